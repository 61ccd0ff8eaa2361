"""The re-plan rule: a plan once half a round of fetches is recorded, within its bounds."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from refresher.refresh._allocate import Allocator, InputSettings, PolicyInputs
from refresher.refresh._replan import (
    COST_FACTOR,
    POLL,
    ReplanRule,
    earliest,
    next_look,
    replan_fetches,
    replan_reason,
)
from refresher.store import StoreStatistics

RULE = ReplanRule(interval=60.0, share=0.5, floor=5.0)

rules = st.builds(
    ReplanRule,
    interval=st.floats(0.1, 1e4),
    share=st.one_of(st.just(0.0), st.floats(1e-3, 4.0)),
    floor=st.floats(0.1, 1e3),
)


def test_half_a_round_of_fetches_calls_for_a_plan_once_the_floor_has_passed():
    assert replan_reason(4.9, 10_000, 1_000, 0.01, RULE) is None
    assert replan_reason(5.0, 500, 1_000, 0.01, RULE) == "learned"
    assert replan_reason(30.0, 499, 1_000, 0.01, RULE) is None
    assert replan_reason(60.0, 0, 1_000, 0.01, RULE) == "clock"


def test_a_slow_solve_holds_the_next_plan_off_for_twenty_times_its_duration():
    # a 10 M-page node's solve of 2 s: no plan within 40 s however much was fetched
    assert earliest(RULE, 2.0) == 2.0 * COST_FACTOR == 40.0
    assert replan_reason(39.0, 10**8, 10**7, 2.0, RULE) is None
    assert replan_reason(40.0, 5 * 10**6, 10**7, 2.0, RULE) == "learned"
    # … and never past the clock
    assert earliest(RULE, 10.0) == 60.0
    assert replan_reason(60.0, 0, 10**7, 10.0, RULE) == "clock"


def test_a_share_of_zero_is_the_clock_alone():
    clock = ReplanRule(interval=60.0, share=0.0, floor=5.0)
    assert replan_fetches(clock, 100) == math.inf
    assert replan_reason(59.0, 10**9, 100, 0.0, clock) is None
    assert next_look(5.0, clock, 0.0) == 55.0


def test_an_empty_store_needs_one_fetch_to_plan_again():
    assert replan_fetches(RULE, 0) == 1.0
    assert replan_reason(10.0, 0, 0, 0.0, RULE) is None
    assert replan_reason(10.0, 1, 0, 0.0, RULE) == "learned"


@given(
    rules,
    st.floats(0.0, 2e4),
    st.integers(0, 10**8),
    st.integers(0, 10**7),
    st.floats(0.0, 100.0),
)
def test_a_plan_comes_by_the_clock_and_never_before_its_bounds(
    rule: ReplanRule, since: float, fetched: int, pages: int, cost: float
) -> None:
    reason = replan_reason(since, fetched, pages, cost, rule)
    if since >= rule.interval:
        assert reason == "clock"
    elif reason is not None:
        assert reason == "learned"
        assert since >= min(rule.floor, rule.interval) and since >= min(
            COST_FACTOR * cost, rule.interval
        )
        assert rule.share > 0 and fetched >= rule.share * pages and fetched >= 1


@given(rules, st.floats(0.0, 100.0))
def test_looking_when_next_look_says_finds_every_plan_the_rule_would_make(
    rule: ReplanRule, cost: float
) -> None:
    # The looks reach the clock exactly, the lower bound exactly, and after it are at most
    # POLL apart: a share reached at any moment is seen within POLL seconds.
    since, looks = 0.0, [0.0]
    while since < rule.interval and len(looks) < 100:
        wait = next_look(since, rule, cost)
        assert wait >= 0.0 and since + wait <= rule.interval + 1e-9
        since += max(wait, 1e-12)
        looks.append(since)
    if since < rule.interval:
        assert rule.share > 0 and rule.interval > POLL * 98  # still polling
        return
    assert looks[-1] == pytest.approx(rule.interval)
    lower = earliest(rule, cost)
    assert any(t == pytest.approx(lower) for t in looks)
    after = [t for t in looks if t >= lower - 1e-9]
    gaps = np.diff(after)
    if rule.share > 0:
        assert (gaps <= POLL + 1e-9).all()
    else:
        assert after[-1] == pytest.approx(rule.interval)


class _Store:
    """Stands in for the store: counts the fetches recorded, takes plans."""

    wait = 0.0  # wall seconds the estimate's read waits (_QueuedStore)

    def __init__(self) -> None:
        self.recorded = 0

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            pages=0,
            hosts=0,
            fetches=self.recorded,
            acknowledged=self.recorded,
            batches=0,
            queued=0,
            last_batch_seconds=0.0,
        )

    async def record_policy(self, policy: str, budget: float, *, now: float) -> None:
        pass

    async def save_plan(self, update: Any, *, now: float) -> None:
        pass

    async def estimator_inputs(self, **how: Any) -> None:
        pass


class _QueuedStore(_Store):
    """A store whose read waits ``wait`` seconds of wall time behind other writes, as the
    daemon's does behind the writer's queued batch: time that is not the solve's CPU."""

    wait = 0.4  # 20 × this is past the floor

    async def estimator_inputs(self, **how: Any) -> None:
        done = threading.Event()
        await trio.to_thread.run_sync(lambda: done.wait(self.wait))


