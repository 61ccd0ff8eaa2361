"""Tests for the parse threads and processes."""

from __future__ import annotations

import functools
import operator
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from _pages import DATA

from refresher._cpus import split_cpus
from refresher.discover import _threads
from refresher.discover._parse import Document, Extracted, HtmlLinks, Link, process
from refresher.discover._threads import (
    MIN_PARSE_THREADS,
    PIPE_BYTES,
    PIPELINE,
    PROCESS_MIN_BYTES,
    ParseCrashed,
    ParseProcesses,
    Parsers,
    ParsersStatistics,
    ParseThreads,
    pickled_call,
    widen,
)


async def test_calls_run_on_at_most_the_given_number_of_threads() -> None:
    pool = ParseThreads(2)
    names: set[str] = set()
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(pool.run, lambda: names.add(threading.current_thread().name))
    finally:
        pool.close()
    assert 1 <= len(names) <= 2
    assert all(name.startswith("parse") for name in names)


async def test_a_result_comes_back_and_an_exception_is_re_raised() -> None:
    pool = ParseThreads(1)
    try:
        assert await pool.run(lambda: 6 * 7) == 42
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 // 0)
    finally:
        pool.close()


async def test_a_cancelled_caller_waits_for_its_call_to_finish() -> None:
    pool = ParseThreads(1)
    release = threading.Event()
    finished: list[str] = []
    scope = trio.CancelScope()

    def blocking() -> None:
        release.wait(30)
        finished.append("call")

    async def caller() -> None:
        with scope:
            await pool.run(blocking)
        finished.append("caller")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert finished == []  # cancelled, and still waiting for its call
            release.set()
    finally:
        pool.close()
    assert finished == ["call", "caller"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_the_parse_threads_follow_the_cpus_the_process_may_run_on_but_are_at_least_two() -> None:
    # a real child process under a one-CPU mask, as systemd's CPUAffinity= or taskset sets
    # it: one thread per CPU of the machine would fight for that one CPU
    code = (
        "from refresher._cpus import usable_cpus; "
        "from refresher.discover._threads import ParseThreads; "
        "print(usable_cpus(), ParseThreads().threads)"
    )
    cpu = min(os.sched_getaffinity(0))
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    assert child.stdout.split() == ["1", str(MIN_PARSE_THREADS)]
    pool = ParseThreads()
    try:
        assert pool.threads == max(MIN_PARSE_THREADS, len(os.sched_getaffinity(0)))
    finally:
        pool.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH here")
async def test_a_parse_thread_waits_for_the_running_threads_slice_when_woken() -> None:
    # SCHED_BATCH: a call wakes a parse thread without handing it the caller's CPU at once
    threads = ParseThreads()
    try:
        assert await threads.run(functools.partial(os.sched_getscheduler, 0)) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the event loop's own: as it was
    finally:
        threads.close()


def test_zero_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ParseThreads(0)


def documents() -> list[Document]:
    """Every HTML fixture (charsets, bases, robots directives, broken markup), and a page
    large enough for a process, with a non-UTF-8 charset and many links and words."""
    docs = [
        Document(
            url=f"http://example.com/dir/{p.name}", content_type="text/html", body=p.read_bytes()
        )
        for p in sorted(DATA.glob("*.html"))
    ]
    words = " ".join(f"mot{i % 97} été{i % 13}" for i in range(4000))
    links = "".join(f'<a href="../p{i}?q={i % 7}">lien {i}</a>' for i in range(300))
    big = f"<html><head><title>grand</title></head><body><p>{words}</p>{links}</body></html>"
    docs.append(
        Document(
            url="http://example.com/a/big.html",
            content_type="text/html; charset=iso-8859-1",
            body=big.encode("iso-8859-1"),
        )
    )
    assert len(docs[-1].body) >= PROCESS_MIN_BYTES
    return docs


def test_an_extracted_result_pickles_to_an_equal_one() -> None:
    e = Extracted(
        links=(Link(url="http://a.example/", kind="a", nofollow=True),),
        canonical="http://a.example/c",
        noindex=True,
        lastmod=(("http://a.example/", 1.5),),
        coarse_lastmod=(("http://a.example/b", 86400.0),),
        fingerprint=2**63 + 5,
        skipped={"too_long": 2},
    )
    again = pickle.loads(pickle.dumps(e))
    assert again == e and dict(again.skipped) == {"too_long": 2}


async def test_every_page_gives_the_same_links_charset_and_simhash_in_a_process() -> None:
    html = HtmlLinks(max_links=100)
    async with ParseProcesses(1) as processes:
        for doc in documents():
            job = functools.partial(process, doc, builtins={html.name: html})
            assert await processes.run(job) == job(), doc.url


async def test_a_large_page_goes_to_a_process_a_small_one_or_an_unportable_call_stays() -> None:
    me = os.getpid()
    async with Parsers(processes=1) as parsers:
        assert parsers.processes is not None
        await parsers.processes.started()
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES - 1) == me
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES, portable=False) == me
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) != me
    async with Parsers(processes=0) as without:
        assert await without.run(os.getpid, size=10 * PROCESS_MIN_BYTES) == me


