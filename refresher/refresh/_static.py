"""Which pages never change: a point mass at λ = 0 beside the log-normal prior.

The log-normal prior on ln λ has no room for a page that never changes: after an exposure T
without a change its λ̂ only falls like 1/T, and a plan keeps spending fetches on it. Many webs
are mostly static. With a share π of pages that never change, a page that showed no change in
T seconds of observed intervals is static with probability

    P₀ = π / (π + (1 − π)·L),   L = E[e^(−λT)] under its log-normal prior N(m, sd²),

and 0 once it changed. π is the maximum-likelihood share (EM over the observed pages); a page
without observations gets P₀ = π. L is a Gauss–Hermite sum over the prior.

A static page is always fresh and never old, so its expected value is (1 − P₀) times that of
the log-normal part plus a constant: the plan weighs it by 1 − P₀ (:func:`refresher.refresh.
_allocate.plan`), and exploration keeps re-checking it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["static_probability"]

Float = NDArray[np.float64]

_NODES = 24
_ROUNDS = 100
_MAX_SHARE = 0.99  # π is kept below 1 so that a new change is never ruled out
_BLOCK = 1 << 14  # quiet pages per block of the Gauss–Hermite sum


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
    exposure = np.bincount(p, t, minlength=n_pages)
    changes = np.bincount(p, c, minlength=n_pages)
    seen = exposure > 0
    quiet = seen & (changes == 0)
    if not seen.any():
        return np.zeros(n_pages), 0.0
    x, w = np.polynomial.hermite.hermgauss(_NODES)
    z, w = math.sqrt(2.0) * x, w / math.sqrt(math.pi)
    m = np.broadcast_to(np.asarray(prior_mean, dtype=np.float64), (n_pages,))[quiet]
    t = exposure[quiet]
    likely = np.empty(m.size)  # L per quiet page, by blocks: no (pages × nodes) array at once
    for start in range(0, m.size, _BLOCK):
        b = slice(start, start + _BLOCK)
        lam = np.exp(np.clip(m[b, None] + sd * z[None, :], -700.0, 700.0))
        likely[b] = np.exp(-lam * t[b, None]) @ w
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
