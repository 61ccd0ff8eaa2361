"""Snapshots: readable by other processes while the store is open, replaced atomically, live."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import duckdb
import pytest
import trio
from conftest import DaemonProcess, daemon_config, fetch_record, wait_for

from refresher._config import Config, StoreConfig, load_config
from refresher._errors import StoreError
from refresher.sim._site import Site
from refresher.store import DuckDBStore, FetchRecord, NewPage, PageRow, StoreService
from refresher.store._snapshot import (
    Snapshotter,
    _interruptible,
    format_table,
    open_for_query,
    run_query,
    snapshot_path,
)

READER = """
import json, sys, duckdb
out = {}
try:
    duckdb.connect(sys.argv[2], read_only=True)
    out["store"] = "opened"
except duckdb.Error as e:
    out["store"] = str(e)
con = duckdb.connect(sys.argv[1], read_only=True)
out["fetches"] = con.execute("SELECT count(*) FROM fetches").fetchone()[0]
out["ids"] = [r[0] for r in con.execute("SELECT id FROM fetches ORDER BY id").fetchall()]
out["now"] = list(con.execute("SELECT pages, pages_with_copy FROM freshness_now").fetchone())
out["log"] = con.execute("SELECT count(*) FROM fetch_log").fetchone()[0]
out["info"] = list(con.execute("SELECT taken_at, fetches FROM snapshot_info").fetchone())
print(json.dumps(out))
"""


def read_in_another_process(snapshot: Path, store: Path) -> dict[str, Any]:
    """What a separate process sees in ``snapshot``, and whether it could open ``store``."""
    done = subprocess.run(
        [sys.executable, "-c", READER, str(snapshot), str(store)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def record(page: PageRow, at: float, *, status: int | None = 200) -> FetchRecord:
    return fetch_record(
        page.id,
        page.host_id,
        at,
        duration=0.01,
        status=status,
        error_kind=None if status else "connect",
        due_at=at + 10,
    )


class Live:
    """A real store file served by a running StoreService, as inside the daemon."""

    def __init__(self, path: Path, service: StoreService) -> None:
        self.path = path
        self.service = service
        self.pages: list[PageRow] = []
        self.clock = 1_000.0

    async def add_pages(self, n: int) -> None:
        new = [
            NewPage(url=f"http://h{i % 2}.test/p{i}", host=f"h{i % 2}.test", scheme="http")
            for i in range(len(self.pages), len(self.pages) + n)
        ]
        self.pages += await self.service._call(lambda s: s.add_pages(new, now=self.clock))

    async def fetch_all(self, *, status: int | None = 200) -> None:
        for page in self.pages:
            self.clock += 1.0
            await self.service.record(record(page, self.clock, status=status))

    async def store_ids(self) -> list[int]:
        rows = await self.service._call(
            lambda s: s._con.execute("SELECT id FROM fetches ORDER BY id").fetchall()
        )
        return [int(r[0]) for r in rows]


@asynccontextmanager
async def live_store(path: Path) -> AsyncIterator[Live]:
    store = DuckDBStore(path)
    service = StoreService(store, flush_interval=0.05)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            try:
                yield Live(path, service)
            finally:
                service.close()
    finally:
        store.close()


async def test_another_process_reads_the_snapshot_while_the_store_is_open(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(4)
        await live.fetch_all()
        await live.fetch_all(status=None)  # failed fetches are history too
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=0)
        path = await snap.write_now()
        seen = await trio.to_thread.run_sync(read_in_another_process, path, live.path)
        # the premise: the daemon's store cannot be opened by anyone else
        assert "lock" in seen["store"].lower()
        assert seen["ids"] == await live.store_ids()
        assert seen["fetches"] == 8 and seen["log"] == 8
        assert seen["now"] == [4, 4]
        assert seen["info"][1] == 8
        stats = snap.statistics()
        assert (stats.snapshots, stats.rebuilds, stats.failures) == (1, 1, 0)
        assert (stats.fetches, stats.pages) == (8, 4)
        assert stats.bytes == path.stat().st_size and stats.last_at == seen["info"][0]
        assert not snap.staging.with_name(snap.staging.name + ".wal").exists()


async def test_incremental_snapshots_copy_every_fetch_exactly_once(tmp_path: Path) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=0)
        await live.add_pages(3)
        for round_ in range(4):
            await live.fetch_all()
            if round_ == 2:
                await live.add_pages(2)  # pages are replaced whole, fetches appended
            await snap.write_now()
            seen = await trio.to_thread.run_sync(read_in_another_process, snap.path, live.path)
            assert seen["ids"] == await live.store_ids()
            assert seen["now"][0] == len(live.pages)
        assert snap.statistics().rebuilds == 1
        assert snap.statistics().snapshots == 4


async def test_a_reader_keeps_the_old_snapshot_across_a_replacement(tmp_path: Path) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=0)
        await live.add_pages(2)
        await live.fetch_all()
        await snap.write_now()
        old = duckdb.connect(str(snap.path), read_only=True)
        try:
            await live.fetch_all()
            await snap.write_now()
            new = await trio.to_thread.run_sync(read_in_another_process, snap.path, live.path)
            assert new["fetches"] == 4
            # the old reader still has its whole, unchanged file
            assert old.execute("SELECT count(*) FROM fetches").fetchall() == [(2,)]
            assert old.execute("SELECT pages FROM freshness_now").fetchall() == [(2,)]
        finally:
            old.close()
        assert not snap.path.with_name(snap.path.name + ".tmp").exists()


async def test_a_new_snapshotter_rebuilds_whatever_staging_file_it_finds(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(2)
        await live.fetch_all()
        path = tmp_path / "snapshot.duckdb"
        staging = Snapshotter(store=live.service, path=path, interval=0).staging
        foreign = duckdb.connect(str(staging))  # a file from some other store
        foreign.execute("CREATE TABLE fetches AS SELECT 999 AS id")
        foreign.close()
        snap = Snapshotter(store=live.service, path=path, interval=0)
        await snap.write_now()
        seen = await trio.to_thread.run_sync(read_in_another_process, path, live.path)
        assert seen["ids"] == await live.store_ids()
        assert snap.statistics().rebuilds == 1


async def test_a_failed_snapshot_is_counted_and_the_previous_stays_published(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(2)
        await live.fetch_all()
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=0)
        await snap.write_now()
        snap.staging.unlink()
        snap.staging.mkdir()  # cannot be opened as a database
        await live.fetch_all()
        with pytest.raises(StoreError, match="snapshot"):
            await snap.write_now()
        assert snap.statistics().failures == 1 and snap.statistics().snapshots == 1
        seen = await trio.to_thread.run_sync(read_in_another_process, snap.path, live.path)
        assert seen["fetches"] == 2
        snap.staging.rmdir()
        await snap.write_now()  # recovers by rebuilding
        assert snap.statistics().rebuilds == 2


async def test_run_publishes_periodically_and_an_interval_of_zero_is_off(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(1)
        off = Snapshotter(store=live.service, path=tmp_path / "off.duckdb", interval=0)
        await off.run()  # returns at once
        assert not off.path.exists()
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=0.01)
        async with trio.open_nursery() as nursery:
            await nursery.start(snap.run)
            await wait_for(lambda: snap.statistics().snapshots >= 1, what="first snapshot")
            await live.fetch_all()
            await wait_for(lambda: snap.statistics().fetches == 1, what="a later snapshot")
            nursery.cancel_scope.cancel()
        # a failing run keeps going
        bad = Snapshotter(
            store=live.service, path=tmp_path / "snapshot.duckdb" / "x.duckdb", interval=0.01
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(bad.run)
            await wait_for(lambda: bad.statistics().failures >= 2, what="failures counted")
            nursery.cancel_scope.cancel()


async def test_cancelling_interrupts_a_running_query() -> None:
    con = duckdb.connect()
    started = threading.Event()
    cancelled = False

    def endless() -> Any:
        started.set()
        return con.execute("SELECT sum(range) FROM range(1000000000000000)").fetchall()

    with trio.fail_after(60):  # a deadline for a hang, not a timing threshold
        async with trio.open_nursery() as nursery:

            async def cancel_when_started() -> None:
                await trio.to_thread.run_sync(started.wait)
                nursery.cancel_scope.cancel()

            nursery.start_soon(cancel_when_started)
            try:
                await _interruptible(con, endless)
            except trio.Cancelled:
                cancelled = True
                raise
    assert cancelled
    assert con.execute("SELECT 1").fetchall() == [(1,)]  # the connection is usable again
    con.close()


def test_a_call_cancelled_before_its_thread_starts_returns_without_running_it() -> None:
    # trio checks for a cancellation before it starts the thread: the job never runs, and the
    # wait for it to finish spun for ever (a daemon stopped as a snapshot began never exited)
    ran: list[int] = []
    returned = threading.Event()

    async def cancelled_first() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            await _interruptible(duckdb.connect(), lambda: ran.append(1))
        assert scope.cancelled_caught

    def run() -> None:
        trio.run(cancelled_first)
        returned.set()

    # in a thread of its own: before the fix the call never returned, shielded from any deadline
    threading.Thread(target=run, daemon=True).start()
    assert returned.wait(60), "the cancelled call never returned"
    assert ran == []


def config_for(tmp_path: Path) -> Config:
    return Config(store=StoreConfig(path=tmp_path / "refresher.duckdb"))


async def test_run_query_reads_the_store_when_no_daemon_holds_it(tmp_path: Path) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(3)
        await live.fetch_all()
    text = run_query(config_for(tmp_path), "SELECT pages, pages_with_copy FROM freshness_now")
    assert text.splitlines() == [
        "pages  pages_with_copy",
        "-----  ---------------",
        "3      3",
        "(1 row)",
    ]
    con, source = open_for_query(config_for(tmp_path))
    con.close()
    assert source == tmp_path / "refresher.duckdb"
    with pytest.raises(StoreError, match="query failed"):
        run_query(config_for(tmp_path), "SELECT * FROM no_such_view")
    with pytest.raises(StoreError, match="no store"):
        run_query(config_for(tmp_path / "elsewhere"), "SELECT 1")


QUERY = """
import sys
from pathlib import Path
from refresher._config import Config, StoreConfig
from refresher.store._snapshot import run_query
from refresher._errors import StoreError
try:
    print(run_query(Config(store=StoreConfig(path=Path(sys.argv[1]))), sys.argv[2]), end="")
