"""refresher and Scrapy side by side on the same loopback webs: pages/s, CPU ms per page, RSS.

    .venv/bin/python bench/bench_vs_scrapy.py --scrapy /tmp/scrapy-venv/bin/python [--web docs,sim]

Scrapy runs from its own virtual environment (``python3 -m venv /tmp/scrapy-venv &&
/tmp/scrapy-venv/bin/pip install scrapy``; not a dependency). Its spider is small: one
concurrent request per domain, no download delay, robots.txt obeyed, links taken with its own
selector ``a::attr(href)`` and followed within the host.

Two webs, each measured for ``--seconds`` after ``--warmup`` seconds, one crawler at a time:

- ``docs``: real pages. nginx (Debian's) serves a documentation tree (default
  /usr/share/doc/python3.11/html from ``python3.11-doc``) under ``--hosts`` virtual hosts
  ``hN.docs.test`` on 127.0.0.1, each page with its host name injected before ``</body>``
  (``sub_filter``) so bodies differ between hosts. Both crawlers start from every host's
  index.html: a first pass, links discovered as they go.
- ``sim``: the tiny-page simulated web (``python -m refresher.sim._site``, ~300-byte pages, 7
  links each). Both start from the host roots; Scrapy re-requests every link it sees
  (``dont_filter``), refresher re-fetches pages as its budget allows: refresh passes.

``--complete`` (docs web): both crawlers are seeded with every page (Scrapy's starts in a
file, the hosts taking turns, through its duplicate filter; its spider then follows only links
to .html pages), and each runs alone until nginx's access log has served it every page once
(or for ``--limit`` seconds). pages/s = pages / seconds from its first request to its last new
page, CPU over the same span; start-up (refresher: seeding its store) is printed apart. Both
fetch and parse the same pages, which a window of a first pass does not give: a window holds
whichever pages each crawler's order reaches first (refresher's, seeded: the first pages of
each host in path order; Scrapy's, breadth first: the index pages and the pages they link).

pages/s counts 2xx responses in the window (refresher: fetch records in its DuckDB history;
Scrapy: responses its spider parsed); on the docs web refresher is seeded with every page
(with only the index pages known, a budget far above what 20 hosts serve makes a refresh
crawler re-fetch them rather than go on) and only each page's first fetch counts, the window
ending where the first pass does if it is sooner. On the sim web refresher also prints its
responses per second with the 304s to its conditional GETs (Scrapy asks unconditionally) and
CPU ms per response. CPU ms/page is the crawler's user + system CPU (its child processes
included) in the window per page; RSS at the end of the window (with ``--complete`` also the
main process's peak, VmHWM). Both crawlers resolve the hosts to 127.0.0.1 themselves
(refresher: ``dns.static``; Scrapy: a resolver in the spider file). "starved" is how long
the crawler's threads were runnable but waiting for a CPU, per second (schedstat: other work
on the machine). ``--stages`` prints where refresher's refreshes
spent their time in the window (``stage_seconds`` from its control socket: a host held, on the
wire, in the parse with its queue, waiting for the store's queue), ``--py-spy DIR`` profiles it.
``--refresher-cpus 0`` pins refresher's daemon alone (its threads and children with it) to
CPU 0 (``sched_setaffinity``); nginx, Scrapy and the bench run where the scheduler puts them.
``--load N`` runs competitor processes beside the crawlers (``--load-kind``: a busy loop, or
numpy copying a 200 MB array), started with each round and killed after; ``--load 0,1`` runs
every round quiet and loaded in turns. ``--complete`` also prints context switches per page
and the machine's steal time. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_daemon import (
    Daemon,
    cpu_seconds,
    cpu_wait_seconds,
    descendants,
    finish_py_spy,
    per_thread,
    print_profile,
    query,
    rss_bytes,
    site_server,
    start_py_spy,
    stop,
    thread_cpu_seconds,
    thread_names,
    thread_waits,
    tree_cpu_seconds,
    tree_cpu_wait_seconds,
    tree_rss_bytes,
    write_config,
)

from refresher.discover._html import PARSERS
from refresher.ops._control import request

DOCS = Path("/usr/share/doc/python3.11/html")

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    {access_log}
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    types {{ text/html html; text/css css; application/javascript js; }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        server_name _;
        root {docs};
        sub_filter '</body>' '<p class="host">$host</p></body>';
        sub_filter_once on;
    }}
}}
"""

SPIDER = '''
import os, time
import scrapy
from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer, task


class LoopbackResolver(CachingThreadedResolver):
    """Every *.test name is 127.0.0.1 (the bench's hosts are virtual)."""

    def getHostByName(self, name, timeout=()):
        if name.endswith(".test"):
            return defer.succeed("127.0.0.1")
        return super().getHostByName(name, timeout)


class Bench(scrapy.Spider):
    name = "bench"
    custom_settings = {
        "CONCURRENT_REQUESTS": 256,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
        "ROBOTSTXT_OBEY": True,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    }

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        if os.environ.get("BENCH_START_FILE"):  # every page a start (--complete)
            with open(os.environ["BENCH_START_FILE"]) as f:
                self.start_urls = f.read().split()
        else:
            self.start_urls = os.environ["BENCH_START"].split()
        self.html_only = os.environ.get("BENCH_HTML_ONLY") == "1"
        self.refresh = os.environ.get("BENCH_REFRESH") == "1"
        self.count_file = os.environ["BENCH_COUNT"]
        self.count = 0
        self.ticker = task.LoopingCall(self.write_count)
        self.ticker.start(0.05)

    async def start(self):
        # through the duplicate filter (Scrapy's own starts skip it), so a page both
        # seeded and linked is fetched once
        for url in self.start_urls:
            yield scrapy.Request(url, callback=self.parse, dont_filter=self.refresh)

    def write_count(self):
        with open(self.count_file + ".tmp", "w") as f:
            f.write(str(self.count))
        os.replace(self.count_file + ".tmp", self.count_file)

    def parse(self, response):
        self.count += 1
        host = response.url.split("/")[2]
        seen = set()  # each link once per page, as refresher takes them
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href).partition("#")[0]
            if url not in seen and url.split("/")[2:3] == [host]:
                if self.html_only and not url.endswith(".html"):
                    continue  # --complete: the pages the web has, as refresher's seeds
                seen.add(url)
                yield scrapy.Request(url, callback=self.parse, dont_filter=self.refresh)
'''


