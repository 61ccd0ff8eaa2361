"""How busy the daemon's event loop is: whether its own fetch capacity is the limit.

The budget B bounds the requests a second; politeness bounds each host's. When neither binds
and the rate still falls short of B, the daemon's event loop is: it runs tasks (or waits for
the GIL its parse threads hold) all the time instead of waiting for I/O. Then every fetch
takes time from every other one in flight, and the frontier lets a first fetch go before a
refresh worth little (:meth:`refresher.crawl.Frontier.acquire`).

:class:`LoopLoad` is a trio instrument: the run loop calls it around each wait for I/O (once
per pass over the runnable tasks, a few µs), and it keeps the share of wall time not spent
waiting over the last completed window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

__all__ = ["SATURATED", "LoopLoad"]

#: The busy share from which the loop counts as saturated: its spare time would not carry one
#: more fetch in ten.
SATURATED = 0.9


class LoopLoad(trio.abc.Instrument):
    """The share of wall time the trio run loop spent outside its waits for I/O, over windows
    of ``window`` seconds (the last completed one; 0 before the first ends). Install it with
    :func:`trio.lowlevel.add_instrument` in the loop it measures."""

    def __init__(
        self, *, window: float = 0.5, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.window = window
        self._clock = clock
        self._start = clock()  # of the window being measured
        self._idle = 0.0  # seconds waited for I/O in it
        self._waiting_since = self._start
        self._busy = 0.0

    def before_io_wait(self, timeout: float) -> None:
        self._waiting_since = self._clock()

    def after_io_wait(self, timeout: float) -> None:
        now = self._clock()
        self._idle += now - self._waiting_since
        elapsed = now - self._start
        if elapsed >= self.window:
            self._busy = max(0.0, 1.0 - self._idle / elapsed)
            self._start, self._idle = now, 0.0

    def busy(self) -> float:
        """The share (0–1) of the last completed window the loop was busy."""
        return self._busy

    def saturated(self) -> bool:
        """Whether the loop was busy for :data:`SATURATED` of the last window or more."""
        return self._busy >= SATURATED
