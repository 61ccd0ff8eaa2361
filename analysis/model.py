"""An offline model of ``analysis.compare``: the same web and policies in seconds, no network.

Usage, from the repository root::

    python -m analysis.model --seconds 600 --budget 10 --runs 3

It takes the simulated web's pages (those a crawler may fetch: robots.txt ``Disallow`` lines
respected) with their true rates, draws each page's Poisson change times, and replays a
crawler against them as the daemon's frontier fetches: a page once it is due, in the order
pages come due, the pages overdue at a re-plan first in the order the frontier's front queues
give them (by value, :func:`front_queues`), through a pacer of ``--budget`` tokens a second
(one second of saved credit), due times by the store's own rule
(:func:`refresher.store.due_after`, :func:`refresher.store.next_due`); when the daemon's own
re-plan rule says so (:mod:`refresher.refresh._replan` at the daemon's defaults: once the
fetches since the last plan reach half the pages, not sooner than 5 s, at the latest every
60 s; ``--resolve-interval`` instead re-plans on that clock alone) the daemon's own estimator
(:func:`refresher.refresh._allocate.posterior` on the per-page statistics the
store keeps of every interval, weighed down to ``history`` observations, with Last-Modified
from the hosts that send honest ones) and its own plan
(:func:`refresher.refresh._allocate.plan`: the policy, the exploration share) set each page's
interval 1/f. True mean freshness is measured exactly over the window
after the warm-up share, as ``analysis.compare`` does.
``--oracle`` gives the planner the true rates instead of estimates.

What it leaves out, and why it is only a model: politeness (host caps, delays, one back queue
per host), fetch times and failures, and the discovery of pages. The front queues order only
what reaches them at once: with fewer hosts than back queues (``workers`` × 3) the selector
empties them at every pass, so between re-plans the daemon fetches in the order pages come
due; the pages overdue when a re-plan re-reads the store reach them together. It is the tool
for asking "which estimator, prior, exploration share or run length would change the outcome?"
before spending half an hour of real runs on it; ``analysis.compare`` gives the verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.compare import disallowed
from refresher import policies
from refresher._config import EstimateConfig
from refresher._errors import RefresherError
from refresher.crawl._frontier import Pacer
from refresher.refresh._allocate import (
    Plan,
    PolicyInputs,
    plan,
    posterior,
    priority_levels,
    reported_rates,
    uncertainty,
    within_caps,
)
from refresher.refresh._estimate import MODELS, estimate_pages
from refresher.refresh._replan import ReplanRule, earliest, next_look, replan_reason
from refresher.sim._simweb import SimwebConfig, plan_web
from refresher.store import due_after, due_interval, fold_observations, next_due
from refresher.store._change_stats import empty_state, read_statistics

__all__ = [
    "HISTORY",
    "SITEMAPS",
    "ModelSettings",
    "ModelWeb",
    "main",
    "model_web",
    "plan_at",
    "replay",
    "run_model",
]

Float = NDArray[np.float64]

#: the daemon's ``estimate.history``: observations a page's estimate is worth at most
HISTORY = EstimateConfig().history
#: seconds of saved credit of the budget's pacer, as the frontier makes it
BURST = Pacer(1.0).burst
#: how the model treats the web's sitemaps (:attr:`ModelSettings.sitemaps`)
SITEMAPS = ("off", "fetched", "honest", "build", "now")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSettings:
    """One modelled comparison: ``seconds`` per run, ``budget`` fetches per second, ``runs``
    independent draws of the change times (seeds 1 … runs), the first ``warmup`` share of
    each run left out; the rest as in :class:`analysis.compare.CompareSettings`."""

    simweb: SimwebConfig = field(default_factory=SimwebConfig)
    policies: tuple[str, ...] = ("uniform", "proportional", "optimal")
    seconds: float = 600.0
    budget: float = 10.0
    runs: int = 3
    warmup: float = 0.2
    #: when to re-plan: the daemon's rule, at its defaults (policy.resolve_interval,
    #: replan_share, replan_floor)
    replan: ReplanRule = field(default_factory=ReplanRule)
    #: seconds: re-plan on this clock alone instead (share 0), for ablations; None: ``replan``
    resolve_interval: float | None = None
    #: seconds a solve takes, as the rule's lower bound counts it (a small web's take ≪ 5 s)
    solve_seconds: float = 0.0
    explore: float = 0.05
    history: int = HISTORY
    model: str = "log-normal"
    spread: float = 2.0
    oracle: bool = False
    min_delay: float = 0.0  # seconds per host between fetches: caps of 1/min_delay (0: none)
    decide: str = "plug-in"  # how the plan treats uncertain rates (policy.decide)
    static: bool = True  # weigh pages by the probability that they change at all
    mixture: bool = True  # centre the prior on the pages that change (estimate_pages)
    fit_spread: bool = True  # fit the prior's sd to the pages (estimate_pages)
    reveal: bool = False  # plan with the true rate of every page fetched twice (a bound)
    catch_up: bool = True  # due times as the store sets them (due_after); False: last + 1/f
    # as the daemon's frontier.work_conserving: a token nothing is due for goes to the page due
    # soonest; False: a page only once due (the frontier before, for comparison)
    work_conserving: bool = True
    # as the daemon's frontier at a re-plan (Frontier.reset): the pages overdue under the new
    # plan reach the host queues in one pass of the biased selector over this many front
    # queues (priority_level); between plans, pages are fetched in the order they come due.
    # 0: earliest due first at every moment (the model before)
    front_queues: int = 8
    # as the daemon's allocator: the estimate from the store's per-page statistics of every
    # observation, weighed down to ``history`` (estimate_statistics); False: from the last
    # ``history`` intervals of each page (estimate_pages, the model before)
    statistics: bool = True
    #: the sitemaps of the hosts that publish one (:data:`SITEMAPS`): "off" (never fetched, as
    #: ``analysis.compare`` runs with discovery off), "fetched" (once at the cold start, as a
    #: daemon discovering pages does, and not read), or read every ``sitemap_interval``
    #: seconds (0: one uniform round, pages / budget) from the start, each read taking a
    #: token, with "honest" lastmods (each page's last true change), "build" (one build time,
    #: the web's start, for every page: a lastmod that never moves) or "now" (the read's time
    #: for every page: a lastmod that moves without the content)
    sitemaps: str = "off"
    sitemap_interval: float = 0.0
    #: a read at t seconds is followed by the next after max(interval, growth · t) (0: every
    #: interval)
    sitemap_growth: float = 0.25

    @property
    def rule(self) -> ReplanRule:
        """The re-plan rule in force: ``replan``, or the clock alone at ``resolve_interval``."""
        if self.resolve_interval is None:
            return self.replan
        return ReplanRule(interval=self.resolve_interval, share=0.0)

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and self.budget > 0 and self.rule.interval > 0):
            raise ValueError("seconds, budget and resolve_interval must be > 0")
        if self.runs < 1 or not 0 <= self.warmup < 1:
            raise ValueError("runs must be ≥ 1 and warmup a share in [0, 1)")
        if self.sitemaps not in SITEMAPS:
            raise ValueError(
                f"sitemaps must be one of {', '.join(SITEMAPS)}, not {self.sitemaps!r}"
            )
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, not {self.model!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelWeb:
    """The crawlable pages at the web's start: true rates (changes per second), dense host
    per page, and per host whether its Last-Modified is honest."""

    rates: Float
    hosts: NDArray[np.intp]
    honest: NDArray[np.bool_]
    #: per host whether it publishes a sitemap with ``<lastmod>`` (None: no host does)
    sitemap: NDArray[np.bool_] | None = None


def model_web(config: SimwebConfig) -> ModelWeb:
    """The pages ``analysis.compare`` would seed: those that exist at the start, less those
    robots.txt disallows."""
    web = plan_web(config, start=0.0)
    rates, hosts = [], []
    for h, spec in enumerate(web.hosts):
        prefixes = disallowed(spec.robots)
        for page in spec.pages:
            if page.created_at is None and not any(page.path.startswith(p) for p in prefixes):
                rates.append(page.change_rate)
                hosts.append(h)
    return ModelWeb(
        rates=np.array(rates, dtype=np.float64),
        hosts=np.array(hosts, dtype=np.intp),
        honest=np.array([spec.validators == "honest" for spec in web.hosts]),
        sitemap=np.array([spec.sitemap for spec in web.hosts], dtype=bool),
    )


def _changes(rates: Float, seconds: float, rng: np.random.Generator) -> list[Float]:
    """Each page's change times in [0, seconds): a Poisson process of its rate, drawn as a
    Poisson count of λ·seconds changes at uniform times. (Drawing exponential gaps until their
    sum passed ``seconds``, and redrawing when too few were drawn, kept only the draws with
    few changes: a page changing 0.3 times in 300 s on average changed 0.11 times.)"""
    counts = rng.poisson(np.maximum(rates, 0.0) * seconds)
    return [np.sort(rng.uniform(0.0, seconds, int(k))) for k in counts]


def _observations(
    fetches: list[list[float]], changes: list[Float], honest: NDArray[np.bool_], history: int
) -> tuple[NDArray[np.intp], Float, NDArray[np.bool_], Float, NDArray[np.bool_]]:
    """The estimator's input: (page, interval, changed, seconds since the last change or NaN,
    whether it is the first copy's quiet time) for the last ``history`` intervals of every
    page."""
    page, interval, changed, since, first = [], [], [], [], []
    for i, times in enumerate(fetches):
        if honest[i] and 0 < len(times) <= history:
            # The first copy's Last-Modified: no change from the last one (or the web's
            # start) to the first fetch, as the daemon reads it (first_fetch_quiet).
            k0 = int(np.searchsorted(changes[i], times[0], side="right"))
            quiet = times[0] - (changes[i][k0 - 1] if k0 else 0.0)
            if quiet > 1e-6:
                page.append(np.array([i], dtype=np.intp))
                interval.append(np.array([quiet]))
                changed.append(np.array([False]))
                since.append(np.array([np.nan]))
                first.append(np.array([True]))
        if len(times) < 2:
            continue
        t = np.asarray(times[-(history + 1) :])
        k = np.searchsorted(changes[i], t, side="right")  # changes up to each fetch
        moved = k[1:] > k[:-1]
        last = changes[i][np.maximum(k[1:] - 1, 0)] if changes[i].size else np.zeros(t.size - 1)
        page.append(np.full(t.size - 1, i, dtype=np.intp))
        interval.append(np.diff(t))
        changed.append(moved)
        since.append(np.where(moved & honest[i], t[1:] - last, np.nan))
        first.append(np.zeros(t.size - 1, dtype=bool))
    if not page:
        empty = np.zeros(0)
        return np.zeros(0, np.intp), empty, np.zeros(0, bool), empty, np.zeros(0, bool)
    return (
        np.concatenate(page),
        np.concatenate(interval),
        np.concatenate(changed),
        np.concatenate(since),
        np.concatenate(first),
    )


def _freshness(fetches: list[list[float]], changes: list[Float], start: float, end: float) -> float:
    """True mean freshness over [start, end): a copy is fresh from its fetch to the page's
    next change; a page without a copy counts as stale."""
    fresh = 0.0
    for times, change in zip(fetches, changes, strict=True):
        t = np.asarray(times)
        if t.size == 0:
            continue
        until = np.append(t[1:], end)  # each copy is current until the next fetch
        nxt = np.searchsorted(change, t, side="right")
        padded = np.append(change, np.inf)  # a page that never changes again stays fresh
        stale_at = padded[nxt]
        a = np.maximum(t, start)
        b = np.minimum(np.minimum(until, stale_at), end)
        fresh += float(np.clip(b - a, 0.0, None).sum())
    return fresh / (len(fetches) * (end - start))


def run_model(policy: str, web: ModelWeb, settings: ModelSettings, seed: int) -> float:
    """True mean freshness of one modelled run of ``policy`` (change times from ``seed``)."""
    fetches, changes = replay(policy, web, settings, seed)
    return _freshness(fetches, changes, settings.warmup * settings.seconds, settings.seconds)


def replay(
    policy: str,
    web: ModelWeb,
    settings: ModelSettings,
    seed: int,
    *,
    on_plan: Callable[[float, PolicyInputs, Plan], None] | None = None,
) -> tuple[list[list[float]], list[Float]]:
    """One modelled run of ``policy``: each page's fetch times and change times (seconds
    from the start; change times drawn from ``seed``). ``on_plan(now, inputs, plan)`` sees
    every plan as it is made.

    As the daemon's frontier: a page is fetched once it is due, in the order pages come due
    (the pages overdue at a re-plan first, by the front queues' biased selector; see
    :func:`_reorder`), each fetch taking a token of a pacer of ``budget`` per second with
    :data:`BURST` seconds of saved credit (so a moment with nothing due leaves tokens unused);
    due times by the store's rule (:func:`refresher.store.due_after` after a fetch,
    :func:`next_due` with a new plan), or one interval after the last fetch
    (``catch_up=False``, the rule before)."""
    rng = np.random.default_rng(seed)
    n = web.rates.size
    changes = _changes(web.rates, settings.seconds, rng)
    fetches: list[list[float]] = [[] for _ in range(n)]
    due: Float = rng.permutation(n).astype(np.float64) * 1e-9  # the first round in a random order
    target = np.full(n, settings.budget / n)
    planned = np.full(n, np.nan)  # the plan each due time was set under (NaN: none yet)
    step, clock, tokens = 1.0 / settings.budget, 0.0, -np.inf
    order = due.copy()  # the order pages are handed out in (_reorder): due, overdue ones first
    select = np.random.default_rng((seed, 1))  # the biased selector's draws
    # the daemon's allocator (Allocator._due): plan at the start (the uniform split above),
    # then ask the re-plan rule when it says to look, counting the fetches since the last plan
    rule, cost = settings.rule, settings.solve_seconds
    planned_at, fetched, look = 0.0, 0, earliest(rule, cost)
    # the sitemap reads: each takes a token, until its host's sitemap fails the trust test;
    # "fetched": once at the cold start, as a daemon discovering pages fetches every page
    # robots.txt names, and not read
    reads = sitemap_reads(web, settings, settings.seconds)
    readers, read = (0 if web.sitemap is None else int(web.sitemap.sum())), 0
    if settings.sitemaps == "fetched":
        reads = np.array([1.0])
    while True:
        i = int(np.argmin(order))
        asked = clock if settings.work_conserving else max(clock, float(due[i]))
        token = max(tokens, asked - BURST)  # the pacer's next token (Pacer.reserve)
        at = max(asked, token)
        if read < reads.size and reads[read] <= min(at, settings.seconds):
            tokens = max(tokens, float(reads[read]) - BURST) + readers * step
            read += 1
            continue
        if look <= min(at, settings.seconds):  # a look at the rule first, at its time
            since = look - planned_at
            if replan_reason(since, fetched, n, cost, rule) is None:
                look += max(next_look(since, rule, cost), 1e-9)
                continue
            clock = planned_at = look
            fetched, look = 0, look + next_look(0.0, rule, cost)
            inputs, made = _plan(policy, web, settings, fetches, changes, clock, on_plan)
            if reads.size and settings.sitemaps != "fetched":
                assert web.sitemap is not None
                failed = sitemap_checks(web, settings, fetches, changes, reads[:read])[1]
                readers = int((web.sitemap & ~failed).sum())
            last = np.array([t[-1] if t else np.nan for t in fetches])
            if settings.catch_up:
                due = next_due(last, made.target, due_at=due, planned=planned, now=clock)
            else:
                with np.errstate(divide="ignore"):
                    due = np.where(np.isfinite(last), last + 1.0 / made.target, due).astype(
                        np.float64
                    )
            target, planned = made.target, made.target
            order = _reorder(due, clock, inputs, target, last, settings.front_queues, select)
            continue
        if at >= settings.seconds:
            return fetches, changes
        tokens, clock = token + step, at
        fetched += 1
        # a first fetch sets the page's schedule (as Allocator.due_after_fetch)
        late = at - float(due[i]) if fetches[i] and settings.catch_up else 0.0
        fetches[i].append(at)
        due[i] = due_after(at, due_interval(float(target[i]), step * n), late)
        order[i] = due[i]


def front_queues(
    inputs: PolicyInputs, target: Float, last: Float, rows: NDArray[np.intp], levels: int
) -> NDArray[np.intp]:
    """The daemon's front queue (:func:`priority_levels`, its own rule) of the pages ``rows``
    under the plan ``target``, with the rate the store holds after the plan
    (:func:`reported_rates`): a page never fetched (``last`` NaN), or planned nothing, first."""
    rate = reported_rates(inputs, target)[rows]
    new = ~np.isfinite(last[rows])
    return priority_levels(new, inputs.weights[rows], rate, target[rows], levels)


def _reorder(
    due: Float,
    now: float,
    inputs: PolicyInputs,
    target: Float,
    last: Float,
    levels: int,
    rng: np.random.Generator,
) -> Float:
    """The order pages are handed out in after a plan made at ``now``: the pages overdue go
    first, in the order the daemon's biased selector takes them from ``levels`` front queues
    (level i with weight 2^−i among the non-empty ones, each queue earliest due first); the
    rest by due time. ``levels`` 0: by due time alone."""
    order = due.copy()
    overdue = np.flatnonzero(due <= now)
    if levels < 1 or overdue.size < 2:
        return order
    overdue = overdue[np.argsort(due[overdue], kind="stable")]
    level = front_queues(inputs, target, last, overdue, levels)
    queues = [list(overdue[level == k][::-1]) for k in range(levels)]
    first = now - overdue.size  # keys first … now − 1: before every page not overdue (due > now)
    weight = np.exp2(-np.arange(levels, dtype=np.float64))
    for position in range(overdue.size):
        nonempty = [k for k in range(levels) if queues[k]]
        if len(nonempty) == 1:  # one queue left: the rest in its order
            rest = queues[nonempty[0]][::-1]
            order[rest] = first + position + np.arange(len(rest))
            break
        cumulative = np.cumsum(weight[nonempty])
        k = nonempty[int(np.searchsorted(cumulative, rng.random() * cumulative[-1], "right"))]
        order[queues[k].pop()] = first + position
    return order


def _plan(
    policy: str,
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]],
    changes: list[Float],
    now: float,
    on_plan: Callable[[float, PolicyInputs, Plan], None] | None,
) -> tuple[PolicyInputs, Plan]:
    """The daemon's plan at ``now``, fitted to the host caps as the allocator fits it, with
    what it read."""
    inputs, made = plan_at(policy, web, settings, fetches, changes, now=now)
    if on_plan is not None:
        on_plan(now, inputs, made)
    return inputs, made


def plan_at(
    policy: str,
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]] | None = None,
    changes: list[Float] | None = None,
    *,
    now: float | None = None,
) -> tuple[PolicyInputs, Plan]:
    """What the plan reads and the plan it makes, fitted to the host caps as the allocator
    fits it, after ``fetches`` of pages whose change times are ``changes`` (None: none yet;
    the clairvoyant plan, ``settings.oracle``, is the same at every moment) at ``now``
    (seconds; default the last fetch), which bounds the sitemap reads seen."""
    n = web.rates.size
    fetches = [[] for _ in range(n)] if fetches is None else fetches
    changes = [np.zeros(0) for _ in range(n)] if changes is None else changes
    if now is None:
        now = max((t[-1] for t in fetches if t), default=0.0)
    inputs = _plan_inputs(policy, web, settings, fetches, changes, now)
    made = plan(inputs, policy, settings.budget, explore=settings.explore, decide=settings.decide)
    return inputs, replace(made, target=within_caps(inputs, made.target))


def _plan_inputs(
    policy: str,
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]],
    changes: list[Float],
    now: float,
) -> PolicyInputs:
    """What the plan reads at this moment: the daemon's estimate from the observations so
    far, the true rates (``oracle``), or the estimate with the true rate of every page
    fetched twice (``reveal``)."""
    n = web.rates.size
    cap = 1.0 / settings.min_delay if settings.min_delay > 0 else np.inf
    host_caps = np.full(int(web.hosts.max()) + 1 if n else 0, cap)
    sd: Float | None
    static_p: Float | None
    if settings.oracle or policy == "uniform":  # uniform's plan reads no rates
        rates, sd, static_p = web.rates, None, None
    elif settings.statistics:
        rates, sd, static_p = _estimate_statistics(web, settings, fetches, changes, now)
    else:
        rates, sd, static_p = _estimate_history(web, settings, fetches, changes)
    if settings.reveal and not settings.oracle and policy != "uniform":
        rates, sd, static_p = _revealed(web, fetches, rates, sd, static_p)
    return PolicyInputs(
        page_ids=np.arange(n, dtype=np.int64),
        host_index=web.hosts,
        host_caps=host_caps,
        last_fetch=np.full(n, np.nan),
        rates=np.asarray(rates, dtype=np.float64),
        rate_n=np.zeros(n),
        weights=np.ones(n),
        rate_sd=sd,
        static_p=static_p if settings.static else None,
    )


def _estimate_history(
    web: ModelWeb, settings: ModelSettings, fetches: list[list[float]], changes: list[Float]
) -> tuple[Float, Float | None, Float | None]:
    """λ̂, the sd of ln λ and P₀ per page from the last ``history`` intervals of each page
    (:func:`estimate_pages`; the model before it read the daemon's statistics); the
    prior's rate and sd before any observation."""
    n = web.rates.size
    page, interval, changed, since, first = _observations(
        fetches, changes, web.honest[web.hosts], settings.history
    )
    if not page.size:
        return np.full(n, 1.0 / settings.seconds), np.full(n, settings.spread), None
    est = estimate_pages(
        page,
        interval,
        changed,
        n,
        page_host=web.hosts,
        n_hosts=int(web.hosts.max()) + 1,
        since_change=since,
        trusted_hosts=web.honest,
        model=settings.model,
        spread=settings.spread,
        mixture=settings.mixture and settings.static,
        fit_spread=settings.fit_spread,
        first_copy=first,
    )
    sd, static_p = uncertainty(est, page, interval, changed, settings.spread, first)
    return np.asarray(est.rate, dtype=np.float64), sd, static_p


def _estimate_statistics(
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]],
    changes: list[Float],
    now: float,
) -> tuple[Float, Float | None, Float | None]:
    """λ̂, the sd of ln λ and P₀ per page as the daemon's allocator reads them
    (:func:`refresher.refresh._allocate.load_inputs`): the store's per-page statistics of
    every fetch so far (:func:`refresher.store.fold_observations`, Last-Modified from the
    hosts that send honest ones: the page's last change, or the web's start) and of every
    sitemap read before ``now`` on the hosts whose sitemaps pass the trust test
    (:func:`_timeline`), estimated with the allocator's :func:`posterior`; until some page
    is observed twice, the rate of one change per run and the prior's sd for every page (the
    daemon's estimate starts at its first observation, one change a day before it)."""
    n = web.rates.size
    page, at, lm, changed, pairs = _timeline(web, settings, fetches, changes, now)
    if not (np.bincount(page, minlength=n) >= 2).any():
        return np.full(n, 1.0 / settings.seconds), np.full(n, settings.spread), None
    ids = np.arange(n, dtype=np.int64)
    state = fold_observations(empty_state(n), ids, page, at, lm, changed, changed, pairs)
    rates, _, sd, static_p = posterior(
        read_statistics(state, meaningful=False),
        web.hosts,
        int(web.hosts.max()) + 1,
        history=settings.history,
        model=settings.model,
        spread=settings.spread,
        mixture=settings.mixture and settings.static,
        fit_spread=settings.fit_spread,
    )
    return rates, sd, static_p


