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
be worth a fetch), with a logarithmic singularity there; it is tabulated in n = −v on cells
that are 1/256 of an octave wide (the width grows with n, as cells uniform in log n would,
which straightens the singularity), found from the bits of n itself: the cell is n's
exponent and leading mantissa bits, the coordinate within it the remaining mantissa bits,
so no logarithm is taken per page. Age: R rises from 0 (y → 0, R ~ e^(v/6)) to 1 (y → ∞) and
is tabulated in v, with the left tail from its asymptote.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
from numpy.typing import NDArray

from ._model import inverse_g, inverse_q

__all__ = ["Response", "age_response", "freshness_response"]

Float = NDArray[np.float64]
Index = NDArray[np.int64]

_DEGREE = 3
_CELLS_PER_UNIT = 128
_BITS = 8  # the octave tables' cells: 2^8 per octave
_SHIFT = 52 - _BITS
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


@dataclass(frozen=True, slots=True)
class _OctaveTable:
    """Piecewise cubic in n > 0 on cells 2^(−_BITS) of an octave wide over [lo, hi], each
    cell's polynomial in the integer of n's mantissa bits below its leading _BITS (exact
    powers of two scale it to the cell's coordinate), its coefficients for dF/dn beside."""

    lo: float
    hi: float
    base: int  # the cell index of 2^first octave, in n's bits shifted right by _SHIFT
    c: tuple[Float, Float, Float, Float]  # F = ((c3·t + c2)·t + c1)·t + c0, t the low bits
    d: tuple[Float, Float, Float]  # dF/dn = (d2·t + d1)·t + d0

    @classmethod
    def fit(cls, function: Callable[[Float], Float], lo: float, hi: float) -> _OctaveTable:
        first, last = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
        cells = (last - first) << _BITS
        cell = np.arange(cells)
        exponent = first + (cell >> _BITS)
        left = np.ldexp(1.0 + (cell & ((1 << _BITS) - 1)) / 2.0**_BITS, exponent)
        width = np.ldexp(2.0**-_BITS, exponent)
        # each cell's polynomial through Chebyshev nodes of the part of it in [lo, hi]
        a = (np.clip(left, lo, hi) - left) / width
        b = (np.clip(left + width, lo, hi) - left) / width
        unused = b <= a  # (cells outside [lo, hi]: through the clamped values)
        a, b = np.where(unused, 0.0, a), np.where(unused, 1.0, b)
        t = a[:, None] + (b - a)[:, None] * _NODES[None, :]
        values = function(np.clip(left[:, None] + width[:, None] * t, lo, hi))
        vander = t[:, :, None] ** np.arange(_DEGREE + 1)[None, None, :]
        c = np.linalg.solve(vander, values[:, :, None])[:, :, 0]
        c *= 2.0 ** (-_SHIFT * np.arange(_DEGREE + 1))  # in t·2^_SHIFT, the bits' integer
        per_n = np.ldexp(1.0, 52 - exponent)  # d(bits' integer)/dn
        d = c[:, 1:] * np.arange(1, _DEGREE + 1) * per_n[:, None]
        base = (1023 + first) << _BITS
        cs = [np.ascontiguousarray(c[:, k]) for k in range(_DEGREE + 1)]
        ds = [np.ascontiguousarray(d[:, k]) for k in range(_DEGREE)]
        return cls(lo, hi, base, (cs[0], cs[1], cs[2], cs[3]), (ds[0], ds[1], ds[2]))

    def __call__(self, n: Float, value: Float, slope: Float, scratch: Scratch) -> None:
        """F and dF/dn at n clamped to [lo, hi], into ``value`` and ``slope`` (``scratch``:
        buffers of at least n's size)."""
        size = n.size
        clamped, t = scratch.floats[0][:size], scratch.floats[1][:size]
        i, low = scratch.ints[0][:size], scratch.ints[1][:size]
        np.clip(n, self.lo, self.hi, out=clamped)
        bits = clamped.view(np.int64)
        np.right_shift(bits, _SHIFT, out=i)
        i -= self.base
        np.bitwise_and(bits, (1 << _SHIFT) - 1, out=low)
        np.copyto(t, low, casting="unsafe")
        c0, c1, c2, c3 = self.c
        np.take(c3, i, out=value, mode="clip")
        for c_k in (c2, c1, c0):
            value *= t
            value += np.take(c_k, i, out=clamped, mode="clip")
        d0, d1, d2 = self.d
        np.take(d2, i, out=slope, mode="clip")
        for d_k in (d1, d0):
            slope *= t
            slope += np.take(d_k, i, out=clamped, mode="clip")


