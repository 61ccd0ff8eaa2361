"""The archive's cost: bytes on disk per change and per fetch, CPU per fetch with it on vs off.

Run from the repository root: ``.venv/bin/python bench/bench_archive.py``. For each web of the
family (``--webs``: seed:mean-change-interval pairs) the demo site runs in a child process,
and ``refresher run`` runs on a fresh store with the archive on, off, and without revisits, for
``--seconds`` after "ready" at ``--budget`` fetches per second. Printed per run: fetches, new
versions archived (``response`` records), revisits, compressed bytes per new version (response
and request records) and per revisit, WARC bytes on disk per fetch, the daemon's CPU
milliseconds per fetch (user + system, all threads, from /proc), and how long its threads
waited for a CPU (other load). A third run per web has revisits off. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import bench_daemon as bd

from refresher.sim._site import make_demo_site


@contextlib.contextmanager
def site(
    hosts: int, pages: int, seed: int, interval: float, directory: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port_file = directory / "site.port"
    command = [sys.executable, "-m", "refresher.sim._site", "--hosts", str(hosts)]
    command += ["--pages", str(pages), "--port", "0", "--port-file", str(port_file)]
    command += ["--crawl-delay", "-1", "--seed", str(seed)]
    command += ["--mean-change-interval", str(interval)]
    env = dict(os.environ, PYTHONPATH=str(bd.ROOT))
    with (directory / "site.log").open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + bd.START_TIMEOUT
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the site did not start; see {directory / 'site.log'}")
            time.sleep(0.05)
        yield process, int(port_file.read_text())
    finally:
        bd.stop(process)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    web: str
    archive: str  # on | off | no revisits
    fetches: int
    responses: int
    revisits: int
    response_bytes: int  # compressed bytes of response + request records
    revisit_bytes: int
    warc_bytes: int  # the files on disk
    cpu: float  # seconds
    wait: float  # seconds runnable but not running

    def row(self) -> str:
        nan = float("nan")
        per_change = self.response_bytes / self.responses if self.responses else nan
        per_revisit = self.revisit_bytes / self.revisits if self.revisits else nan
        per_fetch = self.warc_bytes / self.fetches if self.fetches else nan
        ms = 1000 * self.cpu / self.fetches if self.fetches else nan
        return (
            f"| {self.web} | {self.archive} | {self.fetches} | {self.responses} | "
            f"{self.revisits} | {per_change:,.0f} | {per_revisit:,.0f} | {per_fetch:,.0f} | "
            f"{ms:.2f} | {self.wait:.1f} |"
        )


def run(args: argparse.Namespace, web: str, port: int, seeds: Path, archive: str) -> Run:
    with bd.scratch(args, "ba-") as directory:
        config = bd.write_config(
            directory,
            store={"flush_interval": 0.5},
            crawl={"workers": args.workers, "seeds_file": str(seeds)},
            budget={"fetches_per_second": args.budget},
            politeness={"min_delay": 0.05, "response_time_factor": 0.0},
            dns={"static": {"*.sim.test": f"127.0.0.1:{port}"}},
            archive={"enabled": archive != "off", "revisits": archive == "on"},
            snapshot={"interval": 0.0},
        )
        daemon = bd.Daemon(config)
        try:
            daemon.wait_ready()
            c0, w0 = bd.cpu_seconds(daemon.pid), bd.cpu_wait_seconds(daemon.pid)
            time.sleep(args.seconds)
            c1, w1 = bd.cpu_seconds(daemon.pid), bd.cpu_wait_seconds(daemon.pid)
        finally:
            daemon.stop()
        db = directory / "refresher.duckdb"
        fetches = bd.query(db, "SELECT count(*) FROM fetches", {})[0][0]
        kinds = {
            k: (n, b)
            for k, n, b in bd.query(
                db, "SELECT kind, count(*), sum(span) FROM warc_records GROUP BY kind", {}
            )
        }
        warc = sum(p.stat().st_size for p in (directory / "archive").glob("*.warc.gz"))
        return Run(
            web=web,
            archive=archive,
            fetches=fetches,
            responses=kinds.get("response", (0, 0))[0],
            revisits=kinds.get("revisit", (0, 0))[0],
            response_bytes=kinds.get("response", (0, 0))[1],
            revisit_bytes=kinds.get("revisit", (0, 0))[1],
            warc_bytes=warc,
            cpu=c1 - c0,
            wait=w1 - w0,
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--webs", default="0:60,1:600", help="seed:mean-change-interval, comma-separated"
    )
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--budget", type=float, default=100.0, help="fetches per second")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--tmp", type=Path, default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for web in args.webs.split(","):
        seed, interval = web.split(":")
        with bd.scratch(args, "bs-") as work:
            urls = make_demo_site(
                hosts=args.hosts, pages_per_host=args.pages, seed=int(seed)
            ).urls()
            seeds = work / "seeds.txt"
            seeds.write_text("".join(f"{u}\n" for u in urls))
            with site(args.hosts, args.pages, int(seed), float(interval), work) as (_, port):
                for archive in ("on", "off", "no revisits"):
                    r = run(args, f"seed {seed}, 1/λ̄ {interval} s", port, seeds, archive)
                    print(r.row(), flush=True)
                    rows.append(r)
    print()
    print(
        "| web | archive | fetches | new versions | revisits | bytes / new version |"
        " bytes / revisit | WARC bytes / fetch | CPU ms / fetch | CPU wait s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
