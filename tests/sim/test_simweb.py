"""The simulated web: change rates, rate mix, links, hosts, new pages, truth files, serving.

Statistical tests use fixed seeds and bounds of several standard deviations, so they pass or
fail the same way every run; each also shows the property failing where it should (a config
without the property). HTTP tests talk to real servers on 127.0.0.1 with an injected clock.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from datetime import datetime
from functools import partial
from pathlib import Path

import duckdb
import httpx
import numpy as np
import pytest
import trio
from lxml import etree
from scipy import stats

from refresher._errors import ConfigError
from refresher.sim._simweb import (
    DEFAULT_RATE_MIX,
    RateClass,
    SimwebConfig,
    SimwebPlan,
    _config_from,
    add_arguments,
    build_site,
    collect_truth,
    main,
    parse_rate_mix,
    plan_web,
    serve_simweb,
    summarize,
    write_truth,
)
from refresher.sim._site import HostSpec, Site

T0 = 1_700_000_000.0
DEADLINE = 30.0  # seconds; only reached when something hangs
SITEMAP_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"


class ManualClock:
    """A wall clock the test moves by hand (Unix seconds)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def small(**overrides: object) -> SimwebConfig:
    base: dict[str, object] = {"hosts": 4, "pages_per_host": 10, "new_pages_per_minute": 0.0}
    return SimwebConfig(**{**base, **overrides})  # type: ignore[arg-type]


def split(url: str) -> tuple[str, str]:
    rest = url.split("://", 1)[1]
    cut = rest.index("/")
    return rest[:cut], rest[cut:]


def pages(site: Site, at: float | None = None) -> list[tuple[str, str]]:
    return [split(url) for url in site.urls(at=at)]


def in_degrees(plan: SimwebPlan, *, skip_chain: bool = True) -> np.ndarray:
    """In-degree of every page at the start from the pages' random links (not the chain)."""
    degree: dict[str, int] = {}
    for host in plan.hosts:
        for page in host.pages:
            degree.setdefault(f"http://{host.name}{page.path}", 0)
            for link in page.links[1 if skip_chain else 0 :]:
                url = link if link.startswith("http://") else f"http://{host.name}{link}"
                degree[url] = degree.get(url, 0) + 1
    return np.array(sorted(degree.values(), reverse=True))


def hill(degrees: np.ndarray, top: int) -> float:
    """Hill's estimate of the tail exponent α in P(K > k) ~ k^(-α), from the top degrees."""
    ordered = np.sort(degrees)[::-1]
    return float(1 / np.mean(np.log(ordered[:top] / ordered[top])))


async def wait_for(predicate: object, what: str) -> None:
    assert callable(predicate)
    with trio.move_on_after(DEADLINE):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"not within {DEADLINE} s: {what}")


# ----------------------------------------------------------------------------- change rates


def test_change_counts_match_the_configured_rates_in_total_and_per_class() -> None:
    config = SimwebConfig(hosts=20, pages_per_host=50, new_pages_per_minute=0.0, seed=3)
    plan = plan_web(config, start=T0)
    site = build_site(config, start=T0, clock=ManualClock())
    horizon = 3600.0  # wall seconds: 150 simulated days at the default time scale
    expected: Counter[str] = Counter()
    counted: Counter[str] = Counter()
    chi2 = 0.0
    df = 0
    for host, path in pages(site):
        rate = site.change_rate(host, path)
        n = len(site.change_times(host, path, T0 + horizon))
        name = plan.classes[f"http://{host}{path}"]
        expected[name] += rate * horizon
        counted[name] += n
        if rate * horizon >= 20:
            chi2 += (n - rate * horizon) ** 2 / (rate * horizon)
            df += 1
    total_expected = sum(expected.values())
    total = sum(counted.values())
    assert abs(total - total_expected) < 4 * math.sqrt(total_expected)
    assert counted["never"] == 0
    for name in ("rare", "frequent"):
        assert expected[name] > 1000  # enough changes for the bound to mean something
        assert abs(counted[name] - expected[name]) < 4 * math.sqrt(expected[name]), name
    # Each page on its own: counts scatter around their rates as Poisson counts do.
    assert df > 300
    assert stats.chi2.sf(chi2, df) > 1e-4


