"""The daemon's backbone under load: fetches per second, CPU per fetch, RSS per tracked page.

Run from the repository root: ``.venv/bin/python bench/bench_daemon.py [--hosts 1000 ...]``.
Everything runs on 127.0.0.1 in child processes this script starts and stops; it prints
figures and asserts nothing.

1. Throughput. ``python -m refresher.sim._site`` serves ``--hosts`` × ``--pages`` pages (no
   Crawl-delay) in its own process. Each daemon run is ``refresher run`` in a child process
   (persistence on: DuckDB in a temp dir) with a budget high enough not to be the limit, a
   small ``min_delay`` and no response-time factor.
   Steady state, per count in ``--workers``: the store already holds every page and every
   host's robots.txt (as the site serves it, good for a day), as after a while of running.
   ``--warmup`` seconds after the "ready" log line the script measures for ``--seconds``,
   sends SIGTERM, and counts in the DuckDB history the fetches that finished in the window. It
   prints fetches per second, the daemon's CPU seconds per 1,000 fetches (user + system from
   /proc, DuckDB's threads included), how long its threads waited for a CPU (schedstat: other
   work on the machine), the server's CPU (was the server the bottleneck?) and the most
   fetches finished but not yet committed.
   Cold start, per count in ``--cold-workers``: a fresh store, every page a seed, measured for
   ``--cold-seconds`` from "ready", through the robots.txt of every host.
2. Memory. For each size in ``--memory-pages`` a store is built with SQL straight into the
   daemon's schema (pages spread over ``--memory-hosts`` hosts, all fetched once "just now"),
   and the daemon runs on it with a tiny budget, so every page is due far in the future and
   the frontier's window holds none of them: what is left is what tracking a page costs when
   it waits in DuckDB. After "ready" and ``--memory-settle`` seconds the script reads VmRSS
   and prints the bytes per page between the sizes. ``--resident-pages`` repeats this with
   every page due now, so the frontier holds them (up to ``frontier.max_pages_in_memory``),
   which prices a page held in memory.
3. A summary block to paste into bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb  # sql-ok: build_store and query only

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from refresher.ops._daemon import check_seeds  # noqa: E402
from refresher.ops._logging import configure_logging  # noqa: E402
from refresher.sim._harness import DaemonProcess, harness_config  # noqa: E402
from refresher.sim._harness import write_config as harness_write_config  # noqa: E402
from refresher.sim._site import Site, make_demo_site  # noqa: E402
from refresher.store import DuckDBStore, RobotsUpdate  # noqa: E402

#: the log line of one robots.txt request
ROBOTS_LINE = '"robots.txt fetched"'
LEGEND = (
    "ready: seconds to READY; robots: robots.txt requests made",
    "fetch/s: fetch records per second from the DuckDB history (pages denied by robots.txt",
    "  included); req/s: HTTP requests among them; 304%: share answered 304 Not Modified",
    "progress/s: min/median/max of the daemon's per-second progress lines",
    "unacked: most fetches finished but not yet committed, at one progress line",
    "CPU ms/fetch: the daemon's CPU seconds (all threads) per 1,000 fetch records",
    "(cores): CPU seconds per second; starved: seconds per second its threads were runnable",
    "  but waiting for a CPU (other work on the machine); server: the site server likewise",
)
#: seconds to wait for a child to come up or go down before giving up on it
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0


# ----------------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_thread(
    pid: int, read: Callable[[Path], tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    """``read`` of each thread's /proc/PID/task/TID directory, by OS thread id (Linux); a
    thread that ends while it is read, or has ended, is missing."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            out[int(task.name)] = read(task)
    return out


