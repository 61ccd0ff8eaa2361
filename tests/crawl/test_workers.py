"""The crawler's workers: the odd cases the daemon tests cannot reach at will."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from _rawserver import Connection, Reply, http_handler, raw_server

from refresher._config import Config, DiscoveryConfig, PolitenessConfig
from refresher.crawl._dns import Resolver
from refresher.crawl._fetch import Fetcher
from refresher.crawl._frontier import Frontier
from refresher.crawl._workers import Crawler, parse_stage
from refresher.store._interface import HostRow, PageRow


class _Recorder:
    """The store's write side, kept in lists (the crawler only queues writes to it)."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.hosts: list[Any] = []

    async def record(self, record: Any, capture: Any = None, host: Any = None) -> None:
        self.records.append(record)
        if host is not None:
            self.hosts.append(host)

    async def update_host(self, update: Any) -> None:
        self.hosts.append(update)


class _Plan:
    policy = "uniform"

    def interval(self, page: PageRow) -> float:
        return 60.0


def _once(url: str, name: str) -> Any:
    """A frontier's page source: one new page due now on a host whose robots.txt is known
    (no robots.txt request comes first), then nothing."""
    now = time.time()
    page = PageRow(
        id=1,
        url=url,
        host_id=1,
        host=name,
        due_at=now - 1,
        etag=None,
        last_modified=None,
        digest=None,
        target_rate=None,
    )
    host = HostRow(
        id=1,
        name=name,
        scheme="http",
        next_allowed=0.0,
        delay=None,
        backoff=0.0,
        errors=0,
        robots_status=404,
        robots_body=b"",
        robots_expires_at=now + 3600,
        paused=False,
    )
    served = False

    async def source(*_: Any) -> tuple[list[PageRow], dict[int, HostRow]]:
        nonlocal served
        rows = [] if served else [page]
        served = True
        return rows, {1: host}

    return source


@asynccontextmanager
async def _crawling(
    frontier: Frontier,
    name: str,
    port: int,
    *,
    config: Config | None = None,
    allocator: Any = None,
    discovery: Any = None,
    timeout: float = 300.0,
) -> AsyncIterator[tuple[Crawler, _Recorder]]:
    """A crawler and ``frontier`` running, host ``name`` served on 127.0.0.1:``port``: the
    crawler and its store's writes. Both stop at the end."""
    store = _Recorder()
    resolver = Resolver(static={name: f"127.0.0.1:{port}"})
    async with (
        Fetcher(user_agent="test", resolver=resolver, timeout=timeout) as fetcher,
        trio.open_nursery() as nursery,
    ):
        crawler = Crawler(
            config=config or Config(),
            frontier=frontier,
            fetcher=fetcher,
            store=store,  # type: ignore[arg-type]
            allocator=allocator or _Plan(),
            discovery=discovery,
        )
        await nursery.start(frontier.run)
        await nursery.start(crawler.run)
        yield crawler, store
        frontier.close()
        nursery.cancel_scope.cancel()  # the loader's next pass is seconds away


async def test_abandon_cuts_a_request_on_the_wire_records_its_hosts_delay_from_the_cut_only():
    async def hang(conn: Connection) -> None:
        await conn.read_request()
        await conn.stream.receive_some(1)  # b"" once the client has closed the connection

    async with raw_server(hang) as server:
        frontier = Frontier(source=_once("http://slow.test/slow", "slow.test"), budget=100.0)
        async with _crawling(frontier, "slow.test", server.port) as (crawler, store):
            await server.wait_for(lambda: len(server.requests) == 1)
            assert crawler.abandon(lambda h: h == "other.test") == 0
            cut_at = time.time()
            assert crawler.abandon(lambda h: h == "slow.test") == 1
            # the server sees the connection close long before the 300 s fetch timeout
            await server.wait_for(lambda: server.closed == 1)
            with trio.fail_after(10):
                await frontier.wait_released(lambda h: h == "slow.test")
            assert crawler.statistics().abandoned == 1
            assert store.records == []  # no fetch of a cut request is recorded
            # but the host was contacted until the cut: its delay counts from there, stored
            # (before the host is released) for a partition's next owner
            (update,) = store.hosts
            assert update.host_id == 1
            assert update.next_allowed >= cut_at + Config().politeness.min_delay


class _Broken(_Plan):
    """A bug after the fetch, before its record: the next due time cannot be computed."""

    def due_after_fetch(self, page: PageRow, fetched_at: float) -> float:
        raise RuntimeError("a bug")


