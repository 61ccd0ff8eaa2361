"""Change-rate estimation: λ (changes per second) per page from its fetch history.

Pure functions over flat arrays, vectorised over pages (no Python loop over pages). The
history is a list of *observations*, one per fetch after a page's first: the page's index,
the interval ``t`` in seconds since its previous fetch, and whether the content changed in
between (its digest differs). A page's changes are taken to be a Poisson process, so an
interval of t seconds shows a change with probability 1 − e^(−λt); several changes in one
interval look like one, which is why the naive X/T underestimates.

* ``estimate_regular``: n fetches at a regular interval I, X of which saw a change — Cho &
  Garcia-Molina's λ̂ = −ln((n − X + 0.5)/(n + 0.5))/I, nearly unbiased, finite when X = n.
* ``estimate_irregular``: the usual case. The maximum a posteriori λ solving
  Σ_changed t_j/(e^(λt_j) − 1) + a/λ = Σ_unchanged t_j + t̄/2 + b for a gamma prior worth
  ``a`` pseudo-changes seen over ``b`` seconds (:class:`Prior`); without a prior that is the
  likelihood equation with Cho & Garcia-Molina's correction, half an unchanged interval of
  the page's mean length t̄ (for regular intervals exactly their estimator: nearly unbiased
  and finite when every fetch changed). Solved for all pages at once by Newton's method,
  which converges monotonically from a lower bound (the left side is convex in λ).
* ``estimate_from_last_modified``: when a host's Last-Modified values are trustworthy
  (``last_modified_consistent``), each changed interval shows the time of its last change, so
  the process is observed over the quiet time T that follows: λ̂ = (X + a)/(T + b).
* ``host_prior``: the prior for each page, pooled per host, each host shrunk towards the
  pooled global rate, so that a page with little history starts from its host's rate and
  moves to its own as evidence grows.
* ``estimate_log_normal``: the maximum a posteriori ln λ under a normal prior on ln λ
  (:class:`LogNormalPrior`), from the same observations, with Last-Modified change times where
  they are trusted. The gamma prior above is worth pseudo-exposure: one pseudo-change at a
  host's rate counts as 1/rate seconds without a change, which drags a page that changes a
  hundred times faster than its host mates down to near their rate. Real change rates spread
  over orders of magnitude within a host, and a prior in log space lets the page's own
  evidence win: a page that changed before every fetch climbs as far as its intervals allow.
* ``log_normal_host_prior``: that prior's means by empirical Bayes: each host's mean of its
  pages' ln λ̂, shrunk towards the global mean, iterated with the estimates.
* ``estimate_pages``: all of the above, per page (log-normal by default; ``model="gamma"``
  for the gamma prior).

Every estimate carries ``n_eff``, its information expressed as a number of directly observed
changes (λ̂² times the observed information; the relative standard error is 1/√n_eff; an
interval with a change counts as at most one), and a confidence interval.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaincinv, ndtri

from refresher.refresh._static import static_probability

__all__ = [
    "DEFAULT_SPREAD",
    "MODELS",
    "Estimate",
    "LogNormalPrior",
    "Method",
    "Prior",
    "estimate_from_last_modified",
    "estimate_irregular",
    "estimate_log_normal",
    "estimate_pages",
    "estimate_regular",
    "host_prior",
    "last_modified_consistent",
    "log_normal_host_prior",
]

#: the priors ``estimate_pages`` knows, the default first (``[estimate] model`` reads these)
MODELS = ("log-normal", "gamma")
#: the log-normal prior's default sd of ln λ (natural-log units; ``[estimate] spread``)
DEFAULT_SPREAD = 2.0

Float = NDArray[np.float64]
Index = NDArray[np.intp]
Mask = NDArray[np.bool_]

_NEWTON_STEPS = 100  # the iteration stops as soon as every page has converged
_BLOCK = 1 << 20  # observations per vectorised block
_RTOL = 1e-12


class Method(enum.IntEnum):
    """How a page's estimate was made (``Estimate.method``)."""

    PRIOR = 0  # no observation: the prior's rate
    REGULAR = 1  # Cho & Garcia-Molina's estimator for regular intervals
    IRREGULAR = 2  # maximum a posteriori from intervals with or without a change
    LAST_MODIFIED = 3  # change times from trustworthy Last-Modified headers


