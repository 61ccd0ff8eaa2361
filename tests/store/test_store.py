from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import trio
import trio.testing
from conftest import fetch_record

from refresher import _cpus
from refresher._errors import StoreError
from refresher.archive._warc import WarcWriter, read_record
from refresher.store import (
    SCHEMA_VERSION,
    DocumentUpdate,
    DuckDBStore,
    FetchRecord,
    Findings,
    HostUpdate,
    NewPage,
    RobotsUpdate,
    StoreService,
    _service,
)
from refresher.store._batch import findings_doc, findings_of_doc
from refresher.store._captures import Capture, CaptureRow
from refresher.store._duckdb import first_row

NOW = 1_700_000_000.0


def page(url: str, host: str = "a.example", source: str = "seed") -> NewPage:
    return NewPage(url=url, host=host, scheme="http", source=source)


def fetch(page_id: int, host_id: int = 1, at: float = NOW + 10, **changes: Any) -> FetchRecord:
    """A successful, changed fetch of ``page_id`` finishing at ``at``; ``changes`` override."""
    record = fetch_record(
        page_id,
        host_id,
        at,
        body_bytes=1234,
        digest=b"d1",
        changed=True,
        etag='"v1"',
        last_modified="Tue, 14 Nov 2023 22:13:20 GMT",
        page_digest=b"d1",
        due_at=at + 100,
    )
    return dataclasses.replace(record, **changes)


def host_update(host_id: int = 1, **changes: Any) -> HostUpdate:
    update = HostUpdate(host_id=host_id, next_allowed=NOW + 20, delay=2.5, backoff=0, errors=0)
    return dataclasses.replace(update, **changes)


def page_row(store: DuckDBStore, page_id: int, columns: str) -> tuple[Any, ...]:
    row = first_row(store._con.execute(f"SELECT {columns} FROM pages WHERE id = ?", [page_id]))
    assert row is not None
    return row


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "refresher.duckdb"


@pytest.fixture
def store(path: Path) -> Iterator[DuckDBStore]:
    s = DuckDBStore(path)
    yield s
    s.close()


# -- opening and migrating ---------------------------------------------------------------------


def test_a_new_file_is_created_and_migrated_to_the_current_schema(path: Path) -> None:
    s = DuckDBStore(path)
    try:
        assert path.is_file()
        assert s.schema_version() == SCHEMA_VERSION
        assert s.counts() == (0, 0, 0)
    finally:
        s.close()


def test_reopening_keeps_the_data_and_ids_continue(path: Path) -> None:
    s = DuckDBStore(path)
    first = s.add_pages(
        [page("http://a.example/1"), page("http://b.example/", "b.example")], now=NOW
    )
    s.write([fetch(first[0].id)], [])
    s.close()

    s = DuckDBStore(path)
    try:
        assert s.schema_version() == SCHEMA_VERSION
        assert s.counts() == (2, 2, 1)
        more = s.add_pages(
            [page("http://a.example/2"), page("http://c.example/", "c.example")], now=NOW
        )
        assert sorted(r.id for r in more) == [3, 4]
        assert {r.host_id for r in more} == {1, 3}  # a.example keeps its id, c.example is new
        s.write([fetch(more[0].id)], [])
        ids = s._con.execute("SELECT id FROM fetches ORDER BY id").fetchall()
        assert ids == [(1,), (2,)]
    finally:
        s.close()


def _index_row(page_id: int, offset: int) -> CaptureRow:
    return CaptureRow(
        page_id=page_id,
        url=f"http://a.example/{page_id}",
        target_uri=f"http://a.example/{page_id}",
        captured_at=NOW,
        kind="response",
        status=200,
        mime="text/html",
        digest=b"d1",
        payload_digest="sha1:X",
        file="a.warc.gz",
        offset=offset,
        length=10,
        span=20,
        payload_bytes=5,
        truncated=False,
    )


