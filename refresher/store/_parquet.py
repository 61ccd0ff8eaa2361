"""The fleet's history as Parquet, and DuckDB over all of it plus the unpublished tail.

In fleet mode each node's fetch records land in PostgreSQL's ``fetches`` (the tail). A node's
:class:`HistoryPublisher` moves its own rows, oldest first, to Parquet files in the shared
``fleet.history_dir``, hive-partitioned by node and day of ``finished_at`` (UTC)::

    <history_dir>/node=<node id>/day=YYYY-MM-DD/fetches-<first id>-<last id>.parquet

Rolled by size and time: a file is written when the node's tail holds ``rows_per_file`` rows
or its oldest row is ``roll_seconds`` old, so there is no flood of small files; a file never
spans two days (the batch ends where the day changes). Exactly once:

1. the rows after the node's watermark (``published.through_id``), in id order, are copied out
   of PostgreSQL (COPY … TO STDOUT, CSV) and written by DuckDB to a hidden temporary file in
   the target directory, which is synced and renamed to its final name (atomic: a reader sees
   the whole file or none);
2. one transaction then moves the watermark to the last id and deletes the published rows
   from PostgreSQL (the estimator does not read them: it keeps its per-page statistics in
   ``pages``).

A crash between 1 and 2 leaves a file whose id range lies above the watermark. On start,
:meth:`HistoryPublisher.repair` finds it by its name and completes step 2 for it (the rows it
holds are exactly the ones after the watermark up to its last id), so nothing is written twice;
temporary files of an interrupted write are removed. Readers only take a node's Parquet rows up
to its watermark and its PostgreSQL rows above it, so even during that window no fetch counts
twice.

:func:`open_fleet_query` builds an in-memory DuckDB with the same tables and views as one
node's store: ``fetches`` over every Parquet file plus the tail read with psycopg (DuckDB's
postgres extension would need a download), ``pages``, ``hosts``, ``policy_periods`` from
PostgreSQL, ``fetch_log`` and the freshness views of :mod:`refresher.store._views`.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import psycopg

from refresher._errors import StoreError
from refresher.ops._logging import get_logger
from refresher.store._duckdb import FETCH_LOG
from refresher.store._pg_dsn import connect, describe, redact
from refresher.store._pg_session import PgSession
from refresher.store._snapshot import query_table
from refresher.store._views import attach_truth, create_views

if TYPE_CHECKING:
    from refresher._config import Config

__all__ = [
    "FETCH_COLUMNS",
    "HistoryPublisher",
    "PublisherStatistics",
    "node_directory",
    "open_fleet_query",
    "parquet_glob",
    "run_fleet_query",
]

log = get_logger("fleet.history")

#: the columns of a fleet fetch record, in PostgreSQL's ``fetches`` and in the Parquet files,
#: with their DuckDB types
FETCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "BIGINT"),
    ("page_id", "BIGINT"),
    ("host_id", "BIGINT"),
    ("started_at", "DOUBLE"),
    ("finished_at", "DOUBLE"),
    ("duration", "DOUBLE"),
    ("status", "SMALLINT"),
    ("bytes", "BIGINT"),
    ("digest", "BLOB"),
    ("changed", "BOOLEAN"),
    ("not_modified", "BOOLEAN"),
    ("error_kind", "VARCHAR"),
    ("policy", "VARCHAR"),
    ("final_url", "VARCHAR"),
    ("redirects", "SMALLINT"),
    ("meaningful", "BOOLEAN"),
    ("fingerprint", "BIGINT"),  # the simhash's 64 bits as signed, as PostgreSQL keeps them
    ("last_modified_at", "DOUBLE"),
    ("node_id", "VARCHAR"),
    ("epoch", "BIGINT"),
    ("partition", "INTEGER"),
)
_PAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "BIGINT"),
    ("url", "VARCHAR"),
    ("host_id", "BIGINT"),
    ("partition", "INTEGER"),
    ("first_seen", "DOUBLE"),
    ("last_fetch", "DOUBLE"),
    ("last_change", "DOUBLE"),
    ("etag", "VARCHAR"),
    ("last_modified", "VARCHAR"),
    ("digest", "BLOB"),
    ("fetches", "INTEGER"),
    ("changes", "INTEGER"),
    ("rate", "DOUBLE"),
    ("rate_n", "DOUBLE"),
    ("target_rate", "DOUBLE"),
    ("weight", "DOUBLE"),
    ("due_at", "DOUBLE"),
    ("status", "VARCHAR"),
    ("source", "VARCHAR"),
    ("depth", "INTEGER"),
    ("url_fp", "BIGINT"),
    ("fingerprint", "BIGINT"),
    ("meaningful_changes", "INTEGER"),
    ("canonical", "VARCHAR"),
    ("noindex", "BOOLEAN"),
    ("duplicate_of", "BIGINT"),
    ("sitemap_lastmod", "DOUBLE"),
)
_HOST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "BIGINT"),
    ("name", "VARCHAR"),
    ("partition", "INTEGER"),
    ("scheme", "VARCHAR"),
    ("next_allowed", "DOUBLE"),
    ("delay", "DOUBLE"),
    ("backoff", "DOUBLE"),
    ("errors", "INTEGER"),
    ("robots_status", "INTEGER"),
    ("robots_fetched_at", "DOUBLE"),
    ("robots_expires_at", "DOUBLE"),
    ("paused", "BOOLEAN"),
)
_POLICY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("started_at", "DOUBLE"),
    ("policy", "VARCHAR"),
    ("budget", "DOUBLE"),
)
_FILE = re.compile(r"^fetches-(\d+)-(\d+)\.parquet$")
_DAY = 86_400.0


def node_directory(history_dir: Path, node_id: str) -> Path:
    """``<history_dir>/node=<node id>`` (the id percent-encoded where a path needs it)."""
    return history_dir / f"node={urllib.parse.quote(node_id, safe='')}"


def parquet_glob(history_dir: Path) -> str:
    """The glob that reads every node's files (for ``read_parquet``)."""
    return str(history_dir / "**" / "*.parquet")


