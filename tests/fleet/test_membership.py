"""Membership's timing on trio's autojump clock, against an in-memory lease table with the
database's rules (the real one is exercised by the fleet's process tests)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pytest
import trio

from refresher._errors import StoreError
from refresher.fleet._assignment import LeaseTiming
from refresher.fleet._membership import ClockSkewError, Membership, owns_hosts
from refresher.store._pg_leases import NodeRow, PartitionRow

EPOCH = 1.7e9
TTL = 3.0
TIMING = LeaseTiming(ttl=TTL, fetch_deadline=0.5)


def wall() -> float:
    return EPOCH + trio.current_time()


class Table:
    """The partitions and nodes tables, on the database's clock (``skew`` s ahead of ours)."""

    def __init__(self, partitions: int, *, skew: float = 0.0) -> None:
        self.partitions_ = partitions
        self.owner: dict[int, str | None] = dict.fromkeys(range(partitions))
        self.epoch = dict.fromkeys(range(partitions), 0)
        self.expires = dict.fromkeys(range(partitions), 0.0)
        self.beats: dict[str, float] = {}
        self.stopping: dict[str, bool] = {}
        self.skew = skew
        self.down = False
        self.log: list[tuple[str, Any]] = []
        self.hold_offs: list[Any] = []

    def now(self) -> float:
        return wall() + self.skew

    def _check(self) -> None:
        if self.down:
            raise StoreError("connection refused")

    def holder(self, p: int) -> str | None:
        o = self.owner[p]
        return o if o is not None and self.expires[p] > self.now() else None

    # -- refresher.store._pg_leases.LeaseStore (times on the caller's clock, as there) --------

    def heartbeat(self, node: str, stats: Any, now: float, *, stopping: bool = False) -> None:
        self._check()
        self.beats[node] = self.now()
        self.stopping[node] = stopping

    def nodes(self, now: float) -> list[NodeRow]:
        self._check()
        return [
            NodeRow(
                node_id=n,
                started_at=0.0,
                heartbeat_at=t,
                clock=None,
                stopping=self.stopping[n],
                statistics={},
                partitions=sum(1 for p in self.owner if self.holder(p) == n),
            )
            for n, t in sorted(self.beats.items())
        ]

    def partitions(self) -> list[PartitionRow]:
        self._check()
        return [
            PartitionRow(partition=p, owner=o, epoch=self.epoch[p], expires_at=self.expires[p])
            for p, o in self.owner.items()
        ]

    def renew(self, node: str, owned: Mapping[int, int], ttl: float, now: float) -> dict[int, int]:
        self._check()
        renewed = {}
        for p, e in owned.items():
            if self.owner[p] == node and self.epoch[p] == e:
                self.expires[p] = now + ttl
                renewed[p] = e
        return renewed

    def claim_free(
        self, node: str, n: int, ttl: float, now: float, hold_off: Any = None
    ) -> dict[int, int]:
        self._check()
        granted = {}
        for p in range(self.partitions_):
            if len(granted) == n:
                break
            if self.owner[p] is None or self.expires[p] < now:
                self.owner[p], self.epoch[p] = node, self.epoch[p] + 1
                self.expires[p] = now + ttl
                granted[p] = self.epoch[p]
        self.log.append(("claim", sorted(granted)))
        self.hold_offs.append(hold_off)
        return granted

    def release(self, node: str, partitions: Collection[int]) -> None:
        self._check()
        self.log.append(("release", sorted(partitions)))
        for p in partitions:
            if self.owner[p] == node:
                self.owner[p], self.expires[p] = None, 0.0


