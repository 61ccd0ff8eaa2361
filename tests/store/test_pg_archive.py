"""A fleet's copy: each node's retention over its own WARC files, decided on the fleet's index;
the fleet's history retention over Parquet days and the tail; backup and restore."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from refresher.archive._archive import Archive
from refresher.archive._retention import prune_absent, prune_now
from refresher.archive._warc import WarcWriter, scan_file
from refresher.fleet import partition_of
from refresher.store import NewPage
from refresher.store._captures import CaptureRow
from refresher.store._pg_archive import FleetIndex, maintenance_lock, node_files_lock
from refresher.store._pg_leases import PgLeases
from refresher.store._pg_schema import init_fleet
from refresher.store._postgres import PgStore
from tests.archive.test_warc import capture, result

P = 4
T0 = 1_700_000_000.0


def rows(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as con:
        return con.execute(sql, params).fetchall()


class Node:
    """A node's store and WARC writer, in a directory of its own."""

    def __init__(self, dsn: str, name: str, root: Path, leases: PgLeases) -> None:
        self.name, self.directory = name, root / f"node={name}"
        self.store = PgStore(dsn, node_id=name, partitions=P)
        self.store.owned = leases.claim_free(name, P, 1e12, 0.0)  # a takes them all
        self.writer = WarcWriter(
            self.directory, prefix=f"refresher-{name}", min_free_bytes=0, max_file_bytes=4000
        )
        self.store.set_meta("archive_dir", str(self.directory))

    def archive(self, page: int, url: str, versions: range) -> None:
        """``versions`` of page ``page``, each a response and a revisit, indexed as this node's."""
        written: list[CaptureRow] = []
        for v in versions:
            body = f"<html>{url} version {v}</html>".encode() * 20
            r = result(body=body, finished_at=T0 + v)
            c = dataclasses.replace(capture(r), page_id=page, url=url)
            same = dataclasses.replace(capture(r, previous=r.digest), page_id=page, url=url)
            written += [self.writer.write(c), self.writer.write(same)]  # type: ignore[list-item]
        self.store.write([], [], (), self.writer.sync(written))

    def close(self) -> None:
        self.writer.close()
        self.store.close()


@pytest.fixture
def fleet(postgres: Callable[..., str], tmp_path: Path) -> Any:
    dsn = postgres()
    init_fleet(dsn, partitions=P)
    leases = PgLeases(dsn, max_skew=None)
    a = Node(dsn, "a", tmp_path / "archive", leases)
    b = Node(dsn, "b", tmp_path / "archive", leases)
    host = next(f"h{i}.example" for i in range(100) if partition_of(f"h{i}.example", P) == 0)
    pages, _ = a.store.add_pages_with_hosts(
        [NewPage(url=f"http://{host}/{k}", host=host, scheme="http") for k in range(2)], now=T0
    )
    yield dsn, a, b, [p.id for p in pages], [p.url for p in pages]
    a.close()
    b.close()
    leases.close()


def latest(dsn: str, base: Path, urls: list[str]) -> dict[str, bytes]:
    archive = Archive("unused", source=FleetIndex(dsn, base=base))
    return {u: v.body for u in urls if (v := archive.get(u)) is not None}


def test_a_node_prunes_only_its_own_files_keeping_versions_counted_over_the_fleet(fleet):
    dsn, a, b, (x, y), (ux, uy) = fleet
    a.archive(x, ux, range(0, 3))  # x's three older versions on a, its partition moved to b
    b.archive(x, ux, range(3, 5))  # and two newer ones on b
    a.archive(y, uy, range(0, 3))  # y only on a
    b.writer.rotate()
    before = latest(dsn, a.directory.parent, [ux, uy])
    b_files = {p.name: p.read_bytes() for p in b.directory.iterdir()}
    b_rows = rows(dsn, "SELECT id, file, record_offset FROM warc_records WHERE node_id = 'b'")
    a.writer.rotate()
    report = prune_now(a.store, a.directory, keep_versions=2, max_bytes=None)
    # x: all three of a's versions are past the fleet's two newest; y: its oldest; revisits too
    assert report.records == 2 * (3 + 1)
    versions = dict(
        rows(
            dsn,
            "SELECT url, count(*) FROM warc_records WHERE kind = 'response' GROUP BY url",
        )
    )
    assert versions == {ux: 2, uy: 2}
    assert rows(dsn, "SELECT count(*) FROM warc_records WHERE node_id = 'a' AND url = %s", ux) == [
        (0,)
    ]
    # b's files and index rows are b's: untouched
    assert {p.name: p.read_bytes() for p in b.directory.iterdir()} == b_files
    assert (
        rows(dsn, "SELECT id, file, record_offset FROM warc_records WHERE node_id = 'b'") == b_rows
    )
    assert latest(dsn, a.directory.parent, [ux, uy]) == before
    for path in a.directory.glob("*.warc.gz"):
        assert scan_file(path)[1] is None


def test_max_bytes_is_a_nodes_own_disk_and_never_takes_a_pages_latest_version(fleet):
    dsn, a, b, (x, y), (ux, uy) = fleet
    a.archive(x, ux, range(0, 4))
    a.archive(y, uy, range(0, 2))
    b.archive(y, uy, range(2, 3))  # y's latest is on b
    a.writer.rotate()
    before = latest(dsn, a.directory.parent, [ux, uy])
    prune_now(a.store, a.directory, keep_versions=None, max_bytes=1)
    left = rows(dsn, "SELECT node_id, url, kind FROM warc_records ORDER BY 1, 2, 3")
    # on a only x's latest response is left; b's revisit went with nothing (b not pruned)
    assert [r for r in left if r[0] == "a"] == [("a", ux, "response")]
    assert latest(dsn, a.directory.parent, [ux, uy]) == before