@dataclass(frozen=True, slots=True, kw_only=True)
class Prior:
    """A gamma prior on λ as pseudo-observations: ``changes`` changes seen over ``exposure``
    seconds, per page (arrays of the same length) — its rate is changes/exposure and its
    weight ``changes``: a prior of strength 1 counts as much as one observed change."""

    changes: Float
    exposure: Float  # seconds

    @property
    def rate(self) -> Float:
        """changes/exposure, changes per second (NaN where both are 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            rate: Float = self.changes / self.exposure
        return rate

    @classmethod
    def from_rate(
        cls, rate: ArrayLike, *, strength: float = 1.0, pages: int | None = None
    ) -> Prior:
        """A prior centred on ``rate`` (changes per second, > 0) worth ``strength``
        pseudo-changes; a scalar rate is repeated for ``pages`` pages."""
        r = np.asarray(rate, dtype=np.float64)
        if pages is not None:
            r = np.broadcast_to(r, (pages,))
        if not (np.isfinite(r).all() and (r > 0.0).all()) or not strength > 0.0:
            raise ValueError("a prior needs finite rates > 0 (changes per second) and strength > 0")
        changes = np.full(r.shape, float(strength))
        return cls(changes=changes, exposure=changes / r)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormalPrior:
    """A normal prior on ln λ per page: ``mean`` in ln(changes per second) (an array, one per
    page), ``sd`` in natural-log units (2: a page's rate is within a factor e² ≈ 7.4 of its
    host's typical rate with probability 0.68, within 50× with 0.95)."""

    mean: Float
    sd: float = 2.0

    def __post_init__(self) -> None:
        if not np.isfinite(np.asarray(self.mean)).all() or not self.sd > 0.0:
            raise ValueError(
                "a log-normal prior needs finite means (ln of changes per second) and sd > 0"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Per-page change-rate estimates; rates in changes per second.

    ``lower``/``upper`` bound a two-sided confidence interval (95 % unless asked otherwise);
    ``n_eff`` is the information as directly observed changes (relative standard error
    1/√n_eff), ``fetches`` the number of observations (intervals) used, ``method`` a
    :class:`Method` code per page."""

    rate: Float
    lower: Float
    upper: Float
    n_eff: Float
    fetches: NDArray[np.int64]
    method: NDArray[np.uint8]
    #: the log-normal prior's mean of ln λ per page (None for the gamma prior)
    prior_mean: Float | None = None
    #: the log-normal prior's sd of ln λ (natural-log units; None for the gamma prior)
    prior_sd: float | None = None

    def __len__(self) -> int:
        return int(self.rate.size)


# --- helpers --------------------------------------------------------------------------------


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return float(ndtri(0.5 + 0.5 * confidence))


def _sum(index: Index, values: ArrayLike, n: int) -> Float:
    return np.bincount(index, values, minlength=n).astype(np.float64, copy=False)


def _observations(
    page_index: ArrayLike, intervals: ArrayLike, changed: ArrayLike, n_pages: int
) -> tuple[Index, Float, Mask]:
    """Validate the flat history arrays; ValueError says what is wrong."""
    p = np.asarray(page_index)
    if p.ndim != 1 or not (p.size == 0 or np.issubdtype(p.dtype, np.integer)):
        raise ValueError("page_index must be a 1-D integer array, one entry per observation")
    p = p.astype(np.intp, copy=False)
    t = np.asarray(intervals, dtype=np.float64)
    c = np.asarray(changed, dtype=bool)
    if t.shape != p.shape or c.shape != p.shape:
        raise ValueError("page_index, intervals and changed must have one entry per observation")
    if p.size and (p.min() < 0 or p.max() >= n_pages):
        raise ValueError(f"page_index must lie in [0, {n_pages}) (n_pages)")
    if t.size and not (t.min() > 0.0 and t.max() < np.inf):  # NaN fails both
        raise ValueError("intervals must be finite and > 0 seconds")
    return p, t, c


def _prior_arrays(prior: Prior, n: int) -> tuple[Float, Float]:
    a = np.broadcast_to(np.asarray(prior.changes, np.float64), (n,))
    b = np.broadcast_to(np.asarray(prior.exposure, np.float64), (n,))
    if not (np.isfinite(a).all() and np.isfinite(b).all() and (a >= 0).all() and (b >= 0).all()):
        raise ValueError("a prior's changes and exposure must be finite and ≥ 0")
    if ((a > 0) & (b <= 0)).any():
        raise ValueError("a prior with pseudo-changes needs an exposure > 0 seconds")
    return a, b


def _log_interval(
    rate: Float, n_eff: Float, z: float, exposure: Float, alpha: float
) -> tuple[Float, Float]:
    """λ̂·e^(±z/√n_eff); where nothing was seen (n_eff = 0), [0, −ln(α/2)/exposure]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.exp(z / np.sqrt(n_eff))
        lower = np.where(n_eff > 0.0, rate / spread, 0.0)
        upper = np.where(n_eff > 0.0, rate * spread, -math.log(alpha / 2.0) / exposure)
    return lower, upper


# --- the estimators ---------------------------------------------------------------------------


def estimate_regular(
    n: ArrayLike, changes: ArrayLike, interval: ArrayLike, *, confidence: float = 0.95
) -> Estimate:
    """Cho & Garcia-Molina's estimator for ``n`` fetches ``interval`` seconds apart, of which
    ``changes`` saw a change (arrays broadcast): λ̂ = −ln((n − X + 0.5)/(n + 0.5))/I.

    The interval is Wilson's score interval for p = 1 − e^(−λI), mapped to λ (its upper end is
    ∞ when every fetch saw a change). n_eff = n·(λ̂I)²/(e^(λ̂I) − 1)."""
    z = _z(confidence)
    nn, xx, ii = np.broadcast_arrays(
        np.asarray(n, np.float64), np.asarray(changes, np.float64), np.asarray(interval, np.float64)
    )
    if not ((nn >= 0).all() and (xx >= 0).all() and (xx <= nn).all()):
        raise ValueError("need 0 ≤ changes ≤ n fetches")
    if not (np.isfinite(ii).all() and (ii > 0).all()):
        raise ValueError("interval must be finite and > 0 seconds")
    rate = -np.log((nn - xx + 0.5) / (nn + 0.5)) / ii
    lam_i = rate * ii
    with np.errstate(invalid="ignore", divide="ignore"):
        n_eff = np.where(lam_i > 0.0, nn * lam_i * lam_i / np.expm1(lam_i), 0.0)
        p = np.where(nn > 0, xx / np.maximum(nn, 1.0), 0.0)
        z2n = z * z / np.maximum(nn, 1.0)
        centre = (p + 0.5 * z2n) / (1.0 + z2n)
        half = (
            z
            / (1.0 + z2n)
            * np.sqrt(p * (1.0 - p) / np.maximum(nn, 1.0) + 0.25 * z2n / np.maximum(nn, 1.0))
        )
        p_lo = np.clip(centre - half, 0.0, 1.0)
        p_hi = np.clip(centre + half, 0.0, 1.0)
        lower = -np.log1p(-p_lo) / ii
        upper = np.where(p_hi < 1.0, -np.log1p(-np.minimum(p_hi, 1.0 - 1e-16)) / ii, np.inf)
    lower = np.where(nn > 0, lower, 0.0)
    upper = np.where(nn > 0, upper, np.inf)
    method = np.where(nn > 0, Method.REGULAR, Method.PRIOR).astype(np.uint8)
    return Estimate(
        rate=np.asarray(rate, np.float64).ravel(),
        lower=np.asarray(lower, np.float64).ravel(),
        upper=np.asarray(upper, np.float64).ravel(),
        n_eff=np.asarray(n_eff, np.float64).ravel(),
        fetches=nn.astype(np.int64).ravel(),
        method=method.ravel(),
    )


def _blocks(n: int) -> list[slice]:
    """Observation blocks small enough that their temporaries recycle memory (page-sized
    arrays of ten million entries cost more to fault in than to compute with)."""
    return [slice(start, start + _BLOCK) for start in range(0, n, _BLOCK)]


def _map_rates(
    group: Index, t: Float, c: Mask, n_groups: int, a: Float, b: Float
) -> tuple[Float, Float, Float, Float, NDArray[np.int64]]:
    """MAP rates for groups of observations under gamma priors (a pseudo-changes over b s).

    Returns (λ̂, n_eff, X changes, quiet exposure U + b in seconds, observations)."""
    fetches = np.bincount(group, minlength=n_groups).astype(np.int64)
    changes, changed_time, total_time = (np.zeros(n_groups) for _ in range(3))
    for block in _blocks(t.size):
        g, tt, cc = group[block], t[block], c[block]
        changes += _sum(g, cc, n_groups)
        total_time += _sum(g, tt, n_groups)
        changed_time += _sum(g[cc], tt[cc], n_groups)
    # Cho & Garcia-Molina's +0.5: half an unchanged interval of the group's mean length. It
    # removes most of the likelihood's upward bias (for regular intervals the result is
    # exactly their estimator) and keeps λ̂ finite when every interval saw a change.
    mean_interval = total_time / np.maximum(fetches, 1)
    quiet = total_time - changed_time + 0.5 * mean_interval + b
    evidence = changes + a
    # φ(s) = s/(e^s − 1) ≥ 1 − s/2, so this starts at or below the root, and Newton on the
    # convex, decreasing h(λ) = Σ_changed φ(λt) + a − λ·quiet climbs to it monotonically.
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(evidence > 0.0, evidence / (quiet + 0.5 * changed_time), 0.0)
    live = evidence > 0.0
    gc, tc = group[c], t[c]
    g_it, t_it = gc, tc  # the changed observations of groups still iterating
    for _ in range(_NEWTON_STEPS):
        h = a - rate * quiet
        dh = -quiet
        for block in _blocks(t_it.size):
            g, tt = g_it[block], t_it[block]
            phi, dphi = _phi(rate[g] * tt)
            h += _sum(g, phi, n_groups)
            dh += _sum(g, tt * dphi, n_groups)
        rate, live = _newton_step(rate, h, dh, live)
        if not live.any():
            break
        keep = live[g_it]
        if keep.mean() < 0.5:  # most groups are done: iterate on the rest only
            g_it, t_it = g_it[keep], t_it[keep]
    n_eff = a.copy()
    for block in _blocks(tc.size):
        g = gc[block]
        n_eff += _sum(g, _psi(rate[g] * tc[block]), n_groups)
    n_eff = np.where(rate > 0.0, n_eff, 0.0)
    return rate, n_eff, changes, quiet, fetches


def _newton_step(rate: Float, h: Float, dh: Float, live: Mask) -> tuple[Float, Mask]:
    """One Newton step on the MAP condition h(λ) = 0 of the groups still ``live``, never below
    zero; a group whose step falls under the relative tolerance is done."""
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(live, -h / dh, 0.0)
    step = np.where(np.isfinite(step), np.maximum(step, 0.0), 0.0)
    rate = rate + step
    return rate, live & (step > _RTOL * rate)


def _phi(s: Float) -> tuple[Float, Float]:
    """φ(s) = s/(e^s − 1) and φ'(s), with φ(0) = 1, φ'(0) = −1/2."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.expm1(s)
        phi = np.where(s > 0.0, s / e, 1.0)
        dphi = np.where(s > 1e-6, (e - s * (e + 1.0)) / (e * e), -0.5 + s / 6.0)
    return phi, np.where(np.isfinite(dphi), dphi, 0.0)


def _psi(s: Float) -> Float:
    """ψ(s) = s²·e^s/(e^s − 1)²: the information of one changed interval, in changes."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        psi = np.where(s > 0.0, s * s / (np.expm1(s) * -np.expm1(-s)), 1.0)
    return np.where(np.isfinite(psi), psi, 0.0)


def _default_prior(group: Index, t: Float, c: Mask, n_pages: int, strength: float = 0.5) -> Prior:
    """The pooled rate of all observations, worth ``strength`` pseudo-changes per page."""
    if t.size == 0:
        raise ValueError(
            "no history and no prior: pass prior=Prior.from_rate(...) (e.g. from configuration)"
        )
    return Prior.from_rate(_pooled_rate(t, c, None), strength=strength, pages=n_pages)


def _pooled_rate(t: Float, c: Mask, prior: Prior | None) -> float:
    """The MAP rate of all observations together; without a prior, half a pseudo-change keeps
    it above 0 when nothing ever changed."""
    if prior is None:
        a, b = np.array([0.5]), np.array([0.0])
    else:
        a, b = _prior_arrays(prior, 1)
    pooled, *_ = _map_rates(np.zeros(t.size, np.intp), t, c, 1, a, b)
    if not pooled[0] > 0.0:
        raise ValueError("the pooled rate is 0: give the global prior some pseudo-changes")
    return float(pooled[0])


def estimate_irregular(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    n_pages: int,
    *,
    prior: Prior | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """The maximum a posteriori λ per page from intervals (seconds) with or without a change.

    ``prior`` (per page; see :func:`host_prior`) defaults to the pooled rate of all
    observations worth half a change, so that a page that never changed gets a small rate,
    not 0, and one that always changed a finite one. Pages without observations get the
    prior's rate (method PRIOR). The interval is λ̂·e^(±z/√n_eff)."""
    z = _z(confidence)
    p, t, c = _observations(page_index, intervals, changed, n_pages)
    if prior is None:
        prior = _default_prior(p, t, c, n_pages)
    a, b = _prior_arrays(prior, n_pages)
    rate, n_eff, _, quiet, fetches = _map_rates(p, t, c, n_pages, a, b)
    lower, upper = _log_interval(rate, n_eff, z, quiet, 1.0 - confidence)
    method = np.where(fetches > 0, Method.IRREGULAR, Method.PRIOR).astype(np.uint8)
    return Estimate(
        rate=rate, lower=lower, upper=upper, n_eff=n_eff, fetches=fetches, method=method
    )


def estimate_from_last_modified(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    since_change: ArrayLike,
    n_pages: int,
    *,
    prior: Prior | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """λ̂ = (X + a)/(T + b) from change times given by trustworthy Last-Modified headers.

    ``since_change`` is, per observation, the seconds from the Last-Modified time to the fetch
    (used where ``changed``; clipped to the interval). The quiet time T is every unchanged
    interval plus, for a changed one, the time after its last change — the Poisson process is
    fully observed there. The interval is Garwood's (gamma quantiles of X + a)."""
    _z(confidence)  # validates the level; the gamma quantiles need no z
    p, t, c = _observations(page_index, intervals, changed, n_pages)
    since = np.asarray(since_change, dtype=np.float64)
    if since.shape != t.shape:
        raise ValueError("since_change must have one entry per observation")
    if (c & ~np.isfinite(since)).any():
        raise ValueError("since_change must be given (seconds ≥ 0) for every changed interval")
    if prior is None:
        prior = _default_prior(p, t, c, n_pages)
    a, b = _prior_arrays(prior, n_pages)
    fetches = np.bincount(p, minlength=n_pages).astype(np.int64)
    evidence = a.copy()
    exposure = b.copy()
    for block in _blocks(t.size):
        pp, tt, cc = p[block], t[block], c[block]
        evidence += _sum(pp, cc, n_pages)
        # quiet time: all of an unchanged interval, the part after the last change otherwise
        exposure += _sum(
            pp, np.where(cc, np.clip(np.nan_to_num(since[block]), 0.0, tt), tt), n_pages
        )
    alpha = 1.0 - confidence
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(evidence > 0.0, evidence / exposure, 0.0)
        lower = np.where(
            evidence > 0.0, gammaincinv(np.maximum(evidence, 1e-300), alpha / 2.0) / exposure, 0.0
        )
        upper = gammaincinv(evidence + 1.0, 1.0 - alpha / 2.0) / exposure
    method = np.where(fetches > 0, Method.LAST_MODIFIED, Method.PRIOR).astype(np.uint8)
    return Estimate(
        rate=rate, lower=lower, upper=upper, n_eff=evidence, fetches=fetches, method=method
    )


def last_modified_consistent(
    host_index: ArrayLike,
    fetched_at: ArrayLike,
    previous_fetched_at: ArrayLike,
    last_modified: ArrayLike,
    previous_last_modified: ArrayLike,
    changed: ArrayLike,
    n_hosts: int,
    *,
    tolerance: float = 1.0,
    min_changes: int = 1,
) -> Mask:
    """Per host: can its Last-Modified values be trusted as change times?

    One entry per observation (a fetch and the one before it of the same page), times in
    seconds since the epoch, NaN where a response had no Last-Modified. A host is consistent
    when every observation has both values, none lies in the future (beyond ``tolerance``
    seconds of clock skew), the value moved only when the content did, a changed page's value
    lies after the previous fetch (or within ``tolerance`` of it: see
    :func:`refresher.store.last_modified_agrees`), and at least ``min_changes`` changes were
    seen."""
    h = np.asarray(host_index).astype(np.intp, copy=False)
    now, before = np.asarray(fetched_at, np.float64), np.asarray(previous_fetched_at, np.float64)
    lm, lm_before = (
        np.asarray(last_modified, np.float64),
        np.asarray(previous_last_modified, np.float64),
    )
    c = np.asarray(changed, dtype=bool)
    if not all(x.shape == h.shape for x in (now, before, lm, lm_before, c)):
        raise ValueError("every argument but n_hosts needs one entry per observation")
    if h.size and (h.min() < 0 or h.max() >= n_hosts):
        raise ValueError(f"host_index must lie in [0, {n_hosts}) (n_hosts)")
    # imported here: the store's package imports the configuration, which imports this module
    from refresher.store._change_stats import last_modified_agrees

    ok = last_modified_agrees(now, before, lm, lm_before, c, tolerance=tolerance)
    bad = np.bincount(h, ~ok, minlength=n_hosts) > 0
    seen = np.bincount(h, minlength=n_hosts) > 0
    changes = np.bincount(h, c, minlength=n_hosts)
    return np.asarray(seen & ~bad & (changes >= min_changes), dtype=bool)


def host_prior(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    page_host: ArrayLike,
    n_hosts: int,
    *,
    global_prior: Prior | None = None,
    host_strength: float = 2.0,
    page_strength: float = 1.0,
) -> Prior:
    """A prior per page: its host's rate, worth ``page_strength`` pseudo-changes.

    Each host's rate is the MAP of all its pages' observations pooled, under a prior at the
    global pooled rate worth ``host_strength`` pseudo-changes; the global rate is the MAP of
    everything under ``global_prior`` (one entry; default: half a pseudo-change). A host
    without history gets the global rate."""
    host_of = np.asarray(page_host).astype(np.intp, copy=False)
    n_pages = host_of.size
    p, t, c = _observations(page_index, intervals, changed, n_pages)
    if host_of.size and (host_of.min() < 0 or host_of.max() >= n_hosts):
        raise ValueError(f"page_host must lie in [0, {n_hosts}) (n_hosts)")
    if global_prior is None and t.size == 0:
        raise ValueError("no history and no global_prior: pass global_prior=Prior.from_rate(...)")
    hp = Prior.from_rate(_pooled_rate(t, c, global_prior), strength=host_strength, pages=n_hosts)
    host_rate, *_ = _map_rates(host_of[p], t, c, n_hosts, hp.changes, hp.exposure)
    return Prior.from_rate(host_rate[host_of], strength=page_strength)


def _timed(c: Mask, t: Float, since_change: ArrayLike | None) -> tuple[Mask, Float]:
    """Which changed observations carry a change time, and the quiet time after it (seconds,
    clipped to the interval)."""
    if since_change is None:
        return np.zeros(c.shape, dtype=bool), np.zeros(c.shape)
    since = np.asarray(since_change, dtype=np.float64)
    if since.shape != t.shape:
        raise ValueError("since_change must have one entry per observation")
    timed = c & np.isfinite(since)
    if (since[timed] < 0.0).any():
        raise ValueError("since_change must be ≥ 0 seconds (NaN where unknown)")
    return timed, np.where(timed, np.minimum(since, t), 0.0)


def _last_modified_pages(
    p: Index,
    c: Mask,
    n_pages: int,
    since_change: ArrayLike | None,
    trusted_hosts: ArrayLike | None,
    page_host: ArrayLike | None,
) -> tuple[Float, Mask] | None:
    """(``since_change`` as an array, per page whether its change times are used: its host is
    trusted and every changed interval of the page has one); None when none are given."""
    if since_change is None or trusted_hosts is None or page_host is None:
        return None
    since = np.asarray(since_change, np.float64)
    if since.shape != c.shape:
        raise ValueError("since_change must have one entry per observation")
    host_of = np.asarray(page_host).astype(np.intp, copy=False)
    trusted = np.asarray(trusted_hosts, dtype=bool)[host_of]
    missing = np.bincount(p, c & ~np.isfinite(since), minlength=n_pages) > 0
    return since, trusted & ~missing


def estimate_log_normal(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    n_pages: int,
    *,
    prior: LogNormalPrior,
    since_change: ArrayLike | None = None,
    start: ArrayLike | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """The maximum a posteriori λ per page under a normal prior on θ = ln λ.

    The log-likelihood of an unchanged interval t is −λt; of a changed one ln(1 − e^(−λt)),
    or, where ``since_change`` gives the seconds A from the change to the fetch (a trusted
    Last-Modified; NaN where unknown), ln λ − λA. With the prior's −(θ − m)²/2sd² the
    objective is concave in θ, so a safeguarded Newton iteration (bisection inside a
    bracket) converges for every page at once. ``n_eff`` is the observed information in θ
    without the prior (changes' worth; 1/√n_eff is the relative standard error); the
    interval is θ̂ ± z/√(information with the prior), so a page without observations gets
    the prior's m ± z·sd. Method: PRIOR without observations, LAST_MODIFIED when it changed
    and every change was timed, IRREGULAR otherwise. ``start``: rates (changes per second)
    to start the iteration from, e.g. an earlier estimate (default: Cho's estimator)."""
    z = _z(confidence)
    p, t, c = _observations(page_index, intervals, changed, n_pages)
    timed, quiet_after = _timed(c, t, since_change)
    return _log_normal_map(p, t, c, timed, quiet_after, n_pages, prior, start, z)


def _log_normal_map(
    p: Index,
    t: Float,
    c: Mask,
    timed: Mask,
    quiet_after: Float,
    n_pages: int,
    prior: LogNormalPrior,
    start: ArrayLike | None,
    z: float,
) -> Estimate:
    """:func:`estimate_log_normal` on validated observations (see :func:`_timed`)."""
    m = np.broadcast_to(np.asarray(prior.mean, dtype=np.float64), (n_pages,))
    inv_var = 1.0 / prior.sd**2
    fetches = np.bincount(p, minlength=n_pages).astype(np.int64)
    # −λ·quiet and ln λ·timed_changes are closed-form per page; only untimed changed
    # intervals need a sum per iteration.
    quiet = _sum(p, np.where(c, quiet_after, t), n_pages)
    timed_changes = _sum(p, timed, n_pages)
    untimed = c & ~timed
    g_it, t_it = p[untimed], t[untimed]
    if start is None:
        # Near the root, where Newton is quick: far above it, on the e^θ side, it creeps down
        # by about 1 per step. (X + ½)/(quiet + ½·untimed changed time) is Cho's estimator
        # for regular intervals.
        changes = timed_changes + _sum(g_it, np.ones(g_it.size), n_pages)
        with np.errstate(divide="ignore"):  # pages without observations keep the prior's
            start = (changes + 0.5) / (quiet + 0.5 * _sum(g_it, t_it, n_pages))
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.log(np.broadcast_to(np.asarray(start, np.float64), (n_pages,)))
    theta = np.where(np.isfinite(guess) & (fetches > 0), np.clip(guess, -59.0, 24.0), m)
    lo, hi = np.full(n_pages, -60.0), np.full(n_pages, 25.0)  # λ from 1e-26 to 7e10 /s
    live = fetches > 0
    for _ in range(_NEWTON_STEPS):
        grad, curv = _log_terms(theta, g_it, t_it, n_pages, timed_changes, quiet)
        grad -= (theta - m) * inv_var
        curv -= inv_var
        lo = np.where(live & (grad > 0.0), theta, lo)
        hi = np.where(live & (grad <= 0.0), theta, hi)
        step = np.clip(-grad / curv, -4.0, 4.0)
        nxt = theta + step
        # strictly inside, or tiny (at the root θ is itself an end of the bracket): a step
        # clipped to ±4 that lands exactly on the other end cycles between the ends
        # (refresher.refresh._estimate_stats._inside)
        nxt = np.where(((nxt > lo) & (nxt < hi)) | (np.abs(step) <= 1e-8), nxt, 0.5 * (lo + hi))
        step = np.where(live, nxt - theta, 0.0)
        theta = theta + step
        live &= np.abs(step) > 1e-10
        if not live.any():
            break
        keep = live[g_it]
        if keep.size and keep.mean() < 0.5:  # most pages are done: iterate on the rest only
            g_it, t_it = g_it[keep], t_it[keep]
    _, curv = _log_terms(theta, p[untimed], t[untimed], n_pages, timed_changes, quiet)
    n_eff = np.maximum(-curv, 0.0)
    half = z / np.sqrt(n_eff + inv_var)
    method = np.where(
        fetches == 0,
        Method.PRIOR,
        np.where(
            (_sum(p, untimed, n_pages) == 0) & (timed_changes > 0),
            Method.LAST_MODIFIED,
            Method.IRREGULAR,
        ),
    ).astype(np.uint8)
    return Estimate(
        rate=np.exp(theta),
        lower=np.exp(theta - half),
        upper=np.exp(theta + half),
        n_eff=n_eff,
        fetches=fetches,
        method=method,
    )


def _log_terms(
    theta: Float, g: Index, t: Float, n: int, timed_changes: Float, quiet: Float
) -> tuple[Float, Float]:
    """The log-likelihood's first and second derivatives in θ = ln λ, per page, without the
    prior."""
    lam = np.exp(theta)
    grad = timed_changes - lam * quiet
    curv = -lam * quiet
    for block in _blocks(t.size):
        gg, tt = g[block], t[block]
        u = lam[gg] * tt
        phi, dphi = _phi(u)
        grad += _sum(gg, phi, n)  # d/dθ ln(1 − e^(−u)) = u/(e^u − 1)
        curv += _sum(gg, u * dphi, n)
    return grad, curv


def _host_strength(
    theta: Float, member: Float, host_of: Index, total: Float, count: Float, n_hosts: int
) -> float:
    """Within-host over between-host variance of ln λ̂, in pseudo-pages (0.1 … 1000);
    ``member``: how much each page counts (1 or 0 for observed or not, or the probability
    that it changes at all)."""
    seen = count > 0.5
    if seen.sum() < 2:
        return 0.1  # one host: nothing to borrow from, its own mean is the global one
    host_mean = np.where(seen, total / np.maximum(count, 0.5), 0.0)
    dof = max(float(count[seen].sum() - seen.sum()), 1.0)
    # Σ member·(θ − host mean)² per host as Σ member·θ² − mean·Σ member·θ: one pass over
    # the pages instead of a residual per page (the same sum to ~1e-14)
    squares = np.bincount(host_of, member * theta * theta, minlength=n_hosts)
    within = float((squares - total * host_mean)[seen].sum()) / dof
    between = float(host_mean[seen].var(ddof=1)) - within * float(np.mean(1.0 / count[seen]))
    if not between > 0.0:
        return 1000.0
    return float(np.clip(within / between, 0.1, 1000.0))


def log_normal_host_prior(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    page_host: ArrayLike,
    n_hosts: int,
    *,
    since_change: ArrayLike | None = None,
    sd: float = 2.0,
    host_strength: float | None = None,
    rounds: int = 3,
    start: ArrayLike | None = None,
) -> LogNormalPrior:
    """Empirical Bayes means for :class:`LogNormalPrior`: per host, the mean ln λ̂ of its
    observed pages, shrunk towards the mean over all observed pages by ``host_strength``
    pseudo-pages; ``rounds`` times, each estimating under the previous round's prior (the
    first under the pooled global rate). A host without history gets the global mean.

    ``host_strength`` defaults to the ratio of the spread within hosts to the spread between
    them (both variances of ln λ̂, the latter less what the within spread explains of it):
    hosts that differ little borrow a lot from each other, hosts that differ a lot little.
    ``start``: rates to start the first round's iteration from (e.g. the last solve's)."""
    host_of = np.asarray(page_host).astype(np.intp, copy=False)
    p, t, c = _observations(page_index, intervals, changed, host_of.size)
    timed, quiet_after = _timed(c, t, since_change)
    prior, _ = _log_normal_rounds(
        p, t, c, timed, quiet_after, host_of, n_hosts, sd, host_strength, rounds, start
    )
    return prior


def _log_normal_rounds(
    p: Index,
    t: Float,
    c: Mask,
    timed: Mask,
    quiet_after: Float,
    host_of: Index,
    n_hosts: int,
    sd: float,
    host_strength: float | None,
    rounds: int,
    start: ArrayLike | None,
    mixture: bool = False,
    real: Mask | None = None,
) -> tuple[LogNormalPrior, Float]:
    """:func:`log_normal_host_prior` on validated observations (see :func:`_timed`), and the
    last round's rates (changes per second), a close start for the final estimate.

    ``mixture``: the prior is that of the pages that change at all. Each page's ln λ̂ counts
    towards its host's mean with the probability that it changes, 1 − P₀
    (:func:`refresher.refresh._static.static_probability` under the previous round's prior),
    so that pages which never change, whose λ̂ only falls like 1/T, do not drag the centre
    of the changing ones down (which in turn made a quiet page look like a slow changing one
    rather than a static one)."""
    n_pages = host_of.size
    if host_of.size and (host_of.min() < 0 or host_of.max() >= n_hosts):
        raise ValueError(f"page_host must lie in [0, {n_hosts}) (n_hosts)")
    if t.size == 0:
        raise ValueError("no history: a log-normal prior needs observations to centre on")
    if (host_strength is not None and not host_strength > 0.0) or rounds < 1:
        raise ValueError("host_strength must be > 0 pages and rounds ≥ 1")
    # The first round's centre: Cho's estimator on everything pooled (a start, not a result).
    pooled = (float(c.sum()) + 0.5) / (float(t.sum()) - 0.5 * float(t[c].sum()))
    means = np.full(n_pages, math.log(pooled))
    observed = np.bincount(p, minlength=n_pages) > 0
    rates = None if start is None else np.asarray(start, np.float64)
    z = _z(0.95)  # the rounds' intervals are not used
    for _ in range(rounds):
        prior = LogNormalPrior(mean=means, sd=sd)
        est = _log_normal_map(p, t, c, timed, quiet_after, n_pages, prior, rates, z)
        rates = est.rate
        theta = np.log(est.rate)
        member = observed.astype(np.float64)
        if mixture:
            p0, _ = _static_of(p, t, c, real, n_pages, means, sd)
            member *= 1.0 - p0
        if not member.sum() > 0.0:
            member = observed.astype(np.float64)
        overall = float((theta * member).sum() / member.sum())
        total = _sum(host_of, theta * member, n_hosts)
        count = _sum(host_of, member, n_hosts)
        strength = host_strength
        if strength is None:
            strength = _host_strength(theta, member, host_of, total, count, n_hosts)
        host_mean = (total + strength * overall) / (count + strength)
        means = host_mean[host_of]
    assert rates is not None  # rounds ≥ 1
    return LogNormalPrior(mean=means, sd=sd), rates


def _static_of(
    p: Index, t: Float, c: Mask, real: Mask | None, n_pages: int, mean: ArrayLike, sd: float
) -> tuple[Float, float]:
    """:func:`static_probability` from the observations in ``real`` (all when None): a first
    copy's Last-Modified says when the page last changed or was made, and a changing page
    shows a quiet time there as surely as a static one, so it says nothing about whether a
    page changes at all."""
    if real is not None:
        p, t, c = p[real], t[real], c[real]
    return static_probability(p, t, c, n_pages, prior_mean=mean, sd=sd)


def _fitted_spread(
    observed: tuple[Index, Float, Mask, Mask, Float],
    n_pages: int,
    prior: LogNormalPrior,
    mixture: bool,
    real: Mask | None = None,
) -> float:
    """:func:`refresher.refresh._spread.fit_spread` on validated observations (page, interval,
    changed, timed, quiet after the change: see :func:`_timed`), the changed intervals without
    a change time as the statistics estimator's two-point rule."""
    # imported here: the statistics estimator imports this module
    from refresher.refresh._estimate_stats import two_point_nodes
    from refresher.refresh._spread import SpreadEvidence, fit_spread, sample

    p, t, c, timed, quiet_after = observed
    untimed = c & ~timed
    lt = np.log(t[untimed])
    pu = p[untimed]
    count = _sum(pu, np.ones(pu.size), n_pages)
    moments = np.stack([_sum(pu, lt**k, n_pages) for k in (1, 2, 3)])
    t0, t1, share = two_point_nodes(count, moments)
    seen = sample(np.flatnonzero(np.bincount(p, minlength=n_pages) > 0))
    mean = np.broadcast_to(np.asarray(prior.mean, dtype=np.float64), (n_pages,))[seen]
    exposure = _sum(p, t if real is None else np.where(real, t, 0.0), n_pages)[seen]
    changed = (_sum(p, c, n_pages) > 0)[seen]
    evidence = SpreadEvidence(
        quiet=_sum(p, np.where(c, quiet_after, t), n_pages)[seen],
        timed=_sum(p, timed, n_pages)[seen],
        t0=t0[seen],
        w0=(count * share)[seen],
        t1=t1[seen],
        w1=(count * (1.0 - share))[seen],
        changed=changed,
        mean=mean,
    )
    pi = 0.0
    if mixture:  # the share of static pages among the sampled pages
        some = np.flatnonzero(exposure > 0.0)
        _, pi = static_probability(
            some, exposure[some], changed[some], seen.size, prior_mean=mean, sd=prior.sd
        )
    return fit_spread(evidence, spread=prior.sd, static_share=pi)


def estimate_pages(
    page_index: ArrayLike,
    intervals: ArrayLike,
    changed: ArrayLike,
    n_pages: int,
    *,
    page_host: ArrayLike | None = None,
    n_hosts: int = 0,
    since_change: ArrayLike | None = None,
    trusted_hosts: ArrayLike | None = None,
    prior: Prior | None = None,
    model: str = MODELS[0],
    spread: float = DEFAULT_SPREAD,
    confidence: float = 0.95,
    mixture: bool = False,
    fit_spread: bool = False,
    first_copy: ArrayLike | None = None,
) -> Estimate:
    """The estimate for every page, choosing the method per page.

    A page whose host is in ``trusted_hosts`` (bool per host, see
    ``last_modified_consistent``) and whose every changed interval has a ``since_change`` uses
    its Last-Modified change times; the others only whether each interval changed.

    ``model="log-normal"`` (the default): :func:`estimate_log_normal` under
    :func:`log_normal_host_prior` with sd ``spread`` (natural-log units). ``model="gamma"``:
    the gamma-prior MAP (:func:`estimate_irregular`, :func:`estimate_from_last_modified`)
    under ``prior``, which defaults to :func:`host_prior` when ``page_host`` is given, else
    the pooled global rate.

    ``mixture`` (log-normal only): centre the prior on the pages that change at all, each
    page counting with its probability of changing (see :func:`_log_normal_rounds`); the
    plan then weighs each page by that probability (:mod:`refresher.refresh._static`).
    ``fit_spread`` (log-normal only): the prior's sd is fitted to the pages
    (:func:`refresher.refresh._spread.fit_spread`, around ``spread``) and the host means
    found again under it before the final estimate; ``Estimate.prior_sd`` says which sd was
    used. ``first_copy`` (bool per
    observation): the observation is a first copy's quiet time from its Last-Modified, used
    for the rate but not for whether the page changes at all (:func:`_static_of`)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, not {model!r}")
    obs = _observations(page_index, intervals, changed, n_pages)
    # per page: are its Last-Modified change times used?
    usable = _last_modified_pages(obs[0], obs[2], n_pages, since_change, trusted_hosts, page_host)
    if model == "gamma":
        return _gamma_pages(obs, n_pages, usable, page_host, n_hosts, prior, confidence)
    if prior is not None:
        raise ValueError("prior is a gamma prior: pass model='gamma' with it")
    options = (spread, confidence, mixture, fit_spread, first_copy)
    return _log_normal_pages(obs, n_pages, usable, page_host, n_hosts, *options)


def _log_normal_pages(
    obs: tuple[Index, Float, Mask],
    n_pages: int,
    usable: tuple[Float, Mask] | None,
    page_host: ArrayLike | None,
    n_hosts: int,
    spread: float,
    confidence: float,
    mixture: bool,
    fit_spread: bool,
    first_copy: ArrayLike | None,
) -> Estimate:
    """:func:`estimate_pages` with ``model="log-normal"``."""
    p, t, c = obs
    # NaN where a page's change times are not used
    since = None if usable is None else np.where(usable[1][p], usable[0], np.nan)
    hosts = np.zeros(n_pages, np.intp) if page_host is None else np.asarray(page_host)
    timed, quiet_after = _timed(c, t, since)
    host_of = hosts.astype(np.intp, copy=False)
    real = None if first_copy is None else ~np.asarray(first_copy, dtype=bool)
    if real is not None and real.shape != t.shape:
        raise ValueError("first_copy must have one entry per observation")

    def centres(sd: float) -> tuple[LogNormalPrior, Float]:
        """The host means (three rounds from the pooled rate) under a prior of sd ``sd``."""
        seen = (p, t, c, timed, quiet_after, host_of, max(n_hosts, 1))
        return _log_normal_rounds(*seen, sd, None, 3, None, mixture, real)

    ln_prior, rates = centres(spread)
    if fit_spread:
        sd = _fitted_spread((p, t, c, timed, quiet_after), n_pages, ln_prior, mixture, real)
        # The host means again, under the prior the estimate uses: means found under a
        # wide sd and kept under a narrow one held each page near a centre found for
        # another prior. On a web of rates spread 0.5 (2–3 intervals a page) the rounds
        # under sd 2 left its hosts with honest Last-Modified up to 1.7 lower in ln λ̂
        # than the others at 150 s, their true rates alike (a first copy's quiet time
        # counts towards the rate without the change that ended it), and the plan
        # split the budget by host; found again from the pooled rate under the fitted
        # sd, the hosts' means stay near it until the pages tell them apart.
        if sd != spread:
            ln_prior, rates = centres(sd)
    z = _z(confidence)
    est = _log_normal_map(p, t, c, timed, quiet_after, n_pages, ln_prior, rates, z)
    return replace(
        est, prior_mean=np.asarray(ln_prior.mean, dtype=np.float64), prior_sd=ln_prior.sd
    )


def _gamma_pages(
    obs: tuple[Index, Float, Mask],
    n_pages: int,
    usable: tuple[Float, Mask] | None,
    page_host: ArrayLike | None,
    n_hosts: int,
    prior: Prior | None,
    confidence: float,
) -> Estimate:
    """:func:`estimate_pages` with ``model="gamma"``."""
    p, t, c = obs
    if prior is None and page_host is not None:
        prior = host_prior(p, t, c, page_host, n_hosts)
    if prior is None:
        prior = _default_prior(p, t, c, n_pages)
    result = estimate_irregular(p, t, c, n_pages, prior=prior, confidence=confidence)
    if usable is None or not usable[1].any():
        return result
    since, use = usable
    keep = use[p]
    lm = estimate_from_last_modified(
        p[keep],
        t[keep],
        c[keep],
        np.where(keep, since, 0.0)[keep],
        n_pages,
        prior=prior,
        confidence=confidence,
    )
    pick = use & (lm.fetches > 0)
    return Estimate(
        rate=np.where(pick, lm.rate, result.rate),
        lower=np.where(pick, lm.lower, result.lower),
        upper=np.where(pick, lm.upper, result.upper),
        n_eff=np.where(pick, lm.n_eff, result.n_eff),
        fetches=result.fetches,
        method=np.where(pick, lm.method, result.method).astype(np.uint8),
    )