def _day(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%d")


def _select(columns: tuple[tuple[str, str], ...], table: str) -> str:
    return f"SELECT {', '.join(c for c, _ in columns)} FROM {table}"


def _copy_out(cur: Any, sql: str, params: Any, path: Path) -> None:
    """The rows of ``sql`` as CSV with a header in ``path`` (PostgreSQL's COPY)."""
    with (
        path.open("wb") as out,
        cur.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv, HEADER)", params) as copy,
    ):
        for data in copy:
            out.write(data)


def _read_csv(path: Path, columns: tuple[tuple[str, str], ...]) -> str:
    """A DuckDB SELECT of the CSV ``path`` written by :func:`_copy_out` with its types
    (bytea travels as ``\\x…`` hex, NULL as an unquoted empty field)."""
    types = ", ".join(f"'{c}': '{'VARCHAR' if t == 'BLOB' else t}'" for c, t in columns)
    select = ", ".join(f"unhex(substr({c}, 3)) AS {c}" if t == "BLOB" else c for c, t in columns)
    return (
        f"SELECT {select} FROM read_csv('{_quote(path)}', header = true, auto_detect = false,"
        f" allow_quoted_nulls = false, columns = {{{types}}})"
    )


def _quote(path: Path | str) -> str:
    return str(path).replace("'", "''")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherStatistics:
    files: int  # Parquet files written by this publisher
    rows: int  # fetch records published
    repaired: int  # files found above the watermark at start and committed
    through_id: int  # the watermark
    last_publish: float  # unix seconds (0: never)


