"""The policy comparison over a family of generated webs, not one: does optimal beat uniform
on webs it was not tuned on, and how near the clairvoyant optimum does it get?

Usage, from the repository root::

    python -m analysis.family --set report --runs 2 --out var/family  # 16 webs, about an hour
    python -m analysis.family --set tune --webs 4 --horizon 300   # a quick look

Each web of the family is drawn from its seed (:func:`family_web`): 1–12 hosts of 10–1,000
pages (at most ``MAX_PAGES`` in all, for the model's speed), a rate mix (log-normal of spread
0.5, 1.5 or 2.5; bimodal fast/slow; mostly static), honest Last-Modified on every host, some
or none, sitemaps on half the hosts or none, a budget of 0.1×–3× the pages' total change rate
Σλ, and host caps (one fetch per ``min_delay``) that hold between 1.2× and 10× the budget.
Seeds 0–7, 47 and 50 are the TUNE set (what the defaults were chosen on), seeds 100–115
the REPORT set.

Every web runs in the offline model (:mod:`analysis.model`, the daemon's own estimator and
plan against drawn change times, re-planning by the daemon's own rule at its defaults,
:mod:`refresher.refresh._replan`; ``--resolve-interval`` re-plans on a clock alone instead) for
``--runs`` draws of the change times, the same draws for every policy: uniform; optimal as
planned (``--decide``); the clairvoyant optimum (the true rates, the same host caps, from the
same cold start); and the same three for age (uniform, optimal-age, clairvoyant optimal-age).
True mean freshness and age are measured over (h/2, h] for each horizon h (1, 5 and 30
minutes); the standard errors are over the draws, and those of the margins over the paired
differences. Printed per web and summed up; written to
``family.json`` and ``family.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from analysis import compare
from analysis._db import open_history, rows
from analysis.model import HISTORY, SITEMAPS, ModelSettings, ModelWeb, model_web, replay
from refresher.refresh._allocate import Plan, PolicyInputs, page_freshness
from refresher.refresh._replan import ReplanRule
from refresher.sim._simweb import RateClass, SimwebConfig
from refresher.sim._site import SITEMAP_LASTMODS, SitemapLastmod

__all__ = [
    "HORIZONS",
    "REAL",
    "REPORT",
    "STEADY_ROUNDS",
    "TUNE",
    "FamilyWeb",
    "chosen_seeds",
    "family_web",
    "goal_lines",
    "honesty",
    "main",
    "markdown_table",
    "measure_real",
    "measure_windows",
    "real_web",
    "run_history",
    "run_web",
    "steady_horizon",
    "web_arguments",
]

Float = NDArray[np.float64]

HORIZONS = (60.0, 300.0, 1800.0)  # seconds from a cold start
#: the steady state is measured over (h/2, h] for h = this many of uniform's rounds (each page
#: fetched once per round; at least the last of ``HORIZONS``): ``estimate.history``'s 32
#: intervals, as many as a page's estimate ever rests on. On TUNE web 7 (0.38 rounds a
#: minute) optimal's share of clairvoyant freshness stays within 0.5 % from 11 rounds to 90,
#: its age share, noisier (the clairvoyant age is small), is 72 % at 11 rounds and 84–116 % from
#: 23 on (2 draws). 30 minutes is 10 rounds on REPORT web 110.
STEADY_ROUNDS = 32
#: what learning can reach: optimal and optimal-age planning with the true rate of each page
#: fetched twice (:class:`analysis.model.ModelSettings` ``reveal``), against the clairvoyant
#: plans on the same draws, up to this horizon (seconds)
INFORMED_HORIZON = 300.0
#: the daemon's re-plan rule at its defaults (policy.resolve_interval, replan_share, replan_floor)
DEFAULT_REPLAN = ReplanRule()
TUNE = (*range(0, 8), 47, 50)  # 47 and 50: narrow rate spreads, which 0–7 lack
REPORT = tuple(range(100, 116))
#: REPORT webs also run with real daemons (``--real``): a wide log-normal mix without
#: validators, a bimodal one, a mostly static one with honest Last-Modified on 9 hosts, and the
#: one-host web crawled least often (1.6 rounds by 5 minutes); budgets of 2.7–6.3 fetches/s
REAL = (104, 105, 109, 110)
#: equal parts of each window of a real run, for the batch-means standard error
BLOCKS = 8
MAX_PAGES = 600
#: (label, policy, decide, oracle)
RUNS: tuple[tuple[str, str, str, bool], ...] = (
    ("uniform", "uniform", "plug-in", False),
    ("optimal", "optimal", "", False),
    ("clairvoyant", "optimal", "plug-in", True),
    ("optimal-age", "optimal-age", "", False),
    ("clairvoyant-age", "optimal-age", "plug-in", True),
)
#: (label, policy, decide, oracle, reveal): the informed bound and its clairvoyant reference
INFORMED_RUNS: tuple[tuple[str, str, str, bool, bool], ...] = (
    ("informed", "optimal", "", False, True),
    ("informed-clairvoyant", "optimal", "plug-in", True, False),
    ("informed-age", "optimal-age", "", False, True),
    ("informed-clairvoyant-age", "optimal-age", "plug-in", True, False),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyWeb:
    """One web of the family: its simweb config, budget (fetches/s), politeness delay
    (seconds per host) and a one-line description."""

    seed: int
    simweb: SimwebConfig
    budget: float
    min_delay: float
    label: str


def _mix(kind: str) -> tuple[RateClass, ...]:
    """Rate classes around a median of 1 change per rate unit (scaled per web)."""
    if kind.startswith("log-normal"):
        return (RateClass(name="all", share=1.0, median=1.0, sigma=float(kind.split("-")[-1])),)
    if kind == "bimodal":
        return (
            RateClass(name="slow", share=0.7, median=0.05, sigma=0.5),
            RateClass(name="fast", share=0.3, median=3.0, sigma=0.5),
        )
    return (  # mostly static
        RateClass(name="never", share=0.8),
        RateClass(name="some", share=0.2, median=1.0, sigma=1.0),
    )


MIXES = ("log-normal-0.5", "log-normal-1.5", "log-normal-2.5", "bimodal", "static")


def family_web(seed: int) -> FamilyWeb:
    """The family's web number ``seed`` (see the module docstring)."""
    rng = np.random.default_rng([20_261_123, seed])
    per_host = round(math.exp(rng.uniform(math.log(10), math.log(1000))))
    hosts = int(rng.integers(1, 13))
    hosts = max(1, min(hosts, MAX_PAGES // per_host))
    per_host = min(per_host, MAX_PAGES // hosts)
    kind = MIXES[int(rng.integers(len(MIXES)))]
    honest = ("all", "some", "none")[int(rng.integers(3))]
    none_share = {"all": 0.0, "some": 0.4, "none": 1.0}[honest]
    sitemaps = float(rng.choice([0.0, 0.5]))
    base = SimwebConfig(
        seed=seed,
        hosts=hosts,
        pages_per_host=per_host,
        rate_mix=_mix(kind),
        rate_unit=1.0,
        time_scale=1.0,
        validators_none_share=none_share,
        validators_wrong_share=0.0,
        sitemap_share=sitemaps,
        new_pages_per_minute=0.0,
        crawl_delay_share=0.0,
    )
    web = model_web(base)
    budget = float(np.exp(rng.uniform(math.log(2.0), math.log(20.0))))
    ratio = float(np.exp(rng.uniform(math.log(0.1), math.log(3.0))))  # B / Σλ
    total = float(web.rates.sum())
    scale = budget / ratio / total  # changes per second per unit of the mix
    simweb = replace(base, time_scale=scale)
    room = float(rng.choice([1.2, 3.0, 10.0]))  # Σ caps / B
    min_delay = hosts / (room * budget)
    label = (
        f"{hosts}×{per_host} {kind}, LM {honest}, sitemaps {sitemaps:.0%}, "
        f"B {budget:.1f}/s = {ratio:.2f}·Σλ, caps {room:g}·B"
    )
    return FamilyWeb(seed=seed, simweb=simweb, budget=budget, min_delay=min_delay, label=label)


def _windows(
    fetches: list[list[float]], changes: list[Float], horizons: Sequence[float]
) -> tuple[Float, Float]:
    """True mean freshness and age (seconds) over (h/2, h] for each horizon h. A page not yet
    fetched counts as stale, its age from its first change."""
    return measure_windows(fetches, changes, [(h / 2, h) for h in horizons])


def measure_windows(
    fetches: list[list[float]], changes: list[Float], windows: Sequence[tuple[float, float]]
) -> tuple[Float, Float]:
    """True mean freshness and age (seconds) over each window (a, b] (seconds from the cold
    start), from each page's fetch times and change times. A page not yet fetched counts as
    stale, its age from its first change."""
    fresh = np.zeros(len(windows))
    age = np.zeros(len(windows))
    for times, change in zip(fetches, changes, strict=True):
        t = np.concatenate(([0.0], np.asarray(times)))
        until = np.append(t[1:], np.inf)
        stale_at = np.append(change, np.inf)[np.searchsorted(change, t, side="right")]
        stale_f = stale_at.copy()
        stale_f[0] = 0.0  # no copy yet: stale for freshness, old from its first change
        for k, (lo, hi) in enumerate(windows):
            a = np.clip(t, lo, hi)
            b = np.clip(until, lo, hi)
            fresh[k] += float((np.clip(stale_f, a, b) - a).sum())
            s = np.clip(stale_at, a, b)
            with np.errstate(invalid="ignore"):
                old = 0.5 * ((b - stale_at) ** 2 - (s - stale_at) ** 2)
            age[k] += float(np.nan_to_num(old, nan=0.0).sum())
    span = np.array([hi - lo for lo, hi in windows]) * max(len(fetches), 1)
    return fresh / span, age / span


def steady_horizon(web: FamilyWeb, pages: int) -> float:
    """Seconds to the steady state of ``web`` (``pages`` crawlable pages): the time uniform
    takes to fetch every page :data:`STEADY_ROUNDS` times, at least the last of
    :data:`HORIZONS`."""
    return max(HORIZONS[-1], STEADY_ROUNDS * pages / web.budget)


def run_web(
    web: FamilyWeb,
    *,
    runs: int,
    horizon: float,
    decide: str,
    resolve_interval: float | None = None,
    replan: ReplanRule = DEFAULT_REPLAN,
    static: bool = True,
    explore: float = 0.05,
    mixture: bool = True,
    fit_spread: bool = True,
    steady: bool = False,
    informed: bool = False,
    work_conserving: bool = True,
    front_queues: int = 8,
    history: int = HISTORY,
    statistics: bool = True,
    sitemaps: str = "off",
    sitemap_interval: float = 0.0,
    sitemap_growth: float = 0.25,
) -> dict[str, Any]:
    """Every policy of ``RUNS`` on ``web``: per label, freshness and age per horizon per run.
    ``steady``: one more horizon, :func:`steady_horizon` (when ``horizon`` reaches the last
    of ``HORIZONS``). ``informed``: the runs of ``INFORMED_RUNS`` up to
    ``INFORMED_HORIZON``, under ``"informed_horizons"``."""
    horizons = [h for h in HORIZONS if h <= horizon]
    mweb: ModelWeb = model_web(web.simweb)
    if steady and horizon >= HORIZONS[-1]:
        horizons.append(steady_horizon(web, int(mweb.rates.size)))
    settings = ModelSettings(
        simweb=web.simweb,
        seconds=max(horizons),
        budget=web.budget,
        min_delay=web.min_delay,
        resolve_interval=resolve_interval,
        replan=replan,
        static=static,
        explore=explore,
        mixture=mixture,
        fit_spread=fit_spread,
        work_conserving=work_conserving,
        front_queues=front_queues,
        history=history,
        statistics=statistics,
        sitemaps=sitemaps,
        sitemap_interval=sitemap_interval,
        sitemap_growth=sitemap_growth,
    )
    out: dict[str, Any] = {"seed": web.seed, "label": web.label, "pages": int(mweb.rates.size)}
    out["horizons"] = horizons
    for label, policy, how, oracle in RUNS:
        s = replace(settings, oracle=oracle, decide=how or decide)
        out[label] = _draws(policy, mweb, s, runs, horizons)
    if informed:
        short = [h for h in horizons if h <= INFORMED_HORIZON]
        out["informed_horizons"] = short
        for label, policy, how, oracle, reveal in INFORMED_RUNS:
            s = replace(settings, seconds=max(short), oracle=oracle, reveal=reveal)
            out[label] = _draws(policy, mweb, replace(s, decide=how or decide), runs, short)
    return out


def _draws(
    policy: str, web: ModelWeb, settings: ModelSettings, runs: int, horizons: Sequence[float]
) -> dict[str, list[list[float]]]:
    """Freshness and age per horizon of ``runs`` modelled runs (change times of seeds 1 …)."""
    fresh, age = [], []
    for run in range(1, runs + 1):
        fetches, changes = replay(policy, web, settings, run)
        f, a = _windows(fetches, changes, horizons)
        fresh.append(f.tolist())
        age.append(a.tolist())
    return {"freshness": fresh, "age": age}


def run_history(run_dir: Path) -> tuple[list[list[float]], list[Float]]:
    """A finished real run (:func:`analysis.compare.run_side_by_side`'s directory of one
    policy): each seeded page's successful fetch times and its true change times, in seconds
    from the run's start, as :func:`analysis.model.replay` gives them for the model."""
    start = float(json.loads((run_dir / "run.json").read_text())["start"])
    con = open_history(run_dir / "refresher.duckdb", truth=run_dir / "truth.duckdb")
    try:
        urls = rows(
            con,
            "SELECT p.url FROM pages p JOIN (SELECT DISTINCT url FROM truth_pages) t"
            " ON t.url = p.url ORDER BY p.url",
        )
        fetched = rows(
            con,
            "SELECT p.url, r.refreshed_at AS t FROM refreshes r JOIN pages p ON p.id = r.page_id"
            " ORDER BY p.url, r.refreshed_at",
        )
        changed = rows(con, "SELECT url, changed_at AS t FROM truth_changes ORDER BY url, t")
    finally:
        con.close()
    index = {str(r["url"]): i for i, r in enumerate(urls)}
    fetches: list[list[float]] = [[] for _ in index]
    change_lists: list[list[float]] = [[] for _ in index]
    for table, into in ((fetched, fetches), (changed, change_lists)):
        for r in table:
            i = index.get(str(r["url"]))
            if i is not None:
                into[i].append(float(r["t"]) - start)
    return fetches, [np.array(c, dtype=np.float64) for c in change_lists]


def real_web(
    web: FamilyWeb,
    *,
    seconds: float,
    out: Path,
    policies: Sequence[str] = ("uniform", "optimal"),
    workers: int = 8,
    horizons: Sequence[float] | None = None,
    sitemaps: bool | SitemapLastmod = False,
) -> dict[str, Any]:
    """Real daemons on ``web``, every policy at the same time (each its own copy of the web,
    daemon and store under ``out/<policy>/``) for ``seconds``; per policy the true mean
    freshness and age over ``BLOCKS`` equal parts of (h/2, h] for each horizon h (default:
    those of ``HORIZONS`` up to ``seconds``), measured as the model measures them
    (:func:`measure_windows`).

    ``sitemaps``: False, discovery off (no sitemap fetched); True or a kind of lastmod
    (:data:`refresher.sim._site.SITEMAP_LASTMODS`; True is "honest"), the daemons read the
    web's sitemaps, which write their lastmods that way."""
    lastmod: SitemapLastmod = "honest" if isinstance(sitemaps, bool) else sitemaps
    settings = compare.CompareSettings(
        simweb=replace(web.simweb, sitemap_lastmod=lastmod),
        policies=tuple(policies),
        seconds=seconds,
        budget=web.budget,
        min_delay=web.min_delay,
        workers=workers,
        resolve_interval=5.0,
        explore=0.05,
        plots=False,
        sitemaps=sitemaps is not False,
    )
    compare.run_side_by_side(settings, out)
    result = measure_real(out, policies, seconds=seconds, seed=web.seed, horizons=horizons)
    return {**result, "label": web.label}


def measure_real(
    out: Path,
    policies: Sequence[str],
    *,
    seconds: float,
    seed: int,
    horizons: Sequence[float] | None = None,
) -> dict[str, Any]:
    """:func:`real_web`'s figures from finished runs in ``out/<policy>/``."""
    horizons = [h for h in HORIZONS if h <= seconds] if horizons is None else list(horizons)
    edges = [
        (h / 2 + h / 2 * k / BLOCKS, h / 2 + h / 2 * (k + 1) / BLOCKS)
        for h in horizons
        for k in range(BLOCKS)
    ]
    result: dict[str, Any] = {"seed": seed, "seconds": seconds, "horizons": horizons}
    for policy in policies:
        fetches, changes = run_history(out / policy)
        fresh, age = measure_windows(fetches, changes, edges)
        result[policy] = {
            "freshness": fresh.reshape(len(horizons), BLOCKS).tolist(),
            "age": age.reshape(len(horizons), BLOCKS).tolist(),
            "pages": len(fetches),
            "fetches": sum(len(f) for f in fetches),
        }
    shares = paired_shares(result)
    if shares:
        result["shares"] = shares
    return result


#: (share, numerator, denominator, kind): the paired shares of real runs against the real
#: clairvoyant (:data:`analysis.compare.CLAIRVOYANT`); an age share is clairvoyant / policy
PAIRED = (
    ("optimal/clairvoyant", "optimal", "clairvoyant", "freshness"),
    ("clairvoyant-age/optimal-age", "clairvoyant-age", "optimal-age", "age"),
)


def paired_shares(real: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per horizon, each :data:`PAIRED` share whose two runs are in ``real``: the ratio of the
    two runs' mean over the blocks (same web, change times and start: paired) and its
    batch-means s.e. by the delta method over the paired blocks (the sd of aᵦ − share·bᵦ
    over √blocks, divided by the denominator's mean)."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, top, bottom, kind in PAIRED:
        if top not in real or bottom not in real:
            continue
        a, b = np.array(real[top][kind]), np.array(real[bottom][kind])
        share = a.mean(axis=1) / b.mean(axis=1)
        spread = (a - share[:, None] * b).std(axis=1, ddof=1) / math.sqrt(a.shape[1])
        out[name] = {"share": share.tolist(), "se": (spread / b.mean(axis=1)).tolist()}
    return out


def summarize_real(real: dict[str, Any], label: str, kind: str) -> tuple[Float, Float]:
    """Per horizon, the mean over the blocks of a real run and its batch-means s.e."""
    blocks = np.array(real[label][kind])
    return blocks.mean(axis=1), blocks.std(axis=1, ddof=1) / math.sqrt(blocks.shape[1])


def format_real(real: dict[str, Any], model: dict[str, Any] | None) -> str:
    """The real daemons' true freshness (and age) per horizon beside the model's for the
    same web and policies."""
    lines = [f"web {real['seed']} real daemons, {real['seconds']:g} s side by side"]
    labels = [k for k, _, _, _ in RUNS if k in real]
    summary = summarize(model) if model is not None else None
    shares = paired_shares(real)
    for k, h in enumerate(real["horizons"]):
        for kind, fmt in (("freshness", ".4f"), ("age", ".3g")):
            parts = []
            for label in labels:
                m, e = (x[k] for x in summarize_real(real, label, kind))
                cell = f"{label} {m:{fmt}}±{e:{fmt}}"
                if summary is not None and k < len(summary[f"{label}.{kind}"][0]):
                    mm, me = (x[k] for x in summary[f"{label}.{kind}"])
                    cell += f" (model {mm:{fmt}}±{me:{fmt}})"
                parts.append(cell)
            if kind == "freshness" and {"uniform", "optimal"} <= set(labels):
                (u, ue), (o, oe) = (
                    (x[k] for x in summarize_real(real, name, kind))
                    for name in ("uniform", "optimal")
                )
                parts.append(f"Δ {o - u:+.4f}±{math.hypot(ue, oe):.4f}")
            parts += _share_cells(shares, summary, kind, k)
            unit = "F" if kind == "freshness" else "age (s)"
            lines.append(f"  {h / 60:>4g} min  {unit}  " + "  ".join(parts))
    return "\n".join(lines)


def _share_cells(
    shares: dict[str, dict[str, list[float]]], summary: dict[str, Any] | None, kind: str, k: int
) -> list[str]:
    """The paired ``shares`` (:func:`paired_shares`) for ``kind`` at horizon ``k``, each beside
    the model's share for the same web (over other draws of the change times)."""
    cells = []
    for name, _, _, of in PAIRED:
        got = shares.get(name)
        if of != kind or got is None:
            continue
        cell = f"share {name} {got['share'][k]:.1%}±{got['se'][k]:.1%}"
        model_key = "share" if of == "freshness" else "age_share"
        if summary is not None and k < len(summary.get(model_key, ())):
            cell += f" (model {summary[model_key][k]:.1%})"
        cells.append(cell)
    return cells


def honesty(web: FamilyWeb, *, seconds: float = 900.0, run: int = 1) -> tuple[float, float]:
    """(estimated, true) mean freshness of optimal over the last quarter of a modelled run of
    ``seconds``: the plan's own estimate (:func:`refresher.refresh._allocate.page_freshness`,
    what status, the metrics and the stored λ̂ report) averaged over the plans made in the
    window, and the truth from the change times."""
    settings = ModelSettings(
        simweb=web.simweb,
        seconds=seconds,
        budget=web.budget,
        min_delay=web.min_delay,
        decide="expected",
    )
    start = 0.75 * seconds
    estimates: list[float] = []

    def seen(now: float, inputs: PolicyInputs, made: Plan) -> None:
        if now >= start:
            estimates.append(float(np.mean(page_freshness(inputs, made.target))))

    fetches, changes = replay("optimal", model_web(web.simweb), settings, run, on_plan=seen)
    fresh, _ = measure_windows(fetches, changes, [(start, seconds)])
    return float(np.mean(estimates)), float(fresh[0])


def _honesty(seeds: Sequence[int], runs: int) -> int:
    """``--honesty``: per web the estimated and true freshness of :func:`honesty` over
    ``runs`` draws, their gap's mean with its standard error over the draws."""
    means = []
    for seed in seeds:
        pairs = np.array([honesty(family_web(seed), run=run) for run in range(1, runs + 1)])
        gaps = pairs[:, 0] - pairs[:, 1]
        gap, se = (float(x) for x in _mean_se(gaps))
        est, true = pairs.mean(axis=0)
        means.append(gap)
        print(
            f"web {seed}: estimated {est:.4f}  true {true:.4f}  gap {gap:+.4f} ± {se:.4f}"
            f"  (largest of {runs} draws {max(gaps, key=abs):+.4f})",
            flush=True,
        )
    print(f"largest mean gap {max(means, key=abs):+.4f} over {len(means)} webs, {runs} draws each")
    return 0


def _mean_se(values: Float) -> tuple[Float, Float]:
    n = values.shape[0]
    se = values.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full(values.shape[1:], np.nan)
    return values.mean(axis=0), se


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per horizon: uniform / optimal / clairvoyant means and s.e.; the margin of optimal over
    uniform (paired s.e.); optimal's share of clairvoyant; the same for age (lower is better,
    share = clairvoyant age / optimal-age age)."""
    s: dict[str, Any] = {}
    for label, _, _, _ in RUNS:
        for kind in ("freshness", "age"):
            m, e = _mean_se(np.array(result[label][kind]))
            s[f"{label}.{kind}"] = (m.tolist(), e.tolist())
    u, o = np.array(result["uniform"]["freshness"]), np.array(result["optimal"]["freshness"])
    c = np.array(result["clairvoyant"]["freshness"])
    s["margin"] = [x.tolist() for x in _mean_se(o - u)]
    s["share"] = (o.mean(axis=0) / c.mean(axis=0)).tolist()
    ua, oa = np.array(result["uniform"]["age"]), np.array(result["optimal-age"]["age"])
    ca = np.array(result["clairvoyant-age"]["age"])
    s["age_margin"] = [x.tolist() for x in _mean_se(ua - oa)]  # > 0: optimal-age younger
    with np.errstate(divide="ignore", invalid="ignore"):
        s["age_share"] = (ca.mean(axis=0) / oa.mean(axis=0)).tolist()
    if "informed" in result:  # the informed bound, against the clairvoyant on its own draws
        i, ic = (np.array(result[k]["freshness"]) for k in ("informed", "informed-clairvoyant"))
        ia, ica = (np.array(result[k]["age"]) for k in ("informed-age", "informed-clairvoyant-age"))
        s["informed_share"] = (i.mean(axis=0) / ic.mean(axis=0)).tolist()
        with np.errstate(divide="ignore", invalid="ignore"):
            s["informed_age_share"] = (ica.mean(axis=0) / ia.mean(axis=0)).tolist()
    return s


def horizon_name(result: dict[str, Any], k: int) -> str:
    """The ``k``-th horizon of ``result``: minutes, "steady" past ``HORIZONS``."""
    h = float(result["horizons"][k])
    return f"{h / 60:g} min" if k < len(HORIZONS) else f"steady {h / 60:.0f} min"


def _informed(summary: dict[str, Any], k: int) -> str:
    """The informed bound at the ``k``-th horizon, if it was run there."""
    if k >= len(summary.get("informed_share", ())):
        return ""
    share, age = summary["informed_share"][k], summary["informed_age_share"][k]
    return f"   informed bound {share:.1%}, age {age:.1%}"


def format_row(result: dict[str, Any], summary: dict[str, Any]) -> str:
    lines = [f"web {result['seed']}: {result['pages']} pages, {result['label']}"]
    for k in range(len(result["horizons"])):
        u, ue = (x[k] for x in summary["uniform.freshness"])
        o, oe = (x[k] for x in summary["optimal.freshness"])
        c = summary["clairvoyant.freshness"][0][k]
        d, de = (x[k] for x in summary["margin"])
        ua = summary["uniform.age"][0][k]
        oa = summary["optimal-age.age"][0][k]
        ca = summary["clairvoyant-age.age"][0][k]
        lines.append(
            f"  {horizon_name(result, k):>8}  F uniform {u:.4f}±{ue:.4f}  "
            f"optimal {o:.4f}±{oe:.4f}  "
            f"clairvoyant {c:.4f}  Δ {d:+.4f}±{de:.4f}  {summary['share'][k]:.1%}   "
            f"age (s) uniform {ua:.3g}  optimal-age {oa:.3g}  clairvoyant {ca:.3g}  "
            f"{summary['age_share'][k]:.1%}" + _informed(summary, k)
        )
    return "\n".join(lines)


def plot_family(results: list[dict[str, Any]], path: Path) -> Path:
    """Optimal's share of clairvoyant freshness and its margin over uniform, per web and
    horizon (the steady state too where it was run); the informed bound at 5 minutes as
    marks where it was run."""
    fig = Figure(figsize=(12, 4.5))
    ax1, ax2 = fig.subplots(1, 2)
    n = max((len(r["horizons"]) for r in results), default=0)
    width = 0.8 / max(n, 1)
    seeds = [str(r["seed"]) for r in results]
    for k in range(n):
        at = [j for j, r in enumerate(results) if len(r["horizons"]) > k]
        x = np.array(at) + (k - (n - 1) / 2) * width
        sums = [summarize(results[j]) for j in at]
        label = "steady (32 rounds)" if k >= len(HORIZONS) else f"{HORIZONS[k] / 60:g} min"
        ax1.bar(x, [s["share"][k] for s in sums], width=width, label=label)
        err = [2 * s["margin"][1][k] for s in sums]
        ax2.errorbar(x, [s["margin"][0][k] for s in sums], yerr=err, fmt="o", ms=3, label=label)
    five = HORIZONS.index(300.0)
    bound = [
        (j, summarize(r))
        for j, r in enumerate(results)
        if len(r.get("informed_horizons", ())) > five
    ]
    if bound:
        x = np.array([j for j, _ in bound]) + (five - (n - 1) / 2) * width
        ax1.plot(
            x,
            [s["informed_share"][five] for _, s in bound],
            "k_",
            ms=9,
            mew=2,
            label="informed bound, 5 min",
        )
    for ax in (ax1, ax2):
        ax.set_xticks(np.arange(len(seeds)), seeds, fontsize=7)
    goal_lines(ax1)
    ax1.set_ylim(0.8, 1.04)
    ax1.set_title("optimal / clairvoyant true freshness")
    ax2.axhline(0.0, color="k", lw=0.8)
    ax2.set_title("optimal − uniform (± 2 s.e.)")
    for ax in (ax1, ax2):
        ax.set_xlabel("web")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def goal_lines(ax: Any) -> None:
    """The goals on a share axis: 97 % (dashed) and 99 % (dotted) of the clairvoyant."""
    ax.axhline(0.97, color="k", lw=0.8, ls="--")
    ax.axhline(0.99, color="k", lw=0.8, ls=":")


def web_arguments(parser: argparse.ArgumentParser) -> None:
    """``--set`` and ``--seeds``: which webs of the family (:func:`chosen_seeds`)."""
    parser.add_argument("--set", choices=("tune", "report"), default="report")
    parser.add_argument("--seeds", default="", help="comma-separated web seeds (overrides --set)")


def chosen_seeds(args: argparse.Namespace) -> tuple[int, ...]:
    """The web seeds :func:`web_arguments` asked for."""
    if args.seeds:
        return tuple(int(x) for x in args.seeds.split(","))
    return TUNE if args.set == "tune" else REPORT


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.family",
        description="Uniform / optimal / clairvoyant true freshness over a family of webs.",
    )
    web_arguments(parser)
    parser.add_argument("--webs", type=int, default=0, help="first N webs of the set (0: all)")
    parser.add_argument("--runs", type=int, default=3, help="draws of the change times")
    parser.add_argument("--horizon", type=float, default=HORIZONS[-1], help="seconds")
    parser.add_argument(
        "--steady",
        action="store_true",
        help=f"also measure the steady state: {STEADY_ROUNDS} of uniform's rounds per page "
        "(at least 30 minutes; needs the default --horizon)",
    )
    parser.add_argument(
        "--informed",
        action="store_true",
        help="also the informed bound up to 5 minutes: optimal and optimal-age planning with "
        "the true rate of each page once fetched twice, against the clairvoyant plans",
    )
    parser.add_argument("--decide", choices=("plug-in", "expected"), default="expected")
    parser.add_argument(
        "--resolve-interval",
        type=float,
        default=None,
        help="re-plan every this many seconds alone (default: the daemon's re-plan rule)",
    )
    parser.add_argument(
        "--replan-share",
        type=float,
        default=DEFAULT_REPLAN.share,
        help="the re-plan rule's share of the pages fetched since the last plan",
    )
    parser.add_argument(
        "--replan-floor",
        type=float,
        default=DEFAULT_REPLAN.floor,
        help="the re-plan rule's floor, seconds",
    )
    parser.add_argument("--explore", type=float, default=0.05, help="policy.explore")
    parser.add_argument(
        "--no-static", action="store_true", help="plan without P(page never changes)"
    )
    parser.add_argument(
        "--no-mixture",
        action="store_true",
        help="centre the rate prior on every page, not only on those that change",
    )
    parser.add_argument(
        "--fixed-spread",
        action="store_true",
        help="plan with the prior's sd as configured (2), not fitted to the pages",
    )
    parser.add_argument(
        "--no-work-conserving",
        action="store_true",
        help="model the frontier before work conservation: a page only once due",
    )
    parser.add_argument(
        "--front-queues",
        type=int,
        default=8,
        help="the daemon's front queues ordering a re-plan's overdue pages by value "
        "(frontier.front_queues); 0: earliest due first, the model before",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=HISTORY,
        help="observations a page's estimate is worth at most (estimate.history)",
    )
    parser.add_argument(
        "--window",
        action="store_true",
        help="estimate from each page's last --history intervals, not the daemon's per-page "
        "statistics of all of them (the model before)",
    )
    parser.add_argument(
        "--sitemaps",
        choices=SITEMAPS,
        default="off",
        help="the web's sitemap hosts' sitemaps: never fetched, fetched once at the start, or "
        "read by the estimator with each page's true last change, one build time for every "
        "page, or the read's time as lastmod",
    )
    parser.add_argument(
        "--sitemap-interval",
        type=float,
        default=0.0,
        help="seconds between a host's sitemap reads (0: one uniform round)",
    )
    parser.add_argument(
        "--sitemap-growth",
        type=float,
        default=0.25,
        help="a read at t seconds is followed by the next after max(interval, growth × t)",
    )
    parser.add_argument(
        "--honesty",
        action="store_true",
        help="instead: optimal's estimated against true freshness, last quarter of 15 minutes, "
        "over --runs draws",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--real",
        nargs="?",
        const=",".join(map(str, REAL)),
        default="",
        help="also run real daemons side by side on these webs (comma-separated seeds; "
        f"alone: {','.join(map(str, REAL))}); needs --out",
    )
    parser.add_argument("--real-seconds", type=float, default=300.0, help="per real run")
    parser.add_argument(
        "--real-sitemaps",
        nargs="?",
        choices=SITEMAP_LASTMODS,
        const="honest",
        default=None,
        help="with --real: the daemons read the webs' sitemaps (discovery on at depth 0), whose "
        "lastmods are honest (alone), honest dates, a build time or the time served "
        "(default: discovery off, no sitemap fetched)",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="with --real: measure the runs already under --out/real again, run no daemons",
    )
    parser.add_argument(
        "--real-policies",
        default="uniform,optimal",
        help="run side by side on each web: policies, and clairvoyant / clairvoyant-age "
        "(optimal / optimal-age with the web's true rates as estimate.known_rates); with "
        "optimal and clairvoyant both, the paired share optimal/clairvoyant is printed",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="with --replot: also print README's table"
    )
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="*",
        default=None,
        help="family.json files of earlier runs: print their summary and plot them together",
    )
    args = parser.parse_args(argv)
    if args.replot:
        return _replot(args.replot, args.out, args.markdown)
    if args.runs < 2 or args.horizon < HORIZONS[0] or args.real_seconds < HORIZONS[0]:
        print(
            "analysis.family: --runs must be ≥ 2, --horizon and --real-seconds ≥ 60 s",
            file=sys.stderr,
        )
        return 2
    real = tuple(int(x) for x in args.real.split(",") if x.strip())
    if real and args.out is None:
        print("analysis.family: --real needs --out DIR for the daemons' runs", file=sys.stderr)
        return 2
    seeds = chosen_seeds(args)
    if args.webs:
        seeds = seeds[: args.webs]
    if args.honesty:
        return _honesty(seeds, args.runs)
    results = []

    def model(seed: int, horizon: float) -> dict[str, Any]:
        return run_web(
            family_web(seed),
            runs=args.runs,
            horizon=horizon,
            decide=args.decide,
            resolve_interval=args.resolve_interval,
            replan=replace(DEFAULT_REPLAN, share=args.replan_share, floor=args.replan_floor),
            static=not args.no_static,
            explore=args.explore,
            mixture=not args.no_mixture,
            fit_spread=not args.fixed_spread,
            steady=args.steady,
            informed=args.informed,
            work_conserving=not args.no_work_conserving,
            front_queues=args.front_queues,
            history=args.history,
            statistics=not args.window,
            sitemaps=args.sitemaps,
            sitemap_interval=args.sitemap_interval,
            sitemap_growth=args.sitemap_growth,
        )

    for seed in seeds:
        result = model(seed, args.horizon)
        results.append(result)
        print(format_row(result, summarize(result)), flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "family.json").write_text(json.dumps(results, indent=1))
    if results:
        _overall(results)
    if args.out is not None and results:
        plot_family(results, args.out / "family.png")
    if real:
        assert args.out is not None
        _real(real, args, {int(r["seed"]): r for r in results}, model)
    return 0


def _real(
    seeds: Sequence[int],
    args: argparse.Namespace,
    models: dict[int, dict[str, Any]],
    model: Any,
) -> None:
    """The real-daemon subset: each web's daemons side by side, printed beside the model's
    figures for the same web (run here for a web the sweep left out); ``real.json``."""
    policies = tuple(p.strip() for p in args.real_policies.split(",") if p.strip())
    out: list[dict[str, Any]] = []
    for seed in seeds:
        if seed not in models:
            models[seed] = model(seed, args.real_seconds)
        web, runs = family_web(seed), args.out / "real" / str(seed)
        if args.remeasure:
            result = measure_real(runs, policies, seconds=args.real_seconds, seed=seed)
            result["label"] = web.label
        else:
            result = real_web(
                web,
                seconds=args.real_seconds,
                out=runs,
                policies=policies,
                sitemaps=args.real_sitemaps or False,
            )
        out.append(result)
        print(format_real(result, models[seed]), flush=True)
        (args.out / "real.json").write_text(json.dumps(out, indent=1))


def markdown_table(results: list[dict[str, Any]]) -> str:
    """README's table: per web and horizon uniform / optimal / clairvoyant true freshness,
    the margin with its s.e., optimal's share of clairvoyant; the age shares at the end."""
    heads = ["web", "pages, mix, Last-Modified, B/Σλ, caps", "rounds by 5 min"]
    for h in HORIZONS:
        heads += [f"{h / 60:g} min: uniform / optimal / clairvoyant", "Δ ± s.e.", "share"]
    heads.append("age share " + " / ".join(f"{h / 60:g}" for h in HORIZONS) + " min")
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in results:
        s = summarize(r)
        label = r["label"].replace(", sitemaps 0%", "").replace(", sitemaps 50%", "")
        rounds = 300.0 * family_web(int(r["seed"])).budget / r["pages"]  # uniform's, per page
        cells = [str(r["seed"]), f"{r['pages']} p. ({label})", f"{rounds:.1f}"]
        for k in range(len(HORIZONS)):
            if k >= len(r["horizons"]):
                cells += ["", "", ""]
                continue
            u, o, c = (s[f"{n}.freshness"][0][k] for n in ("uniform", "optimal", "clairvoyant"))
            d, e = (x[k] for x in s["margin"])
            share = f"{s['share'][k]:.1%}"
            cells += [f"{u:.3f} / {o:.3f} / {c:.3f}", f"{d:+.4f} ± {e:.4f}", share]
        cells.append(" / ".join(f"{x:.0%}" for x in s["age_share"][: len(HORIZONS)]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_steady(results: list[dict[str, Any]]) -> str:
    """README's second table: per web the steady state (:data:`STEADY_ROUNDS` rounds) and,
    at 5 minutes, optimal's and optimal-age's shares beside the informed bound's."""
    heads = [
        "web",
        "rounds by 5 min",
        "5 min: share / informed bound",
        "5 min age share / informed bound",
        "steady: minutes (rounds)",
        "steady: uniform / optimal / clairvoyant",
        "Δ ± s.e.",
        "share",
        "age share",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    five, steady = HORIZONS.index(300.0), len(HORIZONS)
    for r in results:
        s = summarize(r)
        web = family_web(int(r["seed"]))
        rounds = 300.0 * web.budget / r["pages"]
        cells = [str(r["seed"]), f"{rounds:.1f}"]
        if len(r["horizons"]) > five:
            bound = len(s.get("informed_share", ())) > five
            shares = (s["share"][five], s["age_share"][five])
            bounds = (s["informed_share"][five], s["informed_age_share"][five]) if bound else None
            cells += [
                f"{shares[0]:.1%} / " + (f"{bounds[0]:.1%}" if bounds else "–"),
                f"{shares[1]:.0%} / " + (f"{bounds[1]:.0%}" if bounds else "–"),
            ]
        else:
            cells += ["–", "–"]
        if len(r["horizons"]) > steady:
            h = float(r["horizons"][steady])
            u, o, c = (
                s[f"{n}.freshness"][0][steady] for n in ("uniform", "optimal", "clairvoyant")
            )
            d, e = (x[steady] for x in s["margin"])
            cells += [
                f"{h / 60:.0f} ({h * web.budget / r['pages']:.0f})",
                f"{u:.3f} / {o:.3f} / {c:.3f}",
                f"{d:+.4f} ± {e:.4f}",
                f"{s['share'][steady]:.1%}",
                f"{s['age_share'][steady]:.0%}",
            ]
        else:
            cells += ["–"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _replot(paths: Sequence[Path], out: Path | None, markdown: bool = False) -> int:
    results = [r for p in paths for r in json.loads(p.read_text())]
    results.sort(key=lambda r: int(r["seed"]))
    for r in results:
        print(format_row(r, summarize(r)))
    _overall(results)
    if markdown:
        print(markdown_table(results))
        print()
        print(markdown_steady(results))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        plot_family(results, out / "family.png")
    return 0


def _overall(results: list[dict[str, Any]]) -> None:
    """The goals, over every web: worst share of clairvoyant, webs where optimal lost to
    uniform by more than 2 s.e."""
    for k in range(max((len(r["horizons"]) for r in results), default=0)):
        rows = [summarize(r) for r in results if len(r["horizons"]) > k]
        name = f"{HORIZONS[k] / 60:g} min" if k < len(HORIZONS) else "steady state"
        shares = [s["share"][k] for s in rows]
        age_shares = [s["age_share"][k] for s in rows]
        lost = sum(1 for s in rows if s["margin"][0][k] < -2 * s["margin"][1][k])
        age_lost = sum(1 for s in rows if s["age_margin"][0][k] < -2 * s["age_margin"][1][k])
        print(
            f"{name} over {len(rows)} webs: optimal/clairvoyant min {min(shares):.1%} "
            f"mean {np.mean(shares):.1%}; lost to uniform (> 2 s.e.) on {lost}; "
            f"age: clairvoyant/optimal-age min {min(age_shares):.1%} "
            f"mean {np.mean(age_shares):.1%}; older than uniform on {age_lost}"
        )
        bounds = [s for s in rows if len(s.get("informed_share", ())) > k]
        if bounds:
            fb = [s["informed_share"][k] for s in bounds]
            ab = [s["informed_age_share"][k] for s in bounds]
            print(
                f"  informed bound over {len(bounds)} webs: freshness min {min(fb):.1%} "
                f"mean {np.mean(fb):.1%}, below 97 % on {sum(x < 0.97 for x in fb)}; "
                f"age min {min(ab):.1%} mean {np.mean(ab):.1%}, "
                f"below 97 % on {sum(x < 0.97 for x in ab)}"
            )


if __name__ == "__main__":
    sys.exit(main())
