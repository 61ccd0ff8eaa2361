"""The fleet's one budget, solved in rounds of questions to its nodes (pure: no I/O).

Each node holds a :class:`refresher.policies.Demand` over its own pages and host caps. The
coordinator asks every node the same question (a *query*), sums their answers and asks the
next, until the level y with Σ_nodes T_n(y) = B is found; the nodes then allocate at it and
the fleet's allocation is the one a single solve over the union of their pages would make.

Why rounds rather than shipping a sampled curve: a curve sampled at K points is exact only at
those points, and between them the freshness demand is a fine staircase of pages dropping out
and kinks of hosts reaching their caps, so 1e-6 on every page would need most of the pages'
breakpoints. An answer at one level is exact, costs a node one pass over its pages, and is
five numbers; Newton's steps in (y, ln T) from a bracket the nodes' own solves give converge
in a handful of rounds (each round one heartbeat of the nodes). The nodes keep allocating at
the last agreed level meanwhile.

The rounds:

1. ``census``: each node's room (Σ caps of hosts with pages worth fetching), the level at
   which it alone would take the whole budget (the fleet's level is at or above the highest of
   these), the room left for the unvalued pages.
2. ``level``: a trial y; each node answers what it takes there (:class:`policies.Point`).
   When Σ room ≤ B every such host sits at its cap (y = −∞) and the round is skipped.
3. ``spare``: what the caps left, water-filled fleet-wide into the unvalued pages' hosts
   (only when there is some); what even those cannot take is the fleet's ``unplaced``.
4. ``worth`` (``policy.decide = "expected"``, the optimal policies, with exploration): at the
   level found, each node's starved pages and Σ of their worth (the posterior probability
   that an exploration fetch can change the plan, :func:`refresher.refresh._allocate.
   worth_fetching`). As the single allocator does, the exploration share goes to the starved
   pages in proportion to their worth, and what their mean worth leaves of it goes back to
   the policy: then the level is searched again for the larger share (from the first one)
   and the worth asked again there.

The census also says whether every node can plan with the expected value (rates > 0 with a
posterior sd); when one cannot, the fleet plans with the point estimates, as a single node
would over the union of the pages.

Then the :class:`Solution`: the level, the factor that makes Σf exactly B (|ln Σ − ln B| is
below 1e-10 before it), the exploration share per starved page (as the single allocator gives
it: in equal parts, or per unit of worth) and the unplaced budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from refresher.policies import EXPECTED_POLICIES, WATER_FILL, Allocation, Demand, Level

__all__ = ["FleetSolver", "Solution", "Worth", "answer", "node_plan", "target_rates"]

#: a node's worth of an exploration fetch per page, given its pages' allocation at a level
Worth = Callable[[Allocation], NDArray[np.float64]]
#: the most of the exploration share the worth may leave before it goes back to the policy
_EXPLORE_KEPT = 0.999

_TOL = 1e-10  # |ln Σ_n T_n(y) − ln B| at which a level is accepted
# a bracket this narrow in y = ln μ is the answer: the root sits on pages dropping out, a
# cliff in Σf no level resolves; the rates are interpolated between the two ends (as the
# single solve does), every page's marginal value within 1e-8 of μ
_NARROW = 1e-8
_MAX_ROUNDS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    """What every node allocates with. ``mu`` is the policy's multiplier as
    :class:`policies.Allocation` reports it (μ, or t for the water-filling policies)."""

    policy: str
    budget: float  # B, the fleet's fetches per second
    y: float
    delta: float
    factor: float
    spare_y: float
    spare_factor: float
    explore_each: float  # fetches per second given to each page the policy gave nothing
    scale: float  # when none was starved: the exploration share spread over all pages
    unplaced: float
    mu: float
    rounds: int
    starved: int
    nodes: int = 0  # the nodes whose census answers it was solved over
    y_hi: float = math.nan  # on a cliff: the other end of the bracket …
    theta: float = 1.0  # … and the weight of y's rates against y_hi's
    decide: str = "plug-in"  # how the fleet planned (``policy.decide``, as it could)
    asked: str = "plug-in"  # how it was asked to
    explore_worth: float = 0.0  # fetches per second per unit of a starved page's worth

    @property
    def level(self) -> Level:
        return Level(
            y=self.y,
            delta=self.delta,
            y_hi=self.y_hi,
            theta=self.theta,
            factor=self.factor,
            spare_y=self.spare_y,
            spare_factor=self.spare_factor,
        )

    def to_json(self) -> dict[str, Any]:
        return {k: _num(v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Solution:
        defaults = {f.name: f.default for f in fields(cls)}
        text = ("policy", "decide", "asked")
        floats = {
            k: float(data.get(k, defaults[k]))
            for k in cls.__dataclass_fields__
            if k not in (*text, "rounds", "starved", "nodes")
        }
        return cls(
            policy=str(data["policy"]),
            rounds=int(data["rounds"]),
            starved=int(data["starved"]),
            nodes=int(data.get("nodes", 0)),
            decide=str(data.get("decide", "plug-in")),
            asked=str(data.get("asked", "plug-in")),
            **floats,
        )


def _num(v: Any) -> Any:
    """JSON has no ∞ or NaN: they travel as strings."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def answer(demand: Demand, query: dict[str, Any], worth: Worth | None = None) -> dict[str, Any]:
    """A node's answer to the coordinator's ``query`` (JSON both ways); ``worth``: the
    node's worth of exploring its pages (for the ``worth`` stage)."""
    stage = query["stage"]
    out: dict[str, Any] = {"round": query["round"], "pages": demand.pages}
    if stage == "census":
        share = float(query["share"])
        out.update(
            room=demand.room,
            spare_room=demand.spare_room,
            unvalued=demand.unvalued,
            start=demand.start(share),
            guess=demand.start(min(share, 0.5 * demand.room)) if demand.pages else -math.inf,
            expected=demand.expected,
        )
    elif stage == "worth":
        level = _level(query)
        alloc = demand.allocation(level, float(query["budget"]))
        idle = np.asarray(alloc.rates) <= 0.0
        value = np.ones(demand.pages) if worth is None else worth(alloc)
        out.update(starved=int(idle.sum()), worth=float(value[idle].sum()))
    else:
        y, spare_y = float(query["y"]), float(query["spare_y"])
        if stage == "spare":
            p = demand.spare(spare_y)
            starved = int((demand.rates(Level(y=y, spare_y=spare_y)) <= 0.0).sum())
        else:  # no spare share at this level: the point's pages are all of them
            p = demand.at(y)
            starved = p.starved
        out.update(capped=p.capped, free=p.free, slope=p.slope, starved=starved)
    return {k: _num(v) for k, v in out.items()}


