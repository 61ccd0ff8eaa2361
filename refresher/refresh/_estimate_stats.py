"""Change-rate estimates from per-page sufficient statistics, not the history.

The store keeps, per page, the sums :class:`refresher.store.ChangeStatistics` lists, updated as
each fetch is recorded; this module computes from them what :func:`refresher.refresh._estimate.
estimate_pages` computes from the observations (the same MAP estimators, host and global
priors, Last-Modified change times and the first copy's quiet time), and the probability of
never changing (:func:`refresher.refresh._static.static_probability`). Dense arrays, one row
per page: no observation arrays, no per-observation sums.

Everything but one term is exact: the log-likelihood of an interval of t seconds that saw a
change, ln(1 − e^(−λt)), does not reduce to sums. Its sum over a page's changed intervals is
approximated by a **two-point rule matched to the first three moments of ln t** (the store
keeps Σ ln t, Σ (ln t)², Σ (ln t)³ over the changed intervals): two nodes and weights that
reproduce the count, mean, variance and skewness of ln t, so that the sum is exact when every
interval has the same length (regular fetching, the daemon's usual case) and when the function
is a cubic in ln t across the page's spread; ``tests/refresh/test_estimate_stats.py`` bounds
the disagreement with the history on generated histories.

The window: the history-based estimator reads a page's latest ``history`` observations. The
statistics sum all of them; a page with n > ``history`` observations has its sums scaled by
history/n, so that it is worth ``history`` observations, as in the window (the same n_eff and
posterior width), centred on the whole history's mean instead of the latest part's. The
Last-Modified consistency test keeps its window exactly (the store counts the observations
since the last inconsistent one); the first copy's quiet time is used while n ≤ ``history``,
as in the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaincinv

from refresher.refresh._estimate import (
    _NEWTON_STEPS,
    DEFAULT_SPREAD,
    MODELS,
    Estimate,
    Method,
    Prior,
    _host_strength,
    _log_interval,
    _newton_step,
    _phi,
    _psi,
    _z,
)
from refresher.refresh._spread import SpreadEvidence, fit_spread, sample
from refresher.refresh._static import static_of_pages, static_probability
from refresher.store import ChangeStatistics

__all__ = ["PageEvidence", "estimate_statistics", "evidence", "two_point_nodes"]

Float = NDArray[np.float64]
Mask = NDArray[np.bool_]
Index = NDArray[np.intp]


#: pages per block: the iteration runs block by block, so that its temporaries stay small
#: (arrays of millions of entries cost more to fault in than to compute with)
_BLOCK = 1 << 15
#: Newton's tolerance in θ = ln λ for the estimate: a step of 1e-8 leaves an error of order
#: 1e-16 (one pass fewer than waiting for a step below 1e-10, the history-based test) …
_TOL = 1e-8
#: … and for the empirical Bayes rounds, which only average θ̂ into host means and start
#: the next solve: a step of 1e-5 leaves an error of order 1e-10, and the rounds take one
#: step fewer than at 1e-8
_ROUND_TOL = 1e-5


def _blocks(n: int) -> list[slice]:
    return [slice(start, min(start + _BLOCK, n)) for start in range(0, n, _BLOCK)]


def two_point_nodes(count: Float, moments: Float) -> tuple[Float, Float, Float]:
    """Two interval lengths (seconds) per page and the first's share (the second's is 1 − it)
    matching the mean, variance and skewness of ln t of ``count`` intervals with the power
    sums ``moments`` (shape (3, pages)): (t₀, t₁, share), each one entry per page."""
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.maximum(count, 1e-300)
        m1, m2, m3 = moments[0] / k, moments[1] / k, moments[2] / k
        var = np.maximum(m2 - m1 * m1, 0.0)
        sd = np.sqrt(var)
        third = m3 - 3.0 * m1 * m2 + 2.0 * m1**3
        skew = np.where(sd > 1e-6, third / np.maximum(sd, 1e-300) ** 3, 0.0)
    skew = np.clip(np.nan_to_num(skew), -20.0, 20.0)
    root = np.sqrt(skew * skew + 4.0)
    a, b = 0.5 * (skew - root), 0.5 * (skew + root)  # standardised nodes, a < 0 < b, ab = −1
    share = b / (b - a)
    some = count > 0
    m1, sd = np.where(some, m1, 0.0), np.where(some, sd, 0.0)
    t0 = np.exp(np.clip(m1 + sd * a, -700.0, 700.0))
    t1 = np.exp(np.clip(m1 + sd * b, -700.0, 700.0))
    return t0, t1, share


@dataclass(frozen=True, slots=True, kw_only=True)
class PageEvidence:
    """A page's statistics as the estimators read them: weighted to the window, with the
    Last-Modified choice made (arrays over pages)."""

    fetches: Float  # observations (weighted), the first copy's quiet interval included
    exposure: Float  # Σ t of those, seconds
    first_quiet: Float  # the first copy's quiet interval in that, seconds (0: none)
    changes: Float  # X (weighted)
    changed_time: Float  # Σ t over changed intervals (weighted)
    timed: Mask  # the page's change times are used (trusted host, every change timed)
    quiet_after: Float  # Σ quiet time after the changes (weighted), seconds
    t0: Float  # the changed intervals as two lengths, seconds …
    t1: Float
    share: Float  # … and the first one's share of the changes
    trusted: Mask  # per host: Last-Modified is consistent
    #: of ``changes``, those of the timeline's Last-Modified pairs (weighted), which the nodes
    #: do not describe (timed: their intervals are in the quiet time alone)
    paired_changes: Float

    def nodes(self, block: slice, mask: Mask | None = None) -> _Nodes:
        """The pages' changed intervals (of those in ``mask``, which is over the block) as
        two weighted nodes."""
        w = self.changes[block] - self.paired_changes[block]
        w = w if mask is None else np.where(mask, w, 0.0)
        share = self.share[block]
        return _Nodes(self.t0[block], self.t1[block], w * share, w * (1.0 - share))


def evidence(
    stats: ChangeStatistics, host_index: Index, n_hosts: int, *, history: int
) -> PageEvidence:
    """:class:`PageEvidence` from the store's statistics (see the module docstring)."""
    n = stats.observations
    host = np.asarray(host_index, dtype=np.intp)
    # A host is trusted when its pages' windows hold observations, none inconsistent, and
    # one change at least (refresher.refresh._estimate.last_modified_consistent).
    seen = np.bincount(host, n > 0, minlength=n_hosts) > 0
    bad = np.bincount(host, stats.lm_run < np.minimum(n, history), minlength=n_hosts) > 0
    changed = np.bincount(host, stats.changes, minlength=n_hosts) >= 1
    trusted = seen & ~bad & changed
    size = n.size
    out = {
        name: np.empty(size)
        for name in ("fetches", "exposure", "first_quiet", "changes", "changed_time", "quiet_after")
    } | {name: np.empty(size) for name in ("t0", "t1", "share", "paired_changes")}
    timed = np.empty(size, dtype=bool)
    for b in _blocks(size):
        on_trusted = trusted[host[b]]
        timed[b] = on_trusted & (stats.untimed[b] == 0)
        # the timeline's pairs a trusted Last-Modified times, on the pages it times all of:
        # timed changes and quiet time, as the pairs the fold made (the offline model's)
        paired, paired_changes, paired_quiet = _paired(stats, b, timed[b])
        nb = n[b] + paired
        scale = np.where(nb > history, history / np.maximum(nb, 1.0), 1.0)
        fq = stats.first_quiet[b]
        first = on_trusted & np.isfinite(fq) & (nb <= history)
        out["fetches"][b] = np.rint(nb * scale) + first
        out["first_quiet"][b] = np.where(first, fq, 0.0)
        out["exposure"][b] = (stats.time[b] + paired_quiet) * scale + out["first_quiet"][b]
        out["changes"][b] = (stats.changes[b] + paired_changes) * scale
        out["paired_changes"][b] = paired_changes * scale
        out["changed_time"][b] = stats.changed_time[b] * scale
        out["quiet_after"][b] = stats.quiet_after[b] * scale
        out["t0"][b], out["t1"][b], out["share"][b] = two_point_nodes(
            stats.changes[b], stats.log_moments[:, b]
        )
    return PageEvidence(timed=timed, trusted=trusted, **out)