async def test_a_process_that_dies_fails_its_call_and_new_processes_take_the_next() -> None:
    async with ParseProcesses(1) as processes:
        first = await processes.run(os.getpid)
        with pytest.raises(ParseCrashed):
            await processes.run(functools.partial(os._exit, 3))
        second = await processes.run(os.getpid)
        assert second not in (first, os.getpid()) and processes.crashes == 1


async def test_a_parse_process_outlives_a_sigterm_and_ends_when_closed() -> None:
    # systemd and terminals signal the daemon's whole group: the daemon ends its workers
    async with ParseProcesses(1) as processes:
        worker = await processes.run(os.getpid)
        os.kill(worker, signal.SIGTERM)
        os.kill(worker, signal.SIGINT)
        assert await processes.run(os.getpid) == worker
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # closed: it has exited and was reaped


def test_zero_processes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ParseProcesses(0)


def test_a_call_pickles_without_its_body_which_follows_it_raw() -> None:
    body = b"x" * PROCESS_MIN_BYTES
    job = functools.partial(len, body)
    request, raw = pickled_call(job)
    assert raw is body and len(request) < 200
    small = functools.partial(len, b"x" * (PROCESS_MIN_BYTES - 1))
    assert pickled_call(small)[1] == b""


async def test_a_call_with_two_large_bodies_sends_one_raw_and_one_in_its_pickle() -> None:
    first, second = b"a" * PROCESS_MIN_BYTES, b"b" * (2 * PROCESS_MIN_BYTES)
    async with ParseProcesses(1) as processes:
        assert await processes.run(functools.partial(operator.add, first, second)) == (
            first + second
        )
        assert await processes.run(functools.partial(len, b"")) == 0


async def test_a_large_page_takes_an_idle_thread_while_every_process_is_busy(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    me = os.getpid()
    async with Parsers(processes=1, prefer="process") as parsers:
        assert parsers.processes is not None
        await parsers.processes.started()
        async with trio.open_nursery() as nursery:
            # the process blocks reading the FIFO until the test writes to it; the calls
            # after it wait in its pipe until every one of its PIPELINE places is taken
            nursery.start_soon(
                functools.partial(
                    parsers.run, functools.partial(fifo.read_bytes), size=PROCESS_MIN_BYTES
                )
            )
            # the held call first: the process is ready, so a call ahead of it would be
            # answered at once (trio shuffles the tasks started together)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(PIPELINE - 1):
                nursery.start_soon(
                    functools.partial(parsers.run, os.getpid, size=PROCESS_MIN_BYTES)
                )
            await trio.testing.wait_all_tasks_blocked()
            assert parsers.statistics().process_calls == PIPELINE
            assert parsers.statistics().processes == 1
            assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) == me
            await trio.to_thread.run_sync(fifo.write_bytes, b"done")
        assert parsers.statistics() == ParsersStatistics(
            thread_calls=1, process_calls=PIPELINE, loop_calls=0, waiting=0, processes=1
        )


