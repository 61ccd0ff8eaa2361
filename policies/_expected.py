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

The multipliers are found by bisection on ln μ (the global one, then every capped host's at
once); the last relative error in Σf is removed by rescaling the uncapped pages.
"""

from __future__ import annotations

import math
import threading
from functools import cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._model import freshness as _freshness
from ._model import g as _g
from ._model import q as _q
from ._solve import Allocation, group_sum

__all__ = ["EXPECTED_POLICIES", "expected_value", "solve_expected"]

Float = NDArray[np.float64]
Index = NDArray[np.intp]

#: the policies with an expected-value form, and their objective's power p
EXPECTED_POLICIES = {"optimal": 1, "optimal-age": 2}

_NODES = 40  # Gauss–Hermite nodes: exact for polynomials of degree 79 in z
_SIGMA_MAX = 4.0  # wider posteriors are treated as this wide (a factor e⁴ ≈ 55 either way)
_SIGMA_STEP = 0.05
_U = np.linspace(-60.0, 60.0, 12001)  # ln(e^θ/f)
_BISECTIONS = 80


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
    c = ln y (age) or c = −ln(σ²/2 − ln y) (freshness) in columns.

    A row costs a Gauss–Hermite sum at 12,001 × 40 points; rows are built when a solve first
    needs them (a plan's posteriors span a few dozen of the 81), so the first plan pays only
    for those, not for the whole table."""

    def __init__(self, power: int) -> None:
        self.power = power
        self.sigmas = np.arange(0.0, _SIGMA_MAX + _SIGMA_STEP / 2, _SIGMA_STEP)
        c0, c1, dc = _LOG_Y if power == 2 else _V
        self.cols = np.arange(c0, c1 + dc / 2, dc)
        self.u = np.full((self.sigmas.size, self.cols.size), np.nan)
        self.built = np.zeros(self.sigmas.size, dtype=bool)
        self._lock = threading.Lock()

    def ensure(self, rows: Index) -> None:
        """Build the rows among ``rows`` not built yet."""
        if self.built[rows].all():
            return
        with self._lock:  # plans run in worker threads; a row is built once
            for r in rows:
                if not self.built[r]:
                    self.u[r] = _row_values(self.power, float(self.sigmas[r]), self.cols)
                    self.built[r] = True

    def _column(self, rows: Index, log_y: Float) -> Float:
        if self.power == 2:
            return log_y
        top = 0.5 * (rows * _SIGMA_STEP) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(-np.log(top - log_y), dtype=np.float64)

    def _row(self, rows: Index, log_y: Float) -> Float:
        c = self._column(rows, log_y)
        c0, c1, dc = _LOG_Y if self.power == 2 else _V
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
        worth a fetch."""
        s = np.clip(sigma, 0.0, _SIGMA_MAX) / _SIGMA_STEP
        j = np.minimum(s.astype(np.intp), self.u.shape[0] - 2)
        if j.size:  # the rows between the lowest and the highest in use
            self.ensure(np.arange(int(j.min()), int(j.max()) + 2))
        a = s - j
        lo, hi = self._row(j, log_y), self._row(j + 1, log_y)
        with np.errstate(invalid="ignore"):
            out = (1.0 - a) * lo + a * hi
        return np.asarray(np.where(np.isinf(lo) | np.isinf(hi), np.inf, out), dtype=np.float64)


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


def _rates(table: _Table, theta: Float, sigma: Float, log_w: Float, log_mu: Float) -> Float:
    """f per page at multiplier(s) e^log_mu (scalar or per page)."""
    u = table.solve(sigma, log_mu + table.power * theta - log_w)
    with np.errstate(over="ignore"):
        return np.where(np.isfinite(u), np.exp(np.minimum(theta - u, 700.0)), 0.0)


def _bisect(
    demand: object, target: Float, lo: Float, hi: Float
) -> Float:  # demand(log_mu) -> Σf per group, decreasing
    """ln μ per group with demand(ln μ) = target, inside the bracket [lo, hi].

    Regula falsi on ln demand − ln target (Illinois: an end kept twice running has its
    error halved), bisecting where an end's demand is 0 or the bracket did not halve in two
    steps (Σf read off the table has steps far below its scale). It stops at a relative error
    of 1e-10 in Σf or a bracket of 1e-7 in ln μ (the caller's rescale removes what is
    left): some 10–40 passes over the pages instead of a bisection's 80."""
    assert callable(demand)
    lo, hi = np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    idle = ~(target > 0.0)  # groups with nothing to place: their level is not used
    log_t = np.log(np.where(idle, 1.0, target))
    with np.errstate(divide="ignore", invalid="ignore"):
        err_lo = np.log(demand(lo)) - log_t  # > 0 (or +∞)
        err_hi = np.log(demand(hi)) - log_t  # < 0 (or −∞)
    side = np.zeros(lo.shape, np.int8)
    x = 0.5 * (lo + hi)
    result = x.copy()
    done = idle.copy()  # a group's level stays where it first met the tolerance
    back1 = back2 = np.full(lo.shape, np.inf)  # the bracket's width one and two steps back
    for _ in range(_BISECTIONS):
        width = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            step = lo + width * err_lo / (err_lo - err_hi)
        bad = ~np.isfinite(step) | (step <= lo) | (step >= hi) | (width > 0.5 * back2)
        x = np.where(bad, 0.5 * (lo + hi), step)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.log(demand(x)) - log_t
        over = ~(err < 0.0)  # demand ≥ target (or NaN): the root lies above x
        err_hi = np.where(over & (side > 0), 0.5 * err_hi, err_hi)
        err_lo = np.where(~over & (side < 0), 0.5 * err_lo, err_lo)
        lo, err_lo = np.where(over, x, lo), np.where(over, err, err_lo)
        hi, err_hi = np.where(over, hi, x), np.where(over, err_hi, err)
        side = np.where(over, 1, -1).astype(np.int8)
        back2, back1 = back1, width
        # on a step of Σf (a page dropping out) no level meets the budget: take the bracket's
        # lower end, where the pages take at least the budget, and the rescale the rest
        met = np.abs(err) < 1e-10
        ended = ~done & (met | (hi - lo < 1e-7))
        result = np.where(ended, np.where(met, x, lo), result)
        done |= ended
        if done.all():
            break
    return result


