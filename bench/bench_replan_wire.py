"""The wire rate against the budget B around re-plans, on a real daemon and a generated site.

Run from the repository root: ``.venv/bin/python bench/bench_replan_wire.py [--hosts 400 ...]``.
Everything runs on 127.0.0.1 in child processes this script starts and stops; it prints
figures and asserts nothing.

``python -m refresher.sim._site`` serves ``--hosts`` × ``--pages`` pages (no Crawl-delay,
``--seed``) in its own process; the store starts warm (every page known, every robots.txt
cached, as :mod:`bench_daemon` builds it) and ``refresher run`` re-plans every
``--resolve-interval`` seconds (policy uniform, discovery off) at budget ``--budget``. After
``--warmup`` seconds the script polls the control socket every ``--poll`` seconds for
``--seconds``: the frontier's pages held (``in_memory``) and the allocator's solve count. Then
it stops the daemon and counts, in the DuckDB history, the fetches started in the window:
the wire rate against B over the window, and in the second after each re-plan (from the
"allocation solved" log lines) against the rest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_daemon import (  # noqa: E402
    Daemon,
    iso_seconds,
    query,
    scratch,
    site_server,
    tree_cpu_seconds,
    warm_store,
    write_config,
)

from refresher.ops._control import request  # noqa: E402
from refresher.sim._site import make_demo_site  # noqa: E402


def run(args: argparse.Namespace) -> None:
    site = make_demo_site(
        hosts=args.hosts, pages_per_host=args.pages, seed=args.seed, crawl_delay=None
    )
    with scratch(args, "brw-") as directory:
        extra = ["--seed", str(args.seed)]
        with site_server(args.hosts, args.pages, directory, extra) as (_server, port):
            warm_store(directory / "refresher.duckdb", site)
            config = write_config(
                directory,
                store={"flush_interval": 0.5},
                crawl={"workers": args.workers},
                budget={"fetches_per_second": args.budget},
                policy={"resolve_interval": args.resolve_interval},
                politeness={"min_delay": args.min_delay, "response_time_factor": 0.0},
                discovery={"enabled": False},
                dns={"static": {"*.sim.test": f"127.0.0.1:{port}"}},
            )
            daemon = Daemon(config)
            socket = directory / "control.sock"
            try:
                daemon.wait_ready()
                time.sleep(args.warmup)
                held: list[int] = []
                t0, c0 = time.time(), tree_cpu_seconds(daemon.pid)
                lapsed0 = request(socket, {"op": "status"})["frontier"]["lapsed"]
                while time.time() < t0 + args.seconds:
                    answer = request(socket, {"op": "status"})
                    held.append(int(answer["frontier"]["in_memory"]))
                    time.sleep(args.poll)
                t1, c1 = time.time(), tree_cpu_seconds(daemon.pid)
                lapsed = answer["frontier"]["lapsed"] - lapsed0
            finally:
                status = daemon.stop()
        solves = [
            iso_seconds(e["timestamp"])
            for e in daemon.events("allocation solved")
            if t0 <= iso_seconds(e["timestamp"]) < t1 - 1.0
        ]
        starts = [
            r[0]
            for r in query(
                directory / "refresher.duckdb",
                "SELECT started_at FROM fetches WHERE started_at >= $t0 AND started_at < $t1"
                " ORDER BY started_at",
                {"t0": t0, "t1": t1},
            )
        ]
    report(args, t0, t1, starts, solves, held)
    print(f"  daemon CPU {c1 - c0:.1f} s over the window; exit {status}")
    print(f"  budget tokens lapsed in the window: {lapsed:.1f}")


def report(
    args: argparse.Namespace,
    t0: float,
    t1: float,
    starts: list[float],
    solves: list[float],
    held: list[int],
) -> None:
    """Print the wire rate against B, overall and in the second after a re-plan."""
    b, span = args.budget, t1 - t0
    after = sum(1 for s in starts if any(0.0 <= s - t < 1.0 for t in solves))
    covered = min(float(len(solves)), span)
    print(
        f"hosts {args.hosts} x {args.pages} pages, B {b:g}/s, resolve_interval "
        f"{args.resolve_interval:g} s, window {span:.1f} s, load {os.getloadavg()[0]:.2f}"
    )
    print(f"  re-plans in the window: {len(solves)}")
    print(f"  wire rate: {len(starts) / span:.2f}/s = {len(starts) / span / b:.3f} B")
    if covered:
        print(f"  in the second after a re-plan: {after / covered / b:.3f} B")
    if span > covered:
        print(f"  otherwise: {(len(starts) - after) / (span - covered) / b:.3f} B")
    if held:
        print(
            f"  frontier in_memory polled {len(held)}x: min {min(held)}, "
            f"median {statistics.median(held):g}, max {max(held)}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=400)
    p.add_argument("--pages", type=int, default=50)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--budget", type=float, default=100.0)
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--min-delay", type=float, default=0.5)
    p.add_argument("--resolve-interval", type=float, default=1.0)
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--poll", type=float, default=0.1)
    p.add_argument("--tmp", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
