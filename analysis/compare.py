"""Side by side: uniform, proportional and optimal on the same simulated web and budget.

Usage, from the repository root::

    python -m analysis.compare --seconds 600 --budget 10 --out var/compare

(three runs of ten minutes: the optimal policy needs a few minutes of each page's history
before its λ̂ tell the pages apart; ``--seconds 120`` is a quick look at policies still
learning).

For each policy in turn: one simulated web (:mod:`refresher.sim._simweb`; the same seed and config
every time, beginning afresh when its run begins) is served on a free 127.0.0.1 port, and a
daemon process (``refresher run``, a fresh store) refreshes its pages with that policy, the
same budget and the same politeness for ``--seconds`` after it is ready; then SIGTERM, and the
web's truth is written. Every page the web starts with is a seed (less those its robots.txt
disallows) and discovery is off, so every policy splits the budget over the same pages.

The TRUE mean freshness and age come from the freshness views (:mod:`refresher.store._views`) over
the run window after a warm-up share (``--warmup``, default 0.2: the first 20 % of the window,
while the first fetches of every page and the first estimates come in, is left out). Printed:
a table (policy, true freshness, true age, estimated freshness, fetches) and by how much optimal
beats uniform and uniform beats proportional, absolute and relative, with a standard error
from batch means (``BLOCKS`` equal parts of each window). Written to ``--out``:
``compare.json``, ``compare.png`` (bars), and per policy the run's store, truth and the
:mod:`analysis.plots` PNGs under ``<out>/<policy>/``.

The budget must be below what keeping every page fresh would take, or every policy is nearly
perfect: the default web's 300 pages change about 119 times a wall second in all
(``refresher simweb --describe``), so a budget of 5–10 fetches/s keeps the comparison
meaningful; the politeness delay is small (0.1 s, no response-time factor) so that host caps
do not decide the split.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import numpy as np
import trio
from matplotlib.figure import Figure

from refresher import policies
from refresher._errors import RefresherError
from refresher.sim._harness import DaemonProcess, harness_config, write_config
from refresher.sim._simweb import SimwebConfig, plan_web, serve_simweb, site_of, write_truth
from refresher.sim._site import Site

if __package__ in (None, ""):  # run as a file: python analysis/compare.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis._db import open_history, rows
from analysis.plots import make_plots

__all__ = [
    "CLAIRVOYANT",
    "COMPARED",
    "CompareSettings",
    "Comparison",
    "RunResult",
    "compare",
    "daemon_policy",
    "format_report",
    "main",
    "measure",
    "measure_run",
    "plot_comparison",
    "run_policy",
    "run_side_by_side",
    "seed_urls",
]

#: The policies compared, in the order of the table.
COMPARED = ("uniform", "proportional", "optimal")
#: runs that are no policy of their own: the daemon runs this policy with ``estimate.known_rates``
#: = its copy of the web's truth, written before it starts (the clairvoyant optimum on real
#: daemons: the true rates, the same host caps, the same cold start and change times)
CLAIRVOYANT = {"clairvoyant": "optimal", "clairvoyant-age": "optimal-age"}
#: equal parts of the measured window whose freshness gives the batch-means standard error
BLOCKS = 8

#: Seconds a daemon may take to become ready, or to stop after SIGTERM, before it is killed.
_DEADLINE = 60.0


class CompareError(RefresherError):
    """A run of the comparison failed (the daemon did not start, or did not stop)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareSettings:
    """One comparison: every run gets the same web, budget and politeness.

    ``seconds`` of refreshing per policy after the daemon is ready; ``budget`` in fetches per
    second; ``warmup`` is the share of each run window left out of the measurement;
    ``min_delay`` seconds between two fetches from one host; ``resolve_interval`` seconds
    between the allocator's solves; ``explore`` the budget share kept for pages a policy
    gives nothing; ``weights`` the daemon's ``policy.weights``: "none" by default, because the
    comparison measures unweighted mean freshness, and the optimum of a PageRank-weighted
    objective is not the optimum of that.
    """

    simweb: SimwebConfig = field(default_factory=SimwebConfig)
    policies: tuple[str, ...] = COMPARED
    seconds: float = 600.0
    budget: float = 10.0
    warmup: float = 0.2
    min_delay: float = 0.1
    workers: int = 16
    resolve_interval: float = 5.0
    explore: float = 0.05
    weights: str = "none"
    plots: bool = True
    #: discovery on for the sitemaps alone (``discovery.max_depth = 0``: the sitemaps that
    #: robots.txt names, or ``/sitemap.xml``, are found at depth 0 and read; the pages they
    #: and the pages' links name lie deeper and are not added, so every policy keeps the
    #: seeded pages); off (the default): discovery off, no sitemap is ever fetched
    sitemaps: bool = False

    def __post_init__(self) -> None:
        if not self.seconds > 0 or not self.budget > 0:
            raise ValueError("seconds and budget must be > 0")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup is a share in [0, 1), not {self.warmup}")
        if not self.policies:
            raise ValueError("compare at least one policy")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One policy's run, measured over ``[window_start, window_end]`` (unix seconds).

    Freshness is a fraction; age in seconds; ``fetches`` are the run's successful and failed
    fetches in the window, ``fetch_rate`` per second; ``coverage`` is the share of page-seconds
    with a copy. ``model_freshness`` and ``model_age`` are what the policy reaches in steady
    state on these pages with their TRUE λ and the whole budget (docs/model.md; no host caps,
    no exploration): the figure the run would approach if the daemon's λ̂ were exact.
    ``block_freshness`` is the true freshness over each of ``BLOCKS`` equal parts of the
    window (batch means, for the standard error). ``store`` and ``truth`` are the files the
    run left.
    """

    policy: str
    true_freshness: float
    true_age: float
    estimated_freshness: float
    estimated_age: float
    model_freshness: float
    model_age: float
    coverage: float
    pages: int
    fetches: int
    fetch_rate: float
    window_start: float
    window_end: float
    store: str
    truth: str
    block_freshness: tuple[float, ...] = ()

    @property
    def standard_error(self) -> float:
        """Of ``true_freshness``, by batch means (NaN with fewer than two blocks)."""
        b = np.asarray(self.block_freshness, dtype=float)
        b = b[np.isfinite(b)]
        return float(b.std(ddof=1) / math.sqrt(b.size)) if b.size > 1 else math.nan


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Every run and the margins: ``margins[("optimal", "uniform")]`` is true freshness of
    optimal minus that of uniform (absolute) and that over uniform's (relative)."""

    settings: CompareSettings
    results: tuple[RunResult, ...]

    def result(self, policy: str) -> RunResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    def margin(self, better: str, worse: str) -> tuple[float, float]:
        """(absolute, relative) margin of ``better`` over ``worse`` in true mean freshness."""
        a, b = self.result(better).true_freshness, self.result(worse).true_freshness
        return a - b, (a - b) / b if b > 0 else math.inf

    def margin_error(self, better: str, worse: str) -> float:
        """The standard error of ``margin(better, worse)[0]``: the runs' batch-means errors
        combined as independent (conservative: the runs see the same change sequence)."""
        return math.hypot(self.result(better).standard_error, self.result(worse).standard_error)

    def margins(self) -> list[tuple[str, str, float, float]]:
        """(better, worse, absolute, relative) for optimal/uniform and uniform/proportional,
        where both ran."""
        have = {r.policy for r in self.results}
        return [
            (a, b, *self.margin(a, b))
            for a, b in (("optimal", "uniform"), ("uniform", "proportional"))
            if a in have and b in have
        ]

    def to_json(self) -> dict[str, Any]:
        """Settings, results and margins; an infinite figure (the age of a page a policy never
        fetches) is null."""
        settings = asdict(self.settings)
        settings["simweb"]["rate_mix"] = [asdict(c) for c in self.settings.simweb.rate_mix]
        out: dict[str, Any] = _finite(
            {
                "settings": settings,
                "results": [asdict(r) for r in self.results],
                "margins": [
                    {
                        "better": a,
                        "worse": b,
                        "absolute": d,
                        "relative": q,
                        "standard_error": self.margin_error(a, b),
                    }
                    for a, b, d, q in self.margins()
                ],
            }
        )
        return out


