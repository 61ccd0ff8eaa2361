"""Link extraction in one parse thread against a process pool: what each costs the crawler.

    .venv/bin/python bench/bench_parse_pool.py [DIR] [--passes N]

The daemon processes each new body (links, charset, simhash: ``refresher.discover.process``)
off the event loop. Two ways are measured on real pages (DIR, default the Python 3.11 docs of
Debian's ``python3.11-doc``), each page handed over on its own as the daemon would:

- **thread**: one parse thread in the crawler's process (what the daemon does per core);
- **pool N**: a ``ProcessPoolExecutor`` of N worker processes; the body is pickled to a worker
  and the ``Extracted`` result (links, fingerprint) pickled back.

For each: pages/s (wall), the crawler process's CPU ms per page (the GIL-holding time the
event loop competes with: the whole parse for the thread, only the hand-over and the result
for the pool), the workers' CPU ms per page, and the total. Under load the wall figure moves
with the machine; the CPU split is what carries over. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from bench_daemon import cpu_seconds
from bench_parsers import DEFAULT_DIR, load

from refresher.discover._document import Extracted
from refresher.discover._parse import Document, process


def run(executor: Executor, docs: list[Document], in_flight: int) -> float:
    """Seconds to process every doc, at most ``in_flight`` at a time, one page per task."""
    start = time.perf_counter()
    pending: list[Future[Extracted]] = []
    for doc in docs:  # Extracted pickles: a worker process sends it back as it is
        pending.append(executor.submit(process, doc))
        if len(pending) >= in_flight:
            pending.pop(0).result()
    for future in pending:
        future.result()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--passes", type=int, default=3, help="passes over the pages")
    args = parser.parse_args()
    docs = load(args.dir)
    if not docs:
        sys.exit(f"no .html files under {args.dir}: install python3.11-doc or name a directory")
    work = docs * args.passes
    size = sum(len(d.body) for d in docs) / len(docs) / 1e3
    print(
        f"{len(docs)} pages × {args.passes} passes, {size:.0f} kB each; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| way | pages/s | crawler CPU ms/page | workers CPU ms/page | total CPU ms/page |")
    print("|---|---|---|---|---|")
    me = os.getpid()
    for name, make, in_flight in (
        ("one parse thread", lambda: ThreadPoolExecutor(1), 4),
        ("process pool, 1 worker", lambda: ProcessPoolExecutor(1), 4),
        ("process pool, 2 workers", lambda: ProcessPoolExecutor(2), 8),
    ):
        with make() as executor:
            run(executor, docs[:8], in_flight)  # start the workers, warm their caches
            workers = list(getattr(executor, "_processes", {}) or {})
            c0 = cpu_seconds(me)
            w0 = sum(cpu_seconds(pid) for pid in workers)
            seconds = run(executor, work, in_flight)
            c1 = cpu_seconds(me)
            w1 = sum(cpu_seconds(pid) for pid in workers)
        own, theirs = 1e3 * (c1 - c0) / len(work), 1e3 * (w1 - w0) / len(work)
        rate = len(work) / seconds
        print(f"| {name} | {rate:.0f} | {own:.2f} | {theirs:.2f} | {own + theirs:.2f} |")


if __name__ == "__main__":
    main()