_RESOLVER_SETTINGS = ("TWISTED_DNS_RESOLVER", "DNS_RESOLVER")


@dataclass(frozen=True, slots=True)
class Run:
    crawler: str
    pages: int
    seconds: float
    cpu: float
    rss: int
    fetches: int = 0  # refresher: every response in the window, 304s included
    starved: float = 0.0  # seconds its threads were runnable but waiting for a CPU
    #: its threads' voluntary and involuntary context switches (--complete only)
    switches: tuple[int, int] = (0, 0)
    steal: float = 0.0  # share of the machine's CPU time the hypervisor took (--complete)
    peak: int = 0  # the main process's peak RSS (VmHWM), bytes; 0: not taken

    def line(self) -> str:
        rate = self.pages / self.seconds
        peak = f" (peak {self.peak / 2**20:.0f})" if self.peak else ""
        cpu_ms = 1e3 * self.cpu / self.pages if self.pages else float("nan")
        per_fetch = (
            f"  ({self.fetches / self.seconds:6.0f} fetches/s, "
            f"{1e3 * self.cpu / self.fetches:4.2f} CPU ms/fetch)"
            if self.fetches
            else ""
        )
        switches = (
            f"  switches/page {self.switches[0] / self.pages:.1f} vol "
            f"{self.switches[1] / self.pages:.1f} invol  steal {100 * self.steal:.1f} %"
            if self.pages and any(self.switches)
            else ""
        )
        return (
            f"  {self.crawler:<10} {rate:8.1f} pages/s  {cpu_ms:6.2f} CPU ms/page  "
            f"{self.cpu / self.seconds:4.2f} cores  "
            f"starved {self.starved / self.seconds:4.2f} s/s  "
            f"RSS {self.rss / 2**20:6.0f} MiB{peak}{per_fetch}{switches}"
        )


@dataclass(frozen=True, slots=True)
class Web:
    """One web both crawlers crawl: where they start, and how refresher resolves its hosts."""

    name: str  # "docs" or "sim"
    starts: list[str]  # start URLs: each host's first page
    pattern: str  # refresher's dns.static pattern for the hosts, e.g. "*.docs.test"
    port: int  # the server's loopback port
    #: refresher's seeds (the docs web: every page); None: the start URLs
    seeds: list[str] | None = None
    #: only each page's first fetch counts, as Scrapy crawls the docs web once
    first_pass: bool = False

    @property
    def refresh(self) -> bool:
        """Whether both re-fetch pages (the sim web) rather than make one pass."""
        return self.name == "sim"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: one line per request, "host path status", for --complete (read by AccessLog)
ACCESS_LOG = "log_format pages '$host $uri $status'; access_log {path} pages;"


@contextlib.contextmanager
def nginx(directory: Path, docs: Path, access_log: Path | None = None) -> Iterator[int]:
    """Debian's nginx serving ``docs`` on a loopback port, one process; yields the port.
    With ``access_log``, it writes a line per request there."""
    port = free_port()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / sub).mkdir(exist_ok=True)
    conf = directory / "nginx.conf"
    logging = ACCESS_LOG.format(path=access_log) if access_log else "access_log off;"
    conf.write_text(NGINX_CONF.format(dir=directory, port=port, docs=docs, access_log=logging))
    process = subprocess.Popen(
        ["nginx", "-p", str(directory), "-c", str(conf), "-e", str(directory / "error.log")],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"nginx did not start; see {directory / 'error.log'}")
            time.sleep(0.05)
        yield port
    finally:
        stop(process)


def refresher_config(directory: Path, web: Web, args: argparse.Namespace) -> Path:
    """The daemon's config for ``web``, seeded with its seeds (default its start URLs)."""
    seeds_file = directory / "seeds.txt"
    seeds_file.write_text("".join(f"{url}\n" for url in web.seeds or web.starts))
    discovery: dict[str, object] = {"sitemaps": False}
    if args.parse_processes is not None:
        discovery["parse_processes"] = args.parse_processes
    if args.html_parser is not None:
        discovery["html_parser"] = args.html_parser
    # no re-plans unless asked: the pass is measured, not the allocator
    policy: dict[str, object] = {"resolve_interval": 3600.0, "replan_share": 0.0}
    if args.replan_share is not None:
        policy["replan_share"] = args.replan_share
    return write_config(
        directory,
        store={"flush_interval": 0.5, "batch_size": 5000},
        crawl={"workers": args.workers, "seeds_file": str(seeds_file)},
        budget={"fetches_per_second": args.budget},
        policy=policy,
        politeness={"min_delay": 0.0, "response_time_factor": 0.0, "max_delay": 5.0},
        fetch={"timeout": 10.0},
        dns={"static": {web.pattern: f"127.0.0.1:{web.port}"}},
        discovery=discovery,
        frontier={"window": 5.0},
        archive={"enabled": args.archive == "on"},
    )


#: what a competitor process runs (``--load-kind``): a busy loop, or numpy copying one
#: 200 MB array into another over and over (memory bandwidth and the shared cache, as a
#: test suite or a build beside the crawler would take them)
LOAD_PROGRAMS = {
    "spin": "while True:\n    pass\n",
    "memory": (
        "import numpy as np\n"
        "a = np.ones(25_000_000)\n"
        "b = np.empty_like(a)\n"
        "while True:\n"
        "    np.copyto(b, a)\n"
    ),
}


