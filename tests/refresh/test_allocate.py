"""The allocator: estimates from a real store's history, plans, exploration, priorities;
and end to end, a daemon whose fetches move toward the optimal allocation."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import trio
from conftest import acli, cli, daemon_config, fetch_record, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refresher import policies
from refresher.refresh._allocate import (
    Allocator,
    PolicyInputs,
    load_inputs,
    page_freshness,
    plan,
    policy_table,
    priority_level,
    priority_levels,
    reported_rates,
    sitemap_reads,
    uncertainty,
    unplaced,
    within_caps,
)
from refresher.refresh._estimate import estimate_pages
from refresher.sim._simweb import SimwebConfig, plan_web
from refresher.sim._site import HostSpec, PageSpec, Site, serve_site
from refresher.store import (
    NEVER,
    DuckDBStore,
    NewPage,
    PageRow,
    PlanUpdate,
    StoreService,
    next_due,
)

NOW = 1_700_000_000.0


def inputs(rates, hosts=None, caps=None) -> PolicyInputs:
    n = len(rates)
    host_index = np.zeros(n, dtype=np.intp) if hosts is None else np.asarray(hosts, np.intp)
    return PolicyInputs(
        page_ids=np.arange(1, n + 1),
        host_index=host_index,
        host_caps=np.full(host_index.max() + 1, np.inf) if caps is None else np.asarray(caps),
        last_fetch=np.full(n, NOW),
        rates=np.asarray(rates, float),
        rate_n=np.ones(n),
        weights=np.ones(n),
    )


def test_the_paper_example_plans_the_optimal_split_when_nothing_explores():
    day = 86_400.0
    p = plan(inputs(np.arange(1, 6) / day), "optimal", 5 / day, explore=0.0)
    assert np.round(p.target * day, 2).tolist() == [1.15, 1.36, 1.35, 1.14, 0.0]
    assert p.explored == 1


def test_exploration_gives_pages_the_policy_starved_a_share_and_spends_the_budget():
    day = 86_400.0
    p = plan(inputs(np.arange(1, 6) / day), "optimal", 5 / day, explore=0.05)
    assert p.target[4] == pytest.approx(0.05 * 5 / day)
    assert p.target.sum() == pytest.approx(5 / day)
    # nothing starved: the whole budget goes to the policy's split
    u = plan(inputs(np.arange(1, 6) / day), "uniform", 5 / day, explore=0.05)
    assert u.explored == 0 and u.target.tolist() == pytest.approx([1 / day] * 5)


def test_a_sitemap_is_read_once_a_round_at_first_then_a_quarter_of_its_age_apart():
    # 100 pages at 10/s: a uniform round is 10 s; page 0 is a sitemap found at NOW
    base = replace(inputs(np.full(100, 0.01)), sitemap_since=np.full(100, np.nan))
    base.sitemap_since[0] = NOW
    target = np.full(100, 0.1)
    young = sitemap_reads(base, target, NOW + 20)
    assert young[0] == pytest.approx(1 / 10)
    old = sitemap_reads(base, target, NOW + 400)
    assert old[0] == pytest.approx(1 / 100)  # 400 s old: read 100 s apart
    for got in (young, old):  # the plan's total is kept, the rest in proportion
        assert got.sum() == pytest.approx(10.0)
        assert np.ptp(got[1:]) == pytest.approx(0.0, abs=1e-12)
    # no sitemap read on a schedule (none, or a store before them): the plan as it was
    assert sitemap_reads(replace(base, sitemap_since=None), target, NOW) is target
    many = replace(base, sitemap_since=np.full(100, NOW))  # all sitemaps: at most half each
    assert sitemap_reads(many, target, NOW).sum() == pytest.approx(5.0)


def test_expected_exploration_goes_where_a_re_check_can_change_the_plan():
    # Four slow pages the plan keeps, two fast ones it drops: one surely too fast (narrow
    # posterior), one that might well be slow (wide posterior).
    rates = np.array([0.01, 0.01, 0.01, 0.01, 5.0, 5.0])
    given = dataclasses.replace(inputs(rates), rate_sd=np.array([0.1, 0.1, 0.1, 0.1, 0.05, 2.0]))
    p = plan(given, "optimal", 0.1, explore=0.05, decide="expected")
    assert p.target.sum() == pytest.approx(0.1)
    assert p.target[4] < 1e-6 < p.target[5]
    assert p.target[5] < 0.05 * 0.1  # the share it does not need goes back to the plan
    plug = plan(given, "optimal", 0.1, explore=0.05)
    assert plug.target[4] == plug.target[5] == pytest.approx(0.05 * 0.1 / 2)


def test_host_caps_bind_and_the_rest_is_reported_unplaced():
    p = plan(
        inputs([1.0, 1.0, 1.0], hosts=[0, 0, 1], caps=[0.5, 0.25]), "uniform", 3.0, explore=0.0
    )
    assert p.target[:2].sum() == pytest.approx(0.5) and p.target[2] == pytest.approx(0.25)
    assert p.allocation.unplaced == pytest.approx(2.25)


@pytest.mark.parametrize("policy", ["uniform", "proportional", "optimal", "optimal-age"])
@pytest.mark.parametrize("explore", [0.0, 0.05, 0.5])
def test_the_budget_reported_unplaced_counts_the_exploration_share(policy, explore):
    rates = [0.001, 0.01, 0.1, 1.0, 10.0, 0.001]
    capped = inputs(rates, hosts=[0, 0, 0, 1, 1, 2], caps=[0.5, 0.25, 0.01])
    p = plan(capped, policy, 3.0, explore=explore)
    fitted = replace(p, target=within_caps(capped, p.target))
    assert fitted.target.sum() == pytest.approx(0.76)  # every host at its cap
    assert unplaced(fitted, 3.0) == pytest.approx(3.0 - 0.76)
    roomy = inputs(rates, hosts=[0, 0, 0, 1, 1, 2], caps=[5.0, 5.0, 5.0])
    p = plan(roomy, policy, 3.0, explore=explore)
    assert unplaced(replace(p, target=within_caps(roomy, p.target)), 3.0) == 0.0


def test_the_allocator_keeps_a_capped_host_at_its_cap_after_exploration():
    # Nothing starves under optimal-age, so the exploration share goes back to the plan: by
    # scaling every rate up it pushed host 0 (at its cap of 5/s) to 5.26/s, which politeness
    # never lets happen, and that part of B never reached the wire.
    rates = np.array([1.0] * 10 + [0.01] * 10 + [0.001] * 10)
    given = inputs(rates, hosts=[0] * 10 + [1] * 10 + [2] * 10, caps=[5.0, 5.0, 5.0])
    for decide in ("plug-in", "expected"):
        sd = np.full(30, 0.3) if decide == "expected" else None
        with_sd = dataclasses.replace(given, rate_sd=sd)
        planned = plan(with_sd, "optimal-age", 8.0, explore=0.05, decide=decide).target
        assert np.bincount(given.host_index, planned)[0] > 5.2  # what the plan alone asks
        target = within_caps(with_sd, planned)
        assert np.bincount(given.host_index, target)[0] == pytest.approx(5.0)
        assert target.sum() == pytest.approx(8.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    budget=st.floats(0.01, 30.0),
    explore=st.sampled_from([0.0, 0.05, 0.3]),
    name=st.sampled_from(["uniform", "proportional", "optimal", "optimal-age"]),
    decide=st.sampled_from(["plug-in", "expected"]),
)
def test_the_allocator_never_asks_a_host_for_more_than_its_cap_and_spends_what_caps_allow(
    n: int, seed: int, budget: float, explore: float, name: str, decide: str
):
    rng = np.random.default_rng(seed)
    hosts = rng.integers(0, 4, n)
    caps = rng.choice([0.05, 0.5, 5.0, np.inf], 4)
    given = dataclasses.replace(
        inputs(np.exp(rng.normal(-2.0, 2.0, n)), hosts=hosts, caps=caps),
        rate_sd=rng.uniform(0.0, 3.0, n),
    )
    target = within_caps(given, plan(given, name, budget, explore=explore, decide=decide).target)
    per_host = np.bincount(hosts, target, minlength=4)
    assert (target >= 0).all()
    assert (per_host <= caps * (1 + 1e-6) + 1e-12).all()
    room = float(caps[np.bincount(hosts, minlength=4) > 0].sum())
    assert target.sum() <= min(budget, room) * (1 + 1e-6)
    if (target > 0).all():  # every page can take more: only the caps stop it
        assert target.sum() == pytest.approx(min(budget, room), rel=1e-6)


def test_the_policy_table_ranks_optimal_over_uniform_over_proportional():
    rates = np.geomspace(1e-5, 1e-1, 50)
    table = policy_table(inputs(rates), 0.05)
    f = {name: row["freshness"] for name, row in table["policies"].items()}
    assert f["optimal"] >= f["uniform"] >= f["proportional"]
    assert table["pages"] == 50 and table["budget"] == 0.05
    a = {name: row["age"] for name, row in table["policies"].items()}
    assert a["optimal-age"] <= a["uniform"]
    json.dumps(table, allow_nan=False)  # machines get strict JSON


def inputs_of(store: DuckDBStore, *, min_delay: float, **settings: str) -> PolicyInputs:
    """:func:`load_inputs` over the store's raw history, as the allocator reads it."""
    raw = store.estimator_inputs(
        meaningful=False, links=settings.get("weights", "pagerank") == "pagerank"
    )
    return load_inputs(raw, min_delay=min_delay, **settings)


