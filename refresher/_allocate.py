"""From target rates to due times: the allocator re-solves the budget split periodically.

Until the policies land, the split is uniform: every page gets f = B/N fetches per second, so
each page is due every N/B seconds after its last fetch. When N or B moves by more than
``tolerance``, the new rates go to the store, due times are recomputed there
(``last_fetch + 1/f``) and the frontier reloads its window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ._frontier import Frontier
from ._logging import get_logger
from ._store import PageRow, Store, StoreService

__all__ = ["Allocator", "AllocatorStatistics"]

log = get_logger("allocate")


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorStatistics:
    policy: str
    budget: float  # fetches per second
    pages: int
    uniform_interval: float  # seconds between fetches of one page under uniform
    solves: int
    last_solve_seconds: float


class Allocator:
    def __init__(
        self,
        *,
        store: StoreService,
        frontier: Frontier,
        budget: float,
        policy: str,
        resolve_interval: float = 60.0,
        tolerance: float = 0.05,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._frontier = frontier
        self.budget = budget
        self.policy = policy
        self.resolve_interval = resolve_interval
        self.tolerance = tolerance
        self._wall = wall_clock
        self._pages = 0
        self._rate = math.nan  # the uniform f in force, fetches per second
        self._solves = 0
        self._last_solve = 0.0
        self._wake = trio.Event()

    def interval(self, page: PageRow) -> float:
        """Seconds until ``page`` is due again after a fetch."""
        if page.target_rate is not None and page.target_rate > 0:
            return 1.0 / page.target_rate
        return self.uniform_interval

    @property
    def uniform_interval(self) -> float:
        return max(self._pages, 1) / self.budget

    def poke(self) -> None:
        """Re-solve now (budget or policy changed)."""
        self._wake.set()

    def pages_added(self, n: int) -> None:
        """``n`` new pages (due now): counted at once, folded into the next periodic solve.

        Not a re-solve: with discovery running, one per new page would reload the frontier
        all the time.
        """
        self._pages += n

    def configure(self, *, budget: float, policy: str) -> None:
        changed = budget != self.budget or policy != self.policy
        self.budget, self.policy = budget, policy
        self._frontier.set_budget(budget)
        if changed:
            self.poke()

    async def solve(self, *, force: bool = False) -> bool:
        """One allocation pass; True when due times moved."""
        t0 = time.perf_counter()
        pages = await self._store.call(lambda s: s.count_pages())
        self._pages = pages
        rate = self.budget / max(pages, 1)
        moved = force or not (
            math.isfinite(self._rate) and abs(rate - self._rate) <= self.tolerance * self._rate
        )
        budget, policy, now = self.budget, self.policy, self._wall()

        def apply(store: Store) -> None:
            store.record_policy(policy, budget, now=now)
            if moved:
                store.set_uniform_rates(rate)
                store.reschedule(now=now)

        await self._store.call(apply)
        self._solves += 1
        self._last_solve = time.perf_counter() - t0
        if moved:
            self._rate = rate
            self._frontier.reset()
            log.info(
                "allocation solved",
                policy=policy,
                pages=pages,
                budget=budget,
                interval=round(1.0 / rate, 3),
                seconds=round(self._last_solve, 4),
            )
        return moved

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.solve(force=True)
        task_status.started()
        while True:
            with trio.move_on_after(self.resolve_interval):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.solve()

    def statistics(self) -> AllocatorStatistics:
        return AllocatorStatistics(
            policy=self.policy,
            budget=self.budget,
            pages=self._pages,
            uniform_interval=self.uniform_interval,
            solves=self._solves,
            last_solve_seconds=self._last_solve,
        )