class CutOff:
    """The table as seen from a node cut off from it."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def heartbeat(self, *args: Any, **kw: Any) -> Any:
        raise StoreError("network unreachable")

    nodes = partitions = renew = claim_free = release = heartbeat


async def inline(fn: Callable[[], Any]) -> Any:
    """The lease calls in the trio thread: the autojump clock must not jump while a worker
    thread runs."""
    return fn()


class Node:
    """A membership with what it published and drained recorded."""

    def __init__(
        self,
        table: Table,
        name: str,
        drain_time: float = 0.0,
        run_sync: Callable[[Callable[[], Any]], Any] = inline,
    ) -> None:
        self.published: list[tuple[float, dict[int, int]]] = []
        self.drained: list[frozenset[int]] = []
        self.fenced: list[dict[int, int]] = []
        self.table = table

        async def drain(parts: frozenset[int], until: float) -> None:
            await trio.sleep(drain_time)
            self.drained.append(parts)
            table.log.append(("drained", sorted(parts)))

        self.m = Membership(
            leases=table,
            node_id=name,
            partitions=table.partitions_,
            run_sync=run_sync,
            timing=TIMING,
            serve=lambda held: self.published.append((trio.current_time(), dict(held))),
            fence=self._fence,
            drain=drain,
            wall_clock=wall,
        )

    def _fence(self, leases: Mapping[int, int]) -> None:
        self.fenced.append(dict(leases))
        self.table.log.append(("fence", sorted(leases)))

    @property
    def held(self) -> set[int]:
        return set(self.m.held)


async def test_nodes_split_the_partitions_and_a_joining_node_gets_its_share(autojump_clock):
    table = Table(12)
    a, b, c = Node(table, "a"), Node(table, "b"), Node(table, "c")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await trio.sleep(2)
        assert len(a.held) == 12
        await nursery.start(b.m.run)
        await trio.sleep(10)
        assert (len(a.held), len(b.held)) == (6, 6)
        await nursery.start(c.m.run)
        await trio.sleep(10)
        assert sorted(len(n.held) for n in (a, b, c)) == [4, 4, 4]
        assert not (a.held & b.held or b.held & c.held or a.held & c.held)
        # a shed partition was drained before it was released
        for i, (what, parts) in enumerate(table.log):
            if what == "release":
                assert ("drained", parts) in table.log[:i]
        nursery.cancel_scope.cancel()


async def test_a_node_stops_fetching_before_its_lease_can_expire_when_the_database_goes_away(
    autojump_clock,
):
    table = Table(4)
    a = Node(table, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await trio.sleep(2)
        assert len(a.held) == 4
        table.down = True
        down_at = trio.current_time()
        # last renewal sent at most one heartbeat before; the stop comes ttl − margin after it
        await trio.sleep(TTL - TIMING.margin)
        dropped = [t for t, held in a.published if not held]
        assert dropped and dropped[0] - down_at <= TTL - TIMING.margin
        # every lease was still valid on the database's clock when fetching stopped
        assert all(e > dropped[0] + EPOCH + TIMING.fetch_deadline for e in table.expires.values())
        assert a.m.statistics().self_fenced == 4 and not a.m.statistics().reachable
        await trio.sleep(20)
        assert a.held == set()
        table.down = False
        await trio.sleep(TTL * 2)
        assert len(a.held) == 4  # back, with new epochs
        assert all(e >= 2 for e in table.epoch.values())
        assert a.m.statistics().heartbeat_failures > 0
        nursery.cancel_scope.cancel()


async def test_a_resumed_node_starts_no_request_past_its_leases_stop_before_it_drops_them(
    autojump_clock,
):
    # A process paused (SIGSTOP, a frozen VM) past its leases' stop wakes with every task
    # ready at once: a worker may dispatch before the self-fencing task has dropped the
    # partitions another node took meanwhile (seen as two requests in flight to one host).
    table = Table(4)
    a = Node(table, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await trio.sleep(1)
        held = a.m.held
        assert len(held) == 4
        owns = owns_hosts(held, 4, fetching=a.m.fetching)
        assert owns("h1.sim.test")
        autojump_clock.jump(TTL)  # the pause: time passes and no task runs
        assert a.m.held == held  # the self-fencing task has not run yet
        assert owns_hosts(held, 4)("h1.sim.test")  # by the held set alone: the race
        assert not owns("h1.sim.test")  # by the leases' stop: no request starts
        nursery.cancel_scope.cancel()


async def test_another_node_takes_over_only_after_the_first_stopped_fetching(autojump_clock):
    table = Table(6)
    a, b = Node(table, "a"), Node(table, "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await trio.sleep(1)
        # a is cut off from the database (b still reaches it)
        a.m._leases = CutOff(table)
        await nursery.start(b.m.run)
        await trio.sleep(10)
        assert len(b.held) == 6 and a.held == set()
        a_stopped = next(t for t, held in a.published if not held)
        b_started = next(t for t, held in b.published if held)
        assert a_stopped < b_started
        nursery.cancel_scope.cancel()


async def test_stop_drains_then_hands_every_partition_back_at_once(autojump_clock):
    table = Table(8)
    a, b = Node(table, "a", drain_time=0.3), Node(table, "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await nursery.start(b.m.run)
        await trio.sleep(15)
        assert len(a.held) == 4
        mine = sorted(a.held)
        await a.m.stop()
        steps = [e for e in table.log if e[0] != "fence" or e[1] in (mine, [])]
        # the store accepts their writes until the fetches in flight are drained and committed
        assert steps[-4:] == [("fence", mine), ("drained", mine), ("fence", []), ("release", mine)]
        assert all(table.holder(p) is None for p in mine)
        stopped = trio.current_time()
        await trio.sleep(TIMING.heartbeat * 2)
        # b took them within a heartbeat or two, not a lease ttl
        assert len(b.held) == 8
        assert next(t for t, h in b.published if len(h) == 8) - stopped < TTL
        nursery.cancel_scope.cancel()


async def test_a_database_slow_to_answer_the_joining_heartbeat_is_waited_for(autojump_clock):
    """A node joining holds no lease, so there is no margin for a deadline to keep: a first
    heartbeat slower than the later ones may take (a loaded machine, a cold connection) is
    waited for, and the node joins with its share instead of failing to start."""
    table = Table(4)
    calls = 0

    async def slow_at_first(fn: Callable[[], Any]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            await trio.sleep(TIMING.heartbeat * 3)
        return fn()

    a = Node(table, "a", run_sync=slow_at_first)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        assert len(a.held) == 4
        assert a.m.statistics().heartbeat_failures == 0
        await trio.sleep(TTL * 2)  # and keeps them: later heartbeats answer in time
        assert len(a.held) == 4 and a.m.statistics().self_fenced == 0
        nursery.cancel_scope.cancel()


async def test_a_database_that_never_answers_the_joining_heartbeat_fails_the_start(
    autojump_clock,
):
    table = Table(4)

    async def hangs(fn: Callable[[], Any]) -> Any:
        await trio.sleep_forever()

    a = Node(table, "a", run_sync=hangs)
    with pytest.raises(StoreError, match="did not answer"):
        await a.m.run()
    assert a.held == set()


async def test_a_node_whose_clock_is_far_off_is_refused(autojump_clock):
    table = Table(4, skew=TTL)
    a = Node(table, "a")
    with pytest.raises(ClockSkewError, match=r"clock is .* off"):
        await a.m.run()
    assert a.held == set()


async def test_a_clock_drifting_away_steps_the_node_out_of_the_fleet_until_it_agrees(
    autojump_clock,
):
    table = Table(4)
    a = Node(table, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        await trio.sleep(2)
        assert len(a.held) == 4
        table.skew = -TTL
        beats = a.m.statistics().heartbeats
        await trio.sleep(TIMING.heartbeat * 2)
        assert a.held == set() and a.m.statistics().refused
        # the heartbeats that found the clock off were answered all the same: counted
        assert a.m.statistics().heartbeats >= beats + 2 and a.m.statistics().reachable
        assert table.stopping["a"] and all(table.owner[p] is None for p in range(4))
        table.skew = 0.0
        await trio.sleep(TIMING.heartbeat * 3)
        assert len(a.held) == 4 and not a.m.statistics().refused
        assert math.isclose(a.m.statistics().clock_skew or 0.0, 0.0, abs_tol=0.1)
        nursery.cancel_scope.cancel()


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Until ``predicate()`` holds, on the autojump clock (a minute of it at most)."""
    with trio.fail_after(60):
        while not predicate():
            await trio.sleep(0.01)