def _history(
    store: DuckDBStore, page_id: int, host_id: int, times: list[float], changed: list[bool]
):
    records = [
        fetch_record(page_id, host_id, t, duration=0.1, body_bytes=10, changed=c)
        for t, c in zip(times, changed, strict=True)
    ]
    store.write(records, [])


def test_inputs_from_a_real_store_order_pages_by_how_often_they_changed(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows = store.add_pages(
            [
                NewPage(url=f"http://h.example/p{i}", host="h.example", scheme="http")
                for i in range(3)
            ]
            + [NewPage(url="http://g.example/", host="g.example", scheme="http")],
            now=NOW,
        )
        ids = {r.url: r.id for r in rows}
        host = {r.url: r.host_id for r in rows}
        times = [NOW + 60 * k for k in range(41)]
        for i, share in enumerate((0.0, 0.3, 0.9)):
            url = f"http://h.example/p{i}"
            changed = [k > 0 and (k * share) % 1 + share >= 1 for k in range(41)]
            _history(store, ids[url], host[url], times, changed)
        store.add_links(ids["http://h.example/p0"], ["http://g.example/"], now=NOW)
        store.add_links(ids["http://h.example/p1"], ["http://g.example/"], now=NOW)
        store._con.execute("UPDATE hosts SET delay = 4.0 WHERE name = 'h.example'")
        got = inputs_of(store, min_delay=1.0)
        unweighted = inputs_of(store, min_delay=1.0, weights="none")
        gamma = inputs_of(store, min_delay=1.0, model="gamma")
        with pytest.raises(ValueError, match="'pagerank' or 'none'"):
            inputs_of(store, min_delay=1.0, weights="indegree")
    finally:
        store.close()
    # the gamma prior orders the pages the same way
    order = [r.url for r in sorted(rows, key=lambda r: r.id)]
    by_gamma = dict(zip(order, gamma.rates, strict=True))
    assert by_gamma["http://h.example/p0"] < by_gamma["http://h.example/p1"]
    assert by_gamma["http://h.example/p1"] < by_gamma["http://h.example/p2"]
    assert not np.array_equal(gamma.rates, got.rates)
    # without weights every page counts the same, and nothing else changes
    assert unweighted.weights.tolist() == [1.0] * 4
    np.testing.assert_array_equal(unweighted.rates, got.rates)
    by_url = dict(zip([r.url for r in sorted(rows, key=lambda r: r.id)], got.rates, strict=True))
    assert (
        by_url["http://h.example/p0"]
        < by_url["http://h.example/p1"]
        < by_url["http://h.example/p2"]
    )
    # the never-fetched page gets a finite prior, pooled from the history
    assert 0 < by_url["http://g.example/"] < math.inf
    caps = dict(zip(got.host_index, got.host_caps[got.host_index], strict=True))
    assert sorted(caps.values()) == [0.25, 1.0]  # 1/delay; min_delay for the other host
    weights = dict(zip([r.url for r in sorted(rows, key=lambda r: r.id)], got.weights, strict=True))
    assert weights["http://g.example/"] == max(weights.values())  # the most linked page
    assert got.weights.mean() == pytest.approx(1.0)


def test_a_hosts_cap_counts_its_mean_response_time_as_politeness_does(tmp_path: Path):
    # The frontier waits the delay from the end of each response: a host with 0.4 s of delay
    # and 0.1 s responses does at most 2 fetches a second, not 2.5.
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows = store.add_pages(
            [
                NewPage(url="http://h.example/", host="h.example", scheme="http"),
                NewPage(url="http://g.example/", host="g.example", scheme="http"),
            ],
            now=NOW,
        )
        h = next(r for r in rows if r.url == "http://h.example/")
        _history(store, h.id, h.host_id, [NOW + 60 * k for k in range(5)], [False] * 5)
        store._con.execute("UPDATE hosts SET delay = 0.4 WHERE name = 'h.example'")
        raw = store.estimator_inputs(meaningful=False, links=False, responses_since=NOW)
        before = store.estimator_inputs(meaningful=False, links=False)
    finally:
        store.close()
    got = load_inputs(raw, min_delay=0.2, weights="none")
    caps = dict(zip(got.page_ids.tolist(), got.host_caps[got.host_index].tolist(), strict=True))
    g = next(r for r in rows if r.url == "http://g.example/")
    assert caps[h.id] == pytest.approx(1 / (0.4 + 0.1))
    assert caps[g.id] == pytest.approx(1 / 0.2)  # no response yet: min_delay alone
    # a delay stored before a reload lowered max_delay: planned as the frontier now waits
    low = load_inputs(raw, min_delay=0.2, max_delay=0.3, weights="none")
    assert low.host_caps[low.host_index][low.page_ids == h.id][0] == pytest.approx(1 / 0.4)
    # read without response times, the cap is 1/delay: a plan the frontier cannot deliver
    old = load_inputs(before, min_delay=0.2, weights="none")
    assert old.host_caps[old.host_index].tolist() == pytest.approx(
        [2.5 if r.id == h.id else 5.0 for r in sorted(rows, key=lambda r: r.id)]
    )


def _page(**fields: Any) -> PageRow:
    """A page due at NOW, fetched never (as far as the row shows), planned as ``fields`` say."""
    base: dict[str, Any] = {"id": 1, "url": "u", "host_id": 1, "host": "h", "due_at": NOW}
    unknown = {"etag": None, "last_modified": None, "digest": None, "target_rate": None}
    return PageRow(**{**base, **unknown, **fields})


def test_priority_puts_new_and_likely_stale_pages_first():
    def row(rate, target, weight=1.0):
        return _page(target_rate=target, rate=rate, weight=weight, digest=b"copy")

    assert priority_level(row(None, None), NOW, 8) == 0
    assert priority_level(row(10.0, 1.0), NOW, 8) == 0  # surely changed by its due time
    assert priority_level(row(0.001, 1.0), NOW, 8) >= 8 - 1 - 1
    assert priority_level(row(0.0, 1.0), NOW, 8) == 7
    assert priority_level(row(0.5, 1.0, weight=0.01), NOW, 8) > priority_level(
        row(0.5, 1.0), NOW, 8
    )


_SIZES = st.one_of(
    st.just(0.0),
    st.floats(min_value=0.0, max_value=1e-300),  # subnormal and tiny
    st.floats(min_value=0.0, max_value=1e300),
    st.sampled_from([1e-12, 0.5, 1.0, 2.0, 1e12, math.inf]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),  # new: never tried
            _SIZES,  # weight
            st.one_of(st.none(), st.just(math.nan), _SIZES),  # λ̂
            st.one_of(st.none(), st.just(math.nan), _SIZES),  # f
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(min_value=1, max_value=12),
)
def test_the_front_queue_of_every_page_of_arrays_is_the_frontiers_level_of_each(pages, levels):
    new, weight, rate, target = zip(*pages, strict=True)
    nan = [math.nan if v is None else v for v in (*rate, *target)]
    got = priority_levels(
        np.array(new), np.array(weight), np.array(nan[: len(pages)]), np.array(nan[len(pages) :]),
        levels,
    )  # fmt: skip
    assert got.dtype == np.intp
    for i, (is_new, w, r, f) in enumerate(pages):
        row = _page(weight=w, rate=r, target_rate=f, digest=None if is_new else b"copy")
        level = priority_level(row, NOW, levels)
        assert 0 <= level < levels
        assert got[i] == level, pages[i]


def test_a_page_without_an_estimate_or_a_plan_goes_first_and_one_with_no_value_last():
    assert priority_level(_page(rate=math.nan, target_rate=1.0, digest=b"c"), NOW, 8) == 0
    assert priority_level(_page(rate=0.1, target_rate=math.nan, digest=b"c"), NOW, 8) == 0
    assert priority_level(_page(rate=0.1, target_rate=0.0, digest=b"c"), NOW, 8) == 0
    assert priority_level(_page(rate=0.1, target_rate=1.0, weight=0.0, digest=b"c"), NOW, 8) == 7
    # an infinite weight or rate is surely worth a fetch, not a crash of the frontier
    heavy = _page(rate=0.1, target_rate=1.0, weight=math.inf, digest=b"c")
    assert priority_level(heavy, NOW, 8) == 0
    assert priority_level(replace(heavy, rate=math.inf, weight=1.0), NOW, 8) == 0


def test_a_page_without_a_copy_stays_first_once_a_solve_has_planned_it():
    # planned: a pooled prior rate, a target, a light weight; its level by them would be 7
    new = _page(target_rate=1.0, rate=0.001, weight=0.2)
    heavy = _page(target_rate=1.0, rate=0.001, weight=50.0, digest=b"copy")
    assert priority_level(new, NOW, 8) == 0
    assert priority_level(heavy, NOW, 8) > 0
    assert priority_level(replace(new, digest=b"copy"), NOW, 8) == 7


def test_a_page_whose_fetches_fail_is_ranked_by_its_plan_not_as_new():
    # no copy after its tries: ranked by its weight and rate as a page with a copy would be,
    # so pages never tried go before it
    failing = _page(target_rate=1.0, rate=0.001, weight=0.2, tried=True)
    assert failing.new is False
    assert priority_level(failing, NOW, 8) == priority_level(
        replace(failing, digest=b"copy"), NOW, 8
    )
    assert priority_level(failing, NOW, 8) > priority_level(replace(failing, tried=False), NOW, 8)


@pytest.mark.slow
async def test_a_daemon_moves_its_fetches_toward_the_optimal_allocation(
    nursery, short_dir, daemons
):
    # 24 pages on 4 hosts. The optimal split of the budget over these true rates grows with λ
    # (none for λ = 0); uniform would be flat. Rates stay within what fetches about twice a
    # second can estimate (a page that changes before every fetch only shows λ ≫ 1/interval).
    # Time runs at twice the pace of a budget of 20/s with the rates of 0.1-2 changes/s: the
    # same 540 requests, the same plan, in half the wait.
    pace = 2.0
    rates = [pace * r for r in (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)]
    hosts = [
        HostSpec(
            name=f"r{h}.sim.test",
            pages=tuple(PageSpec(path=f"/p{i}", change_rate=r) for i, r in enumerate(rates)),
            validators="none",
        )
        for h in range(4)
    ]
    site = Site(hosts)
    port = await nursery.start(serve_site, site)
    budget = 20.0 * pace
    config = daemon_config(
        short_dir,
        port=port,
        seeds=site.urls(),
        budget={"fetches_per_second": budget},
        policy={"name": "optimal", "resolve_interval": 2.0 / pace, "explore": 0.05},
        politeness={"min_delay": 0.05 / pace, "response_time_factor": 0.0},
    )
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: len(site.requests) >= 300, timeout=120, what="300 requests")
    mark = len(site.requests)
    await wait_for(lambda: len(site.requests) >= mark + 240, timeout=120, what="240 more")
    # the CLI in a thread: the site is served by this event loop, and must keep answering
    table = json.loads((await acli("policy", "--config", str(config), "--json")).stdout)
    switched = await acli("policy", "--config", str(config), "--uniform")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0

    late = list(site.requests)[mark:]
    counts = {f"http://{r.host}{r.path}": 0 for r in site.requests if r.path != "/robots.txt"}
    for r in late:
        if r.path != "/robots.txt":
            counts[f"http://{r.host}{r.path}"] += 1
    true_rate = {f"http://{h.name}{p.path}": p.change_rate for h in hosts for p in h.pages}
    urls = sorted(counts)
    optimal = policies.solve("optimal", [true_rate[u] for u in urls], budget).rates
    got = np.array([counts[u] for u in urls], dtype=float)
    # Spearman correlation of fetch counts with the optimal rates from the true λ
    rank = lambda a: np.argsort(np.argsort(a, kind="stable"), kind="stable")  # noqa: E731
    rho = np.corrcoef(rank(got), rank(optimal))[0, 1]
    assert rho > 0.6, (rho, got.tolist(), optimal.tolist())
    by_rate = {r / pace: sum(counts[u] for u in urls if true_rate[u] == r) for r in rates}
    assert by_rate[0.0] < by_rate[0.5] < by_rate[2.0], by_rate

    f = {name: row["freshness"] for name, row in table["policies"].items()}
    assert table["pages"] == 24 and f["optimal"] >= f["uniform"] >= f["proportional"]
    assert switched.returncode == 0 and "running daemon" in switched.stdout
    db = short_dir / "refresher.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    try:
        periods = [
            r[0]
            for r in con.execute("SELECT policy FROM policy_periods ORDER BY started_at").fetchall()
        ]
        estimated = dict(con.execute("SELECT url, rate FROM pages").fetchall())
    finally:
        con.close()
    assert periods[0] == "optimal" and periods[-1] == "uniform"
    # estimates order the classes as the truth does (slowest vs fastest)
    slow = np.mean([estimated[u] for u in urls if true_rate[u] == 0.1 * pace])
    fast = np.mean([estimated[u] for u in urls if true_rate[u] == 2.0 * pace])
    assert fast > 5 * slow
    # the switch holds across a restart while the config still says optimal; offline table
    offline = json.loads(cli("policy", "--config", str(config), "--json", "--budget", "2").stdout)
    assert offline["budget"] == 2 and set(offline["policies"]) == set(policies.available())


