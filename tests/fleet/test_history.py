"""The fleet's history: nodes publish their fetch records from PostgreSQL to Parquet, exactly
once, and `refresher query --fleet` runs one node's views over all of it plus the tail."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import psycopg
import pytest

from refresher._errors import StoreError
from refresher.ops._cli import main
from refresher.store._duckdb import DuckDBStore
from refresher.store._parquet import READER_GRACE, HistoryPublisher, open_fleet_query
from refresher.store._pg_schema import init_fleet
from refresher.store._views import create_views

T0 = 20_718 * 86_400.0 - 3_000.0  # 50 minutes before a UTC midnight: the history spans two days
NODES = ("n-1", "n/2")  # the second needs quoting in a path


def _history(
    seed: int = 1, pages: int = 40, fetches: int = 600
) -> dict[str, list[tuple[Any, ...]]]:
    rng = np.random.default_rng(seed)
    hosts = [(h + 1, f"h{h}.test", h % 4, "http") for h in range(6)]
    page_rows = []
    for p in range(pages):
        rate = None if p % 3 == 0 else float(rng.uniform(1e-5, 1e-3))
        page_rows.append((p + 1, f"http://h{p % 6}.test/p{p}", p % 6 + 1, p % 4, T0, T0, rate))
    fetch_rows = []
    at = T0
    for i in range(fetches):
        at += float(rng.exponential(10.0))
        page = int(rng.integers(0, pages))
        status = 200 if rng.random() < 0.9 else 503
        fp = int(rng.integers(-(2**63), 2**63 - 1))
        fetch_rows.append(
            (
                i + 1,  # id
                page + 1,
                page % 6 + 1,
                at - 0.2,
                at,
                0.2,
                status,
                100 + i,
                bytes([i % 256, 7]),
                bool(rng.random() < 0.3) and status == 200,
                False,
                None if status == 200 else "http",
                "optimal",
                None,
                0,
                None,
                fp,
                None,
                NODES[(page % 6) % 2],  # whole hosts to one node
                1,
                page % 4,
            )
        )
    return {"hosts": hosts, "pages": page_rows, "fetches": fetch_rows}


FETCH_COLS = (
    "id, page_id, host_id, started_at, finished_at, duration, status, bytes, digest, changed,"
    " not_modified, error_kind, policy, final_url, redirects, meaningful, fingerprint,"
    " last_modified_at, node_id, epoch, partition"
)


def _load_pg(dsn: str, h: dict[str, list[tuple[Any, ...]]]) -> None:
    init_fleet(dsn, partitions=4)
    with psycopg.connect(dsn) as con, con.cursor() as cur:
        cur.executemany(
            "INSERT INTO hosts (id, name, partition, scheme) VALUES (%s,%s,%s,%s)", h["hosts"]
        )
        cur.executemany(
            "INSERT INTO pages (id, url, host_id, partition, first_seen, due_at, rate)"
            " VALUES (%s,%s,%s,%s,%s,%s,%s)",
            h["pages"],
        )
        cur.execute("INSERT INTO policy_periods VALUES (%s, 'optimal', 2.0)", (T0,))
        with cur.copy(f"COPY fetches ({FETCH_COLS}) FROM STDIN") as copy:
            for row in h["fetches"]:
                copy.write_row(row)


def _load_duckdb(path: Path, h: dict[str, list[tuple[Any, ...]]]) -> duckdb.DuckDBPyConnection:
    DuckDBStore(path).close()
    con = duckdb.connect(str(path))
    con.executemany(
        "INSERT INTO hosts (id, name, scheme) VALUES (?, ?, ?)",
        [(i, n, s) for i, n, _, s in h["hosts"]],
    )
    con.executemany(
        "INSERT INTO pages (id, url, host_id, first_seen, due_at, rate) VALUES (?,?,?,?,?,?)",
        [(i, u, hid, fs, due, r) for i, u, hid, _, fs, due, r in h["pages"]],
    )
    con.execute("INSERT INTO policy_periods VALUES (?, 'optimal', 2.0)", [T0])
    con.executemany(
        "INSERT INTO fetches (id, page_id, host_id, started_at, finished_at, duration, status,"
        " bytes, digest, changed, not_modified, error_kind, policy, final_url, redirects,"
        " meaningful, fingerprint, last_modified_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [(*r[:16], r[16] % 2**64, r[17]) for r in h["fetches"]],
    )
    create_views(con, temporary=True)
    return con


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(_round(v) for v in row) for row in con.execute(sql).fetchall()]


def _round(v: Any) -> Any:
    return round(v, 9) if isinstance(v, float) and math.isfinite(v) else v


def _publish_all(dsn: str, history: Path, rows_per_file: int) -> list[Path]:
    written = []
    for node in NODES:
        pub = HistoryPublisher(dsn, node, history, rows_per_file=rows_per_file, roll_seconds=3600)
        written += pub.publish(force=True)
        pub.close()
    return written


def test_history_written_by_two_nodes_is_queried_as_one(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    h = _history()
    _load_pg(dsn, h)
    written = _publish_all(dsn, history, rows_per_file=120)
    # rolled by size, split at the day's end, one directory per node and day
    days = {p.parent.name for p in written}
    assert days == {"day=2026-09-21", "day=2026-09-22"}  # day 20,718 since 1970 is 09-22
    assert {p.parent.parent.name for p in written} == {"node=n-1", "node=n%2F2"}
    assert all(p.name.startswith("fetches-") for p in written)
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    by_node = dict(_rows(con, "SELECT node_id, count(*) FROM fetches GROUP BY ALL"))
    assert by_node == {n: sum(1 for r in h["fetches"] if r[18] == n) for n in NODES}
    con.close()
    # and the stock recipe reads the same files
    plain = duckdb.connect()
    got = plain.execute(
        f"SELECT node, count(*) FROM read_parquet('{history}/**/*.parquet',"
        " hive_partitioning = true) GROUP BY ALL ORDER BY node"
    ).fetchall()
    assert sum(n for _, n in got) == 600
    with psycopg.connect(dsn) as pg:  # published rows leave PostgreSQL
        assert pg.execute("SELECT count(*) FROM fetches").fetchone() == (0,)


def test_the_tail_and_the_parquet_together_count_each_fetch_once(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    h = _history(seed=2)
    _load_pg(dsn, h)
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=1000, roll_seconds=3600)
    assert not pub.due(now=T0)  # neither big nor old enough for a file yet
    assert pub.due(now=T0 + 4000)  # its oldest row old enough
    pub.close()
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=50, roll_seconds=3600)
    first = pub.publish(now=T0)  # only while there is a full file's worth
    pub.close()
    assert first
    with psycopg.connect(dsn) as pg:
        left = pg.execute(
            "SELECT count(*) FROM fetches f JOIN published p USING (node_id)"
            " WHERE node_id = %s AND f.id > p.through_id",
            (NODES[0],),
        )
        assert left.fetchone()[0] < 50  # less than a file stays in the tail
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    con.close()


def test_a_crash_between_the_rename_and_the_commit_leaves_a_stray_that_never_counts(
    postgres: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=3))
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=80, roll_seconds=0)

    def crash(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("killed after the rename")

    monkeypatch.setattr(HistoryPublisher, "_commit", crash)
    with pytest.raises(SystemExit):
        pub.publish(force=True)
    pub.close()
    monkeypatch.undo()
    files = sorted(history.rglob("*.parquet"))
    assert len(files) == 1
    # not in the manifest: readers ignore it, the rows come from the tail
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    con.close()
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=80, roll_seconds=0)
    assert pub.repair() == 1  # the stray goes; its rows are published again
    assert not files[0].exists()
    pub.publish(force=True)
    pub.close()
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    in_files = _rows(con, f"SELECT count(*) FROM read_parquet('{history}/**/*.parquet')")
    tail = sum(1 for r in _history(seed=3)["fetches"] if r[18] == NODES[1])
    assert in_files == [(600 - tail,)]
    con.close()


def test_two_publishers_of_one_node_publish_each_fetch_exactly_once(
    postgres: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that comes back while another publishes its tail: whoever commits first wins,
    the other's file is refused and removed, readers count every fetch once."""
    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=7))
    adopter = HistoryPublisher(dsn, NODES[0], history, rows_per_file=100, roll_seconds=0)
    returned = HistoryPublisher(dsn, NODES[0], history, rows_per_file=60, roll_seconds=0)
    commit = HistoryPublisher._commit
    raced: list[Path] = []

    def slow_commit(self: HistoryPublisher, cur: Any, **kw: Any) -> None:
        if self is adopter and not raced:  # the node publishes between the adopter's write
            raced.extend(returned.publish(force=True))  # and its commit
        commit(self, cur, **kw)

    monkeypatch.setattr(HistoryPublisher, "_commit", slow_commit)
    first = adopter.publish(force=True)
    monkeypatch.undo()
    assert raced and first == []  # the adopter's commit was refused
    assert adopter.statistics().refused == 1
    assert sorted(history.rglob("*.parquet")) == sorted(raced)  # its file removed
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    con.close()
    adopter.close()
    returned.close()