def test_the_gaps_between_changes_are_exponential_at_each_pages_rate() -> None:
    config = small(seed=5)
    site = build_site(config, start=T0, clock=ManualClock())
    scaled: list[np.ndarray] = []
    for host, path in pages(site):
        rate = site.change_rate(host, path)
        if rate > 0:
            times = site.change_times(host, path, T0 + 200 / rate)
            scaled.append(np.diff(np.concatenate(([T0], times))) * rate)
    gaps = np.concatenate(scaled)
    assert len(gaps) > 5000
    assert stats.kstest(gaps, "expon").pvalue > 1e-3
    # The same gaps measured against twice the rate are not exponential with mean 1.
    assert stats.kstest(gaps * 2, "expon").pvalue < 1e-6


def test_the_rate_mix_has_its_shares_exactly_and_each_class_its_log_normal_rates() -> None:
    config = SimwebConfig(hosts=25, pages_per_host=40, new_pages_per_minute=0.0, seed=11)
    plan = plan_web(config, start=T0)
    site = build_site(config, start=T0, clock=ManualClock())
    by_class: dict[str, list[float]] = {c.name: [] for c in config.rate_mix}
    for host, path in pages(site):
        by_class[plan.classes[f"http://{host}{path}"]].append(site.change_rate(host, path))
    n = 25 * 40
    assert {k: len(v) for k, v in by_class.items()} == {
        c.name: round(c.share * n) for c in config.rate_mix
    }
    assert set(by_class["never"]) == {0.0}
    for c in config.rate_mix[1:]:
        logs = np.log(by_class[c.name])
        wall_median = config.wall_rate(c.median)
        assert stats.kstest(logs, "norm", args=(math.log(wall_median), c.sigma)).pvalue > 1e-3
        # Rates given per simulated day, compressed: a wall median off by the scale fails.
        wrong = (math.log(c.median / 86400), c.sigma)
        assert stats.kstest(logs, "norm", args=wrong).pvalue < 1e-6