def daemon_policy(label: str) -> str:
    """The policy the daemon of a run labelled ``label`` runs (:data:`CLAIRVOYANT`)."""
    return CLAIRVOYANT.get(label, label)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def seed_urls(site: Site, robots: Mapping[str, str | None], *, at: float) -> list[str]:
    """Every page that exists at ``at``, less those under a ``Disallow:`` prefix of its host's
    robots.txt (``robots``: host → body): a crawler would never fetch those, so they would
    only sit in every policy's page set as pages without a copy."""
    out = []
    for url in site.urls(at=at):
        host, _, path = url.split("://", 1)[1].partition("/")
        if not any(f"/{path}".startswith(p) for p in disallowed(robots.get(host))):
            out.append(url)
    return out


def disallowed(robots: str | None) -> list[str]:
    """The path prefixes of a simulated host's robots.txt ``Disallow:`` lines (its bodies have
    one group, for every agent)."""
    return [
        line.split(":", 1)[1].strip()
        for line in (robots or "").splitlines()
        if line.lower().startswith("disallow:") and line.split(":", 1)[1].strip()
    ]


def _daemon_config(
    path: Path,
    *,
    store: Path,
    control: Path,
    port: int,
    seeds: Sequence[str],
    policy: str,
    settings: CompareSettings,
    known_rates: Path | None = None,
) -> Path:
    tables = harness_config(
        path.parent,
        user_agent="refresher-compare/1.0 (+http://127.0.0.1/)",
        store={"path": str(store), "flush_interval": 0.5},
        crawl={"seeds": list(seeds), "workers": settings.workers},
        budget={"fetches_per_second": settings.budget},
        policy={
            "name": policy,
            "resolve_interval": settings.resolve_interval,
            "explore": settings.explore,
            "weights": settings.weights,
        },
        politeness={
            "min_delay": settings.min_delay,
            "response_time_factor": 0.0,
            "max_delay": 5.0,
            "backoff_base": 0.5,
            "max_backoff": 2.0,
        },
        fetch={"timeout": 5.0},
        dns={"static": {f"*.{settings.simweb.domain}": f"127.0.0.1:{port}"}},
        frontier={"window": 10.0},
        estimate={} if known_rates is None else {"known_rates": str(known_rates)},
        discovery={"enabled": True, "max_depth": 0} if settings.sitemaps else {"enabled": False},
        snapshot={"interval": 0.0},
        control={"socket": str(control)},
        log={"progress_interval": 10.0},
    )
    return write_config(path, tables)