class Scratch:
    """Block-sized buffers for one evaluation, reused from block to block (fresh memory of a
    block's size costs page faults, as much as a pass over it): ``floats`` float buffers
    (four serve ``Response.into``) and two of integers."""

    def __init__(self, size: int, floats: int = 4) -> None:
        self.floats = tuple(np.empty(size) for _ in range(floats))
        self.ints = (np.empty(size, np.int64), np.empty(size, np.int64))


class Response:
    """R(v) and dR/dv for one objective; see the module docstring."""

    def __init__(self, name: str, power: int, drops_out: bool) -> None:
        self.name = name
        self.power = power
        self.drops_out = drops_out  # R = 0 for v ≥ 0: pages can get nothing

    def __call__(self, v: Float) -> tuple[Float, Float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def scratch(self, size: int) -> Scratch | None:
        """Buffers for :meth:`into` on blocks of up to ``size`` pages (None: it needs none)."""
        return None

    def into(self, v: Float, amp: Float, f: Float, df: Float, scratch: Scratch | None) -> None:
        """f = amp·R(v) and df = amp·(R'(v) − R(v)/2) into ``f`` and ``df`` (``v`` and
        ``amp`` may be overwritten; ``scratch`` from :meth:`scratch`)."""
        r, dr = self(v)
        np.multiply(amp, r, out=f)
        dr -= 0.5 * r
        np.multiply(amp, dr, out=df)


class _FreshnessResponse(Response):
    # n = −v. n > 80 is y < 1.8e-35, where R = 1 − √(2y)/3 is 1 in double precision.
    # Within 1e-10 of the drop-out (1 − y < 1e-10, x > 26) R falls to 0 as a straight line in
    # v instead of as 1/log: in double precision the true curve is a jump (v = log μ + log s
    # cannot come closer to 0 than an ulp), which no root-finder can land on. Any f on the
    # ramp has a marginal value within 1e-10 of μ, so the optimum is unchanged to that
    # precision, and the sum over pages becomes continuous.
    _RAMP = 1e-10
    _HI = 80.0

    def __init__(self) -> None:
        super().__init__("freshness", 1, drops_out=True)

        def r(n: Float) -> Float:
            value: Float = np.sqrt(2.0) * np.exp(-0.5 * n) / inverse_g(-n)
            return value

        table = _OctaveTable.fit(r, self._RAMP, self._HI)
        # dR/dv = −dR/dn: the table's slope coefficients say dR/dv
        d0, d1, d2 = table.d
        self._table = replace(table, d=(-d0, -d1, -d2))
        self._ramp_top = float(r(np.array([self._RAMP]))[0])

    def scratch(self, size: int) -> Scratch:
        return Scratch(size)

    def __call__(self, v: Float) -> tuple[Float, Float]:
        value, slope = np.empty(v.size), np.empty(v.size)
        self._values(-v, value, slope, Scratch(v.size))
        return value, slope

    def into(self, v: Float, amp: Float, f: Float, df: Float, scratch: Scratch | None) -> None:
        assert scratch is not None
        np.negative(v, out=v)
        self._values(v, f, df, scratch)
        half = scratch.floats[0][: f.size]
        np.multiply(f, 0.5, out=half)
        df -= half
        f *= amp
        df *= amp

    def _values(self, n: Float, value: Float, slope: Float, scratch: Scratch) -> None:
        """R and dR/dv at v = −n into ``value`` and ``slope``."""
        self._table(n, value, slope, scratch)
        # on the ramp and past the drop-out (n < 1e-10) the table's value at 1e-10 times
        # max(n, 0)/1e-10: one multiplication for all pages, no masks (many pages are past
        # their drop-out); the ramp's few pages then get its slope
        factor = scratch.floats[0][: n.size]
        np.multiply(n, 1.0 / self._RAMP, out=factor)
        np.clip(factor, 0.0, 1.0, out=factor)
        value *= factor
        slope *= factor
        if np.count_nonzero(factor) != np.count_nonzero(n >= self._RAMP):
            ramp = (n > 0.0) & (n < self._RAMP)
            value[ramp] = n[ramp] * (self._ramp_top / self._RAMP)
            slope[ramp] = -self._ramp_top / self._RAMP


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