def thread_cpu_seconds(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of a process (by its OS thread id): user and system CPU seconds."""
    tick = os.sysconf("SC_CLK_TCK")

    def read(task: Path) -> tuple[float, float]:
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / tick, int(fields[12]) / tick

    return per_thread(pid, read)


def thread_waits(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of a process (by its OS thread id): seconds it was runnable but waiting for a
    CPU so far (schedstat), shaped as :func:`thread_cpu_seconds` (second: 0)."""
    return per_thread(
        pid, lambda task: (int((task / "schedstat").read_text().split()[1]) / 1e9, 0.0)
    )


def nonblocking_works(pid: int) -> bool:
    """Whether py-spy can read ``pid`` without pausing it (``--nonblocking``). On some
    kernels (6.18 on the machine of 26 Nov) it cannot find the Python version that way, while
    a paused read works: then every sample pauses the process for a moment."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    probe = [spy, "dump", "--nonblocking", "--pid", str(pid)]
    return subprocess.run(probe, capture_output=True).returncode == 0


def thread_names(pid: int) -> dict[int, str]:
    """The Python name of each thread of a process that runs Python (``py-spy dump``), by OS
    thread id; threads that never ran Python (DuckDB's) are missing. Empty without py-spy."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {}
    command = [str(spy), "dump", "--pid", str(pid)]
    if nonblocking_works(pid):
        command.append("--nonblocking")
    dump = subprocess.run(command, capture_output=True, text=True).stdout
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', dump, re.M)}


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (the daemon's parse processes and the fork
    server that starts them), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _tree_sum(pid: int, of: Callable[[int], float]) -> float:
    """``of(pid)`` summed over a process and every process under it still running."""
    total = of(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            total += of(child)
    return total


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` of a process and every process under it that is still running."""
    return _tree_sum(pid, cpu_seconds)


def tree_rss_bytes(pid: int) -> int:
    """:func:`rss_bytes` of a process and every process under it."""
    total = rss_bytes(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, RuntimeError):
            total += rss_bytes(child)
    return total


def cpu_wait_seconds(pid: int) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU (schedstat).

    On a machine shared with other work this tells a slow daemon from a starved one.
    """
    return sum(wait for wait, _ in thread_waits(pid).values())


def tree_cpu_wait_seconds(pid: int) -> float:
    """:func:`cpu_wait_seconds` of a process and every process under it still running."""
    return _tree_sum(pid, cpu_wait_seconds)


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of a process in bytes (VmRSS from /proc; ``field="VmHWM"``: its
    peak so far)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status; is the process a zombie?")


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  pid {process.pid} ignored SIGTERM for {timeout:.0f} s; killing it")
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def site_server(
    hosts: int, pages: int, directory: Path, extra: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The demo site in a child process (``extra``: more of its command-line options, e.g.
    ``--seed 3``); yields (process, port) and stops it afterwards."""
    port_file = directory / "site.port"
    command = [sys.executable, "-m", "refresher.sim._site", "--hosts", str(hosts)]
    command += ["--pages", str(pages), "--port", "0", "--port-file", str(port_file)]
    command += ["--crawl-delay", "-1", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with (directory / "site.log").open("wb") as log:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the site server did not start; see {directory / 'site.log'}")
            time.sleep(0.05)
        yield process, int(port_file.read_text())
    finally:
        stop(process)


@contextlib.contextmanager
def scratch(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """A temp directory, removed afterwards unless ``--keep``."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=args.tmp))
    try:
        yield directory
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def write_config(directory: Path, **sections: dict[str, Any]) -> Path:
    """A daemon config with everything under ``directory``; ``sections`` override keys."""
    sections["policy"] = {"name": "uniform", **sections.get("policy", {})}
    tables = harness_config(
        directory, user_agent="refresher-bench/1.0 (+http://127.0.0.1/)", **sections
    )
    return harness_write_config(directory / "refresher.toml", tables)


class Daemon(DaemonProcess):
    """``refresher run`` as a child process (the harness's), with the bench's waits."""

    def __init__(self, config: Path) -> None:
        # From ROOT: `python -m` puts the working directory before PYTHONPATH, so a bench run
        # from another checkout's directory would otherwise time that checkout's daemon.
        super().__init__(config, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)

    def count(self, needle: str) -> int:
        """Log lines containing ``needle`` (cheaper than parsing them all)."""
        return self.log_path.read_bytes().count(needle.encode())

    def wait_ready(self) -> float:
        """Seconds from start until the "ready" log line."""
        t0 = time.monotonic()
        while not self.events("ready"):
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"the daemon exited ({self.proc.returncode}):\n{tail}")
            if time.monotonic() - t0 > START_TIMEOUT:
                stop(self.proc)
                raise SystemExit(f"the daemon was not ready after {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        return stop(self.proc, timeout)


def query(db: Path, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)  # sql-ok: finished runs' figures, read-only
    try:
        return con.execute(sql, params).fetchall()  # sql-ok: finished runs' figures, read-only
    finally:
        con.close()


# ----------------------------------------------------------------------------- throughput


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    workers: int
    ready_seconds: float  # from start to "ready" (seeding included)
    warmup: float  # seconds from "ready" to the measured window
    robots_before: int  # hosts whose robots.txt was fetched before the window
    robots_during: int  # … and during it
    window: float  # seconds measured
    records: int  # fetch records that finished in the window (denied ones included)
    requests: int  # of which were HTTP requests (not denied by robots.txt)
    not_modified: int
    errors: int
    daemon_cpu: float  # CPU seconds in the window
    daemon_wait: float  # seconds its threads waited for a CPU in the window
    server_cpu: float
    progress: tuple[float, ...]  # fetches per second from the progress lines in the window
    unacknowledged: int  # most fetches finished but not yet committed, at a progress line
    rss: int  # bytes, at the end of the window
    exit_status: int | None

    @property
    def rate(self) -> float:
        """Fetch records per second."""
        return self.records / self.window

    @property
    def request_rate(self) -> float:
        return self.requests / self.window

    def cpu_per_1000(self, cpu: float) -> float:
        return 1000.0 * cpu / max(self.records, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cold:
    workers: int
    ready_seconds: float
    seconds: float  # measured from READY
    records: int  # fetch records committed by SIGTERM
    robots: int  # robots.txt fetched
    all_robots_after: float  # seconds from READY until every host's robots.txt; nan: not yet
    progress: tuple[float, ...]
    unacknowledged: int
    daemon_cpu: float
    daemon_wait: float
    server_cpu: float
    exit_status: int | None


def _throughput_config(
    args: argparse.Namespace, directory: Path, workers: int, port: int, seeds: Path | None
) -> Path:
    return write_config(
        directory,
        store={"flush_interval": 0.5, "batch_size": 5000},
        crawl={"workers": workers, **({"seeds_file": str(seeds)} if seeds else {})},
        budget={"fetches_per_second": args.budget},
        policy={"resolve_interval": 3600.0, "replan_share": 0.0},  # no re-plans
        politeness={
            "min_delay": args.min_delay,
            "response_time_factor": 0.0,
            "max_delay": 5.0,
            "backoff_base": 1.0,
            "max_backoff": 5.0,
        },
        fetch={"timeout": 10.0},
        dns={"static": {"*.sim.test": f"127.0.0.1:{port}"}},
        **({"discovery": {"queue": args.discovery_queue}} if args.discovery_queue else {}),
    )


def run_throughput(
    args: argparse.Namespace, workers: int, port: int, server_pid: int, site: Site
) -> Throughput:
    """Steady state: robots.txt cached in the store, every page due; measure a window."""
    with scratch(args, f"bd{workers}-") as directory:
        warm_store(directory / "refresher.duckdb", site)
        config = _throughput_config(args, directory, workers, port, None)
        daemon = Daemon(config)
        try:
            ready = daemon.wait_ready()
            t_ready = time.time()
            time.sleep(args.warmup)
            robots = daemon.count(ROBOTS_LINE)
            spy = start_py_spy(args, daemon.pid, workers)
            t0, d0, s0 = time.time(), tree_cpu_seconds(daemon.pid), cpu_seconds(server_pid)
            w0 = cpu_wait_seconds(daemon.pid)
            time.sleep(args.seconds)
            d1, s1 = tree_cpu_seconds(daemon.pid), cpu_seconds(server_pid)
            rss = tree_rss_bytes(daemon.pid)
            w1 = cpu_wait_seconds(daemon.pid)
            t1 = time.time()
            robots_after = daemon.count(ROBOTS_LINE)
            if spy is not None:
                spy.wait(STOP_TIMEOUT)
        finally:
            status = daemon.stop()
        rows = query(
            directory / "refresher.duckdb",
            """
            SELECT count(*) FILTER (WHERE finished_at >= $t0 AND finished_at < $t1),
                   count(*) FILTER (WHERE finished_at >= $t0 AND finished_at < $t1
                                    AND error_kind IS DISTINCT FROM 'denied'),
                   count(*) FILTER (WHERE finished_at >= $t0 AND finished_at < $t1
                                    AND not_modified),
                   count(*) FILTER (WHERE finished_at >= $t0 AND finished_at < $t1
                                    AND error_kind IS NOT NULL AND error_kind <> 'denied')
            FROM fetches
            """,
            {"t0": t0, "t1": t1},
        )
        records, requests, not_modified, errors = rows[0]
        progress, lag = _progress(daemon, t0, t1)
        return Throughput(
            workers=workers,
            ready_seconds=ready,
            warmup=t0 - t_ready,
            robots_before=robots,
            robots_during=robots_after - robots,
            window=t1 - t0,
            records=records,
            requests=requests,
            not_modified=not_modified,
            errors=errors,
            daemon_cpu=d1 - d0,
            daemon_wait=w1 - w0,
            server_cpu=s1 - s0,
            progress=progress,
            unacknowledged=lag,
            rss=rss,
            exit_status=status,
        )


def warm_store(path: Path, site: Site) -> None:
    """Every page of ``site`` in a new store at ``path``, with each host's robots.txt cached.

    The bodies and statuses are what the site serves, fetched "just now" and good for a day,
    so the daemon starts in the state a long-running one is in: no robots.txt requests.
    """
    pages, rejected = check_seeds(site.urls())
    if rejected:
        raise SystemExit(f"the demo site's own URLs were rejected: {rejected[:3]}")
    now = time.time()
    store = DuckDBStore(path)
    try:
        rows = store.add_pages(pages, now=now)
        host_id = {h.name: h.id for h in store.hosts({r.host_id for r in rows}).values()}
        robots = [
            RobotsUpdate(
                host_id=host_id[h.name],
                status=404 if h.robots is None else 200,
                body=b"" if h.robots is None else h.robots.encode(),
                fetched_at=now,
                expires_at=now + 86_400.0,
            )
            for h in site.hosts
            if h.name in host_id
        ]
        store.write([], [], robots)
    finally:
        store.close()


def run_cold(
    args: argparse.Namespace, workers: int, port: int, server_pid: int, seeds: Path
) -> Cold:
    """A fresh store and every page as a seed: from READY through the robots.txt phase."""
    with scratch(args, f"bc{workers}-") as directory:
        config = _throughput_config(args, directory, workers, port, seeds)
        daemon = Daemon(config)
        try:
            ready = daemon.wait_ready()
            t0, d0, s0 = time.time(), tree_cpu_seconds(daemon.pid), cpu_seconds(server_pid)
            w0 = cpu_wait_seconds(daemon.pid)
            all_robots = math.nan
            while time.time() - t0 < args.cold_seconds:
                if math.isnan(all_robots) and daemon.count(ROBOTS_LINE) >= args.hosts:
                    all_robots = time.time() - t0
                time.sleep(0.25)
            d1, s1 = tree_cpu_seconds(daemon.pid), cpu_seconds(server_pid)
            w1 = cpu_wait_seconds(daemon.pid)
            t1 = time.time()
            robots = daemon.count(ROBOTS_LINE)
        finally:
            status = daemon.stop()
        rows = query(
            directory / "refresher.duckdb",
            "SELECT count(*) FROM fetches WHERE finished_at < $t1",
            {"t1": t1},
        )
        progress, lag = _progress(daemon, t0, t1)
        return Cold(
            workers=workers,
            ready_seconds=ready,
            seconds=t1 - t0,
            records=rows[0][0],
            robots=robots,
            all_robots_after=all_robots,
            progress=progress,
            unacknowledged=lag,
            daemon_cpu=d1 - d0,
            daemon_wait=w1 - w0,
            server_cpu=s1 - s0,
            exit_status=status,
        )


def _progress(daemon: Daemon, t0: float, t1: float) -> tuple[tuple[float, ...], int]:
    """Fetches per second of the progress lines within [t0, t1], and the largest number of
    fetches finished but not yet committed at one of them."""
    rates, lag = [], 0
    for e in daemon.events("progress"):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if t0 + 1.0 <= iso_seconds(e["timestamp"]) <= t1:
                rates.append(float(e["fetches_per_second"]))
                lag = max(lag, int(e["fetches"]) - int(e["acknowledged"]))
    return tuple(rates), lag


def start_py_spy(
    args: argparse.Namespace, pid: int, workers: int, *, seconds: float | None = None
) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the daemon for the measured window (``seconds``, default
    ``args.seconds``), when ``--py-spy DIR`` is given; :func:`finish_py_spy` ends it sooner."""
    if args.py_spy is None:
        return None
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.py_spy) / f"daemon-{workers}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    duration = str(max(1, round(args.seconds if seconds is None else seconds)))
    command = [exe, "record", "--pid", str(pid), "--duration", duration]
    command += ["--rate", "100", "--format", "raw", "--output", str(out)]
    if getattr(args, "native", False):
        command += ["--native", "--threads"]  # native frames need the process paused
    elif nonblocking_works(pid):
        command.append("--nonblocking")
    if args.gil:
        command.append("--gil")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_py_spy(spy: subprocess.Popen[bytes]) -> None:
    """End py-spy's sampling now (SIGINT: it writes what it has sampled) and wait for it."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def print_profile(path: Path, top: int = 15) -> None:
    """Self and inclusive shares of the functions in py-spy's collapsed stacks."""
    if not path.exists():
        print(
            f"  no profile at {path} (py-spy needs ptrace rights: run as root or set "
            "kernel.yama.ptrace_scope=0)"
        )
        return
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        n = int(count_text)
        total += n
        # A frame reads "function (file.py:line)"; drop the line to add up per function.
        frames = [f.rsplit(":", 1)[0] + ")" if ":" in f else f for f in stack.split(";")]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
    print(f"  py-spy, {total} samples ({path}):")
    for title, table in (("self", own), ("inclusive", inclusive)):
        print(f"  {title}:")
        for f, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {100 * n / total:5.1f} %  {f}")


def iso_seconds(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------- memory


def build_store(path: Path, *, pages: int, hosts: int, due_now: bool) -> float:
    """A store of ``pages`` pages over ``hosts`` hosts, written with SQL; returns seconds taken.

    Every page looks fetched once in the last hour (status ok, a digest, an ETag), so the
    allocator's reschedule puts it ``pages / budget`` seconds later; with ``due_now`` it is
    never fetched, hence due at once.
    """
    t0 = time.perf_counter()
    DuckDBStore(path).close()  # the schema, migrated exactly as the daemon does it
    con = duckdb.connect(str(path))  # sql-ok: synthetic store
    try:
        now = time.time()
        con.execute(  # sql-ok: synthetic store
            "INSERT INTO hosts (id, name, scheme) "
            "SELECT i, 'h' || (i - 1) || '.mem.test', 'http' FROM range(1, ? + 1) t(i)",
            [hosts],
        )
        # Fetched pages carry what a fetch leaves behind (validators, a digest).
        fetched = (
            "NULL, NULL, NULL, 0, 'new'"
            if due_now
            else "$now - random() * 3600, '\"' || md5(i::VARCHAR)[:16] || '\"', "
            "unhex(md5(i::VARCHAR)), 1, 'ok'"
        )
        con.execute(  # sql-ok: synthetic store
            f"""
            INSERT INTO pages (id, url, host_id, first_seen, due_at,
                               last_fetch, etag, digest, fetches, status)
            SELECT i,
                   'http://h' || ((i - 1) % $h) || '.mem.test/p' || ((i - 1) // $h),
                   ((i - 1) % $h) + 1,
                   $now - 3600,
                   $now,
                   {fetched}
            FROM range(1, $n + 1) t(i)
            """,
            {"h": hosts, "now": now, "n": pages},
        )
        con.execute("CHECKPOINT")  # sql-ok: synthetic store
    finally:
        con.close()
    return time.perf_counter() - t0


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    pages: int
    build_seconds: float
    ready_seconds: float
    rss: int  # bytes, the last of the samples
    rss_samples: tuple[int, ...]
    in_memory: int | None  # pages the frontier held (last progress line)
    file_bytes: int


def run_memory(args: argparse.Namespace, pages: int, *, due_now: bool) -> Memory:
    with scratch(args, f"bm{pages}-") as directory:
        db = directory / "refresher.duckdb"
        build = build_store(db, pages=pages, hosts=min(args.memory_hosts, pages), due_now=due_now)
        file_bytes = db.stat().st_size
        config = write_config(
            directory,
            store={"memory_limit": args.memory_limit},
            crawl={"workers": args.memory_workers},
            # So low that, after the allocator's reschedule, every fetched page is due days
            # from now; the pacer lets at most a token or two through.
            budget={"fetches_per_second": 1e-6},
            policy={"resolve_interval": 3600.0, "replan_share": 0.0},  # no re-plans
            politeness={"min_delay": 1.0, "response_time_factor": 0.0},
            fetch={"timeout": 1.0},
            # Workers wait for the pacer's next token (days away) and finish only at the
            # drain deadline: keep it short.
            daemon={"drain_timeout": 1.0},
            # Nothing serves these names: port 9 (discard) on loopback refuses, no DNS query.
            dns={"static": {"*.mem.test": "127.0.0.1:9"}},
        )
        daemon = Daemon(config)
        samples: list[int] = []
        try:
            ready = daemon.wait_ready()
            deadline = time.monotonic() + args.memory_settle
            while time.monotonic() < deadline:
                time.sleep(0.5)
                samples.append(rss_bytes(daemon.pid))
        finally:
            daemon.stop()
        progress = daemon.events("progress")
        in_memory = progress[-1].get("in_memory") if progress else None
        return Memory(
            pages=pages,
            build_seconds=build,
            ready_seconds=ready,
            rss=samples[-1],
            rss_samples=tuple(samples),
            in_memory=in_memory,
            file_bytes=file_bytes,
        )


def per_page(small: Memory, large: Memory) -> float:
    return (large.rss - small.rss) / (large.pages - small.pages)


# ----------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.0f}/{statistics.median(values):.0f}/{max(values):.0f}"


def _exit(status: int | None) -> str:
    return "" if status == 0 else f"  (exit status {status})"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    t = parser.add_argument_group("throughput")
    t.add_argument("--hosts", type=int, default=1000, help="virtual hosts (default 1000)")
    t.add_argument("--pages", type=int, default=20, help="pages per host (default 20)")
    t.add_argument("--workers", type=_ints, default=[128, 256], help="e.g. 64,128,256")
    t.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    t.add_argument("--warmup", type=float, default=5.0, help="seconds after READY, unmeasured")
    t.add_argument(
        "--cold-workers",
        type=_ints,
        default=[128],
        help="worker counts for the cold start (fresh store, robots.txt to fetch); empty: skip",
    )
    t.add_argument("--cold-seconds", type=float, default=30.0, help="measured from READY")
    t.add_argument("--budget", type=float, default=5000.0, help="fetches/s, above the goal")
    t.add_argument("--min-delay", type=float, default=0.05, help="politeness, seconds")
    t.add_argument(
        "--discovery-queue",
        type=int,
        default=0,
        help="discovery.queue (default: the daemon's); a large one keeps every document in "
        "memory, so that code which drops documents when it is full does the same work",
    )
    m = parser.add_argument_group("memory")
    m.add_argument("--memory-pages", type=_ints, default=[10_000, 1_000_000])
    m.add_argument("--memory-hosts", type=int, default=10_000, help="hosts of those pages")
    m.add_argument("--memory-limit", default="256MB", help="store.memory_limit (DuckDB)")
    m.add_argument("--memory-workers", type=int, default=64, help="crawl.workers")
    m.add_argument("--memory-settle", type=float, default=5.0, help="seconds after ready")
    m.add_argument(
        "--resident-pages",
        type=_ints,
        default=[10_000, 100_000],
        help="sizes for the frontier-resident case (all due now); empty to skip",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--tmp", default=None, help="directory for temp stores (default /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directories")
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile the daemon with py-spy during each measured window; stacks go to DIR "
        "(the sampler takes CPU too: profiled figures run slower)",
    )
    parser.add_argument(
        "--gil", action="store_true", help="with --py-spy: only samples holding the GIL"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --py-spy: C frames too, each stack under its thread (thread (0x…))",
    )
    args = parser.parse_args(argv)
    configure_logging(format="console", level="warning")  # the store's own log lines are noise

    cores = os.cpu_count()
    load = os.getloadavg()
    started = time.monotonic()
    print(
        f"refresher daemon bench: {cores} cores, load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f} at start, Python {sys.version.split()[0]}, "
        f"DuckDB {duckdb.__version__}"
    )
    runs: list[Throughput] = []
    colds: list[Cold] = []
    if not args.skip_throughput:
        with scratch(args, "bdsite-") as work:
            # The server builds the same site from the same seed: its URLs ("/private/…" ones
            # included, which robots.txt denies on every third host) and robots.txt bodies.
            site = make_demo_site(hosts=args.hosts, pages_per_host=args.pages, crawl_delay=None)
            seeds = work / "seeds.txt"
            seeds.write_text("".join(f"{url}\n" for url in site.urls()))
            with site_server(args.hosts, args.pages, work) as (server, port):
                print(
                    f"\n1. throughput: site pid {server.pid} on 127.0.0.1:{port}, "
                    f"{args.hosts} hosts × {args.pages} pages = {args.hosts * args.pages} pages, "
                    f"budget {args.budget:g}/s, min_delay {args.min_delay:g} s"
                )
                if args.workers:
                    print(
                        f"\nsteady state: robots.txt cached in the store, every page due; "
                        f"{args.warmup:g} s after READY unmeasured, then {args.seconds:g} s"
                    )
                    print(
                        f"{'workers':>7} {'ready':>6} {'robots':>7} {'fetch/s':>7} "
                        f"{'req/s':>6} {'304%':>4} {'err':>4} {'progress/s':>12} "
                        f"{'unacked':>7} {'CPU ms/fetch':>12} {'(cores)':>7} {'starved':>7} "
                        f"{'server':>6} {'(cores)':>7} {'RSS':>9}"
                    )
                for workers in args.workers:
                    r = run_throughput(args, workers, port, server.pid, site)
                    runs.append(r)
                    print(
                        f"{r.workers:7d} {r.ready_seconds:6.1f} "
                        f"{r.robots_before + r.robots_during:7d} "
                        f"{r.rate:7.0f} {r.request_rate:6.0f} "
                        f"{100 * r.not_modified / max(r.requests, 1):4.0f} {r.errors:4d} "
                        f"{_spread(r.progress):>12} {r.unacknowledged:7d} "
                        f"{r.cpu_per_1000(r.daemon_cpu):12.2f} "
                        f"{r.daemon_cpu / r.window:7.2f} {r.daemon_wait / r.window:7.2f} "
                        f"{r.cpu_per_1000(r.server_cpu):6.2f} {r.server_cpu / r.window:7.2f} "
                        f"{_mib(r.rss):>9}" + _exit(r.exit_status),
                        flush=True,
                    )
                if args.cold_workers:
                    print(
                        f"\ncold start: a fresh store, every page a seed; {args.cold_seconds:g} s "
                        "from READY, robots.txt of every host fetched first"
                    )
                    print(
                        f"{'workers':>7} {'ready':>6} {'robots':>7} {'all robots':>10} "
                        f"{'fetch/s':>7} {'progress/s':>12} {'unacked':>7} "
                        f"{'CPU ms/fetch':>12} {'(cores)':>7} {'starved':>7} {'server':>6} "
                        f"{'(cores)':>7}"
                    )
                for workers in args.cold_workers:
                    c = run_cold(args, workers, port, server.pid, seeds)
                    colds.append(c)
                    every = (
                        f"{c.all_robots_after:9.1f}s"
                        if math.isfinite(c.all_robots_after)
                        else "not yet"
                    )
                    print(
                        f"{c.workers:7d} {c.ready_seconds:6.1f} {c.robots:7d} {every:>10} "
                        f"{c.records / c.seconds:7.0f} {_spread(c.progress):>12} "
                        f"{c.unacknowledged:7d} "
                        f"{1000 * c.daemon_cpu / max(c.records, 1):12.2f} "
                        f"{c.daemon_cpu / c.seconds:7.2f} {c.daemon_wait / c.seconds:7.2f} "
                        f"{1000 * c.server_cpu / max(c.records, 1):6.2f} "
                        f"{c.server_cpu / c.seconds:7.2f}" + _exit(c.exit_status),
                        flush=True,
                    )
                print("\n".join(["", *LEGEND]))
                if args.py_spy is not None:
                    for r in runs:
                        print(f"\nprofile, {r.workers} workers")
                        print_profile(Path(args.py_spy) / f"daemon-{r.workers}.txt")

    idle: list[Memory] = []
    resident: list[Memory] = []
    if not args.skip_memory:
        print(
            f"\n2. memory: pages over {args.memory_hosts} hosts, store.memory_limit "
            f"{args.memory_limit}, {args.memory_workers} workers, RSS after "
            f"{args.memory_settle:g} s"
        )
        cases = [("idle", p, False) for p in args.memory_pages]
        cases += [("resident", p, True) for p in args.resident_pages]
        print(
            f"{'case':>8} {'pages':>9} {'build s':>7} {'ready s':>7} {'in memory':>9} "
            f"{'file':>10} {'RSS':>10} {'RSS min..max':>22}"
        )
        for name, pages, due_now in cases:
            mem = run_memory(args, pages, due_now=due_now)
            (resident if due_now else idle).append(mem)
            print(
                f"{name:>8} {mem.pages:9d} {mem.build_seconds:7.1f} {mem.ready_seconds:7.1f} "
                f"{mem.in_memory if mem.in_memory is not None else '-':>9} "
                f"{_mib(mem.file_bytes):>10} {_mib(mem.rss):>10} "
                f"{_mib(min(mem.rss_samples)) + '..' + _mib(max(mem.rss_samples)):>22}",
                flush=True,
            )

    end = os.getloadavg()
    print(
        f"\n=== summary: {cores} cores, load average {load[0]:.2f} at start and {end[0]:.2f} "
        "at end (other work on the machine slows wall-clock figures; CPU per fetch holds) ==="
    )
    for r in runs:
        cost = r.cpu_per_1000(r.daemon_cpu)
        print(
            f"throughput, steady state, {r.workers} workers, {args.hosts} hosts × {args.pages} "
            f"pages, persistence on: {r.rate:.0f} fetches/s ({r.request_rate:.0f} HTTP "
            f"requests/s); goal ≥ 1,000"
        )
        print(
            f"  daemon {cost:.2f} CPU s per 1,000 fetches using {r.daemon_cpu / r.window:.2f} "
            f"cores and waiting {r.daemon_wait / r.window:.2f} s per s for a CPU "
            f"(≈ {1000 / max(cost, 1e-9):.0f} fetches/s per core of CPU), server "
            f"{r.cpu_per_1000(r.server_cpu):.2f} using {r.server_cpu / r.window:.2f} cores; "
            f"up to {r.unacknowledged} fetches not yet committed"
        )
    for c in colds:
        every = (
            f"every host's robots.txt after {c.all_robots_after:.0f} s"
            if math.isfinite(c.all_robots_after)
            else f"robots.txt of {c.robots}/{args.hosts} hosts"
        )
        print(
            f"cold start, {c.workers} workers: {c.records / c.seconds:.0f} fetches/s over the "
            f"first {c.seconds:.0f} s after READY, {every}; up to {c.unacknowledged} fetches "
            "not yet committed"
        )
    if len(idle) >= 2:
        small, large = idle[0], idle[-1]
        print(
            f"memory, pages waiting in DuckDB: {per_page(small, large):.0f} bytes per tracked page "
            f"between {small.pages:,} and {large.pages:,} pages (RSS {_mib(small.rss)} → "
            f"{_mib(large.rss)}); goal ≤ 150 bytes beyond a fixed base"
        )
    if len(resident) >= 2:
        small, large = resident[0], resident[-1]
        print(
            f"memory, pages held by the frontier: {per_page(small, large):.0f} bytes per page "
            f"between {small.in_memory} and {large.in_memory} pages in memory (RSS "
            f"{_mib(small.rss)} → {_mib(large.rss)})"
        )
    print(f"bench took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
