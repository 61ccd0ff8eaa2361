"""The crawler's workers: the odd cases the daemon tests cannot reach at will."""

from __future__ import annotations

import time
from typing import Any

import trio
from _rawserver import Connection, raw_server

from refresher._config import Config
from refresher.crawl._dns import Resolver
from refresher.crawl._fetch import Fetcher
from refresher.crawl._frontier import Frontier
from refresher.crawl._workers import Crawler
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


async def test_abandon_cuts_a_request_on_the_wire_records_nothing_and_frees_its_host():
    async def hang(conn: Connection) -> None:
        await conn.read_request()
        await conn.stream.receive_some(1)  # b"" once the client has closed the connection

    async with raw_server(hang) as server:
        now = time.time()
        page = PageRow(
            id=1,
            url="http://slow.test/slow",
            host_id=1,
            host="slow.test",
            due_at=now - 1,
            etag=None,
            last_modified=None,
            digest=None,
            target_rate=None,
        )
        host = HostRow(
            id=1,
            name="slow.test",
            scheme="http",
            next_allowed=0.0,
            delay=None,
            backoff=0.0,
            errors=0,
            robots_status=404,  # known: no robots.txt request comes first
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

        frontier = Frontier(source=source, budget=100.0)
        store = _Recorder()
        resolver = Resolver(static={"slow.test": f"127.0.0.1:{server.port}"})
        async with (
            Fetcher(user_agent="test", resolver=resolver, timeout=300.0) as fetcher,
            trio.open_nursery() as nursery,
        ):
            crawler = Crawler(
                config=Config(),
                frontier=frontier,
                fetcher=fetcher,
                store=store,  # type: ignore[arg-type]
                allocator=_Plan(),  # type: ignore[arg-type]
            )
            await nursery.start(frontier.run)
            await nursery.start(crawler.run)
            await server.wait_for(lambda: len(server.requests) == 1)
            assert crawler.abandon(lambda h: h == "other.test") == 0
            assert crawler.abandon(lambda h: h == "slow.test") == 1
            # the server sees the connection close long before the 300 s fetch timeout
            await server.wait_for(lambda: server.closed == 1)
            with trio.fail_after(10):
                await frontier.wait_released(lambda h: h == "slow.test")
            assert crawler.statistics().abandoned == 1
            assert store.records == []  # nothing of a cut request is recorded
            frontier.close()