@contextmanager
def _daemon(config: Path, log: Path) -> Iterator[DaemonProcess]:
    """``refresher run`` as a child process; killed on the way out if it still runs."""
    daemon = DaemonProcess(config, log_path=log)
    try:
        yield daemon
    finally:
        daemon.kill()


async def _until(what: str, check: Any, log: Path) -> None:
    with trio.move_on_after(_DEADLINE):
        while not check():
            await trio.sleep(0.05)
        return
    tail = log.read_text(errors="replace")[-2000:]
    raise CompareError(f"the daemon did not {what} within {_DEADLINE:g} s; its log ends:\n{tail}")


async def _run(policy: str, settings: CompareSettings, run_dir: Path) -> tuple[float, float]:
    """Serve a fresh web, run a daemon on it for ``settings.seconds``, write the truth; the
    (start, end) of the refreshing, unix seconds. A :data:`CLAIRVOYANT` label runs its policy
    with the web's true rates (``known.duckdb``, written before the daemon starts)."""
    plan = plan_web(settings.simweb, start=time.time())
    site = site_of(plan, settings.simweb)
    seeds = seed_urls(site, {h.name: h.robots for h in plan.hosts}, at=plan.start)
    known = None
    if policy in CLAIRVOYANT:
        known = run_dir / "known.duckdb"
        write_truth(site, known, until=plan.start)
    # A unix socket path must stay under ~100 bytes, so the control socket lives in /tmp.
    sock_dir = Path(tempfile.mkdtemp(prefix="rfcmp", dir="/tmp"))
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_simweb, settings.simweb, site=site, port=0))
            config = _daemon_config(
                run_dir / "refresher.toml",
                store=run_dir / "refresher.duckdb",
                control=sock_dir / "control.sock",
                port=port,
                seeds=seeds,
                policy=daemon_policy(policy),
                settings=settings,
                known_rates=known,
            )
            log = run_dir / "daemon.log"
            with _daemon(config, log) as daemon:
                proc = daemon.proc

                def ready() -> bool:
                    if proc.poll() is not None:
                        raise CompareError(
                            f"the daemon exited ({proc.returncode}) before it was ready:\n"
                            + log.read_text(errors="replace")[-2000:]
                        )
                    return daemon.event("ready") is not None

                await _until("become ready", ready, log)
                # from when the crawling began: the first fetches precede the "ready" line
                line = daemon.event("ready")
                assert line is not None
                start = float(line["crawling_since"])
                await trio.sleep(settings.seconds)
                end = time.time()
                proc.send_signal(signal.SIGTERM)
                await _until("stop after SIGTERM", lambda: proc.poll() is not None, log)
            # The truth reaches past the end, so every change in the window is in it.
            write_truth(site, run_dir / "truth.duckdb", until=time.time())
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    return start, end