class HistoryPublisher:
    """Publishes one node's fetch records from PostgreSQL to Parquet (see the module
    docstring). Synchronous: the daemon calls :meth:`publish` from a worker thread."""

    def __init__(
        self,
        dsn: str,
        node_id: str,
        history_dir: Path,
        *,
        rows_per_file: int = 250_000,
        roll_seconds: float = 600.0,
    ) -> None:
        if rows_per_file < 1 or roll_seconds < 0:
            raise ValueError("rows_per_file ≥ 1 and roll_seconds ≥ 0")
        self.node_id = node_id
        self.history_dir = history_dir
        self.rows_per_file = rows_per_file
        self.roll_seconds = roll_seconds
        self._session = PgSession(dsn)
        self._run = self._session.run
        self._files = 0
        self._rows = 0
        self._repaired = 0
        self._through = 0
        self._last = 0.0

    def close(self) -> None:
        self._session.close()

    @property
    def directory(self) -> Path:
        return node_directory(self.history_dir, self.node_id)

    def _watermark(self, cur: Any) -> int:
        cur.execute("SELECT through_id FROM published WHERE node_id = %s", (self.node_id,))
        row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def _commit(self, cur: Any, watermark: int, last: int) -> None:
        """Move the watermark from ``watermark`` to ``last`` and delete those rows from
        PostgreSQL (the estimator keeps its own per-page statistics in ``pages``)."""
        cur.execute(
            "INSERT INTO published (node_id, through_id) VALUES (%s, %s)"
            " ON CONFLICT (node_id) DO UPDATE SET through_id = excluded.through_id",
            (self.node_id, last),
        )
        cur.execute(
            "DELETE FROM fetches WHERE node_id = %s AND id > %s AND id <= %s",
            (self.node_id, watermark, last),
        )

    def _files_above(self, watermark: int) -> list[tuple[int, int, Path]]:
        out = []
        if self.directory.is_dir():
            for path in self.directory.glob("day=*/*"):
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    path.unlink(missing_ok=True)  # an interrupted write
                    continue
                m = _FILE.match(path.name)
                if m and int(m.group(2)) > watermark:
                    out.append((int(m.group(1)), int(m.group(2)), path))
        return sorted(out)

    def repair(self) -> int:
        """Commit what a crash left between a file's rename and its watermark (the files
        above the watermark, in id order); remove interrupted temporary files. The number of
        files committed."""

        def fix(cur: Any) -> int:
            watermark = self._watermark(cur)
            found = self._files_above(watermark)
            for _first, last, path in found:
                self._commit(cur, watermark, last)
                log.warning("history file committed after a crash", file=str(path), through=last)
                watermark = last
            self._through = watermark
            return len(found)

        repaired: int = self._run("repairing the published history", fix)
        self._repaired += repaired
        return repaired

    def due(self, now: float | None = None) -> bool:
        """Whether the node's tail should roll into a file now."""
        now = time.time() if now is None else now

        def check(cur: Any) -> bool:
            watermark = self._watermark(cur)
            cur.execute(
                "SELECT count(*), min(finished_at) FROM (SELECT finished_at FROM fetches"
                " WHERE node_id = %s AND id > %s ORDER BY id LIMIT %s) t",
                (self.node_id, watermark, self.rows_per_file),
            )
            n, oldest = cur.fetchone()
            return bool(n) and (n >= self.rows_per_file or now - float(oldest) >= self.roll_seconds)

        due: bool = self._run("reading the unpublished history", check)
        return due

    def publish(self, *, force: bool = False, now: float | None = None) -> list[Path]:
        """Roll the tail into files while it is due (``force``: whatever there is); the
        files written."""
        written: list[Path] = []
        while force or self.due(now):
            path = self._publish_one()
            if path is None:
                break
            written.append(path)
        return written

    def _publish_one(self) -> Path | None:
        """One file: the next rows after the watermark, up to ``rows_per_file``, of one day."""
        with tempfile.TemporaryDirectory(prefix="rfhist") as tmp:
            csv = Path(tmp) / "batch.csv"

            def read(cur: Any) -> tuple[int, int, int, str, int] | None:
                watermark = self._watermark(cur)
                cur.execute(
                    "SELECT id, finished_at FROM fetches WHERE node_id = %s AND id > %s"
                    " ORDER BY id LIMIT %s",
                    (self.node_id, watermark, self.rows_per_file),
                )
                rows = cur.fetchall()
                if not rows:
                    return None
                day = _day(float(rows[0][1]))
                last, count = int(rows[0][0]), 0
                for rid, finished in rows:
                    if _day(float(finished)) != day:
                        break
                    last, count = int(rid), count + 1
                _copy_out(
                    cur,
                    _select(FETCH_COLUMNS, "fetches")
                    + " WHERE node_id = %s AND id > %s AND id <= %s ORDER BY id",
                    (self.node_id, watermark, last),
                    csv,
                )
                return watermark, int(rows[0][0]), last, day, count

            batch = self._run("reading the unpublished history", read)
            if batch is None:
                return None
            watermark, first, last, day, count = batch
            target = self.directory / f"day={day}" / f"fetches-{first:019d}-{last:019d}.parquet"
            self._write(csv, target)

        def commit(cur: Any) -> None:
            if self._watermark(cur) != watermark:  # pragma: no cover - one publisher per node
                raise StoreError(f"the history of node {self.node_id!r} moved under its publisher")
            self._commit(cur, watermark, last)

        self._run("committing the published history", commit)
        self._files += 1
        self._rows += count
        self._through = last
        self._last = time.time()
        log.info("history published", file=str(target), rows=count, through=last)
        return target

    def _write(self, csv: Path, target: Path) -> None:
        """``csv`` as the Parquet file ``target``, atomically (temp file, fsync, rename)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.tmp"
        con = duckdb.connect()
        try:
            con.execute(
                f"COPY ({_read_csv(csv, FETCH_COLUMNS)}) TO '{_quote(temp)}'"
                " (FORMAT parquet, COMPRESSION zstd)"
            )
        except duckdb.Error as e:
            temp.unlink(missing_ok=True)
            raise StoreError(f"writing the history file {str(target)!r}: {e}") from e
        finally:
            con.close()
        with temp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, target)
        _fsync_dir(target.parent)

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(
            files=self._files,
            rows=self._rows,
            repaired=self._repaired,
            through_id=self._through,
            last_publish=self._last,
        )


def open_fleet_query(dsn: str, history_dir: Path | None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one node's tables and views over the whole fleet: the Parquet
    history (each node's files up to its watermark) plus the unpublished tail, and the pages,
    hosts and policy periods, read from PostgreSQL in one snapshot."""
    con = duckdb.connect()
    try:
        with tempfile.TemporaryDirectory(prefix="rfquery") as tmp:
            paths = {
                name: Path(tmp) / f"{name}.csv" for name in ("tail", "pages", "hosts", "pp", "wm")
            }
            try:
                with connect(dsn) as pg, pg.transaction(), pg.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    _copy_out(cur, "SELECT node_id, through_id FROM published", None, paths["wm"])
                    _copy_out(
                        cur,
                        _select(FETCH_COLUMNS, "fetches f")
                        + " WHERE f.id > coalesce((SELECT through_id FROM published p"
                        " WHERE p.node_id = f.node_id), 0)",
                        None,
                        paths["tail"],
                    )
                    _copy_out(cur, _select(_PAGE_COLUMNS, "pages"), None, paths["pages"])
                    _copy_out(cur, _select(_HOST_COLUMNS, "hosts"), None, paths["hosts"])
                    _copy_out(cur, _select(_POLICY_COLUMNS, "policy_periods"), None, paths["pp"])
            except psycopg.Error as e:
                raise StoreError(
                    f"reading the fleet's tail ({redact(dsn)!r}): {describe(e)}"
                ) from e
            watermarks = (("node_id", "VARCHAR"), ("through_id", "BIGINT"))
            con.execute(f"CREATE TABLE _published AS {_read_csv(paths['wm'], watermarks)}")
            con.execute(f"CREATE TABLE _tail AS {_read_csv(paths['tail'], FETCH_COLUMNS)}")
            con.execute(f"CREATE TABLE pages AS {_fleet_pages(paths['pages'])}")
            con.execute(f"CREATE TABLE hosts AS {_read_csv(paths['hosts'], _HOST_COLUMNS)}")
            con.execute(f"CREATE TABLE policy_periods AS {_read_csv(paths['pp'], _POLICY_COLUMNS)}")
        con.execute(f"CREATE VIEW fetches AS {_fleet_fetches(history_dir)}")
        con.execute(f"CREATE VIEW fetch_log AS {FETCH_LOG}")
        create_views(con, temporary=False)
    except BaseException:
        con.close()
        raise
    return con


