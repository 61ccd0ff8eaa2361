"""Querying the history while the daemon runs: a consistent snapshot file, refreshed periodically.

DuckDB lets one process open a database file, and the daemon holds the store, so no other
process may open it, not even read-only. The daemon therefore publishes a copy,
``snapshot.duckdb`` beside the store, that any stock ``duckdb`` CLI or client opens read-only
while the daemon runs::

    duckdb -readonly var/snapshot.duckdb "SELECT * FROM freshness_now"

How a snapshot is made (every ``snapshot.interval`` seconds, and by :meth:`Snapshotter.write_now`):

1. A second connection to the store's database (``StoreService.cursor()``, made in the store
   thread) reads inside one transaction, so every table is seen at one commit point: MVCC lets the
   store thread keep committing batches meanwhile; the store's queue never waits for a snapshot.
2. It writes into a private *staging* file, ``snapshot.staging.duckdb``, attached to the same
   database instance: ``fetches`` (append-only, ids increasing in commit order) is copied
   incrementally, the new ids only; the other tables are small next to it and are replaced
   whole. The first snapshot of a daemon process rebuilds the staging file from nothing (so a
   schema migration or a foreign file never leaks in) and creates the freshness views and
   macros of :mod:`refresher.store._views` in it, plus the store's own views (``fetch_log``).
3. After ``DETACH`` (which checkpoints it: no WAL remains), the staging file is copied to
   ``snapshot.duckdb.tmp``, synced and renamed over ``snapshot.duckdb`` (``os.replace``, atomic).
   A reader that opened the old file keeps reading the old inode, whole and unchanged; one that
   opens the path gets the old or the new file, never half of one. The staging file cannot be
   published by rename itself: the next snapshot appends to it. When the snapshotter stops
   (the daemon stops) the staging file is deleted; ``snapshot.duckdb`` stays.

Parquet segments were the alternative: readers would have to glob the segments and create the
views themselves, and one reader would see a fetch segment newer than the pages file. One
DuckDB file carries its views and one commit point.

Staleness: a snapshot holds every fetch acknowledged when its transaction began. A reader is
behind the daemon by at most ``snapshot.interval + the snapshot's duration +
store.flush_interval`` seconds (the table ``snapshot_info`` says when its data was read). Cost:
the incremental copy is proportional to the new fetches plus the pages, hosts and periods; the
file copy to the file's size (about 30 bytes per fetch).

Open the snapshot read-only: a read-write open would leave a WAL that the next published file
must not inherit (the publisher deletes a stale one). Its macros refer to tables by bare name,
so open the snapshot as the main database, not by ``ATTACH``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import trio

from refresher._config import Config
from refresher._errors import RefresherError, StoreError
from refresher.ops._logging import get_logger
from refresher.store._duckdb import StoreService, first_row
from refresher.store._views import attach_truth, create_views

__all__ = [
    "DEFAULT_SNAPSHOT_NAME",
    "SnapshotStatistics",
    "Snapshotter",
    "open_for_query",
    "query_table",
    "run_query",
    "snapshot_path",
]

log = get_logger("snapshot")
T = TypeVar("T")

#: The snapshot's file name beside the store, unless ``snapshot.path`` says otherwise.
DEFAULT_SNAPSHOT_NAME = "snapshot.duckdb"

#: Append-only tables copied incrementally, by the column that grows with each commit.
#: Retention deletes from them: :meth:`Snapshotter.rebuild_next` after it.
_APPEND_ONLY = {"fetches": "id", "warc_records": "id"}

_ALIAS = "rf_snapshot"


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotStatistics:
    #: snapshots published by this process
    snapshots: int = field(metadata={"metric": "counter"})
    #: snapshots that failed (the previous one stays published)
    failures: int = field(metadata={"metric": "counter"})
    #: snapshots that rebuilt the staging file from nothing
    rebuilds: int = field(metadata={"metric": "counter"})
    #: seconds the last snapshot took, reading to publishing
    last_seconds: float
    #: unix seconds at which the last published snapshot read the store; 0 before the first
    last_at: float
    #: rows of the last snapshot's fetches and pages
    fetches: int
    pages: int
    #: bytes of the last published file
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _Built:
    taken_at: float
    fetches: int
    pages: int
    rebuilt: bool


def snapshot_path(config: Config) -> Path:
    """The snapshot file of ``config``: ``snapshot.path`` if the config has one, else beside the
    store."""
    section = getattr(config, "snapshot", None)  # the [snapshot] section, once configured
    configured = getattr(section, "path", None)
    if isinstance(configured, Path):
        return configured
    return config.store.path.parent / DEFAULT_SNAPSHOT_NAME


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


class Snapshotter:
    """Publishes a consistent, read-only copy of the store every ``interval`` seconds.

    ``path`` is the published file; ``interval`` 0 (or less) means :meth:`run` does nothing,
    while :meth:`write_now` still works.
    """

    def __init__(
        self,
        *,
        store: StoreService,
        path: Path,
        interval: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.path = path
        self.interval = interval
        self._wall = wall_clock
        self.staging = path.with_name(f"{path.stem}.staging{path.suffix}")
        self._tmp = path.with_name(f"{path.name}.tmp")
        self._lock = trio.Lock()
        self._fresh_staging = False  # True once this process has rebuilt the staging file
        self._snapshots = 0
        self._failures = 0
        self._rebuilds = 0
        self._last_seconds = 0.0
        self._last_at = 0.0
        self._fetches = 0
        self._pages = 0
        self._bytes = 0

    def statistics(self) -> SnapshotStatistics:
        return SnapshotStatistics(
            snapshots=self._snapshots,
            failures=self._failures,
            rebuilds=self._rebuilds,
            last_seconds=self._last_seconds,
            last_at=self._last_at,
            fetches=self._fetches,
            pages=self._pages,
            bytes=self._bytes,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish a snapshot now and then every ``interval`` seconds after the last one ended.

        A failed snapshot is logged and counted; the previous file stays published.
        """
        task_status.started()
        if self.interval <= 0:
            return
        try:
            while True:
                with contextlib.suppress(RefresherError, OSError):
                    await self.write_now()  # failures are logged and counted there
                await trio.sleep(self.interval)
        finally:
            self.remove_staging()

    def remove_staging(self) -> None:
        """Delete the staging file: the next process rebuilds it from nothing anyway, so on a
        stop it is only dead weight beside the published snapshot, which stays."""
        for name in (self.staging, self.staging.with_name(self.staging.name + ".wal")):
            # missing, or a path that cannot be a file: nothing to remove
            with contextlib.suppress(OSError):
                name.unlink()

    async def rebuild_next(self) -> None:
        """Make the next snapshot start from nothing: rows of a table copied incrementally were
        deleted or changed (archive and history retention)."""
        async with self._lock:
            self._fresh_staging = False

    async def write_now(self) -> Path:
        """Publish a snapshot holding every fetch queued before this call; returns its path.

        Raises :class:`StoreError` (or ``OSError`` from the file system) when it cannot.
        """
        async with self._lock:
            t0 = time.perf_counter()
            try:
                # Through the store's queue: what was queued before is committed first.
                con = await self.store.cursor()
                try:
                    built = await _interruptible(con, lambda: self._build(con))
                finally:
                    con.close()
                size = await trio.to_thread.run_sync(self._publish)
            except (RefresherError, OSError) as e:
                self._failures += 1
                self._fresh_staging = False  # start over from nothing next time
                log.warning(
                    "snapshot failed; the previous one stays published",
                    path=str(self.path),
                    error=str(e),
                    hint="check the disk space and permissions of the snapshot's directory",
                )
                raise
            self._snapshots += 1
            self._rebuilds += built.rebuilt
            self._last_seconds = time.perf_counter() - t0
            self._last_at = built.taken_at
            self._fetches, self._pages, self._bytes = built.fetches, built.pages, size
            log.debug(
                "snapshot published",
                path=str(self.path),
                seconds=round(self._last_seconds, 3),
                fetches=built.fetches,
                rebuilt=built.rebuilt,
            )
            return self.path

    # -- in a worker thread ---------------------------------------------------------------

    def _build(self, con: duckdb.DuckDBPyConnection) -> _Built:
        rebuild = not self._fresh_staging or not self.staging.exists()
        if rebuild:
            self.staging.parent.mkdir(parents=True, exist_ok=True)
            for stale in (self.staging, self.staging.with_name(self.staging.name + ".wal")):
                stale.unlink(missing_ok=True)
        store_db = str(_scalar(con, "SELECT current_database()"))
        src = _quote(store_db)
        try:
            con.execute(f"ATTACH {_literal(self.staging)} AS {_ALIAS}")
        except duckdb.Error as e:
            raise StoreError(
                f"cannot create the snapshot staging file {str(self.staging)!r}: {e}"
            ) from e
        try:
            try:
                con.execute("BEGIN")
                taken_at = self._wall()
                tables = [
                    str(r[0])
                    for r in con.execute(
                        "SELECT table_name FROM duckdb_tables()"
                        " WHERE database_name = ? AND schema_name = 'main' ORDER BY table_name",
                        [store_db],
                    ).fetchall()
                ]
                for table in tables:
                    self._copy_table(con, src, table, incremental=not rebuild)
                con.execute(
                    f"CREATE OR REPLACE TABLE {_ALIAS}.snapshot_info AS SELECT"
                    " CAST(? AS DOUBLE) AS taken_at, CAST(? AS VARCHAR) AS store,"
                    f" (SELECT count(*) FROM {_ALIAS}.fetches) AS fetches,"
                    f" (SELECT count(*) FROM {_ALIAS}.pages) AS pages",
                    [taken_at, store_db],
                )
                row = first_row(con.execute(f"SELECT fetches, pages FROM {_ALIAS}.snapshot_info"))
                con.execute("COMMIT")
            except duckdb.Error:
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
                raise
            if rebuild:
                self._create_views(con, store_db)
            con.execute(f"CHECKPOINT {_ALIAS}")
        except duckdb.Error as e:
            raise StoreError(f"writing the snapshot {str(self.staging)!r}: {e}") from e
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute(f"DETACH {_ALIAS}")
        self._fresh_staging = True
        assert row is not None
        return _Built(taken_at=taken_at, fetches=int(row[0]), pages=int(row[1]), rebuilt=rebuild)

    def _copy_table(
        self, con: duckdb.DuckDBPyConnection, src: str, table: str, *, incremental: bool
    ) -> None:
        name = _quote(table)
        key = _APPEND_ONLY.get(table)
        if incremental and key is not None:
            last = _scalar(con, f"SELECT coalesce(max({key}), -1) FROM {_ALIAS}.{name}")
            con.execute(
                f"INSERT INTO {_ALIAS}.{name} BY NAME"
                f" SELECT * FROM {src}.{name} WHERE {key} > ? ORDER BY {key}",
                [last],
            )
        else:
            order = f" ORDER BY {key}" if key is not None else ""
            con.execute(
                f"CREATE OR REPLACE TABLE {_ALIAS}.{name} AS SELECT * FROM {src}.{name}{order}"
            )

    def _create_views(self, con: duckdb.DuckDBPyConnection, store_db: str) -> None:
        # The store's own views (fetch_log) first, then the freshness views over the copies.
        views = con.execute(
            "SELECT sql FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main'"
            " AND NOT internal AND NOT temporary",
            [store_db],
        ).fetchall()
        con.execute(f"USE {_ALIAS}")
        try:
            for (sql,) in views:
                text = str(sql).strip().rstrip(";")
                if text.upper().startswith("CREATE VIEW"):
                    text = "CREATE OR REPLACE VIEW" + text[len("CREATE VIEW") :]
                con.execute(text)
        finally:
            con.execute(f"USE {_quote(store_db)}")
        create_views(con, schema=_ALIAS)

    def _publish(self) -> int:
        with self.staging.open("rb") as source, self._tmp.open("wb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
            target.flush()
            os.fsync(target.fileno())
        # A WAL left by someone who opened the published file read-write belongs to the old
        # file; DuckDB would replay it against the new one.
        self.path.with_name(self.path.name + ".wal").unlink(missing_ok=True)
        os.replace(self._tmp, self.path)
        with contextlib.suppress(OSError):
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)  # the rename itself survives a crash
            finally:
                os.close(fd)
        return self.path.stat().st_size


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> Any:
    row = first_row(con.execute(sql, list(params)))
    return row[0] if row else None