def _paired(stats: ChangeStatistics, block: slice, timed: Mask) -> tuple[Float, Float, Float]:
    """The pages' Last-Modified pairs of the timeline (count, changes, quiet time, seconds)
    where ``timed`` (over the block), zeros elsewhere and where the store has none. Their
    quiet time goes to the exposure with no changed time to take off, so that a timed page's
    quiet time (exposure − changed time + quiet after) gains exactly it."""
    zero = np.zeros(timed.size)
    if stats.paired is None or stats.paired_changes is None or stats.paired_quiet is None:
        return zero, zero, zero
    n, changes, quiet = (
        np.where(timed, np.nan_to_num(x[block]), 0.0)
        for x in (stats.paired, stats.paired_changes, stats.paired_quiet)
    )
    return n, changes, quiet


@dataclass(frozen=True, slots=True)
class _Solved:
    """The MAP θ = ln λ of every page under the prior N(``mean``, 1/``inv_var``) and each
    page's observed information at it (0 where nothing was observed)."""

    theta: Float
    info: Float
    mean: Float
    inv_var: float

    def start(self, mean: Float, sd: float) -> Float:
        """θ̂ under the prior N(``mean``, sd²), to first order from this solve: the MAP
        condition g(θ) = (θ − m)·v moves by dθ = (v·dm − (θ − m)·dv)/(I + v). A start that
        close saves the Newton iteration one step of the ≈ 3 that a start from the last
        solve's θ̂ takes (its error is the square of the prior's move, not the move); the
        iteration converges to the same root from either."""
        inv_var = 1.0 / sd**2
        shift = inv_var * (mean - self.mean) - (self.theta - self.mean) * (inv_var - self.inv_var)
        shift /= self.info + inv_var
        shift += self.theta
        return shift