def _beat(dsn: str, node: str, age: float) -> None:
    with psycopg.connect(dsn) as con:
        con.execute(
            "INSERT INTO nodes (node_id, started_at, heartbeat_at) VALUES"
            " (%s, 0, extract(epoch FROM clock_timestamp()) - %s)",
            (node, age),
        )


def test_a_node_absent_too_long_has_its_tail_published_by_a_live_one_under_its_id(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    h = _history(seed=8)
    _load_pg(dsn, h)
    _beat(dsn, NODES[0], age=5.0)  # live a moment ago
    _beat(dsn, NODES[1], age=120.0)  # gone for two minutes
    live = HistoryPublisher(dsn, "live", history, rows_per_file=100, roll_seconds=3600)
    assert live.absent_nodes(60.0) == [NODES[1]]
    done = live.publish_absent(60.0)
    gone = sum(1 for r in h["fetches"] if r[18] == NODES[1])
    assert done == {NODES[1]: gone}
    assert live.statistics().absent_rows == gone
    assert live.publish_absent(60.0) == {}  # nothing left of it
    live.close()
    assert {p.parent.parent.name for p in history.rglob("*.parquet")} == {"node=n%2F2"}
    with psycopg.connect(dsn) as pg:
        tail = dict(pg.execute("SELECT node_id, count(*) FROM fetches GROUP BY 1").fetchall())
        assert tail == {NODES[0]: 600 - gone}  # the live node's tail is its own to publish
    con = open_fleet_query(dsn, history)
    assert _rows(con, "SELECT count(*), count(DISTINCT id) FROM fetches") == [(600, 600)]
    con.close()


def test_a_reader_without_the_shared_directory_is_told_to_set_it(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=9))
    _publish_all(dsn, history, rows_per_file=1000)
    with pytest.raises(StoreError, match=r"set fleet\.history_dir"):
        open_fleet_query(dsn, None)
    with pytest.raises(StoreError, match=r"not under .* on this machine"):
        open_fleet_query(dsn, tmp_path / "elsewhere")


