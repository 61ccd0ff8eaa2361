"""Tests for the parse threads."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from refresher.discover._threads import ParseThreads


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


def test_zero_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ParseThreads(0)