def _solve(
    ev: PageEvidence, mean: Float, sd: float, start: Float | None, tol: float = _TOL
) -> _Solved:
    """The MAP θ = ln λ under N(mean, sd²) over page evidence, by safeguarded Newton to
    ``tol``, block by block of pages (no page-sized temporaries); ``start``: θ per page to
    start from (None: each page's own rough rate)."""
    n_pages = ev.fetches.size
    inv_var = 1.0 / sd**2
    theta, info = np.empty(n_pages), np.empty(n_pages)
    for b in _blocks(n_pages):
        timed = ev.timed[b]
        changes = ev.changes[b]
        quiet = ev.exposure[b] - ev.changed_time[b] + np.where(timed, ev.quiet_after[b], 0.0)
        if start is None:
            untimed_time = np.where(timed, 0.0, ev.changed_time[b])
            with np.errstate(divide="ignore", invalid="ignore"):
                guess = np.log((changes + 0.5) / (quiet + 0.5 * untimed_time))
        else:
            guess = start[b]
        live = ev.fetches[b] > 0
        m = mean[b]
        th_b = np.where(np.isfinite(guess) & live, np.clip(guess, -59.0, 24.0), m)
        timed_changes = np.where(timed, changes, 0.0)
        _newton(th_b, live, ev.nodes(b, ~timed), timed_changes, quiet, m, inv_var, info[b], tol)
        theta[b] = th_b
    np.maximum(info, 0.0, out=info)
    return _Solved(theta, info, mean, inv_var)


