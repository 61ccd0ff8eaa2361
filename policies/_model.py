"""Freshness and age of a page refreshed at a fixed rate, and their marginal values.

A page changes as a Poisson process of rate λ (changes per second) and is fetched every
1/f seconds (f in fetches per second). Cho & Garcia-Molina's time averages, with x = λ/f::

    F̄(λ, f) = (f/λ)·(1 − e^(−λ/f))                 = (1 − e^(−x))/x
    Ā(λ, f) = 1/(2f) − 1/λ + (f/λ²)·(1 − e^(−λ/f))  = (x/2 − 1 + (1 − e^(−x))/x)/λ   seconds

and the marginal values of one more fetch per second::

    ∂F̄/∂f  = g(x)/λ     with g(x) = 1 − (1 + x)·e^(−x)         (falls from 1/λ to 0)
    −∂Ā/∂f = q(x)/λ²    with q(x) = x²/2 − 1 + (1 + x)·e^(−x)   (falls from ∞ to 0)

Every function here is elementwise, broadcasts, and is exact in its limits: a page that never
changes (λ = 0) is always fresh and never old; a page with λ > 0 that is never fetched (f = 0)
is never fresh and infinitely old. Small x is evaluated from power series, where the closed
forms would cancel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "age",
    "freshness",
    "g",
    "inverse_g",
    "inverse_q",
    "marginal_age",
    "marginal_freshness",
    "mean_age",
    "mean_freshness",
    "q",
]

Float = NDArray[np.float64]
Elementwise = Callable[[Float], Float]

# Below this x the closed forms lose more than ~1e-13 to cancellation; the series are used.
_SERIES_X = 0.25
_TERMS = 24


def _series(x: Float, coefficients: Float) -> Float:
    """Σ coefficients[k]·x^k by Horner's rule."""
    acc = np.zeros_like(x)
    for c in coefficients[::-1]:
        acc = acc * x + c
    return acc


def _coefficients(term: Callable[[int], float]) -> Float:
    return np.array([term(k) for k in range(_TERMS)], dtype=np.float64)


# g(x) = Σ_{k≥2} (−1)^k (k−1)/k! x^k ; q(x) = x²/2 − g(x) = Σ_{k≥3} (−1)^(k+1) (k−1)/k! x^k
_G = _coefficients(lambda k: 0.0 if k < 2 else (-1) ** k * (k - 1) / math.factorial(k))
_Q = _coefficients(lambda k: 0.0 if k < 3 else (-1) ** (k + 1) * (k - 1) / math.factorial(k))
# a(x) = λ·Ā = x/2 − 1 + (1 − e^(−x))/x = Σ_{k≥2} (−1)^k x^k/(k+1)!
_A = _coefficients(lambda k: 0.0 if k < 2 else (-1) ** k / math.factorial(k + 1))
# k(x) = x − log(1 + x) = Σ_{k≥2} (−1)^k x^k/k
_K = _coefficients(lambda k: 0.0 if k < 2 else (-1) ** k / k)


def _piecewise(x: Float, closed: Elementwise, coefficients: Float) -> Float:
    """``closed(x)`` where it is accurate, the series below ``_SERIES_X``."""
    out = np.empty_like(x)
    small = x < _SERIES_X
    big = ~small
    with np.errstate(over="ignore", invalid="ignore"):
        out[big] = closed(x[big])
    out[small] = _series(x[small], coefficients)
    return out


def g(x: ArrayLike) -> Float:
    """g(x) = 1 − (1 + x)·e^(−x) for x ≥ 0 (x = λ/f); g(∞) = 1."""
    xa = np.asarray(x, dtype=np.float64)
    return _piecewise(np.atleast_1d(xa), lambda t: -np.expm1(-t) - t * np.exp(-t), _G).reshape(
        xa.shape
    )


def q(x: ArrayLike) -> Float:
    """q(x) = x²/2 − 1 + (1 + x)·e^(−x) for x ≥ 0 (x = λ/f); q(∞) = ∞."""
    xa = np.asarray(x, dtype=np.float64)
    return _piecewise(
        np.atleast_1d(xa), lambda t: 0.5 * t * t - 1.0 + (1.0 + t) * np.exp(-t), _Q
    ).reshape(xa.shape)


