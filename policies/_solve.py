"""Splitting a fetch budget over pages, under per-host politeness caps.

Two solvers, both vectorised over pages and hosts (no Python loop over either):

* ``water_fill``: f_i = a_i·t for a share a_i (1 for uniform, λ_i for proportional), with
  every host h whose pages would exceed its cap c_h held at c_h (f_i = a_i·c_h/a_h) and the
  level t set so that the budget is spent. Exact, from one sort of the hosts' breakpoints.
* ``optimal``: maximise Σ w_i·V(λ_i, f_i) (V = F̄ or −Ā) under Σ f_i = B and Σ_{i∈h} f_i ≤ c_h.
  The Lagrange conditions are w_i·∂V/∂f = μ for pages of hosts whose cap does not bind and
  = μ_h > μ for pages of a host at its cap (its own multiplier), which is how the caps are
  met: as the constrained optimum, not by clipping. A host at its cap takes c_h whatever μ
  is below μ_h, so μ solves Σ_h min(D_h(μ), c_h) = B, D_h being what the host's pages would
  take at μ; the hosts over their caps there are then solved for their own μ_h, all at once.

The pages are :class:`Pages`: what a page takes at a level and its slope, block by block
(the plug-in optimum's :class:`ResponsePages` here, the expected value's in ``_expected``);
the search is the same for both. Each multiplier is found by a safeguarded iteration on
log Σf in log μ, run for all groups at once: the first step from a compressed stand-in for
the pages (a histogram; under caps, then from each host's local model), then secant steps —
pages dropping out of the freshness optimum make Σf a fine staircase whose average slope a
local derivative misses — with Illinois false position when a step leaves the bracket or
stalls. The page rates come from the tables of ``_table``. The last small gap to the budget
is closed along the derivative and by an exact rescale; a root on a cliff of pages dropping
out is pinned to 1e-8 in μ and the rates interpolated across. The marginal values then agree
to about 1e-7 or better.

Budget that cannot be placed by the policy itself (every host holding a page worth fetching is
at its cap, or no page is worth fetching) is spread uniformly over the remaining pages whose
hosts still have room, and what is left after that is returned as ``unplaced``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from ._table import Response, Scratch

__all__ = ["Allocation", "Problem", "group_sum", "optimal", "water_fill"]

Float = NDArray[np.float64]
Index = NDArray[np.intp]
Mask = NDArray[np.bool_]
_T = TypeVar("_T", bound=np.generic)

_CHUNK = 1 << 16  # pages per vectorised block: keeps temporaries in cache
# |log Σf − log budget| at which a multiplier is accepted; the first-order correction that
# follows leaves an error of order _FTOL² (see _solve_groups)
_FTOL = 1e-6
# … and for one group (the global multiplier): tighter, so that the level it reports is the
# same whichever way it was reached (a fleet's rounds reach it otherwise), to ~1e-9; the
# last step along the derivative then rarely moves a page across its drop-out
_FTOL_ONE = 1e-8
_BINS = 4096
_UTOL = 1e-8  # a bracket on log μ this narrow is the answer (see _solve_groups)
_MAX_ITERATIONS = 200
_ELASTIC = 16.0  # the most |d ln f/du| a page's slope counts with (see _smooth_slope)
_CAP_SLACK = 1e-9  # a host is over its cap when its sum exceeds c_h·(1 + slack)
# how far above an earlier plan's global level (in ln μ) a warm solve first evaluates the
# pages: far enough that the root is below it after the rates have moved a little, so that
# the hosts over their caps there are settled (see _solve_global)
_PROBE = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """The result of splitting ``budget`` over pages; every rate in fetches per second.

    ``multiplier`` is the level shared by the pages of every host whose cap does not bind:
    for the optimal policies the Lagrange multiplier μ (the weighted marginal value
    w·∂V/∂f of one more fetch per second; ∞ when the budget is 0), for uniform the rate
    per page and for proportional the fetches per change. ``host_multipliers`` gives each
    host its own level (μ_h ≥ μ for the optimal policies, a level ≤ the common one for the
    others), ``capped_hosts`` which hosts sit at their cap; both are None without hosts.
    Arrays are read-only.
    """

    policy: str
    rates: Float
    budget: float
    unplaced: float
    multiplier: float
    host_multipliers: Float | None = None
    capped_hosts: Mask | None = None

    @property
    def placed(self) -> float:
        """Fetches per second given to pages: Σf, which is ``budget − unplaced``."""
        return float(self.rates.sum())


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Validated input of one allocation (see ``Problem.build``)."""

    rates: Float  # λ_i, changes per second
    budget: float  # B, fetches per second
    weights: Float | None  # w_i ≥ 0; None: all 1
    hosts: Index | None  # host id per page, or None (no caps)
    caps: Float | None  # c_h, fetches per second (∞ = no cap), indexed by host id

    @classmethod
    def build(
        cls,
        rates: object,
        budget: float,
        *,
        weights: object = None,
        hosts: object = None,
        host_caps: object = None,
    ) -> Problem:
        """Check and convert the arguments of ``allocate``; ValueError says what is wrong."""
        lam = np.ascontiguousarray(rates, dtype=np.float64)
        if lam.ndim != 1:
            raise ValueError(f"rates must be a 1-D array of changes per second, got {lam.ndim}-D")
        if not _finite_nonnegative(lam):
            raise ValueError("rates must be finite and ≥ 0 (changes per second)")
        b = float(budget)
        if not (math.isfinite(b) and b >= 0.0):
            raise ValueError(f"budget must be finite and ≥ 0 fetches per second, got {budget!r}")
        w = None
        if weights is not None:
            w = np.ascontiguousarray(np.broadcast_to(np.asarray(weights, np.float64), lam.shape))
            if not _finite_nonnegative(w):
                raise ValueError("weights must be finite and ≥ 0")
        h, c = check_hosts(hosts, host_caps, lam.size)
        return cls(rates=lam, budget=b, weights=w, hosts=h, caps=c)


class Budgeted(Protocol):
    """What a split needs besides the pages: B and the host caps (validated)."""

    @property
    def budget(self) -> float: ...
    @property
    def hosts(self) -> Index | None: ...
    @property
    def caps(self) -> Float | None: ...