def _log_normal_map(ev: PageEvidence, solved: _Solved, z: float) -> Estimate:
    """:func:`refresher.refresh._estimate.estimate_log_normal` over page evidence, from the
    MAP θ̂ (:func:`_solve`): λ̂, its interval, n_eff and the method per page."""
    half = z / np.sqrt(solved.info + solved.inv_var)
    observed = ev.fetches
    method = np.where(
        observed == 0,
        Method.PRIOR,
        np.where(ev.timed & (ev.changes > 0), Method.LAST_MODIFIED, Method.IRREGULAR),
    ).astype(np.uint8)
    return Estimate(
        rate=np.exp(solved.theta),
        lower=np.exp(solved.theta - half),
        upper=np.exp(solved.theta + half),
        n_eff=solved.info,
        fetches=observed.astype(np.int64),
        method=method,
    )


def _newton(
    theta: Float,
    live: Mask,
    nodes: _Nodes,
    timed_changes: Float,
    quiet: Float,
    mean: Float,
    inv_var: float,
    info: Float,
    tol: float = _TOL,
) -> None:
    """Safeguarded Newton (bisection inside a bracket) on the pages in ``live``, in place:
    the objective is concave in θ, so it converges for every page. ``info``: each live
    page's observed information (minus the likelihood's curvature) at its last step, which
    moved θ by ``tol`` at most (0 for the others, which have no observation)."""
    lo, hi = np.full(theta.size, -60.0), np.full(theta.size, 25.0)  # λ from 1e-26 to 7e10 /s
    idx: Index | None = None if live.all() else np.flatnonzero(live)
    info[:] = 0.0
    for _ in range(_NEWTON_STEPS):
        th = theta if idx is None else theta[idx]
        if th.size == 0:
            return
        grad, curv = _terms(th, nodes.take(idx), _take(timed_changes, idx), _take(quiet, idx))
        if idx is None:
            np.negative(curv, out=info)
        else:
            info[idx] = -curv
        grad -= (th - _take(mean, idx)) * inv_var
        curv -= inv_var
        up = grad > 0.0
        lo_i = np.where(up, th, _take(lo, idx))
        hi_i = np.where(up, _take(hi, idx), th)
        step = np.clip(-grad / curv, -4.0, 4.0)
        nxt = th + step
        nxt = np.where(_inside(nxt, step, lo_i, hi_i), nxt, 0.5 * (lo_i + hi_i))
        moving = np.abs(nxt - th) > tol
        if idx is None:
            lo, hi = lo_i, hi_i
            theta[:] = nxt
            left = np.count_nonzero(moving)
            if left == 0:
                return
            # while most pages still move, all take the next step: gathering the movers'
            # terms costs more than a step of the few that are done
            if left < 0.75 * moving.size:
                idx = np.flatnonzero(moving)
        else:
            lo[idx], hi[idx], theta[idx] = lo_i, hi_i, nxt
            idx = idx[moving]


def _inside(nxt: Float, step: Float, lo: Float, hi: Float) -> Mask:
    """Where a Newton step stands: strictly inside the bracket, or tiny (at the root θ is
    itself an end of the bracket). A step clipped to ±4 can land exactly on the bracket's
    other end, and two such steps then cycle between the ends for ever: on pages whose
    every interval changed, 3 in a million of bench_estimate's pages ran all 100 steps and
    stopped up to 1.7 from their MAP (it was ``lo ≤ nxt ≤ hi``); a bisection breaks it."""
    return ((nxt > lo) & (nxt < hi)) | (np.abs(step) <= 1e-8)


def _take(a: Float, idx: Index | None) -> Float:
    return a if idx is None else a[idx]


@dataclass(frozen=True, slots=True)
class _Nodes:
    """Each page's changed intervals as two nodes: lengths (seconds) and weights (changes)."""

    t0: Float
    t1: Float
    w0: Float
    w1: Float

    def take(self, idx: Index | None) -> _Nodes:
        if idx is None:
            return self
        return _Nodes(self.t0[idx], self.t1[idx], self.w0[idx], self.w1[idx])