VIEWS = (
    "SELECT * FROM fetch_log ORDER BY finished_at",
    "SELECT * FROM page_rates ORDER BY page_id",
    "SELECT * FROM page_freshness_now ORDER BY page_id",
    "SELECT * FROM freshness_now",
    "SELECT * FROM freshness_by_policy",
    "SELECT * FROM freshness_by_host ORDER BY host",
    f"SELECT * FROM freshness_series({T0}, {T0 + 5000}, 600) ORDER BY ALL",
    "SELECT * FROM history_span",
)


def test_the_views_answer_as_on_one_nodes_duckdb_for_the_same_fetches(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    h = _history(seed=4)
    _load_pg(dsn, h)
    pub = HistoryPublisher(dsn, NODES[1], history, rows_per_file=70, roll_seconds=0)
    pub.publish(force=True)  # one node published, the other's rows still in the tail
    pub.close()
    single = _load_duckdb(tmp_path / "one.duckdb", h)
    fleet = open_fleet_query(dsn, history)
    for sql in VIEWS:
        assert _rows(fleet, sql) == _rows(single, sql), sql
    fleet.close()
    single.close()


def test_refresher_query_fleet_runs_sql_over_the_fleets_history(
    postgres: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=5))
    _publish_all(dsn, history, rows_per_file=1000)
    config = tmp_path / "r.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path}/r.duckdb"\n'
        f"[fleet]\ndsn = {dsn!r}\nnode_id = 'n-1'\npartitions = 4\n"
        f"history_dir = {str(history)!r}\n"
    )
    code = main(
        ["query", "--fleet", "--config", str(config), "SELECT count(*) AS n FROM fetch_log"]
    )
    assert code == 0
    assert "600" in capsys.readouterr().out