def test_index_row_ids_continue_past_a_failed_batch_and_a_reopening(path: Path) -> None:
    s = DuckDBStore(path)
    [p] = s.add_pages([page("http://a.example/1")], now=NOW)
    s.write([fetch(p.id)], [], (), [_index_row(p.id, 0), _index_row(p.id, 10)])
    # a robots.txt status past INTEGER fails the batch after its index rows were inserted
    bad = RobotsUpdate(host_id=p.host_id, status=1 << 40, body=b"", fetched_at=NOW, expires_at=NOW)
    with pytest.raises(StoreError):
        s.write([fetch(p.id)], [], [bad], [_index_row(p.id, 20)])
    s.write([fetch(p.id)], [], (), [_index_row(p.id, 30)])
    s.close()
    s = DuckDBStore(path)
    try:
        s.write([fetch(p.id)], [], (), [_index_row(p.id, 40)])
        rows = s._con.execute("SELECT id, record_offset FROM warc_records ORDER BY id").fetchall()
    finally:
        s.close()
    assert rows == [(1, 0), (2, 10), (3, 30), (4, 40)]


def test_findings_a_run_left_owed_go_to_the_next_run_at_once_oldest_first(path: Path) -> None:
    """The owed table's lifecycle: written with the fetch's batch, taken by the next run at
    once (an earlier run's), not handed out twice within the grace, deleted when discovery
    saves the fetch's document; the table ends empty."""
    s = DuckDBStore(path)
    rows = s.add_pages([page(f"http://a.example/{i}") for i in range(3)], now=NOW)

    def found(i: int) -> Findings:
        return Findings(depth=i, url=rows[i].url, links=((f"/to{i}", "a"),), canonical=None)

    records = [fetch(r.id, at=NOW + 10 - i, findings=found(i)) for i, r in enumerate(rows)]
    s.write([*records, fetch(rows[0].id, at=NOW + 20)], [])  # the last one found nothing
    assert s.owed_documents(10, grace=120.0, now=NOW + 30) == []  # this run's: in its queue
    s.close()  # stopped before discovery stored any of them

    s = DuckDBStore(path)
    try:
        first = s.owed_documents(2, grace=120.0, now=NOW + 40)
        assert [o[1:] for o in first] == [
            (rows[2].id, NOW + 8, found(2)),
            (rows[1].id, NOW + 9, found(1)),
        ]
        rest = s.owed_documents(2, grace=120.0, now=NOW + 41)
        assert [o[1:] for o in rest] == [(rows[0].id, NOW + 10, found(0))]
        assert s.owed_documents(10, grace=120.0, now=NOW + 42) == []  # taken by this run
        assert len(s.owed_documents(10, grace=120.0, now=NOW + 200)) == 3  # after the grace

        def update(i: int) -> DocumentUpdate:
            return DocumentUpdate(
                page_id=rows[i].id,
                new=[],
                linked=[],
                canonical=None,
                noindex=False,
                lastmod=[],
                fetched_at=NOW + 10 - i,
            )

        s.save_documents([update(0), update(2)], now=NOW + 50)
        assert [o[1] for o in s.owed_documents(10, grace=0.0, now=NOW + 500)] == [rows[1].id]
        s.save_document(update(1), now=NOW + 51)
        assert s._scalar("SELECT count(*) FROM owed_documents") == 0
    finally:
        s.close()