def _phi_terms(u: Float, w: Float) -> tuple[Float, Float]:
    """w·φ(u) and w·u·φ'(u) for φ(u) = u/(e^u − 1), u ≥ 0, in few passes over memory:
    with e = e^u − 1, u·φ'(u) = φ − φ²·(e + 1); its series where that cancels (u < 10⁻³)."""
    u = np.minimum(u, 700.0)  # φ(700) ≈ 1e-301: no overflow, no 0·∞
    e = np.expm1(u)
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = u / e
    ud = phi * (1.0 - phi * (e + 1.0))
    small = u < 1e-3
    if small.any():
        us = u[small]
        phi[small] = 1.0 - 0.5 * us + us * us / 12.0
        ud[small] = -0.5 * us + us * us / 6.0
    phi *= w
    ud *= w
    return phi, ud


def _terms(theta: Float, nodes: _Nodes, timed_changes: Float, quiet: Float) -> tuple[Float, Float]:
    """The log-likelihood's first and second derivatives in θ, without the prior."""
    lam = np.exp(theta)
    g0, c0 = _phi_terms(lam * nodes.t0, nodes.w0)
    g1, c1 = _phi_terms(lam * nodes.t1, nodes.w1)
    lq = lam * quiet
    return timed_changes - lq + g0 + g1, c0 + c1 - lq


def _log_normal(
    ev: PageEvidence,
    host: Index,
    n_hosts: int,
    spread: float,
    z: float,
    mixture: bool,
    fit: bool = False,
) -> Estimate:
    """:func:`refresher.refresh._estimate.estimate_pages` (log-normal): three rounds of
    empirical Bayes host means, then the estimate under the last; ``mixture``: each page
    counts towards its host's mean with its probability of changing at all; ``fit``: the
    prior's sd fitted to the pages before the final estimate (:mod:`._spread`), and the
    host means estimated again under it (the rounds' centres are those of the prior they
    were found under: see :func:`refresher.refresh._estimate.estimate_pages`)."""
    means, last, first = _centres(ev, host, n_hosts, spread, mixture)
    sd = _fitted_spread(ev, means, spread, mixture) if fit else spread
    if sd != spread:
        # the same rounds from the same pooled centre: the first starts from the first
        # round's θ̂ under the configured sd, moved to the fitted one
        means, last, _ = _centres(ev, host, n_hosts, sd, mixture, first)
    est = _log_normal_map(ev, _solve(ev, means, sd, last.start(means, sd)), z)
    return replace(est, prior_mean=means, prior_sd=sd)


def _centres(
    ev: PageEvidence,
    host: Index,
    n_hosts: int,
    sd: float,
    mixture: bool,
    first: _Solved | None = None,
) -> tuple[Float, _Solved, _Solved]:
    """Each page's host mean of ln λ (three empirical Bayes rounds under a prior of sd
    ``sd``, from the pooled rate), the last round's solve and the first's; ``first``: a
    first round's solve under another sd, to start this first round from."""
    n_pages = ev.fetches.size
    pooled = (float(ev.changes.sum()) + 0.5) / (
        float(ev.exposure.sum()) - 0.5 * float(ev.changed_time.sum())
    )
    means = np.full(n_pages, math.log(pooled))
    observed = (ev.fetches > 0).astype(np.float64)
    real = ev.exposure - ev.first_quiet
    changed = ev.changes > 0
    start = None if first is None else first.start(means, sd)
    solves: list[_Solved] = []
    for _ in range(3):
        solved = _solve(ev, means, sd, start, _ROUND_TOL)
        solves.append(solved)
        theta = solved.theta
        member = observed
        if mixture:
            member = observed * (1.0 - _static(real, changed, means, sd))
        if not member.sum() > 0.0:
            member = observed
        weighted = theta * member
        overall = float(weighted.sum() / member.sum())
        total = np.bincount(host, weighted, minlength=n_hosts).astype(np.float64)
        count = np.bincount(host, member, minlength=n_hosts).astype(np.float64)
        strength = _host_strength(theta, member, host, total, count, n_hosts)
        means = ((total + strength * overall) / (count + strength))[host]
        start = solved.start(means, sd)
    return means, solves[-1], solves[0]