def test_a_retention_pass_waits_out_a_fleet_backup(fleet):
    dsn, *_ = fleet
    with maintenance_lock(dsn, exclusive=True), maintenance_lock(dsn) as free:
        assert not free  # a pass skips its round while a backup copies the files
    with maintenance_lock(dsn) as free, maintenance_lock(dsn) as also:
        assert free and also  # passes of several nodes run side by side


def _config(tmp: Path, dsn: str, node: str, **archive: Any) -> Path:
    path = tmp / f"{node}.toml"
    keys = "".join(f"{k} = {v!r}\n" for k, v in archive.items())
    path.write_text(
        f'[store]\npath = "{tmp}/{node}.duckdb"\n[archive]\ndir = "{tmp / "archive"}"\n{keys}'
        f"[fleet]\ndsn = {dsn!r}\nnode_id = {node!r}\npartitions = {P}\n"
    )
    return path


def test_refresher_prune_on_a_fleet_prunes_a_stopped_nodes_files_and_refuses_a_running_one(
    fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from refresher.ops._cli import main

    dsn, a, _b, (x, _y), (ux, _uy) = fleet
    a.archive(x, ux, range(0, 3))
    a.writer.rotate()
    config = _config(tmp_path, dsn, "a", keep_versions=1)
    with psycopg.connect(dsn) as con:  # a is running: its heartbeat is fresh
        con.execute(
            "INSERT INTO nodes (node_id, started_at, heartbeat_at)"
            " VALUES ('a', 0, extract(epoch FROM clock_timestamp()))"
        )
    assert main(["prune", "--config", str(config)]) == 1
    assert "node 'a' is running; it applies archive retention itself" in capsys.readouterr().err
    with psycopg.connect(dsn) as con:  # a stopped
        con.execute("UPDATE nodes SET stopping = true")
    assert main(["prune", "--config", str(config)]) == 0
    assert rows(dsn, "SELECT count(*) FROM warc_records WHERE kind = 'response'") == [(1,)]


def test_the_single_node_commands_say_in_one_line_what_a_fleet_uses_instead(
    fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from refresher.ops._cli import main

    dsn, *_ = fleet
    config = str(_config(tmp_path, dsn, "a"))
    assert main(["query", "SELECT 1", "--config", config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use `refresher query --fleet`" in err
    assert main(["backup", str(tmp_path / "b.duckdb"), "--config", config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`refresher fleet backup DEST`" in err


def _absent(dsn: str, node: str, seconds: float) -> None:
    """``node``'s last heartbeat ``seconds`` ago on the database's clock."""
    with psycopg.connect(dsn) as con:
        con.execute(
            "INSERT INTO nodes (node_id, started_at, heartbeat_at) VALUES (%s, 0,"
            " extract(epoch FROM clock_timestamp()) - %s) ON CONFLICT (node_id)"
            " DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            (node, seconds),
        )


def test_a_live_node_prunes_the_files_of_a_node_absent_too_long_where_it_reaches_them(fleet):
    dsn, a, _, (x, y), (ux, uy) = fleet
    a.archive(x, ux, range(0, 4))
    a.archive(y, uy, range(0, 1))
    a.writer.close()  # a stopped for good
    _absent(dsn, "a", 7200.0)
    _absent(dsn, "b", 0.0)
    base = a.directory.parent
    before = latest(dsn, base, [ux, uy])

    def pass_of_b(absent_after: float = 3600.0) -> list[Any]:
        return prune_absent(
            dsn=dsn,
            node_id="b",
            absent_after=absent_after,
            base=base,
            keep_versions=2,
            max_bytes=None,
        )

    assert pass_of_b(absent_after=10_000.0) == []  # not absent long enough: left alone
    with node_files_lock(dsn, "a") as held:  # a came back and prunes itself meanwhile
        assert held and pass_of_b() == []
    [report] = pass_of_b()
    assert report.records == 2 * 2  # x's two oldest versions, each with its revisit
    assert rows(
        dsn, "SELECT count(*) FROM warc_records WHERE node_id = 'a' AND kind = 'response'"
    ) == [(3,)]
    assert latest(dsn, base, [ux, uy]) == before
    for path in a.directory.glob("*.warc.gz"):
        assert scan_file(path)[1] is None


def test_a_file_a_returned_node_is_appending_to_is_never_pruned_by_another(fleet):
    dsn, a, _, (x, _), (ux, _) = fleet
    a.archive(x, ux, range(2, 5))
    a.writer.rotate()
    a.archive(x, ux, range(0, 2))  # older versions, in a file a holds open again
    _absent(dsn, "a", 7200.0)
    [open_file] = [f for f in a.directory.iterdir() if f.name == a.writer.current_file]
    held = open_file.read_bytes()
    [report] = prune_absent(
        dsn=dsn,
        node_id="b",
        absent_after=3600.0,
        base=a.directory.parent,
        keep_versions=1,
        max_bytes=None,
    )
    assert open_file.read_bytes() == held and report.records == 2 * 2  # versions 2 and 3 only
    assert open_file.name not in {f for f, _ in report.rewritten} | set(report.deleted)
