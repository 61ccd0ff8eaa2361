"""PNG plots of one run: freshness over time, λ̂ against the true λ, the policies' f(λ).

Usage, from the repository root (the store of a stopped daemon, or the snapshot of a running
one; the truth a simulated web wrote, optional)::

    python -m analysis.plots --db var/demo.duckdb --truth var/demo-truth.duckdb --out var/plots

writes

- ``freshness.png``: mean freshness (top) and mean age (bottom, seconds) of the copy over time,
  estimated (solid, from λ̂) and, with the truth, true (dashed), one colour per policy period;
- ``rates.png``: λ̂ against the true λ per page (log-log, the diagonal is a perfect estimate;
  pages that never change sit on the left edge), coloured by the fetch intervals behind λ̂;
  without the truth, a histogram of λ̂;
- ``allocation.png``: f(λ) of uniform, proportional, optimal and optimal-age for the run's pages
  (their λ̂, or the true λ with ``--true-rates``) and budget: pure math (:func:`policies.solve`,
  no host caps), each policy's expected mean freshness and age in the legend.

Times on the x axes are seconds since the run's first page; rates are per second.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import matplotlib

matplotlib.use("Agg")  # files only, never a display

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from refresher import policies
from refresher._errors import RefresherError, StoreError

if __package__ in (None, ""):  # run as a file: python analysis/plots.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis._db import open_history, rows

__all__ = [
    "ALLOCATION_POLICIES",
    "PlotFiles",
    "main",
    "make_plots",
    "planned",
    "plot_allocation",
    "plot_freshness",
    "plot_rates",
]

#: The policies whose f(λ) ``allocation.png`` draws.
ALLOCATION_POLICIES = ("uniform", "proportional", "optimal", "optimal-age")

_DPI = 110


@dataclass(frozen=True, slots=True, kw_only=True)
class PlotFiles:
    """The PNG files :func:`make_plots` wrote."""

    freshness: Path
    rates: Path
    allocation: Path


def _span(con: duckdb.DuckDBPyConnection) -> tuple[float, float]:
    row = rows(con, "SELECT started_at, ended_at FROM history_span")[0]
    t0, t1 = row["started_at"], row["ended_at"]
    if t0 is None or t1 is None or not t1 > t0:
        raise StoreError("the history is empty: no pages or no fetches to plot; run the daemon")
    return float(t0), float(t1)


def _has_truth(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(rows(con, "SELECT count(*) AS n FROM truth_pages")[0]["n"])


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


def plot_freshness(
    con: duckdb.DuckDBPyConnection, path: Path, *, step: float | None = None
) -> Path:
    """``freshness.png``: estimated (and true, with the truth) freshness and age over time.

    ``step`` is the width of each averaging window in seconds (default: 1/60 of the run, at
    least one second).
    """
    t0, t1 = _span(con)
    step = step or max(1.0, (t1 - t0) / 60.0)
    truth = _has_truth(con)
    series = (
        rows(con, "SELECT * FROM true_freshness_series(?, ?, ?)", [t0, t1, step])
        if truth
        else rows(con, "SELECT * FROM freshness_series(?, ?, ?)", [t0, t1, step])
    )
    periods = rows(con, "SELECT * FROM policy_windows ORDER BY window_start")
    if not periods:
        periods = [{"window_start": t0, "window_end": t1, "policy": "?", "budget": math.nan}]
    fig = Figure(figsize=(9, 6.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    colours = matplotlib.colormaps["tab10"]
    for i, period in enumerate(periods):
        a, b = period["window_start"], period["window_end"]
        part = [r for r in series if r["window_end"] > a and r["window_start"] < b]
        if not part:
            continue
        x = np.array([(r["window_start"] + r["window_end"]) / 2 - t0 for r in part])
        label = f"{period['policy']} (B = {period['budget']:g}/s)"

        def col(name: str, part: list[dict[str, Any]] = part) -> NDArray[np.float64]:
            return np.array([np.nan if r[name] is None else r[name] for r in part], dtype=float)

        c = colours(i % 10)
        est_f, est_a = ("estimated_freshness", "estimated_age") if truth else ("freshness", "age")
        top.plot(x, col(est_f), color=c, label=f"{label}: estimated")
        bottom.plot(x, col(est_a), color=c, label=f"{label}: estimated")
        if truth:
            top.plot(x, col("freshness"), color=c, linestyle="--", label=f"{label}: true")
            bottom.plot(x, col("age"), color=c, linestyle="--", label=f"{label}: true")
        if i:
            for ax in (top, bottom):
                ax.axvline(a - t0, color="grey", linewidth=0.8, linestyle=":")
    top.set_ylabel("mean freshness")
    top.set_ylim(0.0, 1.02)
    top.legend(fontsize="small", loc="lower right")
    top.set_title(f"Freshness of the copy over time (windows of {step:.3g} s)")
    bottom.set_ylabel("mean age (s)")
    bottom.set_xlabel("seconds since the first page")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _log_floor(values: NDArray[np.float64]) -> float:
    positive = values[values > 0]
    return float(positive.min()) / 3.0 if positive.size else 1e-6


def _empty(fig: Figure, ax: Any, path: Path, text: str) -> Path:
    """A figure that says why it has no data (a run too short), so every PNG exists."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return _save(fig, path)