def _fitted_spread(ev: PageEvidence, means: Float, spread: float, mixture: bool) -> float:
    """:func:`refresher.refresh._spread.fit_spread` on the observed pages' evidence (a
    sample of them: :func:`refresher.refresh._spread.sample`)."""
    seen = sample(np.flatnonzero(ev.fetches > 0))
    timed = ev.timed[seen]
    changes = ev.changes[seen]
    untimed = np.where(timed, 0.0, changes)
    share = ev.share[seen]
    evidence = SpreadEvidence(
        quiet=ev.exposure[seen]
        - ev.changed_time[seen]
        + np.where(timed, ev.quiet_after[seen], 0.0),
        timed=np.where(timed, changes, 0.0),
        t0=ev.t0[seen],
        w0=untimed * share,
        t1=ev.t1[seen],
        w1=untimed * (1.0 - share),
        changed=changes > 0,
        mean=means[seen],
    )
    pi = 0.0
    if mixture:  # the share of static pages among the sampled pages
        exposure = ev.exposure[seen] - ev.first_quiet[seen]
        some = np.flatnonzero(exposure > 0.0)
        _, pi = static_probability(
            some, exposure[some], changes[some] > 0, seen.size, prior_mean=means[seen], sd=spread
        )
    return fit_spread(evidence, spread=spread, static_share=pi)


def _gamma_map(
    group: Index,
    n_groups: int,
    ev: PageEvidence,
    a: Float,
    b: Float,
) -> tuple[Float, Float, Float, Float]:
    """The gamma-prior MAP rates of groups of pages (``_map_rates`` over page evidence):
    (λ̂, n_eff, X, quiet exposure + b) per group."""

    def total_of(x: Float) -> Float:
        return np.bincount(group, x, minlength=n_groups).astype(np.float64)

    fetches, changes = total_of(ev.fetches), total_of(ev.changes)
    total, changed_time = total_of(ev.exposure), total_of(ev.changed_time)
    mean_interval = total / np.maximum(fetches, 1.0)
    quiet = total - changed_time + 0.5 * mean_interval + b
    evid = changes + a
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(evid > 0.0, evid / (quiet + 0.5 * changed_time), 0.0)
    nodes = ev.nodes(slice(None))
    g = np.concatenate((group, group))
    t = np.concatenate((nodes.t0, nodes.t1))
    w = np.concatenate((nodes.w0, nodes.w1))
    keep = w > 0
    g, t, w = g[keep], t[keep], w[keep]
    live = evid > 0.0
    for _ in range(_NEWTON_STEPS):
        phi, dphi = _phi(rate[g] * t)
        h = a - rate * quiet + np.bincount(g, w * phi, minlength=n_groups)
        dh = -quiet + np.bincount(g, w * t * dphi, minlength=n_groups)
        rate, live = _newton_step(rate, h, dh, live)
        if not live.any():
            break
    n_eff = a + np.bincount(g, w * _psi(rate[g] * t), minlength=n_groups)
    return rate, np.where(rate > 0.0, n_eff, 0.0), changes, quiet