class _Frontier:
    """Stands in for the frontier: notes the (trio) time of every reload."""

    def __init__(self) -> None:
        self.resets: list[float] = []
        self.changed = trio.Event()

    def reset(self) -> None:
        self.resets.append(trio.current_time())
        self.changed.set()
        self.changed = trio.Event()

    def set_budget(self, budget: float) -> None:
        pass


class _Pages(InputSettings):
    """What the allocator reads: 1,000 pages, one host, no history (no store, no thread)."""

    async def load_costed(
        self, store: Any, *, now: float | None = None
    ) -> tuple[PolicyInputs, float]:
        await store.estimator_inputs()
        n = 1_000
        inputs = PolicyInputs(
            page_ids=np.arange(1, n + 1),
            host_index=np.zeros(n, dtype=np.intp),
            host_caps=np.array([np.inf]),
            last_fetch=np.full(n, np.nan),
            rates=np.full(n, 1e-3),
            rate_n=np.zeros(n),
            weights=np.ones(n),
        )
        return inputs, 0.0


@pytest.mark.parametrize(
    ("store", "fetched", "at", "reason"),
    [
        (_Store(), 600, RULE.floor, "learned"),
        (_Store(), 400, RULE.interval, "clock"),
        # the floor, not 20 × the wall time the solve's read spent queued
        (_QueuedStore(), 600, RULE.floor, "learned"),
    ],
)
async def test_the_allocator_plans_again_once_half_its_pages_were_fetched_but_not_before_the_floor(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    store: _Store,
    fetched: int,
    at: float,
    reason: str,
) -> None:
    frontier = _Frontier()
    allocator = Allocator(
        store=store,  # type: ignore[arg-type]
        frontier=frontier,  # type: ignore[arg-type]
        budget=10.0,
        policy="uniform",
        replan=RULE,
        inputs=_Pages(),
    )
    await nursery.start(allocator.run)
    [started] = frontier.resets
    assert allocator.statistics().last_solve_seconds >= store.wait
    store.recorded += fetched  # at once: the floor alone holds the plan off (or the clock)
    await frontier.changed.wait()
    assert frontier.resets[1] - started == pytest.approx(at, abs=1e-6)
    stats = allocator.statistics()
    assert stats.solve_reasons == {"start": 1, reason: 1}
    assert stats.replan_fetches == 500 and stats.fetched_since_solve == 0
    nursery.cancel_scope.cancel()