def node_plan(
    demand: Demand, solution: Solution, worth: Worth | None = None
) -> tuple[NDArray[np.float64], Allocation]:
    """A node's target rate per page under the fleet's ``solution`` (exploration included;
    ``worth`` as for :func:`answer`) and its pages' allocation at the fleet's level."""
    alloc = demand.allocation(solution.level, solution.budget, solution.unplaced)
    f = np.asarray(alloc.rates)
    if solution.explore_worth > 0.0 and worth is not None:
        f = np.where(f <= 0.0, solution.explore_worth * worth(alloc), f)
    elif solution.explore_each > 0.0:
        f = np.where(f <= 0.0, solution.explore_each, f)
    elif solution.scale != 1.0:
        f = f * solution.scale
    return f, alloc


def target_rates(
    demand: Demand, solution: Solution, worth: Worth | None = None
) -> NDArray[np.float64]:
    """:func:`node_plan`'s target rates."""
    return node_plan(demand, solution, worth)[0]


def _level(query: dict[str, Any]) -> Level:
    """The :class:`Level` a ``worth`` query carries."""
    return Level(**{k: float(query[k]) for k in _LEVEL_KEYS})


_LEVEL_KEYS = ("y", "delta", "factor", "y_hi", "theta", "spare_y", "spare_factor")


@dataclass(slots=True)
class _Search:
    """y with T(y) = target, T falling in y. Steps in (y, ln T): the secant through the last
    two answers (pages dropping out make T a fine staircase whose average slope the local
    derivative misses), the local derivative for the first; Illinois false position on the
    bracket when a step leaves it or fails to halve the error; doubling outward while a side
    of the bracket is open."""

    target: float
    lo: float = -math.inf  # T(lo) ≥ target
    hi: float = math.inf  # T(hi) < target
    err_lo: float = math.inf
    err_hi: float = -math.inf
    expand: float = 1.0
    previous: float = math.inf
    previous_y: float = math.nan
    side: int = 0
    total_lo: float = math.nan  # T at lo and at hi, as answered
    total_hi: float = math.nan
    narrow: bool = False

    def next(self, y: float, total: float, slope: float) -> float | None:
        err = math.log(total / self.target) if total > 0.0 else -math.inf
        if abs(err) <= _TOL:
            return None
        if err > 0.0:
            if self.side > 0:  # Illinois: the other end kept twice, halve its error
                self.err_hi *= 0.5
            self.lo, self.err_lo, self.side, self.total_lo = y, err, 1, total
        else:
            if self.side < 0:
                self.err_lo *= 0.5
            self.hi, self.err_hi, self.side, self.total_hi = y, err, -1, total
        if self.hi - self.lo <= _NARROW:
            self.narrow = True
            return None
        s = slope / total if total > 0.0 else math.nan
        if math.isfinite(self.previous) and math.isfinite(err) and y != self.previous_y:
            secant = (err - self.previous) / (y - self.previous_y)
            if secant < 0.0 and math.isfinite(secant):
                s = secant
        step = math.nan
        if math.isfinite(err) and s < 0.0 and math.isfinite(s):
            step = y - err / s
        bounded = math.isfinite(self.lo) and math.isfinite(self.hi)
        stalled = bounded and abs(err) > 0.5 * abs(self.previous)
        self.previous, self.previous_y = err, y
        if math.isfinite(step) and self.lo < step < self.hi and not stalled:
            return step
        if bounded:
            if math.isfinite(self.err_lo) and math.isfinite(self.err_hi):
                position = self.lo + (self.hi - self.lo) * self.err_lo / (self.err_lo - self.err_hi)
                if self.lo < position < self.hi:
                    return position
            return 0.5 * (self.lo + self.hi)
        self.expand *= 2.0
        return self.lo + self.expand if math.isfinite(self.lo) else self.hi - self.expand