def check_hosts(hosts: object, host_caps: object, pages: int) -> tuple[Index | None, Float | None]:
    """``hosts`` and ``host_caps`` checked and converted (None, None: no caps)."""
    if host_caps is not None and hosts is None:
        raise ValueError("host_caps needs hosts: give the host id of every page")
    if hosts is None or host_caps is None:
        return None, None
    h = np.ascontiguousarray(hosts)
    if h.shape != (pages,) or not np.issubdtype(h.dtype, np.integer):
        raise ValueError("hosts must be an integer array with one host id per page")
    h = h.astype(np.intp, copy=False)
    c = np.ascontiguousarray(host_caps, dtype=np.float64)
    if c.ndim != 1 or np.isnan(c).any() or (c < 0.0).any():
        raise ValueError("host_caps must be a 1-D array of fetches per second ≥ 0 (∞: none)")
    if h.size and (h.min() < 0 or h.max() >= c.size):
        raise ValueError(f"host ids must lie in [0, {c.size}): host_caps has one entry per host id")
    return h, c


def _finite_nonnegative(a: Float) -> bool:
    """All of ``a`` finite and ≥ 0 (NaN fails both bounds), without a temporary array."""
    return a.size == 0 or bool(a.min() >= 0.0 and a.max() < np.inf)


def _add_along(f: Float, df: Float, delta: float, where: Mask | None = None) -> bool:
    """f ← max(f + delta·df, 0) in place (only ``where``), unless that leaves nothing: then
    f stays and False is returned. Block by block: big temporaries cost more than the
    arithmetic."""
    blocks = [slice(start, start + _CHUNK) for start in range(0, f.size, _CHUNK)]

    def moved(block: slice) -> Float:
        step = df[block] * delta
        if where is not None:
            step *= where[block]
        return np.maximum(f[block] + step, 0.0)

    if not sum(float(moved(block).sum()) for block in blocks) > 0.0:
        return False
    for block in blocks:
        f[block] = moved(block)
    return True


def group_sum(group: Index, values: Float, groups: int) -> Float:
    """Σ values per group id in [0, groups)."""
    return np.bincount(group, values, minlength=groups).astype(np.float64, copy=False)


def _frozen(a: NDArray[np.generic] | None) -> None:
    if a is not None:
        a.flags.writeable = False


def _finish(
    name: str,
    problem: Budgeted,
    f: Float,
    leftover: float,
    multiplier: float,
    host_levels: Float | None,
    capped: Mask | None,
    unvalued: Mask | None,
) -> Allocation:
    """Place ``leftover`` uniformly on ``unvalued`` pages with room, report the rest."""
    if leftover > 0.0 and unvalued is not None and unvalued.any():
        residual = None
        if problem.hosts is not None and problem.caps is not None:
            used = group_sum(problem.hosts, f, problem.caps.size)
            residual = np.maximum(problem.caps - used, 0.0)
        extra, _, _, leftover = _water_fill(
            unvalued.astype(np.float64), problem.hosts, residual, leftover, f.size
        )
        f += extra
    for a in (f, host_levels, capped):
        _frozen(a)
    return Allocation(
        policy=name,
        rates=f,
        budget=problem.budget,
        unplaced=max(leftover, 0.0),
        multiplier=multiplier,
        host_multipliers=host_levels,
        capped_hosts=capped,
    )