async def test_a_process_takes_calls_while_it_works_and_answers_each_its_own(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    answers: dict[int, object] = {}

    async def call(processes: ParseProcesses, i: int, fn: object) -> None:
        answers[i] = await processes.run(fn)  # type: ignore[arg-type]

    async with ParseProcesses(1, pipeline=3) as processes:
        await processes.started()  # else the calls wait for its notice, and go in any order
        async with trio.open_nursery() as nursery:
            # one at a time, so they reach the process in this order (trio shuffles tasks)
            for i, fn in enumerate(
                [
                    functools.partial(fifo.read_bytes),
                    functools.partial(operator.mul, 6, 7),
                    os.getpid,
                ]
            ):
                nursery.start_soon(call, processes, i, fn)
                await trio.testing.wait_all_tasks_blocked()
            assert answers == {} and len(processes.pids()) == 1  # one process, three calls
            await trio.to_thread.run_sync(fifo.write_bytes, b"done")
        assert answers == {0: b"done", 1: 42, 2: processes.pids()[0]}


async def test_a_call_larger_than_the_pipe_is_sent_whole_before_the_calls_behind_it(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    answers: dict[int, object] = {}
    body = b"y" * (3 * PIPE_BYTES)  # written in part at once, the rest while the process reads

    async def call(processes: ParseProcesses, i: int, fn: object) -> None:
        answers[i] = await processes.run(fn)  # type: ignore[arg-type]

    async with ParseProcesses(1, pipeline=3) as processes:
        await processes.started()
        async with trio.open_nursery() as nursery:
            # one at a time, so they reach the process in this order (trio shuffles tasks)
            for i, fn in enumerate(
                [
                    functools.partial(fifo.read_bytes),
                    functools.partial(len, body),
                    functools.partial(operator.mul, 6, 7),
                ]
            ):
                nursery.start_soon(call, processes, i, fn)
                await trio.testing.wait_all_tasks_blocked()
            assert answers == {}
            await trio.to_thread.run_sync(fifo.write_bytes, b"done")
        assert answers == {0: b"done", 1: len(body), 2: 42}


async def test_a_dying_process_fails_the_calls_queued_behind_its_own_too(tmp_path: Path) -> None:
    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    outcomes: dict[str, object] = {}

    async def call(processes: ParseProcesses, name: str, fn: object) -> None:
        try:
            outcomes[name] = await processes.run(fn)  # type: ignore[arg-type]
        except ParseCrashed:
            outcomes[name] = "crashed"

    async with ParseProcesses(1, pipeline=3) as processes:
        await processes.started()  # else the calls wait for its notice, and go in any order
        async with trio.open_nursery() as nursery:
            # one at a time, so they reach the process in this order (trio shuffles tasks)
            for name, fn in [
                ("held", functools.partial(fifo.read_bytes)),
                ("dies", functools.partial(os._exit, 3)),
                ("behind", os.getpid),
            ]:
                nursery.start_soon(call, processes, name, fn)
                await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(fifo.write_bytes, b"done")
        assert outcomes == {"held": b"done", "dies": "crashed", "behind": "crashed"}
        assert processes.crashes == 1
        assert await processes.run(os.getpid) == processes.pids()[0]  # a new process


async def test_a_large_page_takes_a_thread_while_the_processes_start_and_then_a_process() -> None:
    # a call sent to a process still importing would wait out its start (~1 s when busy)
    me = os.getpid()
    async with Parsers(processes=1, prefer="process") as parsers:
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) == me
        assert parsers.statistics().processes == 1  # started by that call, not waited for
        assert parsers.processes is not None
        await parsers.processes.started()
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) != me
        assert parsers.statistics().thread_calls == 1


async def test_a_process_that_dies_before_it_is_ready_is_replaced_by_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with ParseProcesses(1) as processes:
        monkeypatch.setattr(sys, "executable", "/bin/false")  # exits at once, says nothing
        processes.ready()
        await processes.started()
        monkeypatch.undo()
        assert not processes.ready() and processes.crashes == 1  # a new one is starting
        await processes.started()
        assert processes.ready()
        assert await processes.run(os.getpid) == processes.pids()[0]


def test_a_pipeline_below_one_call_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ParseProcesses(1, pipeline=0)


