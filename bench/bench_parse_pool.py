"""The daemon's parse stage on real pages: parse threads alone, or with parse processes.

    .venv/bin/python bench/bench_parse_pool.py [DIR] [--passes N] [--large]

The daemon processes each new body (links, charset, simhash: ``refresher.discover.process``)
off the event loop, through :class:`refresher.discover._threads.Parsers`. Each way below runs
the pages of DIR (default the Python 3.11 docs of Debian's ``python3.11-doc``; ``--large``
keeps only pages of 16 KiB and more, the ones a process may take) through it from a trio
event loop, eight calls in flight, one page per call, as the daemon's workers would:

- **threads**: the parse threads alone (``discovery.parse_processes = 0``);
- **2 processes**: a large page goes to a free process, else to a free thread (``= 2``);
- **auto**: a large page goes to a free thread, else to a free process (``= "auto"``, the
  default; here with two processes, as on a 2-CPU machine);
- **2 processes only**: every large page waits for a process (``= 2`` before 26 Nov).

For each: pages/s (wall), the crawler process's CPU ms per page (what the event loop competes
with: the whole parse on a thread; the pickling, the pipes and the result in a process), the
workers' CPU ms per page, the total, and how many calls went to a process. The processes
start before the timed pass, so their start-up is not counted; their first pass (caches
filling) is. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio
from bench_daemon import cpu_seconds
from bench_parsers import DEFAULT_DIR, load

from refresher._config import Config
from refresher.crawl._workers import processors
from refresher.discover._parse import Document, process
from refresher.discover._threads import PROCESS_MIN_BYTES, Parsers

IN_FLIGHT = 8


async def run(parsers: Parsers, docs: list[Document], only: bool = False) -> float:
    """Seconds to process every doc, :data:`IN_FLIGHT` calls at a time; ``only``: every large
    page to a process (the dispatch before 26 Nov)."""
    builtins = processors(Config().discovery)
    start = time.perf_counter()

    async def lane(mine: list[Document]) -> None:
        for doc in mine:
            job = functools.partial(process, doc, builtins=builtins)
            if only and parsers.processes and len(doc.body) >= PROCESS_MIN_BYTES:
                await parsers.processes.run(job)
            else:
                await parsers.run(job, size=len(doc.body))

    async with trio.open_nursery() as nursery:
        for i in range(IN_FLIGHT):
            nursery.start_soon(lane, docs[i::IN_FLIGHT])
    return time.perf_counter() - start


async def measure(
    make: Callable[[], Parsers], work: list[Document], only: bool
) -> tuple[float, float, float, float]:
    """pages/s, crawler and workers CPU ms per page, the share of pages parsed in a process."""
    me = os.getpid()
    async with make() as parsers:  # the pipes close in the event loop that opened them
        workers: list[int] = []
        if parsers.processes is not None:  # start every worker, outside the timed pass
            async with trio.open_nursery() as nursery:
                for _ in range(parsers.processes.processes):
                    nursery.start_soon(parsers.processes.run, os.getpid)
            workers = parsers.processes.pids()
        c0, w0 = cpu_seconds(me), sum(cpu_seconds(pid) for pid in workers)
        seconds = await run(parsers, work, only)
        c1, w1 = cpu_seconds(me), sum(cpu_seconds(pid) for pid in workers)
        sent = len(work) - parsers.statistics().thread_calls
    pages = len(work)
    return pages / seconds, 1e3 * (c1 - c0) / pages, 1e3 * (w1 - w0) / pages, sent / pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--passes", type=int, default=2, help="passes over the pages")
    parser.add_argument("--large", action="store_true", help="pages of 16 KiB and more only")
    args = parser.parse_args()
    docs = load(args.dir, limit=None)
    if args.large:
        docs = [d for d in docs if len(d.body) >= PROCESS_MIN_BYTES]
    if not docs:
        sys.exit(f"no .html files under {args.dir}: install python3.11-doc or name a directory")
    work = docs * args.passes
    size = sum(len(d.body) for d in docs) / len(docs) / 1e3
    print(
        f"{len(docs)} pages × {args.passes} passes, {size:.0f} kB each; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| way | pages/s | crawler CPU ms/page | workers CPU ms/page | total | to a process |")
    print("|---|---|---|---|---|---|")
    ways = (
        ("threads", functools.partial(Parsers)),
        ("2 processes", functools.partial(Parsers, processes=2, prefer="process")),
        ("auto", functools.partial(Parsers, processes=2, prefer="thread")),
        ("2 processes only", functools.partial(Parsers, processes=2, prefer="process")),
    )
    for name, make in ways:
        rate, own, theirs, share = trio.run(measure, make, work, name.endswith("only"))
        print(
            f"| {name} | {rate:.0f} | {own:.2f} | {theirs:.2f} | {own + theirs:.2f} | {share:.0%} |"
        )


if __name__ == "__main__":
    main()