def test_owed_findings_keep_coarse_lastmods_apart_and_an_older_row_still_loads() -> None:
    findings = Findings(
        depth=0,
        url="http://a.example/s.xml",
        links=(),
        lastmod=(("http://a.example/x", NOW - 5),),
        coarse_lastmod=(("http://a.example/y", NOW // 86400 * 86400),),
    )
    assert findings_of_doc(json.loads(json.dumps(findings_doc(findings)))) == findings
    # a row of an earlier version: its lastmods (2-element entries) only, date-only ones among
    # them (read as before)
    old = json.dumps(
        {
            "depth": 0,
            "url": "http://a.example/s.xml",
            "links": [],
            "canonical": None,
            "noindex": False,
            "lastmod": [["http://a.example/x", NOW - 5], ["http://a.example/y", 1.7e9]],
            "synthetic": False,
        }
    )
    got = findings_of_doc(json.loads(old))
    assert got.lastmod == (("http://a.example/x", NOW - 5), ("http://a.example/y", 1.7e9))
    assert got.coarse_lastmod == ()


def test_a_file_with_a_newer_schema_is_refused_with_upgrade_advice(path: Path) -> None:
    s = DuckDBStore(path)
    s._con.execute(
        "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)]
    )
    s.close()
    with pytest.raises(
        StoreError, match=r"newer than this refresher understands.*upgrade refresher"
    ):
        DuckDBStore(path)


def test_a_path_whose_directory_cannot_be_made_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot create the store directory"):
        DuckDBStore(blocker / "sub" / "x.duckdb")


def test_a_file_that_is_not_duckdb_is_a_store_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database file at all" * 200)
    with pytest.raises(StoreError, match="cannot open the store"):
        DuckDBStore(junk)


HOLDER = """
import sys
from pathlib import Path
from refresher.store import DuckDBStore
store = DuckDBStore(Path(sys.argv[1]))
print("open", flush=True)
sys.stdin.read()
store.close()
"""


def test_a_second_process_cannot_open_a_store_in_use(path: Path) -> None:
    DuckDBStore(path).close()
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        try:
            # Blocks until the other process holds the file (or ends, giving "").
            assert holder.stdout.readline() == "open\n"
            with pytest.raises(StoreError, match="in use by another process") as info:
                DuckDBStore(path)
            assert "refresher status" in str(info.value)
        finally:
            holder.stdin.close()
            assert holder.wait(timeout=30) == 0
    DuckDBStore(path).close()  # free again once the other process is gone


# -- pages and hosts ---------------------------------------------------------------------------


def test_add_pages_inserts_new_pages_due_now_and_creates_their_hosts(store: DuckDBStore) -> None:
    rows = store.add_pages(
        [page("http://a.example/1"), page("http://b.example:8080/", "b.example:8080", "link")],
        now=NOW,
    )
    assert [(r.id, r.url, r.host, r.due_at) for r in sorted(rows, key=lambda r: r.id)] == [
        (1, "http://a.example/1", "a.example", NOW),
        (2, "http://b.example:8080/", "b.example:8080", NOW),
    ]
    hosts = store.hosts(r.host_id for r in rows)
    assert sorted(h.name for h in hosts.values()) == ["a.example", "b.example:8080"]
    assert all(h.scheme == "http" and not h.paused and h.errors == 0 for h in hosts.values())
    assert page_row(store, 2, "source, status, first_seen, fetches") == ("link", "new", NOW, 0)


def test_add_pages_skips_duplicates_and_known_urls(store: DuckDBStore) -> None:
    first = store.add_pages([page("http://a.example/1"), page("http://a.example/1")], now=NOW)
    assert [r.url for r in first] == ["http://a.example/1"]
    again = store.add_pages(
        [page("http://a.example/1"), page("http://a.example/2"), page("http://a.example/2")],
        now=NOW + 5,
    )
    assert [(r.id, r.url) for r in again] == [(2, "http://a.example/2")]
    assert store.add_pages([page("http://a.example/1")], now=NOW) == []
    assert store.add_pages([], now=NOW) == []
    assert store.counts() == (2, 1, 0)
    assert page_row(store, 1, "first_seen") == (NOW,)


def test_http_and_https_pages_of_one_host_in_one_batch_share_the_host(store: DuckDBStore) -> None:
    rows = store.add_pages(
        [
            NewPage(url="https://a.example/", host="a.example", scheme="https"),
            NewPage(url="http://a.example/", host="a.example", scheme="http"),
        ],
        now=NOW,
    )
    assert len(rows) == 2
    assert {r.host_id for r in rows} == {1}
    assert store.hosts([1])[1].scheme == "https"
    assert store.counts() == (2, 1, 0)


def test_hosts_returns_the_requested_hosts_only(store: DuckDBStore) -> None:
    store.add_pages([page(f"http://h{i}.example/", f"h{i}.example") for i in range(3)], now=NOW)
    assert store.hosts([]) == {}
    got = store.hosts([1, 3, 3, 99])
    assert sorted(got) == [1, 3]
    assert got[1].name == "h0.example"
    assert got[3].name == "h2.example"
    assert got[1].next_allowed == 0
    assert got[1].delay is None
    assert got[1].robots_status is None


def test_save_robots_stores_status_body_and_expiry(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.save_robots(
        1, status=200, body=b"User-agent: *\nDisallow: /x\n", fetched_at=NOW, expires_at=NOW + 86400
    )
    host = store.hosts([1])[1]
    assert host.robots_status == 200
    assert host.robots_body == b"User-agent: *\nDisallow: /x\n"
    assert host.robots_expires_at == NOW + 86400
    store.save_robots(1, status=None, body=b"", fetched_at=NOW, expires_at=NOW + 600)
    assert store.hosts([1])[1].robots_status is None


def test_set_paused_pauses_a_known_host_and_reports_unknown_ones(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    assert store.set_paused("a.example", True) is True
    assert store.hosts([1])[1].paused is True
    assert store.set_paused("a.example", False) is True
    assert store.hosts([1])[1].paused is False
    assert store.set_paused("nowhere.example", True) is False


# -- the history -------------------------------------------------------------------------------


def test_write_appends_fetches_and_updates_the_page_and_host(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.write([fetch(1, at=NOW + 10, status=200, body_bytes=99)], [host_update(1, errors=2)])
    assert store.counts() == (1, 1, 1)
    row = first_row(
        store._con.execute(
            "SELECT id, page_id, host_id, status, bytes, changed, policy FROM fetches"
        )
    )
    assert row == (1, 1, 1, 200, 99, True, "uniform")
    assert page_row(
        store,
        1,
        "last_fetch, last_change, etag, last_modified, digest, fetches, changes, status, due_at",
    ) == (NOW + 10, NOW + 10, '"v1"', "Tue, 14 Nov 2023 22:13:20 GMT", b"d1", 1, 1, "ok", NOW + 110)
    host = store.hosts([1])[1]
    assert (host.next_allowed, host.delay, host.backoff, host.errors) == (NOW + 20, 2.5, 0, 2)


def test_an_unchanged_fetch_does_not_move_last_change(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.write([fetch(1, at=NOW + 10)], [])
    store.write(
        [
            fetch(
                1,
                at=NOW + 20,
                status=304,
                changed=False,
                not_modified=True,
                digest=None,
                etag='"v2"',
                page_status="not_modified",
            )
        ],
        [],
    )
    assert page_row(
        store, 1, "last_fetch, last_change, fetches, changes, etag, digest, status"
    ) == (
        NOW + 20,
        NOW + 10,
        2,
        1,
        '"v2"',
        b"d1",
        "not_modified",
    )


def test_a_page_fetched_twice_in_one_batch_adds_up_and_keeps_the_later_state(
    store: DuckDBStore,
) -> None:
    store.add_pages([page("http://a.example/1"), page("http://a.example/2")], now=NOW)
    store.write(
        [
            fetch(1, at=NOW + 10, digest=b"x", page_digest=b"x"),
            fetch(2, at=NOW + 11, changed=False),
            fetch(1, at=NOW + 20, changed=False, etag=None, page_status="ok", due_at=NOW + 500),
        ],
        [host_update(1, errors=1), host_update(1, errors=0, next_allowed=NOW + 30)],
    )
    assert store.counts()[2] == 3
    assert page_row(store, 1, "last_fetch, last_change, fetches, changes, etag, due_at") == (
        NOW + 20,
        NOW + 10,
        2,
        1,
        None,
        NOW + 500,
    )
    assert page_row(store, 2, "last_fetch, last_change, fetches, changes") == (NOW + 11, None, 1, 0)
    host = store.hosts([1])[1]
    assert (host.errors, host.next_allowed) == (0, NOW + 30)


def test_a_failed_fetch_is_recorded_without_a_status(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.write(
        [
            fetch(
                1,
                status=None,
                body_bytes=0,
                digest=None,
                changed=False,
                error_kind="timeout",
                etag=None,
                last_modified=None,
                page_digest=None,
                page_status="error",
            )
        ],
        [host_update(1, errors=1, backoff=30)],
    )
    assert first_row(store._con.execute("SELECT status, error_kind, digest FROM fetches")) == (
        None,
        "timeout",
        None,
    )
    assert page_row(store, 1, "status, fetches, changes, last_change") == ("error", 1, 0, None)
    assert store.hosts([1])[1].backoff == 30


def test_write_with_only_host_updates_changes_hosts_only(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.write([], [host_update(1, delay=7.0)])
    assert store.hosts([1])[1].delay == 7.0
    assert store.counts() == (1, 1, 0)


def test_fetch_log_shows_the_documented_columns_with_timestamps(store: DuckDBStore) -> None:
    store.add_pages([page("http://a.example/")], now=NOW)
    store.write([fetch(1, at=NOW + 10)], [])
    columns = store._con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'fetch_log' ORDER BY ordinal_position"
    ).fetchall()
    assert [c for c, _ in columns] == [
        "url",
        "host",
        "started_at",
        "finished_at",
        "status",
        "changed",
        "not_modified",
        "bytes",
        "policy",
        "error_kind",
        "duration",
        "meaningful",
    ]
    types = dict(columns)
    assert types["started_at"] == "TIMESTAMP"
    assert types["finished_at"] == "TIMESTAMP"
    row = first_row(store._con.execute("SELECT url, host, finished_at, status FROM fetch_log"))
    assert row == ("http://a.example/", "a.example", datetime(2023, 11, 14, 22, 13, 30), 200)


# -- scheduling --------------------------------------------------------------------------------


def test_due_pages_pages_through_by_due_time_then_id(store: DuckDBStore) -> None:
    store.add_pages([page(f"http://a.example/{i}") for i in range(5)], now=NOW)
    # pages 1..5; give 4 and 5 a later due time than the rest
    store.write([fetch(4, due_at=NOW + 50), fetch(5, due_at=NOW + 40)], [])
    seen: list[int] = []
    after = (float("-inf"), 0)
    while batch := store.due_pages(after=after, until=NOW + 1000, limit=2):
        assert len(batch) <= 2
        seen.extend(p.id for p in batch)
        after = (batch[-1].due_at, batch[-1].id)
    assert seen == [1, 2, 3, 5, 4]


def test_due_pages_stops_at_until_and_holds_gone_pages_back_until_their_re_check(
    store: DuckDBStore,
) -> None:
    store.add_pages([page(f"http://a.example/{i}") for i in range(3)], now=NOW)
    store.write([fetch(2, due_at=NOW + 50), fetch(3, page_status="gone", due_at=NOW + 86_400)], [])
    due = store.due_pages(after=(float("-inf"), 0), until=NOW + 49, limit=10)
    assert [p.id for p in due] == [1]
    later = store.due_pages(after=(float("-inf"), 0), until=NOW + 86_400, limit=10)
    assert [p.id for p in later] == [1, 2, 3]
    assert [p.id for p in store.due_pages(after=(NOW, 1), until=NOW + 50, limit=10)] == [2]
    row = store.due_pages(after=(NOW, 1), until=NOW + 50, limit=10)[0]
    assert (row.url, row.host, row.etag, row.digest) == (
        "http://a.example/1",
        "a.example",
        '"v1"',
        b"d1",
    )


def test_record_policy_appends_only_when_the_policy_or_budget_changes(store: DuckDBStore) -> None:
    store.record_policy("uniform", 10.0, now=NOW)
    store.record_policy("uniform", 10.0, now=NOW + 1)
    store.record_policy("optimal", 10.0, now=NOW + 2)
    store.record_policy("optimal", 5.0, now=NOW + 3)
    store.record_policy("optimal", 5.0, now=NOW + 4)
    rows = store._con.execute("SELECT * FROM policy_periods ORDER BY started_at").fetchall()
    assert rows == [
        (NOW, "uniform", 10.0),
        (NOW + 2, "optimal", 10.0),
        (NOW + 3, "optimal", 5.0),
    ]


def test_count_pages_leaves_out_gone_pages(store: DuckDBStore) -> None:
    store.add_pages([page(f"http://a.example/{i}") for i in range(3)], now=NOW)
    store.write([fetch(2, page_status="gone")], [])
    assert store.count_pages() == 2


# -- the service -------------------------------------------------------------------------------


class Commits:
    """Counts the service's committed batches; lets a test wait for the next one."""

    def __init__(self, service: StoreService) -> None:
        self.sizes: list[int] = []
        self._changed = trio.Event()
        service.on_commit.append(self._commit)

    def _commit(self, size: int) -> None:
        self.sizes.append(size)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, batches: int) -> None:
        with trio.fail_after(30):
            while len(self.sizes) < batches:
                await self._changed.wait()


@pytest.fixture
def paged_store(store: DuckDBStore) -> DuckDBStore:
    store.add_pages([page(f"http://a.example/{i}") for i in range(10)], now=NOW)
    return store


async def test_a_full_batch_commits_at_once(paged_store: DuckDBStore) -> None:
    service = StoreService(paged_store, flush_interval=10_000, batch_size=3)
    commits = Commits(service)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        for i in range(1, 5):
            await service.record(fetch(i))
        await commits.wait_for(1)
        await trio.testing.wait_all_tasks_blocked()
        stats = service.statistics()
        assert commits.sizes == [3]
        assert (stats.acknowledged, stats.batches, stats.queued) == (3, 1, 1)
        service.close()
    assert commits.sizes == [3, 1]


async def test_records_commit_once_the_flush_interval_passes(
    paged_store: DuckDBStore, mock_clock: trio.testing.MockClock
) -> None:
    service = StoreService(paged_store, flush_interval=5.0, batch_size=100)
    commits = Commits(service)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1))
        await service.update_host(host_update(1, errors=4))
        await service.record(fetch(2))
        mock_clock.jump(4.9)
        await trio.testing.wait_all_tasks_blocked()
        assert commits.sizes == []
        assert service.statistics().queued == 2
        assert paged_store.counts()[2] == 0
        mock_clock.jump(0.2)
        await commits.wait_for(1)
        assert commits.sizes == [2]
        assert service.statistics().acknowledged == 2
        assert paged_store.hosts([1])[1].errors == 4
        service.close()


class Archive(WarcWriter):
    """The real WARC writer, noting what each batch gave it and how many fetches the store
    held then."""

    def __init__(self, directory: Path, store: DuckDBStore) -> None:
        super().__init__(directory, min_free_bytes=0)
        self.store = store
        self.batches: list[tuple[list[Capture], int]] = []

    def write_batch(self, captures: Sequence[Capture]) -> list[CaptureRow]:
        self.batches.append((list(captures), self.store.counts()[2]))
        return super().write_batch(captures)


def a_capture(page_id: int) -> Capture:
    return Capture(
        page_id=page_id,
        url=f"http://a.example/{page_id - 1}",
        target_uri=f"http://a.example/{page_id - 1}",
        fetched_at=NOW + 10,
        kind="response",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(),
        request_headers=(),
        payload=b"<p>hi</p>",
        truncated=False,
        digest=b"d1",
    )


async def test_a_batchs_captures_are_archived_together_before_the_transaction_indexing_them(
    paged_store: DuckDBStore, tmp_path: Path
) -> None:
    archive = Archive(tmp_path, paged_store)
    service = StoreService(paged_store, flush_interval=10_000, batch_size=3, archive=archive)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1), a_capture(1), host_update(1, errors=2))
        await service.record(fetch(2))
        await service.record(fetch(3), a_capture(3))
        await service.flush()
        service.close()
    [(captures, fetches_before)] = archive.batches
    assert [c.page_id for c in captures] == [1, 3] and fetches_before == 0
    indexed = paged_store._con.execute(
        "SELECT page_id, file, record_offset FROM warc_records ORDER BY page_id"
    ).fetchall()
    assert [r[0] for r in indexed] == [1, 3]
    for _, file, offset in indexed:  # the index points at the records on disk
        assert read_record(tmp_path / file, offset).body == b"<p>hi</p>"
    assert paged_store.hosts([1])[1].errors == 2 and paged_store.counts()[2] == 3


class _MaskArchive(Archive):
    """Notes the CPUs each batch's archiving may run on, and its thread's scheduling policy."""

    def __init__(self, directory: Path, store: DuckDBStore) -> None:
        super().__init__(directory, store)
        self.masks: list[frozenset[int]] = []
        self.policies: list[int] = []

    def write_batch(self, captures: Sequence[Capture]) -> list[CaptureRow]:
        self.masks.append(frozenset(os.sched_getaffinity(0)))
        self.policies.append(os.sched_getscheduler(0))
        return super().write_batch(captures)


async def _archived_batches(store: DuckDBStore, tmp_path: Path, n: int) -> _MaskArchive:
    """The archive of ``n`` batches of one capture each, each flushed before the next."""
    archive = _MaskArchive(tmp_path, store)
    service = StoreService(store, flush_interval=10_000, batch_size=100, archive=archive)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        for i in range(1, n + 1):
            await service.record(fetch(i), a_capture(i))
            await service.flush()
        service.close()
    return archive


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(_cpus.STARTED_ON) < 2,
    reason="needs CPU masks and two CPUs",
)
async def test_a_batch_is_written_on_every_cpu_while_the_daemons_threads_keep_to_one(
    paged_store: DuckDBStore, tmp_path: Path
) -> None:
    _cpus.keep_threads_to(frozenset({min(_cpus.STARTED_ON)}))  # as discovery.split_cpus does
    try:
        archive = await _archived_batches(paged_store, tmp_path, 1)
    finally:
        _cpus.keep_threads_to(_cpus.STARTED_ON)
    assert archive.masks == [_cpus.STARTED_ON]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH here")
async def test_a_batch_is_written_by_a_thread_that_does_not_preempt_the_event_loop(
    paged_store: DuckDBStore, tmp_path: Path
) -> None:
    archive = await _archived_batches(paged_store, tmp_path, 2)
    assert archive.policies == [os.SCHED_BATCH] * 2
    assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the event loop's own: as it was


async def test_large_captures_commit_their_batch_early_so_copies_do_not_pile_up_in_memory(
    paged_store: DuckDBStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_service, "CAPTURE_BYTES", 15)  # two 9-byte payloads pass it
    archive = Archive(tmp_path, paged_store)
    service = StoreService(paged_store, flush_interval=10_000, batch_size=100, archive=archive)
    commits = Commits(service)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        for i in range(1, 4):
            await service.record(fetch(i), a_capture(i))
        await commits.wait_for(1)
        assert [[c.page_id for c in b] for b, _ in archive.batches] == [[1, 2]]
        service.close()


async def test_a_call_sees_every_record_queued_before_it(paged_store: DuckDBStore) -> None:
    service = StoreService(paged_store, flush_interval=10_000, batch_size=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        for i in range(1, 4):
            await service.record(fetch(i))
        await service.update_host(host_update(1, delay=9.0))
        fetches = await service._call(lambda s: s.counts()[2])
        delay = await service._call(lambda s: s.hosts([1])[1].delay)
        assert (fetches, delay) == (3, 9.0)
        assert service.statistics().acknowledged == 3
        service.close()


async def test_close_commits_what_is_queued_and_run_returns(path: Path) -> None:
    store = DuckDBStore(path)
    store.add_pages([page("http://a.example/1"), page("http://a.example/2")], now=NOW)
    service = StoreService(store, flush_interval=10_000, batch_size=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1))
        await service.record(fetch(2))
        service.close()
        service.close()  # closing twice is harmless
    stats = service.statistics()
    assert (stats.acknowledged, stats.queued) == (2, 0)
    store.close()
    reopened = DuckDBStore(path)
    try:
        assert reopened.counts()[2] == 2
    finally:
        reopened.close()


async def test_queued_records_are_committed_when_the_service_is_cancelled(
    paged_store: DuckDBStore,
) -> None:
    service = StoreService(paged_store, flush_interval=10_000, batch_size=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1))
        await service.record(fetch(2))
        nursery.cancel_scope.cancel()
    assert service.statistics().acknowledged == 2
    assert paged_store.counts()[2] == 2


