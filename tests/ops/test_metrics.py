"""The /metrics endpoint: a real server on 127.0.0.1, scraped with httpx, parsed by prometheus."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from refresher._errors import ConfigError
from refresher.crawl._fetch import FetcherStatistics
from refresher.crawl._frontier import FrontierStatistics
from refresher.crawl._workers import CrawlerStatistics
from refresher.discover._discovery import DiscoveryStatistics
from refresher.discover._threads import ParsersStatistics
from refresher.fleet import FleetBudgetStatistics
from refresher.fleet._node import FleetNodeStatistics
from refresher.ops._metrics import METRICS, MetricsServer
from refresher.ops._notify import NotifierStatistics
from refresher.refresh._allocate import AllocatorStatistics
from refresher.store import StoreStatistics


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Cache:
    hits: int = 0
    hit_rate: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Odd:
    """A component the metrics module has no table entry for."""

    lookups: int = dataclasses.field(default=0, metadata={"metric": "counter"})
    hit_rate: float = 0.0
    name: str = "clock"
    ready: bool = True
    estimate: float = float("nan")
    cache: Cache = dataclasses.field(default_factory=Cache)


def crawler(**kw: Any) -> CrawlerStatistics:
    base: dict[str, Any] = dict(
        workers=8,
        busy=3,
        fetches=120,
        changed=7,
        not_modified=40,
        errors=2,
        denied=5,
        robots_fetches=3,
        bytes=123_456,
        meaningful=4,
        duplicates=1,
    )
    return CrawlerStatistics(**{**base, **kw})


def fetcher() -> FetcherStatistics:
    return FetcherStatistics(
        fetches=122,
        robots_fetches=3,
        requests=130,
        outcomes={"ok": 80, "not_modified": 40, "timeout": 2},
        bytes=200_000,
        open_hosts=3,
        evictions=0,
    )


def frontier() -> FrontierStatistics:
    return FrontierStatistics(
        in_memory=15,
        waiting=9,
        front=(4, 1, 0),
        back=2,
        active_hosts=3,
        ready_hosts=2,
        leased=1,
        hosts_known=3,
        dispatched=118,
        cursor=1_700_000_000.5,
    )


def allocator() -> AllocatorStatistics:
    return AllocatorStatistics(
        policy="uniform",
        budget=40.0,
        pages=15,
        uniform_interval=float("inf"),
        solves=4,
        last_solve_seconds=0.0125,
        unplaced=0.5,
        explored=2,
        expected_freshness=0.75,
        expected_age=12.5,
    )


def store() -> StoreStatistics:
    return StoreStatistics(
        pages=15,
        hosts=3,
        fetches=500,
        acknowledged=118,
        batches=30,
        queued=2,
        last_batch_seconds=0.004,
    )


def notifier() -> NotifierStatistics:
    return NotifierStatistics(
        enabled=True, datagrams_sent=9, send_failures=0, watchdog_pings=6, watchdog_withheld=0
    )


class Sources:
    """Fake components whose snapshots a test may change between scrapes."""

    def __init__(self) -> None:
        self.crawler = crawler()
        self.odd: Odd | None = None

    def mapping(self) -> dict[str, Callable[[], object]]:
        return {
            "crawler": lambda: self.crawler,
            "frontier": frontier,
            "store": store,
            "fetcher": fetcher,
            "allocator": allocator,
            "notifier": notifier,
            "odd": lambda: self.odd,
        }


async def start(nursery: trio.Nursery, sources: Mapping[str, Callable[[], object]]) -> int:
    server = MetricsServer(port=0, sources=sources)
    port: int = await nursery.start(server.run)
    return port


async def scrape(port: int, path: str = "/metrics") -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for f in text_string_to_metric_families(text):
        s: Sample
        for s in f.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def sources() -> Sources:
    return Sources()


async def test_a_scrape_turns_every_snapshot_into_typed_prometheus_metrics(nursery, sources):
    port = await start(nursery, sources.mapping())
    r = await scrape(port)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    fam = families(r.text)
    values = samples(r.text)

    assert fam["refresher_crawler_fetches"].type == "counter"
    assert values["refresher_crawler_fetches_total", ()] == 120
    assert fam["refresher_crawler_busy"].type == "gauge"
    assert values["refresher_crawler_busy", ()] == 3
    assert values["refresher_crawler_denied_total", ()] == 5
    assert values["refresher_crawler_bytes_total", ()] == 123_456

    assert fam["refresher_fetches"].type == "counter"
    assert values["refresher_fetches_total", (("outcome", "timeout"),)] == 2
    assert values["refresher_fetches_total", (("outcome", "ok"),)] == 80
    assert values["refresher_fetcher_fetches_total", ()] == 122

    assert fam["refresher_frontier_front"].type == "gauge"
    assert [values["refresher_frontier_front", (("queue", q),)] for q in "012"] == [4, 1, 0]
    assert values["refresher_frontier_in_memory", ()] == 15
    assert values["refresher_frontier_dispatched_total", ()] == 118

    assert values["refresher_store_acknowledged_total", ()] == 118
    assert values["refresher_store_queued", ()] == 2
    assert values["refresher_allocator_last_solve_seconds", ()] == 0.0125
    assert values["refresher_allocator_solves_total", ()] == 4
    assert values["refresher_notifier_enabled", ()] == 1
    assert "process_resident_memory_bytes" in fam


async def test_strings_and_non_finite_numbers_are_left_out(nursery, sources):
    port = await start(nursery, sources.mapping())
    fam = families((await scrape(port)).text)
    # policy is a string; uniform_interval is +inf (no pages)
    assert not [n for n in fam if n.startswith("refresher_allocator_policy")]
    assert "refresher_allocator_uniform_interval" not in fam
    assert "refresher_allocator_budget" in fam


async def test_values_are_read_at_scrape_time(nursery, sources):
    port = await start(nursery, sources.mapping())
    assert samples((await scrape(port)).text)["refresher_crawler_fetches_total", ()] == 120
    sources.crawler = crawler(fetches=121, busy=0)
    values = samples((await scrape(port)).text)
    assert values["refresher_crawler_fetches_total", ()] == 121
    assert values["refresher_crawler_busy", ()] == 0


async def test_a_component_appears_once_it_exists_with_counters_from_field_metadata(
    nursery, sources
):
    port = await start(nursery, sources.mapping())
    assert not [n for n in families((await scrape(port)).text) if n.startswith("refresher_odd")]

    sources.odd = Odd(lookups=1000, hit_rate=0.8, cache=Cache(hits=7, hit_rate=0.5))
    fam = families((await scrape(port)).text)
    assert fam["refresher_odd_lookups"].type == "counter"
    assert fam["refresher_odd_hit_rate"].type == "gauge"
    assert fam["refresher_odd_hit_rate"].samples[0].value == 0.8
    assert fam["refresher_odd_ready"].samples[0].value == 1
    assert fam["refresher_odd_cache_hits"].samples[0].value == 7
    assert fam["refresher_odd_cache_hit_rate"].samples[0].value == 0.5
    assert "refresher_odd_name" not in fam
    assert "refresher_odd_estimate" not in fam


async def test_a_nested_snapshot_takes_its_specs_by_dotted_key(nursery):
    port = await start(nursery, {"seen": lambda: Odd(cache=Cache(hits=3, hit_rate=0.75))})
    fam = families((await scrape(port)).text)
    assert fam["refresher_seen_cache_hits"].type == "counter"
    assert fam["refresher_seen_cache_hits"].samples[0].value == 3
    assert fam["refresher_seen_cache_hit_rate"].type == "gauge"


async def test_a_failing_source_is_left_out_and_the_rest_is_served(nursery, sources):
    def broken() -> object:
        raise RuntimeError("boom")

    server = MetricsServer(port=0, sources={**sources.mapping(), "broken": broken, "odd": dict})
    port = await nursery.start(server.run)
    r = await scrape(port)
    assert r.status_code == 200
    fam = families(r.text)
    assert "refresher_crawler_fetches" in fam
    assert not [n for n in fam if n.startswith(("refresher_broken", "refresher_odd"))]
    stats = server.statistics()
    assert stats.source_errors == 1 and stats.scrapes == 1 and stats.port == port


async def test_the_fleet_budgets_solves_are_counted_by_reason(nursery):
    stats = FleetBudgetStatistics(
        coordinator=True,
        epoch=3,
        policy="optimal",
        mu=0.25,
        unplaced=0.0,
        rounds=5,
        solves=3,
        solve_reasons={"start": 1, "learned": 2},
        fetched_since_solve=40,
        replan_fetches=float("inf"),  # policy.replan_share = 0: left out
        nodes=2,
        node_budget=1.5,
        errors=0,
    )
    port = await start(nursery, {"fleet_budget": lambda: stats})
    fam = families((await scrape(port)).text)
    values = samples((await scrape(port)).text)
    assert fam["refresher_fleet_budget_solves_by_reason"].type == "counter"
    assert values["refresher_fleet_budget_solves_by_reason_total", (("reason", "learned"),)] == 2
    assert values["refresher_fleet_budget_solves_total", ()] == 3
    assert values["refresher_fleet_budget_fetched_since_solve", ()] == 40
    assert "refresher_fleet_budget_replan_fetches" not in fam


def test_every_field_of_the_known_snapshots_has_a_spec_and_every_spec_a_field():
    for component, cls in (
        ("crawler", CrawlerStatistics),
        ("frontier", FrontierStatistics),
        ("store", StoreStatistics),
        ("fetcher", FetcherStatistics),
        ("allocator", AllocatorStatistics),
        ("notifier", NotifierStatistics),
        ("discovery", DiscoveryStatistics),
        ("fleet", FleetNodeStatistics),
        ("fleet_budget", FleetBudgetStatistics),
        ("parse", ParsersStatistics),
    ):
        names = {f.name for f in dataclasses.fields(cls)} - {"policy"}
        assert set(METRICS[component]) == names, component


async def test_other_paths_are_404_other_methods_405_and_head_has_no_body(nursery, sources):
    port = await start(nursery, sources.mapping())
    assert (await scrape(port, "/")).status_code == 404
    assert (await scrape(port, "/metrics/x")).status_code == 404
    assert (await scrape(port, "/metrics?name[]=x")).status_code == 200
    async with httpx.AsyncClient() as client:
        post = await client.post(f"http://127.0.0.1:{port}/metrics", content=b"x")
        head = await client.head(f"http://127.0.0.1:{port}/metrics")
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) > 0


async def test_one_connection_serves_several_scrapes_and_garbage_gets_400(nursery, sources):
    server = MetricsServer(port=0, sources=sources.mapping())
    port = await nursery.start(server.run)
    async with httpx.AsyncClient() as client:
        for _ in range(3):
            r = await client.get(f"http://127.0.0.1:{port}/metrics")
            assert r.status_code == 200
    assert server.statistics().scrapes == 3

    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert server.statistics().bad_requests == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "::", "2001:db8::1"])
def test_a_non_loopback_host_is_refused_unless_remote_is_allowed(host):
    with pytest.raises(ConfigError) as e:
        MetricsServer(port=9100, host=host, sources={})
    assert e.value.key == "metrics.host" and "loopback" in str(e.value)
    # Constructing binds nothing, so this opens no port.
    MetricsServer(port=9100, host=host, sources={}, allow_remote=True)


def test_host_names_bad_ports_and_bad_component_names_are_refused():
    with pytest.raises(ConfigError, match="not an IP address") as e:
        MetricsServer(port=9100, host="localhost", sources={})
    assert e.value.key == "metrics.host"
    for port in (-1, 65536):
        with pytest.raises(ConfigError) as e:
            MetricsServer(port=port, sources={})
        assert e.value.key == "metrics.port"
    with pytest.raises(ValueError, match="metric name"):
        MetricsServer(port=0, sources={"bad-name": dict})


async def test_a_port_in_use_is_a_config_error_naming_the_key(nursery, sources):
    port = await start(nursery, sources.mapping())
    with pytest.raises(ConfigError) as e:
        await nursery.start(MetricsServer(port=port, sources={}).run)
    assert e.value.key == "metrics.port" and f"127.0.0.1:{port}" in str(e.value)