async def test_partitions_a_timed_out_claim_was_granted_are_fetched_within_a_heartbeat_or_two(
    autojump_clock,
):
    # PostgreSQL grants the claim, but its answer comes after the heartbeat's deadline: the
    # node gave up on it, so the table says the partition is the node's while nobody fetches
    # it. It used to wait out the whole lease (nobody may claim an unexpired one).
    table = Table(4)
    table.owner[3], table.expires[3] = "gone", table.now() + 1.5  # a node that left
    late = 0

    async def late_answer(fn: Callable[[], Any]) -> Any:
        nonlocal late
        if getattr(fn, "__name__", "") == "claim" and table.holder(3) is None and not late:
            late += 1  # the first claim of partition 3: granted, then answered too late
            value = fn()
            await trio.sleep(TTL)
            return value
        return fn()

    a = Node(table, "a", run_sync=late_answer)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        assert a.held == {0, 1, 2}
        await wait_until(lambda: late == 1)
        granted = trio.current_time()
        assert table.owner[3] == "a" and 3 not in a.held
        await wait_until(lambda: a.held == {0, 1, 2, 3})
        # a heartbeat's wait for the answer and one retry, not the lease's whole ttl
        assert trio.current_time() - granted < TTL
        assert ("release", [3]) in table.log
        # and the leases it held went on: the heartbeat after the claim kept its time
        assert a.m.statistics().self_fenced == 0 and a.m.statistics().lost == 0
        nursery.cancel_scope.cancel()


async def test_a_claim_after_a_reload_holds_hosts_off_by_the_reloaded_politeness_delays(
    autojump_clock,
):
    table = Table(4)
    # another node held two partitions and went silent: their leases lapse in 5 s
    for p in (2, 3):
        table.owner[p], table.epoch[p], table.expires[p] = "gone", 1, table.now() + 5
    a = Node(table, "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.m.run)
        assert a.held == {0, 1}
        a.m.set_delays(min_delay=3.0, max_delay=9.0)  # what a reload of [politeness] does
        await trio.sleep(10)
        assert a.held == {0, 1, 2, 3}
        last = table.hold_offs[-1]
        assert (last.min_delay, last.max_delay) == (3.0, 9.0)
        nursery.cancel_scope.cancel()
