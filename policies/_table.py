"""Fast inverses of the marginal values, for allocating millions of pages.

The optimal policies need, for every page and every trial multiplier μ, the fetch rate f at
which the page's marginal value equals μ. With x = λ/f that is x = G⁻¹(y), y = μ·λᵖ/w, where
G = g, p = 1 for freshness and G = q, p = 2 for age (see ``_model``). Writing

    f = λ/x = A·μ^(−1/2)·R(log y),   R(v) = √(2y)/G⁻¹(y),   A = √(λ^(2−p)·w/2)

separates what depends on the page (A and log s = log(λᵖ/w), v = log μ + log s) from one smooth,
bounded function R ∈ [0, 1] of v = log y = log μ + log s. R is tabulated once, per cell a
cubic polynomial through Chebyshev nodes of the exact inverse, so evaluating it for ten
million pages costs a handful of vectorised arithmetic operations and gathers and no
transcendental function. The tables agree with the exact inverses to about 1e-12.

Freshness: R falls from 1 (y → 0) to 0 at y = 1 (the page drops out: it changes too often to
be worth a fetch), with a logarithmic singularity there; it is tabulated in ξ = log(−v),
which straightens the singularity. Age: R rises from 0 (y → 0, R ~ e^(v/6)) to 1 (y → ∞) and is
tabulated in v, with the left tail from its asymptote.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from numpy.typing import NDArray

from ._model import inverse_g, inverse_q

__all__ = ["Response", "age_response", "freshness_response"]

Float = NDArray[np.float64]

_DEGREE = 3
_CELLS_PER_UNIT = 128
# Chebyshev nodes of the first kind on [0, 1] and the matrix taking node values to monomial
# coefficients in the cell's local coordinate t ∈ [0, 1).
_NODES = 0.5 - 0.5 * np.cos((2 * np.arange(_DEGREE + 1) + 1) * np.pi / (2 * (_DEGREE + 1)))
_TO_COEFFICIENTS = np.linalg.inv(np.vander(_NODES, _DEGREE + 1, increasing=True))


@dataclass(frozen=True, slots=True)
class _Table:
    """Piecewise cubic on a uniform grid over [lo, lo + cells/scale]."""

    lo: float
    scale: float  # cells per unit of the variable
    c0: Float
    c1: Float
    c2: Float
    c3: Float

    @classmethod
    def fit(cls, function: Callable[[Float], Float], lo: float, hi: float) -> _Table:
        cells = math.ceil((hi - lo) * _CELLS_PER_UNIT)
        scale = cells / (hi - lo)
        left = lo + np.arange(cells, dtype=np.float64) / scale
        values = function(left[:, None] + _NODES[None, :] / scale)
        c = values @ _TO_COEFFICIENTS.T
        parts = [np.ascontiguousarray(c[:, k]) for k in range(_DEGREE + 1)]
        return cls(lo, scale, *parts)

    def __call__(self, z: Float) -> tuple[Float, Float]:
        """Values and derivatives d/dz at z, clamped to the table's range (in place: few
        temporaries, which at a block's size cost more than the arithmetic)."""
        t = z - self.lo
        t *= self.scale
        np.clip(t, 0.0, self.c0.size - 1e-9, out=t)
        i = t.astype(np.intp)
        t -= i
        c1, c2, c3 = np.take(self.c1, i), np.take(self.c2, i), np.take(self.c3, i)
        # value = ((c3·t + c2)·t + c1)·t + c0, slope = ((3·c3·t + 2·c2)·t + c1)·scale
        value = c3 * t
        value += c2
        value *= t
        value += c1
        value *= t
        value += np.take(self.c0, i)
        c3 *= 3.0
        c3 *= t
        c2 *= 2.0
        c3 += c2
        c3 *= t
        c3 += c1
        c3 *= self.scale
        return value, c3


class Response:
    """R(v) and dR/dv for one objective; see the module docstring."""

    def __init__(self, name: str, power: int, drops_out: bool) -> None:
        self.name = name
        self.power = power
        self.drops_out = drops_out  # R = 0 for v ≥ 0: pages can get nothing

    def __call__(self, v: Float) -> tuple[Float, Float]:  # pragma: no cover - abstract
        raise NotImplementedError


class _FreshnessResponse(Response):
    # ξ = log(−v). ξ > log 80 is y < 1.8e-35, where R = 1 − √(2y)/3 is 1 in double precision.
    # Within 1e-10 of the drop-out (1 − y < 1e-10, x > 26) R falls to 0 as a straight line in
    # v instead of as 1/log: in double precision the true curve is a jump (v = log μ + log s
    # cannot come closer to 0 than an ulp), which no root-finder can land on. Any f on the
    # ramp has a marginal value within 1e-10 of μ, so the optimum is unchanged to that
    # precision, and the sum over pages becomes continuous.
    _RAMP = 1e-10
    _XI_LO = math.log(_RAMP)
    _XI_HI = math.log(80.0)

    def __init__(self) -> None:
        super().__init__("freshness", 1, drops_out=True)

        def r(xi: Float) -> Float:
            v = -np.exp(xi)
            value: Float = np.sqrt(2.0) * np.exp(0.5 * v) / inverse_g(v)
            return value

        self._table = _Table.fit(r, self._XI_LO, self._XI_HI)
        self._ramp_top = float(r(np.array([self._XI_LO]))[0])

    def __call__(self, v: Float) -> tuple[Float, Float]:
        neg = -v
        clamped = np.maximum(neg, self._RAMP)
        value, slope = self._table(np.log(clamped))
        # dR/dv = dR/dξ · dξ/dv with dξ/dv = 1/v
        clamped *= -1.0
        slope /= clamped
        ramp = neg < self._RAMP  # many pages are past their drop-out: masked copies, no gathers
        if ramp.any():
            np.maximum(neg, 0.0, out=neg)
            on = neg > 0.0
            neg /= self._RAMP
            neg *= self._ramp_top
            np.copyto(value, neg, where=ramp)
            np.copyto(slope, np.where(on, -self._ramp_top / self._RAMP, 0.0), where=ramp)
        return value, slope


class _AgeResponse(Response):
    # v > 40: R = √(y/(y+1)) to double precision is 1. v < −120: x < 1e-17 and R is its
    # asymptote √2·3^(−1/3)·e^(v/6) to double precision.
    _V_LO = -120.0
    _V_HI = 40.0
    _TAIL = math.sqrt(2.0) * 3.0 ** (-1.0 / 3.0)

    def __init__(self) -> None:
        super().__init__("age", 2, drops_out=False)
        self._table = _Table.fit(
            lambda v: np.sqrt(2.0) * np.exp(0.5 * v) / inverse_q(v), self._V_LO, self._V_HI
        )

    def __call__(self, v: Float) -> tuple[Float, Float]:
        value, slope = self._table(v.copy())
        tail = v < self._V_LO
        if tail.any():
            tv = v[tail]
            value[tail] = self._TAIL * np.exp(tv / 6.0)
            slope[tail] = value[tail] / 6.0
        return value, slope


@cache
def freshness_response() -> Response:
    """The freshness table, built on first use (about 6,000 cells, a few milliseconds)."""
    return _FreshnessResponse()


@cache
def age_response() -> Response:
    """The age table, built on first use."""
    return _AgeResponse()
