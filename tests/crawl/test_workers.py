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
from refresher.fleet._node import FleetNode
from refresher.fleet._partition import partition_of
from refresher.store._interface import HostRow, PageRow


class _Recorder:
    """The store's write side, kept in lists (the crawler only queues writes to it)."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.hosts: list[Any] = []
        self.flushed: list[tuple[int, int]] = []  # (records, host updates) queued at each flush

    async def record(self, record: Any, capture: Any = None, host: Any = None) -> None:
        self.records.append(record)
        if host is not None:
            self.hosts.append(host)

    async def update_host(self, update: Any) -> None:
        self.hosts.append(update)

    async def flush(self) -> None:
        self.flushed.append((len(self.records), len(self.hosts)))


class _Plan:
    policy = "uniform"

    def interval(self, page: PageRow) -> float:
        return 60.0


def _once(url: str, name: str, *, pages: int = 1) -> Any:
    """A frontier's page source: ``pages`` new pages due now (``url``, then ``url`` + ``1``,
    ...) on a host whose robots.txt is known (no robots.txt request comes first), then
    nothing."""
    now = time.time()
    rows = [
        PageRow(
            id=1 + i,
            url=url + (str(i) if i else ""),
            host_id=1,
            host=name,
            due_at=now - 1,
            etag=None,
            last_modified=None,
            digest=None,
            target_rate=None,
        )
        for i in range(pages)
    ]
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
        taken = [] if served else rows
        served = True
        return taken, {1: host}

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
    parsers: Any = None,
    store: _Recorder | None = None,
) -> AsyncIterator[tuple[Crawler, _Recorder]]:
    """A crawler and ``frontier`` running, host ``name`` served on 127.0.0.1:``port``: the
    crawler and its store's writes. Both stop at the end."""
    store = store or _Recorder()
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
            parsers=parsers,
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


class _HeldParse:
    """The parse stage with every parse held until ``go`` is set."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.calls = 0
        self._called = trio.Event()

    async def run(self, fn: Any, *, size: int, portable: bool = True) -> Any:
        self.calls += 1
        self._called.set()
        await self.go.wait()
        return fn()

    async def wait_calls(self, n: int) -> None:
        with trio.fail_after(10):
            while self.calls < n:
                self._called = trio.Event()
                await self._called.wait()


_HTML = Reply(headers=[("Content-Type", "text/html")], body=b"<p>a page</p>")
_QUICK = Config(politeness=PolitenessConfig(min_delay=0.01))


async def test_a_hosts_next_request_goes_out_while_its_last_page_is_parsed():
    async with raw_server(http_handler(lambda request: _HTML)) as server:
        frontier = Frontier(source=_once("http://two.test/", "two.test", pages=2), budget=100.0)
        parse = _HeldParse()
        async with _crawling(
            frontier, "two.test", server.port, config=_QUICK, allocator=_Later(), parsers=parse
        ) as (_, store):
            # the second request went out while the first page's parse is held
            await server.wait_for(lambda: len(server.requests) == 2)
            await parse.wait_calls(2)
            assert store.records == []
            # each response's host timing was queued before its host was freed
            assert [u.host_id for u in store.hosts] == [1, 1]
            assert store.hosts[1].next_allowed > store.hosts[0].next_allowed
            stats = frontier.statistics()
            assert (stats.leased, stats.recording, stats.in_memory) == (0, 2, 2)
            parse.go.set()
            with trio.fail_after(10):
                while len(store.records) < 2:
                    await trio.testing.wait_all_tasks_blocked()
            assert frontier.statistics().recording == 0
            assert len(store.hosts) == 2  # the records carry no second copy of the timing
            assert len(server.requests) == 2  # neither page was handed out again meanwhile


class _Failing(_Recorder):
    """A store whose fetch records fail (a bug, a store closing)."""

    async def record(self, record: Any, capture: Any = None, host: Any = None) -> None:
        raise RuntimeError("the store failed")


async def test_a_page_whose_host_was_freed_goes_back_once_when_its_record_fails_or_is_cut():
    async with raw_server(http_handler(lambda request: _HTML)) as server:
        frontier = Frontier(source=_once("http://fail.test/", "fail.test"), budget=100.0)
        parse = _HeldParse()
        parse.go.set()
        async with _crawling(
            frontier, "fail.test", server.port, allocator=_Later(), parsers=parse, store=_Failing()
        ) as (_, store):
            await parse.wait_calls(1)
            with trio.fail_after(10):
                await frontier.wait_released(lambda h: h == "fail.test")
            stats = frontier.statistics()
            assert (stats.leased, stats.recording, stats.in_memory) == (0, 0, 0)
            assert len(store.hosts) == 1  # the response's timing, no fallback after it
        cut = _HeldParse()
        frontier = Frontier(source=_once("http://cut.test/", "cut.test"), budget=100.0)
        async with _crawling(
            frontier, "cut.test", server.port, allocator=_Later(), parsers=cut
        ) as (_, store):
            await cut.wait_calls(1)
        # cancelled in the parse (a drain deadline): the page went back alone, once
        stats = frontier.statistics()
        assert (stats.leased, stats.recording, stats.in_memory) == (0, 0, 0)
        assert len(store.hosts) == 1 and store.records == []


async def test_a_partition_is_handed_over_after_a_freed_hosts_record_and_its_timing_commit():
    async with raw_server(http_handler(lambda request: _HTML)) as server:
        frontier = Frontier(source=_once("http://shed.test/", "shed.test"), budget=100.0)
        parse = _HeldParse()
        async with (
            _crawling(frontier, "shed.test", server.port, allocator=_Later(), parsers=parse) as (
                _,
                store,
            ),
            trio.open_nursery() as nursery,
        ):
            await parse.wait_calls(1)  # the host is free, its page's record pending
            config = Config()
            node = FleetNode(
                config,
                store=store,  # type: ignore[arg-type]
                frontier=frontier,
                rate=lambda: 0.0,
                pages_added=lambda n: None,
            )
            partition = partition_of("shed.test", config.fleet.partitions)
            drained = trio.Event()

            async def hand_over() -> None:
                await node._drain(frozenset({partition}), trio.current_time() + 30.0)
                drained.set()

            nursery.start_soon(hand_over)
            await trio.testing.wait_all_tasks_blocked()
            assert not drained.is_set() and store.flushed == []
            parse.go.set()
            with trio.fail_after(10):
                await drained.wait()
            # one flush, after the page's record and its host's timing were queued
            assert store.flushed == [(1, 1)]


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