async def test_with_threads_preferred_a_crawl_the_threads_keep_up_with_starts_no_process() -> None:
    me = os.getpid()
    async with Parsers(processes=1, prefer="thread") as parsers:
        for _ in range(100):  # one at a time: a thread is always free
            assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) == me
        assert parsers.statistics().processes == 0


@pytest.mark.parametrize("prefer", ["thread", "process"])
async def test_a_process_takes_a_large_page_when_every_thread_is_busy_once_it_is_ready(
    prefer: str,
) -> None:
    # the process starts with the call and is not ready: the page waits for it (or a thread)
    me = os.getpid()
    release = threading.Event()
    async with Parsers(processes=1, prefer=prefer) as parsers:
        async with trio.open_nursery() as nursery:
            for _ in range(parsers.threads.threads):
                nursery.start_soon(functools.partial(parsers.run, release.wait, size=10))
            await trio.testing.wait_all_tasks_blocked()
            assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) != me
            # a small page waits for a thread; it is handed the first one freed
            nursery.start_soon(functools.partial(parsers.run, os.getpid, size=10))
            await trio.testing.wait_all_tasks_blocked()
            assert parsers.statistics().waiting == 1
            release.set()
        assert parsers.statistics().waiting == 0


async def test_a_process_idle_for_long_ends_and_a_new_one_takes_the_next_call() -> None:
    async with ParseProcesses(1) as processes:
        first = await processes.run(os.getpid)
        assert processes.expire(60.0, time.monotonic()) == 0  # not idle so long
        assert processes.expire(0.0, float("inf")) == 1 and processes.pids() == []
        second = await processes.run(os.getpid)
        assert second != first and processes.pids() == [second]
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # reaped


def test_an_unknown_preference_is_refused() -> None:
    with pytest.raises(ValueError, match="prefer"):
        Parsers(prefer="gpu")


def test_a_pipe_is_widened_where_it_can_be_and_anything_else_is_left_quietly(
    tmp_path: Path,
) -> None:
    read, write = os.pipe()
    try:
        widen(read)
        fcntl = pytest.importorskip("fcntl")
        if hasattr(fcntl, "F_GETPIPE_SZ"):
            assert fcntl.fcntl(write, fcntl.F_GETPIPE_SZ) in (PIPE_BYTES, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    with open(tmp_path / "file", "wb") as f:
        widen(f.fileno())  # not a pipe: refused by the kernel, and nothing is raised


async def test_an_idle_process_ends_on_a_small_pages_call_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Parsers(processes=1, prefer="thread") as parsers:
        assert parsers.processes is not None
        await parsers.processes.run(os.getpid)  # a process started by a busy moment
        assert parsers.statistics().processes == 1
        monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.0)
        await parsers.run(os.getpid, size=10)  # only small pages come now
        assert parsers.statistics().processes == 0


def _masks() -> set[frozenset[int]]:
    """The CPU mask of every thread of this process."""
    return {frozenset(os.sched_getaffinity(int(task))) for task in os.listdir("/proc/self/task")}


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU masks and two CPUs",
)
async def test_split_keeps_this_process_to_one_cpu_and_the_processes_to_the_others() -> None:
    before = frozenset(os.sched_getaffinity(0))
    own, others = split_cpus(before) or (frozenset(), frozenset())
    async with Parsers(processes=1, prefer="process", split=True):
        assert _masks() == {before}  # made, never called: nothing pinned
    async with Parsers(processes=1, prefer="process", split=True) as parsers:
        assert parsers.processes is not None
        await parsers.processes.started()  # started (pinned to the others), not yet called
        assert _masks() == {before}
        await parsers.run(os.getpid, size=10)  # the first page, however small, pins every thread
        assert _masks() == {own}
        worker = await parsers.run(os.getpid, size=PROCESS_MIN_BYTES)
        async with trio.open_nursery() as nursery:  # both parse threads busy: a second starts
            for _ in range(2):
                sleep = functools.partial(time.sleep, 0.05)
                nursery.start_soon(functools.partial(parsers.run, sleep, size=10))
        assert _masks() == {own}
        assert worker != os.getpid()  # processes first: they have CPUs of their own
        assert frozenset(os.sched_getaffinity(worker)) == others
    assert _masks() == {before}


