"""A fleet on one machine: 1 node vs 2 against one loopback web, and one PostgreSQL primary's
write capacity with the project's own write path.

Run from the repository root: ``nice -n 15 .venv/bin/python bench/bench_fleet.py``. It starts
its own PostgreSQL (``initdb`` + ``pg_ctl`` in a temp dir, durable defaults: fsync on,
synchronous_commit on, listening on 127.0.0.1 only), its own demo web and its nodes as child
processes, prints figures, asserts nothing, and stops everything.

1. Write path (``--writers``): N processes each hold P/N partitions (real leases), own their
   hosts' pages, and commit batches of ``--batch`` fetch records through
   :meth:`refresher.store._postgres.PgStore.write` (what every node's batched store calls once
   per ``store.flush_interval``: the records by COPY, their pages' state, their hosts'
   politeness, fenced by the leases' epochs) as fast as PostgreSQL takes them, for
   ``--seconds``. Prints committed fetch records per second, batches per second, the
   writers' CPU and PostgreSQL's CPU (every postgres process, from /proc). With
   ``--findings N`` a fifth of the records (the changed ones) are documents: each is stored
   afterwards by ``PgStore.save_document`` as discovery does, and with N ≥ 1 carries findings
   of N links that ride in the batch (``owed_documents``) until that call deletes them, which
   measures what keeping the links in the fetch's transaction costs (N = 0: the same calls
   without findings).
2. Nodes (``--nodes``): ``refresher run`` in fleet mode, one process per node, against
   ``python -m refresher.sim._site`` (``--hosts`` × ``--pages``, no Crawl-delay), a budget far
   above what a node can do; after ``--warmup`` s a ``--seconds`` window: fetches/s (rows
   committed in PostgreSQL's ``fetches`` in the window), the nodes' CPU ms per fetch,
   PostgreSQL's rows/s and CPU seconds per second, and its share of all CPU used.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402  # sql-ok: the benchmark's own databases and figures
from bench_daemon import Daemon, cpu_seconds, site_server, stop, write_config  # noqa: E402

from refresher.ops._daemon import check_seeds  # noqa: E402
from refresher.store._interface import (  # noqa: E402
    DocumentUpdate,
    FetchRecord,
    Findings,
    HostUpdate,
)
from refresher.store._pg_leases import PgLeases  # noqa: E402
from refresher.store._pg_schema import init_fleet  # noqa: E402
from refresher.store._postgres import PgStore  # noqa: E402

P = 64


# ----------------------------------------------------------------------------- PostgreSQL


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise SystemExit("PostgreSQL server binaries not found: apt-get install postgresql")
    return found


class Postgres:
    """A throw-away cluster with the server's defaults (durable commits)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "pg"
        self.dir.mkdir()
        self.data = self.dir / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.user: int | None = None
        if os.geteuid() == 0:  # the server refuses root
            try:
                self.user = pwd.getpwnam("postgres").pw_uid
            except KeyError:
                self.user = pwd.getpwnam("nobody").pw_uid
            os.chown(root, self.user, -1)
            os.chown(self.dir, self.user, -1)
        self._run(_binary("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections=100"
        )
        self._run(
            _binary("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            options,
            "-w",
            "start",
        )
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, user=self.user, timeout=120)
        if done.returncode:
            raise SystemExit(f"{argv[0]} failed: {done.stderr}")

    def pids(self) -> list[int]:
        """The postmaster and its children (backends, writer, WAL writer, checkpointer …)."""
        master = int((self.data / "postmaster.pid").read_text().split()[0])
        out = [master]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == master:
                    out.append(int(stat.parent.name))
        return out

    def cpu(self) -> float:
        """CPU seconds of every postgres process alive now (backends that ended are lost:
        the bench keeps its connections open through each window)."""
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total

    def fresh(self, name: str) -> str:
        with psycopg.connect(self.dsn, autocommit=True) as con:  # sql-ok: a fresh database
            con.execute(f"CREATE DATABASE {name}")  # sql-ok: a fresh database
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{name}"
        init_fleet(dsn, partitions=P)
        return dsn

    def stop(self) -> None:
        subprocess.run(
            [_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            user=self.user,
            timeout=60,
        )


# ----------------------------------------------------------------------------- write path


def _findings(i: int, links: int) -> Findings:
    return Findings(
        depth=1,
        url=f"http://w.sim.test/{i}",
        links=tuple((f"/l{i}/{j}", "a") for j in range(links)),
    )


def _store_documents(store: PgStore, records: list[FetchRecord], now: float) -> None:
    """What discovery does after the batch: one save_document per changed record."""
    for r in records:
        if not r.changed:
            continue
        update = DocumentUpdate(
            page_id=r.page_id,
            new=[],
            linked=[],
            canonical=None,
            noindex=False,
            lastmod=(),
            fetched_at=r.finished_at if r.findings is not None else None,
        )
        store.save_document(update, now=now)


def _writer(
    dsn: str,
    k: int,
    n: int,
    pages: int,
    batch: int,
    seconds: float,
    out: Any,
    release: Any,
    links: int = -1,
) -> None:
    """One writer process: claim P/n partitions, own ``pages`` pages on their hosts, commit
    batches of ``batch`` records until ``seconds`` are up; put (records, batches, cpu)."""
    node = f"w{k}"
    leases = PgLeases(dsn, max_skew=None)
    owned = leases.claim_free(node, P // n, 3600.0, time.time())
    store = PgStore(dsn, node_id=node, partitions=P)
    store.owned = owned
    from refresher.fleet._partition import partition_of

    hosts = [h for h in (f"w{k}h{i}.sim.test" for i in range(2000)) if partition_of(h, P) in owned]
    urls = [f"http://{hosts[i % len(hosts)]}/p{i}" for i in range(pages)]
    new, _ = check_seeds(urls)
    rows, _ = store.add_pages_with_hosts(new, now=time.time())
    out.put(("ready", k))
    t_end = time.time() + seconds
    written = batches = 0
    c0 = time.process_time()
    i = 0
    while time.time() < t_end:
        now = time.time()
        records = []
        for _ in range(batch):
            r = rows[i % len(rows)]
            i += 1
            records.append(
                FetchRecord(
                    page_id=r.id,
                    host_id=r.host_id,
                    started_at=now - 0.05,
                    finished_at=now,
                    duration=0.05,
                    status=200,
                    body_bytes=2000,
                    digest=b"0123456789abcdef",
                    changed=i % 5 == 0,
                    not_modified=False,
                    error_kind=None,
                    policy="optimal",
                    final_url=None,
                    redirects=0,
                    etag=None,
                    last_modified=None,
                    page_digest=b"0123456789abcdef",
                    page_status="ok",
                    due_at=now + 60.0,
                    fingerprint=i,
                    findings=_findings(i, links) if links > 0 and i % 5 == 0 else None,
                )
            )
        host_ids = {r.host_id for r in records}
        updates = [
            HostUpdate(host_id=h, next_allowed=now + 1.0, delay=1.0, backoff=0.0, errors=0)
            for h in host_ids
        ]
        written += store.write(records, updates)
        if links >= 0:
            _store_documents(store, records, now)
        batches += 1
    out.put(("done", k, written, batches, time.process_time() - c0))
    release.wait()  # the connection (its backend's CPU) stays until the window is read
    store.close()
    leases.close()


def bench_writes(pg: Postgres, writers: int, args: argparse.Namespace) -> None:
    dsn = pg.fresh(f"w{writers}")
    ctx = get_context("spawn")
    q, release = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_writer,
            args=(
                dsn,
                k,
                writers,
                args.write_pages,
                args.batch,
                args.seconds,
                q,
                release,
                args.findings,
            ),
        )
        for k in range(writers)
    ]
    for p in procs:
        p.start()

    def get() -> Any:
        while True:
            with contextlib.suppress(queue.Empty):
                return q.get(timeout=1.0)
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("a writer failed; see its traceback above")

    for _ in procs:
        get()  # "ready": pages added, the window starts now
    t0, c0 = time.time(), pg.cpu()
    results = [get() for _ in procs]
    t1, c1 = time.time(), pg.cpu()
    release.set()
    for p in procs:
        p.join()
    records = sum(r[2] for r in results)
    batches = sum(r[3] for r in results)
    cpu = sum(r[4] for r in results)
    window = t1 - t0
    print(
        f"  {writers} writer(s): {records / window:9,.0f} fetch records/s committed"
        f"  {batches / window:6.1f} batches/s of {args.batch}"
        f"  writers' CPU {cpu / window:4.2f} s/s"
        f"  PostgreSQL CPU {(c1 - c0) / window:4.2f} s/s"
        f" ({1000 * (c1 - c0) / max(records, 1):.3f} ms per record)"
    )


# ----------------------------------------------------------------------------- nodes


def _count(dsn: str, t0: float, t1: float) -> int:
    """Fetch rows committed in the window."""
    sql = "SELECT count(*) FROM fetches WHERE finished_at >= %s AND finished_at < %s"
    with psycopg.connect(dsn) as con:  # sql-ok: the figures of a finished window
        row = con.execute(sql, (t0, t1)).fetchone()  # sql-ok: the figures of a finished window
    return int(row[0]) if row else 0


def bench_nodes(pg: Postgres, nodes: int, args: argparse.Namespace, root: Path) -> None:
    dsn = pg.fresh(f"n{nodes}")
    directory = root / f"nodes{nodes}"
    directory.mkdir()
    with site_server(args.hosts, args.pages, directory) as (server, port):
        from refresher.sim._site import make_demo_site

        site = make_demo_site(hosts=args.hosts, pages_per_host=args.pages, crawl_delay=None)
        seeds = directory / "seeds.txt"
        seeds.write_text("".join(f"{url}\n" for url in site.urls()))
        daemons = []
        try:
            for k in range(nodes):
                d = directory / f"node{k}"
                d.mkdir()
                config = write_config(
                    d,
                    store={"flush_interval": 0.5, "batch_size": 5000},
                    crawl={"workers": args.workers, "seeds_file": str(seeds)},
                    budget={"fetches_per_second": args.budget},
                    policy={"resolve_interval": 3600.0, "replan_share": 0.0},  # no re-plans
                    politeness={
                        "min_delay": args.min_delay,
                        "response_time_factor": 0.0,
                        "max_delay": 5.0,
                        "backoff_base": 1.0,
                        "max_backoff": 5.0,
                    },
                    fetch={"timeout": 2.0},
                    dns={"static": {"*.sim.test": f"127.0.0.1:{port}"}},
                    fleet={"dsn": dsn, "node_id": f"node{k}", "partitions": P, "lease_ttl": 10.0},
                )
                daemons.append(Daemon(config))
            for d in daemons:
                d.wait_ready()
            time.sleep(args.warmup)
            t0 = time.time()
            n0 = [cpu_seconds(d.pid) for d in daemons]
            p0, s0 = pg.cpu(), cpu_seconds(server.pid)
            time.sleep(args.seconds)
            t1 = time.time()
            n1 = [cpu_seconds(d.pid) for d in daemons]
            p1, s1 = pg.cpu(), cpu_seconds(server.pid)
        finally:
            for d in daemons:
                stop(d.proc)
        fetched = _count(dsn, t0, t1)
        window = t1 - t0
        node_cpu = sum(n1) - sum(n0)
        pg_cpu = p1 - p0
        total = node_cpu + pg_cpu + (s1 - s0)
        print(
            f"  {nodes} node(s): {fetched / window:7.1f} fetches/s"
            f"  nodes' CPU {1000 * node_cpu / max(fetched, 1):5.2f} ms/fetch"
            f" ({node_cpu / window:4.2f} s/s)"
            f"  PostgreSQL {fetched / window:7.1f} fetch rows/s, CPU {pg_cpu / window:4.2f} s/s"
            f" ({100 * pg_cpu / max(total, 1e-9):4.1f} % of all CPU used; the web server"
            f" {(s1 - s0) / window:4.2f} s/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,2,4", help="writer processes, comma-separated")
    parser.add_argument("--batch", type=int, default=500, help="records per committed batch")
    parser.add_argument("--write-pages", type=int, default=20_000, help="pages per writer")
    parser.add_argument(
        "--findings",
        type=int,
        default=-1,
        help="write path: links per document in the batch (0: documents without); -1: none",
    )
    parser.add_argument("--nodes", default="1,2", help="node counts, comma-separated")
    parser.add_argument("--hosts", type=int, default=300)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--workers", type=int, default=128)
    parser.add_argument("--budget", type=float, default=5000.0)
    parser.add_argument("--min-delay", type=float, default=0.05)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"bench_fleet: {os.cpu_count()} CPUs, load average {load:.1f}, nice {os.nice(0)}")
    root = Path(tempfile.mkdtemp(prefix="rfbench"))
    pg = Postgres(root)
    try:
        if args.writers:
            print(f"write path: PgStore.write, batches of {args.batch}, {args.seconds:.0f} s each")
            for n in (int(x) for x in args.writers.split(",")):
                bench_writes(pg, n, args)
        if args.nodes:
            print(
                f"nodes: refresher run in fleet mode, {args.hosts} hosts × {args.pages} pages,"
                f" {args.workers} workers per node, {args.warmup:.0f} s warm-up,"
                f" {args.seconds:.0f} s window"
            )
            for n in (int(x) for x in args.nodes.split(",")):
                bench_nodes(pg, n, args, root)
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