except StoreError as e:
    print("error:", e)
"""


def query_in_another_process(store: Path, sql: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", QUERY, str(store), sql],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


async def test_run_query_falls_back_to_the_snapshot_while_the_store_is_held(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(2)
        await live.fetch_all()
        sql = "SELECT count(*) AS n FROM fetches"
        out = await trio.to_thread.run_sync(query_in_another_process, live.path, sql)
        assert out.startswith("error:") and "snapshot.interval" in out
        await Snapshotter(
            store=live.service, path=tmp_path / "snapshot.duckdb", interval=0
        ).write_now()
        out = await trio.to_thread.run_sync(query_in_another_process, live.path, sql)
        assert out.splitlines()[2] == "2"


def test_format_table_aligns_columns_and_shows_nulls() -> None:
    text = format_table(["a", "long_name"], [(1, None), (22.5, "x")])
    assert text == "a     long_name\n----  ---------\n1     NULL\n22.5  x\n(2 rows)\n"
    assert format_table([], []) == ""


def test_the_snapshot_lives_beside_the_store_by_default(tmp_path: Path) -> None:
    assert snapshot_path(config_for(tmp_path)) == tmp_path / "snapshot.duckdb"


# -- end to end: a real daemon process ----------------------------------------------------------

HAS_SNAPSHOT_CONFIG = hasattr(Config(), "snapshot")


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_SNAPSHOT_CONFIG,
    reason="the daemon does not run the Snapshotter yet: Config has no [snapshot] section",
)
async def test_a_live_daemon_publishes_snapshots_that_queries_can_read(
    site: tuple[Site, int], short_dir: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    s, port = site
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        snapshot={"interval": 0.3},
    )
    daemon = daemons(config)
    await daemon.ready()
    cfg = load_config(config)
    path = snapshot_path(cfg)
    store = cfg.store.path

    def snapshot_fetches() -> int:
        # In this process, quick: the site's server shares this event loop.
        if not path.exists():
            return 0
        con = duckdb.connect(str(path), read_only=True)
        try:
            return int(con.execute("SELECT count(*) FROM fetches").fetchall()[0][0])
        finally:
            con.close()

    first = await wait_for(snapshot_fetches, what="a snapshot with fetches while the daemon runs")
    seen = await trio.to_thread.run_sync(read_in_another_process, path, store)
    assert "lock" in seen["store"].lower()  # the daemon holds the store all along
    assert seen["now"][0] >= len(s.urls())
    # the daemon keeps crawling and the snapshot keeps up
    await wait_for(lambda: snapshot_fetches() > first, what="a newer snapshot")
    out = await trio.to_thread.run_sync(
        query_in_another_process, store, "SELECT pages_with_copy > 0 AS ok FROM freshness_now"
    )
    assert out.splitlines()[2] == "True", out
    assert daemon.proc.poll() is None


async def test_a_stopped_snapshotter_leaves_the_snapshot_and_removes_its_staging_file(
    tmp_path: Path,
) -> None:
    async with live_store(tmp_path / "refresher.duckdb") as live:
        await live.add_pages(2)
        await live.fetch_all()
        snap = Snapshotter(store=live.service, path=tmp_path / "snapshot.duckdb", interval=60)
        async with trio.open_nursery() as nursery:
            await nursery.start(snap.run)
            await wait_for(lambda: snap.statistics().snapshots == 1, what="the first snapshot")
            assert snap.staging.exists()
            nursery.cancel_scope.cancel()
        assert snap.path.exists()
        assert not snap.staging.exists()
