"""From fetch history to due times: estimate λ per page, split the budget by policy.

At start, whenever the re-plan rule says so (:mod:`refresher.refresh._replan`: once the fetches
recorded since the last plan reach ``policy.replan_share`` of the pages, not sooner than
``policy.replan_floor`` seconds, and at the latest every ``policy.resolve_interval`` seconds),
and at once when the budget or the policy changes, the allocator

1. reads each page's change statistics from the store (sums over the intervals between
   successful fetches, :func:`refresher.store.is_success`, and whether the body changed: raw
   or meaningful, as ``estimate.change`` says; kept as fetches are recorded, worth at most
   ``estimate.history`` observations per page) and estimates λ̂ with a prior pooled per host,
   then globally (:mod:`refresher.refresh._estimate_stats`);
2. weights pages by PageRank over the stored link edges (mean weight 1), or not at all when
   ``policy.weights = "none"``;
3. caps each host at one fetch per politeness delay and solves the policy
   (:mod:`refresher.policies`) for B·(1 − ``policy.explore``); the exploration share goes in equal
   parts to the pages the policy gave nothing, so their estimates never go stale;
4. writes λ̂, its evidence, the weight and the target rate f to the store, which makes each
   page due one interval 1/f after its last fetch (:data:`NEVER` when f = 0), less the
   lateness its due time made up (:func:`refresher.store.next_due`; the workers apply the
   same rule after each fetch, :func:`refresher.store.due_after`: one interval after the
   page was due, lateness made up to half an interval), and has the frontier reload its
   window.

Budget that the host caps leave unplaced, the exploration share included, is reported
(``statistics().unplaced``, :func:`unplaced`), never silently dropped.

Step 3 is the allocator's :class:`Planner` (default :func:`plan`). In a fleet it is
:class:`refresher.fleet.FleetBudget`, which allocates the node's pages at the fleet's one level
(μ); :func:`demand` is what a node tells the fleet about its pages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import trio
from numpy.typing import NDArray

from refresher import policies
from refresher.crawl._frontier import DelayLimits, Frontier
from refresher.ops._logging import get_logger
from refresher.refresh._estimate import DEFAULT_SPREAD, MODELS, Estimate
from refresher.refresh._estimate_stats import estimate_statistics
from refresher.refresh._known import KnownRates, load_known_rates, with_known_rates
from refresher.refresh._replan import (
    Reason,
    ReplanRule,
    next_look,
    replan_fetches,
    replan_reason,
)
from refresher.refresh._static import static_probability
from refresher.store._interface import (
    ChangeStatistics,
    EstimatorInputs,
    PageRow,
    PlanUpdate,
    Store,
    due_after,
    due_interval,
)

if TYPE_CHECKING:
    from refresher._config import Config

__all__ = [
    "Allocator",
    "AllocatorStatistics",
    "InputSettings",
    "Plan",
    "Planner",
    "PolicyInputs",
    "ReplanRule",
    "WarmStart",
    "demand",
    "load_inputs",
    "plan",
    "policy_table",
    "priority_level",
    "priority_levels",
    "sitemap_reads",
    "unplaced",
    "within_caps",
]

log = get_logger("allocate")

#: λ for pages with no history at all and no prior to pool: one change a day
DEFAULT_PRIOR_RATE = 1.0 / 86_400
#: how a plan treats uncertain rates (``policy.decide``)
DECISIONS = ("plug-in", "expected")
#: seconds of fetches over which a host's mean response time is taken for its cap
RESPONSE_WINDOW = 300.0
_Z95 = 1.959963984540054


def posterior_sd(est: Estimate) -> NDArray[np.float64]:
    """The sd of ln λ per page (natural-log units) from a log-normal estimate's 95 % interval,
    which is θ̂ ± z·sd."""
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.log(est.upper / est.lower) / (2.0 * _Z95)
    return np.where(np.isfinite(sd) & (sd >= 0.0), sd, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorStatistics:
    policy: str
    budget: float  # fetches per second
    pages: int
    uniform_interval: float  # seconds between fetches of one page under uniform
    solves: int
    last_solve_seconds: float  # wall, store calls included
    # CPU of the last solve's estimate and plan (the re-plan rule's cost)
    last_solve_cpu_seconds: float = 0.0
    # solves by why they were made (refresher.refresh._replan.Reason)
    solve_reasons: Mapping[str, int] = field(
        default_factory=dict, hash=False, metadata={"metric": "counter"}
    )
    # fetches recorded since the last solve began, and how many call for the next one
    fetched_since_solve: int = 0
    replan_fetches: float = 0.0
    unplaced: float  # fetches per second the host caps left unplaced
    explored: int  # pages given only the exploration share
    expected_freshness: float  # the plan's expected mean freshness (NaN before a solve)
    expected_age: float  # seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyInputs:
    """Arrays over pages (same order) that a plan needs; rates in changes per second."""

    page_ids: NDArray[np.int64]
    host_index: NDArray[np.intp]  # dense host number per page
    host_caps: NDArray[np.float64]  # fetches per second per dense host
    last_fetch: NDArray[np.float64]  # unix seconds, NaN when never fetched
    rates: NDArray[np.float64]  # λ̂
    rate_n: NDArray[np.float64]  # evidence (effective observed changes)
    weights: NDArray[np.float64]
    # posterior sd of ln λ per page (natural-log units); None: the rates are taken as exact
    rate_sd: NDArray[np.float64] | None = None
    # probability per page that it never changes (:mod:`refresher.refresh._static`); None: 0
    static_p: NDArray[np.float64] | None = None
    # the store's id of each dense host (``host_index`` numbers them); None: not known, and a
    # later plan carries no host's level over from this one (see :class:`WarmStart`)
    hosts: NDArray[np.int64] | None = None
    # unix seconds: when each sitemap page read on its own schedule was found, NaN for every
    # other page (:func:`sitemap_reads`); None: none is
    sitemap_since: NDArray[np.float64] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmStart:
    """What a later plan starts its searches from: the policy's split of B·(1 − explore)
    (its global and per-host levels; nothing else of it is used) and the store's id of each
    host it numbers. A guess only: the plan is the same without it (to the solver's
    tolerance), whatever the budget, caps, pages or rates are now."""

    allocation: policies.Allocation
    hosts: NDArray[np.int64] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    target: NDArray[np.float64]  # f per page, fetches per second
    allocation: policies.Allocation
    explored: int
    #: the request rate this node's pacer allows, fetches per second; None: the whole budget
    #: (one node). A fleet node paces at its own part, so that pages overdue on partitions it
    #: just took over are not caught up at the fleet's whole budget.
    pace: float | None = None
    #: where the next plan's searches start (:func:`plan` keeps its first split); None: cold
    warm: WarmStart | None = None


def _pagerank(
    n: int, src: NDArray[np.intp], dst: NDArray[np.intp], *, d: float = 0.85, steps: int = 30
) -> NDArray[np.float64]:
    """PageRank over ``n`` pages, scaled to mean 1 (power iteration, sparse, vectorised)."""
    if n == 0:
        return np.zeros(0)
    if src.size == 0:
        return np.ones(n)
    from scipy import sparse

    out_degree = np.bincount(src, minlength=n).astype(np.float64)
    m = sparse.csr_matrix((1.0 / out_degree[src], (dst, src)), shape=(n, n))
    dangling = out_degree == 0
    r: NDArray[np.float64] = np.full(n, 1.0 / n)
    for _ in range(steps):
        r = np.asarray((1.0 - d) / n + d * (m @ r + r[dangling].sum() / n), dtype=np.float64)
    scaled: NDArray[np.float64] = r * (n / float(r.sum()))
    return scaled


def load_inputs(
    raw: EstimatorInputs,
    *,
    min_delay: float,
    max_delay: float = math.inf,
    weights: str = "pagerank",
    model: str = MODELS[0],
    spread: float = DEFAULT_SPREAD,
    history: int = 32,
) -> PolicyInputs:
    """Everything a plan needs, estimated from the store's per-page change statistics (pure;
    no I/O).

    ``weights``: "pagerank" weighs pages by PageRank over the stored links (mean 1), "none"
    gives every page weight 1. ``model`` and ``spread``: the estimator's prior; ``history``:
    the observations a page's estimate is worth at most
    (:func:`refresher.refresh._estimate_stats.estimate_statistics`). A host's cap is one
    fetch per politeness delay (within [``min_delay``, ``max_delay``], seconds, as the
    frontier bounds it) plus its mean response time where ``raw`` has one
    (:attr:`EstimatorInputs.host_response`)."""
    if weights not in ("pagerank", "none"):
        raise ValueError(f"weights must be 'pagerank' or 'none', not {weights!r}")
    ids = raw.page_ids
    n = ids.size
    hosts, host_index = _dense_hosts(raw.page_host)
    # politeness waits the delay from the end of each response: a host does at most one
    # fetch per delay + response time, and a cap of 1/delay would plan what it cannot do
    # a delay stored before a reload lowered max_delay is waited no longer than the new one:
    # the frontier's range (DelayLimits.delay_range). Not its max_backoff: a backoff holds a
    # failing host off for a while, the caps are the rate a host takes in the steady state
    limits = DelayLimits(min_delay=min_delay, max_delay=max_delay)
    delay = np.clip(raw.host_delay, *limits.delay_range())
    if raw.host_response is not None:
        delay = delay + raw.host_response
    host_delay = np.zeros(hosts.size)
    host_delay[host_index] = delay  # a host's pages carry its one delay …
    if not (delay <= host_delay[host_index]).all():  # … else the largest of theirs
        np.maximum.at(host_delay, host_index, delay)
    with np.errstate(divide="ignore"):
        caps = np.where(host_delay > 0, 1.0 / host_delay, np.inf)
    if n and bool((raw.stats.observations > 0).any()):
        rates, rate_n, rate_sd, static_p = posterior(
            raw.stats, host_index, hosts.size, history=history, model=model, spread=spread
        )
    else:
        rates, rate_n = np.full(n, DEFAULT_PRIOR_RATE), np.zeros(n)
        rate_sd = np.full(n, spread) if model == "log-normal" else None
        static_p = None
    return PolicyInputs(
        page_ids=ids,
        host_index=host_index.astype(np.intp),
        host_caps=caps,
        last_fetch=raw.last_fetch,
        rates=rates,
        rate_n=rate_n,
        weights=_weights(raw, weights),
        rate_sd=rate_sd,
        static_p=static_p,
        hosts=hosts,
        sitemap_since=raw.sitemap_since,
    )


#: a sitemap read when it is t seconds old is read next after max(round, growth · t)
SITEMAP_GROWTH = 0.25
#: the largest share of a plan's fetches its sitemap reads take (a web of a few pages per
#: sitemap would otherwise spend most of its budget re-reading them)
SITEMAP_SHARE = 0.5


def sitemap_reads(
    inputs: PolicyInputs, target: NDArray[np.float64], now: float
) -> NDArray[np.float64]:
    """``target`` with the sitemap pages (:attr:`PolicyInputs.sitemap_since`) on a schedule of
    their own, as the offline model reads them (``analysis.model.sitemap_reads``): once per
    uniform round of the plan (its pages over its total rate) at first, then further apart as
    the sitemap ages (after max(round, :data:`SITEMAP_GROWTH` · its age)); the other pages'
    targets scaled to keep the plan's total. Not the policy's: a sitemap changes whenever a
    page it lists does, so the policy would plan it as too fast to keep fresh, while its
    worth is the lastmods it tells of every listed page (each read a point of their
    timelines, :mod:`refresher.store._timeline`)."""
    since = inputs.sitemap_since
    if since is None or target.size == 0:
        return target
    read = np.isfinite(since)
    total = float(target.sum())
    if not read.any() or total <= 0.0:
        return target
    uniform_round = target.size / total
    rates = 1.0 / np.maximum(uniform_round, SITEMAP_GROWTH * np.maximum(now - since[read], 0.0))
    rates *= min(1.0, SITEMAP_SHARE * total / float(rates.sum()))
    out = target.copy()
    out[read] = rates
    rest = float(target[~read].sum())
    if rest > 0.0:
        out[~read] *= (total - float(rates.sum())) / rest
    return out


Posterior = tuple[
    NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None, NDArray[np.float64] | None
]


def posterior(
    stats: ChangeStatistics,
    host_index: NDArray[np.intp],
    n_hosts: int,
    *,
    history: int,
    model: str,
    spread: float,
    mixture: bool = True,
    fit_spread: bool = True,
) -> Posterior:
    """What a plan reads of the pages' change statistics, per page: λ̂ (changes per second),
    its evidence (effective observed changes), the posterior sd of ln λ (None for the gamma
    prior) and the probability of never changing (None for the gamma prior), by
    :func:`estimate_statistics`. ``mixture`` and ``fit_spread`` as there; the daemon plans
    with both, the offline model (:mod:`analysis.model`) also without them."""
    est, static_p = estimate_statistics(
        stats,
        host_index,
        n_hosts,
        history=history,
        model=model,
        spread=spread,
        mixture=mixture,
        fit_spread=fit_spread,
    )
    rate_sd = posterior_sd(est) if est.prior_mean is not None else None
    return np.asarray(est.rate, np.float64), np.asarray(est.n_eff, np.float64), rate_sd, static_p


def _dense_hosts(page_host: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.intp]]:
    """The distinct host ids, sorted, and each page's index among them (``np.unique`` with
    ``return_inverse``); by counting when the ids are small, as the store's are, which
    takes a pass where a sort of ten million ids takes seconds."""
    if page_host.size == 0 or page_host.min() < 0 or page_host.max() > 4 * page_host.size + 1024:
        hosts, index = np.unique(page_host, return_inverse=True)
        return hosts, index.astype(np.intp)
    present = np.bincount(page_host) > 0
    hosts = np.flatnonzero(present)
    dense = np.cumsum(present) - 1
    return hosts.astype(np.int64), dense[page_host].astype(np.intp)


def uncertainty(
    est: Estimate,
    page_index: NDArray[np.intp],
    intervals: NDArray[np.float64],
    changed: NDArray[np.bool_],
    spread: float,
    first_copy: NDArray[np.bool_] | None = None,
) -> tuple[NDArray[np.float64] | None, NDArray[np.float64] | None]:
    """The posterior sd of ln λ and the probability of never changing, per page, from a
    log-normal estimate and its observations (None, None for the gamma prior); the prior's
    sd is the estimate's own (``Estimate.prior_sd``) where it has one, else ``spread``.
    ``first_copy`` marks the observations that are a first copy's quiet time, which say
    nothing about whether a page changes at all."""
    if est.prior_mean is None:
        return None, None
    n = est.rate.size
    sd = spread if est.prior_sd is None else est.prior_sd
    if first_copy is not None:
        real = ~first_copy
        page_index, intervals, changed = page_index[real], intervals[real], changed[real]
    p0, _ = static_probability(page_index, intervals, changed, n, prior_mean=est.prior_mean, sd=sd)
    return posterior_sd(est), p0


def _static_share(inputs: PolicyInputs) -> NDArray[np.float64]:
    return np.zeros(inputs.rates.size) if inputs.static_p is None else inputs.static_p


def page_freshness(inputs: PolicyInputs, target: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each page's expected time-averaged freshness under ``target``: P₀ + (1 − P₀)·F̄(λ̂, f),
    a static page being always fresh (λ̂ is the rate of the page if it changes at all)."""
    p0 = _static_share(inputs)
    return np.asarray(p0 + (1.0 - p0) * policies.freshness(inputs.rates, target), np.float64)