def test_last_modified_times_reveal_a_page_that_changes_before_every_fetch(tmp_path: Path):
    # Both pages changed before every one of 20 fetches a minute apart: without change times
    # they look alike. Honest Last-Modified values say one changed 2 s before each fetch
    # (λ ≈ 0.5/s) and the other 50 s before (λ ≈ 0.02/s).
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows = store.add_pages(
            [
                NewPage(url=f"http://h.example/{n}", host="h.example", scheme="http")
                for n in ("fast", "slow")
            ],
            now=NOW,
        )
        for row, since in zip(sorted(rows, key=lambda r: r.url), (2.0, 50.0), strict=True):
            records = [
                fetch_record(
                    row.id,
                    row.host_id,
                    t,
                    duration=0.1,
                    body_bytes=10,
                    digest=bytes([k % 256]),
                    changed=k > 0,
                    page_digest=bytes([k % 256]),
                    last_modified_at=t - since,
                )
                for k, t in enumerate(NOW + 60.0 * k for k in range(21))
            ]
            store.write(records, [])
        got = inputs_of(store, min_delay=1.0)
    finally:
        store.close()
    fast, slow = got.rates  # ids in insertion order: fast, slow
    assert fast > 0.2 and slow < 0.05 and fast > 10 * slow


def _three_pages(store: DuckDBStore) -> tuple[list[PageRow], list[int]]:
    """Three new pages of one host, and their ids in order."""
    rows = store.add_pages(
        [NewPage(url=f"http://a.example/{i}", host="a.example", scheme="http") for i in range(3)],
        now=NOW,
    )
    return rows, sorted(r.id for r in rows)


