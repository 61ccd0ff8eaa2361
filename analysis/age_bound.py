"""Why optimal-age stays short of the clairvoyant age at the steady state: what the plans are
worth, scored with the true rates, and a bound for any plan that learns from its fetches.

Usage, from the repository root::

    python -m analysis.age_bound --set report --runs 2 --out var/age-bound

Per web of the family (:mod:`analysis.family`), optimal-age runs in the offline model to the
steady state (:func:`analysis.family.steady_horizon`) and every plan it makes over the
measured window (h/2, h] is kept. Scored with the true rates, Σ Ā(λᵢ, fᵢ) (seconds, per
page), without the noise of one draw of the change times:

* **plan**: the clairvoyant plan's age / optimal-age's mean plan's age (the share of the
  family's table, less the draw noise);
* **alike bound**: the clairvoyant age / the age of the best plan that knows every true rate
  but must fetch the *quiet* pages alike, those that showed no change in any interval of the
  run (:func:`quiet_pages`). A learner cannot tell such pages apart from their fetches: each
  shows the same run of unchanged intervals. It can do no better than this plan, which picks
  the one rate for all of them that is best for their true rates taken together;
* the share of B the quiet pages get under optimal-age and under the clairvoyant plan.

The bound is approximate in one respect: quiet pages differ in how long they have been
watched (a page fetched less often has shown less), which a learner could use; the bound
gives them one rate. Printed per web; ``age_bound.json`` and ``age_bound.png`` under
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from analysis.family import (
    FamilyWeb,
    chosen_seeds,
    family_web,
    goal_lines,
    steady_horizon,
    web_arguments,
)
from analysis.model import ModelSettings, ModelWeb, model_web, plan_at, replay
from refresher import policies
from refresher.refresh._allocate import Plan, PolicyInputs

__all__ = [
    "alike_plan",
    "changed_intervals",
    "main",
    "noisy_plan",
    "plan_age",
    "quiet_pages",
    "run_bound",
]

Float = NDArray[np.float64]

#: draws of the rate errors of :func:`noisy_plan` per run
_NOISE_DRAWS = 8
#: golden-section steps for the quiet pages' one rate (each shrinks the bracket by 0.618)
_STEPS = 60


def quiet_pages(fetches: Sequence[Sequence[float]], changes: Sequence[Float]) -> NDArray[np.bool_]:
    """Per page, whether no interval between two of its fetches saw a change (a page
    fetched fewer than twice has shown nothing either)."""
    quiet: NDArray[np.bool_] = changed_intervals(fetches, changes) == 0
    return quiet


def changed_intervals(
    fetches: Sequence[Sequence[float]], changes: Sequence[Float]
) -> NDArray[np.int64]:
    """Per page, how many intervals between two of its fetches saw a change."""
    out = np.zeros(len(fetches), dtype=np.int64)
    for i, (times, change) in enumerate(zip(fetches, changes, strict=True)):
        if len(times) >= 2:
            seen = np.searchsorted(change, times, side="right")
            out[i] = int((np.diff(seen) > 0).sum())
    return out


def plan_age(rates: Float, target: Float) -> float:
    """Mean age (seconds) over pages of a plan ``target`` (fetches per second) under the true
    ``rates`` (changes per second); a page that never changes is never old."""
    changing = rates > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        age = policies.age(np.where(changing, rates, 1.0), target)
    return float(np.where(changing, age, 0.0).mean())


def alike_plan(
    rates: Float, quiet: NDArray[np.bool_], budget: float, hosts: NDArray[np.intp], caps: Float
) -> Float:
    """The plan of least mean age under the true ``rates`` in which every ``quiet`` page
    gets one rate f_Q: the other pages optimal-age's split of B − |Q|·f_Q (each host's cap
    less its quiet pages' part), f_Q by golden-section search (the age is convex in it)."""
    n_quiet = int(quiet.sum())
    loud = ~quiet
    if n_quiet == 0:
        return _split(rates, loud, budget, hosts, caps)
    per_host = np.bincount(hosts[quiet], minlength=caps.size).astype(np.float64)
    with np.errstate(divide="ignore"):
        room = np.where(per_host > 0, caps / np.maximum(per_host, 1.0), np.inf).min()
    top = min(budget / n_quiet, float(room)) * (1.0 - 1e-9)

    def plan_for(f_q: float) -> Float:
        rest = caps - per_host * f_q
        target = _split(rates, loud, budget - n_quiet * f_q, hosts, np.maximum(rest, 0.0))
        target[quiet] = f_q
        return target

    lo, hi = top * 1e-6, top
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = plan_age(rates, plan_for(a)), plan_age(rates, plan_for(b))
    for _ in range(_STEPS):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = plan_age(rates, plan_for(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = plan_age(rates, plan_for(b))
    return plan_for(0.5 * (lo + hi))


def noisy_plan(
    rates: Float,
    shown: NDArray[np.int64],
    alike: Float,
    budget: float,
    hosts: NDArray[np.intp],
    caps: Float,
    rng: np.random.Generator,
) -> Float:
    """Optimal-age's plan for rates each off by the error of the changes its page showed:
    ln λ̂ = ln λ + ε/√k, ε ~ N(0, 1), for a page whose k ≥ 1 intervals saw a change (a
    maximum-likelihood estimate from k changes is off by about that much); the quiet pages
    (k = 0) as in ``alike`` (:func:`alike_plan`)."""
    quiet = shown == 0
    noisy = rates * np.exp(rng.standard_normal(rates.size) / np.sqrt(np.maximum(shown, 1)))
    rest = caps - np.bincount(hosts[quiet], alike[quiet], minlength=caps.size)
    out = _split(noisy, ~quiet, budget - float(alike[quiet].sum()), hosts, np.maximum(rest, 0.0))
    out[quiet] = alike[quiet]
    return out


def _split(
    rates: Float, pages: NDArray[np.bool_], budget: float, hosts: NDArray[np.intp], caps: Float
) -> Float:
    """Optimal-age's split of ``budget`` over ``pages`` with the true rates (static pages get
    nothing), the other pages 0."""
    out = np.zeros(rates.size)
    rows = np.flatnonzero(pages & (rates > 0))
    if rows.size and budget > 0:
        alloc = policies.solve(
            "optimal-age", rates[rows], budget, hosts=hosts[rows], host_caps=caps
        )
        out[rows] = alloc.rates
    return out


def run_bound(web: FamilyWeb, *, runs: int, resolve_interval: float = 5.0) -> dict[str, Any]:
    """:mod:`analysis.age_bound`'s figures for one web over ``runs`` draws (per draw)."""
    mweb: ModelWeb = model_web(web.simweb)
    n = int(mweb.rates.size)
    h = steady_horizon(web, n)
    settings = ModelSettings(
        simweb=web.simweb,
        seconds=h,
        budget=web.budget,
        min_delay=web.min_delay,
        resolve_interval=resolve_interval,
        decide="expected",
    )
    rates = mweb.rates
    clair_inputs, clair = plan_at(
        "optimal-age", mweb, replace(settings, oracle=True, decide="plug-in")
    )
    clair_age = plan_age(rates, clair.target)
    out: dict[str, Any] = {"seed": web.seed, "label": web.label, "pages": n, "horizon": h}
    rows: list[dict[str, float]] = []
    for run in range(1, runs + 1):
        fetches, changes, learned = _learned(mweb, settings, run, h / 2)
        shown = changed_intervals(fetches, changes)
        quiet = shown == 0
        caps = clair_inputs.host_caps
        alike = alike_plan(rates, quiet, web.budget, mweb.hosts, caps)
        rng = np.random.default_rng([web.seed, run])
        noisy = [
            plan_age(rates, noisy_plan(rates, shown, alike, web.budget, mweb.hosts, caps, rng))
            for _ in range(_NOISE_DRAWS)
        ]
        rows.append(
            {
                "plan_share": clair_age / plan_age(rates, learned),
                "alike_share": clair_age / plan_age(rates, alike),
                "noisy_share": clair_age / float(np.mean(noisy)),
                "quiet": float(quiet.mean()),
                "quiet_budget": float(learned[quiet].sum() / learned.sum()),
                "quiet_budget_clairvoyant": float(clair.target[quiet].sum() / clair.target.sum()),
                "quiet_budget_alike": float(alike[quiet].sum() / alike.sum()),
            }
        )
    out["draws"] = rows
    return out


def _learned(
    web: ModelWeb, settings: ModelSettings, run: int, start: float
) -> tuple[list[list[float]], list[Float], Float]:
    """One modelled run of optimal-age: fetch times, change times, and its mean plan (f per
    page) over the plans made from ``start`` on."""
    plans: list[Float] = []

    def keep(now: float, inputs: PolicyInputs, made: Plan) -> None:
        if now >= start:
            plans.append(made.target)

    fetches, changes = replay("optimal-age", web, settings, run, on_plan=keep)
    return fetches, changes, np.mean(plans, axis=0)


def format_bound(result: dict[str, Any]) -> str:
    """One line per web: the means over the draws."""
    mean = {k: float(np.mean([d[k] for d in result["draws"]])) for k in result["draws"][0]}
    return (
        f"web {result['seed']} ({result['label']}), steady {result['horizon'] / 60:.0f} min: "
        f"plan {mean['plan_share']:.1%}  alike bound {mean['alike_share']:.1%}  "
        f"rate errors of the changes shown {mean['noisy_share']:.1%}  "
        f"quiet pages {mean['quiet']:.0%} with {mean['quiet_budget']:.1%} of B "
        f"(clairvoyant {mean['quiet_budget_clairvoyant']:.1%}, alike "
        f"{mean['quiet_budget_alike']:.1%})"
    )


def plot_bound(results: list[dict[str, Any]], path: Path, measured: dict[int, float]) -> Path:
    """Per web: optimal-age's plan share, the alike bound and the rate-error reference
    (clairvoyant age / age, plans scored with the true rates), and the family's measured
    steady-state age share where given."""
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    x = np.arange(len(results))
    plan = [np.mean([d["plan_share"] for d in r["draws"]]) for r in results]
    alike = [np.mean([d["alike_share"] for d in r["draws"]]) for r in results]
    ax.bar(x - 0.2, plan, width=0.4, label="optimal-age's plan (true rates)")
    ax.bar(x + 0.2, alike, width=0.4, label="bound: quiet pages fetched alike")
    noisy = [np.mean([d["noisy_share"] for d in r["draws"]]) for r in results]
    ax.plot(x - 0.2, noisy, "r.", ms=7, label="rates off by the error of the changes shown")
    have = [
        (j, measured[int(r["seed"])]) for j, r in enumerate(results) if int(r["seed"]) in measured
    ]
    if have:
        ax.plot(
            [j for j, _ in have],
            [v for _, v in have],
            "k_",
            ms=10,
            mew=2,
            label="measured (family, steady)",
        )
    goal_lines(ax)
    ax.set_xticks(x, [str(r["seed"]) for r in results], fontsize=7)
    ax.set_ylim(0.6, 1.4)
    ax.set_xlabel("web")
    ax.set_title("steady state: clairvoyant age / age")
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.age_bound",
        description="Optimal-age's steady-state plan and a bound for learning plans, per web.",
    )
    web_arguments(parser)
    parser.add_argument("--runs", type=int, default=2, help="draws of the change times")
    parser.add_argument(
        "--family",
        type=Path,
        default=None,
        help="a family.json with --steady: its measured shares in the plot",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--replot", type=Path, default=None, help="an age_bound.json: print and plot it again"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        print("analysis.age_bound: --runs must be ≥ 1", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    if args.replot is not None:
        results = json.loads(args.replot.read_text())
        for result in results:
            print(format_bound(result))
    for seed in () if args.replot is not None else chosen_seeds(args):
        result = run_bound(family_web(seed), runs=args.runs)
        results.append(result)
        print(format_bound(result), flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "age_bound.json").write_text(json.dumps(results, indent=1))
    if args.out is not None and results:
        args.out.mkdir(parents=True, exist_ok=True)
        measured = _measured(args.family) if args.family is not None else {}
        plot_bound(results, args.out / "age_bound.png", measured)
    return 0


def _measured(path: Path) -> dict[int, float]:
    """The steady-state age share per web of a family run (``--steady``)."""
    from analysis.family import summarize

    out = {}
    for r in json.loads(path.read_text()):
        s = summarize(r)
        if len(s["age_share"]) > 3:
            out[int(r["seed"])] = float(s["age_share"][3])
    return out


if __name__ == "__main__":
    sys.exit(main())
