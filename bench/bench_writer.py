"""The store writer's work per real page, in isolation: the WARC records, DuckDB's batch and the
documents' edges, as the daemon's store thread does them on a first pass of a docs web.

    python bench/bench_writer.py [DIR] [--hosts 20] [--batch 130] [--rounds 3] [--profile]

Every page of a docs tree (default: the Python 3.11 HTML docs of Debian's ``python3.11-doc``)
under ``--hosts`` host names becomes what a first fetch hands the store: a fetch record whose
findings are the page's links (refresher's own HTML processor, run once before timing), and a
``response`` capture of the page. In batches of ``--batch`` (the daemon's batches on the docs
web: 0.5 s of about 260 fetches/s), the writer's batch runs as :class:`refresher.store.
BatchedService` runs it: the archive's ``write_batch`` (records built, compressed, written,
fsynced), ``DuckDBStore.write`` with the index rows, ``counts``; then discovery's
``save_documents`` in batches of 128. Printed: CPU milliseconds per page (this process, all
threads, best of ``--rounds``, each on a fresh store and archive directory) for the whole and
for each part. ``--profile`` samples one more round with py-spy (native frames) and prints
the top functions. Asserts nothing: figures for bench/README.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_warc import page_capture  # noqa: E402
from conftest import fetch_record  # noqa: E402

import refresher.store as rs  # noqa: E402
from refresher.archive._warc import WarcWriter  # noqa: E402
from refresher.crawl._fetch import body_digest  # noqa: E402
from refresher.discover._discovery import Found, findings_of  # noqa: E402
from refresher.discover._parse import Document, HtmlLinks, process  # noqa: E402
from refresher.ops._logging import configure_logging  # noqa: E402
from refresher.store._captures import Capture  # noqa: E402

DEFAULT_DIR = Path("/usr/share/doc/python3.11/html")
#: documents saved per ``save_documents`` call (discovery's batch)
DOCUMENTS = 128


def pages_of(root: Path, hosts: int) -> list[tuple[str, str, bytes]]:
    """(host, URL, body) of every HTML page under ``root`` for each of ``hosts`` host names,
    the hosts taking turns (the daemon's order), each body with its host name in it."""
    files = sorted(root.rglob("*.html"))
    bodies = [f.read_bytes() for f in files]
    out = []
    for i, f in enumerate(files):
        for h in range(hosts):
            host = f"h{h}.docs.test"
            body = bodies[i].replace(b"</body>", f"<p>{host}</p></body>".encode())
            out.append((host, f"http://{host}/{f.relative_to(root)}", body))
    return out


def workload(
    store: rs.DuckDBStore, pages: list[tuple[str, str, bytes]], found: list[rs.Findings]
) -> list[tuple[rs.FetchRecord, Capture, rs.HostUpdate]]:
    """The store's pages for ``pages`` and, per page, what its first fetch hands the store."""
    rows = store.add_pages(
        [rs.NewPage(url=u, host=h, scheme="http") for h, u, _ in pages], now=1.8e9
    )
    by_url = {r.url: r for r in rows}
    out = []
    for i, (host, url, body) in enumerate(pages):
        row = by_url[url]
        digest = body_digest(body)  # the fetch's, which the WARC writer reuses
        capture = replace(page_capture(i, host, url, body), page_id=row.id, digest=digest)
        at = capture.fetched_at
        record = fetch_record(
            row.id,
            row.host_id,
            at,
            duration=0.01,
            body_bytes=len(body),
            digest=digest,
            page_digest=digest,
            policy="optimal",
            fingerprint=int.from_bytes(digest[:8], "little"),
            last_modified_at=1.72e9,
            findings=found[i],
        )
        host_update = rs.HostUpdate(
            host_id=row.host_id, next_allowed=at, delay=0.0, backoff=0.0, errors=0
        )
        out.append((record, capture, host_update))
    return out


def documents(
    items: Sequence[tuple[rs.FetchRecord, Capture, rs.HostUpdate]],
) -> list[rs.DocumentUpdate]:
    """What discovery saves for each fetch: edges to the linked pages (all known here)."""
    out = []
    for record, _, _ in items:
        f = record.findings
        assert f is not None
        out.append(
            rs.DocumentUpdate(
                page_id=record.page_id,
                new=[],
                linked=[u for u, _ in f.links],
                canonical=f.canonical,
                noindex=f.noindex,
                lastmod=[],
                fetched_at=record.finished_at,
            )
        )
    return out


class Clock:
    """CPU seconds of this process spent in each named part."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t = time.process_time()
        try:
            return fn()
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.process_time() - t


def one_round(
    directory: Path, pages: list[tuple[str, str, bytes]], found: list[rs.Findings], batch: int
) -> dict[str, float]:
    """CPU seconds per part of the writer's work for every page once, on a fresh store."""
    store = rs.DuckDBStore(directory / "s.duckdb")
    archive = WarcWriter(directory / "archive")
    items = workload(store, pages, found)
    clock = Clock()
    for s in range(0, len(items), batch):
        part = items[s : s + batch]
        records = [r for r, _, _ in part]
        rows = clock.run("WARC records", lambda p=part: archive.write_batch([c for _, c, _ in p]))
        clock.run(
            "DuckDB batch",
            lambda r=records, p=part, w=rows: store.write(r, [h for _, _, h in p], (), w),
        )
        clock.run("counts", store.counts)
    docs = documents(items)
    for s in range(0, len(docs), DOCUMENTS):
        clock.run(
            "documents' edges",
            lambda d=docs[s : s + DOCUMENTS]: store.save_documents(d, now=1.8e9 + 100),
        )
    archive.close()
    store.close()
    return clock.parts


def extract(pages: list[tuple[str, str, bytes]]) -> list[rs.Findings]:
    """Each page's findings, as the crawler hands them with its record."""
    html = HtmlLinks()
    out = []
    for _, url, body in pages:
        ex = process(
            Document(url=url, content_type="text/html", body=body, robots_tag=None),
            builtins={html.name: html},
        )
        out.append(findings_of(Found(page_id=0, depth=1, url=url, extracted=ex)))
    return out


def profile(args: argparse.Namespace) -> None:
    """py-spy over one more round, in a child process; the top functions by own samples."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="writer-spy-") as tmp:
        out = Path(tmp) / "raw.txt"
        cmd = [sys.executable, __file__, str(args.dir), "--hosts", str(args.hosts)]
        cmd += ["--batch", str(args.batch), "--rounds", "1"]
        spy = [exe, "record", "--native", "--rate", "250", "--format", "raw", "-o", str(out)]
        subprocess.run([*spy, "--", *cmd], check=True, stdout=subprocess.DEVNULL)
        # only the timed rounds, not the reading and link extraction before them
        timed = Path(tmp) / "timed.txt"
        lines = out.read_text().splitlines()
        timed.write_text("".join(f"{x}\n" for x in lines if "one_round (" in x))
        if args.keep_profile is not None:
            shutil.copy(timed, args.keep_profile)
        from bench_daemon import print_profile

        print_profile(timed, top=45)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    p.add_argument("--hosts", type=int, default=20)
    p.add_argument("--batch", type=int, default=130, help="fetch records per batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="py-spy one more round")
    p.add_argument("--keep-profile", type=Path, help="with --profile: keep its stacks here")
    args = p.parse_args(argv)
    configure_logging(format="console", level="warning")
    pages = pages_of(args.dir, args.hosts)
    if not pages:
        raise SystemExit(f"no *.html under {str(args.dir)!r}: apt-get install python3.11-doc")
    found = extract(pages)
    links = sum(len(f.links) for f in found) / len(found)
    size = sum(len(b) for _, _, b in pages) / len(pages)
    print(f"{len(pages)} pages ({args.hosts} hosts), {size / 1024:.1f} KiB, {links:.0f} links each")
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="writer-") as tmp:
            parts = one_round(Path(tmp), pages, found, args.batch)
        parts["all"] = sum(parts.values())
        for k, v in parts.items():
            best[k] = min(best.get(k, v), v)
    for k, v in best.items():
        print(f"  {k:18} {v / len(pages) * 1e3:6.3f} CPU ms per page")
    if args.profile:
        profile(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
