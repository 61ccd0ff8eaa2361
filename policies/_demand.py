"""A page set's demand for fetches as a function of the budget's price: the seam that lets
several page sets (a fleet's nodes) share one budget and one optimum.

Every built-in policy allocates at one common *level* for the pages of hosts below their cap:
the Lagrange multiplier μ of the optimal policies, the rate per page t of uniform, the fetches
per change t of proportional. What a page set takes at a level, T(y) = Σ_h min(D_h(y), c_h),
is monotone, so the union of page sets spread over nodes is allocated exactly as one solve
over all of them by finding the y with Σ_nodes T_n(y) = B and allocating every node at it.
Here y = ln μ for the optimal policies and y = −ln t for the water-filling ones, so that
T falls as y rises in every case.

:class:`Demand` answers, for its own pages (with their host caps, which stay with the node):

* ``room``: the most the hosts of valued pages can take (Σ c_h); a budget at or above it
  leaves every such host at its cap, and the rest goes to the unvalued pages (λ = 0 or
  w = 0) water-filled into the hosts' residual room, fleet-wide too (:meth:`Demand.spare`);
* ``start(B)``: the level at which this page set alone takes B: the fleet's level lies at
  or above the largest of these (each node's T at its own is already B);
* ``at(y)``: the :class:`Point` there: Σ caps of the hosts over their caps, Σf of the
  other pages and its derivative in y, and how many pages get nothing;
* ``rates(level)``: the allocation at a :class:`Level` the fleet agreed on, pages of the
  hosts over their caps at their own multiplier (solved here: host caps are per node), the
  others scaled by the level's ``factor`` so that the fleet's Σf is exactly its budget;
  ``allocation(level)`` the same with the multipliers.

The optimal policies' demand is the plug-in one (the rates taken as exact) or, given each
rate's posterior sd, the expected value's (:func:`refresher.policies.solve_expected`): the
same search over the same kind of pages, so the fleet's level is the single solve's.

The coordinator's side (the root-finding over rounds of answers) is ``refresher.fleet``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._expected import EXPECTED_POLICIES, page_set, solve_expected
from ._solve import (
    _CAP_SLACK,
    Allocation,
    Pages,
    Problem,
    _host_start,
    _solve_groups,
    _Work,
    group_sum,
    response_pages,
)
from ._table import age_response, freshness_response

__all__ = ["WATER_FILL", "Demand", "Level", "Point"]

Float = NDArray[np.float64]
Index = NDArray[np.intp]
Mask = NDArray[np.bool_]

#: the policies whose level is a rate per unit of share (y = −ln t), with their share
WATER_FILL = ("uniform", "proportional")
_RESPONSES = {"optimal": freshness_response, "optimal-age": age_response}


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """What a page set takes at one level."""

    capped: float  # Σ c_h of the hosts over their caps there
    free: float  # Σf of the pages of the other hosts
    slope: float  # d(free)/dy (≤ 0)
    starved: int  # pages given nothing

    @property
    def total(self) -> float:
        return self.capped + self.free


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """The fleet's agreement: ``y`` (−∞: every host of valued pages at its cap), then the free
    pages' rates moved along their derivative by ``delta`` in y (the last step to the root, to
    first order: the pages steepest in y, about to drop out, take most of it, as in the single
    solve) and scaled by ``factor``; ``spare_y`` and ``spare_factor`` the same for the unvalued
    pages' share of what the caps left (``spare_y`` −∞: they take all their hosts' room; NaN:
    none)."""

    y: float
    delta: float = 0.0
    factor: float = 1.0
    #: on a cliff of pages dropping out: the free pages' rates are ``theta``·f(y) +
    #: (1 − ``theta``)·f(``y_hi``) (NaN: no second end)
    y_hi: float = math.nan
    theta: float = 1.0
    spare_y: float = math.nan
    spare_factor: float = 1.0


def _water(shares: Float, host: Index, caps: Float, t: float) -> tuple[Float, Mask, float, float]:
    """f_i = shares_i·min(t, c_h/a_h) (t = ∞: every host with shares at its cap); the hosts
    over their caps, Σ their caps and Σf of the others."""
    a_h = group_sum(host, shares, caps.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        breaks = np.where(a_h > 0.0, caps / a_h, np.inf)
    over = (a_h > 0.0) & (breaks < t)
    level = np.minimum(breaks, t)
    with np.errstate(invalid="ignore"):
        f = np.where(shares > 0.0, shares * level[host], 0.0)
    capped = float(caps[over].sum())
    free = float(np.sum(f, where=~over[host]))
    return f, over, capped, free


class Demand:
    """One page set's demand curve under ``policy`` (``uniform``, ``proportional``,
    ``optimal``, ``optimal-age``), with per-host caps; see the module docstring. Arguments
    as :func:`refresher.policies.solve`'s (budget aside); with ``log_sd`` (the sd of each
    ln λ, natural-log units, every rate > 0), the optimal policies' expected-value demand
    (:func:`refresher.policies.solve_expected`'s, ``rates`` the posterior medians)."""

    def __init__(
        self,
        policy: str,
        rates: ArrayLike,
        *,
        weights: ArrayLike | None = None,
        hosts: ArrayLike | None = None,
        host_caps: ArrayLike | None = None,
        log_sd: ArrayLike | None = None,
    ) -> None:
        if policy not in WATER_FILL and policy not in _RESPONSES:
            raise ValueError(f"no demand curve for policy {policy!r}")
        p = Problem.build(rates, 0.0, weights=weights, hosts=hosts, host_caps=host_caps)
        #: the expected-value demand (else the plug-in one)
        self.expected = log_sd is not None and policy in EXPECTED_POLICIES
        self._log_sd = None
        if self.expected:
            self._log_sd = np.broadcast_to(np.asarray(log_sd, np.float64), p.rates.shape)
            if p.rates.size and not p.rates.min() > 0.0:
                raise ValueError("an expected-value demand needs every rate > 0 (ln λ finite)")
        self.policy = policy
        self.pages = p.rates.size
        self._rates = p.rates
        self._host = np.zeros(self.pages, np.intp) if p.hosts is None else p.hosts
        self._caps = np.array([np.inf]) if p.caps is None else p.caps
        open_host = self._caps > 0.0
        lam, w = p.rates, p.weights
        self._weights = w
        if policy == "uniform":
            valued = np.ones(self.pages, dtype=bool)
        elif policy == "proportional":
            valued = lam > 0.0
        else:
            valued = (lam > 0.0) & (True if w is None else w > 0.0)
        self._valued = valued
        n_hosts = self._caps.size
        has_valued = group_sum(self._host, valued.astype(np.float64), n_hosts) > 0.0
        self.room = float(self._caps[has_valued & open_host].sum())
        unvalued = ~valued
        self.unvalued = int(unvalued.sum())
        has_unvalued = group_sum(self._host, unvalued.astype(np.float64), n_hosts) > 0.0
        #: Σ c_h of the open hosts with unvalued pages and no valued one: what the unvalued
        #: pages can take once every host of valued pages is at its cap
        self.spare_room = float(self._caps[has_unvalued & ~has_valued & open_host].sum())
        self._pages: Pages | None = None
        self._host_levels = np.full(n_hosts, math.nan)
        self._over = np.zeros(n_hosts, dtype=bool)
        if policy in _RESPONSES:
            # only the valued pages of open hosts take part, as in the single solve
            self._rows = np.flatnonzero(valued & open_host[self._host])
            w_v = None if w is None else w[self._rows]
            if self._log_sd is not None:
                self._pages = page_set(
                    policy, np.log(lam[self._rows]), self._log_sd[self._rows], w_v
                )
            else:
                self._pages = response_pages(_RESPONSES[policy](), lam[self._rows], w_v)
        self._shares = (
            np.where(valued, lam, 0.0) if policy == "proportional" else valued.astype(np.float64)
        )

    # -- the level ------------------------------------------------------------------------

    def start(self, budget: float) -> float:
        """The level at which these pages alone take ``budget`` (−∞ when their hosts' room
        is at most that)."""
        if budget >= self.room or self.pages == 0:
            return -math.inf
        from ._registry import solve

        w, host, caps = self._weights, self._host, self._caps
        if self._log_sd is not None:
            alloc = solve_expected(
                self.policy,
                np.log(self._rates),
                self._log_sd,
                budget,
                weights=w,
                hosts=host,
                host_caps=caps,
            )
        else:
            alloc = solve(self.policy, self._rates, budget, weights=w, hosts=host, host_caps=caps)
        if self.policy in WATER_FILL:
            return -math.log(alloc.multiplier)
        if self._pages is None or not alloc.multiplier > 0.0:  # pragma: no cover
            return -math.inf
        return math.log(alloc.multiplier)

    def at(self, y: float) -> Point:
        """What these pages take at level ``y`` (see :class:`Point`)."""
        f, over, _ = self._valued_rates(y)
        capped = float(self._caps[over].sum())
        free_pages = ~over[self._host]
        free = float(np.sum(f, where=free_pages))
        slope = self._slope
        return Point(capped=capped, free=free, slope=slope, starved=int((f <= 0.0).sum()))

    def spare(self, leftover_y: float) -> Point:
        """What the unvalued pages take at spare level ``leftover_y`` (= −ln t) in the room
        the hosts of valued pages, all at their caps, leave."""
        f, _, capped, free = self._spare_rates(leftover_y)
        return Point(capped=capped, free=free, slope=-free, starved=int((f <= 0.0).sum()))

    def rates(self, level: Level) -> Float:
        """f per page at the fleet's ``level`` (+∞: a zero budget, nothing)."""
        if level.y == math.inf:
            return np.zeros(self.pages)
        f, over, df = self._valued_rates(level.y)
        f = f.copy()
        free = ~over[self._host] & self._valued
        if not math.isnan(level.y_hi):
            f_hi, _, _ = self._valued_rates(level.y_hi)
            f[free] = level.theta * f[free] + (1.0 - level.theta) * f_hi[free]
        if level.delta != 0.0:
            f[free] = np.maximum(f[free] + level.delta * df[free], 0.0)
        f[free] *= level.factor
        if not math.isnan(level.spare_y) and self.unvalued:
            extra, over2, _, _ = self._spare_rates(level.spare_y)
            scale = np.where(over2[self._host], 1.0, level.spare_factor)
            f += extra * scale
        return f

    def allocation(self, level: Level, budget: float, unplaced: float = 0.0) -> Allocation:
        """These pages' share of a fleet's ``budget`` at ``level`` as an :class:`Allocation`:
        the multiplier is μ = e^y (uniform's and proportional's t = e^(−y)); for the optimal
        policies with each capped host's own."""
        rates = self.rates(level)
        rates.flags.writeable = False
        if self._pages is None:
            mu = math.exp(-level.y) if level.y > -math.inf else math.inf
            return Allocation(
                policy=self.policy, rates=rates, budget=budget, unplaced=unplaced, multiplier=mu
            )
        # the level the rates are at, as the single solve reports it: past the last step
        # along the derivative, or between the ends of a cliff's bracket
        y = level.y + level.delta
        if not math.isnan(level.y_hi):
            y += (1.0 - level.theta) * (level.y_hi - level.y)
        levels = np.where(self._over, self._host_levels, y)
        with np.errstate(over="ignore"):
            multipliers = np.exp(levels)
        multipliers.flags.writeable = False
        return Allocation(
            policy=self.policy,
            rates=rates,
            budget=budget,
            unplaced=unplaced,
            multiplier=math.exp(y) if y < 709.0 else math.inf,
            host_multipliers=multipliers,
            capped_hosts=self._over.copy(),
        )

    # -- internals --------------------------------------------------------------------------

    def _residual(self) -> Float:
        """The hosts' room once every host of valued pages is at its cap."""
        has_valued = group_sum(self._host, self._valued.astype(np.float64), self._caps.size) > 0
        return np.where(has_valued | (self._caps <= 0.0), 0.0, self._caps)

    def _spare_rates(self, y: float) -> tuple[Float, Mask, float, float]:
        t = math.inf if y == -math.inf else math.exp(-y)
        shares = (~self._valued).astype(np.float64)
        return _water(shares, self._host, self._residual(), t)

    def _valued_rates(self, y: float) -> tuple[Float, Mask, Float]:
        """(f per page at y, the hosts over their caps, df/dy per page); sets ``_slope``."""
        n_hosts = self._caps.size
        pages = self._pages
        if pages is None:
            t = math.inf if y == -math.inf else math.exp(-y)
            f, over, _, free = _water(self._shares, self._host, self._caps, t)
            self._slope = -free
            return f, over, -f
        f = np.zeros(self.pages)
        df_all = np.zeros(self.pages)
        rows = self._rows
        host = self._host[rows]
        caps = self._caps
        f_v = np.zeros(rows.size)
        if y == -math.inf:  # every host of valued pages at its cap
            over = group_sum(host, np.ones(rows.size), n_hosts) > 0.0
            start = np.full(n_hosts, np.nan)
            lo = None
            self._slope = 0.0
        else:
            work = _Work(pages)
            work.evaluate(np.array([y]))
            f_v, df = work.f.copy(), work.df
            df_all[rows] = df
            demand = group_sum(host, f_v, n_hosts)
            over = demand > caps * (1.0 + _CAP_SLACK)
            self._slope = float(np.sum(df, where=~over[host]))
            start = _host_start(y, host, f_v, df, caps, over)
            lo = np.full(n_hosts, y)
        levels = np.full(n_hosts, y)
        if over.any():
            capped_rows = np.flatnonzero(over[host])
            u, f_rows, _ = _solve_groups(
                pages.take(capped_rows),
                host[capped_rows],
                np.where(over, caps, 0.0),
                lo=lo,
                start=start,
                owned=True,
            )
            f_v[capped_rows] = f_rows
            levels[over] = u[over]
        levels[caps <= 0.0] = math.inf
        self._host_levels, self._over = levels, over | (caps <= 0.0)
        f[rows] = f_v
        return f, over, df_all