def _water_fill(
    shares: Float | None, hosts: Index | None, caps: Float | None, budget: float, pages: int
) -> tuple[Float, float, Float | None, float]:
    """f_i = shares_i·min(t, c_h/a_h) with Σf = budget where the caps allow; ``shares``
    None means 1 for each of ``pages`` pages.

    Returns (f, t, per-host level or None, unplaced)."""
    if hosts is None or caps is None:
        total = float(pages if shares is None else shares.sum())
        if total <= 0.0:
            return np.zeros(pages), math.inf, None, budget
        t = budget / total
        return (np.full(pages, t) if shares is None else shares * t), t, None, 0.0
    a_h = group_sum(hosts, np.ones(pages) if shares is None else shares, caps.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        breaks = np.where(a_h > 0.0, caps / a_h, np.inf)
    order = np.argsort(breaks[a_h > 0.0], kind="stable")
    live = np.flatnonzero(a_h > 0.0)[order]
    t_sorted = breaks[live]
    c_sorted = caps[live]
    a_sorted = a_h[live]
    # T(t_k) = Σ_{j<k} c_j + t_k·Σ_{j≥k} a_j: what the hosts take when the level reaches t_k
    capped_before = np.concatenate(([0.0], np.cumsum(c_sorted)[:-1]))
    shares_from = np.cumsum(a_sorted[::-1])[::-1]
    with np.errstate(invalid="ignore"):
        taken = capped_before + t_sorted * shares_from
    k = int(np.searchsorted(taken, budget, side="left"))
    if k == live.size:  # every host with shares is at its cap
        t = math.inf
        leftover = budget - float(c_sorted.sum())
    else:
        t = (budget - capped_before[k]) / shares_from[k]
        leftover = 0.0
    level = np.minimum(breaks, t)
    if shares is None:
        return level[hosts], t, level, max(leftover, 0.0)
    with np.errstate(invalid="ignore"):
        f = np.where(shares > 0.0, shares * level[hosts], 0.0)
    return f, t, level, max(leftover, 0.0)


def water_fill(name: str, problem: Problem, shares: Float | None) -> Allocation:
    """Allocate ``f_i ∝ shares_i`` (uniform: None, i.e. 1; proportional: λ_i) under the caps."""
    pages = problem.rates.size
    f, t, level, leftover = _water_fill(shares, problem.hosts, problem.caps, problem.budget, pages)
    capped = None
    if level is not None and problem.hosts is not None and problem.caps is not None:
        counts = np.ones(pages) if shares is None else shares
        capped = (group_sum(problem.hosts, counts, problem.caps.size) > 0.0) & (level < t)
    unvalued = None if shares is None else shares <= 0.0
    return _finish(name, problem, f, leftover, t, level, capped, unvalued)


class Pages:
    """Pages of one objective as the solvers see them: each page's rate f(u) and df/du at
    u = ln μ of its group, block by block into the caller's buffers. Two kinds: the plug-in
    optimum (:class:`ResponsePages`, a response table of ``_table``) and the expected value
    under a posterior (``_expected``)."""

    #: a page's rate falls to 0 at a finite μ (freshness), making Σf a fine staircase
    drops_out = False

    @property
    def size(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def take(self, index: Index) -> Pages:  # pragma: no cover - abstract
        """The pages at ``index``."""
        raise NotImplementedError

    def compact(self, index: Index) -> Pages:
        """The pages at ``index`` (increasing), in this object's own arrays where it can:
        the caller is done with this one (its arrays are this solve's copies)."""
        return self.take(index)

    def level(self, u: Float) -> object:
        """What one evaluation at the groups' levels ``u`` shares between its blocks."""
        return u

    def rates(  # pragma: no cover - abstract
        self, block: slice, level: object, group: Index | None, f: Float, df: Float
    ) -> None:
        """f and df/du of the pages in ``block`` at ``level`` (``group``: the block's group
        per page, None: one group), written into ``f`` and ``df``."""
        raise NotImplementedError

    def mass(self, group: Index | None, groups: int) -> Float:  # pragma: no cover - abstract
        """Σ M_i per group (one entry for ``group`` None) of M_i ≥ 0 with f_i(u) ≤ M_i·e^(−u/2)
        for every u: an upper end for each group's u."""
        raise NotImplementedError

    def start(self, budget: float) -> tuple[float, float] | None:
        """A first guess of u for one group taking ``budget`` and the slope of ln Σf in u
        there, from a compressed stand-in for the pages; None: no cheaper way than trying."""
        return None

    def alive(self, u: Float, group: Index | None) -> Mask | None:
        """The pages that take something at their group's level ``u`` (``group``: per page,
        None: one group); every other page takes nothing at any level from there up (past
        its drop-out). None: every page takes something."""
        return None

    def _alive(self, u: Float, group: Index | None, dead: Callable[[slice, Float], Mask]) -> Mask:
        """:meth:`alive` block by block (no page-sized temporaries), ``dead(block, u per
        page)`` saying which of a block's pages take nothing."""
        out = np.empty(self.size, dtype=bool)
        for start in range(0, self.size, _CHUNK):
            block = slice(start, start + _CHUNK)
            level = u[group[block]] if group is not None else np.broadcast_to(u[0], (1,))
            np.logical_not(dead(block, level), out=out[block])
        return out


class ResponsePages(Pages):
    """The plug-in optimum: f = A·e^(−u/2)·R(u + ln s) (see ``_table``)."""

    def __init__(self, response: Response, log_s: Float, amp: Float) -> None:
        self.response, self.log_s, self.amp = response, log_s, amp
        self.drops_out = response.drops_out

    @property
    def size(self) -> int:
        return self.log_s.size

    def take(self, index: Index) -> ResponsePages:
        return ResponsePages(self.response, self.log_s[index], self.amp[index])

    def compact(self, index: Index) -> ResponsePages:
        return ResponsePages(self.response, compact(self.log_s, index), compact(self.amp, index))

    def level(self, u: Float) -> object:
        with np.errstate(over="ignore"):
            return u, np.exp(-0.5 * u), self.response.scratch(min(self.size, _CHUNK))

    def alive(self, u: Float, group: Index | None) -> Mask | None:
        if not self.drops_out:
            return None
        # R(v) = 0 from v = ln μ + ln s = 0 on
        return self._alive(u, group, lambda block, level: self.log_s[block] + level >= 0.0)

    def rates(self, block: slice, level: object, group: Index | None, f: Float, df: Float) -> None:
        u, scale, scratch = cast(tuple[Float, Float, "Scratch | None"], level)
        # f = A·e^(−u/2)·R(v), df/du = A·e^(−u/2)·(R'(v) − R/2), v = u + ln s
        if group is None:
            v = np.add(self.log_s[block], u[0], out=_buffer(scratch, 2, f.size))
            a = np.multiply(self.amp[block], scale[0], out=_buffer(scratch, 3, f.size))
        else:
            v = np.take(u, group, out=_buffer(scratch, 2, f.size), mode="clip")
            v += self.log_s[block]
            a = np.take(scale, group, out=_buffer(scratch, 3, f.size), mode="clip")
            a *= self.amp[block]
        self.response.into(v, a, f, df, scratch)

    def mass(self, group: Index | None, groups: int) -> Float:
        # R ≤ 1
        return np.array([self.amp.sum()]) if group is None else group_sum(group, self.amp, groups)

    def start(self, budget: float) -> tuple[float, float] | None:
        if self.size <= _BINS:
            return None
        return _Histogram(self.log_s, self.amp).start(self.response, budget)


def _buffer(scratch: Scratch | None, k: int, size: int) -> Float:
    """The k-th float buffer of ``scratch`` cut to ``size``, or a fresh one without it."""
    return np.empty(size) if scratch is None else scratch.floats[k][:size]


def _step_sums(group: Index, f: Float, df: Float, groups: int) -> Float:
    """Σ of :func:`_step_slope` per group, in blocks (no page-sized temporaries)."""
    out = np.zeros(groups)
    # one pair of buffers for every block: a fresh block of this size is memory-mapped,
    # and its page faults cost more than the arithmetic
    size = min(f.size, 1 << 20)
    slope, scaled = np.empty(size), np.empty(size)
    for start in range(0, f.size, 1 << 20):
        b = slice(start, start + (1 << 20))
        n = f[b].size
        out += group_sum(group[b], _step_slope(f[b], df[b], slope[:n], scaled[:n]), groups)
    return out


def _step_slope(
    f: Float, df: Float, out: Float | None = None, scratch: Float | None = None
) -> Float:
    """df/du held to at most ``_ELASTIC`` times f in size: the slope to step along. A page
    close to its drop-out (or, under a posterior, to its cut-off) has a slope that a step of
    1e-8 already leaves behind; summed, it would make the pages' slope that of the one page
    about to drop, and every step along it vanish. Held, the slope is the other pages' (whose
    elasticity is of order 1), which is what a step of the size the search takes sees. The
    true slope stays what the last first-order step to the root moves the pages along."""
    if out is None or scratch is None:
        return np.maximum(df, f * -_ELASTIC)
    np.multiply(f, -_ELASTIC, out=scratch)
    return np.maximum(df, scratch, out=out)


class _Work:
    """Pages of one solve (of one group, or of several with ``group``), evaluated block by
    block into reusable buffers. ``index`` maps them to the caller's order (None: same)."""

    def __init__(
        self,
        pages: Pages,
        group: Index | None = None,
        index: Index | None = None,
        buffers: tuple[Float, Float] | None = None,
        *,
        owned: bool = False,
    ):
        self.pages, self.group, self.index = pages, group, index
        # the pages, groups and index are this solve's copies: a keep may overwrite them
        self.owned = owned
        n = pages.size
        # a smaller work than the one it came from takes that one's buffers (fresh memory
        # of this size costs page faults, as much as a pass over it)
        self.f = np.empty(n) if buffers is None else buffers[0][:n]
        self.df = np.empty(n) if buffers is None else buffers[1][:n]
        self.step = np.zeros(0)  # per group, Σ of _step_slope (when asked for)

    def keep(self, mask: Mask, *, reuse: bool = False) -> _Work:
        """The pages of ``mask``; ``reuse``: in this work's buffers (this one is done with)."""
        assert self.group is not None
        rows = np.flatnonzero(mask)
        if reuse and self.owned:  # (no fresh copies: they would cost page faults)
            index = rows if self.index is None else compact(self.index, rows)
            group = compact(self.group, rows)
            return _Work(self.pages.compact(rows), group, index, (self.f, self.df), owned=True)
        index = rows if self.index is None else self.index[rows]
        buffers = (self.f, self.df) if reuse else None
        return _Work(self.pages.take(rows), self.group[rows], index, buffers, owned=reuse)

    def live(self, active: Mask, lo: Float) -> Mask:
        """Per page: its group is ``active`` and the page not past its drop-out at its group's
        lower bracket end ``lo`` (ln μ per group; from there up it takes nothing)."""
        assert self.group is not None
        keeping = active[self.group]
        # (at a level of −∞ every page takes something: no pass over the pages to say so)
        alive = self.pages.alive(lo, self.group) if np.isfinite(lo).any() else None
        if alive is not None:
            keeping &= alive
        return keeping

    def evaluate(self, u: Float, *, step: bool = False, slope: bool = True) -> tuple[Float, Float]:
        """Σf and dΣf/du per group at u = log μ (one entry per group; without ``slope`` only
        Σf, and NaN for the slope: :meth:`slope` sums it when needed); fills f and df, and
        with ``step`` ``self.step``."""
        level = self.pages.level(u)
        n = self.f.size
        self.step = np.zeros(u.size)
        with np.errstate(over="ignore", invalid="ignore"):  # far out of the way Σf may be ∞
            for start in range(0, n, _CHUNK):
                block = slice(start, min(start + _CHUNK, n))
                group = None if self.group is None else self.group[block]
                f, df = self.f[block], self.df[block]
                self.pages.rates(block, level, group, f, df)
                if not step:
                    continue
                if group is None:
                    self.step[0] += _step_slope(f, df).sum()
                else:
                    self.step += group_sum(group, _step_slope(f, df), u.size)
        if self.group is None:
            return np.array([self.f.sum()]), np.array([self.df.sum()])
        total = group_sum(self.group, self.f, u.size)
        return total, self.slope(u.size) if slope else np.full(u.size, np.nan)

    def slope(self, groups: int) -> Float:
        """dΣf/du per group at the last evaluation."""
        if self.group is None:
            return np.array([self.df.sum()])
        return group_sum(self.group, self.df, groups)


class _Histogram:
    """The pages of one solve binned by log s (4,096 bins), for a cheap first guess of μ.

    Each bin stands for its pages at their A-weighted mean log s, which cancels the
    first-order error."""

    def __init__(self, log_s: Float, amp: Float) -> None:
        self.log_s, self.amp = log_s, amp
        self.lo = float(log_s.min())
        self.width = (float(log_s.max()) - self.lo) / _BINS or 1.0
        self.mass = np.zeros(_BINS)
        self.moment = np.zeros(_BINS)
        for start in range(0, log_s.size, _CHUNK):  # in blocks: no page-sized temporaries
            ls, a = log_s[start : start + _CHUNK], amp[start : start + _CHUNK]
            idx = self.bins(ls)
            self.mass += group_sum(idx, a, _BINS)
            self.moment += group_sum(idx, a * ls, _BINS)

    def bins(self, log_s: Float) -> Index:
        idx = ((log_s - self.lo) * (1.0 / self.width)).astype(np.intp)
        np.clip(idx, 0, _BINS - 1, out=idx)
        return idx

    def start(self, response: Response, budget: float) -> tuple[float, float]:
        """(log μ, d log Σf/d log μ) for the pages. Where pages drop out (freshness:
        v = log μ + log s reaches 0) binning smears a cliff, so the bins around the first
        answer's drop-out are replaced by their pages and solved again. The slope is the
        histogram's, smoothed over the pages dropping out, which a local derivative misses."""
        keep = self.mass > 0.0
        centre = np.divide(self.moment, self.mass, out=np.zeros(_BINS), where=keep)
        b = np.array([budget])
        u, _, df = _solve_groups(ResponsePages(response, centre[keep], self.mass[keep]), None, b)
        if response.drops_out and np.isfinite(u[0]):
            cliff = math.floor((-u[0] - self.lo) / self.width)
            first, last = max(cliff - 2, 0), min(cliff + 2, _BINS - 1)
            if first <= last:
                edge_lo = self.lo + first * self.width if first > 0 else -np.inf
                edge_hi = self.lo + (last + 1) * self.width if last < _BINS - 1 else np.inf
                exact = np.flatnonzero((self.log_s >= edge_lo) & (self.log_s < edge_hi))
                keep[first : last + 1] = False
                pages = ResponsePages(
                    response,
                    np.concatenate((centre[keep], self.log_s[exact])),
                    np.concatenate((self.mass[keep], self.amp[exact])),
                )
                u, _, df = _solve_groups(pages, None, b, start=u)
        return float(u[0]), float(df.sum()) / budget


def _exactly(group: Index, f: Float, budgets: Float) -> Float:
    """``f`` rescaled so that every group's sum is exactly its budget."""
    placed = group_sum(group, f, budgets.size)
    factor = np.divide(budgets, placed, out=np.zeros(budgets.size), where=placed > 0.0)
    scaled: Float = f * factor[group]
    return scaled


def _between(
    work: _Work,
    lo: Float,
    hi: Float,
    budgets: Float,
    caps_by: tuple[Index, Float, Mask] | None = None,
) -> tuple[Float, Float, Float]:
    """Rates of ``work``'s groups interpolated between the bracket ends, where the groups take
    more (lo) and less (hi) than their budgets, so that they take them exactly. With
    ``caps_by`` (one group), each host's sum is interpolated alike and counts up to its
    cap: the weight solves Σ_h min(D_h, c_h) = budget, piecewise linear in it (a host may
    reach its cap inside the bracket, or leave it: the page it owes it to is the one
    crossing its drop-out), and the hosts over their caps there are the capped ones.

    Returns (u, f, df/du at lo)."""
    at_lo, _ = work.evaluate(lo)
    f_lo, df_lo = work.f.copy(), work.df.copy()
    at_hi, _ = work.evaluate(hi)
    if caps_by is not None:
        host, caps, capped = caps_by
        d_lo = group_sum(host, f_lo, caps.size)
        d_hi = group_sum(host, work.f, caps.size)

        def taken(theta: float) -> float:
            return float(np.minimum(d_hi + theta * (d_lo - d_hi), caps).sum())

        low, high = 0.0, 1.0  # taken(0) < budget ≤ taken(1): the bracket's ends
        for _ in range(60):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if taken(mid) < budgets[0] else (low, mid)
        theta = high
        sums = d_hi + theta * (d_lo - d_hi)
        capped[...] = sums > caps * (1.0 + _CAP_SLACK)
        f = work.f + theta * (f_lo - work.f)
        free = ~capped[host]
        rest = budgets[0] - float(caps[capped].sum())
        placed = float(np.sum(f, where=free))
        np.multiply(f, rest / placed if placed > 0.0 else 0.0, out=f, where=free)
        return lo + (1.0 - theta) * (hi - lo), f, df_lo
    with np.errstate(invalid="ignore", divide="ignore"):
        theta_g = np.clip(np.nan_to_num((budgets - at_hi) / (at_lo - at_hi)), 0.0, 1.0)
    g = np.zeros(f_lo.size, np.intp) if work.group is None else work.group
    f = work.f + theta_g[g] * (f_lo - work.f)
    with np.errstate(invalid="ignore"):  # groups not in ``work`` may have open brackets
        u = lo + (1.0 - theta_g) * (hi - lo)
    return u, _exactly(g, f, budgets), df_lo


def _capped_slope(work: _Work, caps_by: tuple[Index, Float, Mask], over: Mask) -> Float:
    """The derivative in u of Σ_h min(D_h, c_h) at ``work``'s last evaluation (``over``: the
    hosts over their caps there, whose sums do not move)."""
    host, caps, _ = caps_by
    return np.array([float(np.where(over, 0.0, group_sum(host, work.df, caps.size)).sum())])


def _capped_totals(
    work: _Work,
    caps_by: tuple[Index, Float, Mask],
    u: float = math.nan,
    budget: float = 0.0,
    *,
    slope: bool = True,
) -> tuple[Float, Float, Float, Mask, float]:
    """(Σ_h min(D_h, c_h), its derivative in u, the slope to step along, hosts over their
    caps, the u where the hosts' local models take ``budget``) for ``work``'s last evaluation
    at u, D_h being the sum over host h's pages. The model holds each D_h log-linear in u
    through its value and slope (to step along; only asked for with a ``budget``). Without
    ``slope`` the derivative and the slope to step along are NaN (:func:`_capped_slope`)."""
    host, caps, _ = caps_by
    demand = group_sum(host, work.f, caps.size)
    over = demand > caps * (1.0 + _CAP_SLACK)
    total = float(np.where(over, caps, demand).sum())
    if not slope:
        return np.array([total]), np.full(1, np.nan), np.full(1, np.nan), over, math.nan
    derivative = _capped_slope(work, caps_by, over)
    step = float(derivative[0])
    model = math.nan
    if math.isfinite(u) and budget > 0.0:
        dslope = _step_sums(host, work.f, work.df, caps.size)
        step = float(np.where(over, 0.0, dslope).sum())
        live = demand > 0.0
        d, c = demand[live], caps[live]
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(dslope[live] < 0.0, dslope[live] / d, -0.5)

        def taken(v: float) -> float:
            with np.errstate(over="ignore"):
                return float(np.minimum(d * np.exp(e * (v - u)), c).sum())

        lo, hi = u - 1.0, u + 1.0
        for _ in range(60):  # widen to a bracket (the model's sum falls in v)
            if taken(lo) >= budget:
                break
            lo = u - 2.0 * (u - lo)
        for _ in range(60):
            if taken(hi) <= budget:
                break
            hi = u + 2.0 * (hi - u)
        if taken(lo) >= budget >= taken(hi):  # else the hosts with demand cannot take it
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if taken(mid) > budget else (lo, mid)
            model = 0.5 * (lo + hi)
    return np.array([total]), derivative, np.array([step]), over, model


def _solve_groups(
    pages: Pages,
    group: Index | None,
    budgets: Float,
    *,
    lo: Float | None = None,
    hi: Float | None = None,
    start: Float | None = None,
    start_slope: Float | float = math.nan,
    caps_by: tuple[Index, Float, Mask] | None = None,
    seen: tuple[float, float] | None = None,
    buffers: tuple[Float, Float] | None = None,
    owned: bool = False,
) -> tuple[Float, Float, Float]:
    """Find u_g = log μ_g with Σ_{i∈g} f_i = budgets[g] for every group holding pages.

    ``group`` None means one group. ``lo``/``hi`` optionally bracket u (Σf > budget at lo,
    < budget at hi); ``start`` is a first guess, ``start_slope`` the slope of log Σf in
    log μ to take the first step with (per group or one for all; default: the local one).
    Returns u per group (+∞ for a zero budget, NaN for a group without pages), f per page
    (each group's sum exactly its budget) and df/du per page.

    ``caps_by`` = (host per page, cap per host, capped: out) makes one group of pages on
    capped hosts: a host counts with min(Σ_{i∈h} f_i, c_h), and u is the global multiplier
    of the capped problem. The hosts over their caps at u are marked in ``capped``; their
    pages' rates are left as they are at u (their own multipliers are the caller's job).
    ``seen`` = (u, log Σf − log budget) of a point already evaluated (one group): the first
    step is the secant through it, not a model's. ``buffers``: f and df arrays of at least
    the pages' size to work in (one group: the rates and slopes returned are theirs).
    ``owned``: ``pages`` and ``group`` are the caller's copies, which the search may
    overwrite (it compacts them as groups finish)."""
    single = group is None
    groups = budgets.size
    ftol = _FTOL_ONE if single else _FTOL
    total_amp = pages.mass(group, groups)
    u = np.full(groups, np.nan)
    present = total_amp > 0.0
    u[present & (budgets <= 0.0)] = np.inf
    active = present & (budgets > 0.0)
    if not active.any():
        return u, np.zeros(pages.size), np.zeros(pages.size)
    # filled group by group as they converge (a single group returns the work buffers)
    f_out = np.zeros(0) if single else np.zeros(pages.size)
    df_out = np.zeros(0) if single else np.zeros(pages.size)
    log_b = np.log(np.where(active, budgets, 1.0))
    # f ≤ M·e^(−u/2), so at u = 2·log(ΣM/b) the group takes at most its budget.
    with np.errstate(divide="ignore"):
        bound = 2.0 * (np.log(np.where(active, total_amp, 1.0)) - log_b)
    lo_u = np.full(groups, -np.inf) if lo is None else np.array(lo, np.float64, copy=True)
    hi_u = bound if hi is None else np.minimum(bound, hi)
    lo_u = np.minimum(lo_u, hi_u)
    # the first step's slope of log Σf in u: the smoothed one when known, else the local one
    first_slope = np.array(np.broadcast_to(start_slope, (groups,)), dtype=np.float64)
    guess = pages.start(float(budgets[0])) if start is None and single else None
    if guess is not None:
        start = np.array([guess[0]])
        first_slope[0] = guess[1]
    u = np.where(active, hi_u, u)
    if start is not None:
        inside = (start > lo_u) & (start < hi_u)
        u = np.where(active & inside, start, u)
    expand = np.ones(groups)
    previous = np.full(groups, np.inf)
    previous_u = np.full(groups, np.nan)
    if seen is not None:
        previous_u[0], previous[0] = seen
    err_lo = np.full(groups, np.inf)  # log Σf − log budget at lo_u (> 0) and hi_u (< 0)
    err_hi = np.full(groups, -np.inf)
    last_side = np.zeros(groups, np.int8)
    work = _Work(pages, group, buffers=buffers, owned=owned)
    if group is not None:
        # the groups with a budget, without their pages past their drop-out at ``lo`` (a
        # group's level is above it: they take nothing; the group has pages that do not)
        keeping = work.live(active, lo_u)
        if not keeping.all():
            work = work.keep(keeping, reuse=True)
    elastic = np.full(groups, np.nan)  # d ln Σf/du to step along, from the first evaluation
    for iteration in range(_MAX_ITERATIONS):
        first = iteration == 0
        # the slopes serve the first step and the last (summed when a group converges)
        total, slope = work.evaluate(
            np.where(active, u, 0.0), step=first and caps_by is None, slope=first
        )
        step_slope = work.step
        model = math.nan
        if caps_by is not None:
            # the hosts' local models only serve the first step
            ask = float(budgets[0]) if first and seen is None else 0.0
            total, slope, step_slope, over, model = _capped_totals(
                work, caps_by, float(u[0]), ask, slope=first
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            if first:
                elastic = step_slope / total
            err = np.log(total) - log_b
            # Then the secant through the last two points: pages crossing their drop-out
            # make Σf a fine staircase, whose average slope the derivative at a point misses.
            secant = (err - previous) / (u - previous_u)
            secant = np.where(np.isfinite(first_slope), first_slope, secant)
            use = np.isfinite(secant) & (secant < 0.0)
            newton = u - err / np.where(use, secant, elastic)
            if math.isfinite(model) and not np.isfinite(previous[0]):
                # first step of a capped solve: the root of the hosts' local models, each
                # host's sum log-linear in u up to its cap, which sees hosts reach their caps
                newton = np.array([model])
        first_slope[:] = np.nan
        err = np.where(active, err, 0.0)
        # the bracket and its errors; Illinois: an end kept twice running has its error halved
        to_lo, to_hi = active & (err > 0.0), active & (err < 0.0)
        err_hi = np.where(to_lo & (last_side > 0), 0.5 * err_hi, err_hi)
        err_lo = np.where(to_hi & (last_side < 0), 0.5 * err_lo, err_lo)
        lo_u, err_lo = np.where(to_lo, u, lo_u), np.where(to_lo, err, err_lo)
        hi_u, err_hi = np.where(to_hi, u, hi_u), np.where(to_hi, err, err_hi)
        last_side = np.where(to_lo, 1, np.where(to_hi, -1, last_side))
        converged = active & (np.abs(err) <= ftol) & (total > 0.0)
        # μ pinned to 1e-8 but Σf still off: the root sits on pages crossing their drop-out,
        # where Σf is steep beyond what a double resolves. Every page's rate between the two
        # ends has a marginal value within 1e-8 of μ, so interpolate the rates between them.
        narrow = active & ~converged & ((hi_u - lo_u) <= _UTOL)
        if converged.any():
            # Close the last gap along the derivative: to first order these are the rates at
            # the exact root (the error left is of the order of err²), and the pages steep in
            # μ absorb most of it. A rescale then makes the sum exact. (When the budget is
            # below what a double resolves on the steep pages, the correction can cancel to
            # nothing; then the rescale alone places it.)
            if not first:
                slope = (
                    work.slope(groups) if caps_by is None else _capped_slope(work, caps_by, over)
                )
            flat = converged & (slope != 0.0)  # a sum held at the caps has no slope
            delta = np.divide(budgets - total, slope, out=np.zeros(groups), where=flat)
            u = np.where(converged, u + delta, u)
            if work.group is None and caps_by is not None:
                host, caps, capped = caps_by
                capped[...] = over
                free = ~over[host]
                _add_along(work.f, work.df, float(delta[0]), free)
                rest = budgets[0] - float(caps[over].sum())
                placed = float(np.sum(work.f, where=free))
                np.multiply(work.f, rest / placed if placed > 0.0 else 0.0, out=work.f, where=free)
                return u, work.f, work.df
            if work.group is None:
                _add_along(work.f, work.df, float(delta[0]))
                work.f *= budgets[0] / work.f.sum()
                return u, work.f, work.df
            rows = converged[work.group]
            g = work.group[rows]
            df_rows = work.df[rows]
            f_rows = work.f[rows]
            corrected = np.maximum(f_rows + delta[g] * df_rows, 0.0)
            usable = group_sum(g, corrected, groups) > 0.0
            f_rows = np.where(usable[g], corrected, f_rows)
            out = work.index[rows] if work.index is not None else np.flatnonzero(rows)
            f_out[out] = _exactly(g, f_rows, budgets)
            df_out[out] = df_rows
        if narrow.any():
            sub = work if work.group is None else work.keep(narrow[work.group])
            u_n, f_rows, df_rows = _between(sub, lo_u, hi_u, budgets, caps_by)
            u = np.where(narrow, u_n, u)
            if sub.group is None:
                return u, f_rows, df_rows
            out = sub.index if sub.index is not None else np.arange(sub.f.size)
            f_out[out] = f_rows
            df_out[out] = df_rows
        finished = converged | narrow
        active &= ~finished
        if not active.any():
            break
        if work.group is not None:
            # drop the finished groups' pages, and those past their drop-out at their
            # group's lower end (they take nothing from there up), once they are a good
            # part of the work (until then they are evaluated along, unused)
            keeping = work.live(active, lo_u)
            if keeping.mean() < 0.75:
                work = work.keep(keeping, reuse=True)
        # Newton/secant in (log μ, log Σf) unless it leaves the bracket or fails to halve the
        # error; then false position on the bracket (Illinois), or bisection where an end has
        # nothing to interpolate (Σf = 0), or a step outward (doubling) while a side is open.
        bounded = np.isfinite(lo_u) & np.isfinite(hi_u)
        stalled = np.abs(err) > 0.5 * np.abs(previous)
        fallback = ~np.isfinite(newton) | (newton <= lo_u) | (newton >= hi_u) | (stalled & bounded)
        outward = np.where(np.isfinite(hi_u), hi_u - expand, lo_u + expand)
        with np.errstate(invalid="ignore", divide="ignore"):
            position = lo_u + (hi_u - lo_u) * err_lo / (err_lo - err_hi)
        middle = 0.5 * (lo_u + hi_u)
        inside = np.isfinite(position) & (position > lo_u) & (position < hi_u)
        step = np.where(bounded, np.where(inside, position, middle), outward)
        expand = np.where(fallback & ~bounded, 2.0 * expand, expand)
        # A bracket across which ln Σf falls ten times faster than the pages' slope says it
        # holds a jump (pages crossing their drop-out): no secant or false position finds a
        # level there, halving it is the fastest way to pin it (see ``narrow``).
        with np.errstate(divide="ignore", invalid="ignore"):
            jump = bounded & (hi_u - lo_u < 1e-5)
            jump &= err_lo - err_hi > -10.0 * elastic * (hi_u - lo_u)
        fallback |= jump
        step = np.where(jump, middle, step)
        previous_u = u
        u = np.where(active, np.where(fallback, step, newton), u)
        previous = err
    else:  # pragma: no cover - the iteration converges in well under 100 rounds
        raise RuntimeError("the allocation multiplier did not converge; please report the input")
    return u, f_out, df_out


def optimal(
    name: str, response: Response, problem: Problem, warm: Allocation | None = None
) -> Allocation:
    """Maximise Σ w_i·V(λ_i, f_i) for the objective tabulated by ``response``; ``warm`` as
    :func:`solve_pages` takes it."""
    lam, w = problem.rates, problem.weights
    everything = lam.size > 0 and lam.min() > 0.0 and (w is None or w.min() > 0.0)
    valued = np.ones(lam.shape, dtype=bool) if everything else lam > 0.0
    if w is not None and not everything:
        valued &= w > 0.0
    index: Index | None = None
    lam_v, w_v = lam, w
    if not everything and not valued.all():
        index = np.flatnonzero(valued)
        lam_v = lam[index]
        w_v = None if w is None else w[index]
    unvalued = None if index is None else ~valued
    pages = response_pages(response, lam_v, w_v)
    return solve_pages(name, pages, problem, lam.size, index, unvalued, warm=warm)


def response_pages(response: Response, rates: Float, weights: Float | None) -> ResponsePages:
    """The plug-in optimum's pages of rates > 0 and weights > 0 (None: all 1)."""
    # y = μ·s with s = λᵖ/w; f = A·μ^(−1/2)·R(log μ + log s) with A = √(λ^(2−p)·w/2)
    log_s = np.log(rates)
    if response.power != 1:
        log_s *= response.power
    half = 0.5 * rates if response.power == 1 else np.full_like(rates, 0.5)
    if weights is not None:
        log_s -= np.log(weights)
        half *= weights
    return ResponsePages(response, log_s, np.sqrt(half, out=half))


def solve_pages(
    name: str,
    pages: Pages,
    problem: Budgeted,
    n: int,
    index: Index | None,
    unvalued: Mask | None,
    hint: Allocation | None = None,
    warm: Allocation | None = None,
) -> Allocation:
    """The optimum over ``pages``: the pages at ``index`` (None: all) of ``n``, under the
    problem's budget and host caps; ``unvalued`` marks the pages left out (they take what
    the caps leave, see ``_finish``). ``hint``: an allocation of the same pages and hosts
    whose multipliers start the searches (a capped host's own level does not depend on the
    budget, so a second solve at another budget finds most of them at once). ``warm``: an
    earlier plan's allocation (other rates, other pages; its hosts numbered as these where
    its arrays have their shape): only where the searches start, nothing of it is trusted,
    so the answer is the same as without it (to the search's tolerance)."""
    budget = problem.budget
    hosts, caps = problem.hosts, problem.caps
    if pages.size == 0:
        return _finish(name, problem, np.zeros(n), budget, 0.0, None, None, unvalued)
    first = None
    guide = hint if hint is not None else warm
    if guide is not None and 0.0 < guide.multiplier < math.inf:
        first = np.array([math.log(guide.multiplier)])
    if hosts is None or caps is None:
        u, fv, _ = _solve_groups(pages, None, np.array([budget]), start=first)
        return _finish(name, problem, _spread(fv, index, n), 0.0, _exp(u[0]), None, None, unvalued)
    n_hosts = caps.size
    host_v = _take(hosts, index)
    has_pages = np.bincount(host_v, minlength=n_hosts) > 0
    closed = caps <= 0.0
    host_u = np.where(closed, np.inf, np.nan)
    # (a pass over the pages only when a host is closed)
    rows_open = np.flatnonzero(~closed[host_v]) if closed[has_pages].any() else None
    host_open = _take(host_v, rows_open)
    room = float(caps[has_pages & ~closed].sum())
    if room <= budget:
        # every host with pages can be filled: each takes its cap, the rest is unplaced
        capped = has_pages & ~closed
        u_global, leftover = -np.inf, budget - room
        guided = _guided_levels(guide, caps)
        start = np.full(n_hosts, np.nan) if guided is None else guided
        lo_h = None
        f_v = np.zeros(pages.size)
    else:
        known = np.zeros(n_hosts, dtype=bool)
        before = None if hint is None or budget < hint.budget else hint.capped_hosts
        if before is not None and before.shape == known.shape:
            known = before & ~closed  # at a larger budget μ is lower: they stay at their caps
        u_global, f_open, capped, start = _solve_global(
            pages if rows_open is None else pages.take(rows_open),
            host_open,
            caps,
            budget,
            first,
            known,
            probe=hint is None and warm is not None,
            levels=_guided_levels(guide, caps),
        )
        leftover = 0.0
        f_v = _spread(f_open, rows_open, pages.size)
        lo_h = np.full(n_hosts, u_global)
    if capped.any():
        # (every capped host's page gets its rate here, 0 past its drop-out)
        host_u[capped], f_rows, rows = _solve_hosts(pages, host_v, caps, capped, lo_h, start)
        f_v[rows] = f_rows
    capped |= closed
    f = _spread(f_v, index, n)
    mu = _exp(u_global)
    with np.errstate(over="ignore"):  # a host capped near 0 has μ_h = ∞
        levels = np.where(capped, np.exp(host_u), mu)
    return _finish(name, problem, f, leftover, mu, levels, capped, unvalued)


def _guided_levels(guide: Allocation | None, caps: Float) -> Float | None:
    """ln μ_h of the hosts ``guide`` (a hint or warm split, hosts numbered alike) had at
    their caps, NaN for the others; None without one."""
    if guide is None or guide.host_multipliers is None or guide.capped_hosts is None:
        return None
    levels = np.asarray(guide.host_multipliers)
    if levels.shape != caps.shape:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(guide.capped_hosts & (levels > 0.0), np.log(levels), np.nan)


def _solve_global(
    pages: Pages,
    host: Index,
    caps: Float,
    budget: float,
    first: Float | None,
    known: Mask,
    *,
    probe: bool = False,
    levels: Float | None = None,
) -> tuple[float, Float, Mask, Float]:
    """The global multiplier under the caps: (u, f per page at u, the hosts over their caps,
    a first guess of each one's own level). The rates of the hosts over their caps are
    left as they fall (the caller solves those hosts' own levels and overwrites them).

    A host over its cap at a level at or above the root stays over it down to the root, so
    its pages need not be evaluated again: it takes its cap. ``known`` are such hosts (a
    hint's, at a smaller budget); otherwise the pages are first evaluated at the uncapped
    root (``Pages.start``), where Σf is the budget, so that the caps' sum falls short of it
    and the hosts over their caps there are settled. The rest is solved without them, from
    the root of the hosts' local models. ``probe``: ``first`` is an earlier plan's level,
    not known to be above the root: the pages are first evaluated a little above it instead
    (at the uncapped root if the root is not below that after all). ``levels``: a first
    guess of a capped host's own level where finite (the hosts left without one get
    theirs from a Newton step), returned as it is."""
    n_hosts = caps.size
    guessed = np.zeros(n_hosts, dtype=bool) if levels is None else np.isfinite(levels)
    f = np.zeros(pages.size)
    start_h = np.full(n_hosts, np.nan)
    hi = first
    seen = None
    settled = known
    spare = None
    guess = None if first is not None or known.any() else pages.start(budget)
    if probe and first is not None:
        guess, hi, first = (float(first[0]) + _PROBE, math.nan), None, None
    if guess is not None:
        u0 = np.array([guess[0]])
        work = _Work(pages)
        work.evaluate(u0)
        total, _, _, over, model = _capped_totals(work, (host, caps, known), guess[0], budget)
        if total[0] < budget and over.any():
            settled, hi = over, u0
            f = work.f
            start_h = _host_start(guess[0], host, f, work.df, caps, over & ~guessed)
            # the settled pages' rates are not read again (the caller solves their hosts):
            # the rest is solved in these buffers, and its rates moved to their places
            spare = (work.f, work.df)
            if math.isfinite(model):
                first = np.array([model])
                # the rest's error there: the secant through it takes the step after
                held = float(caps[over].sum())
                seen = (guess[0], math.log((total[0] - held) / (budget - held)))
        elif probe and math.isfinite(model):
            # the root is above the earlier level after all: on from the local models' root
            first, seen = np.array([model]), (guess[0], math.log(total[0] / budget))
        else:
            first = u0
    rest = None if not settled.any() else np.flatnonzero(~settled[host])
    if rest is not None and rest.size == 0:  # (cannot be: the caps would take it all)
        settled, rest, hi, seen = np.zeros(n_hosts, dtype=bool), None, None, None
    capped = np.zeros(n_hosts, dtype=bool)
    host_rest = _take(host, rest)
    u, f_rest, df_rest = _solve_groups(
        pages if rest is None else pages.take(rest),
        None,
        np.array([budget - float(caps[settled].sum())]),
        hi=hi,
        start=first,
        caps_by=(host_rest, caps, capped),
        seen=seen,
        buffers=spare,
    )
    # the capped hosts' own μ_h > μ: a Newton step off the global solution, or off the
    # level at which a settled host was last evaluated (its pages' rates are those there)
    later = _host_start(float(u[0]), host_rest, f_rest, df_rest, caps, capped & ~guessed)
    if rest is None:
        f = f_rest
    else:
        _expand(f, rest, f_rest)  # (the rates only: the slopes served ``later``)
    start_h = np.where(capped, later, start_h)
    if levels is not None:
        start_h = np.where(guessed, levels, start_h)
    return float(u[0]), f, capped | settled, start_h


def compact(a: NDArray[_T], index: Index) -> NDArray[_T]:
    """a[index] moved to a's first index.size entries, in place (``index`` increasing, so
    index[i] ≥ i), block by block from the first, so that no entry is overwritten before it
    has been read; returns them."""
    for start in range(0, index.size, _CHUNK):
        block = slice(start, min(start + _CHUNK, index.size))
        a[block] = a[index[block]]
    return a[: index.size]


def _expand(out: Float, index: Index, values: Float) -> None:
    """out[index] = values, where ``values`` may be ``out``'s first index.size entries
    (``index`` increasing, so index[i] ≥ i): block by block from the last, so that no
    value is overwritten before it has moved (numpy copies a block whose source and
    destination overlap)."""
    for start in reversed(range(0, index.size, _CHUNK)):
        block = slice(start, start + _CHUNK)
        out[index[block]] = values[block]


def _host_start(u: float, host: Index, f: Float, df: Float, caps: Float, capped: Mask) -> Float:
    """A Newton step from ``u`` towards each capped host's own level, from its pages' sum
    and slope to step along at u (NaN elsewhere)."""
    if not capped.any():
        return np.full(caps.size, np.nan)
    rows = np.flatnonzero(capped[host])  # (the sums of the others are not needed)
    host, f, df = host[rows], f[rows], df[rows]
    demand = group_sum(host, f, caps.size)
    slope = _step_sums(host, f, df, caps.size)
    with np.errstate(divide="ignore", invalid="ignore"):
        start = u - (np.log(demand) - np.log(caps)) * demand / slope
    return np.where(capped, start, np.nan)


def _solve_hosts(
    pages: Pages,
    host: Index,
    caps: Float,
    capped: Mask,
    lo: Float | None,
    start: Float,
) -> tuple[Float, Float, Index]:
    """Every capped host's own level, all at once: (u per capped host, f of their pages,
    those pages' rows). The hosts are numbered densely, so a round costs what their pages
    do, not what all hosts do."""
    ids = np.flatnonzero(capped)
    dense = np.full(caps.size, -1, np.intp)
    dense[ids] = np.arange(ids.size)
    rows = np.flatnonzero(capped[host])
    u, f, _ = _solve_groups(
        pages.take(rows),
        dense[host[rows]],
        caps[ids],
        lo=None if lo is None else lo[ids],
        start=start[ids],
        owned=True,
    )
    return u, f, rows


def _exp(u: float) -> float:
    """e^u, ∞ past the float range."""
    return math.exp(u) if u < 709.0 else math.inf


def _take(a: NDArray[_T], index: Index | None) -> NDArray[_T]:
    return a if index is None else a[index]


def _spread(values: Float, index: Index | None, pages: int) -> Float:
    """``values`` of the pages at ``index`` placed among ``pages`` zeros (None: all pages)."""
    if index is None:
        return values
    out = np.zeros(pages)
    out[index] = values
    return out
