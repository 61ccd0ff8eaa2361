"""The parse hand-off's cost to the event loop: its thread's CPU per call, apart from the parse.

Calls ``len(body)`` (no parse: the hand-off alone) with a body of ``--kib`` KiB, ``--calls``
times per round: on one parse process, ``--in-flight`` calls at a time (as the crawl's hosts
keep its pipeline busy), then on the parse threads one at a time. Prints the event loop's
thread CPU (``time.thread_time``) and wall time per call. Run old and new trees in turns,
each from its own directory (bench/README.md, "The parse hand-off's cost to the event loop").

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/bench_handoff.py
"""

from __future__ import annotations

import argparse
import functools
import time

import trio

from refresher.discover._threads import ParseProcesses, ParseThreads


async def process_round(processes: ParseProcesses, body: bytes, calls: int, flight: int) -> str:
    limit = trio.Semaphore(flight)

    async def one() -> None:
        async with limit:
            await processes.run(functools.partial(len, body))

    cpu, wall = time.thread_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(calls):
            nursery.start_soon(one)
    return per_call("process", cpu, wall, calls)


async def thread_round(threads: ParseThreads, body: bytes, calls: int) -> str:
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        await threads.run(functools.partial(len, body))
    return per_call("thread", cpu, wall, calls)


def per_call(kind: str, cpu: float, wall: float, calls: int) -> str:
    us_cpu = 1e6 * (time.thread_time() - cpu) / calls
    us_wall = 1e6 * (time.perf_counter() - wall) / calls
    return f"  {kind:8} {us_cpu:6.1f} us of the loop's CPU per call, {us_wall:6.1f} us wall"


async def main(args: argparse.Namespace) -> None:
    body = b"x" * (args.kib * 1024)
    async with ParseProcesses(1) as processes:
        await processes.started()
        for _ in range(args.rounds):
            print(await process_round(processes, body, args.calls, args.in_flight))
    threads = ParseThreads()
    try:
        for _ in range(args.rounds):
            print(await thread_round(threads, body, args.calls))
    finally:
        threads.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kib", type=int, default=64, help="the body's size")
    parser.add_argument("--in-flight", type=int, default=8, help="process calls at a time")
    trio.run(main, parser.parse_args())
