"""Figures for the processing modules: pages per second, a 10 MB page's time and memory,
simhash throughput, a 50,000-entry sitemap. Prints; asserts nothing.

    .venv/bin/python bench/bench_parse.py
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from refresher.discover._parse import Document, Extracted, Sitemaps, process, simhash

DATA = Path(__file__).parent.parent / "tests" / "data" / "html"


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Best wall time of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes (Linux), 0 elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> int:
    """Reset the peak resident set (Linux clear_refs) and return the current one, bytes."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def peak_rss() -> int:
    return _status("VmHWM")


def big_page(links: int = 100_000) -> bytes:
    item = (
        b'<li><a href="/catalogue/s-%02d/item-%06d-a-descriptive-slug.html">Item %d</a> %s</li>\n'
    )
    text = b"a few words of description for the reader"
    return b"<html><body><ul>" + b"".join(item % (i % 100, i, i, text) for i in range(links))


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    article = (DATA / "article_library_v1.html").read_bytes()
    messy = (DATA / "messy.html").read_bytes()
    for name, body in (("article (2.5 kB)", article), ("messy (2.3 kB)", messy)):
        doc = Document(url="https://www.example.org/a/b.html", content_type="text/html", body=body)

        def pages(doc: Document = doc) -> None:
            for _ in range(200):
                process(doc)

        seconds = timed(pages, repeat=3) / 200
        print(f"{name:<24} {1 / seconds:10,.0f} pages/s  ({seconds * 1e3:.2f} ms each)")

    body = big_page()
    doc = Document(url="http://example.com/", content_type="text/html", body=body)
    rss_before = reset_peak_rss()
    result: list[Extracted] = []
    seconds = timed(lambda: result.append(process(doc)))
    rss_grew = peak_rss() - rss_before
    tracemalloc.start()
    process(doc)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"{len(body) / 1e6:.1f} MB page, 100,000 links: {seconds:.2f} s "
        f"({len(body) / 1e6 / seconds:.1f} MB/s), kept {len(result[0].links):,} links, "
        f"Python peak {peak / 1e6:.1f} MB, peak RSS grew {rss_grew / 1e6:.1f} MB"
    )

    text = (b" ".join([b"the quick brown fox jumps over the lazy dog 2024"] * 200_000)).decode()
    seconds = timed(lambda: simhash(text))
    print(f"simhash: {len(text) / 1e6 / seconds:.1f} MB/s of text ({len(text) / 1e6:.1f} MB)")

    entries = b"".join(
        b"<url><loc>https://www.example.org/p/%d</loc><lastmod>2024-05-06T10:32:15Z</lastmod></url>"
        % i
        for i in range(50_000)
    )
    xml = b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
    xml += entries + b"</urlset>"
    packed = gzip.compress(xml)
    for label, data in (("plain", xml), ("gzip", packed)):
        sdoc = Document(url="https://www.example.org/s.xml", content_type="text/xml", body=data)
        seconds = timed(lambda sdoc=sdoc: Sitemaps().process(sdoc))  # type: ignore[misc]
        print(f"sitemap, 50,000 entries, {label:<5} {seconds:.2f} s ({len(data) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
