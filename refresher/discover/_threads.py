"""Where the processors run: a fixed set of parse threads (one per core) in the daemon's
process, and worker processes for larger bodies.

libxml2 parses without the GIL, so these threads use every core; keeping them few and fixed
matters for memory as well as for the GIL. Each thread that parses keeps its own malloc arena
and lxml parser context, so parsing spread over trio's general thread cache (which also runs
DNS lookups and other blocking calls, and grows with them) made the daemon's RSS grow with the
number of distinct threads that had ever parsed: about 10 MiB each (bench/bench_parsers.py).

Link resolution and the simhash still hold the GIL, which the event loop needs for every
fetch. A page of real size is therefore handed to a worker *process* (when
``discovery.parse_processes`` > 0): the daemon's process then pays only for pickling the body
there and the result back, about 7 % of parsing it (bench/bench_parse_pool.py), and the parse
runs on another core. A tiny page costs more to hand over than to parse
(:data:`PROCESS_MIN_BYTES`), so it stays on a thread. The workers run the same code on the
same document, so the result is the same; processors :func:`~refresher.discover._parse.
register`-ed at run time exist only in this process, so while there are any every body stays
here.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

import trio

from refresher.ops._logging import configure_logging, get_logger

__all__ = ["PROCESS_MIN_BYTES", "ParseCrashed", "ParseProcesses", "ParseThreads", "Parsers"]

T = TypeVar("T")
log = get_logger("parse")

#: bodies of at least this many bytes go to the parse processes, smaller ones to a thread:
#: handing a 374-byte page to a process cost the daemon's process 0.12-0.20 ms against 0.09
#: ms to parse it on a thread, a 95 kB page 0.5 ms against 7 ms (bench/bench_parse_pool.py)
PROCESS_MIN_BYTES = 16 * 1024


async def _outcome(executor: Executor, fn: Callable[[], T]) -> T:
    """``fn()`` on ``executor``, awaited without blocking trio and without being cancellable:
    the call cannot be stopped half-way, so its caller waits it out (as ``trio.to_thread``)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def finished(_: Future[T]) -> None:
        token.run_sync_soon(done.set)

    future = executor.submit(fn)
    future.add_done_callback(finished)
    with trio.CancelScope(shield=True):
        await done.wait()
    return future.result()


class ParseThreads:
    """Runs blocking calls on ``threads`` dedicated threads (default: one per core).

    :meth:`run` waits for its call without being cancellable, as ``trio.to_thread.run_sync``
    does by default: the thread cannot be stopped half-way, so its caller waits it out.
    """

    def __init__(self, threads: int | None = None) -> None:
        count = threads if threads is not None else (os.cpu_count() or 1)
        if count < 1:
            raise ValueError(f"threads={count}: give at least 1")
        self.threads = count
        self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="parse")

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of the parse threads; its result, or its exception re-raised."""
        return await _outcome(self._executor, fn)

    def close(self) -> None:
        """Stop the threads once the calls already submitted have finished."""
        self._executor.shutdown(wait=True)


class ParseCrashed(Exception):
    """A parse process died while it held the call (a crash in C code, or killed)."""


def _start_worker(log_format: str, log_level: str) -> None:
    configure_logging(format=log_format, level=log_level)  # as the daemon logs


def _context() -> multiprocessing.context.BaseContext:
    # Never a plain fork of the daemon: its other threads (trio's, DuckDB's) would be copied
    # mid-step. The fork server is a clean process that imports the parser once.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["refresher.discover._parse"])
        return ctx
    return multiprocessing.get_context("spawn")


class ParseProcesses:
    """Runs picklable calls on ``processes`` worker processes, started on first use.

    A worker that dies mid-call fails that call with :class:`ParseCrashed` (the daemon goes
    on: isolating a crash in C code is a gain of its own) and the pool is started anew.
    """

    def __init__(self, processes: int, *, log_format: str = "json", log_level: str = "info"):
        if processes < 1:
            raise ValueError(f"processes={processes}: give at least 1")
        self.processes = processes
        self._start = (log_format, log_level)
        self._executor: ProcessPoolExecutor | None = None  # made on first use
        self.crashes = 0

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.processes,
            mp_context=_context(),
            initializer=_start_worker,
            initargs=self._start,
        )

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker process; its result, or its exception re-raised."""
        if self._executor is None:
            self._executor = self._new()
        executor = self._executor
        try:
            return await _outcome(executor, fn)
        except BrokenProcessPool as e:
            if self._executor is executor:  # the first caller to see it starts a new pool
                self.crashes += 1
                log.error("a parse process died; starting new ones", error=str(e))
                self._executor = self._new()
                await trio.to_thread.run_sync(executor.shutdown)
            raise ParseCrashed(str(e)) from e

    def close(self) -> None:
        """Stop the workers once the calls already submitted have finished."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class Parsers:
    """The parse threads, and ``processes`` worker processes (0: none) for bodies of at least
    :data:`PROCESS_MIN_BYTES`."""

    def __init__(
        self, *, processes: int = 0, log_format: str = "json", log_level: str = "info"
    ) -> None:
        self.threads = ParseThreads()
        self.processes = (
            ParseProcesses(processes, log_format=log_format, log_level=log_level)
            if processes > 0
            else None
        )

    async def run(self, fn: Callable[[], T], *, size: int, portable: bool = True) -> T:
        """``fn()`` for a body of ``size`` bytes: in a process when there are any, the body
        is large enough and ``fn`` runs the same there (``portable``), else on a thread."""
        if self.processes is not None and portable and size >= PROCESS_MIN_BYTES:
            return await self.processes.run(fn)
        return await self.threads.run(fn)

    def close(self) -> None:
        self.threads.close()
        if self.processes is not None:
            self.processes.close()
