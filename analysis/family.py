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
plan against drawn change times) for ``--runs`` draws of the change times, the same draws for
every policy: uniform; optimal as planned (``--decide``); the clairvoyant optimum (the true
rates, the same host caps, from the same cold start); and the same three for age (uniform,
optimal-age, clairvoyant optimal-age). True mean freshness and age are measured over
(h/2, h] for each horizon h (1, 5 and 30 minutes); the standard errors are over the draws, and
those of the margins over the paired differences. Printed per web and summed up; written to
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

from analysis.model import ModelSettings, ModelWeb, model_web, replay
from refresher.sim._simweb import RateClass, SimwebConfig

__all__ = ["HORIZONS", "REPORT", "TUNE", "FamilyWeb", "family_web", "main", "run_web"]

Float = NDArray[np.float64]

HORIZONS = (60.0, 300.0, 1800.0)  # seconds from a cold start
TUNE = (*range(0, 8), 47, 50)  # 47 and 50: narrow rate spreads, which 0–7 lack
REPORT = tuple(range(100, 116))
MAX_PAGES = 600
#: (label, policy, decide, oracle)
RUNS: tuple[tuple[str, str, str, bool], ...] = (
    ("uniform", "uniform", "plug-in", False),
    ("optimal", "optimal", "", False),
    ("clairvoyant", "optimal", "plug-in", True),
    ("optimal-age", "optimal-age", "", False),
    ("clairvoyant-age", "optimal-age", "plug-in", True),
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
    fresh = np.zeros(len(horizons))
    age = np.zeros(len(horizons))
    for times, change in zip(fetches, changes, strict=True):
        t = np.concatenate(([0.0], np.asarray(times)))
        until = np.append(t[1:], np.inf)
        stale_at = np.append(change, np.inf)[np.searchsorted(change, t, side="right")]
        stale_f = stale_at.copy()
        stale_f[0] = 0.0  # no copy yet: stale for freshness, old from its first change
        for k, h in enumerate(horizons):
            a = np.clip(t, h / 2, h)
            b = np.clip(until, h / 2, h)
            fresh[k] += float((np.clip(stale_f, a, b) - a).sum())
            s = np.clip(stale_at, a, b)
            with np.errstate(invalid="ignore"):
                old = 0.5 * ((b - stale_at) ** 2 - (s - stale_at) ** 2)
            age[k] += float(np.nan_to_num(old, nan=0.0).sum())
    span = np.array([h / 2 for h in horizons]) * len(fetches)
    return fresh / span, age / span


def run_web(
    web: FamilyWeb,
    *,
    runs: int,
    horizon: float,
    decide: str,
    resolve_interval: float,
    static: bool = True,
    explore: float = 0.05,
    mixture: bool = True,
) -> dict[str, Any]:
    """Every policy of ``RUNS`` on ``web``: per label, freshness and age per horizon per run."""
    horizons = [h for h in HORIZONS if h <= horizon]
    settings = ModelSettings(
        simweb=web.simweb,
        seconds=max(horizons),
        budget=web.budget,
        min_delay=web.min_delay,
        resolve_interval=resolve_interval,
        static=static,
        explore=explore,
        mixture=mixture,
    )
    mweb: ModelWeb = model_web(web.simweb)
    out: dict[str, Any] = {"seed": web.seed, "label": web.label, "pages": int(mweb.rates.size)}
    out["horizons"] = horizons
    for label, policy, how, oracle in RUNS:
        s = replace(settings, oracle=oracle, decide=how or decide)
        fresh, age = [], []
        for run in range(1, runs + 1):
            fetches, changes = replay(policy, mweb, s, run)
            f, a = _windows(fetches, changes, horizons)
            fresh.append(f.tolist())
            age.append(a.tolist())
        out[label] = {"freshness": fresh, "age": age}
    return out


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
    return s


def format_row(result: dict[str, Any], summary: dict[str, Any]) -> str:
    lines = [f"web {result['seed']}: {result['pages']} pages, {result['label']}"]
    for k, h in enumerate(result["horizons"]):
        u, ue = (x[k] for x in summary["uniform.freshness"])
        o, oe = (x[k] for x in summary["optimal.freshness"])
        c = summary["clairvoyant.freshness"][0][k]
        d, de = (x[k] for x in summary["margin"])
        ua = summary["uniform.age"][0][k]
        oa = summary["optimal-age.age"][0][k]
        ca = summary["clairvoyant-age.age"][0][k]
        lines.append(
            f"  {h / 60:>4g} min  F uniform {u:.4f}±{ue:.4f}  optimal {o:.4f}±{oe:.4f}  "
            f"clairvoyant {c:.4f}  Δ {d:+.4f}±{de:.4f}  {summary['share'][k]:.1%}   "
            f"age (s) uniform {ua:.3g}  optimal-age {oa:.3g}  clairvoyant {ca:.3g}  "
            f"{summary['age_share'][k]:.1%}"
        )
    return "\n".join(lines)


def plot_family(results: list[dict[str, Any]], path: Path) -> Path:
    """Optimal's share of clairvoyant freshness and its margin over uniform, per web and
    horizon."""
    fig = Figure(figsize=(11, 4.5))
    ax1, ax2 = fig.subplots(1, 2)
    for k, h in enumerate(HORIZONS):
        rows = [r for r in results if len(r["horizons"]) > k]
        if not rows:
            continue
        x = np.arange(len(rows)) + (k - 1) * 0.25
        share = [summarize(r)["share"][k] for r in rows]
        margin = [summarize(r)["margin"][0][k] for r in rows]
        err = [2 * summarize(r)["margin"][1][k] for r in rows]
        ax1.bar(x, share, width=0.25, label=f"{h / 60:g} min")
        ax2.errorbar(x, margin, yerr=err, fmt="o", ms=3, label=f"{h / 60:g} min")
    seeds = [str(r["seed"]) for r in results]
    for ax in (ax1, ax2):
        ax.set_xticks(np.arange(len(seeds)), seeds, fontsize=7)
    ax1.axhline(0.97, color="k", lw=0.8, ls="--")
    ax1.set_ylim(0.8, 1.02)
    ax1.set_title("optimal / clairvoyant true freshness")
    ax2.axhline(0.0, color="k", lw=0.8)
    ax2.set_title("optimal − uniform (± 2 s.e.)")
    for ax in (ax1, ax2):
        ax.set_xlabel("web")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.family",
        description="Uniform / optimal / clairvoyant true freshness over a family of webs.",
    )
    parser.add_argument("--set", choices=("tune", "report"), default="report")
    parser.add_argument("--webs", type=int, default=0, help="first N webs of the set (0: all)")
    parser.add_argument("--seeds", default="", help="comma-separated web seeds (overrides --set)")
    parser.add_argument("--runs", type=int, default=3, help="draws of the change times")
    parser.add_argument("--horizon", type=float, default=HORIZONS[-1], help="seconds")
    parser.add_argument("--decide", choices=("plug-in", "expected"), default="expected")
    parser.add_argument("--resolve-interval", type=float, default=5.0)
    parser.add_argument("--explore", type=float, default=0.05, help="policy.explore")
    parser.add_argument(
        "--no-static", action="store_true", help="plan without P(page never changes)"
    )
    parser.add_argument(
        "--no-mixture",
        action="store_true",
        help="centre the rate prior on every page, not only on those that change",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="*",
        default=None,
        help="family.json files of earlier runs: print their summary and plot them together",
    )
    args = parser.parse_args(argv)
    if args.replot:
        return _replot(args.replot, args.out)
    if args.runs < 2 or args.horizon < HORIZONS[0]:
        print("analysis.family: --runs must be ≥ 2 and --horizon ≥ 60 s", file=sys.stderr)
        return 2
    seeds = TUNE if args.set == "tune" else REPORT
    if args.seeds:
        seeds = tuple(int(x) for x in args.seeds.split(","))
    if args.webs:
        seeds = seeds[: args.webs]
    results = []
    for seed in seeds:
        web = family_web(seed)
        result = run_web(
            web,
            runs=args.runs,
            horizon=args.horizon,
            decide=args.decide,
            resolve_interval=args.resolve_interval,
            static=not args.no_static,
            explore=args.explore,
            mixture=not args.no_mixture,
        )
        results.append(result)
        print(format_row(result, summarize(result)), flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "family.json").write_text(json.dumps(results, indent=1))
    _overall(results)
    if args.out is not None:
        plot_family(results, args.out / "family.png")
    return 0