def test_a_plan_makes_pages_due_one_interval_after_their_last_fetch(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows, ids = _three_pages(store)
        _history(store, ids[0], rows[0].host_id, [NOW + 10], [False])
        _history(store, ids[2], rows[0].host_id, [NOW + 20], [False])
        got = inputs_of(store, min_delay=1.0)
        target = np.array([0.01, 0.5, 0.0])
        update = PlanUpdate(
            page_ids=got.page_ids,
            rates=got.rates,
            rate_n=got.rate_n,
            weights=got.weights,
            target=target,
        )
        store.save_plan(update, now=NOW + 60)
        due = dict(store._con.execute("SELECT id, due_at FROM pages").fetchall())
    finally:
        store.close()
    assert due[ids[0]] == pytest.approx(NOW + 10 + 100)  # last fetch + 1/f
    assert due[ids[1]] == NOW  # never fetched: stays due
    assert due[ids[2]] == pytest.approx(NOW + 20 + NEVER)  # no fetches planned: re-checked late
    # the store applies the one definition of a due time
    nan = np.full(3, np.nan)  # no plan before this one
    expected = next_due(got.last_fetch, target, due_at=np.full(3, NOW), planned=nan, now=NOW)
    assert [due[i] for i in got.page_ids] == pytest.approx(expected.tolist())


def test_a_plan_saved_in_slices_reaches_every_page(tmp_path: Path, monkeypatch):
    from refresher.store import _duckdb

    monkeypatch.setattr(_duckdb, "_PLAN_SLICE", 2)  # three pages: two slices
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        _three_pages(store)
        got = inputs_of(store, min_delay=1.0)
        target = np.array([0.1, 0.2, 0.3])
        update = PlanUpdate(
            page_ids=got.page_ids,
            rates=got.rates,
            rate_n=got.rate_n,
            weights=got.weights,
            target=target,
        )
        store.save_plan(update, now=NOW + 60)
        saved = dict(store._con.execute("SELECT id, target_rate FROM pages").fetchall())
    finally:
        store.close()
    assert [saved[i] for i in got.page_ids] == pytest.approx(target.tolist())


def test_on_the_default_simweb_an_optimal_plan_from_ten_fetches_a_page_beats_uniform() -> None:
    # The offline check behind analysis.compare's result: the pages and true rates of the
    # default simulated web, ten jittered fetches of each at the uniform interval, Last-Modified
    # change times from the hosts that send honest ones; the optimal split of λ̂ is then
    # scored with the TRUE rates. The gamma prior held the ~45 pages that change every second
    # or so near their hosts' rates, and optimal fetched them most; the log-normal one does not.
    web = plan_web(SimwebConfig(), start=0.0)
    rates_l, host_l = [], []
    for h, spec in enumerate(web.hosts):
        for page_spec in spec.pages:
            if page_spec.created_at is None:
                rates_l.append(page_spec.change_rate)
                host_l.append(h)
    rates, host = np.array(rates_l), np.array(host_l)
    honest = np.array([spec.validators == "honest" for spec in web.hosts])
    n, budget, fetches = rates.size, 10.0, 10
    rng = np.random.default_rng(5)
    t = rng.uniform(0.5, 1.5, (n, fetches)) * n / budget
    p_change = -np.expm1(-rates[:, None] * t)
    changed = rng.random(t.shape) < p_change
    with np.errstate(divide="ignore", invalid="ignore"):
        back = -np.log1p(-rng.random(t.shape) * p_change) / rates[:, None]
    since = np.where(changed, back, np.nan)
    scores = {}
    for model in ("log-normal", "gamma"):
        estimate = estimate_pages(
            np.repeat(np.arange(n), fetches),
            t.ravel(),
            changed.ravel(),
            n,
            page_host=host,
            n_hosts=len(web.hosts),
            since_change=since.ravel(),
            trusted_hosts=honest,
            model=model,
        )
        split = policies.solve("optimal", estimate.rate, budget).rates
        scores[model] = policies.mean_freshness(rates, split)
    uniform = policies.mean_freshness(rates, np.full(n, budget / n))
    best = policies.mean_freshness(rates, policies.solve("optimal", rates, budget).rates)
    assert scores["log-normal"] > uniform + 0.012  # measured +0.020 (true λ: +0.041)
    assert scores["log-normal"] > scores["gamma"] + 0.005  # measured +0.010
    assert scores["log-normal"] < best


class _Frontier:
    """Stands in for the frontier: the allocator only asks it to reload its window."""

    resets = 0

    def reset(self) -> None:
        self.resets += 1

    def set_budget(self, budget: float) -> None:
        pass


async def test_without_exploration_a_starved_page_is_due_alike_in_the_store_and_after_a_fetch(
    tmp_path: Path,
) -> None:
    # One page changes at every fetch, nine once in 30; at a tiny budget the optimal policy gives
    # the hopeless one nothing. Its due time saved with the plan and the one a worker sets
    # after fetching it (Allocator.interval) must agree: both come from due_interval.
    store = DuckDBStore(tmp_path / "s.duckdb")
    rows = store.add_pages(
        [
            NewPage(url=f"http://h{i}.example/", host=f"h{i}.example", scheme="http")
            for i in range(10)
        ],
        now=NOW,
    )
    rows.sort(key=lambda r: r.id)
    times = [NOW + 60.0 * k for k in range(30)]
    for i, row in enumerate(rows):
        _history(
            store, row.id, row.host_id, times, [(i == 0 and k > 0) or k == 15 for k in range(30)]
        )
    service = StoreService(store)
    frontier = _Frontier()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            allocator = Allocator(
                store=service,
                frontier=frontier,  # type: ignore[arg-type]
                budget=0.002,
                policy="optimal",
                explore=0.0,
                wall_clock=lambda: times[-1] + 1,
            )
            await allocator.solve()
            pages, _ = await service.load_due(
                after=(-math.inf, 0), until=math.inf, limit=100, known_hosts=frozenset()
            )
            service.close()
    finally:
        store.close()
    assert frontier.resets == 1
    starved = [p for p in pages if p.target_rate == 0]
    assert [p.id for p in starved] == [rows[0].id]
    for p in pages:
        assert p.due_at == pytest.approx(times[-1] + allocator.interval(p))
    assert allocator.interval(starved[0]) == NEVER


def test_after_a_fetch_a_page_is_due_one_interval_after_it_was_due_unless_it_had_no_copy():
    from refresher.refresh._allocate import Allocator

    allocator = Allocator(
        store=None,  # type: ignore[arg-type]
        frontier=_NoFrontier(),  # type: ignore[arg-type]
        budget=10.0,
        policy="optimal",
    )
    page = _page(digest=b"d", target_rate=0.1)
    assert allocator.due_after_fetch(page, NOW + 3) == NOW + 10  # 3 s late, made up
    assert allocator.due_after_fetch(page, NOW + 60) == NOW + 65  # far behind: half an interval
    # A page fetched for the first time has no schedule to keep: pages found together are due
    # at one time, and making up each one's wait would keep them bunched.
    first = dataclasses.replace(page, digest=None)
    assert allocator.due_after_fetch(first, NOW + 3) == NOW + 13
    # tried before with no copy to show for it (its fetches failed): it keeps its schedule
    failing = dataclasses.replace(first, tried=True)
    assert allocator.due_after_fetch(failing, NOW + 3) == NOW + 10
    # not planned yet: the uniform interval (pages / B; the allocator knows no page here)
    assert allocator.due_after_fetch(dataclasses.replace(page, target_rate=None), NOW) == NOW + 0.1


def test_gone_pages_leave_the_plan_until_they_answer_again(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows, ids = _three_pages(store)
        host = rows[0].host_id
        _history(store, ids[0], host, [NOW + 10, NOW + 20], [False, True])
        gone = fetch_record(ids[1], host, NOW + 5, status=404, page_status="gone")
        store.write([gone], [])
        assert ids[1] not in inputs_of(store, min_delay=1.0).page_ids.tolist()
        # its re-check a day later finds it again: back in the plan
        _history(store, ids[1], host, [NOW + 86_405], [False])
        assert ids[1] in inputs_of(store, min_delay=1.0).page_ids.tolist()
    finally:
        store.close()


def test_pages_robots_txt_denies_leave_the_plan(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows, ids = _three_pages(store)
        _history(store, ids[0], rows[0].host_id, [NOW + 10, NOW + 20], [False, True])
        denied = fetch_record(
            ids[1],
            rows[0].host_id,
            NOW + 5,
            status=None,
            error_kind="denied",
            page_status="denied",
            due_at=NOW + 3600,
        )
        store.write([denied], [])
        got = inputs_of(store, min_delay=1.0)
    finally:
        store.close()
    assert ids[1] not in got.page_ids.tolist()
    assert sorted(got.page_ids.tolist()) == [ids[0], ids[2]]
    assert got.rate_sd is not None and (got.rate_sd > 0).all()


class _NoFrontier:
    """The allocator tells the frontier its pace and to reload; the pace is kept."""

    rate: float | None = None

    def reset(self) -> None:
        pass

    def set_budget(self, budget: float) -> None:
        self.rate = budget


async def test_the_frontier_paces_at_the_plans_own_pace_or_else_the_whole_budget(
    tmp_path: Path, nursery
) -> None:
    from refresher.refresh._allocate import Allocator

    store = DuckDBStore(tmp_path / "r.duckdb")
    _three_pages(store)
    service = StoreService(store)
    await nursery.start(service.run)
    frontier = _NoFrontier()

    def fleet_part(inputs, policy, budget, *, explore, decide="plug-in", warm=None):  # type: ignore[no-untyped-def]
        return replace(plan(inputs, policy, budget / 4, explore=explore), pace=budget / 4)

    for planner, pace in ((plan, 10.0), (fleet_part, 2.5)):
        allocator = Allocator(
            store=service,
            frontier=frontier,  # type: ignore[arg-type]
            budget=10.0,
            policy="uniform",
            planner=planner,
        )
        await allocator.solve()
        assert frontier.rate == pace
    service.close()


async def test_each_plan_starts_from_the_last_one(tmp_path: Path, nursery) -> None:
    from refresher.refresh._allocate import Allocator

    store = DuckDBStore(tmp_path / "r.duckdb")
    _three_pages(store)
    service = StoreService(store)
    await nursery.start(service.run)
    seen, made = [], []

    def remembering(inputs, policy, budget, *, explore, decide="plug-in", warm=None):  # type: ignore[no-untyped-def]
        seen.append(warm)
        made.append(plan(inputs, policy, budget, explore=explore, decide=decide, warm=warm))
        return made[-1]

    allocator = Allocator(
        store=service,
        frontier=_NoFrontier(),  # type: ignore[arg-type]
        budget=10.0,
        policy="optimal",
        planner=remembering,
    )
    await allocator.solve()
    await allocator.solve()
    assert seen[0] is None
    assert seen[1] is made[0].warm and made[0].warm is not None
    assert made[0].warm.hosts is not None and made[0].warm.hosts.size == 1
    service.close()


def _hosted(theta, host_ids, caps, seed):
    """Inputs with posteriors over hosts known by their store ids (``host_ids`` per page)."""
    ids, index = np.unique(host_ids, return_inverse=True)
    rng = np.random.default_rng(seed)
    return dataclasses.replace(
        inputs(np.exp(theta), index, caps[ids]),
        rate_sd=rng.uniform(0.1, 1.5, theta.size),
        hosts=ids.astype(np.int64),
    )


@pytest.mark.parametrize("decide", ["plug-in", "expected"])
def test_a_plan_started_from_the_last_one_is_that_plan_when_hosts_come_and_go(
    decide: str,
) -> None:
    # the store's hosts 1000..1299, the 40 biggest capped; then a host gone, ten new ones
    # and half the pages' rates re-estimated: the carried levels follow the host ids
    rng = np.random.default_rng(4)
    n = 20_000
    theta = rng.normal(np.log(1 / 3600), 1.5, n)
    host_ids = 1000 + (300 * rng.random(n) ** 3).astype(np.int64)
    caps = np.where(np.arange(1400) < 1040, 0.01, np.inf)
    first = plan(_hosted(theta, host_ids, caps, 1), "optimal", 2.0, explore=0.05, decide=decide)
    assert first.warm is not None
    moved = rng.random(n) < 0.5
    theta2 = theta + np.where(moved, rng.normal(0.0, 0.2, n), 0.0)
    host2 = np.where(host_ids == 1001, 1310 + np.arange(n) % 10, host_ids)
    later = _hosted(theta2, host2, caps, 2)
    cold = plan(later, "optimal", 2.0, explore=0.05, decide=decide)
    warm = plan(later, "optimal", 2.0, explore=0.05, decide=decide, warm=first.warm)
    assert warm.allocation.multiplier == pytest.approx(cold.allocation.multiplier, rel=1e-7)
    # the same split to the solver's tolerance: a page near its drop-out on a capped host
    # moves most with its host's level (searched to 1e-6 in ln Σf)
    close = np.isclose(warm.target, cold.target, rtol=1e-6, atol=1e-12)
    assert close.mean() > 0.999
    np.testing.assert_allclose(warm.target, cold.target, rtol=1e-3)
    value = [policies.mean_freshness(later.rates, p.target) for p in (cold, warm)]
    assert value[1] == pytest.approx(value[0], rel=1e-9)
    assert warm.explored == cold.explored


def test_a_warm_start_carries_each_hosts_level_by_its_store_id() -> None:
    from refresher.refresh._allocate import WarmStart, carried

    levels = np.array([1.0, 5.0, 7.0])
    alloc = policies.Allocation(
        policy="optimal",
        rates=np.zeros(3),
        budget=1.0,
        unplaced=0.0,
        multiplier=1.0,
        host_multipliers=levels,
        capped_hosts=np.array([False, True, True]),
    )
    warm = WarmStart(allocation=alloc, hosts=np.array([10, 20, 30]))
    now = dataclasses.replace(inputs([1.0, 1.0, 1.0], [0, 1, 2]), hosts=np.array([5, 20, 30]))
    got = carried(warm, now, "optimal")
    assert got is not None and got.capped_hosts is not None
    assert got.multiplier == 1.0
    np.testing.assert_array_equal(got.host_multipliers, [np.nan, 5.0, 7.0])
    assert got.capped_hosts.tolist() == [False, True, True]
    assert carried(warm, now, "optimal-age") is None
    unknown = carried(warm, inputs([1.0]), "optimal")
    assert unknown is not None and unknown.host_multipliers is None


async def test_an_empty_store_is_reported_as_no_pages_not_as_unplaced_budget(
    tmp_path: Path, nursery
) -> None:
    import structlog

    from refresher.refresh._allocate import Allocator

    store = DuckDBStore(tmp_path / "r.duckdb")
    service = StoreService(store)
    await nursery.start(service.run)
    allocator = Allocator(
        store=service,
        frontier=_NoFrontier(),  # type: ignore[arg-type]
        budget=10.0,
        policy="optimal",
    )
    with structlog.testing.capture_logs() as logs:
        await allocator.solve()
    events = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert events == ["no pages to refresh yet; add seeds with `refresher seed URL`"]
    service.close()


@pytest.mark.parametrize("explore", [0.0, 0.05])
async def test_the_allocator_plans_a_host_at_what_its_responses_leave_room_for(
    tmp_path: Path, nursery, explore: float
) -> None:
    from refresher.refresh._allocate import RESPONSE_WINDOW, Allocator, InputSettings

    store = DuckDBStore(tmp_path / "r.duckdb")
    rows = store.add_pages(
        [NewPage(url=f"http://h.example/{i}", host="h.example", scheme="http") for i in range(4)],
        now=NOW,
    )
    for r in rows:  # 0.1 s responses, a fetch a minute per page
        _history(store, r.id, r.host_id, [NOW + 60 * k for k in range(3)], [False] * 3)
    service = StoreService(store)
    await nursery.start(service.run)
    stats = {}
    for late in (0.0, 10 * RESPONSE_WINDOW):  # at the fetches, and long after them
        allocator = Allocator(
            store=service,
            frontier=_NoFrontier(),  # type: ignore[arg-type]
            budget=10.0,
            policy="uniform",
            explore=explore,  # the exploration share is unplaced too where the caps bind
            inputs=InputSettings(min_delay=0.4, weights="none"),
            wall_clock=lambda late=late: NOW + 120 + late,
        )
        await allocator.solve()
        stats[late] = allocator.statistics()
    service.close()
    # one fetch per 0.4 s of delay and 0.1 s of response: 2/s of the 10, the rest unplaced
    assert stats[0.0].unplaced == pytest.approx(8.0)
    # no fetch in the last RESPONSE_WINDOW: the delay alone, 2.5/s
    assert stats[10 * RESPONSE_WINDOW].unplaced == pytest.approx(7.5)


def test_the_first_copys_last_modified_on_an_honest_host_counts_as_quiet_time(tmp_path: Path):
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        rows, ids = _three_pages(store)
        host = rows[0].host_id
        day = 86_400.0
        # page 0 shows the host's Last-Modified moving exactly with its content
        lm = [NOW - day, NOW - day, NOW + 15, NOW + 15]
        times = [NOW + 10, NOW + 11, NOW + 20, NOW + 30]
        store.write(
            [
                fetch_record(ids[0], host, t, changed=i == 2, last_modified_at=m)
                for i, (t, m) in enumerate(zip(times, lm, strict=True))
            ],
            [],
        )
        # pages 1 and 2 were fetched once, unchanged for a day before that fetch (page 1)
        store.write([fetch_record(ids[1], host, NOW + 12, last_modified_at=NOW - day)], [])
        store.write([fetch_record(ids[2], host, NOW + 13)], [])
        raw = store.estimator_inputs(meaningful=False, links=False)
        got = inputs_of(store, min_delay=1.0)
    finally:
        store.close()
    quiet = dict(zip(raw.page_ids.tolist(), raw.stats.first_quiet.tolist(), strict=True))
    assert quiet[ids[0]] == pytest.approx(day + 10)
    assert quiet[ids[1]] == pytest.approx(day + 12)
    assert math.isnan(quiet[ids[2]])
    rate = dict(zip(got.page_ids.tolist(), got.rates.tolist(), strict=True))
    assert rate[ids[1]] < rate[ids[2]] / 2  # a day without a change: slower


def test_the_policy_table_uses_the_allocators_definition_and_shows_weighted_freshness():
    from dataclasses import replace

    rng = np.random.default_rng(3)
    rates = np.geomspace(1e-4, 1e-1, 40)
    weighted = replace(
        inputs(rates, hosts=[i % 4 for i in range(40)], caps=[0.2, 0.2, 0.2, 0.2]),
        weights=rng.gamma(0.5, 2.0, 40),
        rate_sd=np.full(40, 0.8),
    )
    table = policy_table(weighted, 0.5, decide="expected")
    rows = table["policies"]
    for name in ("uniform", "optimal"):
        target = plan(weighted, name, 0.5, explore=0.0, decide="expected").target
        # scored as the allocator's statistics and the metrics score a plan: F̄ at λ̂
        assert rows[name]["freshness"] == pytest.approx(policies.mean_freshness(rates, target))
    # the optimal policy maximises weighted freshness: its weighted column beats uniform's
    assert rows["optimal"]["weighted"] >= rows["uniform"]["weighted"]
    assert rows["optimal"]["weighted"] != pytest.approx(rows["optimal"]["freshness"])
    assert table["decide"] == "expected" and "host politeness caps" in table["definition"]
    json.dumps(table, allow_nan=False)


def test_a_page_likely_never_to_change_reads_fresh_and_its_stored_rate_says_so():
    from dataclasses import replace

    rates = np.array([0.05, 0.05, 0.05, 0.05])
    given = replace(inputs(rates), static_p=np.array([0.0, 0.5, 0.99, 1.0]))
    target = np.array([0.02, 0.02, 0.02, 0.0])
    fresh = page_freshness(given, target)
    plain = policies.freshness(0.05, 0.02)
    assert fresh[0] == pytest.approx(plain)  # sure to change: F̄ at λ̂
    assert fresh[1] == pytest.approx(0.5 + 0.5 * plain)
    assert fresh[3] == 1.0  # sure to be static: always fresh, even never fetched
    # the stored rate turns into the same freshness (the views and the live line read it)
    stored = reported_rates(given, target)
    assert stored[0] == 0.05
    assert policies.freshness(stored[:3], target[:3]) == pytest.approx(fresh[:3], rel=1e-6)
    assert stored[1] < stored[0] and stored[2] < stored[1] and stored[3] == 0.0


def test_the_stored_rate_gives_the_pages_freshness_over_every_range_of_rate_and_chance():
    from dataclasses import replace

    rng = np.random.default_rng(3)
    n = 200_000
    rates = np.exp(rng.uniform(-30.0, 5.0, n))
    target = np.exp(rng.uniform(-25.0, 5.0, n))  # λ/f from 1e-15 to 1e15
    p0 = np.where(rng.random(n) < 0.1, 0.0, rng.uniform(0.0, 1.0, n) ** 3)
    given = replace(inputs(rates), static_p=p0)
    stored = reported_rates(given, target)
    fresh = page_freshness(given, target)
    np.testing.assert_allclose(policies.freshness(stored, target), fresh, rtol=1e-12)
    assert (stored <= rates * (1.0 + 1e-12)).all()  # a chance of never changing lowers it
    assert (stored[p0 == 0.0] == rates[p0 == 0.0]).all()


def test_a_chance_of_never_changing_below_what_a_double_resolves_leaves_the_rate_as_it_is():
    from dataclasses import replace

    rates = np.array([0.05, 3.0, 1e-6])
    target = np.array([0.02, 0.01, 0.5])
    given = replace(inputs(rates), static_p=np.array([1e-18, 1e-17, 1e-19]))
    np.testing.assert_allclose(reported_rates(given, target), rates, rtol=1e-13)


def test_a_first_copys_quiet_time_does_not_make_a_page_look_static():
    # 40 pages never change, 40 change every 5 s (fetched every 10 s, eight times); 20 more
    # were fetched once, their Last-Modified 3 s before: as likely from a changing page as a
    # static one, so they stay at the share of static pages
    rng = np.random.default_rng(3)
    page = np.repeat(np.arange(80), 8)
    t = np.full(page.size, 10.0)
    changed = (page >= 40) & (rng.random(page.size) < -np.expm1(-10.0 / 5.0))
    page = np.r_[page, np.arange(80, 100)]
    t = np.r_[t, np.full(20, 3.0)]
    changed = np.r_[changed, np.zeros(20, bool)]
    first = np.r_[np.zeros(640, bool), np.ones(20, bool)]
    est = estimate_pages(page, t, changed, 100, mixture=True, first_copy=first)
    _, p0 = uncertainty(est, page, t, changed, 2.0, first)
    _, counted = uncertainty(est, page, t, changed, 2.0)
    assert p0 is not None and counted is not None
    share = float(p0[:80].mean())
    assert share == pytest.approx(0.5, abs=0.05)
    assert p0[80:] == pytest.approx(share, abs=0.01)
    assert (counted[80:] > share + 0.1).all()  # 3 quiet seconds at a 5 s centre: "static"
