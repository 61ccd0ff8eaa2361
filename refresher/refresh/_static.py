"""Which pages never change: a point mass at λ = 0 beside the log-normal prior.

The log-normal prior on ln λ has no room for a page that never changes: after an exposure T
without a change its λ̂ only falls like 1/T, and a plan keeps spending fetches on it. Many webs
are mostly static. With a share π of pages that never change, a page that showed no change in
T seconds of observed intervals is static with probability

    P₀ = π / (π + (1 − π)·L),   L = E[e^(−λT)] under its log-normal prior N(m, sd²),

and 0 once it changed. π is the maximum-likelihood share (Newton on the likelihood's 1-D
stationarity condition over the observed pages, see :func:`_ml_share`); a page
without observations gets P₀ = π. L is a Gauss–Hermite sum over the prior.

A static page is always fresh and never old, so its expected value is (1 − P₀) times that of
the log-normal part plus a constant: the plan weighs it by 1 − P₀ (:func:`refresher.refresh.
_allocate.plan`), and exploration keeps re-checking it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["static_of_pages", "static_probability"]

Float = NDArray[np.float64]

_NODES = 24
_ROUNDS = 100  # Newton steps on the share at most (9–11 in practice)
_MAX_SHARE = 0.99  # π is kept below 1 so that a new change is never ruled out
_BLOCK = 1 << 14  # quiet pages (or table points) per block of the Gauss–Hermite sum
#: L depends on a quiet page only through x = m + ln T: where pages outnumber the points of
#: a table of ln L over their range of x at this step (natural-log units), they read it by
#: linear interpolation instead of 24 terms each. The interpolation errs by at most step²/8
#: times the curvature of ln L, which is about |ln L| where that is large: L is off by at
#: most 8e-9·|ln L| relatively (6e-6 where L is about to underflow, 1e-8 where L ≈ π)
_STEP = 1.0 / 4096.0


def static_probability(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    n_pages: int,
    *,
    prior_mean: ArrayLike,
    sd: float,
) -> tuple[Float, float]:
    """P₀ per page and the share π (see the module docstring). ``intervals`` in seconds,
    ``prior_mean`` the mean of ln λ (changes per second) per page, ``sd`` its spread."""
    p = np.asarray(page_index, dtype=np.intp)
    t = np.asarray(intervals, dtype=np.float64)
    c = np.asarray(changed, dtype=bool)
    exposure = np.bincount(p, t, minlength=n_pages).astype(np.float64, copy=False)
    changes = np.bincount(p, c, minlength=n_pages)
    mean = np.broadcast_to(np.asarray(prior_mean, dtype=np.float64), (n_pages,))
    return static_of_pages(exposure, changes > 0, mean, sd)


def static_of_pages(
    exposure: Float, changed: NDArray[np.bool_], prior_mean: Float, sd: float
) -> tuple[Float, float]:
    """:func:`static_probability` from each page's summed intervals ``exposure`` (seconds, 0
    where it was never observed) and whether it ever ``changed``, arrays over pages."""
    seen = exposure > 0
    quiet = seen & ~changed
    if not seen.any():
        return np.zeros(exposure.size), 0.0
    likely = _quiet_likelihood(prior_mean[quiet], exposure[quiet], sd)
    share = _ml_share(likely, float(seen.sum()))
    out = np.where(seen, 0.0, share)
    out[quiet] = _posterior(share, likely)
    return out, share


def _posterior(share: float, likely: Float) -> Float:
    """P₀ = π/(π + (1 − π)·L) of quiet pages of likelihood ``likely`` (0 where π is)."""
    if share <= 0.0:
        return np.zeros(likely.size)
    return share / (share + (1.0 - share) * likely)


def _ml_share(likely: Float, n_seen: float) -> float:
    """The maximum-likelihood share π in [0, _MAX_SHARE] from the quiet pages' L and the
    count of observed pages (quiet or changed).

    The log-likelihood Σ_quiet ln(π + (1 − π)·L) + n_changed·ln(1 − π) is concave in π; its
    stationary point is where g(π) = Σ_quiet 1/(π + (1 − π)·L) equals ``n_seen`` (also EM's
    fixed point), and g falls and is convex in π. EM crawled there by a share step per round:
    with the share still moving at its round cap, it stopped wherever 100 rounds landed.
    Newton's steps on g from the left of the root climb to it monotonically (from its right
    they may overshoot: a bracket keeps them inside [0, _MAX_SHARE] and bisects there).
    9-11 evaluations of g on bench_replan's statistics."""
    lo, hi = 0.0, _MAX_SHARE
    rest = 1.0 - likely
    if likely.size == 0 or _share_slope(hi, likely, rest)[0] >= n_seen:
        return hi if likely.size else 0.0
    with np.errstate(divide="ignore"):
        if float(np.sum(1.0 / likely)) <= n_seen:
            return 0.0  # no share of static pages is more likely than none
    share = 0.5
    for _ in range(_ROUNDS):
        g, dg = _share_slope(share, likely, rest)
        if abs(g - n_seen) <= 1e-13 * n_seen:  # as close as the sum resolves
            return share
        if g > n_seen:
            lo = share
        else:
            hi = share
        step = (g - n_seen) / dg if dg < 0.0 else math.nan
        new = share - step
        if not lo < new < hi:
            new = 0.5 * (lo + hi)
        if abs(new - share) <= 1e-13 * max(share, 1e-3):
            return new
        share = new
    return share


