"""analysis/: plots and the policy comparison, on short real runs against a simulated web."""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# `python -m pytest` from the repository root puts it on sys.path; a bare `pytest` may not.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from conftest import cli  # noqa: E402

from analysis import age_bound, compare, model, plots  # noqa: E402
from refresher.refresh._allocate import (  # noqa: E402
    PolicyInputs,
    priority_level,
    reported_rates,
)
from refresher.sim._simweb import SimwebConfig, parse_rate_mix, plan_web, site_of  # noqa: E402
from refresher.store import PageRow  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A small web whose rates a run of seconds can measure: 40 pages (less the few robots.txt
# disallows), no Crawl-delay (so no host cap binds), two simulated days per wall minute; half
# the pages change about 0.8 times a second (0.3-2.2 for most of them), which fetches every
# ~2.5 s can both see and measure, 40 % every five minutes or so, a tenth never.
SMALL_WEB = SimwebConfig(
    seed=7,
    hosts=4,
    pages_per_host=10,
    time_scale=2880.0,
    rate_mix=parse_rate_mix("never:0.1,rare:0.4:0.1:1.5,frequent:0.5:24:1"),
    crawl_delay_share=0.0,
    new_pages_per_minute=0.0,
)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    # a plot with axes, labels and lines is tens of kB; a blank canvas a few
    assert len(data) > 10_000, (path, len(data))


def _short_run(out: Path) -> compare.RunResult:
    """One 16 s optimal run on SMALL_WEB at 16 fetches/s: every page about every 2.5 s."""
    settings = compare.CompareSettings(
        simweb=SMALL_WEB,
        policies=("optimal",),
        seconds=16.0,
        budget=16.0,
        min_delay=0.05,
        workers=8,
        resolve_interval=2.0,
        plots=False,
    )
    return compare.run_policy("optimal", settings, out)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> compare.RunResult:
    """:func:`_short_run`, made once per `make test`: the first xdist worker that needs it
    makes it under a file lock and leaves its result beside its files; the others wait on the
    lock and copy the files (a DuckDB file is one writer's at a time). pytest-xdist's
    ``xdist_group`` would put these tests on one worker, but 3.8 ignores it under pytest 9.2
    (pytest-xdist issue 1386)."""
    own = tmp_path_factory.mktemp("run")
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:  # no xdist: this process is the only one that needs it
        return _short_run(own)
    shared = tmp_path_factory.getbasetemp().parent / f"short-run-{run_id}"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "result.json"
        if not done.exists():
            result = _short_run(shared / "files")
            done.write_text(json.dumps(asdict(result)))
    made = json.loads(done.read_text())
    for name in ("store", "truth"):
        for path in (Path(made[name]), Path(made[name] + ".wal")):
            if path.exists():
                shutil.copy(path, own)
        made[name] = str(own / Path(made[name]).name)
    made["block_freshness"] = tuple(made["block_freshness"])
    return compare.RunResult(**made)


@pytest.mark.slow
def test_plots_writes_three_pngs_of_a_run(short_run: compare.RunResult, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    code = plots.main(["--db", short_run.store, "--truth", short_run.truth, "--out", str(out)])
    assert code == 0
    for name in ("freshness.png", "rates.png", "allocation.png"):
        assert_png(out / name)


@pytest.mark.slow
def test_plots_without_the_truth_still_draws_every_png(
    short_run: compare.RunResult, tmp_path: Path
) -> None:
    files = plots.make_plots(Path(short_run.store), tmp_path)
    for path in (files.freshness, files.rates, files.allocation):
        assert_png(path)


@pytest.mark.slow
def test_the_allocation_plot_shows_the_figures_refresher_policy_prints(
    short_run: compare.RunResult,
) -> None:
    # one definition of a policy's freshness: the plot's legend, the CLI table and the metrics
    shown = plots.planned(Path(short_run.store), 7.0)["table"]
    done = cli("policy", "--json", "--store", short_run.store, "--budget", "7")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["definition"] == shown["definition"]
    for name in plots.ALLOCATION_POLICIES:
        for figure in ("freshness", "weighted"):
            assert printed["policies"][name][figure] == pytest.approx(
                shown["policies"][name][figure], rel=1e-9
            ), (name, figure)


def test_plots_says_what_is_wrong_with_a_missing_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plots.main(["--db", str(tmp_path / "nope.duckdb"), "--out", str(tmp_path)]) == 2
    assert "no store or snapshot" in capsys.readouterr().err


@pytest.mark.slow
def test_the_estimated_freshness_tracks_the_true_one(short_run: compare.RunResult) -> None:
    # Tolerance 0.15. The estimate uses each page's final λ̂ from only ~6 fetch intervals
    # (relative error ~40 % per page), and the fastest pages, which change before almost
    # every fetch, show only that λ is well above 1/interval (their λ̂ depends on the prior's
    # spread), so their freshness is uncertain; the true mean over ~38 pages in a 13 s window
    # also carries sampling noise of a few hundredths. A broken estimate (the prior of one
    # change a day, λ̂ = 0, a wrong sign, a wrong unit) puts the estimated freshness near 1
    # while the true one is far below; the first assertion makes sure the true one is.
    r = short_run
    assert r.pages >= 30 and r.coverage > 0.5
    assert r.true_freshness < 0.85, "the web barely changed: the test would prove nothing"
    assert abs(r.estimated_freshness - r.true_freshness) < 0.15, r


def test_seeds_leave_out_what_robots_txt_disallows() -> None:
    web = SimwebConfig(
        hosts=5, pages_per_host=20, private_share=0.5, robots_rules_share=1.0, no_robots_share=0.0
    )
    plan = plan_web(web, start=0.0)
    site = site_of(plan, web)
    assert all(h.robots and "Disallow: /private/" in h.robots for h in plan.hosts)
    seeds = compare.seed_urls(site, {h.name: h.robots for h in plan.hosts}, at=0.0)
    everything = site.urls(at=0.0)
    assert any("/private/" in u for u in everything)
    assert seeds == [u for u in everything if "/private/" not in u]


@pytest.mark.slow
def test_compare_runs_every_policy_and_writes_its_table_json_and_png(tmp_path: Path) -> None:
    settings = compare.CompareSettings(
        simweb=SimwebConfig(
            seed=3,
            hosts=2,
            pages_per_host=6,
            time_scale=1440.0,
            crawl_delay_share=0.0,
            new_pages_per_minute=0.0,
        ),
        seconds=5.0,
        budget=6.0,
        min_delay=0.05,
        workers=4,
        resolve_interval=1.0,
        plots=False,
    )
    result = compare.compare(settings, tmp_path)
    assert [r.policy for r in result.results] == ["uniform", "proportional", "optimal"]
    for r in result.results:
        assert 0.0 <= r.true_freshness <= 1.0 and r.true_age >= 0.0 and r.fetches > 0
        assert len(r.block_freshness) == compare.BLOCKS
        # the blocks partition the window, so they average to the whole (up to coverage)
        assert min(r.block_freshness) <= r.true_freshness <= max(r.block_freshness)
        assert r.standard_error >= 0.0
    report = compare.format_report(result)
    assert all(name in report for name in compare.COMPARED)
    assert "optimal" in report.splitlines()[-2] and "uniform" in report.splitlines()[-1]
    data = json.loads((tmp_path / "compare.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["uniform", "proportional", "optimal"]
    # unweighted freshness is measured, so the daemons optimise it unweighted
    assert data["settings"]["weights"] == "none"
    assert 'weights = "none"' in (tmp_path / "optimal" / "refresher.toml").read_text()
    assert all(m["standard_error"] >= 0.0 for m in data["margins"])
    assert {(m["better"], m["worse"]) for m in data["margins"]} == {
        ("optimal", "uniform"),
        ("uniform", "proportional"),
    }
    assert_png(tmp_path / "compare.png")
    for policy in compare.COMPARED:
        assert (tmp_path / policy / "truth.duckdb").is_file()


# --- the offline model ----------------------------------------------------------------------


def test_the_model_measures_freshness_exactly_on_a_hand_made_history() -> None:
    # page 0 changes at 5 s and is fetched at 0 and 10: fresh 0–5 and 10–20; page 1 never
    # changes but is first fetched at 4: fresh 4–20, and without a copy before
    changes = [np.array([5.0]), np.zeros(0)]
    assert model._freshness([[0.0, 10.0], [4.0]], changes, 0.0, 20.0) == pytest.approx(31.0 / 40.0)
    # the window starts late: 10–20 and 8–20 out of 2 × 12 s
    assert model._freshness([[0.0, 10.0], [4.0]], changes, 8.0, 20.0) == pytest.approx(22.0 / 24.0)


def test_the_model_ranks_the_policies_as_the_real_comparison_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = model.ModelSettings(seconds=120.0, runs=1)
    web = model.model_web(settings.simweb)
    assert web.rates.size == 288  # the pages analysis.compare seeds on the default web
    uniform = model.run_model("uniform", web, settings, 1)
    proportional = model.run_model("proportional", web, settings, 1)
    oracle = model.run_model("optimal", web, replace(settings, oracle=True), 1)
    assert 0.0 < proportional < uniform < oracle < 1.0
    assert model.main(["--seconds", "30", "--runs", "1", "--policies", "uniform,optimal"]) == 0
    out = capsys.readouterr().out
    assert "optimal − uniform:" in out and "288 pages" in out
    assert model.main(["--policies", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err


@pytest.mark.slow
def test_on_a_generated_web_optimal_is_at_least_uniform_within_two_standard_errors(
    tmp_path: Path,
) -> None:
    # Not the default web: three hosts of a dozen pages, rates log-normal with a wide spread
    # (about one change every 5 s at the median), a third of the hosts without validators.
    settings = compare.CompareSettings(
        simweb=SimwebConfig(
            seed=23,
            hosts=3,
            pages_per_host=12,
            rate_unit=1.0,
            time_scale=1.0,
            rate_mix=parse_rate_mix("all:1:0.2:1.5"),
            validators_none_share=0.34,
            validators_wrong_share=0.0,
            crawl_delay_share=0.0,
            new_pages_per_minute=0.0,
        ),
        policies=("uniform", "optimal"),
        seconds=20.0,
        budget=8.0,
        min_delay=0.05,
        workers=4,
        resolve_interval=2.0,
        plots=False,
    )
    # side by side: each policy its 20 s against its own copy of the web, under one load, in
    # the time of one run (the in-turn path has the test above)
    result = compare.compare(settings, tmp_path, side_by_side=True)
    margin, _ = result.margin("optimal", "uniform")
    error = result.margin_error("optimal", "uniform")
    assert math.isfinite(error) and error > 0
    assert margin >= -2.0 * error, (margin, error)


def test_the_family_tunes_and_reports_on_different_webs_drawn_the_same_every_time() -> None:
    from analysis import family

    assert not set(family.TUNE) & set(family.REPORT)
    assert len(family.REPORT) >= 16
    assert family.family_web(101) == family.family_web(101)
    webs = [family.family_web(s) for s in family.REPORT]
    assert len({w.label for w in webs}) == len(webs)
    assert all(0.1 <= w.budget / model.model_web(w.simweb).rates.sum() <= 3.0 for w in webs)


def test_the_family_measures_freshness_and_age_exactly_in_each_window() -> None:
    from analysis import family

    # fetched at 1 s and 6 s, changed at 3 s: over (4, 8] stale until 6 s, then fresh
    fresh, age = family._windows([[1.0, 6.0]], [np.array([3.0])], [8.0])
    assert fresh.tolist() == pytest.approx([0.5])
    assert age.tolist() == pytest.approx([1.0])  # ∫ from 4 to 6 of (t − 3) dt, over 4 s


@pytest.mark.slow
def test_the_familys_real_subset_runs_both_daemons_at_once_and_measures_as_the_views_do(
    tmp_path: Path,
) -> None:
    from analysis import family
    from analysis._db import open_history, rows

    web = family.FamilyWeb(seed=7, simweb=SMALL_WEB, budget=16.0, min_delay=0.05, label="small")
    real = family.real_web(web, seconds=16.0, out=tmp_path, workers=8, horizons=[16.0])
    pages = model.model_web(SMALL_WEB).rates.size
    spans = []
    for policy in ("uniform", "optimal"):
        run = real[policy]
        assert run["pages"] == pages and run["fetches"] > 0.8 * 16.0 * 16.0  # B for 16 s
        fetches, _ = family.run_history(tmp_path / policy)
        times = np.concatenate([np.asarray(f) for f in fetches])
        assert times.min() >= 0.0 and times.max() <= 16.5
        window = json.loads((tmp_path / policy / "run.json").read_text())
        spans.append((window["start"], window["end"]))
        # every page has a copy by 8 s, so the views' freshness over the covered page-seconds
        # is the freshness over all of them that the family measures
        t0 = window["start"] + 8.0
        con = open_history(
            tmp_path / policy / "refresher.duckdb", truth=tmp_path / policy / "truth.duckdb"
        )
        try:
            view = rows(con, "SELECT * FROM true_freshness(?, ?)", [t0, t0 + 8.0])[0]
        finally:
            con.close()
        assert view["coverage"] == pytest.approx(1.0)
        fresh, age = family.measure_windows(*family.run_history(tmp_path / policy), [(8.0, 16.0)])
        assert fresh[0] == pytest.approx(view["freshness"], rel=1e-6)
        assert age[0] == pytest.approx(view["age"], rel=1e-6)
        assert np.mean(run["freshness"][0]) == pytest.approx(fresh[0], abs=1e-9)
    # side by side: the two runs overlap for most of their span
    (a0, a1), (b0, b1) = spans
    assert min(a1, b1) - max(a0, b0) > 12.0
    assert "web 7 real daemons" in family.format_real(real, None)


def test_the_familys_honesty_check_compares_the_plans_estimate_with_the_truth() -> None:
    from analysis import family

    web = family.FamilyWeb(seed=7, simweb=SMALL_WEB, budget=16.0, min_delay=0.05, label="small")
    estimated, true = family.honesty(web, seconds=120.0)
    assert 0.0 < true < 1.0 and 0.0 < estimated < 1.0
    assert abs(estimated - true) < 0.1, (estimated, true)


def test_the_familys_honesty_command_averages_the_gap_over_the_draws(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis import family

    gaps = {1: (0.50, 0.49), 2: (0.52, 0.48), 3: (0.40, 0.40)}  # draw: (estimated, true)

    def honesty(web: family.FamilyWeb, *, run: int = 1) -> tuple[float, float]:
        return gaps[run]

    monkeypatch.setattr(family, "honesty", honesty)
    monkeypatch.setattr(family, "family_web", lambda seed: None)
    assert family.main(["--seeds", "6", "--honesty", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    # gaps +0.01, +0.04, 0: mean +0.0167, s.e. 0.0120; the largest +0.04
    assert "web 6: estimated 0.4733  true 0.4567  gap +0.0167 ± 0.0120" in out
    assert "largest of 3 draws +0.0400" in out
    assert "largest mean gap +0.0167 over 1 webs, 3 draws each" in out


@pytest.mark.parametrize(
    ("flag", "sitemaps"),
    [([], False), (["--real-sitemaps"], "honest"), (["--real-sitemaps", "build"], "build")],
)
def test_the_familys_real_sitemaps_flag_alone_still_means_honest_lastmods(
    flag: list[str], sitemaps: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from analysis import family

    asked: list[object] = []

    def real_web(web: object, **kwargs: object) -> dict[str, object]:
        asked.append(kwargs["sitemaps"])
        return {}

    for name, stub in [
        ("family_web", lambda seed: None),
        ("run_web", lambda *a, **k: {"seed": 6}),
        ("summarize", lambda r: {}),
        ("format_row", lambda *a: ""),
        ("_overall", lambda r: None),
        ("plot_family", lambda *a: None),
        ("format_real", lambda *a: ""),
        ("real_web", real_web),
    ]:
        monkeypatch.setattr(family, name, stub)
    argv = ["--seeds", "6", "--real", "6", "--out", str(tmp_path), *flag]
    assert family.main(argv) == 0
    assert asked == [sitemaps]


def test_the_familys_real_daemons_read_sitemaps_that_write_the_asked_lastmods(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from analysis import family

    ran: list[compare.CompareSettings] = []
    monkeypatch.setattr(compare, "run_side_by_side", lambda settings, out: ran.append(settings))
    monkeypatch.setattr(family, "measure_real", lambda *a, **k: {})
    web = family.FamilyWeb(seed=7, simweb=SMALL_WEB, budget=16.0, min_delay=0.05, label="small")
    for sitemaps in (False, True, "now"):
        family.real_web(web, seconds=60.0, out=tmp_path, sitemaps=sitemaps)  # type: ignore[arg-type]
    assert [(s.sitemaps, s.simweb.sitemap_lastmod) for s in ran] == [
        (False, "honest"),
        (True, "honest"),
        (True, "now"),
    ]


def test_the_familys_real_policies_take_the_clairvoyant_and_print_the_paired_share(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis import family

    asked: list[object] = []
    blocks = {"optimal": 0.6, "clairvoyant": 0.8}  # each block's freshness, two horizons
    model_figures = {
        f"{p}.{kind}": ([0.7, 0.7], [0.01, 0.01]) for p in blocks for kind in ("freshness", "age")
    }

    def real_web(web: object, **kwargs: Any) -> dict[str, Any]:
        asked.append(kwargs["policies"])
        real: dict[str, Any] = {"seed": 6, "seconds": 300.0, "horizons": [60.0, 300.0]}
        for p, f in blocks.items():
            fresh = [[f + 0.01 * (k % 2) for k in range(family.BLOCKS)]] * 2
            real[p] = {"freshness": fresh, "age": fresh}
        return {**real, "shares": family.paired_shares(real)}

    for name, stub in [
        ("family_web", lambda seed: None),
        ("run_web", lambda *a, **k: {"seed": 6}),
        ("summarize", lambda r: {**model_figures, "share": [0.9, 0.95]}),
        ("format_row", lambda *a: ""),
        ("_overall", lambda r: None),
        ("plot_family", lambda *a: None),
        ("real_web", real_web),
    ]:
        monkeypatch.setattr(family, name, stub)
    argv = ["--seeds", "6", "--real", "6", "--out", str(tmp_path)]
    assert family.main([*argv, "--real-policies", "optimal,clairvoyant"]) == 0
    assert asked == [("optimal", "clairvoyant")]
    # the ratio of the means, 0.605 / 0.805, its s.e. from the paired blocks; the model's
    # share for the same web beside it
    printed = capsys.readouterr().out
    assert "share optimal/clairvoyant 75.2%±0.1% (model 90.0%)" in printed  # 1 minute
    assert "share optimal/clairvoyant 75.2%±0.1% (model 95.0%)" in printed  # 5 minutes
    saved = json.loads((tmp_path / "real.json").read_text())[0]["shares"]
    assert saved["optimal/clairvoyant"]["share"] == pytest.approx([0.605 / 0.805] * 2)


def test_a_clairvoyant_runs_its_policy_with_the_webs_truth_as_its_known_rates(
    tmp_path: Path,
) -> None:
    from refresher._config import load_config
    from refresher.sim._simweb import write_truth

    site = site_of(plan_web(SMALL_WEB, start=0.0), SMALL_WEB)
    write_truth(site, tmp_path / "known.duckdb", until=0.0)
    assert compare.daemon_policy("clairvoyant") == "optimal"
    assert compare.daemon_policy("clairvoyant-age") == "optimal-age"
    assert compare.daemon_policy("uniform") == "uniform"
    path = compare._daemon_config(
        tmp_path / "refresher.toml",
        store=tmp_path / "refresher.duckdb",
        control=tmp_path / "control.sock",
        port=8080,
        seeds=["http://h0.sim.test/"],
        policy="optimal",
        settings=compare.CompareSettings(simweb=SMALL_WEB),
        known_rates=tmp_path / "known.duckdb",
    )
    config = load_config(path)  # reads and checks the file
    assert config.estimate.known_rates == tmp_path / "known.duckdb"
    assert config.policy.name == "optimal"


def test_the_model_draws_each_pages_changes_at_its_rate() -> None:
    rng = np.random.default_rng(0)
    for rate in (0.001, 0.01, 1.0):
        counts = np.array([c.size for c in model._changes(np.full(20_000, rate), 300.0, rng)])
        expected = rate * 300.0
        assert counts.mean() == pytest.approx(expected, abs=4 * math.sqrt(expected / 20_000))
        assert counts.var() == pytest.approx(expected, rel=0.1)  # Poisson: variance = mean
    times = model._changes(np.array([0.5]), 100.0, rng)[0]
    assert (np.diff(times) > 0).all() and times.min() >= 0.0 and times.max() < 100.0


def test_the_steady_state_is_32_rounds_of_uniform_and_never_before_30_minutes() -> None:
    from analysis import family

    slow = family.FamilyWeb(seed=0, simweb=SMALL_WEB, budget=2.0, min_delay=0.1, label="slow")
    assert family.steady_horizon(slow, 500) == pytest.approx(32 * 500 / 2.0)  # 8,000 s
    fast = replace(slow, budget=50.0)
    assert family.steady_horizon(fast, 500) == family.HORIZONS[-1]  # 32 rounds in 320 s


def test_the_informed_bound_is_planned_on_the_clairvoyants_own_draws_and_printed() -> None:
    from analysis import family

    web = family.FamilyWeb(seed=7, simweb=SMALL_WEB, budget=16.0, min_delay=0.05, label="small")
    result = family.run_web(
        web, runs=2, horizon=60.0, decide="expected", resolve_interval=5.0, informed=True
    )
    assert result["informed_horizons"] == [60.0]
    # the bound's reference is the clairvoyant plan on the same change times
    assert result["informed-clairvoyant"] == result["clairvoyant"]
    summary = family.summarize(result)
    informed = np.mean(result["informed"]["freshness"])
    clairvoyant = np.mean(result["clairvoyant"]["freshness"])
    assert summary["informed_share"] == pytest.approx([informed / clairvoyant])
    assert "informed bound" in family.format_row(result, summary)
    assert "| 7 |" in family.markdown_steady([result])


def test_the_model_fetches_through_the_budgets_pacer_and_by_default_spends_every_token() -> None:
    from analysis import family

    web = family.family_web(3)  # a TUNE web
    settings = model.ModelSettings(
        simweb=web.simweb,
        seconds=120.0,
        budget=web.budget,
        min_delay=web.min_delay,
        work_conserving=False,
    )
    mweb = model.model_web(web.simweb)
    most = web.budget * (settings.seconds + model.BURST) + 1  # the pacer's tokens, its credit too
    for policy in ("uniform", "optimal"):
        fetches, _ = model.replay(policy, mweb, settings, 1)
        assert sum(map(len, fetches)) <= most
        assert all(np.all(np.diff(t) > 0) for t in fetches)
    # uniform always has a page due: it spends every token
    uniform, _ = model.replay("uniform", mweb, settings, 1)
    assert sum(map(len, uniform)) >= web.budget * settings.seconds
    # the default, as the daemon: a token nothing is due for goes to the page due soonest
    assert model.ModelSettings().work_conserving
    greedy, _ = model.replay("optimal", mweb, replace(settings, work_conserving=True), 1)
    assert sum(map(len, greedy)) >= web.budget * settings.seconds


def test_the_model_makes_up_late_fetches_as_the_store_does_and_so_spends_more_of_the_budget() -> (
    None
):
    from analysis import family

    web = family.family_web(3)  # a TUNE web: 357 pages, 4.1 fetches/s, optimal's plan uneven
    settings = model.ModelSettings(
        simweb=web.simweb,
        seconds=600.0,
        budget=web.budget,
        min_delay=web.min_delay,
        decide="expected",
        work_conserving=False,  # the due rule alone
        resolve_interval=5.0,  # a plan every 5 s, as the figure was found
    )
    mweb = model.model_web(web.simweb)
    spent = {}
    for catch_up in (False, True):
        fetches, _ = model.replay("optimal", mweb, replace(settings, catch_up=catch_up), 1)
        spent[catch_up] = sum(map(len, fetches)) / (web.budget * settings.seconds)
    # one interval after the last fetch adds every fetch's lateness to the next interval
    assert spent[True] > spent[False]
    assert spent[True] >= 0.99, spent


def test_a_page_is_quiet_until_an_interval_between_its_fetches_saw_a_change() -> None:
    fetches = [[1.0, 5.0, 9.0], [1.0, 5.0, 9.0], [3.0], [], [1.0, 2.0, 3.0]]
    changes = [np.array([0.5, 9.5]), np.array([6.0]), np.array([4.0]), np.zeros(0)]
    changes.append(np.array([1.5, 1.7, 2.5]))
    assert age_bound.quiet_pages(fetches, changes).tolist() == [True, False, True, True, False]
    assert age_bound.changed_intervals(fetches, changes).tolist() == [0, 1, 0, 0, 2]


def test_the_alike_bound_is_the_clairvoyant_plan_when_no_page_is_quiet_and_never_better() -> None:
    from refresher import policies

    alike_plan, plan_age = age_bound.alike_plan, age_bound.plan_age
    rng = np.random.default_rng(3)
    rates = np.exp(rng.normal(-4.0, 1.5, 60))
    hosts = np.repeat(np.arange(3), 20).astype(np.intp)
    caps = np.full(3, np.inf)
    best = policies.solve("optimal-age", rates, 2.0, hosts=hosts, host_caps=caps).rates
    none = alike_plan(rates, np.zeros(60, bool), 2.0, hosts, caps)
    np.testing.assert_allclose(none, best, rtol=1e-9)
    quiet = rates < np.quantile(rates, 0.3)  # the slowest pages, fetched alike
    alike = alike_plan(rates, quiet, 2.0, hosts, caps)
    assert alike.sum() == pytest.approx(2.0)
    assert np.ptp(alike[quiet]) == 0.0
    assert plan_age(rates, alike) > plan_age(rates, best)
    # no one rate for the quiet pages does better than the one found
    for f_q in (0.5, 0.9, 1.1, 2.0):
        other = alike.copy()
        other[quiet] *= f_q
        rest = ~quiet
        other[rest] *= (2.0 - other[quiet].sum()) / alike[rest].sum()
        assert plan_age(rates, other) >= plan_age(rates, alike) * (1 - 1e-9)


def test_rate_errors_leave_the_quiet_pages_alike_and_cost_age_where_changes_were_few() -> None:
    rng = np.random.default_rng(5)
    rates = np.exp(rng.normal(-4.0, 1.5, 80))
    hosts = np.zeros(80, dtype=np.intp)
    caps = np.array([np.inf])
    shown = rng.integers(0, 6, 80)
    quiet = shown == 0
    alike = age_bound.alike_plan(rates, quiet, 3.0, hosts, caps)
    noisy = age_bound.noisy_plan(rates, shown, alike, 3.0, hosts, caps, rng)
    assert noisy.sum() == pytest.approx(3.0)
    np.testing.assert_array_equal(noisy[quiet], alike[quiet])
    sure = age_bound.noisy_plan(rates, np.where(quiet, 0, 10**12), alike, 3.0, hosts, caps, rng)
    assert age_bound.plan_age(rates, sure) == pytest.approx(age_bound.plan_age(rates, alike))
    assert age_bound.plan_age(rates, noisy) > age_bound.plan_age(rates, alike)


def _inputs(rates: np.ndarray, weights: np.ndarray, static_p: np.ndarray) -> PolicyInputs:
    n = rates.size
    return PolicyInputs(
        page_ids=np.arange(n, dtype=np.int64),
        host_index=np.zeros(n, dtype=np.intp),
        host_caps=np.array([np.inf]),
        last_fetch=np.full(n, np.nan),
        rates=rates,
        rate_n=np.zeros(n),
        weights=weights,
        static_p=static_p,
    )


def test_the_models_front_queue_levels_are_the_daemons_priority_level_of_each_page() -> None:
    rng = np.random.default_rng(5)
    n = 400
    rates = np.exp(rng.normal(-4.0, 2.5, n))
    target = np.where(rng.random(n) < 0.1, 0.0, np.exp(rng.normal(-3.0, 1.5, n)))
    inputs = _inputs(rates, np.exp(rng.normal(0.0, 1.0, n)), rng.random(n) ** 4)
    fetched = rng.random(n) < 0.9
    last = np.where(fetched, 0.0, np.nan)
    levels = model.front_queues(inputs, target, last, np.arange(n), 8)
    stored = reported_rates(inputs, target)  # the rate the store holds after the plan
    for i in range(n):
        page = PageRow(
            id=i, url=f"http://h.test/{i}", host_id=0, host="h.test", due_at=0.0, etag=None,
            last_modified=None, digest=b"d" if fetched[i] else None,
            target_rate=float(target[i]), rate=float(stored[i]), weight=float(inputs.weights[i]),
        )  # fmt: skip
        assert levels[i] == priority_level(page, 0.0, 8), i
    assert len(set(levels.tolist())) > 4  # the pages spread over the queues


def test_a_replans_overdue_pages_go_first_the_likelier_changed_before_the_static_ones() -> None:
    n = 200
    due = np.concatenate([np.linspace(1.0, 9.0, 100), np.linspace(11.0, 20.0, 100)])
    static = np.arange(n) % 2 == 0  # every other page all but surely never changes
    inputs = _inputs(np.full(n, 0.1), np.ones(n), np.where(static, 0.999, 0.0))
    target, last = np.full(n, 0.05), np.zeros(n)
    rng = np.random.default_rng(1)
    order = model._reorder(due, 10.0, inputs, target, last, 8, rng)
    first = np.argsort(order, kind="stable")
    assert set(first[:100].tolist()) == set(range(100))  # the overdue ones, then by due time
    assert first[100:].tolist() == list(range(100, n))
    # the changing overdue pages mostly before the static ones: by value, not by due time
    assert static[first[:50]].mean() < 0.2
    assert np.all(np.diff(due[first[:100]][~static[first[:100]]]) > 0)  # each queue by due
    # no front queues: earliest due first, the model before
    assert np.array_equal(model._reorder(due, 10.0, inputs, target, last, 0, rng), due)


def _regular_web() -> tuple[model.ModelWeb, list[list[float]], list[np.ndarray]]:
    """Two hosts of three pages (the second host's Last-Modified honest), each page fetched
    every 2 s for 80 s; page 0 changed only in the first half, page 1 never, the others about
    every 3 s."""
    rng = np.random.default_rng(7)
    web = model.ModelWeb(
        rates=np.array([0.5, 0.0, 0.3, 0.3, 0.3, 0.3]),
        hosts=np.array([0, 0, 0, 1, 1, 1], dtype=np.intp),
        honest=np.array([False, True]),
    )
    fetches = [list(np.arange(1.0, 81.0, 2.0) + 0.1 * i) for i in range(6)]
    changes = [np.arange(0.5, 40.0, 2.0), np.zeros(0)]
    changes += [np.sort(rng.uniform(0.0, 80.0, 27)) for _ in range(4)]
    return web, fetches, changes


def test_the_model_reads_the_daemons_statistics_which_match_the_window_within_history() -> None:
    web, fetches, changes = _regular_web()
    settings = model.ModelSettings(seconds=80.0, budget=3.0, decide="expected")
    short = [t[:20] for t in fetches]  # 19 intervals each, within the history of 32
    daemon = model.plan_at("optimal", web, settings, short, changes)[0]
    window = model.plan_at("optimal", web, replace(settings, statistics=False), short, changes)[0]
    assert model.ModelSettings().statistics  # the default, as the daemon's allocator
    # regular intervals: the statistics' two-point rule is exact, so the estimates agree
    np.testing.assert_allclose(daemon.rates, window.rates, rtol=1e-4)
    assert daemon.rate_sd is not None and window.rate_sd is not None
    np.testing.assert_allclose(daemon.rate_sd, window.rate_sd, rtol=1e-4)
    assert daemon.static_p is not None and window.static_p is not None
    np.testing.assert_allclose(daemon.static_p, window.static_p, atol=1e-4)


def test_past_history_the_models_estimate_rests_on_every_interval_weighed_down() -> None:
    web, fetches, changes = _regular_web()
    settings = model.ModelSettings(seconds=80.0, budget=3.0, decide="expected", history=8)
    daemon = model.plan_at("optimal", web, settings, fetches, changes)[0]
    window = model.plan_at("optimal", web, replace(settings, statistics=False), fetches, changes)[0]
    # page 0 changed in every interval of its first 40 s and in none of its last 8: the last
    # intervals alone read it as slow, the statistics of all 39 as changing about half of them
    assert daemon.rates[0] > 4 * window.rates[0]
    # weighed down to 8 observations, not 39: the posterior stays as wide as the window's
    assert daemon.rate_sd is not None and window.rate_sd is not None
    assert daemon.rate_sd[2] == pytest.approx(window.rate_sd[2], rel=0.5)
    wide = model.plan_at("optimal", web, replace(settings, history=64), fetches, changes)[0]
    assert wide.rate_sd is not None and wide.rate_sd[2] < daemon.rate_sd[2]


def test_the_model_weighs_a_pages_evidence_down_as_far_as_the_daemon_does() -> None:
    from refresher._config import EstimateConfig

    assert model.ModelSettings().history == model.HISTORY == EstimateConfig().history


def test_the_model_re_plans_when_the_daemons_rule_says_or_on_a_clock_when_told() -> None:
    from analysis import family
    from refresher.refresh._replan import replan_fetches, replan_reason

    web = family.family_web(0)  # 79 pages at 5.4/s: half a round in ~7 s
    mweb = model.model_web(web.simweb)
    n = int(mweb.rates.size)
    base = model.ModelSettings(
        simweb=web.simweb, seconds=120.0, budget=web.budget, min_delay=web.min_delay
    )
    for settings in (base, replace(base, resolve_interval=30.0)):
        times: list[float] = []
        fetches, _ = model.replay(
            "optimal", mweb, settings, 1, on_plan=lambda now, i, p, seen=times: seen.append(now)
        )
        at = np.sort(np.concatenate([np.asarray(t) for t in fetches]))
        rule, plans = settings.rule, [0.0, *times]
        for last, now in itertools.pairwise(plans):
            fetched = int(np.count_nonzero((at >= last) & (at < now)))
            reason = replan_reason(now - last, fetched, n, 0.0, rule)
            assert reason is not None
            # … and not a POLL earlier (the clock's plans come on the dot)
            before = int(np.count_nonzero((at >= last) & (at < now - 1.0)))
            if now - last - 1.0 >= rule.floor:
                assert replan_reason(now - last - 1.0, before, n, 0.0, rule) is None
        if settings.resolve_interval is None:
            assert len(times) > 120.0 / rule.interval + 5  # many more than the clock's
            assert replan_fetches(rule, n) == 0.5 * n
        else:
            assert times == [30.0, 60.0, 90.0, 120.0]  # the last at the run's end, as before


def _sitemap_web(lastmods: str) -> tuple[model.ModelWeb, model.ModelSettings]:
    """One host of two pages, no Last-Modified, a sitemap read every 20 s from 1 s."""
    web = model.ModelWeb(
        rates=np.array([0.05, 0.05]),
        hosts=np.zeros(2, dtype=np.intp),
        honest=np.array([False]),
        sitemap=np.array([True]),
    )
    return web, model.ModelSettings(seconds=100.0, sitemaps=lastmods, sitemap_interval=20.0)


def test_a_trusted_sitemap_adds_its_reads_to_each_pages_timeline_without_counting_twice() -> None:
    web, settings = _sitemap_web("honest")
    # page 0 fetched at 10 and 50, changed at 25: the read at 41 times the change, and the
    # fetch at 50 (content changed since 10) cannot tell whether it changed again after 41
    # page 1 fetched at 10, 50 and 75, changed at 60: the reads at 21 and 41 said unchanged,
    # so the fetch at 50 observes (41, 50]; the read at 61 the change at 60, and the fetch at
    # 75 (content changed since 50) only starts the next pair
    fetches = [[10.0, 50.0], [10.0, 50.0, 75.0]]
    changes = [np.array([25.0]), np.array([60.0])]
    passed, failed = model.sitemap_checks(web, settings, fetches, changes, np.arange(1.0, 80, 20))
    assert passed[0] and not failed[0]
    page, at, lm, changed, pairs = model._timeline(web, settings, fetches, changes, 80.0)
    first = page == 0
    np.testing.assert_array_equal(at[first], [1.0, 10.0, 21.0, 41.0, 50.0, 61.0])
    np.testing.assert_array_equal(changed[first], [False, False, False, True, True, False])
    np.testing.assert_array_equal(pairs[first], [True, False, True, True, False, True])
    assert lm[first][3] == 25.0 and np.isnan(lm[first][4])
    second = page == 1
    np.testing.assert_array_equal(at[second], [1.0, 10.0, 21.0, 41.0, 50.0, 61.0, 75.0])
    np.testing.assert_array_equal(changed[second], [False] * 5 + [True, True])
    np.testing.assert_array_equal(pairs[second], [True, False, True, True, True, True, False])


@pytest.mark.parametrize("lastmods", ["build", "now"])
def test_a_sitemap_whose_lastmod_does_not_move_with_the_content_is_not_trusted(
    lastmods: str,
) -> None:
    web, settings = _sitemap_web(lastmods)
    # the content changed between the fetches at 10 and 30 ("build" says 0 at 41), and not
    # between 30 and 50, which "now" claimed at 41
    fetches = [[10.0, 30.0, 50.0], [10.0, 30.0, 50.0]]
    changes = [np.array([20.0]), np.array([20.0])]
    failed = model.sitemap_checks(web, settings, fetches, changes, np.arange(1.0, 60, 20))[1]
    assert failed[0]
    page, *_ = model._timeline(web, settings, fetches, changes, 60.0)
    assert page.size == 6  # the fetches alone


def test_reading_honest_sitemaps_learns_the_rates_sooner_than_fetching_alone() -> None:
    web = model.ModelWeb(
        rates=np.array([0.5, 0.5, 0.01, 0.01] * 5),
        hosts=np.zeros(20, dtype=np.intp),
        honest=np.array([False]),
        sitemap=np.array([True]),
    )
    base = model.ModelSettings(seconds=60.0, budget=1.0, sitemap_interval=5.0, sitemap_growth=0)
    fetches, changes = model.replay("uniform", web, base, 1)
    with pytest.raises(ValueError, match="sitemaps"):
        model.ModelSettings(sitemaps="sometimes")
    errors = {}
    for lastmods in ("off", "honest"):
        inputs = model.plan_at("optimal", web, replace(base, sitemaps=lastmods), fetches, changes)[
            0
        ]
        errors[lastmods] = np.abs(np.log(inputs.rates / web.rates)).mean()
    # two fetches a page in a minute against twelve reads
    assert errors["honest"] < 0.5 * errors["off"]


def test_a_sitemap_fetched_once_at_the_cold_start_takes_one_token_of_the_pages() -> None:
    web, settings = _sitemap_web("off")
    counts = {}
    for mode in ("off", "fetched"):
        fetches, _ = model.replay("uniform", web, replace(settings, sitemaps=mode, budget=1.0), 1)
        counts[mode] = sum(len(t) for t in fetches)
    assert counts["fetched"] == counts["off"] - 1


def test_the_sitemap_reads_come_every_interval_then_further_apart_as_the_crawl_ages() -> None:
    web, settings = _sitemap_web("honest")
    reads = model.sitemap_reads(web, replace(settings, sitemap_growth=0.25), 200.0)
    np.testing.assert_allclose(reads[:5], [1.0, 21.0, 41.0, 61.0, 81.0])
    np.testing.assert_allclose(reads[5:], [101.25, 126.5625, 158.203125, 197.75390625])
    assert model.sitemap_reads(web, replace(settings, sitemap_growth=0), 200.0).size == 10
    assert model.sitemap_reads(web, replace(settings, sitemaps="fetched"), 200.0).size == 0