@contextlib.contextmanager
def competitors(count: int, kind: str, nice: int | None = None) -> Iterator[list[int]]:
    """``count`` processes running ``LOAD_PROGRAMS[kind]`` for the duration, on no particular
    core (the scheduler places them), at the nice value ``nice`` (None: the bench's own, as
    the crawlers'); yields their pids. Killed afterwards."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD_PROGRAMS[kind]],
            stdin=subprocess.DEVNULL,
            preexec_fn=None if nice is None else lambda: set_nice(nice),
        )
        for _ in range(count)
    ]
    try:
        time.sleep(0.5 if kind == "spin" else 1.0)  # under way (the arrays allocated)
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def parse_cpus(text: str) -> frozenset[int]:
    """``--refresher-cpus``: CPU numbers and ranges, e.g. ``0`` or ``0,1`` or ``0-1``, each
    one this process may run on; a one-line error (SystemExit) otherwise."""
    allowed = os.sched_getaffinity(0)
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if match is None:
            raise SystemExit(f"--refresher-cpus {text!r}: give CPU numbers, e.g. 0 or 0,1 or 0-1")
        cpus.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    if not cpus or not cpus <= allowed:
        raise SystemExit(
            f"--refresher-cpus {text!r}: this machine lets the bench run on CPUs "
            f"{','.join(map(str, sorted(allowed)))}; give some of those"
        )
    return frozenset(cpus)


@contextlib.contextmanager
def cpu_affinity(cpus: frozenset[int] | None) -> Iterator[None]:
    """Processes started inside run on ``cpus`` only (None: wherever the scheduler puts
    them): the bench's own thread takes that affinity for the while, a child inherits it at
    fork, with every thread it starts later, and the bench gets its own set back after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def autogroup() -> str:
    """Whether the kernel groups processes by session for CPU shares (sched_autogroup): when
    on, a process of another session gets an even share against the bench's whatever the two
    nice values (a nice 19 loop in another session took half a CPU from one at nice 10)."""
    path = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not path.exists():
        return "absent"
    return "on" if path.read_text().strip() == "1" else "off"


def start_daemon(directory: Path, web: Web, args: argparse.Namespace) -> Daemon:
    """refresher's daemon for ``web`` in ``directory``, on ``--refresher-cpus`` if given
    (only it: nginx, Scrapy, the competitors and the bench itself run where they would)."""
    with cpu_affinity(args.refresher_cpus):
        return Daemon(refresher_config(directory, web, args))


def set_nice(value: int) -> None:
    """This process's nice value (a lower one than the bench's needs root: else kept)."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, value)


def steal_ticks() -> tuple[int, int]:
    """The machine's CPU ticks stolen by the hypervisor and all its ticks (/proc/stat)."""
    ticks = machine_ticks()
    return ticks["steal"], sum(ticks.values())


