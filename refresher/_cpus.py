"""The CPUs this process started on, for work that should not keep to the daemon's one.

With ``discovery.split_cpus`` the daemon's threads keep to one CPU
(:mod:`refresher.discover._threads`): every hand-off between them wakes a thread, and a
wake-up across CPUs is dear. A store batch is the exception: one wake-up per batch, and most
of its work (the WARC records' gzip, DuckDB's insert) runs without the GIL, so it may as well
use the CPUs the parse processes leave idle. On the Rust book, refresher alone in turns, the
batch on every CPU gave 669.8, 701.2 against 596.7, 613.8 pages/s at the same CPU per page
(bench/README.md, "The store's batch on every CPU").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["STARTED_ON", "cpu_mask", "every_cpu"]


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