class _GivenUp(Exception):
    """A thread of :func:`_interruptible` that began after its caller gave it up."""


async def _interruptible(con: duckdb.DuckDBPyConnection, fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread; on cancellation interrupt DuckDB and wait for the thread.

    Shutdown must not wait for a long copy, and must not leave a thread using the store's
    database after the store closes.
    """
    finished = threading.Event()
    lock = threading.Lock()
    started = given_up = False

    def job() -> T:
        nonlocal started
        with lock:
            if given_up:  # the caller was cancelled before this thread began: nothing to do
                raise _GivenUp
            started = True
        try:
            return fn()
        finally:
            finished.set()

    try:
        return await trio.to_thread.run_sync(job, abandon_on_cancel=True)
    except trio.Cancelled:
        with lock:
            given_up = True
            running = started
        # Cancelled before the thread began (trio checks before it starts one), ``fn`` never
        # runs. Else: an interrupt that lands before the thread's query starts is lost, so it
        # is repeated until the thread is done.
        with trio.CancelScope(shield=True):
            while running and not finished.is_set():
                con.interrupt()
                await trio.to_thread.run_sync(finished.wait, 0.05)
        raise


# -- queries from outside the daemon ----------------------------------------------------------


def open_for_query(
    config: Config, *, truth: Path | None = None
) -> tuple[duckdb.DuckDBPyConnection, Path]:
    """A read-only connection with the freshness views, and the file it reads.

    The store itself when no daemon holds it (its views are made TEMP), else the snapshot.
    ``truth`` attaches a simulated web's truth (see :func:`refresher.store._views.attach_truth`).
    """
    store_path = config.store.path
    if not store_path.exists():
        raise StoreError(f"no store at {str(store_path)!r}; fix store.path or run the daemon")
    con: duckdb.DuckDBPyConnection | None = None
    source = store_path
    try:
        con = duckdb.connect(str(store_path), read_only=True)
    except duckdb.Error as e:
        if "lock" not in str(e).lower():
            raise StoreError(f"cannot open the store {str(store_path)!r}: {e}") from e
    if con is not None:
        create_views(con, temporary=True)
    else:
        source = snapshot_path(config)
        if not source.exists():
            raise StoreError(
                f"a running daemon holds {str(store_path)!r} and there is no snapshot at "
                f"{str(source)!r}; set snapshot.interval above 0 and wait one interval"
            )
        try:
            con = duckdb.connect(str(source), read_only=True)
        except duckdb.Error as e:
            raise StoreError(f"cannot open the snapshot {str(source)!r}: {e}") from e
    if truth is not None:
        try:
            attach_truth(con, truth)
        except StoreError:
            con.close()
            raise
    return con, source


def run_query(config: Config, sql: str, *, truth: Path | None = None) -> str:
    """Run ``sql`` against the store (no daemon) or its snapshot (daemon running); a text table."""
    con, source = open_for_query(config, truth=truth)
    return query_table(con, sql, source)


def query_table(con: duckdb.DuckDBPyConnection, sql: str, source: object) -> str:
    """Run ``sql`` on ``con`` (closed afterwards) as a text table; errors name ``source``."""
    try:
        try:
            cur = con.execute(sql)
            columns = [str(d[0]) for d in cur.description or ()]
            rows = cur.fetchall() if columns else []
        except duckdb.Error as e:
            raise StoreError(
                f"the query failed on {str(source)!r}: {e}; the views are listed by "
                "SELECT view_name FROM duckdb_views() WHERE NOT internal"
            ) from e
    finally:
        con.close()
    return format_table(columns, rows)


def _cell(v: Any) -> str:
    """A value as text: NULL for missing; a float to 6 significant digits, but to the
    millisecond when it has more integer digits (unix seconds stay exact enough to join on)."""
    if v is None:
        return "NULL"
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        whole = max(int(math.log10(abs(v))) + 1, 0)
        return f"{v:.{max(6, whole + 3)}g}"
    return str(v)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns, a header rule and a row count; NULL for missing values."""
    if not columns:
        return ""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines) + "\n"
