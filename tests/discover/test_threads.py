"""Tests for the parse threads and processes."""

from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import threading

import pytest
import trio
import trio.testing
from _pages import DATA

from refresher.discover._parse import Document, Extracted, HtmlLinks, Link, process
from refresher.discover._threads import (
    MIN_PARSE_THREADS,
    PROCESS_MIN_BYTES,
    ParseCrashed,
    ParseProcesses,
    Parsers,
    ParseThreads,
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
        "from refresher.discover._threads import ParseThreads, usable_cpus; "
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
        fingerprint=2**63 + 5,
        skipped={"too_long": 2},
    )
    again = pickle.loads(pickle.dumps(e))
    assert again == e and dict(again.skipped) == {"too_long": 2}


async def test_every_page_gives_the_same_links_charset_and_simhash_in_a_process() -> None:
    processes = ParseProcesses(1)
    html = HtmlLinks(max_links=100)
    try:
        for doc in documents():
            job = functools.partial(process, doc, builtins={html.name: html})
            assert await processes.run(job) == job(), doc.url
    finally:
        processes.close()


async def test_a_large_page_goes_to_a_process_a_small_one_or_an_unportable_call_stays() -> None:
    parsers = Parsers(processes=1)
    me = os.getpid()
    try:
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES - 1) == me
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES, portable=False) == me
        assert await parsers.run(os.getpid, size=PROCESS_MIN_BYTES) != me
    finally:
        parsers.close()
    without = Parsers(processes=0)
    try:
        assert await without.run(os.getpid, size=10 * PROCESS_MIN_BYTES) == me
    finally:
        without.close()


async def test_a_process_that_dies_fails_its_call_and_new_processes_take_the_next() -> None:
    processes = ParseProcesses(1)
    try:
        first = await processes.run(os.getpid)
        with pytest.raises(ParseCrashed):
            await processes.run(functools.partial(os._exit, 3))
        second = await processes.run(os.getpid)
        assert second not in (first, os.getpid()) and processes.crashes == 1
    finally:
        processes.close()


async def test_a_parse_process_outlives_a_sigterm_and_ends_when_closed() -> None:
    # systemd and terminals signal the daemon's whole group: the daemon ends its workers
    processes = ParseProcesses(1)
    try:
        worker = await processes.run(os.getpid)
        os.kill(worker, signal.SIGTERM)
        os.kill(worker, signal.SIGINT)
        assert await processes.run(os.getpid) == worker
    finally:
        processes.close()
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # closed: it has exited and was reaped


def test_zero_processes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ParseProcesses(0)