async def test_a_refresh_that_fails_on_a_bug_stores_its_hosts_delay_before_releasing_it():
    contacted: list[float] = []

    def answer(request: Any) -> Reply:
        contacted.append(time.time())
        return Reply(status=200)

    async with raw_server(http_handler(answer)) as server:
        frontier = Frontier(source=_once("http://bug.test/", "bug.test"), budget=100.0)
        async with _crawling(frontier, "bug.test", server.port, allocator=_Broken()) as (
            crawler,
            store,
        ):
            await server.wait_for(lambda: len(server.requests) == 1)
            with trio.fail_after(10):
                await frontier.wait_released(lambda h: h == "bug.test")
            assert store.records == []  # nothing recorded of a refresh a bug cut short
            # the host was contacted: its delay from then is stored, as on every release
            # without a record (a cut request, a cancellation), for the next run or owner
            (update,) = store.hosts
            assert update.host_id == 1
            assert update.next_allowed >= contacted[0] + Config().politeness.min_delay
            assert crawler.statistics().fetches == 1


class _Soon(_Plan):
    """Every page due again a moment after its fetch: back in the frontier's window."""

    def due_after_fetch(self, page: PageRow, fetched_at: float) -> float:
        return fetched_at + 0.05


async def test_a_page_whose_fetch_failed_goes_back_to_the_frontier_tried_not_new():
    async with raw_server(http_handler(lambda request: Reply(status=500))) as server:
        seen: list[PageRow] = []

        def prioritize(page: PageRow, now: float) -> int:
            seen.append(page)
            return 0

        frontier = Frontier(
            source=_once("http://err.test/", "err.test"), budget=100.0, prioritize=prioritize
        )
        polite = PolitenessConfig(min_delay=0.01, backoff_base=0.01, max_backoff=0.01)
        config = Config(politeness=polite)
        async with _crawling(
            frontier, "err.test", server.port, config=config, allocator=_Soon()
        ) as (_, store):
            await server.wait_for(lambda: len(server.requests) == 2)
        # queued new, then (its first fetch failed, no copy) tried: no longer a new page
        assert [p.new for p in seen[:2]] == [True, False]
        assert seen[1].digest is None and seen[1].tried
        assert store.records[0].status == 500


class _Later(_Plan):
    """Every page due again in an hour: fetched once in a test."""

    def due_after_fetch(self, page: PageRow, fetched_at: float) -> float:
        return fetched_at + 3600.0


class _Stuck:
    """Discovery with its queue full for good: a handover waits until cancelled."""

    def __init__(self) -> None:
        self.waiting = trio.Event()

    def defer(self) -> bool:
        return False  # the deferred backlog is full too

    async def put(self, found: Any) -> None:
        self.waiting.set()
        await trio.sleep_forever()


async def test_a_worker_cancelled_handing_links_to_discovery_does_not_release_its_host_again():
    page = Reply(headers=[("Content-Type", "text/html")], body=b'<a href="/next">next</a>')
    async with raw_server(http_handler(lambda request: page)) as server:
        frontier = Frontier(source=_once("http://links.test/", "links.test"), budget=100.0)
        discovery = _Stuck()
        async with _crawling(
            frontier, "links.test", server.port, allocator=_Later(), discovery=discovery
        ) as (
            _,
            store,
        ):
            with trio.fail_after(10):
                await discovery.waiting.wait()
            assert frontier.statistics().leased == 0  # released with the fetch's record
        # cancelled (a drain deadline) while waiting on discovery: the host was given back
        # once, and no fallback timing overwrote the one recorded with the fetch
        assert frontier.statistics().leased == 0
        assert len(store.records) == 1
        assert len(store.hosts) == 1


async def test_the_parse_stage_starts_its_processes_before_any_page_when_they_come_first():
    # The daemon enters the stage before it opens the store: a new interpreter's imports
    # (~1 s) are over by the first large page, instead of the pages waiting for threads.
    first = Config(discovery=DiscoveryConfig(parse_processes=1, split_cpus=False))
    async with parse_stage(first) as parsers:
        assert parsers.processes is not None and len(parsers.processes.pids()) == 1
        assert parsers.statistics().process_calls == 0  # started, not waited for
    # "auto" without a CPU split: processes only take the threads' overflow, started then
    overflow = Config(discovery=DiscoveryConfig(parse_processes="auto", split_cpus=False))
    async with parse_stage(overflow) as parsers:
        assert parsers.processes is None or parsers.processes.pids() == []
