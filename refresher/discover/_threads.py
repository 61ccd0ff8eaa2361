"""The parse threads: a fixed set of long-lived threads (one per core) that run the processors.

libxml2 parses without the GIL, so these threads use every core; keeping them few and fixed
matters for memory as well as for the GIL. Each thread that parses keeps its own malloc arena
and lxml parser context, so parsing spread over trio's general thread cache (which also runs
DNS lookups and other blocking calls, and grows with them) made the daemon's RSS grow with the
number of distinct threads that had ever parsed: about 10 MiB each (bench/bench_parsers.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import trio

__all__ = ["ParseThreads"]

T = TypeVar("T")


class ParseThreads:
    """Runs blocking calls on ``threads`` dedicated threads (default: one per core).

    :meth:`run` waits for its call without being cancellable, as ``trio.to_thread.run_sync``
    does by default: the thread cannot be stopped half-way, so its caller waits it out.
    """

    def __init__(self, threads: int | None = None) -> None:
        count = threads if threads is not None else (os.cpu_count() or 1)
        if count < 1:
            raise ValueError(f"threads={count}: give at least 1")
        self.threads = count
        self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="parse")

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of the parse threads; its result, or its exception re-raised."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def finished(_: Future[T]) -> None:
            token.run_sync_soon(done.set)

        future = self._executor.submit(fn)
        future.add_done_callback(finished)
        with trio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def close(self) -> None:
        """Stop the threads once the calls already submitted have finished."""
        self._executor.shutdown(wait=True)
