"""The event loop's busy share (LoopLoad), on a fake clock and in a real trio loop."""

from __future__ import annotations

import trio

from refresher.crawl._load import SATURATED, LoopLoad


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_busy_share_is_the_time_outside_waits_for_io_over_the_last_window() -> None:
    clock = Clock()
    load = LoopLoad(window=0.5, clock=clock)
    assert load.busy() == 0.0  # no window has ended
    load.before_io_wait(0.0)
    clock.now = 0.3  # waited 0.3 s
    load.after_io_wait(0.0)
    assert load.busy() == 0.0  # the window is still open
    clock.now = 0.5  # busy 0.2 s
    load.before_io_wait(0.0)
    clock.now = 0.6  # waited 0.1 s
    load.after_io_wait(0.0)
    assert abs(load.busy() - (1 - 0.4 / 0.6)) < 1e-9
    clock.now = 1.2  # a whole window busy
    load.before_io_wait(0.0)
    load.after_io_wait(0.0)
    assert load.busy() == 1.0 and load.saturated()


def test_an_idle_loop_counts_as_not_busy() -> None:
    load = LoopLoad(window=0.1)

    async def main() -> None:
        trio.lowlevel.add_instrument(load)
        await trio.sleep(0.3)  # waiting for I/O (the timer) the whole time

    trio.run(main)
    assert load.busy() < SATURATED