def sitemap_reads(web: ModelWeb, settings: ModelSettings, now: float) -> Float:
    """The times (seconds) the sitemaps are read before ``now``: from 1 s after the cold start,
    every ``sitemap_interval`` (0: one uniform round); none when ``sitemaps`` is "off"."""
    if settings.sitemaps in ("off", "fetched") or web.sitemap is None or not web.sitemap.any():
        return np.zeros(0)
    period = settings.sitemap_interval or web.rates.size / settings.budget
    if settings.sitemap_growth <= 0:
        return np.arange(1.0, now, period, dtype=np.float64)
    times, t = [], 1.0
    while t < now:  # the interval grows with the crawl's age: the rates are known better
        times.append(t)
        t += max(period, settings.sitemap_growth * t)
    return np.array(times, dtype=np.float64)


def _timeline(
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]],
    changes: list[Float],
    now: float,
) -> tuple[NDArray[np.int64], Float, Float, NDArray[np.bool_], NDArray[np.bool_]]:
    """Every page's observation points in one timeline, as :func:`fold_observations` takes
    them: (page, time, Last-Modified or lastmod, changed since the previous point, pairs).

    A fetch's change is its content against the page's previous fetch; a sitemap read's is
    its lastmod after the previous point. A fetch after sitemap reads observes (last read,
    fetch] only when every read since the previous fetch said unchanged (then the content's
    change lies after the last read) or its own Last-Modified is honest; otherwise it only
    starts the next pair. The reads count only on hosts whose sitemaps pass
    :func:`sitemap_checks`."""
    reads = sitemap_reads(web, settings, now)
    use = np.zeros(web.honest.size, dtype=bool)
    if reads.size:
        assert web.sitemap is not None
        passed, failed = sitemap_checks(web, settings, fetches, changes, reads)
        use = web.sitemap & passed & ~failed
    parts: list[tuple[Any, ...]] = []
    for i, times in enumerate(fetches):
        h = int(web.hosts[i])
        if not times and not use[h]:
            continue
        f = np.asarray(times, dtype=np.float64)
        r = reads if use[h] else np.zeros(0)
        at = np.concatenate((f, r))
        is_fetch = np.concatenate((np.ones(f.size, bool), np.zeros(r.size, bool)))
        order = np.argsort(at, kind="stable")
        at, is_fetch = at[order], is_fetch[order]
        k = np.searchsorted(changes[i], at, side="right")  # changes up to each point
        last = np.concatenate(([0.0], changes[i]))[k]  # the last one, or the start
        told = _lastmods(settings, at, last)
        lm = np.where(is_fetch, last if web.honest[h] else np.nan, told)
        changed = np.zeros(at.size, dtype=bool)
        pairs = np.ones(at.size, dtype=bool)
        prior_fetch = -1
        for j in range(at.size):
            if is_fetch[j]:
                seen = k[prior_fetch] if prior_fetch >= 0 else -1
                changed[j] = prior_fetch >= 0 and k[j] > seen
                if j > 0 and not is_fetch[j - 1] and not web.honest[h]:
                    # the reads since the last fetch said nothing moved: the content's change
                    # lies after the last read; else (or no fetch before) it tells nothing
                    pairs[j] = prior_fetch >= 0 and not (lm[j - 1] > at[prior_fetch])
                elif web.honest[h]:
                    changed[j] = j > 0 and k[j] > k[j - 1]
                prior_fetch = j
            elif j > 0:
                changed[j] = lm[j] > at[j - 1]
        parts.append((np.full(at.size, i, dtype=np.int64), at, lm, changed, pairs))
    if not parts:
        e = np.zeros(0)
        return np.zeros(0, np.int64), e, e, np.zeros(0, bool), np.zeros(0, bool)
    page, at, lm, changed, pairs = (np.concatenate(c) for c in zip(*parts, strict=True))
    return page, at, lm, changed, pairs


