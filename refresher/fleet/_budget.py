"""One budget, one optimum: a node's part in the fleet's allocation.

Every node runs a :class:`FleetBudget`. It is the allocator's :class:`Planner` in fleet mode:
at each allocation pass the node's estimated pages become its :class:`policies.Demand`, and the
plan is the node's pages allocated at the fleet's last agreed level (:class:`Solution`): the
optimal policies' μ, uniform's rate per page, proportional's fetches per change. Host caps stay
with the node: the pages of a host over its cap get the host's own multiplier, solved here.
The demand is the one :func:`refresher.refresh._allocate.plan` plans with (``policy.decide``:
the expected value under each rate's posterior when every node can), and exploration goes to
the starved pages as that plan gives it (by their worth, from the node's own estimates).

Whichever node holds the coordinator lease (one row in PostgreSQL, claimed like a partition
lease: free or expired, take it and increment its epoch; held, renew it) runs the rounds of
:class:`FleetSolver`: it posts a question, every live node answers from the demand it pinned
at the round's census, and when the answers agree with the budget it publishes the solution
with its epoch. A node keeps allocating at the last solution while a new one is being found or
the coordinator changes hands (a level stays valid when the pages change: it is a price), and
before the first one it plans alone for B/N, N being the nodes seen answering.

A node is live while its answer row is fresher than the lease ttl (each node rewrites it
every tick); a round waits for every live node, at most a lease ttl, then goes on with the
answers it has. The coordinator starts a new solve when the re-plan rule says so, the one a
single node's allocator asks (:func:`refresher.refresh._replan.replan_reason`, ``[policy]``):
once the fetches the nodes have acknowledged since the last solve began reach
``policy.replan_share`` of the fleet's pages, not sooner than ``policy.replan_floor`` nor than
20 × the last solve's cost, and at the latest every ``policy.resolve_interval`` seconds. Each
node's row carries its store's count of acknowledged fetches, its page count and the CPU
seconds of its last allocation pass (estimate and plan); the fleet's count is the sum of the
live nodes' counts since the solve began, its pages the sum of theirs, and a solve's cost the
costliest pass among them
(each new solution has every node plan again). It also solves at once when the fleet's
budget, policy, exploration share or ``policy.decide`` changes (its own configuration's) or a
node joins or leaves (the set of live nodes differs from the one the last solve heard), and
when a node's page set has grown or shrunk by more than a tenth since it answered the census:
a level is a price that stays valid while pages come and go, but not across a fleet that
starts empty and is then seeded (its first solve, over no pages, places nothing).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import trio

from refresher import policies
from refresher._errors import StoreError
from refresher.fleet._solve import FleetSolver, Solution, answer, node_plan
from refresher.ops._logging import get_logger
from refresher.refresh._allocate import (
    Plan,
    PolicyInputs,
    WarmStart,
    demand,
    plan,
    worth_fetching,
)
from refresher.refresh._replan import Reason, ReplanRule, replan_fetches, replan_reason
from refresher.store._pg_budget import BudgetStore, DemandRow

__all__ = ["FleetBudget", "FleetBudgetStatistics", "FleetReason"]

log = get_logger("fleet.budget")

# a node's pages may move this much (relative) from what its census answer counted before
# the coordinator solves again
_PAGES_MOVED = 0.1

#: why the coordinator solved: the allocator's reasons ("start": this node's first solve as
#: coordinator; "settings": the fleet's budget or policy changed), or "nodes": a node joined or
#: left, or its pages moved by more than a tenth since its census answer
FleetReason = Reason | Literal["nodes"]

_NO_PAGES = PolicyInputs(
    page_ids=np.zeros(0, np.int64),
    host_index=np.zeros(0, np.intp),
    host_caps=np.zeros(0),
    last_fetch=np.zeros(0),
    rates=np.zeros(0),
    rate_n=np.zeros(0),
    weights=np.zeros(0),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBudgetStatistics:
    coordinator: bool  # this node holds the coordinator lease
    epoch: int  # the coordinator epoch of the solution in use (0: none yet)
    policy: str
    mu: float  # the fleet's level (NaN before the first solution)
    unplaced: float  # fetches per second the fleet's caps leave unplaced
    rounds: int  # rounds the last solution took
    solves: int  # solutions this node published as coordinator
    # those solutions by why their solve began (FleetReason)
    solve_reasons: Mapping[str, int] = field(
        default_factory=dict, hash=False, metadata={"metric": "counter"}
    )
    # as coordinator: fetches the live nodes acknowledged since the last solve began, and how
    # many call for the next one (∞: policy.replan_share = 0; 0 and NaN on the other nodes)
    fetched_since_solve: int = 0
    replan_fetches: float = math.nan
    nodes: int  # nodes answering (as last seen)
    node_budget: float  # Σ target rates of this node's pages in its last plan
    errors: int  # ticks that failed on the database (it keeps the last level meanwhile)


_DEFAULT_REPLAN = ReplanRule()


def _none_acknowledged() -> int:
    return 0


def _no_pass() -> float:
    return 0.0


class FleetBudget:
    """A node's part in the fleet's one budget; see the module docstring. ``store`` is the
    SQL (:class:`refresher.store._pg_budget.PgBudget`), called from worker threads;
    ``replan`` the re-plan rule (``[policy]``, live: assign it); ``acknowledged`` this node's
    count of fetches its store acknowledged (:attr:`refresher.store.StoreStatistics.
    acknowledged`; none: the fleet re-plans on the clock alone) and ``plan_seconds`` the CPU
    seconds of its allocator's last estimate and plan (``last_solve_cpu_seconds``)."""

    def __init__(
        self,
        *,
        store: BudgetStore,
        node_id: str,
        lease_ttl: float = 10.0,
        replan: ReplanRule = _DEFAULT_REPLAN,
        acknowledged: Callable[[], int] = _none_acknowledged,
        plan_seconds: Callable[[], float] = _no_pass,
        tick: float | None = None,
        on_solution: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self.node_id = node_id
        self.lease_ttl = lease_ttl
        self.replan = replan
        self._acknowledged = acknowledged
        self._plan_seconds = plan_seconds
        self.tick = lease_ttl / 10.0 if tick is None else tick
        self._on_solution = on_solution
        # what the allocator's last plan saw (written from its worker thread)
        self._inputs = _NO_PAGES
        self._settings: tuple[str, float, float, str] | None = None
        self._solution: Solution | None = None
        self._solution_epoch = 0
        # node side: the demand pinned for the current solve (with its inputs), and what
        # was answered
        self._pinned: tuple[policies.Demand, PolicyInputs] | None = None
        self._answer: dict[str, Any] | None = None
        # coordinator side
        self._epoch: int | None = None
        self._solver: FleetSolver | None = None
        self._solver_settings: tuple[str, float, float, str] | None = None
        self._solve_id = 0
        self._members: frozenset[str] = frozenset()  # the nodes the last solve heard
        self._posted_at = 0.0
        self._solved_at = -math.inf
        self._reason: FleetReason = "start"  # why the solve under way began
        self._reasons: dict[str, int] = {}  # published solutions by self._reason
        # each live node's acknowledged fetches when the last solve began
        self._acknowledged_at: dict[str, int] = {}
        self._fetched = 0  # fetches since then, as of the last tick
        self._replan_fetches = math.nan
        self._nodes = 1
        self._node_budget = 0.0
        self._wake = trio.Event()
        self.errors = 0  # ticks that failed on the database

    # -- the allocator's side ---------------------------------------------------------------

    def __call__(
        self,
        inputs: PolicyInputs,
        policy: str,
        budget: float,
        *,
        explore: float,
        decide: str = "plug-in",
        warm: WarmStart | None = None,
    ) -> Plan:
        """The :class:`Planner`: ``inputs`` allocated at the fleet's level, planned as
        :func:`plan` plans (``decide``: with the expected value when every node can; ``warm``
        where a plan of this node's alone starts)."""
        self._inputs = inputs
        self._settings = (policy, budget, explore, decide)
        solution = self._solution
        if solution is None or solution.policy != policy or solution.asked != decide:
            # no level for these settings yet: plan alone for this node's share of B
            share = budget / max(self._nodes, 1)
            result = plan(inputs, policy, share, explore=explore, decide=decide, warm=warm)
        else:
            result = self._plan_at(inputs, solution)
        self._node_budget = float(result.target.sum())
        # The node's pacer at its own part of B (an even share while it planned nothing):
        # each node pacing at the whole B let a partition's new owner catch up on its overdue
        # pages at B while the others spent their parts, and with a work-conserving frontier
        # every node spends its whole pace, so a floor of an even share overspent the fleet's
        # B (12.7 of 10 fetches/s over two nodes planned 7.6 and 2.4).
        share = budget / max(self._nodes, 1)
        return replace(result, pace=self._node_budget if self._node_budget > 0 else share)

    @staticmethod
    def _plan_at(inputs: PolicyInputs, solution: Solution) -> Plan:
        d = demand(inputs, solution.policy, solution.decide)
        target, alloc = node_plan(d, solution, lambda a: worth_fetching(inputs, a))
        explored = 0
        if solution.explore_each > 0.0 or solution.explore_worth > 0.0:
            explored = int((np.asarray(alloc.rates) <= 0.0).sum())
        return Plan(target=target, allocation=alloc, explored=explored)

    @property
    def solution(self) -> Solution | None:
        """The fleet's last solution this node saw."""
        return self._solution

    def poke(self) -> None:
        self._wake.set()

    def close(self) -> None:
        """Close the store's connection (after :meth:`run` ended)."""
        self._store.close()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backoff = 0.0
        try:
            while True:
                try:
                    await self.step()
                    backoff = 0.0
                except StoreError as e:
                    # PostgreSQL away: keep planning at the last level; the coordinator lease
                    # cannot be proven, so coordinate again only after claiming it anew
                    backoff = min(max(2.0 * backoff, self.tick), self.lease_ttl)
                    if self._epoch is not None:
                        log.warning("fleet budget coordinator lost", error=str(e))
                    self._epoch, self._solver = None, None
                    self.errors += 1
                    log.warning("fleet budget: the database is unreachable", error=str(e))
                with trio.move_on_after(max(self.tick, backoff)):
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            if self._epoch is not None:
                epoch = self._epoch
                with trio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await trio.to_thread.run_sync(
                        lambda: self._store.release_coordinator(self.node_id, epoch)
                    )

    async def step(self) -> None:
        """One tick: answer the current round, take up a new solution, and coordinate if
        this node holds (or can take) the coordinator lease."""
        store = self._store
        row = await trio.to_thread.run_sync(store.coordinator)
        if row.solution and (
            self._solution is None
            or row.epoch != self._solution_epoch
            or row.solution != self._solution.to_json()
        ):
            self._solution = Solution.from_json(row.solution)
            self._solution_epoch = row.epoch
            log.info(
                "fleet budget solved",
                policy=self._solution.policy,
                mu=self._solution.mu,
                unplaced=round(self._solution.unplaced, 6),
                rounds=self._solution.rounds,
            )
            if self._on_solution is not None:
                self._on_solution()
        await self._answer_round(row.epoch, row.query)
        await self._coordinate()

    async def _answer_round(self, epoch: int, query: dict[str, Any] | None) -> None:
        if query is None:
            return
        key = (epoch, query.get("solve"), query.get("round"))
        mine = self._answer
        if mine is None or (mine["epoch"], mine.get("solve"), mine.get("round")) != key:
            inputs = self._inputs
            if query["stage"] == "census" or self._pinned is None:
                policy, decide = str(query["policy"]), str(query.get("decide", "plug-in"))
                pinned_demand = await trio.to_thread.run_sync(
                    lambda: demand(inputs, policy, decide)
                )
                self._pinned = (pinned_demand, inputs)
            d, seen = self._pinned
            reply = await trio.to_thread.run_sync(
                lambda: answer(d, query, lambda a: worth_fetching(seen, a))
            )
            mine = {**reply, "epoch": epoch, "solve": query.get("solve")}
            self._answer = mine
        # with the page count of the allocator's last plan: the coordinator solves again when
        # it has moved far from what this node's census answer counted
        # and what the coordinator's re-plan rule counts: its acknowledged fetches and the
        # cost of a new solution to it (its allocator's pass)
        summary = {
            **mine,
            "pages_now": int(self._inputs.page_ids.size),
            "acknowledged": int(self._acknowledged()),
            "plan_seconds": float(self._plan_seconds()),
        }
        # rewritten every tick: the row's freshness is this node's liveness
        await trio.to_thread.run_sync(lambda: self._store.answer(self.node_id, epoch, summary))

    async def _coordinate(self) -> None:
        store = self._store
        epoch = await trio.to_thread.run_sync(
            lambda: store.claim_coordinator(self.node_id, self.lease_ttl)
        )
        if epoch != self._epoch:
            if epoch is not None:
                log.info("fleet budget coordinator", node=self.node_id, epoch=epoch)
            self._epoch, self._solver = epoch, None
        rows = await trio.to_thread.run_sync(store.answers)
        live = [r for r in rows if r.age <= self.lease_ttl]
        self._nodes = max(len(live), 1)
        if epoch is None or self._settings is None:
            return
        now = time.monotonic()
        solver = self._solver
        reason: FleetReason | None = "start"
        if solver is not None:
            reason = self._due(live, now) if solver.solution is not None else None
        if reason is not None:
            self._members = frozenset(r.node_id for r in live)
            await self._start(epoch, now, reason, live)
            return
        if solver is None or solver.solution is not None:
            return
        query = solver.query
        current = [
            r.summary
            for r in live
            if r.epoch == epoch
            and r.summary.get("solve") == self._solve_id
            and r.summary.get("round") == query["round"]
        ]
        if len(current) < len(live) and now - self._posted_at < self.lease_ttl:
            return  # wait for the others (at most a lease ttl)
        if query["stage"] == "census":
            self._members = frozenset(
                r.node_id
                for r in live
                if r.epoch == epoch and r.summary.get("solve") == self._solve_id
            )
        solver.answers(current)
        if solver.solution is not None:
            solution = solver.solution
            ok = await trio.to_thread.run_sync(
                lambda: store.publish(epoch, solution.to_json(), unplaced=solution.unplaced)
            )
            if ok:
                self._reasons[self._reason] = self._reasons.get(self._reason, 0) + 1
                self._solved_at = now
            return
        await self._post(epoch, solver.query, now)

    def _due(self, live: list[DemandRow], now: float) -> FleetReason | None:
        """Why a new solve is due now, the last one published, with ``live`` the live nodes'
        rows: the settings or the nodes changed, or as the re-plan rule says over the fleet's
        pages and the fetches acknowledged since the last solve began; None: not yet."""
        if self._settings != self._solver_settings:
            return "settings"
        members = frozenset(r.node_id for r in live)
        if members != self._members or any(_pages_moved(r.summary) for r in live):
            return "nodes"
        self._fetched = sum(
            _fetched_since(r.summary, self._acknowledged_at.get(r.node_id, 0)) for r in live
        )
        pages = sum(int(r.summary.get("pages_now", 0)) for r in live)
        cost = max((float(r.summary.get("plan_seconds", 0.0)) for r in live), default=0.0)
        self._replan_fetches = replan_fetches(self.replan, pages)
        since = now - self._solved_at
        return replan_reason(since, self._fetched, pages, cost, self.replan)

    async def _start(
        self, epoch: int, now: float, reason: FleetReason, live: list[DemandRow]
    ) -> None:
        assert self._settings is not None
        policy, budget, explore, decide = self._settings
        log.info(
            "fleet budget solving",
            reason=reason,
            fetched_since=self._fetched,
            nodes=len(live),
            epoch=epoch,
        )
        self._reason = reason
        self._acknowledged_at = {r.node_id: int(r.summary.get("acknowledged", 0)) for r in live}
        self._fetched = 0
        self._solve_id += 1
        self._solver = FleetSolver(policy=policy, budget=budget, explore=explore, decide=decide)
        self._solver_settings = self._settings
        await self._post(epoch, self._solver.query, now)

    async def _post(self, epoch: int, query: dict[str, Any], now: float) -> None:
        # a solve id that outlives coordinators: the epoch and the sequence in it
        self._solve_id = max(self._solve_id, 1)
        posted = {**query, "solve": self._solve_id}
        ok = await trio.to_thread.run_sync(lambda: self._store.post_query(epoch, posted))
        self._posted_at = now
        if not ok:
            self._solver = None
        self._wake.set()  # answer it ourselves at once

    def statistics(self) -> FleetBudgetStatistics:
        s = self._solution
        return FleetBudgetStatistics(
            coordinator=self._epoch is not None,
            epoch=self._solution_epoch,
            policy="" if s is None else s.policy,
            mu=math.nan if s is None else s.mu,
            unplaced=0.0 if s is None else s.unplaced,
            rounds=0 if s is None else s.rounds,
            solves=sum(self._reasons.values()),
            solve_reasons=dict(self._reasons),
            fetched_since_solve=self._fetched if self._epoch is not None else 0,
            replan_fetches=self._replan_fetches if self._epoch is not None else math.nan,
            nodes=self._nodes,
            node_budget=self._node_budget,
            errors=self.errors,
        )


def _pages_moved(summary: dict[str, Any]) -> bool:
    """Whether a node's pages now differ from those its answers count by more than
    ``_PAGES_MOVED`` of them (any page at all, when it answered for none)."""
    now, pinned = summary.get("pages_now"), summary.get("pages")
    if now is None or pinned is None:
        return False
    return abs(int(now) - int(pinned)) > _PAGES_MOVED * max(int(pinned), 1)


def _fetched_since(summary: dict[str, Any], before: int) -> int:
    """A node's acknowledged fetches since the last solve began, when it had acknowledged
    ``before``: all of its count when that is smaller (the node started again since)."""
    now = int(summary.get("acknowledged", 0))
    return now - before if now >= before else now