def _replot(paths: Sequence[Path], out: Path | None) -> int:
    results = [r for p in paths for r in json.loads(p.read_text())]
    results.sort(key=lambda r: int(r["seed"]))
    for r in results:
        print(format_row(r, summarize(r)))
    _overall(results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        plot_family(results, out / "family.png")
    return 0


def _overall(results: list[dict[str, Any]]) -> None:
    """The goals, over every web: worst share of clairvoyant, webs where optimal lost to
    uniform by more than 2 s.e."""
    for k, h in enumerate(HORIZONS):
        rows = [summarize(r) for r in results if len(r["horizons"]) > k]
        if not rows:
            continue
        shares = [s["share"][k] for s in rows]
        age_shares = [s["age_share"][k] for s in rows]
        lost = sum(1 for s in rows if s["margin"][0][k] < -2 * s["margin"][1][k])
        age_lost = sum(1 for s in rows if s["age_margin"][0][k] < -2 * s["age_margin"][1][k])
        print(
            f"{h / 60:g} min over {len(rows)} webs: optimal/clairvoyant min {min(shares):.1%} "
            f"mean {np.mean(shares):.1%}; lost to uniform (> 2 s.e.) on {lost}; "
            f"age: clairvoyant/optimal-age min {min(age_shares):.1%} "
            f"mean {np.mean(age_shares):.1%}; older than uniform on {age_lost}"
        )


if __name__ == "__main__":
    sys.exit(main())
