"""Where the processors run: a fixed set of parse threads (one per core) in the daemon's
process, and worker processes for larger bodies.

Lexbor and libxml2 parse without the GIL (the bare Lexbor parse ran on 1.9 cores in 2
threads), so these threads use every core while they parse; the rest of a page's processing
(link resolution, the simhash) holds the GIL, and the processor as a whole ran on 1.0 core in
2, 8 or 20 threads (bench/bench_parsers.py), so more threads than cores buy nothing: one per
core. Keeping them few and fixed matters for memory as well as for the GIL. Each thread that
parses keeps its own malloc arena and parser state, so parsing spread over trio's general
thread cache (which also runs DNS lookups and other blocking calls, and grows with them) made
the daemon's RSS grow with the number of distinct threads that had ever parsed: about 10 MiB
each (bench/bench_parsers.py).

Link resolution and the simhash still hold the GIL, which the event loop needs for every
fetch. A page of real size can therefore be handed to a worker *process* (when
``discovery.parse_processes`` > 0): the daemon's process then pays only for pickling the body
there and the result back, about 7 % of parsing it (bench/bench_parse_pool.py), and the parse
runs on another core. The event loop writes each call to the worker's stdin pipe and reads the
answer from its stdout itself: no helper thread takes the GIL to move it (a process pool's
manager and feeder threads did, for every call). On the docs web the processes still cost
more CPU per page than the threads (bench/README.md), so they are off by default. A tiny page
costs more to hand over than to parse
(:data:`PROCESS_MIN_BYTES`), so it stays on a thread. The workers run the same code on the
same document, so the result is the same; processors :func:`~refresher.discover._parse.
register`-ed at run time exist only in this process, so while there are any every body stays
here.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

import trio

from refresher.ops._logging import get_logger

__all__ = [
    "HEADER",
    "MIN_PARSE_THREADS",
    "PROCESS_MIN_BYTES",
    "ParseCrashed",
    "ParseProcesses",
    "ParseThreads",
    "Parsers",
    "usable_cpus",
]

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


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (systemd's ``CPUAffinity=``,
    ``taskset``, a container's cpuset), not every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity masks on this platform (macOS)
        return os.cpu_count() or 1


#: parse threads even on one CPU: a daemon pinned to one CPU parsed the Python docs at
#: 4.06-5.23 CPU ms and 197-224 pages/s with two threads, 5.31-7.16 and 134-182 with one (a
#: lone thread idles while the event loop hands it the next page; bench/README.md, "One CPU,
#: one parse thread, a longer switch interval")
MIN_PARSE_THREADS = 2


class ParseThreads:
    """Runs blocking calls on ``threads`` dedicated threads (default: one per CPU the process
    may run on, :func:`usable_cpus`, and at least :data:`MIN_PARSE_THREADS`).

    :meth:`run` waits for its call without being cancellable, as ``trio.to_thread.run_sync``
    does by default: the thread cannot be stopped half-way, so its caller waits it out.
    """

    def __init__(self, threads: int | None = None) -> None:
        count = threads if threads is not None else max(MIN_PARSE_THREADS, usable_cpus())
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


#: bytes of the length that precedes each pickle on a parse process's pipes
HEADER = 8


class ParseCrashed(Exception):
    """A parse process died while it held the call (a crash in C code, or killed)."""


class _Died(Exception):
    """The worker's answer pipe ended: it exited."""


class _Worker:
    """One parse process (:mod:`refresher.discover._parse_worker`) and the pipes to it."""

    def __init__(self, log_format: str, log_level: str) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        try:
            # A fresh interpreter, never a fork of the daemon: its other threads (trio's,
            # DuckDB's) would be copied mid-step.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "refresher.discover._parse_worker", log_format, log_level],
                stdin=to_child,
                stdout=from_child,
                close_fds=True,
            )
        finally:
            os.close(to_child)
            os.close(from_child)
        # Both ends are trio streams: a call is a write and a read on the event loop, with
        # no helper thread taking the GIL to move it (as a process pool's manager does).
        self._calls = trio.lowlevel.FdStream(from_parent)
        self._answers = trio.lowlevel.FdStream(to_parent)
        self._buffer = bytearray()

    async def call(self, request: bytes) -> tuple[bool, Any]:
        """Send one pickled call; its ``(ok, result or exception)``."""
        try:
            await self._calls.send_all(len(request).to_bytes(HEADER, "little") + request)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise _Died from e
        size = int.from_bytes(await self._read(HEADER), "little")
        answer: tuple[bool, Any] = pickle.loads(await self._read(size))
        return answer

    async def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = await self._answers.receive_some(max(n - len(self._buffer), 1 << 16))
            if not chunk:
                raise _Died
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def shut(self) -> None:
        """Close the pipes (in the event loop's thread): the process sees its stdin end."""
        self._calls.close()
        self._answers.close()

    def reap(self, timeout: float = 10.0) -> None:
        """Wait for the process to end (blocking), killing it after ``timeout`` seconds."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ParseProcesses:
    """Runs picklable calls on ``processes`` worker processes, started on first use.

    A call is pickled onto the worker's stdin pipe and its answer read from its stdout by the
    event loop itself. A worker that dies mid-call fails that call with :class:`ParseCrashed`
    (the daemon goes on: isolating a crash in C code is a gain of its own) and the next call
    starts a new one.
    """

    def __init__(self, processes: int, *, log_format: str = "json", log_level: str = "info"):
        if processes < 1:
            raise ValueError(f"processes={processes}: give at least 1")
        self.processes = processes
        self._start = (log_format, log_level)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots: trio.Semaphore | None = None  # made in the event loop, on first use
        self.crashes = 0

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker process; its result, or its exception re-raised. Not
        cancellable once sent: the worker's pipe carries one call at a time."""
        if self._slots is None:
            self._slots = trio.Semaphore(self.processes)
        request = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        async with self._slots:
            worker = self._idle.pop() if self._idle else _Worker(*self._start)
            self._busy.add(worker)
            try:
                with trio.CancelScope(shield=True):
                    ok, result = await worker.call(request)
            except _Died as e:
                self._busy.discard(worker)
                self.crashes += 1
                status = worker.process.poll()
                log.error("a parse process died; a new one takes the next call", status=status)
                worker.shut()
                await trio.to_thread.run_sync(worker.reap)
                raise ParseCrashed(f"the parse process exited (status {status})") from e
            self._busy.discard(worker)
            self._idle.append(worker)
        if not ok:
            raise result
        return result  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the workers, from the event loop's thread once no call is running."""
        workers = [*self._idle, *self._busy]
        for worker in workers:
            worker.shut()
        for worker in workers:
            worker.reap()
        self._idle.clear()
        self._busy.clear()


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
