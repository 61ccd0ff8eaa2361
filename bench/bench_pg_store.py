"""The fleet's write path alone: how many fetch records per second one PostgreSQL primary
absorbs through PostgresStore's fenced batches (COPY of the history, multi-row page and host
updates, the change statistics, the lease check), and what it costs the server in CPU.

Starts its own PostgreSQL (initdb + pg_ctl in a temporary directory, default durability:
fsync and synchronous commits on), one fleet of P partitions, one node owning them all, and
writes batches of records for distinct pages, like a node's StoreService does. Prints a table;
asserts nothing.

    .venv/bin/python bench/bench_pg_store.py [--pages 200000] [--seconds 10]
                                             [--batches 100,1000,5000]
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refresher.fleet import partition_of
from refresher.store import FetchRecord, HostUpdate, NewPage
from refresher.store._pg_leases import PgLeases
from refresher.store._pg_schema import init_fleet
from refresher.store._postgres import PgStore

P = 64
TICKS = os.sysconf("SC_CLK_TCK")


def binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None
    )
    if found is None:
        sys.exit("PostgreSQL server binaries not found: apt-get install postgresql")
    return found


class Server:
    """A PostgreSQL of its own, with production durability."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rfbench", dir="/tmp"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.user = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else None
        if self.user is not None:
            os.chown(self.dir, self.user, -1)
        data = str(self.dir / "data")
        self.data = data
        self.run(binary("initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-instructions")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
        self.run(binary("pg_ctl"), "-D", data, "-l", f"{self.dir}/log", "-o", opts, "-w", "start")
        self.run(
            binary("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "bench"
        )
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/bench"

    def run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, user=self.user)

    def cpu_seconds(self) -> float:
        """CPU seconds of the postmaster and its children so far."""
        pid = int(Path(self.data, "postmaster.pid").read_text().split()[0])
        pids = [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
        total = 0
        for p in pids:
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / TICKS

    def stop(self) -> None:
        subprocess.run(
            [binary("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"],
            capture_output=True,
            user=self.user,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def record(page_id: int, host_id: int, at: float, n: int) -> FetchRecord:
    return FetchRecord(
        page_id=page_id,
        host_id=host_id,
        started_at=at - 0.2,
        finished_at=at,
        duration=0.2,
        status=200 if n % 10 else 304,
        body_bytes=15_000,
        digest=b"d%d" % (n % 3),
        changed=n % 3 == 0,
        not_modified=n % 10 == 0,
        error_kind=None,
        policy="optimal",
        final_url=None,
        redirects=0,
        etag='"e"',
        last_modified="Tue, 14 Nov 2023 22:13:20 GMT",
        page_digest=b"d",
        page_status="ok",
        due_at=at + 3600,
        fingerprint=n * 2654435761 % (1 << 64),
        meaningful=n % 6 == 0,
        last_modified_at=at - 100,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=200_000)
    ap.add_argument("--hosts", type=int, default=2_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batches", default="100,1000,5000")
    args = ap.parse_args()
    server = Server()
    try:
        init_fleet(server.dsn, partitions=P)
        leases = PgLeases(server.dsn)
        store = PgStore(server.dsn, node_id="bench", partitions=P)
        store.owned = leases.claim_free("bench", P, 3600.0, time.time())
        t0 = time.perf_counter()
        pages: list[tuple[int, int]] = []
        chunk = 10_000
        for start in range(0, args.pages, chunk):
            new = [
                NewPage(
                    url=f"http://h{i % args.hosts}.example/p{i}",
                    host=f"h{i % args.hosts}.example",
                    scheme="http",
                )
                for i in range(start, min(start + chunk, args.pages))
            ]
            rows, _ = store.add_pages_with_hosts(new, now=time.time())
            pages += [(r.id, r.host_id) for r in rows]
        spread = len({partition_of(f"h{i}.example", P) for i in range(args.hosts)})
        print(
            f"{len(pages):,} pages on {args.hosts:,} hosts in {spread} of {P} partitions, added "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        print(
            f"{'batch':>7} {'records/s':>10} {'ms/batch':>9} {'node CPU ms/1k':>15} "
            f"{'server CPU ms/1k':>17}"
        )
        n = 0
        for size in [int(x) for x in args.batches.split(",")]:
            written, batches = 0, 0
            cpu0, own0, t0 = server.cpu_seconds(), time.process_time(), time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                at = time.time()
                recs = [record(*pages[(n + k) % len(pages)], at, n + k) for k in range(size)]
                hosts = {
                    r.host_id: HostUpdate(
                        host_id=r.host_id, next_allowed=at + 1, delay=1.0, backoff=0, errors=0
                    )
                    for r in recs
                }
                n += size
                written += store.write(recs, list(hosts.values()))
                batches += 1
            wall = time.perf_counter() - t0
            cpu, own = server.cpu_seconds() - cpu0, time.process_time() - own0
            print(
                f"{size:>7} {written / wall:>10,.0f} {wall / batches * 1000:>9.1f} "
                f"{own / written * 1e6:>15.1f} {cpu / written * 1e6:>17.1f}"
            )
        store.close()
        leases.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
