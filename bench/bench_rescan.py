"""A re-plan's rescan of the frontier's window on a real DuckDB store: peak RSS and CPU.

Run from the repository root: ``python bench/bench_rescan.py [--pages 1000000 ...]``. Prints
figures and asserts nothing.

The store (built with SQL in a temp dir) has ``--pages`` pages over pages/100 hosts; the
``--window`` pages due soonest fall within the frontier's window (60 s), the rest later. Each
measurement runs in a child process of its own on a copy of the store: the frontier
(``max_pages_in_memory`` = ``--window``) loads its window; then the store's due times change as
a re-plan changes them, and the frontier rescans (``reset`` and one loading pass). Printed:
RSS with the window held (after a collection), the peak RSS during the rescan (VmHWM, reset
before it through /proc/self/clear_refs) above it, per page held, and the rescan's CPU.

Re-plans (``--scenario``): ``moved`` (every page of the window gets a new due time within it,
what a re-plan mostly does), ``turnover`` (the window's pages move beyond it and as many
others come in: a new policy, the most a rescan can take in). Run this script with an older
tree first on ``sys.path`` (``cd`` there) to measure that tree's frontier.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb  # sql-ok: builds the synthetic store
import trio

sys.path.insert(0, str(Path.cwd()))

from bench_daemon import rss_bytes

from refresher.crawl._frontier import Frontier
from refresher.store import DuckDBStore

NOW = 1_800_000_000.0
WINDOW = 60.0  # seconds


def build(path: Path, pages: int, window: int) -> None:
    """The synthetic store: ``window`` pages due within the window, the others after it."""
    DuckDBStore(path).close()
    con = duckdb.connect(str(path))  # sql-ok: synthetic store
    try:
        hosts = max(pages // 100, 1)
        con.execute(  # sql-ok: synthetic store
            "INSERT INTO hosts (id, name, scheme, delay) "
            "SELECT i, 'h' || i || '.test', 'http', 1.0 FROM range(0, $h) t(i)",
            {"h": hosts},
        )
        con.execute(  # sql-ok: synthetic store
            """
            INSERT INTO pages (id, url, host_id, first_seen, due_at, last_fetch, fetches, status,
                               etag, digest, target_rate, rate)
            SELECT i, 'http://h' || (i % $h) || '.test/section/page-' || i || '.html', i % $h,
                   $now - 86400, $now + (CASE WHEN i <= $w THEN $span * i / $w
                                              ELSE $span + 3600 * i / $n END),
                   $now - 600, 5, 'ok', '"etag-' || i || '"',
                   sha256(CAST(i AS VARCHAR))::BLOB, 1 / 3600.0, 1 / 7200.0
            FROM range(1, $n + 1) t(i)
            """,
            {"h": hosts, "n": pages, "w": window, "now": NOW, "span": WINDOW - 1},
        )
        con.execute("CHECKPOINT")  # sql-ok: synthetic store
    finally:
        con.close()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(path: Path, window: int, scenario: str) -> dict[str, float]:
    store = DuckDBStore(path)

    async def source(after, until, limit, known):  # type: ignore[no-untyped-def]
        return store.load_due(after=after, until=until, limit=limit, known_hosts=known)

    frontier = Frontier(
        source=source,
        budget=100.0,
        window=WINDOW,
        max_pages_in_memory=window,
        wall_clock=lambda: NOW,
    )
    await frontier.load()
    held = frontier.statistics().in_memory
    if scenario == "moved":  # a new due time within the window for each page of it
        change = "UPDATE pages SET due_at = $now + (hash(id) % 59) WHERE due_at <= $now + 60"
    else:  # the window's pages after it, and as many others into it
        change = (
            "UPDATE pages SET due_at = CASE WHEN due_at <= $now + 60 THEN due_at + 7200 "
            "ELSE $now + (hash(id) % 59) END WHERE id <= 2 * $w"
        )
    values = {"now": NOW, "w": window} if "$w" in change else {"now": NOW}
    store._con.execute(change, values)  # sql-ok: the re-plan's save
    gc.collect()
    steady = rss_bytes(os.getpid())
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    cpu, wall = _cpu(), time.perf_counter()
    frontier.reset()
    await frontier.load()
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    peak = rss_bytes(os.getpid(), "VmHWM")
    after = frontier.statistics().in_memory
    store.close()
    return {
        "held": held,
        "held_after": after,
        "steady_mib": steady / 2**20,
        "peak_above_mib": (peak - steady) / 2**20,
        "peak_per_page": (peak - steady) / max(held, 1),
        "cpu_s": cpu,
        "wall_s": wall,
    }


def child(args: argparse.Namespace) -> None:
    figures = trio.run(measure, args.store, args.window, args.scenario)
    print(json.dumps(figures))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pages", type=int, default=1_000_000)
    p.add_argument("--window", type=int, default=200_000, help="pages due within the window")
    p.add_argument("--scenario", choices=["moved", "turnover"], nargs="+", default=None)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.scenario = args.scenario[0]
        child(args)
        return
    directory = Path(tempfile.mkdtemp(prefix="bench-rescan-"))
    try:
        built = directory / "built.duckdb"
        t0 = time.perf_counter()
        build(built, args.pages, args.window)
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(
            f"store: {args.pages:,} pages, {args.window:,} in the window, built in "
            f"{time.perf_counter() - t0:.1f} s; load {' '.join(load)}"
        )
        for scenario in args.scenario or ["moved", "turnover"]:
            for _ in range(args.repeat):
                copy = directory / "run.duckdb"
                shutil.copy(built, copy)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        "--store",
                        str(copy),
                        "--window",
                        str(args.window),
                        "--scenario",
                        scenario,
                    ],
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"the measuring process failed:\n{out.stderr}")
                f = json.loads(out.stdout)
                print(
                    f"{scenario:9} held {f['held']:,} -> {f['held_after']:,}: RSS "
                    f"{f['steady_mib']:.0f} MiB held, peak +{f['peak_above_mib']:.1f} MiB "
                    f"({f['peak_per_page']:.0f} B per page held) during the rescan; "
                    f"{f['cpu_s']:.2f} CPU s, {f['wall_s']:.2f} s"
                )
                copy.unlink()
        print(f"load {Path('/proc/loadavg').read_text().split()[:3]}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