def plot_rates(con: duckdb.DuckDBPyConnection, path: Path) -> Path:
    """``rates.png``: λ̂ against the true λ (with the truth), else a histogram of λ̂."""
    fig = Figure(figsize=(7, 6))
    ax = fig.subplots()
    if _has_truth(con):
        data = rows(
            con,
            """
            SELECT pr.rate AS estimated, t.rate AS true_rate, pr.intervals
            FROM page_rates pr JOIN pages p ON p.id = pr.page_id
            JOIN (SELECT url, any_value(rate) AS rate FROM truth_pages GROUP BY url) t
              ON t.url = p.url
            WHERE pr.intervals > 0
            """,
        )
        if not data:
            return _empty(fig, ax, path, "no page was fetched twice yet: no λ̂ to compare")
        est = np.array([r["estimated"] for r in data], dtype=float)
        true = np.array([r["true_rate"] for r in data], dtype=float)
        n = np.array([r["intervals"] for r in data], dtype=float)
        # Log axes cannot show 0: pages that never change (or a λ̂ of 0) sit on the floor.
        floor = min(_log_floor(est), _log_floor(true))
        x, y = np.maximum(true, floor), np.maximum(est, floor)
        points = ax.scatter(x, y, c=n, cmap="viridis", s=14, alpha=0.8)
        fig.colorbar(points, ax=ax, label="fetch intervals behind λ̂")
        lo, hi = floor, float(max(x.max(), y.max())) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="λ̂ = λ")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("true λ (changes/s); never-changing pages at the left edge")
        ax.set_ylabel("estimated λ̂ (changes/s)")
        ax.legend(loc="upper left")
        ax.set_title(f"Estimated against true change rates ({len(data)} pages)")
    else:
        data = rows(con, "SELECT rate FROM page_rates WHERE rate > 0")
        if not data:
            return _empty(fig, ax, path, "no page has a positive λ̂ yet")
        est = np.array([r["rate"] for r in data], dtype=float)
        ax.hist(np.log10(est), bins=30, color="tab:blue")
        ax.set_xlabel("log10 λ̂ (changes/s)")
        ax.set_ylabel("pages")
        ax.set_title(f"Estimated change rates ({len(data)} pages; no truth given)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _page_rates(con: duckdb.DuckDBPyConnection, *, true_rates: bool) -> NDArray[np.float64]:
    if true_rates:
        data = rows(
            con,
            """
            SELECT t.rate FROM pages p
            JOIN (SELECT url, any_value(rate) AS rate FROM truth_pages GROUP BY url) t
              ON t.url = p.url
            WHERE p.status <> 'gone'
            """,
        )
    else:
        data = rows(
            con,
            "SELECT pr.rate FROM page_rates pr JOIN pages p ON p.id = pr.page_id"
            " WHERE p.status <> 'gone'",
        )
    return np.array([r["rate"] for r in data], dtype=float)


def _budget(con: duckdb.DuckDBPyConnection) -> float:
    data = rows(con, "SELECT budget FROM policy_periods ORDER BY started_at DESC LIMIT 1")
    if not data:
        raise StoreError("the store has no policy period, so no budget; give --budget")
    return float(data[0]["budget"])


def planned(db: Path, budget: float | None, *, decide: str = "expected") -> dict[str, Any]:
    """The plan of every policy of :data:`ALLOCATION_POLICIES` for the pages of ``db`` (a store
    no daemon holds, or a snapshot), made as the daemon and ``refresher policy`` make it: λ̂
    from the history, host politeness caps, ``decide``, page weights (the default settings).
    Returns ``{"rates", "table", "targets"}``: λ̂ per page, :func:`policy_table`'s figures (the
    one definition the CLI and the metrics print) and each policy's f per page."""
    from refresher.refresh._allocate import InputSettings, plan, policy_table
    from refresher.store import DuckDBStore

    settings = InputSettings()
    if not db.is_file():
        raise StoreError(f"no store or snapshot at {str(db)!r}; give the DuckDB file of a run")
    try:
        store = DuckDBStore(db, read_only=True)
    except RefresherError as e:
        raise StoreError(f"cannot read the plan inputs of {str(db)!r}: {e}") from e
    try:
        raw = store.estimator_inputs(meaningful=settings.meaningful, links=True)
    finally:
        store.close()
    inputs = settings.estimate(raw)
    b = budget if budget is not None else _run_budget(db)
    targets = {
        name: np.asarray(plan(inputs, name, b, explore=0.0, decide=decide).target)
        for name in ALLOCATION_POLICIES
    }
    return {
        "rates": inputs.rates,
        "table": policy_table(inputs, b, decide=decide),
        "targets": targets,
    }


def _run_budget(db: Path) -> float:
    con = open_history(db)
    try:
        return _budget(con)
    finally:
        con.close()


def plot_allocation(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    *,
    budget: float | None = None,
    true_rates: bool = False,
    plans: dict[str, Any] | None = None,
) -> Path:
    """``allocation.png``: f(λ) of each of :data:`ALLOCATION_POLICIES` for the run's pages.

    With ``plans`` (from :func:`planned`) the points are each page's planned f against its λ̂
    and the legend's figures are ``refresher policy``'s (host caps, ``policy.decide``,
    weights). Otherwise (``true_rates``: the truth's λ, which the daemon never knows) the
    curves are the policies' split without host caps. ``budget`` in fetches per second
    (default: the run's last policy period's).
    """
    if plans is not None:
        lam, targets = plans["rates"], plans["targets"]
        b = float(plans["table"]["budget"])
    else:
        lam = _page_rates(con, true_rates=true_rates)
        b = _budget(con) if budget is None else budget
        targets = {
            name: np.asarray(policies.solve(name, lam, b).rates) for name in ALLOCATION_POLICIES
        }
    if not lam.size:
        raise StoreError("the store has no pages (or none in the truth); nothing to allocate")
    order = np.argsort(lam, kind="stable")
    floor = _log_floor(lam[order])
    fig = Figure(figsize=(8, 5.5))
    ax = fig.subplots()
    for name in ALLOCATION_POLICIES:
        f = targets[name][order]
        if plans is not None:
            row = plans["table"]["policies"][name]
            mean_f, weighted, mean_a = row["freshness"], row["weighted"], row["age"]
            age = "∞" if mean_a is None else f"{mean_a:.3g} s"
            label = f"{name}: F̄ = {mean_f:.3f} (weighted {weighted:.3f}), Ā = {age}"
        else:
            mean_a = policies.mean_age(lam[order], f)
            age = f"{mean_a:.3g} s" if math.isfinite(mean_a) else "∞"
            label = f"{name}: F̄ = {policies.mean_freshness(lam[order], f):.3f}, Ā = {age}"
        # a plan differs page by page (weights, host caps): points, not a curve
        style = {"linestyle": "none", "markersize": 4} if plans is not None else {"markersize": 3}
        ax.plot(np.maximum(lam[order], floor), f, marker=".", label=label, **style)
    ax.set_xscale("log")
    ax.set_xlabel(
        ("true λ" if true_rates else "λ̂") + " (changes/s); never-changing pages at the left edge"
    )
    ax.set_ylabel("f (fetches/s per page)")
    if plans is not None:
        ax.set_title(
            f"Planned f of {lam.size} pages, budget {b:g} fetches/s, as `refresher policy` "
            "(host caps, decide, weights)",
            fontsize="medium",
        )
    else:
        ax.set_title(f"Allocation f(λ) of {lam.size} pages, budget {b:g} fetches/s (no host caps)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def make_plots(
    db: Path,
    out: Path,
    *,
    truth: Path | None = None,
    step: float | None = None,
    budget: float | None = None,
    true_rates: bool = False,
) -> PlotFiles:
    """Write ``freshness.png``, ``rates.png`` and ``allocation.png`` of the run in ``db`` (a
    store or a snapshot) to the directory ``out``; ``truth`` is the simulated web's truth (a
    DuckDB file or a directory of Parquet files)."""
    if true_rates and truth is None:
        raise StoreError("true rates need the truth; give --truth")
    # read before the views' connection: DuckDB opens a file with one configuration per process
    plans = None if true_rates else planned(db, budget)
    con = open_history(db, truth=truth)
    try:
        return PlotFiles(
            freshness=plot_freshness(con, out / "freshness.png", step=step),
            rates=plot_rates(con, out / "rates.png"),
            allocation=plot_allocation(
                con, out / "allocation.png", budget=budget, true_rates=true_rates, plans=plans
            ),
        )
    finally:
        con.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.plots",
        description="PNG plots of a run: freshness.png, rates.png, allocation.png.",
    )
    parser.add_argument("--db", type=Path, required=True, help="the store or a snapshot")
    parser.add_argument("--truth", type=Path, help="the simulated web's truth (file or dir)")
    parser.add_argument("--out", type=Path, default=Path("var/plots"), help="(var/plots)")
    parser.add_argument("--step", type=float, help="seconds per window of freshness.png")
    parser.add_argument("--budget", type=float, help="fetches/s for allocation.png (the run's)")
    parser.add_argument(
        "--true-rates", action="store_true", help="allocation.png from the true λ, not λ̂"
    )
    args = parser.parse_args(argv)
    try:
        files = make_plots(
            args.db,
            args.out,
            truth=args.truth,
            step=args.step,
            budget=args.budget,
            true_rates=args.true_rates,
        )
    except RefresherError as e:
        print(f"analysis.plots: {e}", file=sys.stderr)
        return 2
    for p in (files.freshness, files.rates, files.allocation):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