#: /proc/stat's columns of the machine's CPU time, in order (ticks)
_STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_ticks() -> dict[str, int]:
    """The machine's CPU time so far by kind, in ticks (/proc/stat's first line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return {k: int(v) for k, v in zip(_STAT_COLUMNS, fields, strict=False)}


def machine_account(
    before: dict[str, float], after: dict[str, float], pages: int, seconds: float
) -> str:
    """Where the whole machine's CPU went during a pass, ms per page and cores: the crawler,
    nginx, the bench itself, everything else that ran (other people's work, the kernel's own
    threads) and idle; and the softirq and irq time (loopback's packets), which the kernel
    (without IRQ_TIME_ACCOUNTING) charges to whichever process was running, so it is inside
    the others, not beside them. ``before`` and ``after`` are :func:`machine_reading`s."""
    d = {k: after[k] - before[k] for k in after}
    busy = sum(d[k] for k in ("user", "nice", "system", "irq", "softirq", "steal"))
    parts = {
        "crawler": d["crawler"],
        "nginx": d["nginx"],
        "bench": d["bench"],
        "other": busy - d["crawler"] - d["nginx"] - d["bench"],
        "idle": d["idle"] + d["iowait"],
        "(softirq+irq inside)": d["softirq"] + d["irq"],
    }
    per = "  ".join(f"{k} {1e3 * v / pages:.2f}" for k, v in parts.items())
    cores = "  ".join(f"{k} {v / seconds:.2f}" for k, v in parts.items())
    return f"  machine, CPU ms per page: {per}\n  machine, cores: {cores}"


def machine_reading(crawler: int, nginx: int) -> dict[str, float]:
    """CPU seconds so far of the crawler's tree, nginx, this bench and the machine by kind."""
    tick = os.sysconf("SC_CLK_TCK")
    reading: dict[str, float] = {k: v / tick for k, v in machine_ticks().items()}
    reading["crawler"] = tree_cpu_seconds(crawler)
    reading["nginx"] = cpu_seconds(nginx)
    reading["bench"] = time.process_time()
    return reading


def thread_switches(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of a process (by its OS thread id): voluntary and involuntary context
    switches so far, from /proc, shaped as :func:`bench_daemon.thread_cpu_seconds`."""

    def read(task: Path) -> tuple[float, float]:
        lines = (task / "status").read_text().splitlines()
        counts = dict(line.split(":") for line in lines if "ctxt_switches" in line)
        voluntary, involuntary = "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"
        return float(counts[voluntary]), float(counts[involuntary])

    return per_thread(pid, read)


def context_switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of a process's threads (and its children's)
    so far, from /proc: a thread blocking (a lock, the GIL, I/O) and a thread preempted."""
    total = [0.0, 0.0]
    for proc in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):  # a child gone meanwhile
            for voluntary, involuntary in thread_switches(proc).values():
                total[0] += voluntary
                total[1] += involuntary
    return int(total[0]), int(total[1])


_OK = "status BETWEEN 200 AND 299"


def first_fetches(directory: Path) -> list[float]:
    """When each page's first 2xx fetch finished (unix seconds), in order."""
    rows = query(
        directory / "refresher.duckdb",
        f"SELECT min(finished_at) AS t FROM fetches WHERE {_OK} GROUP BY page_id ORDER BY t",
        {},
    )
    return [t for (t,) in rows]


def run_refresher(directory: Path, web: Web, args: argparse.Namespace) -> Run:
    """The daemon on ``web``. Seeded with every page (the docs web), only each page's first
    fetch counts (as Scrapy crawls the docs web once), and the window ends where the first
    pass does, if sooner."""
    daemon = start_daemon(directory, web, args)
    samples: list[tuple[float, float]] = []  # (unix time, CPU seconds of the daemon's tree)
    try:
        daemon.wait_ready()
        time.sleep(args.warmup)
        spy = start_py_spy(args, daemon.pid, args.workers)
        status0 = daemon_status(directory)
        threads0 = thread_cpu_seconds(daemon.pid)
        end = time.time() + args.seconds
        waits: list[float] = []
        while True:  # the daemon's parse processes included
            samples.append((time.time(), tree_cpu_seconds(daemon.pid)))
            waits.append(tree_cpu_wait_seconds(daemon.pid))
            if samples[-1][0] >= end:
                break
            time.sleep(min(0.5, max(0.0, end - time.time())))
        rss = tree_rss_bytes(daemon.pid)
        status1 = daemon_status(directory)
        threads1 = thread_cpu_seconds(daemon.pid)
        names = thread_names(daemon.pid) if args.stages else {}
        if spy is not None:
            spy.wait()
    finally:
        daemon.stop()
    if args.py_spy is not None:
        print_profile(Path(args.py_spy) / f"daemon-{args.workers}.txt", top=40)
    if args.stages:
        print_stages(status0, status1)
        print_threads(
            threads0, threads1, names, status1["crawler"]["fetches"] - status0["crawler"]["fetches"]
        )
    t0, t1 = samples[0][0], samples[-1][0]
    if web.first_pass:
        firsts = first_fetches(directory)
        pages = bisect.bisect_left(firsts, t1) - bisect.bisect_left(firsts, t0)
        last = firsts[-1] if firsts else None
        if last is not None and t0 < last < t1 - 0.5:  # every page was found and fetched
            t1 = next(t for t, _ in samples if t >= last)
        i = next(i for i, (t, _) in enumerate(samples) if t >= t1)
        return Run(
            "refresher",
            pages,
            t1 - t0,
            samples[i][1] - samples[0][1],
            rss,
            starved=waits[i] - waits[0],
        )
    pages, fetches = query(
        directory / "refresher.duckdb",
        f"SELECT count(*) FILTER (WHERE {_OK}), count(status) FROM fetches"
        " WHERE finished_at >= $t0 AND finished_at < $t1",
        {"t0": t0, "t1": t1},
    )[0]
    return Run(
        "refresher",
        pages,
        t1 - t0,
        samples[-1][1] - samples[0][1],
        rss,
        fetches,
        starved=waits[-1] - waits[0],
    )


def daemon_status(directory: Path) -> dict[str, Any]:
    """The daemon's statistics from its control socket (the harness puts it in ``directory``)."""
    return request(directory / "control.sock", {"op": "status", "hosts_limit": 0})


def print_stages(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Where the window's refreshes spent their time: seconds per stage per fetch."""
    fetches = after["crawler"]["fetches"] - before["crawler"]["fetches"]
    if not fetches:
        return
    stages = after["crawler"]["stage_seconds"]
    spent = {k: v - before["crawler"]["stage_seconds"][k] for k, v in stages.items()}
    per = "  ".join(f"{k} {1e3 * v / fetches:6.1f}" for k, v in spent.items())
    print(f"  stages, ms per fetch ({fetches} fetches): {per}")
    print(f"  frontier at the end: {after['frontier']}")
    print(f"  store at the end: {after['store']}")
    print(f"  discovery at the end: {after.get('discovery')}")
    print(f"  parse at the end: {after.get('parse')}")


def cpu_by_thread_kind(
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    names: dict[int, str],
) -> dict[str, tuple[float, float]]:
    """User and system CPU seconds spent between two readings of
    :func:`bench_daemon.thread_cpu_seconds`, threads of one kind together (``parse_0`` and
    ``parse_1`` as ``parse``; a thread ``names`` lacks, such as DuckDB's own, which never run
    Python, as ``native``; every thread as ``unnamed`` when ``names`` is empty), most first."""
    kinds: dict[str, tuple[float, float]] = {}
    for tid, (user, system) in after.items():
        user0, system0 = before.get(tid, (0.0, 0.0))
        name = names.get(tid, "native") if names else "unnamed"
        kind = re.sub(r"[_ ]?\d+$", "", name)
        spent = kinds.get(kind, (0.0, 0.0))
        kinds[kind] = (spent[0] + user - user0, spent[1] + system - system0)
    return dict(sorted(kinds.items(), key=lambda kv: -sum(kv[1])))


def print_threads(
    before: dict[int, tuple[float, float]],
    after: dict[int, tuple[float, float]],
    names: dict[int, str],
    fetches: int,
) -> None:
    """The window's CPU per fetch by kind of thread: user + system ms, the system part in
    brackets (:func:`cpu_by_thread_kind`)."""
    if not fetches:
        return
    kinds = cpu_by_thread_kind(before, after, names)
    per = "  ".join(
        f"{k} {1e3 * (u + s) / fetches:.2f} ({1e3 * s / fetches:.2f})"
        for k, (u, s) in kinds.items()
    )
    hint = "" if names else " (pip install py-spy to name the threads)"
    print(f"  CPU ms per fetch by thread (system part): {per}{hint}")


@contextlib.contextmanager
def scrapy_process(
    directory: Path, web: Web, args: argparse.Namespace, *, complete: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], int]]]:
    """Scrapy crawling ``web`` from its start URLs, once it has parsed a page; yields the
    process and a function reading how many pages it has parsed so far. Killed afterwards.
    ``complete``: from every seed of ``web`` instead, following only links to HTML pages,
    yielded as soon as it has started."""
    spider = directory / "bench_spider.py"
    spider.write_text(SPIDER)
    count = directory / "scrapy.count"
    env = dict(
        os.environ,
        BENCH_START=" ".join(web.starts),
        BENCH_REFRESH="1" if web.refresh else "0",
        BENCH_COUNT=str(count),
        PYTHONPATH=str(directory),
    )
    if complete:  # 10,000 URLs are more than an environment variable may hold
        starts = directory / "starts.txt"
        starts.write_text("".join(f"{url}\n" for url in by_turns(web.seeds or web.starts)))
        env.update(BENCH_START_FILE=str(starts), BENCH_HTML_ONLY="1")
    with (directory / "scrapy.log").open("wb") as log:
        process = subprocess.Popen(
            # The resolver is a process setting (installed before the spider's are read);
            # TWISTED_DNS_RESOLVER is its name in recent Scrapy (2.19 here), DNS_RESOLVER before.
            [args.scrapy, "-m", "scrapy", "runspider", str(spider)]
            + [f"-s{name}=bench_spider.LoopbackResolver" for name in _RESOLVER_SETTINGS],
            cwd=directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def pages() -> int:
        with contextlib.suppress(OSError, ValueError):
            return int(count.read_text())
        return 0

    try:
        deadline = time.monotonic() + 60
        while pages() == 0 and not complete:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (directory / "scrapy.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"Scrapy did not get going:\n{tail}")
            time.sleep(0.05)
        yield process, pages
    finally:
        if process.poll() is None:
            process.kill()  # Scrapy's graceful stop waits out its queue; the figures are taken
        process.wait()


def run_scrapy(directory: Path, web: Web, args: argparse.Namespace) -> Run:
    with scrapy_process(directory, web, args) as (process, pages):
        time.sleep(args.warmup)
        t0, p0, c0 = time.time(), pages(), cpu_seconds(process.pid)
        w0 = cpu_wait_seconds(process.pid)
        time.sleep(args.seconds)
        t1, p1, c1 = time.time(), pages(), cpu_seconds(process.pid)
        w1 = cpu_wait_seconds(process.pid)
        rss = rss_bytes(process.pid)
    return Run("Scrapy", p1 - p0, t1 - t0, c1 - c0, rss, starved=w1 - w0)


def by_turns(urls: list[str]) -> list[str]:
    """``urls`` with their hosts taking turns (the first of each host, then the second, …).
    Scrapy's scheduler hands its downloader requests in order, at most 256 waiting: in the
    seeds' order (host by host) they would all be one host's, one in flight. refresher's
    frontier keeps a queue per host whatever the order."""
    hosts: dict[str, list[str]] = {}
    for url in urls:
        hosts.setdefault(url.split("/")[2], []).append(url)
    queues = list(hosts.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


class AccessLog:
    """nginx's access log (``ACCESS_LOG``'s format) read as it grows: which of the web's
    pages have been served with a 200, and how many requests in all."""

    def __init__(self, path: Path, pages: set[tuple[str, str]]) -> None:
        self.path = path
        self.pages = pages  # (host, path) of every page of the web
        self.served: set[tuple[str, str]] = set()  # of those, served with a 200
        self.requests = 0
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def poll(self) -> None:
        data = self._partial
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
            f.seek(self._offset)
            data += f.read()
            self._offset = f.tell()
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            host, path, status = line.decode(errors="replace").rsplit(" ", 2)
            self.requests += 1
            if (host, path) in self.pages and status == "200":
                self.served.add((host, path))

    @property
    def complete(self) -> bool:
        return len(self.served) == len(self.pages)


@dataclass(frozen=True, slots=True)
class Complete:
    """One crawler's pass over every page of the docs web, from its first request to its
    last new page (``Run``'s figures), with what else it asked for."""

    run: Run
    startup: float  # seconds from the process's start to its first request
    startup_cpu: float  # CPU seconds it spent in them (refresher: seeding its store)
    requests: int  # requests in the pass, re-fetches and robots.txt included
    done: bool  # every page fetched within --limit

    def line(self) -> str:
        tail = "" if self.done else f"  NOT COMPLETE after {self.run.seconds:.0f} s"
        return (
            f"{self.run.line()}  {self.run.seconds:6.1f} s for {self.run.pages} pages, "
            f"{self.requests} requests, start-up {self.startup:.1f} s "
            f"({self.startup_cpu:.1f} CPU s){tail}"
        )


#: refresher's fetches of one --complete pass from its store: each fetch numbered per page
#: (1: the page's first), the pass ending at the last first fetch, each host's first pass
#: at its own last first fetch
REFETCHES = """
    WITH f AS (
        SELECT host_id, started_at,
               row_number() OVER (PARTITION BY page_id ORDER BY started_at) AS n
        FROM fetches),
    hosts AS (SELECT host_id, max(started_at) AS ended FROM f WHERE n = 1 GROUP BY host_id),
    pass AS (SELECT min(ended) AS first_end, max(ended) AS last_end FROM hosts)
    SELECT count(*) FILTER (WHERE n = 1),
           count(*) FILTER (WHERE n > 1 AND started_at <= last_end),
           count(*) FILTER (WHERE n > 1 AND started_at < ended),
           count(*) FILTER (WHERE n > 1 AND started_at <= last_end
                            AND started_at > last_end - 1.0),
           any_value(last_end - first_end)
    FROM f JOIN hosts USING (host_id), pass
"""


def refetch_line(db: Path) -> str:
    """What refresher's store (``db``, the daemon stopped) says of its --complete pass: first
    fetches, and re-fetches made before the last first fetch (pages fetched again while
    others had no copy yet), how many of them before their own host's last first fetch and
    in the pass's last second; and the spread of the hosts' first passes' ends (seconds)."""
    [(first, again, own, last, spread)] = query(db, REFETCHES, {})
    if not first:
        return "  refresher's store: no fetch recorded"
    return (
        f"  refresher's store: {first} first fetches, {again} re-fetches before the last of "
        f"them ({again / first:.1%}; {own} before their own host's last first fetch, {last} "
        f"in the pass's last second); the hosts' first passes ended within {spread:.2f} s"
    )


def run_complete(directory: Path, web: Web, args: argparse.Namespace, crawler: str) -> Complete:
    """``crawler`` (seeded with every page of the web) until nginx has served it every page
    once, or for ``--limit`` seconds; measured from its first request, polled every 0.2 s."""
    assert web.seeds is not None
    pages = {(u.split("/")[2].split(":")[0], "/" + u.split("/", 3)[3]) for u in web.seeds}
    log = AccessLog(args.access_log, pages)
    nginx_pid = int((args.access_log.parent / "nginx.pid").read_text())
    with contextlib.ExitStack() as stack:
        started = time.time()
        if crawler == "refresher":
            daemon = start_daemon(directory, web, args)
            stack.callback(daemon.stop)
            pid = daemon.pid
        else:
            pid = stack.enter_context(scrapy_process(directory, web, args, complete=True))[0].pid
        # at the start: time, CPU, CPU wait, context switches, the machine's stolen ticks
        first: tuple[float, float, float, tuple[int, int], tuple[int, int]] | None = None
        while True:
            log.poll()
            now, cpu, wait = time.time(), tree_cpu_seconds(pid), tree_cpu_wait_seconds(pid)
            if first is None and log.requests:
                first = (now, cpu, wait, context_switches(pid), steal_ticks())
                threads0, switches0 = thread_cpu_seconds(pid), thread_switches(pid)
                waits0, nginx_wait0 = thread_waits(pid), cpu_wait_seconds(nginx_pid)
                machine0 = machine_reading(pid, nginx_pid)
                if args.stages and crawler == "refresher":
                    status0 = daemon_status(directory)
                if crawler == "refresher":  # --py-spy: the pass, until it is complete
                    spy = start_py_spy(args, pid, args.workers, seconds=args.limit)
                    if spy is not None:
                        stack.callback(finish_py_spy, spy)
            if first is not None and (log.complete or now - first[0] > args.limit):
                break
            time.sleep(0.2)
        machine1 = machine_reading(pid, nginx_pid)
        rss, peak = tree_rss_bytes(pid), rss_bytes(pid, "VmHWM")
        switches, steal = context_switches(pid), steal_ticks()
        if args.stages and crawler == "refresher":  # the pass's stages and CPU by thread
            print_stages(status0, daemon_status(directory))
            names = thread_names(pid)
            print_threads(threads0, thread_cpu_seconds(pid), names, len(log.served))
            kinds = cpu_by_thread_kind(switches0, thread_switches(pid), names)
            per = "  ".join(
                f"{k} {v / len(log.served):.1f}/{i / len(log.served):.1f}"
                for k, (v, i) in kinds.items()
            )
            print(f"  context switches per page by thread (voluntary/involuntary): {per}")
            waits = cpu_by_thread_kind(waits0, thread_waits(pid), names)
            per = "  ".join(f"{k} {v / (now - first[0]):.2f}" for k, (v, _) in waits.items())
            nginx_wait = (cpu_wait_seconds(nginx_pid) - nginx_wait0) / (now - first[0])
            print(f"  waiting for a CPU, s/s by thread: {per}; nginx {nginx_wait:.2f}")
    if args.py_spy is not None and crawler == "refresher":
        print_profile(Path(args.py_spy) / f"daemon-{args.workers}.txt", top=40)
    t0, c0, w0, s0, st0 = first
    print(machine_account(machine0, machine1, len(log.served), now - t0))
    if crawler == "refresher":  # the daemon has stopped: its store may be read
        print(refetch_line(directory / "refresher.duckdb"))
    run = Run(
        crawler,
        len(log.served),
        now - t0,
        cpu - c0,
        rss,
        starved=wait - w0,
        switches=(switches[0] - s0[0], switches[1] - s0[1]),
        steal=(steal[0] - st0[0]) / max(1, steal[1] - st0[1]),
        peak=peak,
    )
    return Complete(run, t0 - started, c0, log.requests, log.complete)


class Turns:
    """Two process trees taking turns at running: one is stopped (SIGSTOP) while the other
    runs for a slice, so a change in the machine's load hits both alike, slice by slice.
    Adds up each one's running time, CPU and CPU wait, and keeps its running spans."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.spans: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
        self.cpu = dict.fromkeys(pids, 0.0)
        self.starved = dict.fromkeys(pids, 0.0)

    def _signal(self, name: str, signum: int) -> None:
        for pid in [self.pids[name], *descendants(self.pids[name])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def stop_all(self) -> None:
        for name in self.pids:
            self._signal(name, signal.SIGSTOP)

    def resume_all(self) -> None:
        for name in self.pids:
            self._signal(name, signal.SIGCONT)

    def run(self, name: str, seconds: float) -> None:
        """Let ``name`` run alone for ``seconds``."""
        pid = self.pids[name]
        c0, w0 = tree_cpu_seconds(pid), tree_cpu_wait_seconds(pid)
        t0 = time.time()
        self._signal(name, signal.SIGCONT)
        time.sleep(seconds)
        self._signal(name, signal.SIGSTOP)
        self.spans[name].append((t0, time.time()))
        self.cpu[name] += tree_cpu_seconds(pid) - c0
        self.starved[name] += tree_cpu_wait_seconds(pid) - w0

    def seconds(self, name: str) -> float:
        return sum(t1 - t0 for t0, t1 in self.spans[name])


def run_interleaved(directory: Path, web: Web, args: argparse.Namespace) -> tuple[Run, Run]:
    """Both crawlers started together, warmed up together, then taking turns of
    ``--interleave`` seconds each for ``--seconds`` each. refresher's pages are those whose
    first fetch (``seeds`` given: the docs web's first pass) or any 2xx fetch finished in
    its turns; Scrapy's, those its spider parsed in its turns."""
    (directory / "r").mkdir()
    (directory / "s").mkdir()
    daemon = start_daemon(directory / "r", web, args)
    try:
        daemon.wait_ready()
        with scrapy_process(directory / "s", web, args) as (scrapy, pages):
            time.sleep(args.warmup)
            turns = Turns({"refresher": daemon.pid, "scrapy": scrapy.pid})
            turns.stop_all()
            time.sleep(0.3)  # Scrapy's count file is written every 0.05 s while it runs
            p0 = pages()
            try:
                while turns.seconds("scrapy") < args.seconds:
                    turns.run("refresher", args.interleave)
                    turns.run("scrapy", args.interleave)
                time.sleep(0.3)
                p1 = pages()
                rss = {"refresher": tree_rss_bytes(daemon.pid), "scrapy": rss_bytes(scrapy.pid)}
            finally:
                turns.resume_all()
    finally:
        daemon.stop()
    db = directory / "r" / "refresher.duckdb"
    if web.first_pass:
        times, answered = first_fetches(directory / "r"), []
    else:  # every 2xx fetch; and every response, the 304s to its conditional GETs included
        rows = query(db, "SELECT finished_at, status FROM fetches ORDER BY finished_at", {})
        times = [t for t, status in rows if status is not None and 200 <= status <= 299]
        answered = [t for t, status in rows if status is not None]

    def within(stamps: list[float]) -> int:
        return sum(
            bisect.bisect_left(stamps, t1) - bisect.bisect_left(stamps, t0)
            for t0, t1 in turns.spans["refresher"]
        )

    seconds, cpu, starved = turns.seconds, turns.cpu, turns.starved
    mine = Run(
        "refresher",
        within(times),
        seconds("refresher"),
        cpu["refresher"],
        rss["refresher"],
        within(answered),
        starved=starved["refresher"],
    )
    theirs = Run(
        "Scrapy",
        p1 - p0,
        seconds("scrapy"),
        cpu["scrapy"],
        rss["scrapy"],
        starved=starved["scrapy"],
    )
    return mine, theirs


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def one_round(round_: int, web: Web, args: argparse.Namespace) -> dict[str, Run]:
    """Each crawler's run of one round, printed as they end."""
    runs: dict[str, Run] = {}
    crawlers = args.crawlers.split(",")
    if args.complete:
        for crawler in crawlers if round_ % 2 == 0 else crawlers[::-1]:
            with tempfile.TemporaryDirectory(prefix=f"vs-{crawler}-", dir=args.tmp) as tmp:
                before = load_average()
                complete = run_complete(Path(tmp), web, args, crawler)
            runs[crawler] = complete.run
            print(complete.line() + f"  (load average before: {before})")
        return runs
    if args.interleave:
        with tempfile.TemporaryDirectory(prefix="vs-turns-", dir=args.tmp) as tmp:
            before = load_average()
            pair = run_interleaved(Path(tmp), web, args)
        for crawler, run in zip(("refresher", "scrapy"), pair, strict=True):
            runs[crawler] = run
            print(run.line() + f"  (load average before: {before})")
        return runs
    # alternate who goes first, so a change in the machine's load hits both alike
    for crawler in crawlers if round_ % 2 == 0 else crawlers[::-1]:
        with tempfile.TemporaryDirectory(prefix=f"vs-{crawler}-", dir=args.tmp) as tmp:
            before = load_average()
            if crawler == "refresher":
                run = run_refresher(Path(tmp), web, args)
            else:
                run = run_scrapy(Path(tmp), web, args)
            runs[crawler] = run
            print(run.line() + f"  (load average before: {before})")
    return runs


def both(web: Web, args: argparse.Namespace) -> None:
    how = f", turns of {args.interleave:g} s" if args.interleave else ""
    window = f"warmup {args.warmup:.0f} s, window {args.seconds:.0f} s{how}"
    if args.complete:
        window = f"every page of {len(web.seeds or ())} once, both seeded with all of them"
    print(f"{web.name}: {len(web.starts)} hosts, {window}")
    ratios: list[float] = []
    for round_ in range(args.rounds):
        # quiet and loaded in turns, the order alternating as the crawlers' does
        for load in args.load if round_ % 2 == 0 else args.load[::-1]:
            ratio = loaded_round(round_, load, web, args)
            if ratio is not None:
                ratios.append(ratio)
    if len(ratios) > 1:
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"  ratios {listed}; median {statistics.median(ratios):.2f}")


def loaded_round(round_: int, load: int, web: Web, args: argparse.Namespace) -> float | None:
    """:func:`one_round` with ``load`` competitor processes running (``--load``); the ratio
    of refresher's pages/s to Scrapy's where both ran."""
    if len(args.load) > 1 or load:
        nice = os.getpriority(os.PRIO_PROCESS, 0) if args.load_nice is None else args.load_nice
        print(f"  load: {load} {args.load_kind} process(es) at nice {nice}")
    with competitors(load, args.load_kind, args.load_nice) as pids:
        t0, c0 = time.time(), sum(cpu_seconds(pid) for pid in pids)
        runs = one_round(round_, web, args)
        used = sum(cpu_seconds(pid) for pid in pids) - c0
    if load:
        print(f"  the competitors used {used / (time.time() - t0):.2f} cores")
    ratio = None
    if len(runs) == 2 and runs["scrapy"].pages:
        mine, theirs = runs["refresher"], runs["scrapy"]
        ratio = (mine.pages / mine.seconds) / (theirs.pages / theirs.seconds)
        answered = (
            f"; by responses, 304s counted: "
            f"{(mine.fetches / mine.seconds) / (theirs.pages / theirs.seconds):.2f}"
            if mine.fetches
            else ""
        )
        cpu = (theirs.cpu / theirs.pages) / (mine.cpu / mine.pages) if mine.pages else 0.0
        print(
            f"  round {round_ + 1}: ratio refresher/Scrapy {ratio:.2f}{answered}; "
            f"CPU per page Scrapy/refresher {cpu:.2f}"
        )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapy", default="/tmp/scrapy-venv/bin/python", help="Scrapy's python")
    parser.add_argument("--web", default="docs,sim")
    parser.add_argument("--crawlers", default="refresher,scrapy")
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--hosts", type=int, default=20, help="virtual hosts of the docs web")
    parser.add_argument("--sim-hosts", type=int, default=500)
    parser.add_argument("--sim-pages", type=int, default=10)
    parser.add_argument("--sim-seed", type=int, default=0, help="the simulated web's seed")
    parser.add_argument(
        "--sim-change",
        type=float,
        default=60.0,
        help="the simulated web's mean change interval of changing pages, seconds",
    )
    parser.add_argument("--workers", type=int, default=256, help="refresher's workers")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--archive",
        choices=("on", "off"),
        default="on",
        help="refresher's WARC copy of every new version (on by default in the daemon; Scrapy "
        "keeps nothing)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, order alternating")
    parser.add_argument(
        "--interleave",
        type=float,
        default=0.0,
        metavar="SLICE",
        help="run both crawlers at once, taking turns of SLICE seconds (the other one stopped) "
        "until each has run --seconds: a change in the machine's load hits both alike "
        "(default 0: one after the other)",
    )
    parser.add_argument(
        "--parse-processes",
        type=lambda v: v if v == "auto" else int(v),
        default=None,
        help="refresher's discovery.parse_processes, a number or auto (default: the daemon's "
        "default)",
    )
    parser.add_argument(
        "--html-parser",
        choices=PARSERS,
        default=None,
        help="refresher's discovery.html_parser (default: the daemon's default, lexbor)",
    )
    parser.add_argument(
        "--refresher-cpus",
        type=parse_cpus,
        default=None,
        metavar="CPUS",
        help="pin refresher's daemon (only it, with its threads and children) to these CPUs, "
        "e.g. 0 or 0-1 (sched_setaffinity; default: wherever the scheduler puts it)",
    )
    parser.add_argument(
        "--load",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[0],
        metavar="N[,N...]",
        help="competitor processes running beside the crawlers (started before each round, "
        "killed after; at the bench's nice value unless --load-nice): a reproducible busy "
        "machine. A list, e.g. 0,1, runs every round at each load in turns (default 0: none)",
    )
    parser.add_argument(
        "--load-kind",
        choices=tuple(LOAD_PROGRAMS),
        default="spin",
        help="what each competitor runs: a busy loop (spin) or numpy copying a 200 MB array "
        "into another (memory: bandwidth and the shared cache)",
    )
    parser.add_argument(
        "--load-nice",
        type=int,
        default=None,
        help="the competitors' nice value (default: the bench's own, as the crawlers'; 0 "
        "under nice -n 10 is other people's work beside a niced bench)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=5000.0,
        help="refresher's budget.fetches_per_second (default 5000: not the limit)",
    )
    parser.add_argument(
        "--replan-share",
        type=float,
        default=None,
        help="refresher's policy.replan_share (default 0: re-plan on the clock alone, at the "
        "bench's resolve_interval of 3,600 s, so no re-plan during a pass; 0.5 is the daemon's)",
    )
    parser.add_argument("--tmp", default=None)
    parser.add_argument(
        "--discover",
        action="store_true",
        help="docs web: seed refresher with the index pages only, as Scrapy starts, so its "
        "first pass goes as fast as discovery finds pages (default: every page a seed)",
    )
    parser.add_argument(
        "--complete",
        action="store_true",
        help="docs web: both crawlers seeded with every page, each run until nginx has served "
        "it every page once (or --limit seconds); pages/s = pages / seconds from its first "
        "request, so both fetch the same pages",
    )
    parser.add_argument(
        "--limit", type=float, default=900.0, help="with --complete: seconds at most per pass"
    )
    parser.add_argument(
        "--py-spy",
        default=None,
        metavar="DIR",
        help="profile refresher with py-spy during each window; stacks go to DIR",
    )
    parser.add_argument(
        "--gil", action="store_true", help="with --py-spy: only samples holding the GIL"
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="with --py-spy: C frames too, each stack under its thread (thread (0x…))",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="print where refresher's refreshes spent their time in the window",
    )
    args = parser.parse_args()
    if "scrapy" in args.crawlers and not Path(args.scrapy).exists():
        sys.exit(f"no Scrapy python at {args.scrapy}: make the venv (see the docstring)")
    pinned = (
        "CPUs " + ",".join(map(str, sorted(args.refresher_cpus)))
        if args.refresher_cpus is not None
        else "every CPU"
    )
    print(
        f"{os.cpu_count()} cores, load average {load_average()}, refresher archive {args.archive}"
        f", refresher on {pinned}, sched_autogroup {autogroup()}"
    )
    webs = args.web.split(",")
    if args.complete and (args.discover or args.interleave or webs != ["docs"]):
        sys.exit(
            "--complete runs the docs web alone (--web docs), without --discover and --interleave"
        )
    if "docs" in webs:
        if shutil.which("nginx") is None or not (args.docs / "index.html").exists():
            sys.exit("apt-get install -y nginx python3.11-doc (or give --docs DIR)")
        with (
            tempfile.TemporaryDirectory(prefix="vs-nginx-", dir=args.tmp) as tmp,
            nginx(
                Path(tmp), args.docs, Path(tmp) / "access.log" if args.complete else None
            ) as port,
        ):
            args.access_log = Path(tmp) / "access.log"
            starts = [f"http://h{i}.docs.test:{port}/index.html" for i in range(args.hosts)]
            # refresher is seeded with every page (Scrapy finds them from the index pages):
            # a refresh crawler re-fetches what it knows, and with few pages known and a budget
            # far above what 20 hosts serve, the index pages would take every host's turns
            pages = sorted(p.relative_to(args.docs).as_posix() for p in args.docs.rglob("*.html"))
            seeds = [
                f"http://h{i}.docs.test:{port}/{page}" for i in range(args.hosts) for page in pages
            ]
            # --discover: from the index pages, as Scrapy, the rest found by discovery
            both(
                Web("docs", starts, "*.docs.test", port, None if args.discover else seeds, True),
                args,
            )
    if "sim" in webs:
        with (
            tempfile.TemporaryDirectory(prefix="vs-site-", dir=args.tmp) as tmp,
            site_server(
                args.sim_hosts,
                args.sim_pages,
                Path(tmp),
                ["--seed", str(args.sim_seed), "--mean-change-interval", str(args.sim_change)],
            ) as (_, port),
        ):
            starts = [f"http://h{i}.sim.test:{port}/" for i in range(args.sim_hosts)]
            both(Web("sim", starts, "*.sim.test", port), args)


if __name__ == "__main__":
    main()