def page_age(inputs: PolicyInputs, target: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each page's expected mean age (seconds): (1 − P₀)·Ā(λ̂, f)."""
    p0 = _static_share(inputs)
    with np.errstate(invalid="ignore"):
        a = (1.0 - p0) * policies.age(inputs.rates, target)
    return np.asarray(np.where(p0 >= 1.0, 0.0, a), np.float64)


def reported_rates(inputs: PolicyInputs, target: NDArray[np.float64]) -> NDArray[np.float64]:
    """The rate stored as a page's λ̂ (``pages.rate``, which the views, ``refresher status``
    and the metrics turn into freshness): the rate whose F̄ at the page's f equals
    :func:`page_freshness`, so that the copy's estimated freshness counts the chance that a
    page never changes; where f = 0, the mean rate (1 − P₀)·λ̂."""
    p0 = _static_share(inputs)
    lam = inputs.rates
    if not p0.any():
        return lam
    out = np.where(p0 > 0, (1.0 - p0) * lam, lam)
    rows = np.flatnonzero((p0 > 0) & (target > 0))
    if rows.size:
        f = target[rows]
        x = lam[rows] / f
        # F̄ = φ(x) = (1 − e^(−x))/x at x = λ/f: the x' with φ(x') = P₀ + (1 − P₀)·φ(x)
        out[rows] = f * _inverse_phi(p0[rows] + (1.0 - p0[rows]) * _phi(x), x)
    return out


def _phi(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """F̄ as a function of x = λ/f: (1 − e^(−x))/x, 1 at x = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0.0, -np.expm1(-x) / x, 1.0)


def _inverse_phi(goal: NDArray[np.float64], above: NDArray[np.float64]) -> NDArray[np.float64]:
    """x ∈ (0, ``above``] with φ(x) = ``goal`` (φ falls from 1 at 0): safeguarded Newton in
    ln x on ln φ, whose slope there is x/(eˣ − 1) − 1 ∈ (−1, 0); to 1e-14 in x. Each round
    works on the pages still moving."""
    # ln φ is concave in ln x, so Newton's steps from above the root stay above it and close
    # in quadratically, while from below they overshoot (and a bisection takes over, halving
    # the gap per round: 25-50 rounds for most pages where P₀ is small and the root lies just
    # below ``above``). φ ≤ 1/x puts 1/goal above the root, as is ``above`` (φ there ≤ goal),
    # and φ ≤ 1 − x/2 + x²/6 the smaller root of that quadratic at goal = 1 − d (d ≤ 3/8).
    d6 = 6.0 * (1.0 - goal)
    with np.errstate(divide="ignore", invalid="ignore"):
        near = np.where(d6 <= 2.25, d6 / (1.5 + np.sqrt(np.maximum(2.25 - d6, 0.0))), np.inf)
        x = np.minimum(np.minimum(1.0 / goal, above), near)
    np.maximum(x, 1e-300, out=x)
    lo, hi = np.zeros_like(x), np.array(above, dtype=np.float64)
    log_goal = np.log(goal)
    rows = np.arange(x.size)
    for _ in range(60):
        xr, lo_r, hi_r, goal_r = x[rows], lo[rows], hi[rows], goal[rows]
        value = _phi(xr)
        up = value > goal_r  # φ(x) too high: the root lies above x
        lo_r, hi_r = np.where(up, xr, lo_r), np.where(up, hi_r, xr)
        slope = np.where(xr > 1e-8, xr / np.expm1(np.minimum(xr, 700.0)), 1.0 - 0.5 * xr) - 1.0
        newton = -(np.log(value) - log_goal[rows]) / np.minimum(slope, -1e-300)
        step = xr * np.exp(np.clip(newton, -30.0, 30.0))
        # (a page whose goal is φ at x to the last bit, P₀ too small to move it, has its
        # root at x: no step, where a bisection would leave it and take 50 rounds back)
        bad = ~((step > lo_r) & (step < hi_r)) & (newton != 0.0)
        nxt = np.where(bad, 0.5 * (lo_r + hi_r), step)
        moving = np.abs(nxt - xr) > 1e-14 * xr
        x[rows], lo[rows], hi[rows] = nxt, lo_r, hi_r
        rows = rows[moving]
        if rows.size == 0:
            break
    return x


def _weights(raw: EstimatorInputs, weights: str) -> NDArray[np.float64]:
    """Per page (``raw.page_ids`` sorted): 1, or PageRank over the links scaled to mean 1."""
    ids = raw.page_ids
    n = ids.size
    if weights == "none":
        return np.ones(n)
    src = np.searchsorted(ids, raw.link_src)
    dst = np.searchsorted(ids, raw.link_dst)
    ok = (src < n) & (dst < n)
    if n:
        ok &= (ids[np.minimum(src, n - 1)] == raw.link_src) & (
            ids[np.minimum(dst, n - 1)] == raw.link_dst
        )
    return _pagerank(n, src[ok], dst[ok])


def plan(
    inputs: PolicyInputs,
    policy: str,
    budget: float,
    *,
    explore: float,
    decide: str = "plug-in",
    warm: WarmStart | None = None,
) -> Plan:
    """Target rates: the policy's split of B·(1 − explore), plus exploration.

    ``decide = "expected"``: the optimal policies maximise the expected value under each
    rate's posterior (:func:`policies.solve_expected`) where ``inputs.rate_sd`` gives one, and
    the exploration share goes to the pages the plan gave nothing in proportion to the
    posterior probability that they are worth fetching (:func:`worth_fetching`); what that
    leaves of the share goes back to the plan. "plug-in" takes λ̂ as exact and explores in
    equal parts. ``warm``: an earlier plan's :attr:`Plan.warm`, where the searches start
    (the same plan without it, to the solver's tolerance; fewer passes over the pages)."""
    n = inputs.page_ids.size
    if n == 0:
        alloc = policies.solve(policy, np.zeros(0), budget)
        return Plan(target=np.zeros(0), allocation=alloc, explored=0)
    expected = plans_expected(inputs, policy, decide)
    share = budget * (1.0 - explore)
    alloc = _solve(inputs, policy, share, expected, warm=carried(warm, inputs, policy))
    kept = WarmStart(allocation=alloc, hosts=inputs.hosts)
    target = np.array(alloc.rates, dtype=np.float64)
    starved = target <= 0.0
    spare = budget - share
    worth = np.ones(n)
    if expected and starved.any() and spare > 0:
        worth = worth_fetching(inputs, alloc)
        used = spare * float(worth[starved].mean())
        if used < spare * 0.999:  # the rest of the share goes back to the plan
            share = budget - used
            alloc = _solve(inputs, policy, share, expected, hint=alloc)
            target = np.array(alloc.rates, dtype=np.float64)
            starved = target <= 0.0
            worth = worth_fetching(inputs, alloc)
            spare = used
    explored = int(starved.sum())
    mass = float(worth[starved].sum())
    if explored and spare > 0 and mass > 0:
        target[starved] = spare * worth[starved] / mass
    elif spare > 0:
        target *= budget / max(float(target.sum()), 1e-300)
    return Plan(target=target, allocation=alloc, explored=explored, warm=kept)


def carried(
    warm: WarmStart | None, inputs: PolicyInputs, policy: str
) -> policies.Allocation | None:
    """``warm``'s split with its hosts' levels renumbered as ``inputs`` numbers its hosts
    (by the store's host ids; NaN and not capped for a host it did not have), for the
    solver to start from; its global level alone when either side's host ids are unknown,
    and nothing for another policy (another objective's levels)."""
    if warm is None or warm.allocation.policy != policy:
        return None
    alloc = warm.allocation
    levels, capped = alloc.host_multipliers, alloc.capped_hosts
    if levels is None or capped is None or warm.hosts is None or inputs.hosts is None:
        return replace(alloc, host_multipliers=None, capped_hosts=None)
    before, now = warm.hosts, inputs.hosts
    if before.size == 0:
        return replace(alloc, host_multipliers=None, capped_hosts=None)
    at = np.minimum(np.searchsorted(before, now), before.size - 1)
    found = before[at] == now
    return replace(
        alloc,
        host_multipliers=np.where(found, levels[at], np.nan),
        capped_hosts=found & capped[at],
    )


def within_caps(inputs: PolicyInputs, target: NDArray[np.float64]) -> NDArray[np.float64]:
    """``target`` (f per page, fetches per second) with every host at most at its cap and the
    same total where the caps allow it. A plan's exploration share, or the rescale that hands
    it back to the policy's split when nothing starved (:func:`plan`, and a fleet's level
    alike), can push a host the solve left at its cap past it; politeness never fetches a
    host faster than its cap, so that part of B would never reach the wire. What a host
    sheds goes to the pages of hosts below their caps, in proportion to their rates, as far
    as their caps allow. The allocator applies it to every plan before the due times."""
    host, caps = inputs.host_index, inputs.host_caps
    budget = float(target.sum())
    out = target.copy()
    for _ in range(len(caps) + 1):  # each round fills at least one more host to its cap
        sums = np.bincount(host, out, minlength=caps.size)
        over = sums > caps * (1.0 + 1e-9)
        if over.any():
            scale = np.where(over, caps / np.maximum(sums, 1e-300), 1.0)
            out *= scale[host]
            sums = np.minimum(sums, caps)
        free = (sums < caps * (1.0 - 1e-9))[host] & (out > 0.0)
        missing = min(budget, float(caps.sum())) - float(out.sum())
        if not over.any() or missing <= 1e-12 * budget or not free.any():
            break
        out[free] *= 1.0 + missing / float(out[free].sum())
    return out


def unplaced(result: Plan, budget: float) -> float:
    """Fetches per second of ``budget`` that ``result`` (fitted to the host caps,
    :func:`within_caps`) leaves unplaced: one node's B less Σf, the exploration share
    included (the policy's split reports what the caps leave of B·(1 − explore) only, and
    when the caps bind everywhere the exploration share finds no room either); a fleet node's,
    the fleet's (:attr:`refresher.fleet.Solution.unplaced`), of the policy's share."""
    if result.pace is not None:
        return float(result.allocation.unplaced)
    left = budget - float(result.target.sum())
    return left if left > 1e-9 * budget else 0.0


class Planner(Protocol):
    """How the allocator turns its inputs into a plan: :func:`plan` (one node's own solve) or
    a fleet's one budget (:class:`refresher.fleet.FleetBudget`)."""

    def __call__(
        self,
        inputs: PolicyInputs,
        policy: str,
        budget: float,
        *,
        explore: float,
        decide: str = "plug-in",
        warm: WarmStart | None = None,
    ) -> Plan: ...


def plans_expected(inputs: PolicyInputs, policy: str, decide: str) -> bool:
    """Whether :func:`plan` maximises the expected value for these inputs: asked to, an
    optimal policy, and every page has a posterior (an sd, a rate > 0)."""
    if decide not in DECISIONS:
        raise ValueError(f"decide must be one of {', '.join(DECISIONS)}, not {decide!r}")
    return (
        decide == "expected"
        and inputs.rate_sd is not None
        and policy in policies.EXPECTED_POLICIES
        and bool((inputs.rates > 0).all())
    )


def demand(inputs: PolicyInputs, policy: str, decide: str = "plug-in") -> policies.Demand:
    """The page set's demand curve under ``policy`` with its host caps, planned as
    :func:`plan` plans (``decide``): what a node tells the fleet so that one level allocates
    the union of the nodes' pages."""
    if plans_expected(inputs, policy, decide):
        return policies.Demand(
            policy,
            inputs.rates,
            weights=_effective_weights(inputs),
            hosts=inputs.host_index,
            host_caps=inputs.host_caps,
            log_sd=inputs.rate_sd,
        )
    return policies.Demand(
        policy,
        inputs.rates,
        weights=inputs.weights,
        hosts=inputs.host_index,
        host_caps=inputs.host_caps,
    )


def _effective_weights(inputs: PolicyInputs) -> NDArray[np.float64]:
    """The weights a page's value is scaled by: a static page's value does not depend on f."""
    if inputs.static_p is None:
        return inputs.weights
    return np.asarray(inputs.weights * (1.0 - inputs.static_p), dtype=np.float64)


def _solve(
    inputs: PolicyInputs,
    policy: str,
    share: float,
    expected: bool,
    hint: policies.Allocation | None = None,
    warm: policies.Allocation | None = None,
) -> policies.Allocation:
    """The policy's split of ``share``; ``hint``: the same pages' split of another share,
    which starts the expected-value search (same answer, fewer passes); ``warm``: an earlier
    plan's split renumbered to these hosts (:func:`carried`), likewise."""
    if expected:
        assert inputs.rate_sd is not None
        return policies.solve_expected(
            policy,
            np.log(inputs.rates),
            inputs.rate_sd,
            share,
            weights=_effective_weights(inputs),
            hosts=inputs.host_index,
            host_caps=inputs.host_caps,
            hint=hint,
            warm=warm,
        )
    return policies.solve(
        policy,
        inputs.rates,
        share,
        weights=inputs.weights,
        hosts=inputs.host_index,
        host_caps=inputs.host_caps,
        warm=warm,
    )


def worth_fetching(inputs: PolicyInputs, alloc: policies.Allocation) -> NDArray[np.float64]:
    """Per page, the posterior probability that its true λ is slow enough for the plan's
    multiplier to give it fetches (freshness: w/λ > μ, so P(ln λ < ln(w/μ))): where an
    exploration fetch can change the plan. Pages surely too fast to keep fresh get ~0."""
    from scipy.special import ndtr

    mu = np.full(inputs.rates.size, alloc.multiplier)
    if alloc.host_multipliers is not None:
        mu = np.asarray(alloc.host_multipliers, dtype=np.float64)[inputs.host_index]
    w = _effective_weights(inputs)
    sd = np.zeros_like(mu) if inputs.rate_sd is None else inputs.rate_sd
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.log(w) - np.log(mu) - np.log(inputs.rates)
        z = np.where(sd > 0, gap / np.maximum(sd, 1e-300), np.where(gap > 0, np.inf, -np.inf))
    out = np.where(np.isnan(z), 0.0, ndtr(z))
    return np.asarray(out, dtype=np.float64)


#: what every freshness and age of :func:`policy_table`, the allocator's statistics and the
#: metrics mean: one definition, printed with the table
DEFINITION = (
    "expected freshness and age per page at its estimated rate, counting the chance that it "
    "never changes, under the plan made as the daemon makes it (host politeness caps, "
    "policy.decide, page weights); 'freshness' and 'age' average pages equally, 'weighted' "
    "weighs them by the page weights"
)


def policy_table(inputs: PolicyInputs, budget: float, *, decide: str = "plug-in") -> dict[str, Any]:
    """Expected mean freshness and age (seconds) of the page set under every policy, planned
    as the daemon plans (``decide``, host caps, weights); see :data:`DEFINITION`."""
    table: dict[str, Any] = {}
    weights = inputs.weights
    for name in policies.available():
        p = plan(inputs, name, budget, explore=0.0, decide=decide)
        fresh = page_freshness(inputs, p.target)
        age = float(np.mean(page_age(inputs, p.target)))
        table[name] = {
            "freshness": float(np.mean(fresh)),
            "weighted": float(np.average(fresh, weights=weights)),
            "age": age if math.isfinite(age) else None,  # None: a changing page never fetched
            "unplaced": p.allocation.unplaced,
        }
    return {
        "budget": budget,
        "pages": int(inputs.page_ids.size),
        "decide": decide,
        "definition": DEFINITION,
        "policies": table,
    }


def priority_level(page: PageRow, now: float, levels: int) -> int:
    """Front queue for a due page: the likelier it changed since its last fetch (times its
    weight), the higher; new pages first. Level 0 is the highest (:func:`_level`).

    A new page (never tried: :attr:`PageRow.new`) is first even once a solve has planned it:
    ranked by its weight it would wait behind re-fetches of heavier pages (an index page every
    other page links to was fetched again and again before the rest of its host was fetched
    once). A page tried with no copy to show for it (its fetches fail) is ranked like any
    other by its plan: in front queue 0 at every plan, it went before the pages never tried."""
    return _level(page.new, page.weight, page.rate, page.target_rate, levels)


def priority_levels(
    new: NDArray[np.bool_],
    weights: NDArray[np.float64],
    rates: NDArray[np.float64],
    targets: NDArray[np.float64],
    levels: int,
) -> NDArray[np.intp]:
    """:func:`priority_level` of every page of the arrays (same order; rates in changes per
    second, targets in fetches per second): the offline model's front queues
    (:mod:`analysis.model`), by the daemon's one rule. Element by element through
    :func:`_level`, which the frontier calls once per page that comes due: numpy on one page
    costs ~20× the scalar rule, and the model asks it for at most its overdue pages at a
    re-plan."""
    # the rule's own comparisons with NaN and overflows to ∞ raise the processor's flags,
    # which numpy would report as warnings after the loop; the rule gives each its level
    with np.errstate(all="ignore"):
        out = _LEVELS(new, weights, rates, targets, levels)
    return np.asarray(out, dtype=np.intp)


def _level(new: bool, weight: float, rate: float | None, target: float | None, levels: int) -> int:
    """The front queue of a page of ``weight`` with change rate ``rate`` (λ̂, per second) and
    plan ``target`` (f, per second): ⌊−log₂ value⌋ within [0, ``levels`` − 1], the value being
    weight · (1 − e^(−λ/f)), the chance that it changed in one interval 1/f. New (never tried)
    or unplanned pages (no λ̂ or f: None or NaN, or f ≤ 0) get 0, a value of 0 (or NaN) the
    last."""
    if new or rate is None or target is None or math.isnan(rate) or not target > 0:
        return 0
    value = weight * -math.expm1(-rate / target)
    if not value > 0:
        return levels - 1
    x = -math.log2(value)  # −∞ for an infinite value
    return 0 if x < 1.0 else min(levels - 1, int(x))


_LEVELS = np.frompyfunc(_level, 5, 1)


T = TypeVar("T")


def on_thread_cpu(fn: Callable[[], T]) -> Callable[[], tuple[T, float]]:
    """``fn``, returning also the CPU seconds it took on the thread that runs it: a wait for
    the GIL or a lock is not counted, as it would be in wall time."""

    def run() -> tuple[T, float]:
        t0 = time.thread_time()
        result = fn()
        return result, time.thread_time() - t0

    return run


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSettings:
    """How :func:`load_inputs` reads and estimates: its keyword arguments, kept together so
    that the daemon's allocator and ``refresher policy`` on a stopped store read alike."""

    min_delay: float = 1.0
    max_delay: float = math.inf
    meaningful: bool = False
    history: int = 32
    weights: str = "pagerank"
    model: str = MODELS[0]
    spread: float = DEFAULT_SPREAD
    #: pages planned at a rate known beforehand (``estimate.known_rates``); None: none
    known: KnownRates | None = None

    @classmethod
    def from_config(cls, config: Config) -> InputSettings:
        path = config.estimate.known_rates
        strip = config.discovery.strip_tracking_params
        return cls(
            min_delay=config.politeness.min_delay,
            max_delay=config.politeness.max_delay,
            meaningful=config.estimate.change == "meaningful",
            history=config.estimate.history,
            weights=config.policy.weights,
            model=config.estimate.model,
            spread=config.estimate.spread,
            known=None if path is None else load_known_rates(path, strip_params=strip),
        )

    async def load(self, store: Store, *, now: float | None = None) -> PolicyInputs:
        """The store's history, estimated with these settings (the estimate in a thread);
        with ``now`` (unix seconds), each host's cap counts its mean response time over the
        last :data:`RESPONSE_WINDOW` seconds (:func:`load_inputs`)."""
        inputs, _ = await self.load_costed(store, now=now)
        return inputs

    async def load_costed(
        self, store: Store, *, now: float | None = None
    ) -> tuple[PolicyInputs, float]:
        """:meth:`load`, and the CPU seconds its estimate took on its thread."""
        raw = await store.estimator_inputs(
            meaningful=self.meaningful,
            links=self.weights == "pagerank",
            responses_since=None if now is None else now - RESPONSE_WINDOW,
        )
        known, ids = self.known, None
        if known is not None:
            ids = await store.page_ids(known.urls)
        return await trio.to_thread.run_sync(on_thread_cpu(lambda: self.estimate(raw, ids)))

    def estimate(
        self, raw: EstimatorInputs, known_ids: NDArray[np.int64] | None = None
    ) -> PolicyInputs:
        """:func:`load_inputs` with these settings; ``known_ids``: the store's page id of each
        page of ``known`` (−1: none), whose known rates replace the estimates
        (:func:`refresher.refresh._known.with_known_rates`)."""
        inputs = self._estimate(raw)
        if self.known is None or known_ids is None:
            return inputs
        return with_known_rates(inputs, known_ids, self.known.rates)

    def _estimate(self, raw: EstimatorInputs) -> PolicyInputs:
        return load_inputs(
            raw,
            min_delay=self.min_delay,
            max_delay=self.max_delay,
            weights=self.weights,
            model=self.model,
            spread=self.spread,
            history=self.history,
        )


_DEFAULT_REPLAN = ReplanRule()


class Allocator:
    def __init__(
        self,
        *,
        store: Store,
        frontier: Frontier,
        budget: float,
        policy: str,
        replan: ReplanRule = _DEFAULT_REPLAN,
        explore: float = 0.05,
        decide: str = "expected",
        inputs: InputSettings = InputSettings(),
        wall_clock: Callable[[], float] = time.time,
        planner: Planner = plan,
    ) -> None:
        self._store = store
        self._frontier = frontier
        self.budget = budget
        self.policy = policy
        self.replan = replan
        self.explore = explore
        self.decide = decide
        self.inputs = inputs
        self._wall = wall_clock
        self._planner = planner
        self._pages = 0
        self._reasons: dict[str, int] = {}
        self._last_solve = 0.0
        self._solve_cpu = 0.0  # CPU seconds of the last solve's estimate and plan
        self._solved_at = -math.inf  # trio time at the end of the last solve
        self._recorded_at = 0  # the store's recorded fetches when the last solve began
        self._unplaced = 0.0
        self._explored = 0
        self._freshness = math.nan
        self._age = math.nan
        self._warm: WarmStart | None = None  # the last plan's, where the next one starts
        self._wake = trio.Event()

    def interval(self, page: PageRow) -> float:
        """Seconds from one due time of ``page`` to the next (:func:`due_interval`)."""
        return due_interval(page.target_rate, self.uniform_interval)

    def due_after_fetch(self, page: PageRow, fetched_at: float) -> float:
        """When ``page``, fetched at ``fetched_at`` (unix seconds), is due again
        (:func:`due_after`): one interval after it was due, its lateness made up. A new page
        (never tried) has no schedule to keep: its first fetch sets one (pages found together
        are due at one time; making up their lateness would keep them together)."""
        late = 0.0 if page.new else fetched_at - page.due_at
        return due_after(fetched_at, self.interval(page), late)

    @property
    def uniform_interval(self) -> float:
        return max(self._pages, 1) / self.budget

    def poke(self) -> None:
        """Re-solve now (budget or policy changed)."""
        self._wake.set()

    def pages_added(self, n: int) -> None:
        """``n`` new pages (due now): counted at once, folded into the next periodic solve.

        Not a re-solve: with discovery running, one per new page would reload the frontier
        all the time.
        """
        self._pages += n

    def configure(
        self,
        *,
        budget: float,
        policy: str,
        explore: float | None = None,
        weights: str | None = None,
        decide: str | None = None,
        replan: ReplanRule | None = None,
        inputs: InputSettings | None = None,
    ) -> None:
        """New settings (a policy switch, SIGHUP); a change that alters the plan re-solves at
        once, a new ``replan`` rule at the allocator's next look (:meth:`run`). ``inputs``
        replaces how the estimator reads the history ([estimate], politeness.min_delay,
        policy.weights)."""
        repace = budget != self.budget
        changed = repace or policy != self.policy
        if replan is not None:
            self.replan = replan
        if inputs is not None and inputs != self.inputs:
            self.inputs, changed = inputs, True
        if decide is not None and decide != self.decide:
            self.decide, changed = decide, True
        self.budget, self.policy = budget, policy
        if explore is not None:
            self.explore = explore
        if weights is not None and weights != self.inputs.weights:
            self.inputs = replace(self.inputs, weights=weights)
            changed = True
        if repace:  # until the solve it pokes sets the plan's own pace
            self._frontier.set_budget(budget)
        if changed:
            self.poke()

    async def solve(self, reason: Reason = "settings") -> None:
        """One allocation pass (see the module docstring); ``reason``: why, for the log and
        :meth:`statistics`."""
        t0 = time.perf_counter()
        recorded = self._store.statistics().acknowledged
        policy, budget, explore, now = self.policy, self.budget, self.explore, self._wall()
        decide = self.decide
        await self._store.record_policy(policy, budget, now=now)
        inputs, estimate_cpu = await self.inputs.load_costed(self._store, now=now)
        planner, warm = self._planner, self._warm
        result, plan_cpu = await trio.to_thread.run_sync(
            on_thread_cpu(
                lambda: planner(inputs, policy, budget, explore=explore, decide=decide, warm=warm)
            )
        )
        self._warm = result.warm
        target = sitemap_reads(inputs, result.target, now)
        result = replace(result, target=within_caps(inputs, target))
        self._frontier.set_budget(budget if result.pace is None else result.pace)
        update = PlanUpdate(
            page_ids=inputs.page_ids,
            rates=reported_rates(inputs, result.target),
            rate_n=inputs.rate_n,
            weights=inputs.weights,
            target=result.target,
        )
        await self._store.save_plan(update, now=now)
        self._pages = int(inputs.page_ids.size)
        self._unplaced = unplaced(result, budget)
        self._explored = result.explored
        if self._pages:
            # F̄ at λ̂ (with P₀), not the posterior mean: in the offline model over the family
            # the posterior mean under the Laplace posterior read 0.02–0.03 low at steady
            # state (its symmetric tail towards fast rates), the value at λ̂ within 0.02.
            self._freshness = float(np.mean(page_freshness(inputs, result.target)))
            self._age = float(np.mean(page_age(inputs, result.target)))
        self._reasons[reason] = self._reasons.get(reason, 0) + 1
        self._last_solve = time.perf_counter() - t0
        # the re-plan rule's cost: the CPU of the estimate and the plan, not the wall time,
        # most of which the store's calls spend behind the writer's queued batch (1.5-3.1 s
        # wall for 0.01 s of plan on a busy 9,240-page daemon, which held learned re-plans
        # 30-60 s apart instead of the floor's 5 s)
        self._solve_cpu = estimate_cpu + plan_cpu
        self._solved_at = trio.current_time()
        fetched, self._recorded_at = recorded - self._recorded_at, recorded
        self._frontier.reset()
        log.info(
            "allocation solved",
            reason=reason,
            fetched_since=fetched,
            policy=policy,
            pages=self._pages,
            budget=budget,
            unplaced=round(self._unplaced, 6),
            explored=self._explored,
            expected_freshness=round(self._freshness, 4) if self._pages else None,
            seconds=round(self._last_solve, 4),
            cpu_seconds=round(self._solve_cpu, 4),
        )
        if self._pages == 0:
            log.warning("no pages to refresh yet; add seeds with `refresher seed URL`")
        elif self._unplaced > 1e-9:
            log.warning(
                "budget unplaced: host politeness caps cannot absorb it",
                unplaced=round(self._unplaced, 6),
                budget=budget,
            )

    async def table(self, budget: float | None = None) -> dict[str, Any]:
        """:func:`policy_table` of the current page set, at ``budget`` (default: B)."""
        inputs = await self.inputs.load(self._store, now=self._wall())
        b = self.budget if budget is None else budget
        decide = self.decide
        return await trio.to_thread.run_sync(lambda: policy_table(inputs, b, decide=decide))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.solve("start")
        task_status.started()
        while True:
            reason = await self._due()
            self._wake = trio.Event()
            await self.solve(reason)

    def _fetched_since(self) -> int:
        """Fetches the store has recorded since the last solve began (its narrow count,
        :attr:`refresher.store.StoreStatistics.acknowledged`)."""
        return self._store.statistics().acknowledged - self._recorded_at

    async def _due(self) -> Reason:
        """Wait until the next plan is due and say why: poked ("settings"), or as
        :func:`replan_reason` says, asked when :func:`next_look` says (the rule's settings may
        change meanwhile: :meth:`configure`)."""
        while True:
            rule = self.replan
            since = trio.current_time() - self._solved_at
            fetched = self._fetched_since()
            reason = replan_reason(since, fetched, self._pages, self._solve_cpu, rule)
            if reason is not None:
                return reason
            with trio.move_on_after(next_look(since, rule, self._solve_cpu)):
                await self._wake.wait()
            if self._wake.is_set():
                return "settings"

    def statistics(self) -> AllocatorStatistics:
        return AllocatorStatistics(
            policy=self.policy,
            budget=self.budget,
            pages=self._pages,
            uniform_interval=self.uniform_interval,
            solves=sum(self._reasons.values()),
            last_solve_seconds=self._last_solve,
            last_solve_cpu_seconds=self._solve_cpu,
            solve_reasons=dict(self._reasons),
            fetched_since_solve=self._fetched_since(),
            replan_fetches=replan_fetches(self.replan, self._pages),
            unplaced=self._unplaced,
            explored=self._explored,
            expected_freshness=self._freshness,
            expected_age=self._age,
        )