def _ratio(rates: ArrayLike, f: ArrayLike) -> tuple[Float, Float, Float]:
    """Broadcast λ and f, return (λ, f, x = λ/f) with x = 0 where λ = 0 and ∞ where f = 0 < λ."""
    lam, fa = np.broadcast_arrays(
        np.asarray(rates, dtype=np.float64), np.asarray(f, dtype=np.float64)
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = np.where(lam > 0.0, lam / fa, 0.0)
    return lam, fa, x


def freshness(rates: ArrayLike, f: ArrayLike) -> Float:
    """Time-averaged freshness F̄(λ, f) ∈ [0, 1] of pages changing at ``rates`` (changes per
    second) fetched at ``f`` (fetches per second). 1 where λ = 0; 0 where f = 0 < λ."""
    _, _, x = _ratio(rates, f)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(x > 0.0, -np.expm1(-x) / x, 1.0)
    return np.where(np.isinf(x), 0.0, out)


def age(rates: ArrayLike, f: ArrayLike) -> Float:
    """Time-averaged age Ā(λ, f) in seconds. 0 where λ = 0; ∞ where f = 0 < λ."""
    lam, fa, x = _ratio(rates, f)
    flat = np.atleast_1d(x).ravel()
    finite = np.isfinite(flat)
    a_over_x = np.full_like(flat, np.inf)
    # Ā = a(x)/λ = (a(x)/x)/f keeps λ → 0 finite.
    a_over_x[finite] = _piecewise(
        flat[finite], lambda t: 0.5 - 1.0 / t - np.expm1(-t) / (t * t), _A[1:]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(lam > 0.0, a_over_x.reshape(x.shape) / fa, 0.0)
    return np.asarray(out, dtype=np.float64)


def marginal_freshness(rates: ArrayLike, f: ArrayLike) -> Float:
    """∂F̄/∂f in seconds per fetch·second⁻¹ … i.e. freshness gained per extra fetch per second.

    Equals g(λ/f)/λ: 1/λ at f = 0, falling to 0 as f → ∞; 0 where λ = 0."""
    lam, fa, x = _ratio(rates, f)
    flat = np.atleast_1d(x).ravel()
    finite = np.isfinite(flat)
    g_over_x = np.zeros_like(flat)
    # g(x)/λ = (g(x)/x)/f keeps λ → 0 finite; at f = 0 it is 1/λ.
    g_over_x[finite] = _piecewise(
        flat[finite], lambda t: (-np.expm1(-t) - t * np.exp(-t)) / t, _G[1:]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(
            np.isinf(x), 1.0 / lam, np.where(lam > 0.0, g_over_x.reshape(x.shape) / fa, 0.0)
        )
    return np.asarray(out, dtype=np.float64)


def marginal_age(rates: ArrayLike, f: ArrayLike) -> Float:
    """−∂Ā/∂f: seconds of age saved per extra fetch per second. Equals q(λ/f)/λ²; ∞ at f = 0
    when λ > 0; 0 where λ = 0."""
    lam, fa, x = _ratio(rates, f)
    flat = np.atleast_1d(x).ravel()
    finite = np.isfinite(flat)
    q_over_x2 = np.full_like(flat, np.inf)
    # q(x)/λ² = (q(x)/x²)/f²
    q_over_x2[finite] = _piecewise(
        flat[finite], lambda t: 0.5 - (1.0 - (1.0 + t) * np.exp(-t)) / (t * t), _Q[2:]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(lam > 0.0, q_over_x2.reshape(x.shape) / (fa * fa), 0.0)
    return np.asarray(out, dtype=np.float64)


def _weighted_mean(values: Float, weights: ArrayLike | None) -> float:
    if values.size == 0:
        return math.nan
    if weights is None:
        return float(np.mean(values))
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), values.shape)
    total = float(w.sum())
    if total <= 0.0:
        raise ValueError("weights sum to zero: give at least one page a positive weight")
    # 0·∞ (a weightless page that is never fetched) contributes nothing.
    return float(np.sum(np.where(w > 0.0, w * values, 0.0)) / total)


def mean_freshness(rates: ArrayLike, f: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Weighted mean of F̄ over pages (weights default to 1); NaN for no pages."""
    return _weighted_mean(freshness(rates, f), weights)


def mean_age(rates: ArrayLike, f: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Weighted mean of Ā over pages, in seconds (∞ if a changing page is never fetched)."""
    return _weighted_mean(age(rates, f), weights)


def _newton_loglog(
    log_target: Float, x0: Float, value: Elementwise, log_slope: Elementwise, steps: int = 60
) -> Float:
    """Solve value(x) = e^log_target for x > 0 by Newton's method in (log x, log value).

    Both g (and x − log(1+x)) and q are increasing with log-log slopes that fall with x, so
    log value(e^w) is concave in w and Newton converges from any start (after one step it
    approaches the root from below, monotonically)."""
    w = np.log(x0)
    polish = 2  # steps after the last one of any size: quadratic convergence ends at an ulp
    for _ in range(steps):
        x = np.exp(w)
        step = (np.log(value(x)) - log_target) / log_slope(x)
        w = w - step
        if step.size == 0 or np.max(np.abs(step)) < 1e-9:
            polish -= 1
            if polish < 0:
                break
    return np.exp(w)


def _k(x: Float) -> Float:
    """k(x) = x − log(1 + x), from its series below 0.25."""
    return _piecewise(x, lambda t: t - np.log1p(t), _K)


def inverse_g(log_y: ArrayLike) -> Float:
    """x > 0 with g(x) = y, given log y < 0 (y ∈ (0, 1)); accurate to a few ulps.

    Slow (iterative, with logarithms): used to build the allocation tables and in tests.
    Solved as x − log(1 + x) = z with z = −log(1 − y), which keeps y → 1 exact."""
    v = np.asarray(log_y, dtype=np.float64)
    # z = −log(1 − e^v), computed so that neither y → 0 nor y → 1 loses digits
    z = np.where(v < -0.5, -np.log1p(-np.exp(np.minimum(v, -0.5))), -np.log(-np.expm1(v)))
    x0 = z + np.sqrt(2.0 * z)
    return _newton_loglog(np.log(z), x0, _k, lambda x: x * x / ((1.0 + x) * _k(x)))


def inverse_q(log_y: ArrayLike) -> Float:
    """x > 0 with q(x) = y, given log y (y ∈ (0, ∞)); slow and accurate, as ``inverse_g``."""
    v = np.asarray(log_y, dtype=np.float64)
    y = np.exp(v)
    x0 = np.minimum(np.cbrt(3.0 * y), np.sqrt(2.0 * y + 2.0))
    return _newton_loglog(v, x0, q, lambda x: x * x * (-np.expm1(-x)) / q(x))
