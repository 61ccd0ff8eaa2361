"""How widely change rates spread around their host's centre: the prior's sd, fitted.

The log-normal prior on θ = ln λ has an sd (``estimate.spread``, default 2: rates within a
factor 7 of the host's typical rate with probability 0.68). It decides how far one interval
moves a page's estimate, and so how much a plan made from a handful of observations differs
from uniform. On a web whose rates are close together a prior of sd 2 reads noise as
differences between pages: on 400 pages of sd 0.3 with four fetches each, the mean squared
error of ln λ̂ is 0.50 under it and 0.11 under the fitted one (sd 0.59).

:func:`fit_spread` takes the sd that maximises the marginal likelihood of what the pages
showed, Σᵢ ln p(Dᵢ | sd), each page's rate integrated over N(mᵢ + δ, sd²) with its host's
centre mᵢ, and the probability π that a page never changes (a page that changed is not
static). The centres come from the estimator's empirical Bayes rounds; a common shift δ of
all of them is profiled out, so the spread is judged by how the pages *differ*, not by where
the centres lie: while no page has changed yet, every sd explains the quiet pages equally
well (with the centres far enough down) and the fit stays at the configured spread, instead
of collapsing towards 0. A normal prior on ln sd around ``estimate.spread`` (``PENALTY``
log-likelihood units per unit of (ln sd − ln spread)²) holds the fit there until the pages
show otherwise.

The likelihood of page i at θ is ``timed``·θ − e^θ·``quiet`` + Σ ln(1 − e^(−e^θ t)) over its
changed intervals without a change time, those given as the two-point rule of
:func:`refresher.refresh._estimate_stats.two_point_nodes`. It is tabulated once per page on a
grid of u = θ − mᵢ, and each (sd, δ) of the search is then one matrix product with Gaussian
weights. At most ``SAMPLE`` pages take part (evenly spaced among the observed ones), so the
fit costs the same on a web of a million pages as on one of four thousand, and the prior on
ln sd weighs as much against four thousand pages' evidence there as here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["PENALTY", "SAMPLE", "SpreadEvidence", "fit_spread", "sample"]

Float = NDArray[np.float64]
Mask = NDArray[np.bool_]

#: log-likelihood units per unit of (ln sd − ln spread)²: the prior on ln sd has sd 1/√40
PENALTY = 20.0
#: at most this many observed pages take part in the fit
SAMPLE = 4096
_SIGMAS = np.exp(np.linspace(math.log(0.25), math.log(4.0), 17))  # steps of 19 %
_SHIFTS = np.linspace(-5.0, 5.0, 11)  # the profile's peak is interpolated
# θ − m in natural-log units. The step may be coarse: a page whose likelihood is narrower
# than it is summed with an error that hardly depends on (sd, δ), since the Gaussian (sd ≥
# 0.25) varies slowly across it, so the error shifts every score of that page alike.
_U = np.arange(-24.0, 24.0 + 1e-9, 0.25)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpreadEvidence:
    """Per observed page: its quiet exposure ``quiet`` (seconds without a change), changes
    with a known time ``timed``, the changed intervals without one as two weighted lengths
    (``t0``, ``w0``, ``t1``, ``w1``: seconds, changes), whether it ever changed, and its
    prior mean ``mean`` of ln λ (λ in changes per second)."""

    quiet: Float
    timed: Float
    t0: Float
    w0: Float
    t1: Float
    w1: Float
    changed: Mask
    mean: Float

    def sample(self, size: int) -> SpreadEvidence:
        """At most ``size`` pages, evenly spaced."""
        pick = sample(np.arange(self.quiet.size), size)
        if pick.size == self.quiet.size:
            return self
        return SpreadEvidence(
            **{name: getattr(self, name)[pick] for name in SpreadEvidence.__slots__}
        )


def sample(pages: NDArray[np.intp], size: int = SAMPLE) -> NDArray[np.intp]:
    """At most ``size`` of ``pages``, evenly spaced: the estimators pick the pages of the fit
    with it before gathering their evidence, so a web of millions gathers four thousand."""
    if pages.size <= size:
        return pages
    return pages[np.linspace(0, pages.size - 1, size).astype(np.intp)]


def _page_table(ev: SpreadEvidence) -> tuple[Float, Float]:
    """ℓᵢ(mᵢ + u) − maxᵢ on the grid ``_U`` (pages × grid) and each page's max."""
    theta = ev.mean[:, None] + _U[None, :]
    lam = np.exp(np.clip(theta, -700.0, 700.0))
    ll = ev.timed[:, None] * theta - lam * ev.quiet[:, None]
    for t, w in ((ev.t0, ev.w0), (ev.t1, ev.w1)):
        has = w > 0.0
        if has.any():
            with np.errstate(divide="ignore"):  # ln(1 − e^(−x)); −∞ where x underflows to 0
                ll[has] += w[has, None] * np.log(-np.expm1(-lam[has] * t[has, None]))
    top = ll.max(axis=1)
    return ll - top[:, None], top