@dataclass(slots=True)
class FleetSolver:
    """The coordinator's side: ``query`` is the question for this round; give every live
    node's answer to :meth:`answers`; ``solution`` is set when the fleet has agreed.
    ``decide``: ``policy.decide`` (the expected value needs every node able to)."""

    policy: str
    budget: float
    explore: float = 0.0
    decide: str = "plug-in"
    query: dict[str, Any] = field(default_factory=dict)
    solution: Solution | None = None
    _search: _Search | None = None
    _census: dict[str, float] = field(default_factory=dict)
    _leftover: float = 0.0
    _heard: int = 0
    _share: float = math.nan  # what the policy splits (B less what exploration keeps)
    _asked: str = "plug-in"
    _again: bool = False  # the level is being searched a second time (worth)
    _found: tuple[Level, float, int] | None = None  # the level found, pending its worth
    _last: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # y, T, slope

    def __post_init__(self) -> None:
        self._share = self.budget * (1.0 - self.explore)
        self._asked = self.decide
        self.query = {"round": 0, "stage": "census", **self._about()}

    @property
    def share(self) -> float:
        """What the policy splits: B less the exploration share (less its worth's leftover,
        once known)."""
        return self._share

    def _about(self) -> dict[str, Any]:
        return {"share": self._share, "policy": self.policy, "decide": self.decide}

    def _ask(self, stage: str, y: float, spare_y: float = math.nan, **more: Any) -> None:
        self.query = {
            "round": self.query["round"] + 1,
            "stage": stage,
            **self._about(),
            "y": _num(y),
            "spare_y": _num(spare_y),
            **{k: _num(v) for k, v in more.items()},
        }

    def answers(self, answers: list[dict[str, Any]]) -> None:
        """All nodes' answers to ``query`` (answers to another round are ignored)."""
        got = [a for a in answers if a.get("round") == self.query["round"]]
        if self.solution is not None or not got:
            return
        if self.query["round"] >= _MAX_ROUNDS:  # pragma: no cover - converges in ~10
            raise RuntimeError("the fleet's level did not converge; please report the input")

        def total(key: str) -> float:
            return float(sum(float(a[key]) for a in got))

        stage = self.query["stage"]
        if stage == "census":
            self._take_census(got, total)
            return
        if stage == "worth":
            self._take_worth(total("starved"), total("worth"))
            return
        capped, free, slope = total("capped"), total("free"), total("slope")
        starved = int(total("starved"))
        y, spare_y = float(self.query["y"]), float(self.query["spare_y"])
        if self._search is None:  # the spare round that only counts the starved pages
            self._done(Level(y=y, spare_y=spare_y), unplaced=self._leftover, starved=starved)
            return
        if stage == "level":
            self._last = (y, capped + free, slope)
        nxt = self._search.next(y if stage == "level" else spare_y, capped + free, slope)
        if nxt is not None:
            if stage == "level":
                self._ask("level", nxt)
            else:
                self._ask("spare", y, nxt)
            return
        search = self._search
        target = search.target
        if stage == "level" and search.narrow:
            # on a cliff: between the two ends, where the fleet takes more and less than B
            gap = search.total_lo - search.total_hi
            theta = (target - search.total_hi) / gap if gap > 0.0 else 1.0
            level = Level(y=search.lo, y_hi=search.hi, theta=min(max(theta, 0.0), 1.0))
        elif stage == "level":
            # the last step to the root along the derivative, as the single solve takes it
            level = Level(y=y, delta=(target - capped - free) / slope if slope < 0.0 else 0.0)
        else:
            factor = (target - capped) / free if free > 0.0 else 1.0
            level = Level(y=y, spare_y=spare_y, spare_factor=factor)
        self._done(level, unplaced=0.0, starved=starved)

    def _take_census(self, got: list[dict[str, Any]], total: Callable[[str], float]) -> None:
        if self.decide == "expected" and not all(a.get("expected", False) for a in got):
            # a node cannot plan with the expected value: the union is planned with the
            # point estimates, as one node would plan it
            self.decide = "plug-in"
            self._ask("census", math.nan)
            return
        self._census = {k: total(k) for k in ("room", "spare_room", "unvalued", "pages")}
        self._heard = len(got)
        share = self._share
        if share <= 0.0 or self._census["pages"] == 0:
            self._done(Level(y=math.inf, factor=0.0), unplaced=share, starved=0)
            return
        if share >= self._census["room"]:
            self._spare(share - self._census["room"])
            return
        start = max(float(a["start"]) for a in got)
        y0 = start if math.isfinite(start) else max(float(a["guess"]) for a in got)
        self._search = _Search(share, lo=start)
        self._ask("level", y0)

    def _weighs(self) -> bool:
        """Exploration goes by worth: the expected value of an optimal policy, explored."""
        return (
            self.decide == "expected"
            and self.policy in EXPECTED_POLICIES
            and self.budget > self._share
        )

    def _done(self, level: Level, *, unplaced: float, starved: int) -> None:
        """The level is found: finish, or first ask for the starved pages' worth there."""
        if not (self._weighs() and starved > 0):
            self._finish(level, unplaced=unplaced, starved=starved)
            return
        self._found = (level, unplaced, starved)
        more = {k: getattr(level, k) for k in _LEVEL_KEYS if k not in ("y", "spare_y")}
        self._ask("worth", level.y, level.spare_y, budget=self.budget, **more)

    def _take_worth(self, starved: float, worth: float) -> None:
        """The starved pages' worth at the level found: the exploration share goes to them by
        worth; what their mean worth leaves of it goes back to the policy (once)."""
        spare = self.budget - self._share
        used = spare * worth / starved if starved > 0 else spare
        if not self._again and used < spare * _EXPLORE_KEPT:
            self._again = True
            self._share = self.budget - used
            y, total, slope = self._last
            if math.isfinite(y):  # the level was searched: its last point starts the next
                self._search = _Search(self._share)
                nxt = self._search.next(y, total, slope)  # the first level is one of its points
                if nxt is not None:
                    self._ask("level", nxt)
                    return
            self._search = None  # no level searched (the caps took it all): from the census
            self._ask("census", math.nan)
            return
        assert self._found is not None
        level, unplaced, count = self._found
        each = spare / worth if worth > 0.0 else 0.0
        self._finish(level, unplaced=unplaced, starved=count, explore_worth=each)

    def _spare(self, leftover: float) -> None:
        """Every host of valued pages at its cap: ``leftover`` goes to the unvalued pages."""
        room = self._census["spare_room"]
        if leftover <= 0.0 or self._census["unvalued"] == 0 or room <= 0.0:
            self._ask("spare", -math.inf, math.nan)
            self._leftover = leftover
            return
        if room <= leftover:
            self._ask("spare", -math.inf, -math.inf)
            self._leftover = leftover - room
            return
        # t = leftover/pages takes at most leftover: a bracket end
        y0 = -math.log(leftover / self._census["unvalued"])
        self._search = _Search(leftover, hi=y0)
        self._leftover = 0.0
        self._ask("spare", -math.inf, y0)

    def _finish(
        self, level: Level, *, unplaced: float, starved: int, explore_worth: float = 0.0
    ) -> None:
        y = level.y
        spare = self.budget - self._share
        placed = self._share - unplaced
        explore_each = spare / starved if starved and spare > 0.0 and not explore_worth else 0.0
        scale = 1.0
        if not explore_each and not explore_worth and spare > 0.0 and placed > 0.0:
            scale = self.budget / placed
        if self.policy in WATER_FILL:
            mu = math.exp(-y) if y > -math.inf else math.inf
        else:
            mu = math.exp(y) if y < 709.0 else math.inf
        self.solution = Solution(
            policy=self.policy,
            budget=self.budget,
            y=y,
            delta=level.delta,
            y_hi=level.y_hi,
            theta=level.theta,
            factor=level.factor,
            spare_y=level.spare_y,
            spare_factor=level.spare_factor,
            explore_each=explore_each,
            scale=scale,
            unplaced=unplaced,
            mu=mu,
            rounds=int(self.query["round"]),
            starved=starved,
            nodes=self._heard,
            decide=self.decide,
            asked=self._asked,
            explore_worth=explore_worth,
        )
