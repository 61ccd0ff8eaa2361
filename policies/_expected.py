"""Splitting the budget when the rates are only known roughly: maximise the expected value.

The estimator gives each page a log-normal posterior, ln λ ~ N(θ, σ²). Rather than planning
for the point estimate (plug-in), :func:`solve_expected` maximises Σ wᵢ·E[V(λᵢ, fᵢ)] under
Σ fᵢ = B and the host caps, V being F̄ (policy ``optimal``) or −Ā (``optimal-age``). The
expectation is a Gauss–Hermite sum over the posterior; each term is concave in f, so their sum
is, and the Lagrange conditions are those of the plug-in problem: wᵢ·∂E[V]/∂f = μ for pages
of hosts below their cap, μ_h > μ for a host at its cap.

Both marginal values scale: ∂F̄/∂f = g(λ/f)/λ and −∂Ā/∂f = q(λ/f)/λ² (:mod:`policies._model`),
so with u = θ − ln f and λ = e^(θ + σz)::

    w·E[∂V/∂f] = w·e^(−pθ)·M_σ(u),   M_σ(u) = E_z[e^(−pσz)·m(e^(u + σz))]

(p = 1, m = g for freshness; p = 2, m = q for age) and the condition is M_σ(u) = μ·e^(pθ)/w:
one increasing function of u per σ. It is tabulated once (``_Table``) on a grid of σ and
inverted by interpolation, so a multiplier costs one pass over the pages. As σ → 0 this is the
plug-in optimum; a page known only roughly gets a hedge between what its possible rates would
each be given. For freshness a page is dropped when μ ≥ w·E[1/λ] = w·e^(−θ + σ²/2): an
uncertain page is dropped later than its point estimate would be, since it may be slow.

The multipliers are found by the plug-in solver's search (:func:`policies._solve.solve_pages`:
the global one, then every capped host's at once), over :class:`ExpectedPages`, which evaluate
the table for a block of pages at a time with its slope; the first guess of the global one comes
from the pages compressed into cells of σ and s (a few tens of thousands for ten million pages),
so that a solve takes a few passes over the pages rather than dozens.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cache
from typing import cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._model import freshness as _freshness
from ._model import g as _g
from ._model import q as _q
from ._solve import (
    _CHUNK,
    Allocation,
    Pages,
    _solve_groups,
    _Work,
    check_hosts,
    compact,
    solve_pages,
)
from ._table import Scratch

__all__ = ["EXPECTED_POLICIES", "expected_value", "solve_expected"]

Float = NDArray[np.float64]
Index = NDArray[np.intp]
#: a page's lower σ row (≤ 80): 4 bytes a page where an index takes 8, in every copy of
#: the pages the solver makes and every pass over them
_ROW = np.int32
Rows = NDArray[np.int32]
Mask = NDArray[np.bool_]

#: the policies with an expected-value form, and their objective's power p
EXPECTED_POLICIES = {"optimal": 1, "optimal-age": 2}

_NODES = 40  # Gauss–Hermite nodes: exact for polynomials of degree 79 in z
_SIGMA_MAX = 4.0  # wider posteriors are treated as this wide (a factor e⁴ ≈ 55 either way)
_SIGMA_STEP = 0.05
_U = np.linspace(-60.0, 60.0, 12001)  # ln(e^θ/f)


def _nodes() -> tuple[Float, Float]:
    """Standard-normal nodes z_k and weights ω_k (Σω = 1)."""
    x, w = np.polynomial.hermite.hermgauss(_NODES)
    return math.sqrt(2.0) * x, w / math.sqrt(math.pi)


_LOG_Y = (-130.0, 100.0, 0.02)  # the age inverse's grid of ln y: start, stop, step
# Freshness: M_σ rises to e^(σ²/2), and u runs off to ∞ as ln y nears σ²/2; its grid is in
# v = −ln(σ²/2 − ln y) so that the approach to the cut-off is resolved.
_V = (-math.log(_SIGMA_MAX**2 / 2 + 130.0), 40.0, 0.005)


class _Table:
    """u(σ, c) solving ln M_σ(u) = ln y on a grid of σ (rows: 0, step, …, _SIGMA_MAX) and
    c = ln y (age) or c = −ln(σ²/2 − ln y) (freshness) in columns; between rows, u is
    interpolated linearly in σ, and within a row linearly in c.

    A row costs a Gauss–Hermite sum at 12,001 × 40 points; rows are built when a solve first
    needs them (a plan's posteriors span a few dozen of the 81), so the first plan pays only
    for those, not for the whole table."""

    def __init__(self, power: int) -> None:
        self.power = power
        self.sigmas = np.arange(0.0, _SIGMA_MAX + _SIGMA_STEP / 2, _SIGMA_STEP)
        self.c0, self.c1, self.dc = _LOG_Y if power == 2 else _V
        self.cols = np.arange(self.c0, self.c1 + self.dc / 2, self.dc)
        self.u = np.full((self.sigmas.size, self.cols.size), np.nan)
        # u[r, k + 1] − u[r, k] (0 in the last column): the kernel reads a cell's value and
        # slope with one index
        self.step = np.zeros_like(self.u)
        self.built = np.zeros(self.sigmas.size, dtype=bool)
        #: σ²/2 of each row: freshness's cut-off in ln y
        self.tops = 0.5 * (np.arange(self.sigmas.size) * _SIGMA_STEP) ** 2
        self._lock = threading.Lock()

    def ensure(self, rows: Index) -> None:
        """Build the rows among ``rows`` not built yet."""
        if self.built[rows].all():
            return
        with self._lock:  # plans run in worker threads; a row is built once
            for r in rows:
                if not self.built[r]:
                    self.u[r] = _row_values(self.power, float(self.sigmas[r]), self.cols)
                    self.step[r, :-1] = np.diff(self.u[r])
                    self.built[r] = True

    def position(self, sigma: Float) -> tuple[Rows, Float]:
        """Each σ's lower row and its weight towards the next one; builds the rows used."""
        j = np.empty(sigma.size, _ROW)
        a = np.empty(sigma.size)
        for start in range(0, sigma.size, _CHUNK):  # in blocks: no page-sized temporaries
            b = slice(start, start + _CHUNK)
            s = np.clip(sigma[b], 0.0, _SIGMA_MAX)
            s /= _SIGMA_STEP
            np.minimum(s.astype(np.intp), self.u.shape[0] - 2, out=j[b])
            np.subtract(s, j[b], out=a[b])
        if j.size:  # the rows between the lowest and the highest in use
            self.ensure(np.arange(int(j.min()), int(j.max()) + 2))
        return j, a

    def _column(self, rows: Rows, log_y: Float) -> Float:
        if self.power == 2:
            return log_y
        top = 0.5 * (rows * _SIGMA_STEP) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(-np.log(top - log_y), dtype=np.float64)

    def _row(self, rows: Rows, log_y: Float) -> Float:
        c = self._column(rows, log_y)
        c0, c1, dc = self.c0, self.c1, self.dc
        pos = np.clip(np.nan_to_num((c - c0) / dc, nan=0.0), 0.0, self.u.shape[1] - 1.000001)
        k = pos.astype(np.intp)
        b = pos - k
        out = (1.0 - b) * self.u[rows, k] + b * self.u[rows, k + 1]
        # beyond the grid: the power laws of M at its ends (m(x) ≈ x²/2 or x³/3 for small
        # x, q(x) ≈ x²/2 for large x; near the cut-off u ≈ v)
        low = c < c0
        if self.power == 1:
            out = np.where(
                low, out + (log_y - (0.5 * (rows * _SIGMA_STEP) ** 2 - math.exp(-c0))) / 2.0, out
            )
            out = np.where(c > c1, out + (c - c1), out)
            out = np.where(np.isnan(c), np.inf, out)  # ln y ≥ σ²/2: not worth a fetch
        else:
            out = np.where(low, out + (c - c0) / 3.0, out)
            out = np.where(c > c1, out + (c - c1) / 2.0, out)
        return np.asarray(out, dtype=np.float64)

    def solve(self, sigma: Float, log_y: Float) -> Float:
        """u per page, interpolated between the two nearest σ rows; +∞ where the page is not
        worth a fetch. The definition, evaluated plainly: the solver's pages
        (:class:`ExpectedPages`) compute the same in blocks, with the slope."""
        j, a = self.position(sigma)
        lo, hi = self._row(j, log_y), self._row(j + 1, log_y)
        with np.errstate(invalid="ignore"):
            out = (1.0 - a) * lo + a * hi
        return np.asarray(np.where(np.isinf(lo) | np.isinf(hi), np.inf, out), dtype=np.float64)

    def interpolate(
        self,
        c: Float,
        base: Index,
        log_y: Float,
        gap: Float | None,
        scratch: Scratch,
        out: tuple[int, int],
    ) -> tuple[Float, Float]:
        """The rows whose first entry's flat index is ``base`` at columns ``c`` (finite):
        u and du/d ln y into ``scratch``'s float buffers ``out`` (``gap`` =
        σ²/2 − ln y for freshness, whose column is −ln gap; None for age)."""
        c0, c1 = self.c0, self.c1
        n = c.size
        u, step = scratch.floats[out[0]][:n], scratch.floats[out[1]][:n]
        k = scratch.ints[1][:n]
        low, high = bool(c.min() < c0), bool(c.max() > c1)
        pos, whole = scratch.floats[12][:n], scratch.floats[9][:n]
        np.subtract(c, c0, out=pos)
        pos *= 1.0 / self.dc
        if low or high:  # (inside the grid the column is within it: c0 ≤ c ≤ c1)
            np.clip(pos, 0.0, self.u.shape[1] - 1.000001, out=pos)
        np.floor(pos, out=whole)
        pos -= whole
        np.copyto(k, whole, casting="unsafe")
        k += base
        np.take(self.step, k, out=step, mode="clip")  # (with out=, 'raise' buffers)
        np.take(self.u, k, out=u, mode="clip")
        pos *= step
        u += pos
        step *= 1.0 / self.dc  # du/dc inside the grid
        if gap is not None:
            step /= gap  # dc/d ln y = 1/gap
        if low:
            off = c < c0
            if gap is None:
                u[off] += (c[off] - c0) / 3.0
                step[off] = 1.0 / 3.0
            else:
                rows = base[off] // self.u.shape[1]
                u[off] += (log_y[off] - (self.tops[rows] - math.exp(-c0))) / 2.0
                step[off] = 0.5
        if high:
            off = c > c1
            if gap is None:
                u[off] += (c[off] - c1) / 2.0
                step[off] = 0.5
            else:
                u[off] += c[off] - c1
                step[off] = 1.0 / gap[off]
        return u, step


@cache
def _table(power: int) -> _Table:
    return _Table(power)


def _row_values(power: int, s: float, cols: Float) -> Float:
    """One row of the table: u at the columns ``cols`` for posterior sd ``s``."""
    z, w = _nodes()
    m = _g if power == 1 else _q
    x = np.exp(np.clip(_U[:, None] + s * z[None, :], -700.0, 700.0))
    terms = w[None, :] * np.exp(-power * s * z)[None, :] * m(x)
    log_m = np.log(np.maximum(terms.sum(axis=1), 1e-300))
    if power == 1:
        gap = np.maximum(0.5 * s * s - log_m, 1e-300)
        key = np.maximum.accumulate(-np.log(gap))
    else:
        key = np.maximum.accumulate(log_m)
    u = np.interp(cols, key, _U)
    slope_low = 2.0 if power == 1 else 3.0
    if power == 1:  # below: ln y = top − e^(−c); u linear in ln y with slope 1/2
        u = np.where(
            cols < key[0],
            _U[0] + ((0.5 * s * s - np.exp(-cols)) - (0.5 * s * s - np.exp(-key[0]))) / slope_low,
            u,
        )
        u = np.where(cols > key[-1], _U[-1] + (cols - key[-1]), u)
    else:
        u = np.where(cols < key[0], _U[0] + (cols - key[0]) / slope_low, u)
        u = np.where(cols > key[-1], _U[-1] + (cols - key[-1]) / 2.0, u)
    return np.asarray(u, dtype=np.float64)


_TINY = 1e-300  # the gap to the cut-off of a page past it (it takes nothing)
_CELL_ROWS_A = 4  # cells of the compressed stand-in: σ-weight bins per row …
_CELL_S = 512  # … and bins of ln y − ln μ
_CELLS_FROM = 1 << 16  # pages from which a first guess is worth a compressed stand-in


class ExpectedPages(Pages):
    """The expected-value optimum's pages: f = e^(θ − u) with u from the table at
    ln y = ln μ + s, s = p·θ − ln w (θ = ln λ's posterior mean), the row pair and weight
    from σ."""

    def __init__(
        self,
        table: _Table,
        theta: Float,
        s: Float,
        row: Rows,
        weight: Float,
        *,
        compressed: bool = False,
    ) -> None:
        self.table, self.theta, self.s, self.row, self.weight = table, theta, s, row, weight
        self.compressed = compressed
        self._total: float | None = None
        self._compressed: ExpectedPages | None = None

    @property
    def size(self) -> int:
        return self.theta.size

    def take(self, index: Index) -> ExpectedPages:
        theta = self.theta[index]
        return ExpectedPages(
            self.table,
            theta,
            theta if self.s is self.theta else self.s[index],  # (freshness, weights 1)
            self.row[index],
            self.weight[index],
            compressed=self.compressed,
        )

    def compact(self, index: Index) -> ExpectedPages:
        theta = compact(self.theta, index)
        return ExpectedPages(
            self.table,
            theta,
            theta if self.s is self.theta else compact(self.s, index),
            compact(self.row, index),
            compact(self.weight, index),
            compressed=self.compressed,
        )

    def level(self, u: Float) -> object:
        return u, Scratch(min(self.size, _CHUNK), floats=13)

    def rates(self, block: slice, level: object, group: Index | None, f: Float, df: Float) -> None:
        u, scratch = cast(tuple[Float, Scratch], level)
        table = self.table
        n = f.size
        y, gap_lo, gap_hi, c_lo, c_hi = (scratch.floats[k][:n] for k in range(5))
        if group is None:
            log_y = np.add(self.s[block], u[0], out=y)
        else:
            log_y = np.take(u, group, out=y, mode="clip")
            log_y += self.s[block]
        rows = self.row[block]
        base = np.multiply(rows, table.u.shape[1], out=scratch.ints[0][:n])
        live: Float | None = None
        lo_gap: Float | None = None  # (age: none)
        hi_gap: Float | None = None
        if table.power == 1:
            np.take(table.tops, rows, out=gap_lo, mode="clip")
            gap_lo -= log_y
            np.take(table.tops[1:], rows, out=gap_hi, mode="clip")  # (the next row)
            gap_hi -= log_y
            # past the lower row's cut-off (gap_lo ≤ 0, so gap_hi ≤ its step < 1) a page takes
            # nothing, so any column will do for it, one inside the grid is cheapest: gap 1,
            # as the maximum with a 0/1 factor (no masked copies)
            dead = np.less_equal(gap_lo, 0.0, out=scratch.floats[10][:n], casting="unsafe")
            live = np.subtract(1.0, dead, out=scratch.floats[11][:n])
            np.maximum(gap_lo, dead, out=gap_lo)
            np.maximum(gap_hi, dead, out=gap_hi)
            np.maximum(gap_lo, _TINY, out=gap_lo)
            np.log(gap_lo, out=c_lo)
            np.negative(c_lo, out=c_lo)
            np.log(gap_hi, out=c_hi)
            np.negative(c_hi, out=c_hi)
            lo_gap, hi_gap = gap_lo, gap_hi
        else:
            c_lo = c_hi = log_y
        u_lo, du_lo = table.interpolate(c_lo, base, log_y, lo_gap, scratch, (5, 6))
        base += table.u.shape[1]
        u_hi, du_hi = table.interpolate(c_hi, base, log_y, hi_gap, scratch, (7, 8))
        a = self.weight[block]
        u_hi -= u_lo
        u_hi *= a
        u_lo += u_hi
        du_hi -= du_lo
        du_hi *= a
        du_lo += du_hi
        np.subtract(self.theta[block], u_lo, out=u_lo)
        np.minimum(u_lo, 700.0, out=u_lo)
        np.exp(u_lo, out=f)
        if live is not None:
            f *= live
        np.multiply(f, du_lo, out=df)
        np.negative(df, out=df)

    def alive(self, u: Float, group: Index | None) -> Mask | None:
        if self.table.power != 1:
            return None
        tops = self.table.tops

        def dead(block: slice, level: Float) -> Mask:
            # past the lower row's cut-off (ln y ≥ σ²/2 of it) a page takes nothing (rates)
            return np.asarray(self.s[block] + level >= np.take(tops, self.row[block]))

        return self._alive(u, group, dead)

    def bounds(self, block: slice) -> Float:
        """e^(θ − (s + ln 2 − [p=1]σ²)/2 + 1) per page of ``block``: M_σ(u) ≤
        e^(2u)·E[e^((2−p)σz)]/2 (g(x), q(x) ≤ x²/2), so u ≥ (ln y + ln 2 − [p=1]σ²/2)/2 and
        f ≤ that·e^(−ln μ/2); σ² as the rows interpolate it, and e for the table's error."""
        exponent = self.s[block] + math.log(2.0)
        exponent *= -0.5
        exponent += self.theta[block]
        exponent += 1.0
        if self.table.power == 1:
            rows = self.row[block]
            lo = np.take(self.table.tops, rows)
            hi = np.take(self.table.tops, rows + 1)
            hi -= lo
            hi *= self.weight[block]
            hi += lo
            hi *= 0.5
            exponent += hi
        np.minimum(exponent, 700.0, out=exponent)
        return np.exp(exponent, out=exponent)

    def mass(self, group: Index | None, groups: int) -> Float:
        if group is None:
            return np.array([self._bound()])
        total = np.zeros(groups)
        for start in range(0, self.size, _CHUNK):
            b = slice(start, start + _CHUNK)
            total += np.bincount(group[b], self.bounds(b), minlength=groups)
        return total

    def start(self, budget: float) -> tuple[float, float] | None:
        if self.compressed or self.size < _CELLS_FROM:
            return None
        cells = self._cells()
        u, _, _ = _solve_groups(cells, None, np.array([budget]))
        if not np.isfinite(u[0]):
            return None
        # the slope of ln Σf over a step, not at the point: near its cut-off a page's rate
        # falls off a cliff whose local slope would make the first step vanish
        h = 1e-3
        work = _Work(cells)
        (lower,), _ = work.evaluate(u - h)
        (upper,), _ = work.evaluate(u + h)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = (math.log(upper) - math.log(lower)) / (2.0 * h) if upper > 0.0 else math.nan
        return float(u[0]), slope

    def _bound(self) -> float:
        """Σ of :meth:`bounds`, kept (block by block, in the order of the pages)."""
        if self._total is None:
            total = 0.0
            for start in range(0, self.size, _CHUNK):
                total += float(self.bounds(slice(start, start + _CHUNK)).sum())
            self._total = total
        return self._total

    def _cells(self) -> ExpectedPages:
        """The compressed stand-in, built when a first guess asks for it (a warm solve and
        the solver's subsets of pages never do), kept: cells of one row, a quarter of the σ
        weight and 1/512 of the range of s, each at its e^θ-weighted mean s and weight with
        the cell's Σe^θ, which cancels the first-order error."""
        if self._compressed is not None:
            return self._compressed
        top = float(self.theta.max())
        lo, hi = float(self.s.min()), float(self.s.max())
        scale = _CELL_S / ((hi - lo) or 1.0)
        per_row = _CELL_ROWS_A * _CELL_S
        n_cells = self.table.u.shape[0] * per_row
        mass, moment_s, moment_a = np.zeros(n_cells), np.zeros(n_cells), np.zeros(n_cells)
        for start in range(0, self.size, _CHUNK):  # in blocks: no page-sized temporaries
            b = slice(start, start + _CHUNK)
            s, a = self.s[b], self.weight[b]
            cell = np.minimum(((s - lo) * scale).astype(np.intp), _CELL_S - 1)
            cell += np.minimum((a * _CELL_ROWS_A).astype(np.intp), _CELL_ROWS_A - 1) * _CELL_S
            cell += self.row[b] * per_row
            e = np.exp(self.theta[b] - top)
            mass += np.bincount(cell, e, minlength=n_cells)
            moment_s += np.bincount(cell, e * s, minlength=n_cells)
            moment_a += np.bincount(cell, e * a, minlength=n_cells)
        used = np.flatnonzero(mass > 0.0)
        m = mass[used]
        self._compressed = ExpectedPages(
            self.table,
            np.log(m) + top,
            moment_s[used] / m,
            (used // per_row).astype(_ROW),
            moment_a[used] / m,
            compressed=True,
        )
        return self._compressed


def solve_expected(
    name: str,
    log_rate: ArrayLike,
    log_sd: ArrayLike,
    budget: float,
    *,
    weights: ArrayLike | None = None,
    hosts: ArrayLike | None = None,
    host_caps: ArrayLike | None = None,
    hint: Allocation | None = None,
    warm: Allocation | None = None,
) -> Allocation:
    """Maximise Σ wᵢ·E[V(λᵢ, fᵢ)] for ln λᵢ ~ N(``log_rate``ᵢ, ``log_sd``ᵢ²) (ln of changes
    per second; sd in natural-log units), V = F̄ for ``name`` "optimal", −Ā for
    "optimal-age"; Σf = ``budget`` fetches per second, at most ``host_caps[h]`` per host.
    Budget the caps leave is spread over the weightless pages with room, as by
    :func:`refresher.policies.solve`, and what is left is ``unplaced``. ``hint``: an
    allocation of the same pages at another budget, whose multipliers start the search
    (the answer is the same without it, to the search's tolerance). ``warm``: an earlier
    plan's allocation (other rates or pages, hosts numbered alike), whose multipliers
    start the searches; likewise the answer does not depend on it."""
    pages, index, problem, unvalued = expected_pages(
        name, log_rate, log_sd, budget, weights=weights, hosts=hosts, host_caps=host_caps
    )
    return solve_pages(name, pages, problem, problem.pages, index, unvalued, hint, warm)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Split:
    budget: float
    pages: int
    hosts: Index | None
    caps: Float | None


def expected_pages(
    name: str,
    log_rate: ArrayLike,
    log_sd: ArrayLike,
    budget: float,
    *,
    weights: ArrayLike | None = None,
    hosts: ArrayLike | None = None,
    host_caps: ArrayLike | None = None,
) -> tuple[ExpectedPages, Index | None, _Split, Mask | None]:
    """:func:`solve_expected`'s arguments checked: the valued pages (weight > 0) as the
    solver's pages, their index (None: all), the budget and caps, the pages left out."""
    if name not in EXPECTED_POLICIES:
        raise ValueError(f"no expected-value form of {name!r}: use one of {EXPECTED_POLICIES}")
    theta = np.ascontiguousarray(log_rate, dtype=np.float64)
    n = theta.size
    sigma = np.ascontiguousarray(np.broadcast_to(np.asarray(log_sd, dtype=np.float64), (n,)))
    if theta.ndim != 1 or not (_finite(theta) and _finite(sigma) and (n == 0 or sigma.min() >= 0)):
        raise ValueError("log_rate and log_sd must be finite (1-D, one per page), log_sd ≥ 0")
    b = float(budget)
    if not (math.isfinite(b) and b >= 0.0):
        raise ValueError(f"budget must be finite and ≥ 0 fetches per second, got {budget!r}")
    h, c = check_hosts(hosts, host_caps, n)
    index: Index | None = None
    unvalued: Mask | None = None
    w: Float | None = None
    if weights is not None:
        w = np.broadcast_to(np.asarray(weights, np.float64), (n,))
        if not (_finite(w) and (n == 0 or w.min() >= 0.0)):
            raise ValueError("weights must be finite and ≥ 0")
        valued = w > 0.0
        if not valued.all():
            index, unvalued = np.flatnonzero(valued), ~valued
            theta, sigma, w = theta[index], sigma[index], w[index]
    pages = page_set(name, theta, sigma, w)
    return pages, index, _Split(budget=b, pages=n, hosts=h, caps=c), unvalued


def page_set(name: str, theta: Float, sigma: Float, weights: Float | None) -> ExpectedPages:
    """The solver's pages for ln λ ~ N(``theta``, ``sigma``²) of weights > 0 (None: all
    1), checked by the caller."""
    table = _table(EXPECTED_POLICIES[name])
    s = theta if table.power == 1 else theta * table.power
    if weights is not None:
        s = s - np.log(weights)
    row, weight = table.position(sigma)
    return ExpectedPages(table, theta, s, row, weight)


def _finite(a: Float) -> bool:
    """All of ``a`` finite, without a temporary array."""
    return a.size == 0 or bool(np.isfinite(a.min()) and np.isfinite(a.max()))


def expected_value(name: str, log_rate: ArrayLike, log_sd: ArrayLike, f: ArrayLike) -> Float:
    """E[F̄(λ, f)] (``name`` "freshness") or E[Ā(λ, f)] in seconds ("age") per page, for
    ln λ ~ N(log_rate, log_sd²): the posterior mean, not the value at the point estimate
    (which overstates the freshness of a page that changed before every fetch)."""
    from ._model import age as _age

    value = {"freshness": _freshness, "age": _age}[name]
    z, w = _nodes()
    theta = np.asarray(log_rate, dtype=np.float64)[..., None]
    s = np.asarray(log_sd, dtype=np.float64)[..., None]
    lam = np.exp(np.clip(theta + s * z, -700.0, 700.0))
    out = (w * value(lam, np.asarray(f, dtype=np.float64)[..., None])).sum(axis=-1)
    return np.asarray(out, dtype=np.float64)