def test_the_rate_mix_is_heavy_tailed() -> None:
    site = build_site(SimwebConfig(new_pages_per_minute=0.0), start=T0, clock=ManualClock())
    rates = np.sort([site.change_rate(h, p) for h, p in pages(site)])[::-1]
    changing = rates[rates > 0]
    # The busiest tenth of the pages make most of the changes; the median page is slow.
    assert rates[: len(rates) // 10].sum() > 0.6 * rates.sum()
    assert np.quantile(changing, 0.99) > 100 * np.median(changing)


def test_time_compression_scales_every_rate() -> None:
    slow = plan_web(small(time_scale=60.0), start=T0)
    fast = plan_web(small(time_scale=6000.0), start=T0)
    for a, b in zip(slow.hosts, fast.hosts, strict=True):
        for p, q in zip(a.pages, b.pages, strict=True):
            assert q.change_rate == pytest.approx(100 * p.change_rate, rel=1e-12)


def test_rates_can_be_given_per_minute() -> None:
    mix = (RateClass(name="steady", share=1.0, median=2.0),)
    site = build_site(
        small(rate_mix=mix, rate_unit=60.0, time_scale=1.0), start=T0, clock=ManualClock()
    )
    rates = [site.change_rate(h, p) for h, p in pages(site)]
    assert rates == pytest.approx([2 / 60] * 40)


# ----------------------------------------------------------------------------- determinism


def test_the_same_seed_gives_the_same_web_and_another_seed_another() -> None:
    config = small(seed=7, new_pages_per_minute=30.0, new_pages_horizon=600.0)
    a, b = plan_web(config, start=T0), plan_web(config, start=T0)
    assert a == b
    other = plan_web(small(seed=8, new_pages_per_minute=30.0, new_pages_horizon=600.0), start=T0)
    assert other.hosts != a.hosts
    first = build_site(config, start=T0, clock=ManualClock())
    second = build_site(config, start=T0, clock=ManualClock())
    # Asked in another order, the change times are the same.
    forward = {hp: first.change_times(*hp, T0 + 5000) for hp in pages(first)}
    backward = {hp: second.change_times(*hp, T0 + 5000) for hp in reversed(pages(second))}
    assert forward.keys() == backward.keys()
    for hp, times in forward.items():
        np.testing.assert_array_equal(times, backward[hp])


def test_changing_the_new_page_rate_keeps_the_initial_web() -> None:
    a = plan_web(small(new_pages_per_minute=0.0), start=T0)
    b = plan_web(small(new_pages_per_minute=60.0, new_pages_horizon=300.0), start=T0)
    for x, y in zip(a.hosts, b.hosts, strict=True):
        initial = [p for p in y.pages if p.created_at is None]
        assert [(p.path, p.change_rate, p.links) for p in x.pages] == [
            (p.path, p.change_rate, p.links) for p in initial
        ]


# ----------------------------------------------------------------------------- links


def test_in_degree_tail_follows_the_popularity_exponent() -> None:
    def tail(exponent: float) -> float:
        config = SimwebConfig(
            hosts=10, pages_per_host=200, new_pages_per_minute=0.0, popularity_exponent=exponent
        )
        return hill(in_degrees(plan_web(config, start=T0)), top=100)

    heavy = tail(1.1)
    assert 0.9 < heavy < 1.8
    assert 2.4 < tail(3.0) < 4.2
    assert tail(50.0) > 8  # nearly uniform popularity: no heavy tail


def test_in_degree_is_concentrated_on_few_pages() -> None:
    degrees = in_degrees(plan_web(SimwebConfig(new_pages_per_minute=0.0), start=T0))
    assert degrees[: len(degrees) // 100].sum() > 0.08 * degrees.sum()
    assert degrees.max() > 15 * np.median(degrees)
    flat = SimwebConfig(new_pages_per_minute=0.0, popularity_exponent=50.0)
    even = in_degrees(plan_web(flat, start=T0))
    assert even[: len(even) // 100].sum() < 0.04 * even.sum()


@pytest.mark.parametrize("locality", [0.2, 0.8])
def test_the_share_of_links_on_the_own_host_is_as_configured(locality: float) -> None:
    plan = plan_web(
        SimwebConfig(hosts=20, pages_per_host=50, new_pages_per_minute=0.0, locality=locality),
        start=T0,
    )
    random_links = [link for h in plan.hosts for p in h.pages for link in p.links[1:]]
    local = sum(not link.startswith("http://") for link in random_links)
    n = len(random_links)
    assert n == 20 * 50 * 7
    assert abs(local - locality * n) < 4 * math.sqrt(n * locality * (1 - locality))


def test_every_page_is_reachable_from_its_hosts_root() -> None:
    plan = plan_web(small(), start=T0)
    for host in plan.hosts:
        local = {p.path: [x for x in p.links if x.startswith("/")] for p in host.pages}
        seen, todo = {"/"}, ["/"]
        while todo:
            for link in local[todo.pop()]:
                if link not in seen:
                    seen.add(link)
                    todo.append(link)
        assert seen == set(local)


# ----------------------------------------------------------------------------- hosts


def test_host_features_come_in_exact_shares() -> None:
    config = SimwebConfig(
        hosts=20,
        pages_per_host=10,
        new_pages_per_minute=0.0,
        robots_rules_share=0.25,
        no_robots_share=0.15,
        crawl_delay_share=0.3,
        crawl_delay=2.5,
        validators_none_share=0.2,
        validators_wrong_share=0.35,
        sitemap_share=0.4,
        gzip_share=0.55,
    )
    plan = plan_web(config, start=T0)
    summary = summarize(plan)
    assert summary.robots_rules_hosts == 5
    assert summary.no_robots_hosts == 3
    assert summary.crawl_delay_hosts == 6
    assert summary.validators == {"honest": 9, "none": 4, "wrong": 7}
    assert summary.sitemap_hosts == 8
    assert sum(h.gzip for h in plan.hosts) == 11
    for host in plan.hosts:
        if host.robots and "Crawl-delay" in host.robots:
            assert "Crawl-delay: 2.5\n" in host.robots
        private = [p.path for p in host.pages if p.path.startswith("/private/")]
        if host.robots and "Disallow: /private/" in host.robots:
            continue
        assert private == []
    assert any(p.path.startswith("/private/") for h in plan.hosts for p in h.pages), (
        "hosts with robots rules keep some pages under /private/"
    )


def test_a_summary_tells_the_demo_is_meaningful_in_minutes() -> None:
    summary = summarize(plan_web(SimwebConfig(), start=T0))
    assert (summary.hosts, summary.pages) == (10, 300)
    assert 60 < summary.median_change_interval < 600  # wall seconds
    assert summary.class_pages == {"never": 30, "rare": 225, "frequent": 45}


# ----------------------------------------------------------------------------- new pages


def test_new_pages_appear_at_the_configured_rate() -> None:
    config = small(new_pages_per_minute=120.0, new_pages_horizon=1800.0)
    plan = plan_web(config, start=T0)
    created = np.sort(
        [p.created_at for h in plan.hosts for p in h.pages if p.created_at is not None]
    )
    expected = 120.0 / 60 * 1800
    assert abs(len(created) - expected) < 4 * math.sqrt(expected)
    assert created[0] > T0
    assert created[-1] <= T0 + 1800
    gaps = np.diff(np.concatenate(([T0], created))) * (120.0 / 60)
    assert stats.kstest(gaps, "expon").pvalue > 1e-3
    # New pages take the rate mix too.
    names = Counter(plan.classes[u] for u in plan.classes if "/n" in u)
    assert abs(names["rare"] / sum(names.values()) - 0.75) < 0.05


def test_a_new_page_is_listed_at_once_and_linked_after_its_parents_next_change() -> None:
    config = small(new_pages_per_minute=6.0, new_pages_horizon=600.0, sitemap_share=1.0, seed=2)
    clock = ManualClock()
    site = build_site(config, start=T0, clock=clock)
    checked = 0
    for spec in site.hosts:
        for page in spec.pages:
            if page.created_at is None:
                continue
            created = page.created_at
            url = f"http://{spec.name}{page.path}"
            assert url not in site.urls(at=created - 1e-3)
            assert url in site.urls(at=created)
            assert f"<loc>{url}</loc>" not in site.sitemap(spec.name, created - 1e-3).decode()
            assert f"<loc>{url}</loc>" in site.sitemap(spec.name, created).decode()
            assert site.created_at(spec.name, page.path) == created
            parents = [p for p in spec.pages if page.path in dict(map(reversed, p.later_links))]
            assert 1 <= len(parents) <= config.new_page_parents
            for parent in parents:
                times = site.change_times(spec.name, parent.path, created + 1e6)
                after = times[times >= created]
                assert len(after), "parents are pages that change"
                href = f'href="{page.path}"'
                assert href not in site.body(spec.name, parent.path, after[0] - 1e-6).decode()
                assert href in site.body(spec.name, parent.path, after[0]).decode()
                checked += 1
    assert checked > 50


# ----------------------------------------------------------------------------- truth files


def check_truth_tables(con: duckdb.DuckDBPyConnection, site: Site, until: float) -> None:
    schema = {
        table: con.execute(f"DESCRIBE {table}").fetchall()
        for table in ("truth_pages", "truth_changes")
    }
    assert [(c[0], c[1]) for c in schema["truth_pages"]] == [
        ("url", "VARCHAR"),
        ("host", "VARCHAR"),
        ("rate", "DOUBLE"),
        ("created_at", "DOUBLE"),
    ]
    assert [(c[0], c[1]) for c in schema["truth_changes"]] == [
        ("url", "VARCHAR"),
        ("changed_at", "DOUBLE"),
    ]
    rows = con.execute("SELECT url, host, rate, created_at FROM truth_pages").fetchall()
    assert sorted(r[0] for r in rows) == sorted(site.urls(at=until))
    for url, host, rate, created_at in rows:
        assert url == url.lower() and ":80" not in url
        assert (host, rate, created_at) == (
            split(url)[0],
            site.change_rate(*split(url)),
            site.created_at(*split(url)),
        )
    changes = con.execute("SELECT url, changed_at FROM truth_changes").fetchnumpy()
    total = 0
    for url in site.urls(at=until):
        mine = np.sort(changes["changed_at"][changes["url"] == url])
        np.testing.assert_array_equal(mine, site.change_times(*split(url), until))
        total += len(mine)
    assert total == len(changes["url"]) > 100


def test_the_duckdb_truth_has_the_exact_schema_and_the_sites_change_times(
    tmp_path: Path,
) -> None:
    config = small(new_pages_per_minute=20.0, new_pages_horizon=600.0)
    site = build_site(config, start=T0, clock=ManualClock())
    path = tmp_path / "var" / "truth.duckdb"
    until = T0 + 300
    truth = write_truth(site, path, until=until)
    assert 40 < len(truth.urls) < len(site.urls())  # some new pages are still to come
    with duckdb.connect(str(path), read_only=True) as con:
        tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
        assert tables == {"truth_pages", "truth_changes"}
        check_truth_tables(con, site, until)
    # Written again later, the file is replaced whole and nothing is left beside it.
    write_truth(site, path, until=until + 300)
    with duckdb.connect(str(path), read_only=True) as con:
        check_truth_tables(con, site, until + 300)
    assert sorted(os.listdir(path.parent)) == ["truth.duckdb"]


def test_the_parquet_truth_has_the_same_tables(tmp_path: Path) -> None:
    site = build_site(small(), start=T0, clock=ManualClock())
    write_truth(site, tmp_path / "truth", until=T0 + 600)
    assert sorted(os.listdir(tmp_path / "truth")) == [
        "truth_changes.parquet",
        "truth_pages.parquet",
    ]
    with duckdb.connect() as con:
        for table in ("truth_pages", "truth_changes"):
            source = tmp_path / "truth" / f"{table}.parquet"
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{source}')")
        check_truth_tables(con, site, T0 + 600)


def test_a_truth_path_of_unknown_kind_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.duckdb"):
        SimwebConfig(truth_path=str(tmp_path / "truth.csv"))
    SimwebConfig(truth_path=str(tmp_path / "truth.csv"), truth_format="parquet")


# ----------------------------------------------------------------------------- serving


@pytest.fixture
def served_config(tmp_path: Path) -> SimwebConfig:
    return small(
        new_pages_per_minute=12.0,
        new_pages_horizon=600.0,
        sitemap_share=0.5,
        no_robots_share=0.0,
        truth_path=str(tmp_path / "truth.duckdb"),
        truth_interval=0.05,
    )


async def test_hosts_robots_and_sitemaps_are_served_over_loopback(
    served_config: SimwebConfig, nursery: trio.Nursery
) -> None:
    clock = ManualClock()
    site = build_site(served_config, start=T0, clock=clock)
    port = await nursery.start(partial(serve_simweb, served_config, site=site))
    clock.now = T0 + 120
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE) as http:
        with_map = [h for h in site.hosts if h.sitemap]
        without = [h for h in site.hosts if not h.sitemap]
        assert len(with_map) == len(without) == 2
        for spec in site.hosts:
            home = await http.get("/", headers={"Host": spec.name})
            assert home.status_code == 200
            assert f"<title>{spec.name}/</title>" in home.text
            robots = await http.get("/robots.txt", headers={"Host": spec.name})
            line = f"Sitemap: http://{spec.name}/sitemap.xml"
            assert (line in robots.text.splitlines()) == spec.sitemap
            sitemap = await http.get("/sitemap.xml", headers={"Host": spec.name})
            assert sitemap.status_code == (200 if spec.sitemap else 404)
        spec = with_map[0]
        sitemap = await http.get("/sitemap.xml", headers={"Host": f"{spec.name.upper()}:{port}"})
        assert sitemap.headers["content-type"].startswith("application/xml")
        root = etree.fromstring(sitemap.content)
        listed = {
            u.findtext(f"{SITEMAP_NS}loc"): u.findtext(f"{SITEMAP_NS}lastmod")
            for u in root.iter(f"{SITEMAP_NS}url")
        }
        assert sorted(listed) == sorted(u for u in site.urls(at=clock.now) if spec.name in u)
        for url, lastmod in listed.items():
            host, path = split(url)
            times = site.change_times(host, path, clock.now)
            last = times[-1] if len(times) else site.created_at(host, path)
            assert lastmod is not None and lastmod.endswith("Z")
            moment = datetime.fromisoformat(lastmod).timestamp()
            assert last - 0.001 < moment <= last
        # A page that appears later answers 404 until it exists, then 200.
        new = next(p for p in spec.pages if p.created_at is not None and p.created_at > clock.now)
        assert new.created_at is not None
        clock.now = new.created_at - 0.01
        assert (await http.get(new.path, headers={"Host": spec.name})).status_code == 404
        clock.now = new.created_at
        assert (await http.get(new.path, headers={"Host": spec.name})).status_code == 200
        map_now = await http.get("/sitemap.xml", headers={"Host": spec.name})
        assert f"<loc>http://{spec.name}{new.path}</loc>" in map_now.text
    assert site.statistics().handler_errors == 0


async def test_the_sitemap_line_carries_the_bound_port_when_links_do(
    served_config: SimwebConfig, nursery: trio.Nursery
) -> None:
    site = build_site(served_config, start=T0, clock=ManualClock(), link_port="bound")
    port = await nursery.start(partial(serve_simweb, served_config, site=site))
    spec = next(h for h in site.hosts if h.sitemap)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE) as http:
        robots = await http.get("/robots.txt", headers={"Host": spec.name})
        assert f"Sitemap: http://{spec.name}:{port}/sitemap.xml" in robots.text
        sitemap = await http.get("/sitemap.xml", headers={"Host": spec.name})
        assert f"<loc>http://{spec.name}:{port}/</loc>" in sitemap.text


async def test_the_truth_is_rewritten_while_serving_and_on_exit(
    served_config: SimwebConfig,
) -> None:
    assert served_config.truth_path is not None
    path = Path(served_config.truth_path)
    clock = ManualClock()
    site = build_site(served_config, start=T0, clock=clock)

    def changes_in_file() -> int | None:
        if not path.exists():
            return None
        with duckdb.connect(str(path), read_only=True) as con:
            row = con.execute("SELECT count(*) FROM truth_changes").fetchone()
        return None if row is None else int(row[0])

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_simweb, served_config, site=site))
        await wait_for(lambda: changes_in_file() == 0, "the truth at the start")
        clock.now = T0 + 60
        expected = len(collect_truth(site, until=clock.now).changed_at)
        assert expected > 10
        await wait_for(lambda: changes_in_file() == expected, "the truth a minute on")
        clock.now = T0 + 600
        nursery.cancel_scope.cancel()
    with duckdb.connect(str(path), read_only=True) as con:
        check_truth_tables(con, site, T0 + 600)