async def test_split_on_one_cpu_or_without_processes_leaves_every_mask_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _masks()
    for processes in (0, 1):
        monkeypatch.setattr(_threads, "cpu_mask", lambda: frozenset({0}))
        async with Parsers(processes=processes, split=True):
            assert _masks() == before
        monkeypatch.undo()
        async with Parsers(processes=0, split=True):
            assert _masks() == before


def test_cpus_split_into_the_lowest_and_the_rest() -> None:
    assert split_cpus(frozenset({3, 1, 2})) == (frozenset({1}), frozenset({2, 3}))
    assert split_cpus(frozenset({0})) is None
    assert split_cpus(frozenset()) is None


async def test_a_failing_notice_reader_ends_the_block_that_owns_it_with_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a task of the processes' own nursery: it ends their block, not the whole trio run
    async def broken(self: object, ready: object) -> None:
        raise RuntimeError("the reader broke")

    monkeypatch.setattr(_threads._Worker, "serve", broken)
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="reader broke")):
        async with ParseProcesses(1) as processes:
            processes.ready()
            await trio.sleep_forever()  # cancelled by the reader's failure
    assert processes.pids() == []  # the block's end stopped the worker


async def test_workers_are_counted_ready_from_their_notice_until_they_die_or_end() -> None:
    async with ParseProcesses(1) as processes:
        assert not processes.ready()  # started, not yet ready
        await processes.started()
        assert processes.ready()
        with pytest.raises(ParseCrashed):
            await processes.run(functools.partial(os._exit, 3))
        assert not processes.ready()  # the dead one retired, its successor starting
        await processes.started()
        assert processes.ready()
        assert processes.expire(0.0, float("inf")) == 1
        assert not processes.ready() and processes.crashes == 1


def test_processes_start_only_inside_their_block() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        ParseProcesses(1).ready()


def test_a_call_goes_to_the_process_with_the_fewest_bytes_in_its_pipe_while_it_has_room() -> None:
    # a huge page's worker holds one call; the calls after it go to the other, however many,
    # while its pipe holds under PIPE_BYTES; a call too large for either waits
    processes = ParseProcesses(2)
    huge = SimpleNamespace(inflight=1, queued=8 << 20, since=0.0)
    small = SimpleNamespace(inflight=5, queued=5 * 30_000, since=0.0)
    processes._running = [huge, small]  # type: ignore[list-item]
    processes._ready = [huge, small]  # type: ignore[assignment]
    assert processes.reserve(30_000) is small
    assert (small.inflight, small.queued) == (6, 6 * 30_000)  # its place taken at once
    assert processes.reserve(PIPE_BYTES) is None
    small.inflight = PIPELINE
    assert processes.reserve(1) is None
    huge.inflight = 0  # idle now: it takes any call, however large
    assert processes.reserve(PIPE_BYTES) is huge


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU masks and two CPUs",
)
async def test_while_split_a_small_page_is_parsed_on_the_event_loop_a_large_one_never() -> None:
    def where() -> str:
        return threading.current_thread().name

    async with Parsers(processes=1, prefer="process", split=True) as parsers:
        # split from the first page: a crawl of small pages alone parses them here, never on
        # a parse thread waiting for the GIL the event loop holds
        assert await parsers.run(where, size=10) == "MainThread"
        assert await parsers.run(where, size=PROCESS_MIN_BYTES - 1) == "MainThread"
        unportable = await parsers.run(where, size=PROCESS_MIN_BYTES, portable=False)
        assert unportable.startswith("parse")
        assert parsers.statistics().loop_calls == 2


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU masks and two CPUs",
)
async def test_while_split_an_idle_process_ends_on_a_small_pages_call_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Parsers(processes=1, prefer="process", split=True) as parsers:
        assert parsers.processes is not None
        await parsers.processes.started()
        await parsers.run(os.getpid, size=PROCESS_MIN_BYTES)  # to the process
        assert parsers.statistics().processes == 1
        monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.0)
        await parsers.run(os.getpid, size=10)  # only small pages come now, parsed here
        stats = parsers.statistics()
        assert stats.loop_calls == 1 and stats.processes == 0
