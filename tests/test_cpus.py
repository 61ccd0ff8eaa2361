"""refresher._cpus: a thread's batch on every CPU the process started on."""

from __future__ import annotations

import os

import pytest

from refresher import _cpus

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(_cpus.STARTED_ON) < 2,
    reason="needs CPU masks and two CPUs",
)


def test_a_thread_kept_to_one_cpu_runs_its_block_on_every_cpu_and_returns_to_its_own() -> None:
    one = frozenset({min(_cpus.STARTED_ON)})
    os.sched_setaffinity(0, one)
    try:
        with _cpus.every_cpu():
            assert frozenset(os.sched_getaffinity(0)) == _cpus.STARTED_ON
        assert frozenset(os.sched_getaffinity(0)) == one
    finally:
        os.sched_setaffinity(0, _cpus.STARTED_ON)


def test_a_thread_on_every_cpu_already_is_left_as_it_is() -> None:
    with _cpus.every_cpu():
        assert frozenset(os.sched_getaffinity(0)) == _cpus.STARTED_ON
    assert frozenset(os.sched_getaffinity(0)) == _cpus.STARTED_ON
