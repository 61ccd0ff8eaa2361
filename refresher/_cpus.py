"""The CPUs this process may run on, how the daemon splits them, and the CPUs it started on
for work that should not keep to the daemon's one.

With ``discovery.split_cpus`` the daemon's threads keep to one CPU (:func:`split_cpus`,
:func:`keep_threads_to`, from the parse stage, :mod:`refresher.discover._threads`): every
hand-off between them wakes a thread, and a wake-up across CPUs is dear. A store batch is the
exception: one wake-up per batch, and most of its work (the WARC records' gzip, DuckDB's
insert) runs without the GIL, so it may as well use the CPUs the parse processes leave idle.
On the Rust book, refresher alone in turns, the batch on every CPU gave 669.8, 701.2 against
596.7, 613.8 pages/s at the same CPU per page
(bench/README.md, "The store's batch on every CPU").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = [
    "STARTED_ON",
    "cpu_mask",
    "every_cpu",
    "keep_threads_to",
    "no_wakeup_preemption",
    "split_cpus",
    "usable_cpus",
]


def cpu_mask() -> frozenset[int]:
    """The CPUs the calling thread may run on (empty where masks are unknown)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks on this platform (macOS)
        return frozenset()


#: the CPUs this process was given when refresher was imported (systemd's CPUAffinity=, a
#: cpuset), before any thread of it kept to one
STARTED_ON = cpu_mask()


@contextlib.contextmanager
def every_cpu() -> Iterator[None]:
    """The calling thread on every CPU of :data:`STARTED_ON` for the block, on its own mask
    again after it; nothing changes (no system call) where it already is or masks are unknown."""
    before = cpu_mask()
    if not STARTED_ON or before in (frozenset(), STARTED_ON):
        yield
        return
    os.sched_setaffinity(0, STARTED_ON)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


_scheduled = threading.local()


def no_wakeup_preemption() -> None:
    """Make the calling thread ``SCHED_BATCH`` (Linux), once per thread: woken, it waits for
    the running thread's slice to end instead of taking the CPU at once. A thread woken for a
    call from the event loop (a parse, a store batch) took the loop's CPU in the middle of the
    hand-off (117 us of wall time per parse call against 18 us of CPU, the git docs, split),
    only to find the GIL held and sleep again. Its share of the CPU is unchanged."""
    if getattr(_scheduled, "done", False):
        return
    _scheduled.done = True
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (systemd's ``CPUAffinity=``,
    ``taskset``, a container's cpuset), not every CPU of the machine."""
    return len(cpu_mask()) or os.cpu_count() or 1


def split_cpus(cpus: frozenset[int]) -> tuple[frozenset[int], frozenset[int]] | None:
    """``cpus`` split into the one the daemon's own threads keep to (the lowest) and the
    others, for its parse processes; None for fewer than two."""
    if len(cpus) < 2:
        return None
    own = frozenset({min(cpus)})
    return own, cpus - own


def keep_threads_to(cpus: frozenset[int]) -> None:
    """Every thread of this process on ``cpus`` (Linux: each thread has its own mask, and a
    thread started later takes its starter's). Where masks are unknown, nothing changes."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for task in tasks:
        # no masks on this platform, or the thread ended meanwhile
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.sched_setaffinity(int(task), cpus)
