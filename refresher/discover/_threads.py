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
``discovery.parse_processes`` is set): the daemon's process then pays only for pickling the
call there and the result back (about 0.5 CPU ms for a 286 kB page, against 7-9 ms to parse
it; bench/bench_parse_pool.py), and the parse runs on another core. The event loop writes
each call to the worker's stdin pipe and reads the answers from its stdout itself: no helper
thread takes the GIL to move them (a process pool's manager and feeder threads did, for
every call). One reader task per worker hands each answer to its call, every answer already
in the pipe at once (a caller reading its own answer after the callers before it had been
scheduled drained one answer per pass of the loop). The body goes down the pipe as it is,
beside the call's pickle rather than copied into it, and the pipes are widened to 1 MiB so
that a large body takes one write, not one per 64 KiB each waking the event loop. A tiny
page costs more to hand over than to parse (:data:`PROCESS_MIN_BYTES`), so it stays on a
thread. The workers run the same code on the same document, so the result is the same;
processors :func:`~refresher.discover._parse.register`-ed at run time exist only in this
process, so while there are any every body stays here.

The daemon's own threads can keep to one CPU and the parse processes to the others
(``split``, :func:`split_cpus`; the daemon's ``discovery.split_cpus``). Every hand-off between
the event loop, the parse threads and the store writer wakes another thread, and the GIL
passes between them many times per page; on the 2-vCPU KVM guest of 26 Nov (kernel 6.18) a
wake-up across CPUs cost ~22 us of CPU and ~45 us of latency against ~2 us on one CPU, and the
daemon spread over both CPUs fetched the Rust book no faster than pinned to one (527 against
523 pages/s) at 2.44 against 1.87 CPU ms per page (bench/README.md, "Hand-offs across CPUs").
The GIL keeps the daemon's Python on about one core anyway: the second core is worth most to
the parse processes, which need one wake-up per page each way.

Threads and processes work together (:class:`Parsers`): a large page takes whichever is free,
a process first (``parse_processes = N``, or split) or a thread first (``"auto"`` unsplit: a
process takes a large page when every thread is busy, so a backlog gets both cores; one idle
for a minute ends). Before, every large page waited for a process while a parse thread
idled. A rule that kept the processes out until most recent large pages had found the
threads busy was tried: it did not keep them off at a budget and cost the Node.js docs most
of their gain (bench/README.md, "Parse threads and processes together").
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import trio

from refresher._cpus import (
    cpu_mask,
    keep_threads_to,
    no_wakeup_preemption,
    split_cpus,
    usable_cpus,
)
from refresher.discover._parse_worker import HEADER
from refresher.ops._logging import get_logger

__all__ = [
    "HEADER",
    "IDLE_SECONDS",
    "MIN_PARSE_THREADS",
    "PIPELINE",
    "PIPE_BYTES",
    "PROCESS_MIN_BYTES",
    "ParseCrashed",
    "ParseProcesses",
    "ParseThreads",
    "Parsers",
    "ParsersStatistics",
    "pickled_call",
    "widen",
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
        self._executor = ThreadPoolExecutor(
            max_workers=count, thread_name_prefix="parse", initializer=no_wakeup_preemption
        )

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of the parse threads; its result, or its exception re-raised."""
        return await _outcome(self._executor, fn)

    def close(self) -> None:
        """Stop the threads once the calls already submitted have finished."""
        self._executor.shutdown(wait=True)


#: the size asked for each parse process's pipes (Linux's ``F_SETPIPE_SZ``; 1 MiB is the
#: unprivileged maximum by default): a 350 kB body then goes in one write, where the default
#: 64 KiB pipe took six, each waking the event loop and the worker again
PIPE_BYTES = 1 << 20

#: calls a parse process takes at a time: while the event loop gets round to reading one
#: answer, the process works on the next call, already in its pipe. A call's round trip was
#: 5-8 ms in the daemon on the Rust book against ~1.2 CPU ms in the process (the loop's CPU
#: busy), so with one call each the processes idled while large pages waited or went to the
#: parse threads, on the event loop's CPU. Eight (four until 27 Nov 05:40): the Rust book's and
#: the git docs' threads took a third fewer large pages; beyond the first call, no more than
#: :data:`PIPE_BYTES` of calls wait in a process (:meth:`ParseProcesses.reserve`)
PIPELINE = 8


def widen(fd: int) -> None:
    """Ask for a :data:`PIPE_BYTES` pipe; where that is refused or unknown, the pipe stays."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):  # not Linux, or above pipe-max-size
        pass


class _CallPickler(pickle.Pickler):
    """Pickles a call with its first large ``bytes`` (the body) left out, as a persistent
    reference: the body then goes down the pipe as it is, never copied into the pickle (the
    copy cost more than the rest of the pickle: 0.076 against 0.008 ms for a 286 kB body)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.body = b""

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is bytes and not self.body and len(obj) >= PROCESS_MIN_BYTES:
            self.body = obj
            return 0
        return None


def pickled_call(fn: Callable[[], Any]) -> tuple[bytes, bytes]:
    """``fn`` as a pickle without its body, and the body (empty when it has none that large)."""
    out = io.BytesIO()
    pickler = _CallPickler(out)
    pickler.dump(fn)
    return out.getvalue(), pickler.body


class ParseCrashed(Exception):
    """A parse process died while it held the call (a crash in C code, or killed)."""


class _Died(Exception):
    """The worker's answer pipe ended: it exited."""


class _Pending:
    """A call sent to a parse process: ``answer`` is its pickled answer, set before ``done``
    (left ``None`` when the process died first)."""

    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.answer: bytes | None = None
        self.done = trio.Event()


class _Worker:
    """One parse process (:mod:`refresher.discover._parse_worker`) and the pipes to it."""

    def __init__(self, log_format: str, log_level: str, cpus: frozenset[int] = frozenset()):
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
        if cpus:  # before the interpreter starts a thread: each it starts takes this mask
            with contextlib.suppress(OSError):  # already gone: its first call says so
                os.sched_setaffinity(self.process.pid, cpus)
        widen(from_parent)
        widen(to_parent)
        # Both ends are trio streams: a call is a write and a read on the event loop, with
        # no helper thread taking the GIL to move it (as a process pool's manager does).
        self._calls = trio.lowlevel.FdStream(from_parent)
        self._answers = trio.lowlevel.FdStream(to_parent)
        self._buffer = bytearray()
        self._sending = trio.Lock()
        # the calls sent and not yet answered, in the order sent: the process answers in
        # that order, and the reader (:meth:`serve`) hands each answer to the oldest
        self._pending: deque[_Pending] = deque()
        self.dead = False
        self.readied = trio.Event()  # set once the notice is read, or the process has died
        # set by ParseProcesses.reserve and run: calls it holds (reserved, being sent, or
        # in its pipe, not yet answered), their bytes, and when its last call was answered
        self.inflight = 0
        self.queued = 0
        self.since = time.monotonic()

    async def serve(self, ready: Callable[[], None]) -> None:
        """Read the ready notice, set ``readied`` and call ``ready``; then read the answers
        as they come, each handed to the oldest call waiting (the process answers in order),
        all those already in the pipe at once: a caller never waits for the callers before it
        to be scheduled. Returns when the process is dead: its pipe ended, or it began
        with anything but the notice."""
        try:
            notice = await self._read(HEADER)
            if any(notice):
                log.error("a parse process began without its ready notice", notice=notice.hex())
                return
            self.readied.set()
            ready()
            while True:
                size = int.from_bytes(await self._read(HEADER), "little")
                answer = await self._read(size)
                if not self._pending:
                    log.error("a parse process answered a call never sent")
                    return
                call = self._pending.popleft()
                call.answer = answer
                call.done.set()
        except _Died:
            return
        finally:
            self._die()

    async def call(self, request: bytes, body: bytes) -> tuple[bool, Any]:
        """Send one pickled call and its body (:func:`pickled_call`); its ``(ok, result or
        exception)``. Calls may overlap (:data:`PIPELINE`): the process works through them
        in order, and :meth:`serve` hands each its answer."""
        head = len(request).to_bytes(HEADER, "little") + len(body).to_bytes(HEADER, "little")
        call = _Pending()
        try:
            if self._sending.locked():  # behind a call still being written: after it
                async with self._sending:
                    if self.dead:
                        raise _Died
                    self._pending.append(call)
                    await self._send(head + request, body)
            else:
                if self.dead:
                    raise _Died
                self._pending.append(call)
                if rest := self._write_now(head + request, body):
                    self._sending.acquire_nowait()  # free: nothing awaited since locked()
                    try:
                        await self._send(rest, b"")
                    finally:
                        self._sending.release()
            await call.done.wait()
            if call.answer is None:
                raise _Died
            answer: tuple[bool, Any] = pickle.loads(call.answer)
            return answer
        except _Died:
            self._die()
            raise

    def _write_now(self, head: bytes, body: bytes) -> bytes:
        """Write a call to the pipe at once, with one system call and no pass of the event
        loop (the pipe has room for it as a rule, :data:`PIPE_BYTES`); what did not fit, which
        the caller sends next, before any other call."""
        try:
            sent = os.writev(self._calls.fileno(), [head, body] if body else [head])
        except BlockingIOError:
            sent = 0
        except OSError as e:  # the process has gone (EPIPE), or its pipe is closed (EBADF)
            raise _Died from e
        if sent == len(head) + len(body):
            return b""
        return (head + body)[sent:]

    async def _send(self, head: bytes, body: bytes) -> None:
        try:
            await self._calls.send_all(head)
            if body:
                await self._calls.send_all(body)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise _Died from e

    def _die(self) -> None:
        """The process is gone (or its pipes closed): every call still waiting on it fails
        too, and whoever waits for its notice is woken."""
        self.dead = True
        self.readied.set()
        while self._pending:
            self._pending.popleft().done.set()  # no answer: the call raises _Died

    async def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = await self._answers.receive_some(max(n - len(self._buffer), 1 << 16))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise _Died from e
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
    """Runs picklable calls on ``processes`` worker processes, started on first use, each
    taking up to ``pipeline`` calls at a time (:data:`PIPELINE`) while its pipe holds less
    than :data:`PIPE_BYTES` (:meth:`reserve`).

    A call is pickled onto the worker's stdin pipe and its answer read from its stdout by the
    event loop itself. A worker that dies mid-call fails that call with :class:`ParseCrashed`
    (the daemon goes on: isolating a crash in C code is a gain of its own), and the calls
    sent to it after that one; the next call starts a new one.

    Used as ``async with ParseProcesses(n) as processes:``: each worker's notice and answers
    are read by a task in a nursery of this object's, and the block's end stops the workers.
    """

    def __init__(
        self,
        processes: int,
        *,
        log_format: str = "json",
        log_level: str = "info",
        cpus: frozenset[int] = frozenset(),
        pipeline: int | None = None,
    ):
        if processes < 1:
            raise ValueError(f"processes={processes}: give at least 1")
        self.processes = processes
        self.pipeline = PIPELINE if pipeline is None else pipeline
        if self.pipeline < 1:
            raise ValueError(f"pipeline={self.pipeline}: give at least 1")
        self._start = (log_format, log_level, cpus)  # cpus: the workers' mask (empty: as ours)
        self._running: list[_Worker] = []  # idle or busy
        self._ended: list[_Worker] = []  # shut (idle, or dead), not yet reaped
        self._ready: set[_Worker] = set()  # running, their notice read and not dead
        self._room = trio.lowlevel.ParkingLot()  # direct callers waiting for room (run)
        self._nursery: trio.Nursery | None = None  # the notice readers', inside the block
        #: called when a worker has said it is ready (:class:`Parsers` hands it the waiting)
        self.on_ready: Callable[[], None] | None = None
        self.crashes = 0

    async def __aenter__(self) -> ParseProcesses:
        self._serving = self._serve()
        return await self._serving.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._serving.__aexit__(exc_type, exc, tb)

    @contextlib.asynccontextmanager
    async def _serve(self) -> AsyncIterator[ParseProcesses]:
        """The workers' notice readers in a nursery of ours until the block ends, then
        :meth:`_close`: a reader that fails ends the parse stage's block, not the daemon."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()  # readers of workers that never said ready
                self._close()

    def reserve(self, size: int) -> _Worker | None:
        """A ready worker with room for a call of ``size`` bytes, its place taken from now
        until :meth:`run` on it ends; ``None`` while none has room (those not running
        start). A worker has room while it holds fewer than ``pipeline`` calls and, beyond
        its first, fewer than :data:`PIPE_BYTES` with this one: calls queued behind a huge
        page (the Node.js docs' 8.4 MB ``all.html``) held their hosts and kept the pages
        away from the idle threads. Of those with room: the idle one used last (so the
        others age and expire), else the one with the fewest bytes in its pipe."""
        self.ready()
        room = [
            w
            for w in self._ready
            if w.inflight == 0 or (w.inflight < self.pipeline and w.queued + size <= PIPE_BYTES)
        ]
        if not room:
            return None
        idle = [w for w in room if w.inflight == 0]
        worker = max(idle, key=lambda w: w.since) if idle else min(room, key=lambda w: w.queued)
        worker.inflight += 1
        worker.queued += size
        return worker

    def _spawn(self) -> _Worker:
        """A new worker, running, and a task in our nursery that reads its answers."""
        if self._nursery is None:
            raise RuntimeError("ParseProcesses start workers only inside 'async with'")
        worker = _Worker(*self._start)
        self._running.append(worker)
        self._nursery.start_soon(self._watch, worker)
        return worker

    async def _watch(self, worker: _Worker) -> None:
        """Serve ``worker``'s answers until it dies: counted ready (and ``on_ready`` called,
        in the event loop's thread) from its notice, retired when its pipe ends."""
        await worker.serve(ready=functools.partial(self._readied, worker))
        if worker in self._running:  # not ended for idling, nor retired by a failed call
            if worker in self._ready:
                self._retire(worker, "a parse process died; a new one takes the next call")
            else:
                self._retire(worker, "a parse process ended before it was ready")

    def _readied(self, worker: _Worker) -> None:
        self._ready.add(worker)
        self._room.unpark_all()
        if self.on_ready is not None:
            self.on_ready()

    def _retire(self, worker: _Worker, message: str) -> None:
        """``worker`` died (before its notice, or during a call): it leaves, counted as a
        crash, its pipes closed; it is reaped later without blocking (:meth:`expire`, the
        block's end), and the next call starts a new one."""
        self._running.remove(worker)
        self._ready.discard(worker)
        self.crashes += 1
        log.error(message, status=worker.process.poll())
        worker.shut()
        self._reap_ended()
        self._ended.append(worker)
        self._room.unpark_all()  # a call waiting for room starts the next worker

    def _reap_ended(self) -> None:
        """Forget the ended workers that have exited (``poll`` reaps them), without blocking."""
        self._ended = [w for w in self._ended if w.process.poll() is None]

    def ready(self) -> bool:
        """Start every worker not running (without waiting for it); whether one of them has
        said it is ready (:mod:`refresher.discover._parse_worker`). Constant time: the ready
        workers are kept as they change, not looked for (it runs for every large page)."""
        while len(self._running) < self.processes:
            self._spawn()
        return bool(self._ready)

    async def started(self) -> None:
        """Start every worker not running and wait until each is ready or dead (a warm
        pool for tests and benches; the daemon never waits: :class:`Parsers` hands large pages
        to the threads meanwhile)."""
        self.ready()
        for worker in list(self._running):
            await worker.readied.wait()

    async def run(self, fn: Callable[[], T], *, place: tuple[_Worker, int] | None = None) -> T:
        """``fn()`` in a worker process; its result, or its exception re-raised. ``place``:
        the worker :meth:`reserve` gave for a call of that many bytes; without it, the first
        worker with room for the pickled call, waited for. Not cancellable once sent: the
        worker's pipe carries its calls in order."""
        request, body = pickled_call(fn)
        if place is None:
            size = len(request) + len(body)
            while (worker := self.reserve(size)) is None:
                await self._room.park()
        else:
            worker, size = place
        try:
            with trio.CancelScope(shield=True):
                ok, result = await worker.call(request, body)
        except _Died as e:
            status = worker.process.poll()
            if worker in self._running:  # the first of its calls to fail
                self._retire(worker, "a parse process died; a new one takes the next call")
            raise ParseCrashed(f"the parse process exited (status {status})") from e
        finally:
            worker.inflight -= 1
            worker.queued -= size
            worker.since = time.monotonic()
            self._room.unpark_all()
        if not ok:
            raise result
        return result  # type: ignore[no-any-return]

    def _close(self) -> None:
        """Stop the workers, from the event loop's thread once no call is running."""
        for worker in self._running:
            worker.shut()
        for worker in [*self._running, *self._ended]:
            worker.reap()
        self._running.clear()
        self._ready.clear()
        self._ended.clear()

    def expire(self, idle_seconds: float, now: float) -> int:
        """End the workers that took no call for ``idle_seconds`` (their memory goes back to
        the system); how many. Without blocking: each is reaped later, or at the block's end."""
        self._reap_ended()
        old = [w for w in self._running if w.inflight == 0 and now - w.since >= idle_seconds]
        for worker in old:
            self._running.remove(worker)
            self._ready.discard(worker)
            worker.shut()
            self._ended.append(worker)
        return len(old)

    def pids(self) -> list[int]:
        """The process ids of the workers running now (idle or busy)."""
        return [w.process.pid for w in self._running]


#: with ``prefer="thread"`` (``parse_processes = "auto"``) a process that took no call for
#: this many seconds ends, giving its memory back (~100 MiB each on the docs webs)
IDLE_SECONDS = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsersStatistics:
    """A snapshot of :class:`Parsers`: calls started on a thread, in a process and on the
    event loop itself so far, calls waiting for a slot now, worker processes running now
    (idle or busy)."""

    thread_calls: int
    process_calls: int
    loop_calls: int
    waiting: int
    processes: int


class _Waiter:
    """A call for a body of ``size`` bytes waiting for a parse slot: ``kind`` is the slot it
    was handed ("thread" or "process"; with a process, ``worker`` its place), set before
    ``ready``."""

    __slots__ = ("kind", "ready", "seq", "size", "worker")

    def __init__(self, seq: int, size: int) -> None:
        self.seq = seq
        self.size = size
        self.kind = ""
        self.worker: _Worker | None = None
        self.ready = trio.Event()


class Parsers:
    """The parse threads, and ``processes`` worker processes (0: none) for bodies of at least
    :data:`PROCESS_MIN_BYTES`, working together.

    A large body takes whichever slot is free, in the order ``prefer`` says: a process first
    (an idle parse thread takes it when every process is busy), or a thread first: a process
    takes a large body only when every thread is busy, and starts then; one that took no call
    for :data:`IDLE_SECONDS` ends. A small body, or one only this process can parse, waits
    for a thread. Calls that find no free slot wait in order of arrival, each handed the
    first slot freed that it may take. Everything here runs in the event loop's thread, inside
    ``async with Parsers(...) as parsers:``; the block's end stops the threads and processes.

    ``split`` (with processes, on two CPUs or more, :func:`split_cpus`): from the first
    call, whatever its size, until the block ends, every thread of this process keeps to one
    CPU, the processes to the others, and a small body is parsed on the event loop itself;
    idle processes end as with ``prefer="thread"``.
    """

    def __init__(
        self,
        *,
        processes: int = 0,
        prefer: str = "process",
        split: bool = False,
        log_format: str = "json",
        log_level: str = "info",
    ) -> None:
        if prefer not in ("process", "thread"):
            raise ValueError(f"prefer={prefer!r}: give 'process' or 'thread'")
        self.threads = ParseThreads()
        mask = cpu_mask()
        halves = split_cpus(mask) if split and processes > 0 else None
        self.processes = (
            ParseProcesses(
                processes,
                log_format=log_format,
                log_level=log_level,
                cpus=halves[1] if halves is not None else frozenset(),
            )
            if processes > 0
            else None
        )
        # the threads keep to halves[0] from the first call until the block ends (none pinned
        # before: a Parsers made and never used leaves every mask as it was)
        self._split = halves
        self._mask: frozenset[int] | None = None  # while pinned: the mask to give back
        order = ("process", "thread") if prefer == "process" else ("thread", "process")
        self._order = order
        self._adaptive = prefer == "thread" or halves is not None
        self._free_threads = self.threads.threads
        self._any: deque[_Waiter] = deque()  # large bodies: a thread or a process
        self._thread_only: deque[_Waiter] = deque()
        self._arrivals = 0
        self.calls = {"thread": 0, "process": 0, "loop": 0}
        if self.processes is not None:
            self.processes.on_ready = self._hand_to_processes

    def warm(self) -> None:
        """Start the worker processes now, not waited for, when a large page goes to a process
        first (a number of processes, or a CPU split): a new interpreter's imports then overlap
        the caller's start-up instead of the first large pages, which the threads would take
        meanwhile. Processes that only take the overflow start on demand."""
        if self.processes is not None and self._order[0] == "process":
            self.processes.ready()

    async def run(self, fn: Callable[[], T], *, size: int, portable: bool = True) -> T:
        """``fn()`` for a body of ``size`` bytes: in a process when there are any, the body
        is large enough, ``fn`` runs the same there (``portable``) and a process is the
        first free slot; else on a thread, but a small body on the event loop itself while
        split (the threads share its CPU then). Not cancellable: a call is waited out."""
        if self._adaptive and self.processes is not None:
            # on every call, small pages' too (those parsed on the event loop while split
            # among them): a crawl that has moved on to small pages (or below the threads'
            # rate) still ends the processes it no longer needs
            self.processes.expire(IDLE_SECONDS, time.monotonic())
        either = self.processes is not None and portable and size >= PROCESS_MIN_BYTES
        if self._split is not None and self._mask is None:
            # the first page, of any size: a crawl of small pages alone split too, its pages
            # parsed here; on the parse threads they waited for the GIL while the loop held
            # it (5 ms at a time), ~200 ms a page on the tiny-page web, holding their hosts
            self._mask = cpu_mask()
            keep_threads_to(self._split[0])
        if self._mask is not None and size < PROCESS_MIN_BYTES:
            # split: the parse threads share the event loop's CPU, so a small page's parse
            # costs as much there as here, plus the hand-off (a wake-up and the GIL each way)
            self.calls["loop"] += 1
            return fn()
        with trio.CancelScope(shield=True):
            kind, worker = await self._slot(either, size)
            self.calls[kind] += 1
            try:
                if worker is not None:
                    assert self.processes is not None
                    result = await self.processes.run(fn, place=(worker, size))
                else:
                    result = await self.threads.run(fn)
            finally:
                self._release(kind)
        return result

    async def _slot(self, either: bool, size: int) -> tuple[str, _Worker | None]:
        for kind in self._order if either else ("thread",):
            if kind == "thread" and self._free_threads > 0:
                self._free_threads -= 1
                return kind, None
            if kind == "process" and (worker := self._process_for(size)) is not None:
                return kind, worker
        self._arrivals += 1
        waiter = _Waiter(self._arrivals, size)
        (self._any if either else self._thread_only).append(waiter)
        await waiter.ready.wait()  # shielded: once queued, a call is always handed a slot
        return waiter.kind, waiter.worker

    def _process_for(self, size: int) -> _Worker | None:
        """A ready worker process with room for ``size`` bytes, its place taken; starts those
        not running. A large page waits for a thread meanwhile rather than for a new
        interpreter's start (~1 s on a busy machine): calls sent to a process that is still
        importing held their hosts, and on a 20-host web the 8 hosts whose pages went to the
        two processes first ended the pass a second after the others (bench/README.md, "The
        git docs")."""
        assert self.processes is not None
        return self.processes.reserve(size)

    def _hand_to_processes(self) -> None:
        """A process call ended or a process became ready: the large pages waiting take the
        room the processes have, in order of arrival (one too large for it lets the next
        pass, and waits for room or a thread)."""
        for waiter in list(self._any):
            worker = self._process_for(waiter.size)
            if worker is not None:
                self._any.remove(waiter)
                waiter.kind, waiter.worker = "process", worker
                waiter.ready.set()

    def _release(self, kind: str) -> None:
        """Hand the freed place to the longest-waiting calls that may take it, or free it."""
        if kind == "process":
            self._hand_to_processes()
            return
        waiting = [q for q in (self._any, self._thread_only) if q]
        if not waiting:
            self._free_threads += 1
            return
        waiter = min(waiting, key=lambda q: q[0].seq).popleft()
        waiter.kind = kind
        waiter.ready.set()

    def statistics(self) -> ParsersStatistics:
        """Calls started on each kind of slot, the calls waiting for one now, and the
        processes running."""
        return ParsersStatistics(
            thread_calls=self.calls["thread"],
            process_calls=self.calls["process"],
            loop_calls=self.calls["loop"],
            waiting=len(self._any) + len(self._thread_only),
            processes=len(self.processes.pids()) if self.processes is not None else 0,
        )

    async def __aenter__(self) -> Parsers:
        if self.processes is not None:
            await self.processes.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Every call was awaited: the threads end, then the processes and their nursery."""
        try:
            self.threads.close()
            if self.processes is None:
                return None
            return await self.processes.__aexit__(exc_type, exc, tb)
        finally:
            self._unpin()

    def _unpin(self) -> None:
        if self._mask is not None:
            keep_threads_to(self._mask)  # the threads left (the store's, trio's) as before
            self._mask = None