async def test_a_failing_call_raises_in_the_caller_and_the_service_goes_on(
    paged_store: DuckDBStore,
) -> None:
    service = StoreService(paged_store, flush_interval=10_000, batch_size=100)

    def broken(store: DuckDBStore) -> None:
        raise ValueError("no such thing")

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1))
        with pytest.raises(ValueError, match="no such thing"):
            await service._call(broken)
        with pytest.raises(duckdb.ParserException):
            await service._call(lambda s: s._con.execute("SELEC 1"))
        await service.record(fetch(2))
        assert await service._call(lambda s: s.counts()[2]) == 2
        service.close()
    assert service.statistics().acknowledged == 2


async def test_statistics_count_pages_hosts_and_fetches(paged_store: DuckDBStore) -> None:
    service = StoreService(paged_store, flush_interval=10_000, batch_size=100)
    assert (service.statistics().pages, service.statistics().hosts) == (10, 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.record(fetch(1))
        await service._call(lambda s: None)
        stats = service.statistics()
        assert (stats.fetches, stats.acknowledged, stats.batches) == (1, 1, 1)
        assert stats.last_batch_seconds >= 0
        service.close()


def test_a_version_1_file_migrates_and_its_url_fingerprints_are_backfilled(tmp_path: Path) -> None:
    import duckdb as ddb

    from refresher.discover._seen import fingerprint
    from refresher.store._duckdb import _MIGRATIONS

    path = tmp_path / "v1.duckdb"
    con = ddb.connect(str(path))
    first = _MIGRATIONS[0]
    assert isinstance(first, str)
    con.execute(first)
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute("INSERT INTO hosts (id, name, scheme) VALUES (1, 'a.example', 'http')")
    con.execute(
        "INSERT INTO pages (id, url, host_id, first_seen, due_at) "
        "VALUES (1, 'http://a.example/', 1, 0, 0)"
    )
    con.close()
    store = DuckDBStore(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        row = first_row(store._con.execute("SELECT url_fp, depth FROM pages WHERE id = 1"))
        assert row == (fingerprint("http://a.example/"), 0)
        known = store.known_fingerprints(np.array([fingerprint("http://a.example/"), 7]))
        assert known.tolist() == [True, False]
    finally:
        store.close()
