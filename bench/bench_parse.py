"""Figures for the processing modules: pages per second, a 10 MB page's time and memory,
simhash throughput, a 50,000-entry sitemap; or, with --docs, CPU per page on real trees by
stage. Prints; asserts nothing.

    .venv/bin/python bench/bench_parse.py
    .venv/bin/python bench/bench_parse.py --docs DIR [DIR ...] [--passes 3] [--max-text CHARS]

``--docs`` runs every .html page under each DIR through :func:`process` (the daemon's entry
point, one thread) for ``--passes`` timed passes after a warm-up pass and prints the CPU ms
per page (min-max over the passes) and per MB, for the pages under the tree bound, the huge
ones (``_html._TREE_MAX`` bytes and more) and all; then one more pass with a CPU timer around
each stage of the daemon's own code: the charset choice, the nesting estimate, Lexbor's parse,
the CSS selection of link and invisible elements, the loop over them (link rules and URL
verdicts), the text walk, the simhash, and the rest (the result, dropping invisible elements,
freeing the tree). ``--max-text`` gives the simhash's text bound (``discovery.max_text_chars``;
0: all of it). Debian's python3.11-doc, nodejs-doc and rustup's docs make good trees.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from refresher.discover import _html, _lexbor
from refresher.discover._parse import Document, Extracted, HtmlLinks, Sitemaps, process, simhash
from refresher.discover._simhash import _Simhash

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


def load_docs(root: Path) -> list[Document]:
    """Every .html page under ``root`` as a fetched document of a made-up host."""
    return [
        Document(
            url=f"http://docs.example/{path.relative_to(root)}",
            content_type="text/html",
            body=path.read_bytes(),
        )
        for path in sorted(root.rglob("*.html"))
    ]


def cpu_per_page(docs: list[Document], builtins: dict[str, Any] | None = None) -> float:
    """CPU ms per page of one pass of :func:`process` over ``docs``."""
    start = time.thread_time()
    for doc in docs:
        process(doc, builtins=builtins)
    return (time.thread_time() - start) / len(docs) * 1e3


#: (namespace, attribute, stage) timed by --docs; a stage inside another is taken out of it
STAGES: tuple[tuple[Any, str, str], ...] = (
    (_html, "choose_charset", "charset"),
    (_html, "lexbor_tree", "nesting estimate"),
    (_lexbor, "LexborHTMLParser", "Lexbor parse"),
    (_html, "_lexbor_selection", "CSS selection"),
    (_html, "_lexbor_links", "link loop + URLs"),
    (_html, "_lexbor_text", "text walk"),
    (_Simhash, "feed", "simhash"),
    (_Simhash, "value", "simhash"),
    (_html, "_tree", "lxml tree"),
    (_html, "_stream", "streaming"),
)


@contextlib.contextmanager
def stage_timers(spent: Counter[str]) -> Iterator[None]:
    """Adds each stage's CPU nanoseconds to ``spent`` while in the block (the daemon's own
    functions, wrapped; the Lexbor parse is taken out of the nesting estimate's call)."""
    inner: list[int] = [0]

    def timed(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer, inner[0] = inner[0], 0
            start = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.thread_time_ns() - start
                spent[stage] += took - inner[0]
                inner[0] = outer + took

        return wrapper

    # Stages missing in the code under test (an older export) are left out.
    present = [(owner, name, stage) for owner, name, stage in STAGES if name in owner.__dict__]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in present]
    try:
        for owner, name, stage in present:
            setattr(owner, name, timed(owner.__dict__[name], stage))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def docs_figures(root: Path, passes: int, builtins: dict[str, Any] | None) -> None:
    docs = load_docs(root)
    if not docs:
        raise SystemExit(f"no .html files under {root}: name a directory of HTML pages")
    huge = [doc for doc in docs if len(doc.body) >= _html._TREE_MAX]
    groups = {"under 1 MiB": [doc for doc in docs if len(doc.body) < _html._TREE_MAX]}
    groups |= {"huge": huge, "all": docs} if huge else {}
    print(f"{root}: {len(docs)} pages, {sum(len(d.body) for d in docs) / 1e6:.1f} MB")
    for label, group in groups.items():
        if not group:
            continue
        cpu_per_page(group, builtins)  # warm-up: caches as a running crawl has them
        runs = [cpu_per_page(group, builtins) for _ in range(passes)]
        megabytes = sum(len(d.body) for d in group) / 1e6
        spent: Counter[str] = Counter()
        with stage_timers(spent):
            total = cpu_per_page(group, builtins)
        stages = {stage: ns / len(group) / 1e6 for stage, ns in spent.items() if ns}
        stages["rest"] = total - sum(stages.values())
        print(
            f"  {label:<12} {len(group):5} pages of {megabytes * 1e3 / len(group):6.0f} kB: "
            f"{min(runs):7.2f}-{max(runs):7.2f} CPU ms/page, "
            f"{min(runs) * len(group) / megabytes:6.2f} CPU ms/MB"
        )
        print("      " + ", ".join(f"{stage} {ms:.3f}" for stage, ms in stages.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", nargs="+", type=Path, metavar="DIR", help="real page trees")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per tree")
    parser.add_argument("--max-text", type=int, metavar="CHARS", help="the simhash's text bound")
    args = parser.parse_args()
    if args.docs:
        builtins = None
        if args.max_text is not None:
            html = HtmlLinks(max_text=args.max_text)
            builtins = {html.name: html}
        for root in args.docs:
            docs_figures(root, args.passes, builtins)
        return
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
