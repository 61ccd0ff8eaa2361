"""``refresher backup DEST``: a consistent copy of the store, made while the daemon runs.

The copy is one DuckDB transaction over a second connection to the store's database (as the
snapshot does): MVCC shows it every table at one commit point while the store thread keeps
committing. The connection is taken through the store's own queue, so every fetch acknowledged
before the backup was asked for is in it. ``COPY FROM DATABASE`` writes tables, views and macros
into ``DEST.tmp``, which is renamed to ``DEST`` only when whole: a DEST that exists is a
complete backup. Restoring is copying DEST to ``store.path`` with the daemon stopped.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import trio

from refresher._errors import StoreError

if TYPE_CHECKING:
    from refresher.store._duckdb import StoreService

__all__ = ["BackupResult", "backup_connection", "backup_file", "backup_service"]

_ALIAS = "rf_backup"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupResult:
    """What one backup holds."""

    path: str
    pages: int
    fetches: int
    bytes: int  # the backup file's size
    seconds: float  # how long the copy took


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _check_destination(dest: Path) -> Path:
    if dest.exists():
        raise StoreError(f"{str(dest)!r} exists; give a new file name or remove it first")
    if not dest.parent.is_dir():
        raise StoreError(f"no directory {str(dest.parent)!r}; create it or give another DEST")
    tmp = dest.with_name(dest.name + ".tmp")
    for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    return tmp


def backup_connection(con: duckdb.DuckDBPyConnection, dest: Path) -> BackupResult:
    """Copy the database ``con`` reads (its main catalog) to the new file ``dest``.

    ``con`` should be a connection of its own (a cursor): the copy is one transaction on it.
    """
    t0 = time.perf_counter()
    tmp = _check_destination(dest)
    try:
        (source,) = con.execute("SELECT current_database()").fetchone() or ("",)
        con.execute(f"ATTACH {_literal(tmp)} AS {_ALIAS} (READ_WRITE)")
        try:
            con.execute("BEGIN TRANSACTION")
            pages, fetches = con.execute(
                "SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM fetches)"
            ).fetchone() or (0, 0)
            con.execute(f'COPY FROM DATABASE "{source}" TO {_ALIAS}')
            con.execute("COMMIT")
        finally:
            con.execute(f"DETACH {_ALIAS}")
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except duckdb.Error as e:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise StoreError(f"backing up to {str(dest)!r}: {e}; check the disk space") from e
    return BackupResult(
        path=str(dest),
        pages=int(pages),
        fetches=int(fetches),
        bytes=dest.stat().st_size,
        seconds=time.perf_counter() - t0,
    )


async def backup_service(service: StoreService, dest: Path) -> BackupResult:
    """Back up a running daemon's store through its queue; the queue keeps flowing meanwhile."""
    cursor = await service.cursor()
    try:
        return await trio.to_thread.run_sync(backup_connection, cursor, dest)
    finally:
        cursor.close()


def backup_file(store_path: Path, dest: Path) -> BackupResult:
    """Back up a store no daemon holds (opened read-only)."""
    if not store_path.exists():
        raise StoreError(f"no store at {str(store_path)!r}; give the daemon's --store or --config")
    try:
        con = duckdb.connect(str(store_path), read_only=True)
    except duckdb.Error as e:
        raise StoreError(f"cannot open the store {str(store_path)!r}: {e}") from e
    try:
        return backup_connection(con, dest)
    finally:
        con.close()