# ----------------------------------------------------------------------------- configuration


def test_a_rate_mix_is_read_from_text() -> None:
    assert parse_rate_mix("never:0.1,rare:0.75:0.1:1.5,frequent:0.15:24:1") == DEFAULT_RATE_MIX
    assert parse_rate_mix("all:1:3") == (RateClass(name="all", share=1.0, median=3.0),)
    with pytest.raises(ConfigError, match="name:share"):
        parse_rate_mix("rare=0.5")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"hosts": 0}, "simweb.hosts"),
        ({"rate_mix": (RateClass(name="a", share=0.5),)}, "simweb.rate_mix"),
        ({"time_scale": 0.0}, "simweb.time_scale"),
        ({"locality": 1.5}, "simweb.locality"),
        ({"robots_rules_share": 0.7, "no_robots_share": 0.5}, "simweb.no_robots_share"),
        ({"new_pages_per_minute": 1e6}, "simweb.new_pages_horizon"),
        ({"sitemap_lastmod": "often"}, "simweb.sitemap_lastmod"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SimwebConfig(**overrides)  # type: ignore[arg-type]
    assert caught.value.key == key


def test_every_sitemap_host_writes_the_configured_kind_of_lastmod() -> None:
    args = argparse.ArgumentParser()
    add_arguments(args)
    config = _config_from(args.parse_args(["--sitemap-lastmod", "now", "--sitemap-share", "1"]))
    assert config.sitemap_lastmod == "now"
    hosts = plan_web(replace(config, hosts=3), start=T0).hosts
    assert all(h.sitemap and h.sitemap_lastmod == "now" for h in hosts)
    assert _config_from(args.parse_args([])).sitemap_lastmod == "honest"


def test_the_command_line_describes_the_web(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--describe", "--hosts", "3", "--pages", "7"]) == 0
    out = capsys.readouterr().out
    assert '"pages": 21' in out and '"hosts": 3' in out
    assert main(["--describe", "--mix", "nope"]) == 2
    assert "name:share" in capsys.readouterr().err


async def test_the_command_line_serves_until_a_signal_and_writes_the_truth(
    tmp_path: Path,
) -> None:
    port_file = tmp_path / "port"
    truth = tmp_path / "truth.duckdb"
    args = ["--port", "0", "--port-file", str(port_file), "--hosts", "3", "--pages", "5"]
    args += ["--truth", str(truth), "--truth-interval", "60", "--seed", "4"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "refresher.sim._simweb", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: port_file.exists() or proc.poll() is not None, "the port file")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        port = int(port_file.read_text())
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            robots = await http.get(
                f"http://127.0.0.1:{port}/robots.txt", headers={"Host": "h0.sim.test"}
            )
        assert robots.status_code in (200, 404)
        proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: proc.poll() is not None, "exit after SIGTERM")
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    with duckdb.connect(str(truth), read_only=True) as con:
        row = con.execute("SELECT count(*), count(DISTINCT host) FROM truth_pages").fetchone()
    assert row == (15, 3)


def test_a_site_of_host_specs_is_what_the_plan_gives() -> None:
    plan = plan_web(small(), start=T0)
    site = build_site(small(), start=T0, clock=ManualClock())
    assert site.hosts == plan.hosts
    assert all(isinstance(h, HostSpec) for h in plan.hosts)