def measure(
    store: Path, truth: Path, *, policy: str, budget: float, window: tuple[float, float]
) -> RunResult:
    """True and estimated mean freshness and age of the run in ``store`` over ``window``
    (unix seconds), and the model's figures for ``policy`` at ``budget`` (fetches per
    second) on the pages' true rates."""
    t0, t1 = window
    con = open_history(store, truth=truth)
    try:
        data = rows(con, "SELECT * FROM true_freshness(?, ?)", [t0, t1])
        truth_rows = rows(
            con,
            "SELECT t.rate FROM pages p JOIN (SELECT url, any_value(rate) AS rate"
            " FROM truth_pages GROUP BY url) t ON t.url = p.url",
        )
        fetched = rows(
            con,
            "SELECT count(*) AS n FROM fetches WHERE finished_at >= ? AND finished_at < ?",
            [t0, t1],
        )[0]["n"]
        edges = np.linspace(t0, t1, BLOCKS + 1)
        block_rows = [
            rows(con, "SELECT freshness FROM true_freshness(?, ?)", [float(a), float(b)])[0]
            for a, b in itertools.pairwise(edges)
        ]
    finally:
        con.close()
    if not data or data[0]["freshness"] is None:
        raise CompareError(
            f"the {policy} run has no refreshed page in the window; run longer or check "
            f"its log beside {str(store)!r}"
        )
    r = data[0]
    true_rates = np.array([t["rate"] for t in truth_rows], dtype=float)
    blocks = tuple(
        float("nan") if b["freshness"] is None else float(b["freshness"]) for b in block_rows
    )
    model = policies.solve(daemon_policy(policy), true_rates, budget).rates
    return RunResult(
        policy=policy,
        true_freshness=float(r["freshness"]),
        true_age=float(r["age"]),
        estimated_freshness=float(r["estimated_freshness"]),
        estimated_age=float(r["estimated_age"]),
        model_freshness=policies.mean_freshness(true_rates, model),
        model_age=policies.mean_age(true_rates, model),
        coverage=float(r["coverage"]),
        pages=int(r["pages"]),
        fetches=int(fetched),
        fetch_rate=int(fetched) / (t1 - t0),
        window_start=t0,
        window_end=t1,
        store=str(store),
        truth=str(truth),
        block_freshness=blocks,
    )


def _fresh_dir(run_dir: Path) -> Path:
    """``run_dir`` made, emptied of an earlier run, as an absolute path (the daemon reads the
    paths in its config relative to the config's directory)."""
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    leftovers = ("refresher.duckdb", "refresher.duckdb.wal", "truth.duckdb", "known.duckdb")
    for leftover in (*leftovers, "run.json"):
        (run_dir / leftover).unlink(missing_ok=True)
    return run_dir


def _write_window(run_dir: Path, policy: str, budget: float, span: tuple[float, float]) -> None:
    window = {"policy": policy, "budget": budget, "start": span[0], "end": span[1]}
    (run_dir / "run.json").write_text(json.dumps(window) + "\n")


def run_policy(policy: str, settings: CompareSettings, run_dir: Path) -> RunResult:
    """One policy's run in ``run_dir`` (created; it receives the store, the truth, the log and
    ``run.json`` with the run window), measured after the warm-up."""
    run_dir = _fresh_dir(run_dir)
    span = trio.run(_run, policy, settings, run_dir)
    _write_window(run_dir, policy, settings.budget, span)
    result = measure_run(run_dir, warmup=settings.warmup)
    if settings.plots:
        make_plots(run_dir / "refresher.duckdb", run_dir, truth=run_dir / "truth.duckdb")
    return result