async def test_the_history_service_repairs_then_rolls_the_tail_as_it_comes_due(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    import trio

    from refresher.fleet import HistoryService
    from tests.conftest import wait_for

    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=6))
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=100, roll_seconds=0)
    service = HistoryService(pub, interval=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await wait_for(lambda: service.statistics().rows > 0 and not pub.due())
        nursery.cancel_scope.cancel()
    pub.close()
    with psycopg.connect(dsn) as pg:
        left = pg.execute(
            "SELECT count(*) FROM fetches f JOIN published p USING (node_id)"
            " WHERE node_id = %s AND f.id > p.through_id",
            (NODES[0],),
        )
        assert left.fetchone() == (0,)


def test_history_retention_drops_whole_old_days_and_the_old_tail_exported_first(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    from refresher.store._pg_retention import FleetHistoryRetention

    dsn, history, export = postgres(), tmp_path / "history", tmp_path / "old"
    h = _history(seed=10)
    _load_pg(dsn, h)
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=100, roll_seconds=0)
    pub.publish(force=True)  # one node published; the other's rows stay in the tail
    pub.close()
    midnight = 20_718 * 86_400.0
    retention = FleetHistoryRetention(dsn=dsn, seconds=60.0, history_dir=history, export_dir=export)
    cutoff = midnight + 60.0  # one minute into 09-22
    in_files = sum(1 for r in h["fetches"] if r[18] == NODES[0] and r[4] < midnight)
    in_tail = sum(1 for r in h["fetches"] if r[18] == NODES[1] and r[4] < cutoff)
    removed, where = retention.apply(cutoff + 60.0)
    assert removed == in_files + in_tail and where == str(export)
    # the whole day left the manifest; its files stay a while for readers that listed them
    assert (history / "node=n-1" / "day=2026-09-21").exists()
    assert {p.parent.relative_to(export).as_posix() for p in export.rglob("day=*/*")} == {
        "node=n-1/day=2026-09-21"
    }
    con = open_fleet_query(dsn, history)
    assert _rows(con, f"SELECT count(*), min(finished_at) >= {midnight} FROM fetches") == [
        (600 - removed, True)
    ]
    con.close()
    # what went is in the export: the day's files as they were, the tail's rows in one file
    plain = duckdb.connect()
    (exported,) = plain.execute(
        f"SELECT count(*) FROM read_parquet('{export}/**/*.parquet', union_by_name = true)"
    ).fetchone()
    assert exported == removed
    assert retention.apply(cutoff + 60.0) == (0, None)  # nothing older left
    retention.apply(cutoff + 60.0 + READER_GRACE)  # (and the tail's next hour)
    assert not (history / "node=n-1" / "day=2026-09-21").exists()  # deleted a grace later


def test_a_query_that_listed_a_day_before_a_retention_pass_still_reads_it(
    postgres: Callable[..., str], tmp_path: Path
) -> None:
    from refresher.store._pg_retention import FleetHistoryRetention

    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=10))
    _publish_all(dsn, history, rows_per_file=100)
    midnight = 20_718 * 86_400.0
    retention = FleetHistoryRetention(dsn=dsn, seconds=60.0, history_dir=history)
    con = open_fleet_query(dsn, history)  # its snapshot lists the first day's files
    removed, _ = retention.apply(midnight + 120.0)
    assert removed > 0
    assert _rows(con, "SELECT count(*) FROM fetch_log") == [(600,)]
    con.close()
    later = open_fleet_query(dsn, history)  # a snapshot after the pass: without that day
    assert _rows(later, "SELECT count(*) FROM fetch_log") == [(600 - removed,)]
    later.close()
    # a node's start-up repair leaves them too: they are retired, not strays
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=100, roll_seconds=0)
    assert pub.repair() == 0
    pub.close()
    assert retention.apply(midnight + 120.0 + READER_GRACE) == (0, None)
    assert not list(history.glob("node=*/day=2026-09-21"))
