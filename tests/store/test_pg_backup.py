"""`refresher fleet backup` and `refresher fleet restore`: pg_dump plus the shared directory,
checked by restoring into a new database and directory and reading the fleet back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from refresher.ops._cli import main
from refresher.store._parquet import HistoryPublisher
from refresher.store._pg_leases import PgLeases
from tests.fleet.test_history import NODES, VIEWS, _history, _load_pg, _rows
from tests.store.test_pg_archive import Node


def config(path: Path, dsn: str, history: Path, node: str = "n-1") -> Path:
    path.write_text(
        f'[store]\npath = "{path.parent}/{node}.duckdb"\n'
        f"[fleet]\ndsn = {dsn!r}\nnode_id = {node!r}\npartitions = 4\n"
        f"history_dir = {str(history)!r}\n"
    )
    return path


def test_a_fleet_backup_restores_to_a_fleet_that_reads_the_same(
    postgres: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from refresher.store._parquet import open_fleet_query

    dsn, history = postgres(), tmp_path / "history"
    _load_pg(dsn, _history(seed=11))
    pub = HistoryPublisher(dsn, NODES[0], history, rows_per_file=90, roll_seconds=0)
    pub.publish(force=True)  # one node's history in Parquet, the other's in the tail
    pub.close()
    leases = PgLeases(dsn, max_skew=None)
    a = Node(dsn, "a", history / "archive", leases)  # a's WARC files in the shared directory
    url = "http://h0.test/p0"  # page 1 of the history
    a.archive(1, url, range(3))
    a.close()
    gone = Node(dsn, "gone", tmp_path / "elsewhere", leases)  # its files stay out of reach
    gone.archive(2, "http://h1.test/p1", range(1))
    gone.close()
    leases.close()
    (tmp_path / "elsewhere").rename(tmp_path / "lost")
    before = open_fleet_query(dsn, history)
    expected = {sql: _rows(before, sql) for sql in VIEWS}
    before.close()

    dest = tmp_path / "backup"
    backing_up = config(tmp_path / "r.toml", dsn, history)
    assert main(["fleet", "backup", str(dest), "--config", str(backing_up)]) == 0
    out, err = capsys.readouterr()
    assert f"backup {dest}: the database, " in out
    assert "node 'gone'" in err and "not reachable" in err
    info = json.loads((dest / "backup.json").read_text())
    assert info["unreachable"] == {"gone": str(tmp_path / "elsewhere" / "node=gone")}
    assert info["warc_files"] == {"a": len(list((history / "archive" / "node=a").iterdir()))}
    assert main(["fleet", "backup", str(dest), "--config", str(backing_up)]) == 1  # exists

    # restore into a new, empty database and another directory
    new_dsn, new_history = postgres(), tmp_path / "restored"
    restoring = config(tmp_path / "new.toml", new_dsn, new_history)
    assert main(["fleet", "restore", str(dest), "--config", str(restoring)]) == 0
    after = open_fleet_query(new_dsn, new_history)
    for sql in VIEWS:
        assert _rows(after, sql) == expected[sql], sql
    after.close()
    got = main(["get", url, "--config", str(restoring)])
    assert got == 0 and f"<html>{url} version 2</html>" in capsys.readouterr().out
    with psycopg.connect(new_dsn) as con:
        noted = con.execute("SELECT value FROM fleet_meta WHERE key = 'archive_dir@a'")
        assert noted.fetchone() == (str((new_history / "archive" / "node=a").resolve()),)
    # and a restore never overwrites a fleet
    assert main(["fleet", "restore", str(dest), "--config", str(restoring)]) == 1
    assert "already holds a fleet" in capsys.readouterr().err