def _unsigned(column: str) -> str:
    """A signed BIGINT holding 64 unsigned bits as the embedded store's UBIGINT."""
    return (
        f"CAST(CASE WHEN {column} < 0 THEN CAST({column} AS HUGEINT) + 18446744073709551616"
        f" ELSE {column} END AS UBIGINT) AS {column}"
    )


def _fleet_pages(path: Path) -> str:
    cols = ", ".join(_unsigned(c) if c == "fingerprint" else c for c, _ in _PAGE_COLUMNS)
    return f"SELECT {cols} FROM ({_read_csv(path, _PAGE_COLUMNS)})"


def _fleet_fetches(history_dir: Path | None) -> str:
    """``fetches`` as one node's store has it (plus node_id, epoch, partition): each node's
    Parquet rows up to its watermark, then the tail."""
    cols = ", ".join(_unsigned(c) if c == "fingerprint" else c for c, _ in FETCH_COLUMNS)
    parts = [f"SELECT {cols} FROM _tail"]
    if history_dir is not None and any(history_dir.glob("node=*/day=*/*.parquet")):
        parts.insert(
            0,
            f"SELECT {cols} FROM (SELECT {', '.join('h.' + c for c, _ in FETCH_COLUMNS)}"
            f" FROM read_parquet('{_quote(parquet_glob(history_dir))}',"
            " hive_partitioning = true, union_by_name = true) h"
            " JOIN _published w ON w.node_id = h.node_id AND h.id <= w.through_id)",
        )
    return " UNION ALL ".join(parts)


def run_fleet_query(config: Config, sql: str, *, truth: Path | None = None) -> str:
    """``refresher query --fleet``: ``sql`` over the fleet's history, as a text table."""
    fleet = config.fleet
    if not fleet.dsn:
        raise StoreError(
            "refresher query --fleet needs a fleet: set fleet.dsn (and fleet.history_dir) "
            "in the config"
        )
    history = Path(fleet.history_dir) if fleet.history_dir else None
    con = open_fleet_query(fleet.dsn, history)
    if truth is not None:
        try:
            attach_truth(con, truth)
        except StoreError:
            con.close()
            raise
    return query_table(con, sql, f"the fleet at {redact(fleet.dsn)}")