def fit_spread(ev: SpreadEvidence, *, spread: float, static_share: float = 0.0) -> float:
    """The sd of ln λ around the host centres that maximises the pages' marginal likelihood
    plus the prior on ln sd around ``spread`` (see the module docstring); ``static_share``:
    the share π of pages that never change. ``spread`` itself when no page was observed."""
    if not spread > 0.0:
        raise ValueError(f"spread must be > 0 (natural-log units), not {spread!r}")
    ev = ev.sample(SAMPLE)
    if ev.quiet.size == 0:
        return spread
    table, top = _page_table(ev)
    step = float(_U[1] - _U[0])
    # Gaussian weights of each grid point for every (sd, shift): grid × (sds · shifts)
    sd = np.repeat(_SIGMAS, _SHIFTS.size)
    z = (_U[:, None] - np.tile(_SHIFTS, _SIGMAS.size)[None, :]) / sd[None, :]
    weights = np.exp(-0.5 * z * z) * (step / (sd * math.sqrt(2.0 * math.pi)))[None, :]
    with np.errstate(divide="ignore"):
        marginal = np.log(np.exp(table) @ weights)  # ln E[p(D | λ)] − top, pages × columns
    pi = min(max(static_share, 0.0), 0.99)
    # a page that changed is not static; one that never did is, with probability π
    changed, quiet = ev.changed, ~ev.changed
    total = (math.log1p(-pi) + marginal[changed] + top[changed, None]).sum(axis=0)
    if quiet.any():
        with np.errstate(divide="ignore", over="ignore"):
            ratio = np.exp(marginal[quiet] + top[quiet, None])
        total += np.log(pi + (1.0 - pi) * ratio).sum(axis=0)
    profile = _peaks(total.reshape(_SIGMAS.size, _SHIFTS.size))
    score = profile - PENALTY * (np.log(_SIGMAS) - math.log(spread)) ** 2
    fitted = float(_SIGMAS[int(np.argmax(score))])
    # the grid's point at the configured spread is the spread itself, not a float off it
    # (2.0 is 1.9999999999999998 there): the estimators find the host means again under a
    # fitted sd unless it *is* the configured one, a second set of rounds for nothing
    return spread if math.isclose(fitted, spread, rel_tol=1e-9) else fitted


def _peaks(rows: Float) -> Float:
    """Each row's maximum, refined by the parabola through the best point and its two
    neighbours (the rows are smooth in the shift)."""
    k = np.clip(np.argmax(rows, axis=1), 1, rows.shape[1] - 2)
    i = np.arange(rows.shape[0])
    left, mid, right = rows[i, k - 1], rows[i, k], rows[i, k + 1]
    curve = left - 2.0 * mid + right
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.where(curve < 0.0, (right - left) ** 2 / (-8.0 * curve), 0.0)
    best = rows.max(axis=1)
    return np.asarray(np.maximum(best, mid + np.nan_to_num(lift)), dtype=np.float64)