def solve_expected(
    name: str,
    log_rate: ArrayLike,
    log_sd: ArrayLike,
    budget: float,
    *,
    weights: ArrayLike | None = None,
    hosts: ArrayLike | None = None,
    host_caps: ArrayLike | None = None,
) -> Allocation:
    """Maximise Σ wᵢ·E[V(λᵢ, fᵢ)] for ln λᵢ ~ N(``log_rate``ᵢ, ``log_sd``ᵢ²) (ln of changes
    per second; sd in natural-log units), V = F̄ for ``name`` "optimal", −Ā for
    "optimal-age"; Σf = ``budget`` fetches per second, at most ``host_caps[h]`` per host."""
    if name not in EXPECTED_POLICIES:
        raise ValueError(f"no expected-value form of {name!r}: use one of {EXPECTED_POLICIES}")
    theta = np.asarray(log_rate, dtype=np.float64)
    sigma = np.broadcast_to(np.asarray(log_sd, dtype=np.float64), theta.shape)
    n = theta.size
    if not (np.isfinite(theta).all() and np.isfinite(sigma).all() and (sigma >= 0).all()):
        raise ValueError("log_rate and log_sd must be finite, log_sd ≥ 0")
    w = np.ones(n) if weights is None else np.broadcast_to(np.asarray(weights, np.float64), (n,))
    host = np.zeros(n, np.intp) if hosts is None else np.asarray(hosts, dtype=np.intp)
    caps = np.array([np.inf]) if host_caps is None else np.asarray(host_caps, np.float64)
    valued = w > 0.0
    with np.errstate(divide="ignore"):
        log_w = np.where(valued, np.log(w), 0.0)
    table = _table(EXPECTED_POLICIES[name])
    n_hosts = caps.size
    worth = group_sum(host, valued.astype(np.float64), n_hosts) > 0
    room = float(caps[worth].sum())

    def rates(log_mu: Float | float) -> Float:
        return np.where(valued, _rates(table, theta, sigma, log_w, np.asarray(log_mu)), 0.0)

    def taken(log_mu: Float) -> Float:
        return np.array(
            [
                float(np.minimum(group_sum(host, rates(float(v)), n_hosts), caps).sum())
                for v in log_mu
            ]
        )

    span = _span(theta, sigma, log_w, table.power)
    if n == 0 or not valued.any() or budget <= 0.0:
        f = np.zeros(n)
        return _allocation(name, f, budget, budget if n == 0 else 0.0, math.inf, None, None)
    if room > budget:
        log_mu = float(
            _bisect(taken, np.array([budget]), np.array([span[0]]), np.array([span[1]]))[0]
        )
        f = rates(log_mu)
        demand = group_sum(host, f, n_hosts)
        capped = demand > caps * (1.0 + 1e-12)
        leftover = 0.0
    else:
        log_mu, capped = -math.inf, worth.copy()
        f = np.zeros(n)
        leftover = budget - room
    if capped.any():
        rows = capped[host] & valued
        start = log_mu if math.isfinite(log_mu) else span[0]

        def by_host(level: Float) -> Float:
            fr = _rates(table, theta[rows], sigma[rows], log_w[rows], level[host[rows]])
            return group_sum(host[rows], fr, n_hosts)

        levels = _bisect(
            by_host, np.where(capped, caps, 0.0), np.full(n_hosts, start), np.full(n_hosts, span[1])
        )
        f[rows] = _rates(table, theta[rows], sigma[rows], log_w[rows], levels[host[rows]])
        f[capped[host]] *= _ratio(caps, group_sum(host, f, n_hosts), capped)[host[capped[host]]]
    else:
        levels = None
    free = ~capped[host]
    want = budget - leftover - float(f[~free].sum())
    have = float(f[free].sum())
    if have > 0.0 and want > 0.0:
        f[free] *= want / have  # the bisection's last relative error
    mu = math.exp(log_mu) if math.isfinite(log_mu) else 0.0
    host_levels = (
        None
        if hosts is None
        else np.where(capped, np.exp(levels), mu)
        if levels is not None
        else np.full(n_hosts, mu)
    )
    return _allocation(
        name, f, budget, leftover, mu, host_levels, capped if hosts is not None else None
    )


def _ratio(caps: Float, sums: Float, capped: NDArray[np.bool_]) -> Float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(capped & (sums > 0.0), caps / sums, 1.0)


def _span(theta: Float, sigma: Float, log_w: Float, power: int) -> tuple[float, float]:
    """A bracket on ln μ: above it no page takes a fetch worth mentioning, below it every
    page takes more than any budget."""
    base = log_w - power * theta
    return float(base.min() - 130.0), float(base.max() + 0.5 * float(sigma.max()) ** 2 + 130.0)


def _allocation(
    name: str,
    f: Float,
    budget: float,
    unplaced: float,
    mu: float,
    levels: Float | None,
    capped: NDArray[np.bool_] | None,
) -> Allocation:
    for a in (f, levels, capped):
        if a is not None:
            a.flags.writeable = False
    return Allocation(
        policy=name,
        rates=f,
        budget=budget,
        unplaced=max(unplaced, 0.0),
        multiplier=mu,
        host_multipliers=levels,
        capped_hosts=capped,
    )


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
