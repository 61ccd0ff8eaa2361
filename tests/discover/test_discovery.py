"""Discovery's queue and the store's owed findings: a full queue defers a document to the
store rather than drop it, and the replay hands it over (real DuckDB file, real store writer;
the frontier and the allocator are stand-ins that count what they are given)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import trio
from conftest import fetch_record, wait_for

from refresher._config import DiscoveryConfig
from refresher.discover._discovery import Discovery, Found, findings_of
from refresher.discover._filter import UrlFilter
from refresher.discover._parse import Extracted, Link
from refresher.discover._seen import UrlSeen
from refresher.store import DuckDBStore, NewPage, StoreService

NOW = 1_700_000_000.0


class Taken:
    """A frontier and an allocator in one: the pages handed to them."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def add(self, rows: Any, hosts: Any = None) -> int:
        self.urls += [r.url for r in rows]
        return len(rows)

    def pages_added(self, n: int) -> None:
        pass


async def test_a_full_queue_defers_a_document_to_the_store_and_the_replay_hands_it_over(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    store = StoreService(DuckDBStore(tmp_path / "s.duckdb"), flush_interval=0.05)
    await nursery.start(store.run)
    (src,), _ = await store.add_pages(
        [NewPage(url="http://a.example/", host="a.example", scheme="http")], now=NOW
    )
    taken = Taken()
    discovery = Discovery(
        store=store,
        frontier=taken,  # type: ignore[arg-type]
        allocator=taken,  # type: ignore[arg-type]
        url_filter=UrlFilter.from_config(
            DiscoveryConfig().filter_config(), seeds_hosts=["a.example"]
        ),
        seen=UrlSeen(capacity=100, lookup=store.known_fingerprints),
        queue=1,
    )

    async def fetched(k: int) -> None:
        """A fetch of the source page that found /k, recorded and queued as a worker does."""
        link = Link(url=f"/{k}", kind="a", nofollow=False)
        found = Found(
            page_id=src.id,
            depth=0,
            url=src.url,
            extracted=Extracted(links=(link,)),
            fetched_at=NOW + k,
        )
        deferred = discovery.defer()
        record = fetch_record(src.id, src.host_id, NOW + k)
        record = dataclasses.replace(record, findings=findings_of(found), deferred=deferred)
        await store.record(record)
        if not deferred:
            await discovery.put(found)

    await fetched(1)  # queued: the queue (of one) is full now
    await fetched(2)  # deferred to the store
    assert discovery.statistics().deferred == 1
    await nursery.start(discovery.run)
    await nursery.start(discovery.replay)
    await wait_for(lambda: len(taken.urls) == 2, what="the pages both documents found")
    assert sorted(taken.urls) == ["http://a.example/1", "http://a.example/2"]
    stats = discovery.statistics()
    # the deferred one replayed; the queued one not handed over twice (its run's, in the grace)
    assert (stats.documents, stats.replayed, stats.dropped) == (2, 1, 0)
    assert await store.owed_documents(10, grace=0.0, now=time.time() + 1e6) == []
    store.close()