def run_side_by_side(settings: CompareSettings, out: Path) -> dict[str, tuple[float, float]]:
    """Every policy of ``settings`` at the same time, each against its own copy of the web
    (the same seed, so the same change times from its start), its own daemon and store, in
    ``out/<policy>/`` as :func:`run_policy` leaves them; each run's (start, end), unix
    seconds. Runs side by side take the time of one and share the machine's load."""
    out = out.resolve()
    for policy in settings.policies:
        _fresh_dir(out / policy)
    spans: dict[str, tuple[float, float]] = {}

    async def both() -> None:
        async def one(policy: str) -> None:
            spans[policy] = await _run(policy, settings, out / policy)

        async with trio.open_nursery() as nursery:
            for policy in settings.policies:
                nursery.start_soon(one, policy)

    trio.run(both)
    for policy, span in spans.items():
        _write_window(out / policy, policy, settings.budget, span)
    return spans


def measure_run(run_dir: Path, *, warmup: float) -> RunResult:
    """(Re)measure a finished run in ``run_dir`` (see :func:`run_policy`), leaving out the
    first ``warmup`` share of its window."""
    try:
        window = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"no run in {str(run_dir)!r} ({e}); run the comparison first") from e
    start, end = float(window["start"]), float(window["end"])
    return measure(
        run_dir / "refresher.duckdb",
        run_dir / "truth.duckdb",
        policy=str(window["policy"]),
        budget=float(window["budget"]),
        window=(start + warmup * (end - start), end),
    )


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    """``compare.png``: true and estimated mean freshness (left) and true mean age (right)."""
    results = comparison.results
    names = [r.policy for r in results]
    x = np.arange(len(results))
    fig = Figure(figsize=(9, 4.5))
    left, right = fig.subplots(1, 2)
    left.bar(x - 0.2, [r.true_freshness for r in results], 0.4, label="true", color="tab:blue")
    left.bar(
        x + 0.2,
        [r.estimated_freshness for r in results],
        0.4,
        label="estimated",
        color="tab:blue",
        alpha=0.4,
        hatch="//",
    )
    for i, r in enumerate(results):
        left.annotate(
            f"{r.true_freshness:.3f}",
            (i - 0.2, r.true_freshness),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    left.set_xticks(x, names)
    left.set_ylim(0.0, 1.05)
    left.set_ylabel("mean freshness")
    left.legend(loc="lower right", fontsize="small")
    right.bar(x, [r.true_age for r in results], 0.5, color="tab:orange")
    right.set_xticks(x, names)
    right.set_ylabel("true mean age (s)")
    s = comparison.settings
    fig.suptitle(
        f"{results[0].pages} pages, budget {s.budget:g} fetches/s, "
        f"{s.seconds:g} s per run, first {s.warmup:.0%} left out"
    )
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def format_report(comparison: Comparison) -> str:
    """The table and the margins, as printed."""
    head = (
        f"{'policy':<13} {'true fresh':>10} {'true age s':>10} {'est fresh':>10} "
        f"{'est age s':>10} {'coverage':>8} {'fetches':>8} {'fetch/s':>8} {'model fresh':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in comparison.results:
        lines.append(
            f"{r.policy:<13} {r.true_freshness:>10.4f} {r.true_age:>10.3f} "
            f"{r.estimated_freshness:>10.4f} {r.estimated_age:>10.3f} {r.coverage:>8.3f} "
            f"{r.fetches:>8d} {r.fetch_rate:>8.2f} {r.model_freshness:>11.4f}"
        )
    lines.append(
        "(true: from the web's change times over the window; est: the daemon's own estimate from "
        "λ̂; model: the policy's steady state with the true λ)"
    )
    for better, worse, d, q in comparison.margins():
        verdict = "beats" if d > 0 else "does NOT beat"
        se = comparison.margin_error(better, worse)
        lines.append(
            f"{better} {verdict} {worse} on true freshness: {d:+.4f} absolute "
            f"(± {se:.4f} s.e., batch means of {BLOCKS} blocks), {q:+.1%} relative"
        )
    return "\n".join(lines) + "\n"


def _horizons(settings: CompareSettings, out: Path) -> str:
    """True freshness and age of side-by-side runs over (h/2, h] per horizon, measured as
    ``analysis.family`` measures its webs."""
    from analysis import family  # imported here: the family module imports this one

    real = family.measure_real(
        out, settings.policies, seconds=settings.seconds, seed=settings.simweb.seed
    )
    (out / "horizons.json").write_text(json.dumps(real, indent=1) + "\n")
    return family.format_real(real, None)


def compare(
    settings: CompareSettings, out: Path, *, rerun: bool = True, side_by_side: bool = False
) -> Comparison:
    """Run every policy of ``settings`` in turn (``side_by_side``: all at once, each against
    its own copy of the web) under ``out/<policy>/``; write ``out/compare.json`` and
    ``out/compare.png``. ``rerun`` False measures the runs already there again (another
    warm-up share) instead of running them."""
    if rerun and side_by_side:
        run_side_by_side(settings, out)
        results = tuple(measure_run(out / p, warmup=settings.warmup) for p in settings.policies)
        if settings.plots:
            for p in settings.policies:
                make_plots(out / p / "refresher.duckdb", out / p, truth=out / p / "truth.duckdb")
    elif rerun:
        results = tuple(run_policy(p, settings, out / p) for p in settings.policies)
    else:
        results = tuple(measure_run(out / p, warmup=settings.warmup) for p in settings.policies)
    comparison = Comparison(settings=settings, results=results)
    (out / "compare.json").write_text(json.dumps(comparison.to_json(), indent=2) + "\n")
    plot_comparison(comparison, out / "compare.png")
    return comparison


def main(argv: Sequence[str] | None = None) -> int:
    defaults = CompareSettings()
    web = defaults.simweb
    parser = argparse.ArgumentParser(
        prog="python -m analysis.compare",
        description="Run uniform, proportional and optimal on the same simulated web and "
        "budget; print true mean freshness and age.",
    )
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="per policy")
    parser.add_argument("--budget", type=float, default=defaults.budget, help="fetches/s")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="share left out")
    parser.add_argument("--min-delay", type=float, default=defaults.min_delay, help="seconds")
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--resolve-interval", type=float, default=defaults.resolve_interval)
    parser.add_argument(
        "--policies",
        default=",".join(defaults.policies),
        help="comma-separated; also clairvoyant and clairvoyant-age (optimal and optimal-age "
        "with the web's true rates as estimate.known_rates)",
    )
    parser.add_argument(
        "--weights",
        choices=("none", "pagerank"),
        default=defaults.weights,
        help="page weights of the optimal policies (none: what unweighted freshness measures)",
    )
    parser.add_argument("--seed", type=int, default=web.seed, help="of the simulated web")
    parser.add_argument("--hosts", type=int, default=web.hosts)
    parser.add_argument("--pages", type=int, default=web.pages_per_host, help="per host")
    parser.add_argument("--time-scale", type=float, default=web.time_scale)
    parser.add_argument("--no-plots", action="store_true", help="no per-run PNGs")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="run the policies at the same time, each against its own copy of the web, and "
        "print true freshness and age over (h/2, h] for h = 1, 5, 30 minutes",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the runs already in --out again (e.g. with another --warmup); no runs",
    )
    parser.add_argument("--out", type=Path, default=Path("var/compare"), help="(var/compare)")
    args = parser.parse_args(argv)
    try:
        settings = CompareSettings(
            simweb=replace(
                web,
                seed=args.seed,
                hosts=args.hosts,
                pages_per_host=args.pages,
                time_scale=args.time_scale,
            ),
            policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
            seconds=args.seconds,
            budget=args.budget,
            warmup=args.warmup,
            min_delay=args.min_delay,
            workers=args.workers,
            resolve_interval=args.resolve_interval,
            weights=args.weights,
            plots=not args.no_plots,
        )
        comparison = compare(
            settings, args.out, rerun=not args.remeasure, side_by_side=args.side_by_side
        )
    except (RefresherError, ValueError) as e:
        print(f"analysis.compare: {e}", file=sys.stderr)
        return 2
    print(format_report(comparison), end="")
    if args.side_by_side:
        print(_horizons(settings, args.out))
    print(f"written: {args.out / 'compare.json'}, {args.out / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