def _share_slope(share: float, likely: Float, rest: Float) -> tuple[float, float]:
    """(g, dg/dπ) of :func:`_ml_share` at ``share``; ``rest`` is 1 − ``likely``."""
    inverse = rest * share  # π + (1 − π)·L = L + π·(1 − L)
    inverse += likely
    np.divide(1.0, inverse, out=inverse)
    g = float(inverse.sum())
    inverse *= inverse
    return g, -float(np.dot(inverse, rest))


def _hermite() -> tuple[Float, Float]:
    """Gauss–Hermite nodes and weights for the expectation over a standard normal."""
    x, w = np.polynomial.hermite.hermgauss(_NODES)
    return math.sqrt(2.0) * x, w / math.sqrt(math.pi)


def _quiet_likelihood(mean: Float, exposure: Float, sd: float) -> Float:
    """L = E[e^(−λT)] per quiet page under N(``mean``, sd²) for ln λ, T = ``exposure``."""
    z, w = _hermite()
    x = mean + np.log(exposure)
    if x.size:
        lo, hi = float(x.min()), float(x.max())
        points = math.ceil((hi - lo) / _STEP) + 1
        if points < x.size // 2:  # a table pays: fewer points than pages
            grid = np.asarray(lo + _STEP * np.arange(points), dtype=np.float64)
            return np.exp(np.interp(x, grid, _log_expectation(grid, sd, z, w)))
    likely = np.empty(x.size)  # by blocks: no (pages × nodes) array at once
    for start in range(0, x.size, _BLOCK):
        b = slice(start, start + _BLOCK)
        lam = np.exp(np.clip(mean[b, None] + sd * z[None, :], -700.0, 700.0))
        likely[b] = np.exp(-lam * exposure[b, None]) @ w
    return likely


def _log_expectation(x: Float, sd: float, z: Float, w: Float) -> Float:
    """ln E[exp(−e^(x + sd·Z))] for Z standard normal, by Gauss–Hermite, summed in log space
    so that it stays finite where the expectation underflows."""
    out = np.empty(x.size)
    log_w = np.log(w)
    for start in range(0, x.size, _BLOCK):
        b = slice(start, start + _BLOCK)
        terms = log_w[None, :] - np.exp(np.clip(x[b, None] + sd * z[None, :], -700.0, 700.0))
        top = terms.max(axis=1)
        out[b] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    return out
