"""Which pages never change: a point mass at λ = 0 beside the log-normal prior.

The log-normal prior on ln λ has no room for a page that never changes: after an exposure T
without a change its λ̂ only falls like 1/T, and a plan keeps spending fetches on it. Many webs
are mostly static. With a share π of pages that never change, a page that showed no change in
T seconds of observed intervals is static with probability

    P₀ = π / (π + (1 − π)·L),   L = E[e^(−λT)] under its log-normal prior N(m, sd²),

and 0 once it changed. π is the maximum-likelihood share (EM over the observed pages); a page
without observations gets P₀ = π. L is a Gauss–Hermite sum over the prior.

Which sd. L is the lower tail of the changing pages' rates. The rate estimates' prior holds
its sd near the configured spread until the pages show otherwise, which on a mostly static
web (changing pages of sd 0.7–1 held at 1.4–2) leaves a page quiet for minutes a plausible
slow changing one (1 − P₀ ≈ 0.01 where the pages' own spread says 10⁻⁴), and optimal-age,
whose f goes as the cube root of the rate, spends a quarter of B on such pages. Reckoned with
the narrower spread the pages show alone, P₀ sharpens, but a page in the far lower tail of a
narrow fit is then retired almost for good, and age, which grows without bound on a page
left unfetched, pays for every such page (one page took a web's age share from 72 % to 46 %
at 30 minutes). So L mixes the two: (1 − ``WIDE_SHARE``)·L(narrow sd) + ``WIDE_SHARE``·L(wide
sd). A page then keeps at least ``WIDE_SHARE`` of the odds of changing the wide prior gives
it, so under age's cube-root law its f is at least about ``WIDE_SHARE``^(1/3) (0.58) of what
the wide prior plans, and a wrong retirement costs at most about ``WIDE_SHARE``^(−2/3) (3×)
the wide plan's age on that page, where the narrow fit alone leaves it unbounded.

A static page is always fresh and never old, so its expected value is (1 − P₀) times that of
the log-normal part plus a constant: the plan weighs it by 1 − P₀ (:func:`refresher.refresh.
_allocate.plan`), and exploration keeps re-checking it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["WIDE_SHARE", "static_probability"]

Float = NDArray[np.float64]

_NODES = 24
_ROUNDS = 100
_MAX_SHARE = 0.99  # π is kept below 1 so that a new change is never ruled out
_BLOCK = 1 << 14  # quiet pages per block of the Gauss–Hermite sum
#: the weight of the wide spread in L (``wide_sd``; see the module docstring). Tuning webs,
#: optimal-age's share of the clairvoyant age: 0.05 lost at 30 minutes where 0.2 did not
#: (web 18 84 % → 58 %), and gained no more at 5
WIDE_SHARE = 0.2


def static_probability(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    n_pages: int,
    *,
    prior_mean: ArrayLike,
    sd: float,
    wide_sd: float | None = None,
) -> tuple[Float, float]:
    """P₀ per page and the share π (see the module docstring). ``intervals`` in seconds,
    ``prior_mean`` the mean of ln λ (changes per second) per page, ``sd`` its spread;
    ``wide_sd``: a wider spread that L mixes in with weight :data:`WIDE_SHARE` (see the
    module docstring; ignored unless wider than ``sd``)."""
    p = np.asarray(page_index, dtype=np.intp)
    t = np.asarray(intervals, dtype=np.float64)
    c = np.asarray(changed, dtype=bool)
    exposure = np.bincount(p, t, minlength=n_pages)
    changes = np.bincount(p, c, minlength=n_pages)
    seen = exposure > 0
    quiet = seen & (changes == 0)
    if not seen.any():
        return np.zeros(n_pages), 0.0
    x, w = np.polynomial.hermite.hermgauss(_NODES)
    z, w = math.sqrt(2.0) * x, w / math.sqrt(math.pi)
    m = np.broadcast_to(np.asarray(prior_mean, dtype=np.float64), (n_pages,))[quiet]
    likely = _quiet_likelihood(m, exposure[quiet], sd, z, w)
    if wide_sd is not None and wide_sd > sd:
        wide = _quiet_likelihood(m, exposure[quiet], wide_sd, z, w)
        likely = (1.0 - WIDE_SHARE) * likely + WIDE_SHARE * wide
    share, n_seen = 0.5, float(seen.sum())
    for _ in range(_ROUNDS):
        post = share / (share + (1.0 - share) * likely)
        new = min(float(post.sum()) / n_seen, _MAX_SHARE)
        if abs(new - share) < 1e-9:
            share = new
            break
        share = new
    out = np.where(seen, 0.0, share)
    out[quiet] = share / (share + (1.0 - share) * likely)
    return out, share


def _quiet_likelihood(m: Float, t: Float, sd: float, z: Float, w: Float) -> Float:
    """L = E[e^(−λT)] per quiet page under N(m, sd²) on ln λ (Gauss–Hermite nodes ``z``,
    weights ``w``), by blocks: no (pages × nodes) array at once."""
    likely = np.empty(m.size)
    for start in range(0, m.size, _BLOCK):
        b = slice(start, start + _BLOCK)
        lam = np.exp(np.clip(m[b, None] + sd * z[None, :], -700.0, 700.0))
        likely[b] = np.exp(-lam * t[b, None]) @ w
    return likely