def _lastmods(settings: ModelSettings, reads: Float, last: Float) -> Float:
    """What the sitemap read at ``reads`` says of a page whose last change before each read
    is ``last``: that change ("honest"), the web's start ("build", a build time that never
    moves) or the read's own time ("now", every entry stamped with the moment it is served)."""
    if settings.sitemaps == "honest":
        return last
    return np.zeros(reads.size) if settings.sitemaps == "build" else reads.copy()


def sitemap_checks(
    web: ModelWeb,
    settings: ModelSettings,
    fetches: list[list[float]],
    changes: list[Float],
    reads: Float,
    *,
    tolerance: float = 1.0,
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Per host, the trust test of its sitemaps so far: (some check that could have failed
    passed, some check failed). A host's sitemaps are trusted when every lastmod checked
    against what the page's own fetches showed agrees, and one check at least could have
    failed. A lastmod after its read (beyond ``tolerance`` seconds) fails; a read that says
    the page changed after its last fetch fails when the next fetch finds the content
    unchanged (a lastmod that moves without the content: "now"); a fetch that found the
    content changed fails every later read whose lastmod lies before the fetch before it (a
    lastmod that stays while the content moves: "build")."""
    ok = np.zeros(web.honest.size, dtype=bool)
    bad = np.zeros(web.honest.size, dtype=bool)
    for i, times in enumerate(fetches):
        h = int(web.hosts[i])
        if web.sitemap is None or not web.sitemap[h] or len(times) < 2 or bad[h]:
            continue
        f = np.asarray(times, dtype=np.float64)
        kf = np.searchsorted(changes[i], f, side="right")
        kr = np.searchsorted(changes[i], reads, side="right")
        last = np.concatenate(([0.0], changes[i]))[kr]
        told = _lastmods(settings, reads, last)
        if (told > reads + tolerance).any():
            bad[h] = True
            continue
        # each read's last fetch before it (−1: none) and the fetch after it
        j = np.searchsorted(f, reads, side="right") - 1
        has_prev, has_next = j >= 1, (j >= 0) & (j + 1 < f.size)
        # (b) the read says changed since its last fetch; the next fetch must see a change
        jn = np.clip(j, 0, f.size - 1)
        claim = (j >= 0) & (told > f[jn])
        nxt = np.clip(j + 1, 0, f.size - 1)
        saw = kf[nxt] > kf[jn]
        checked_b = claim & has_next
        # (c) the last fetch before the read saw a change: the lastmod lies after the fetch
        # before that one
        jp = np.clip(j - 1, 0, f.size - 1)
        moved = has_prev & (kf[jn] > kf[jp])
        checked_c = moved
        fail = (checked_b & ~saw) | (checked_c & ~(told > f[jp]))
        bad[h] |= bool(fail.any())
        ok[h] |= bool((checked_b | checked_c).any())
    return ok, bad


def _revealed(
    web: ModelWeb,
    fetches: list[list[float]],
    rates: Float,
    sd: Float | None,
    static_p: Float | None,
) -> tuple[Float, Float | None, Float | None]:
    """The plan's inputs with every page fetched twice known exactly: its true rate, no
    uncertainty, static or not for sure. A bound on what learning from one's own fetches can
    reach: no estimator knows a page this well after one interval."""
    n = web.rates.size
    known = np.array([len(t) >= 2 for t in fetches], dtype=bool)
    static = web.rates <= 0.0
    # a static page keeps a small positive rate (the expected-value plan takes logs); it is
    # planned as static through P₀ = 1
    true = np.where(static, 1e-12, web.rates)
    rates = np.where(known, true, rates)
    sd = None if sd is None else np.where(known, 0.0, sd)
    base = np.zeros(n) if static_p is None else static_p
    static_p = np.where(known, static.astype(np.float64), base)
    return rates, sd, static_p


def main(argv: Sequence[str] | None = None) -> int:
    defaults = ModelSettings()
    parser = argparse.ArgumentParser(
        prog="python -m analysis.model",
        description="Model analysis.compare offline: true mean freshness per policy.",
    )
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="per run")
    parser.add_argument("--budget", type=float, default=defaults.budget, help="fetches/s")
    parser.add_argument("--runs", type=int, default=defaults.runs, help="draws of the changes")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="share left out")
    parser.add_argument(
        "--resolve-interval",
        type=float,
        default=None,
        help="re-plan every this many seconds alone (default: the daemon's re-plan rule)",
    )
    parser.add_argument("--explore", type=float, default=defaults.explore)
    parser.add_argument("--estimator", choices=MODELS, default=defaults.model)
    parser.add_argument("--spread", type=float, default=defaults.spread)
    parser.add_argument("--oracle", action="store_true", help="plan with the true rates")
    parser.add_argument("--policies", default=",".join(defaults.policies))
    parser.add_argument("--seed", type=int, default=0, help="of the simulated web")
    parser.add_argument("--hosts", type=int, default=defaults.simweb.hosts)
    parser.add_argument("--pages", type=int, default=defaults.simweb.pages_per_host)
    args = parser.parse_args(argv)
    try:
        settings = ModelSettings(
            simweb=replace(
                defaults.simweb, seed=args.seed, hosts=args.hosts, pages_per_host=args.pages
            ),
            policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
            seconds=args.seconds,
            budget=args.budget,
            runs=args.runs,
            warmup=args.warmup,
            resolve_interval=args.resolve_interval,
            explore=args.explore,
            model=args.estimator,
            spread=args.spread,
            oracle=args.oracle,
        )
        for name in settings.policies:
            policies.get(name)
    except (ValueError, RefresherError) as e:
        print(f"analysis.model: {e}", file=sys.stderr)
        return 2
    web = model_web(settings.simweb)
    print(
        f"{web.rates.size} pages, budget {settings.budget:g}/s, {settings.runs} × "
        f"{settings.seconds:g} s, first {settings.warmup:.0%} left out, "
        f"{'true rates' if settings.oracle else settings.model + ' estimates'}"
    )
    results: dict[str, list[float]] = {}
    for name in settings.policies:
        results[name] = [
            run_model(name, web, settings, seed) for seed in range(1, settings.runs + 1)
        ]
        runs = " ".join(f"{f:.4f}" for f in results[name])
        print(f"{name:<13} true freshness {np.mean(results[name]):.4f}   runs: {runs}", flush=True)
    if "uniform" in results:
        base = np.array(results["uniform"])
        for name, values in results.items():
            if name != "uniform":
                diff = np.array(values) - base
                print(
                    f"{name} − uniform: {diff.mean():+.4f} (runs: {diff.min():+.4f} … "
                    f"{diff.max():+.4f})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