def _gamma(ev: PageEvidence, host: Index, n_hosts: int, confidence: float) -> Estimate:
    """:func:`refresher.refresh._estimate.estimate_pages` (gamma): the host prior, the MAP
    from intervals, and the Last-Modified estimate where change times are used."""
    z = _z(confidence)
    n_pages = ev.fetches.size
    one = np.zeros(n_pages, dtype=np.intp)
    pooled, *_ = _gamma_map(one, 1, ev, np.array([0.5]), np.array([0.0]))
    if not pooled[0] > 0.0:
        raise ValueError("the pooled rate is 0: give the global prior some pseudo-changes")
    hp = Prior.from_rate(float(pooled[0]), strength=2.0, pages=n_hosts)
    host_rate, *_ = _gamma_map(host, n_hosts, ev, hp.changes, hp.exposure)
    prior = Prior.from_rate(host_rate[host], strength=1.0)
    a, b = prior.changes, prior.exposure
    rate, n_eff, _, quiet = _gamma_map(np.arange(n_pages), n_pages, ev, a, b)
    lower, upper = _log_interval(rate, n_eff, z, quiet, 1.0 - confidence)
    method = np.where(ev.fetches > 0, Method.IRREGULAR, Method.PRIOR)
    pick = ev.timed & (ev.fetches > 0)
    if pick.any():
        evid = ev.changes + a
        exposure = ev.exposure - ev.changed_time + ev.quiet_after + b
        alpha = 1.0 - confidence
        with np.errstate(divide="ignore", invalid="ignore"):
            lm_rate = np.where(evid > 0.0, evid / exposure, 0.0)
            lm_lower = np.where(
                evid > 0.0, gammaincinv(np.maximum(evid, 1e-300), alpha / 2.0) / exposure, 0.0
            )
            lm_upper = gammaincinv(evid + 1.0, 1.0 - alpha / 2.0) / exposure
        rate = np.where(pick, lm_rate, rate)
        lower = np.where(pick, lm_lower, lower)
        upper = np.where(pick, lm_upper, upper)
        n_eff = np.where(pick, evid, n_eff)
        method = np.where(pick, Method.LAST_MODIFIED, method)
    return Estimate(
        rate=rate,
        lower=lower,
        upper=upper,
        n_eff=n_eff,
        fetches=ev.fetches.astype(np.int64),
        method=method.astype(np.uint8),
    )


def estimate_statistics(
    stats: ChangeStatistics,
    host_index: Index,
    n_hosts: int,
    *,
    history: int,
    model: str = MODELS[0],
    spread: float = DEFAULT_SPREAD,
    confidence: float = 0.95,
    mixture: bool = False,
    fit_spread: bool = False,
) -> tuple[Estimate, Float | None]:
    """The estimate for every page (as :func:`refresher.refresh._estimate.estimate_pages`
    with Last-Modified change times and the first copy's quiet time where the host is
    trusted) and, for the log-normal model, each page's probability of never changing
    (None for the gamma model). ``host_index``: dense host number per page; ``mixture``: the
    prior is centred on the pages that change at all (``estimate_pages(mixture=True)``);
    ``fit_spread``: the prior's sd fitted to the pages (``estimate_pages(fit_spread=True)``)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, not {model!r}")
    host = np.asarray(host_index, dtype=np.intp)
    ev = evidence(stats, host, max(n_hosts, 1), history=history)
    if model == "gamma":
        return _gamma(ev, host, max(n_hosts, 1), confidence), None
    est = _log_normal(ev, host, max(n_hosts, 1), spread, _z(confidence), mixture, fit_spread)
    assert est.prior_mean is not None and est.prior_sd is not None
    p0 = _static(ev.exposure - ev.first_quiet, ev.changes > 0, est.prior_mean, est.prior_sd)
    return est, p0


def _static(exposure: Float, changed: Mask, prior_mean: Float, spread: float) -> Float:
    """P(never changes) per page (:func:`static_of_pages`) from its intervals between fetches
    (``exposure``, seconds): not the first copy's quiet time, which a changing page shows as
    surely as a static one (:func:`refresher.refresh._estimate._static_of`)."""
    static_p, _ = static_of_pages(exposure, changed, prior_mean, spread)
    return static_p
