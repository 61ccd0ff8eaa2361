"""A store batch of refreshes with and without sitemap timelines, in isolation (DuckDB).

    python bench/bench_timeline.py [--hosts 20] [--pages 250] [--batch 50] [--passes 4]
                                   [--rounds 3] [--profile]

A fresh DuckDB store of ``--hosts`` hosts of ``--pages`` pages and a sitemap page each gets
one first fetch of every page (not timed); then ``--passes`` passes of refreshes in batches of
``--batch`` records (the hosts taking turns, 1 in 5 changed, each with a Last-Modified), timed
as ``DuckDBStore.write`` runs them. Two webs, built alike: ``none``, where no sitemap is ever
read (the pages have no timeline), and ``sitemaps``, where each host's sitemap lists all its
pages (a saved document before the passes) and is fetched again once per pass, unchanged (a
re-read: a point of each listed page's timeline) in the batches that hold it, and saved with
new lastmods (a new read) every other pass, the saves timed apart. Printed: CPU ms per batch
(this process, all threads) of each web, best of ``--rounds`` (each on fresh stores), and of
the sitemap saves. ``--profile`` samples one more round of the ``none`` web with py-spy.
Asserts nothing: figures for bench/README.md.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import fetch_record  # noqa: E402

import refresher.store as rs  # noqa: E402
from refresher.ops._logging import configure_logging  # noqa: E402

T0 = 1.8e9
#: seconds between two fetches of a pass (about the daemon's rate on a docs web)
STEP = 0.004


def build(path: Path, args: argparse.Namespace) -> tuple[rs.DuckDBStore, list, dict[int, list]]:
    """The store, its pages (hosts taking turns) and each host's sitemap page with its
    pages."""
    store = rs.DuckDBStore(path)
    new = [
        rs.NewPage(url=f"http://h{h}.test/p{i}", host=f"h{h}.test", scheme="http")
        for i in range(args.pages)
        for h in range(args.hosts)
    ]
    new += [
        rs.NewPage(url=f"http://h{h}.test/sitemap.xml", host=f"h{h}.test", scheme="http")
        for h in range(args.hosts)
    ]
    rows = store.add_pages(new, now=T0)
    pages = [r for r in rows if not r.url.endswith("sitemap.xml")]
    sitemaps = {r.host_id: [r] for r in rows if r.url.endswith("sitemap.xml")}
    for r in pages:
        sitemaps[r.host_id].append(r)
    return store, pages, sitemaps


def record(page: rs.PageRow, at: float, changed: bool) -> rs.FetchRecord:
    """A successful fetch of ``page`` at ``at``, Last-Modified half a second before a change."""
    return fetch_record(
        page.id,
        page.host_id,
        at,
        changed=changed,
        last_modified_at=at - 0.5 if changed else T0 - 100.0,
    )


def read(store: rs.DuckDBStore, listed: list[rs.PageRow], at: float) -> float:
    """CPU seconds of saving the sitemap ``listed[0]`` as read at ``at``, listing the rest."""
    update = rs.DocumentUpdate(
        page_id=listed[0].id,
        new=[],
        linked=[],
        canonical=None,
        noindex=False,
        lastmod=[(r.url, at - 1.0 - (r.id % 7)) for r in listed[1:]],
        fetched_at=at,
    )
    t = time.process_time()
    store.save_documents([update], now=at)
    return time.process_time() - t


def one_round(tmp: Path, args: argparse.Namespace, *, sitemaps: bool) -> tuple[float, float]:
    """CPU ms per timed batch and per sitemap save, on a fresh store."""
    store, pages, by_host = build(tmp / f"{sitemaps}.duckdb", args)
    try:
        at = T0
        first = [fetch_record(p.id, p.host_id, at + i * STEP) for i, p in enumerate(pages)]
        for s in range(0, len(first), args.batch):
            store.write(first[s : s + args.batch], [])
        at += len(pages) * STEP + 1.0
        saves: list[float] = []
        if sitemaps:
            saves += [read(store, listed, at) for listed in by_host.values()]
        write = 0.0
        batches = 0
        for p in range(args.passes):
            records = [
                record(page, at + i * STEP, (i + p) % 5 == 0) for i, page in enumerate(pages)
            ]
            if sitemaps:  # each sitemap fetched once a pass, spread over it, unchanged
                every = len(records) // len(by_host)
                for k, listed in enumerate(by_host.values()):
                    j = k * every
                    records.insert(j, fetch_record(listed[0].id, listed[0].host_id, at + j * STEP))
                records.sort(key=lambda r: r.finished_at)
            for s in range(0, len(records), args.batch):
                batch = records[s : s + args.batch]
                t = time.process_time()
                store.write(batch, [])
                write += time.process_time() - t
                batches += 1
            at += len(records) * STEP + 1.0
            if sitemaps and p % 2 == 1:
                saves += [read(store, listed, at) for listed in by_host.values()]
        return write / batches * 1e3, (sum(saves) / len(saves) * 1e3 if saves else 0.0)
    finally:
        store.close()


def profile(args: argparse.Namespace) -> None:
    """One more round of the ``none`` web under py-spy: the top functions (own time)."""
    py_spy = Path(sys.executable).parent / "py-spy"
    with tempfile.TemporaryDirectory(prefix="tl-prof-") as tmp:
        out = Path(tmp) / "profile.txt"
        cmd = [sys.executable, __file__, "--rounds", "1", "--only", "none"]
        cmd += ["--hosts", str(args.hosts), "--pages", str(args.pages)]
        cmd += ["--batch", str(args.batch), "--passes", str(args.passes)]
        subprocess.run(
            [str(py_spy), "record", "-r", "250", "-f", "raw", "-o", str(out), "--", *cmd],
            check=True,
            capture_output=True,
        )
        own: dict[str, int] = {}
        total = 0
        for line in out.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if "one_round" not in stack or "write" not in stack:
                continue
            frames = stack.split(";")
            count = int(n)
            total += count
            for name in {re.sub(r":\d+\)$", ")", f) for f in frames}:  # inclusive, once
                own[name] = own.get(name, 0) + count
        print(f"py-spy, samples in write(): {total}; inclusive share per function:")
        for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {n / max(total, 1):6.1%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=250, help="pages per host")
    parser.add_argument("--batch", type=int, default=50, help="records per write")
    parser.add_argument("--passes", type=int, default=4, help="timed refresh passes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("none", "sitemaps"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    configure_logging(format="console", level="warning")
    webs = [args.only == "sitemaps"] if args.only else [False, True]
    for sitemaps in webs:
        best_w = best_s = float("inf")
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="tl-") as tmp:
                w, s = one_round(Path(tmp), args, sitemaps=sitemaps)
            best_w, best_s = min(best_w, w), min(best_s, s)
        name = "sitemaps" if sitemaps else "none"
        saves = f", a sitemap save {best_s:.2f} ms" if sitemaps else ""
        print(f"{name:<8}: {best_w:.3f} CPU ms a batch of {args.batch}{saves}")
    if args.profile:
        profile(args)


if __name__ == "__main__":
    main()
