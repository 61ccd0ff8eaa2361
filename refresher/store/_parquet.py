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
2. one transaction then locks the node's ``published`` row, checks that the watermark is still
   the one step 1 read after (a compare-and-set: the *fence* between two publishers of one
   node) and that the file is still there, lists the file in the manifest ``history_files``,
   moves the watermark to the last id and deletes the published rows from PostgreSQL (the
   estimator does not read them: it keeps its per-page statistics in ``pages``).

**The manifest is what readers read**: a file counts once it is listed, and it is listed in the
same transaction that deletes its rows from the tail, so no reader ever counts a fetch twice or
misses one. A file that is not listed is a *stray*: written by a publisher that crashed between
1 and 2, or one whose commit was refused because another publisher of the same node got there
first (a node that came back while a live node published its tail: :meth:`publish_absent`).
:meth:`HistoryPublisher.repair` deletes a node's strays under the same row lock (a publisher
about to commit re-checks its file under that lock), and the rows they held, still in the tail,
are published again. Temporary files of an interrupted write go the same way.

A node that never comes back would leave its tail in PostgreSQL for good; every node therefore
also publishes, under the absent node's id and watermark, the tail of any node whose heartbeat
is older than ``fleet.absent_after`` (:meth:`HistoryPublisher.publish_absent`; one at a time by
an advisory lock, and exactly once by the fence above whoever wins).

:func:`open_fleet_query` builds an in-memory DuckDB with the same tables and views as one
node's store: ``fetches`` over the manifest's Parquet files plus the tail read with psycopg
(DuckDB's postgres extension would need a download), ``pages``, ``hosts``, ``policy_periods``
from PostgreSQL, ``fetch_log`` and the freshness views of :mod:`refresher.store._views`; the
manifest and the tail are read in one PostgreSQL snapshot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import re
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from functools import partial
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
    "READER_GRACE",
    "HistoryPublisher",
    "PublisherStatistics",
    "copy_out",
    "day_of",
    "node_directory",
    "note_retired",
    "open_fleet_query",
    "parquet_glob",
    "retired_files",
    "run_fleet_query",
    "write_parquet",
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
#: seconds a history file stays on disk after a retention pass took it out of the manifest: a
#: reader whose snapshot listed it before (``refresher query --fleet``) still reads it
READER_GRACE = 3600.0
#: the history directory's note of the files taken out of the manifest and when (JSON lines)
_RETIRED = ".retired.jsonl"


def retired_files(history_dir: Path) -> dict[str, float]:
    """The files (relative paths) a retention pass took out of the manifest and has not deleted
    yet, with when (unix seconds)."""
    try:
        text = (history_dir / _RETIRED).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            out[str(entry["path"])] = float(entry["at"])
    return out


def note_retired(history_dir: Path, retired: dict[str, float]) -> None:
    """Replace the note of retired files with ``retired`` (written whole, synced, renamed)."""
    temp = history_dir / f"{_RETIRED}.tmp"
    with temp.open("w", encoding="utf-8") as f:
        for path, at in sorted(retired.items()):
            f.write(json.dumps({"path": path, "at": at}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, history_dir / _RETIRED)


_DAY = 86_400.0


def node_directory(history_dir: Path, node_id: str) -> Path:
    """``<history_dir>/node=<node id>`` (the id percent-encoded where a path needs it)."""
    return history_dir / f"node={urllib.parse.quote(node_id, safe='')}"


def parquet_glob(history_dir: Path) -> str:
    """The glob that reads every node's files (for ``read_parquet``)."""
    return str(history_dir / "**" / "*.parquet")


def day_of(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%d")


def _select(columns: tuple[tuple[str, str], ...], table: str) -> str:
    return f"SELECT {', '.join(c for c, _ in columns)} FROM {table}"


def copy_out(cur: Any, sql: str, params: Any, path: Path) -> None:
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


def write_parquet(csv: Path, target: Path) -> None:
    """Fetch records in ``csv`` (:func:`copy_out` of :data:`FETCH_COLUMNS`) as the Parquet
    file ``target``, atomically (a hidden temporary file, fsync, rename)."""
    temp = target.parent / f".{target.name}.{os.getpid()}.{next(_TEMPS)}.tmp"
    con = duckdb.connect()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        con.execute(
            f"COPY ({_read_csv(csv, FETCH_COLUMNS)}) TO '{_quote(temp)}'"
            " (FORMAT parquet, COMPRESSION zstd)"
        )
        with temp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, target)
        _fsync_dir(target.parent)
    except (duckdb.Error, OSError) as e:
        temp.unlink(missing_ok=True)
        raise StoreError(f"writing the history file {str(target)!r}: {e}") from e
    finally:
        con.close()


_TEMPS = itertools.count()


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherStatistics:
    files: int  # Parquet files written by this publisher
    rows: int  # fetch records published
    repaired: int  # stray files found and removed (their rows published again)
    through_id: int  # the watermark
    last_publish: float  # unix seconds (0: never)
    refused: int = 0  # commits refused: another publisher of the node got there first
    absent_rows: int = 0  # fetch records of absent nodes published by this node


class _Superseded(Exception):
    """The watermark moved (another publisher of the node committed) or the file was removed
    as a stray: this publisher's file must not be listed."""


#: advisory lock class of "publishing an absent node's tail" (the key's second half is the
#: node id's hash): one node does it at a time
_ABSENT_LOCK = 0x72666162


class HistoryPublisher:
    """Publishes one node's fetch records from PostgreSQL to Parquet (see the module
    docstring). Synchronous: the daemon calls :meth:`publish` from a worker thread.

    ``session`` shares another publisher's connection (the one publishing an absent node's
    tail); without it the publisher opens its own."""

    def __init__(
        self,
        dsn: str,
        node_id: str,
        history_dir: Path,
        *,
        rows_per_file: int = 250_000,
        roll_seconds: float = 600.0,
        session: PgSession | None = None,
    ) -> None:
        if rows_per_file < 1 or roll_seconds < 0:
            raise ValueError("rows_per_file ≥ 1 and roll_seconds ≥ 0")
        self.dsn = dsn
        self.node_id = node_id
        self.history_dir = history_dir
        self.rows_per_file = rows_per_file
        self.roll_seconds = roll_seconds
        self._own_session = session is None
        self._session = session if session is not None else PgSession(dsn)
        self._run = self._session.run
        self._files = 0
        self._rows = 0
        self._repaired = 0
        self._refused = 0
        self._absent_rows = 0
        self._through = 0
        self._last = 0.0

    def close(self) -> None:
        if self._own_session:
            self._session.close()

    @property
    def directory(self) -> Path:
        return node_directory(self.history_dir, self.node_id)

    def _watermark(self, cur: Any) -> int:
        cur.execute("SELECT through_id FROM published WHERE node_id = %s", (self.node_id,))
        row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def _lock(self, cur: Any) -> int:
        """Lock the node's ``published`` row (made at 0 when new) for this transaction: the
        fence between publishers of one node. Its watermark."""
        cur.execute(
            "INSERT INTO published (node_id, through_id) VALUES (%s, 0)"
            " ON CONFLICT (node_id) DO NOTHING",
            (self.node_id,),
        )
        cur.execute(
            "SELECT through_id FROM published WHERE node_id = %s FOR UPDATE", (self.node_id,)
        )
        return int(cur.fetchone()[0])

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.history_dir).as_posix()

    def _listed(self, cur: Any) -> set[str]:
        cur.execute("SELECT path FROM history_files WHERE node_id = %s", (self.node_id,))
        return {str(r[0]) for r in cur.fetchall()}

    def _commit(
        self, cur: Any, watermark: int, batch: tuple[int, int, int, str], target: Path
    ) -> None:
        """List ``target`` (rows ``first``…``last`` of ``day``) and move the watermark from
        ``watermark`` to ``last``, deleting those rows from PostgreSQL; refused
        (:class:`_Superseded`) when the watermark moved or the file is gone."""
        first, last, count, day = batch
        if self._lock(cur) != watermark or not target.exists():
            raise _Superseded
        cur.execute(
            "INSERT INTO history_files (node_id, path, first_id, last_id, rows, day)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (self.node_id, self._relative(target), first, last, count, day),
        )
        cur.execute("UPDATE published SET through_id = %s WHERE node_id = %s", (last, self.node_id))
        cur.execute(
            "DELETE FROM fetches WHERE node_id = %s AND id > %s AND id <= %s",
            (self.node_id, watermark, last),
        )

    def repair(self) -> int:
        """Remove this node's stray files (not in the manifest: a crash between a file's
        rename and its commit, a refused commit) and interrupted temporary files, under the
        node's row lock; their rows are still in the tail and are published again. The number
        of files removed."""

        def fix(cur: Any) -> int:
            self._through = self._lock(cur)
            # retired by a retention pass: kept a while for readers, deleted by a later pass
            listed = self._listed(cur) | set(retired_files(self.history_dir))
            removed = 0
            if self.directory.is_dir():
                for path in self.directory.glob("day=*/*"):
                    stray = _FILE.match(path.name) and self._relative(path) not in listed
                    if stray or (path.name.startswith(".") and path.name.endswith(".tmp")):
                        path.unlink(missing_ok=True)
                        removed += 1
                        log.warning("stray history file removed", file=str(path))
            return removed

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

    def _read_batch(self, csv: Path) -> tuple[int, tuple[int, int, int, str]] | None:
        """Copy the next rows after the watermark, up to ``rows_per_file`` of one day, to
        ``csv``: the watermark read and (first id, last id, rows, day), or None."""

        def read(cur: Any) -> tuple[int, tuple[int, int, int, str]] | None:
            watermark = self._watermark(cur)
            cur.execute(
                "SELECT id, finished_at FROM fetches WHERE node_id = %s AND id > %s"
                " ORDER BY id LIMIT %s",
                (self.node_id, watermark, self.rows_per_file),
            )
            rows = cur.fetchall()
            if not rows:
                return None
            day = day_of(float(rows[0][1]))
            last, count = int(rows[0][0]), 0
            for rid, finished in rows:
                if day_of(float(finished)) != day:
                    break
                last, count = int(rid), count + 1
            copy_out(
                cur,
                _select(FETCH_COLUMNS, "fetches")
                + " WHERE node_id = %s AND id > %s AND id <= %s ORDER BY id",
                (self.node_id, watermark, last),
                csv,
            )
            return watermark, (int(rows[0][0]), last, count, day)

        batch: tuple[int, tuple[int, int, int, str]] | None = self._run(
            "reading the unpublished history", read
        )
        return batch

    def _publish_one(self) -> Path | None:
        """One file: the next rows after the watermark, up to ``rows_per_file``, of one day."""
        with tempfile.TemporaryDirectory(prefix="rfhist") as tmp:
            read = self._read_batch(Path(tmp) / "batch.csv")
            if read is None:
                return None
            watermark, batch = read
            first, last, count, day = batch
            target = self.directory / f"day={day}" / f"fetches-{first:019d}-{last:019d}.parquet"
            write_parquet(Path(tmp) / "batch.csv", target)
        try:
            self._run(
                "committing the published history",
                partial(self._commit, watermark=watermark, batch=batch, target=target),
            )
        except _Superseded:
            self._refused += 1
            self._drop_unlisted(target)
            log.warning(
                "history file not committed: another publisher of the node was first",
                node=self.node_id,
                file=str(target),
            )
            return None
        self._files += 1
        self._rows += count
        self._through = last
        self._last = time.time()
        log.info("history published", file=str(target), rows=count, through=last)
        return target

    def _drop_unlisted(self, target: Path) -> None:
        """Delete ``target`` unless the manifest lists it (another publisher's file of the same
        rows has the same name)."""

        def drop(cur: Any) -> None:
            self._lock(cur)
            if self._relative(target) not in self._listed(cur):
                target.unlink(missing_ok=True)

        self._run("removing a refused history file", drop)

    def absent_nodes(self, absent_after: float) -> list[str]:
        """Other nodes whose last heartbeat is older than ``absent_after`` seconds (on the
        database's clock) and that left fetch records in the tail."""

        def read(cur: Any) -> list[str]:
            cur.execute(
                "SELECT n.node_id FROM nodes n WHERE n.node_id <> %s"
                " AND n.heartbeat_at < extract(epoch FROM clock_timestamp()) - %s"
                " AND EXISTS (SELECT 1 FROM fetches f WHERE f.node_id = n.node_id)"
                " ORDER BY 1",
                (self.node_id, absent_after),
            )
            return [str(r[0]) for r in cur.fetchall()]

        nodes: list[str] = self._run("looking for absent nodes", read)
        return nodes

    def publish_absent(self, absent_after: float) -> dict[str, int]:
        """Publish the whole tail of every node absent longer than ``absent_after`` seconds,
        under its own id and watermark (one node at a time fleet-wide by an advisory lock; a
        node that returns meanwhile is fenced by the watermark). Rows published per node."""
        done: dict[str, int] = {}
        for node in self.absent_nodes(absent_after):
            if not self._absent_lock("SELECT pg_try_advisory_lock(%s, hashtext(%s))", node):
                continue  # another node is at it
            try:
                other = HistoryPublisher(
                    self.dsn,
                    node,
                    self.history_dir,
                    rows_per_file=self.rows_per_file,
                    roll_seconds=0,
                    session=self._session,
                )
                other.repair()
                files = other.publish(force=True)
                rows = other.statistics().rows
            finally:
                self._absent_lock("SELECT pg_advisory_unlock(%s, hashtext(%s))", node)
            self._absent_rows += rows
            done[node] = rows
            log.warning(
                "published the history tail of an absent node",
                node=node,
                rows=rows,
                files=len(files),
                absent_after=absent_after,
            )
        return done

    def _absent_lock(self, sql: str, node: str) -> bool:
        """Take (``pg_try_advisory_lock``) or release the session lock on ``node``'s tail."""
        got: bool = self._run(
            "locking an absent node's history",
            partial(_fetch_bool, sql=sql, params=(_ABSENT_LOCK, node)),
        )
        return got

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(
            files=self._files,
            rows=self._rows,
            repaired=self._repaired,
            through_id=self._through,
            last_publish=self._last,
            refused=self._refused,
            absent_rows=self._absent_rows,
        )


def _fetch_bool(cur: Any, sql: str, params: Any) -> bool:
    cur.execute(sql, params)
    return bool(cur.fetchone()[0])


def open_fleet_query(dsn: str, history_dir: Path | None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one node's tables and views over the whole fleet: the Parquet
    history (the manifest's files) plus the unpublished tail, and the pages, hosts and policy
    periods, read from PostgreSQL in one snapshot."""
    con = duckdb.connect()
    try:
        with tempfile.TemporaryDirectory(prefix="rfquery") as tmp:
            paths = {name: Path(tmp) / f"{name}.csv" for name in ("tail", "pages", "hosts", "pp")}
            try:
                with connect(dsn) as pg, pg.transaction(), pg.cursor() as cur:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cur.execute("SELECT path FROM history_files ORDER BY path")
                    files = [str(r[0]) for r in cur.fetchall()]
                    copy_out(
                        cur,
                        _select(FETCH_COLUMNS, "fetches f")
                        + " WHERE f.id > coalesce((SELECT through_id FROM published p"
                        " WHERE p.node_id = f.node_id), 0)",
                        None,
                        paths["tail"],
                    )
                    copy_out(cur, _select(_PAGE_COLUMNS, "pages"), None, paths["pages"])
                    copy_out(cur, _select(_HOST_COLUMNS, "hosts"), None, paths["hosts"])
                    copy_out(cur, _select(_POLICY_COLUMNS, "policy_periods"), None, paths["pp"])
            except psycopg.Error as e:
                raise StoreError(
                    f"reading the fleet's tail ({redact(dsn)!r}): {describe(e)}"
                ) from e
            con.execute(f"CREATE TABLE _tail AS {_read_csv(paths['tail'], FETCH_COLUMNS)}")
            con.execute(f"CREATE TABLE pages AS {_fleet_pages(paths['pages'])}")
            con.execute(f"CREATE TABLE hosts AS {_read_csv(paths['hosts'], _HOST_COLUMNS)}")
            con.execute(f"CREATE TABLE policy_periods AS {_read_csv(paths['pp'], _POLICY_COLUMNS)}")
        con.execute(f"CREATE VIEW fetches AS {_fleet_fetches(published_files(history_dir, files))}")
        con.execute(f"CREATE VIEW fetch_log AS {FETCH_LOG}")
        create_views(con, temporary=False)
    except BaseException:
        con.close()
        raise
    return con


def published_files(history_dir: Path | None, files: list[str]) -> list[Path]:
    """The manifest's ``files`` (relative paths) under ``history_dir``; a clear error when this
    machine cannot reach them (no history_dir in its config, or not the shared directory)."""
    if not files:
        return []
    if history_dir is None:
        raise StoreError(
            f"the fleet's history has {len(files)} published Parquet files; set "
            "fleet.history_dir in this config to the fleet's shared history directory"
        )
    paths = [history_dir / f for f in files]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise StoreError(
            f"{len(missing)} of the fleet's {len(paths)} published history files are not under "
            f"{str(history_dir)!r} on this machine (e.g. {str(missing[0])!r}); is "
            "fleet.history_dir the fleet's shared directory here?"
        )
    return paths


def _unsigned(column: str) -> str:
    """A signed BIGINT holding 64 unsigned bits as the embedded store's UBIGINT."""
    return (
        f"CAST(CASE WHEN {column} < 0 THEN CAST({column} AS HUGEINT) + 18446744073709551616"
        f" ELSE {column} END AS UBIGINT) AS {column}"
    )


def _fleet_pages(path: Path) -> str:
    cols = ", ".join(_unsigned(c) if c == "fingerprint" else c for c, _ in _PAGE_COLUMNS)
    return f"SELECT {cols} FROM ({_read_csv(path, _PAGE_COLUMNS)})"


def _fleet_fetches(files: list[Path]) -> str:
    """``fetches`` as one node's store has it (plus node_id, epoch, partition): the manifest's
    Parquet files, then the tail."""
    cols = ", ".join(_unsigned(c) if c == "fingerprint" else c for c, _ in FETCH_COLUMNS)
    parts = [f"SELECT {cols} FROM _tail"]
    if files:
        listed = ", ".join(f"'{_quote(p)}'" for p in files)
        parts.insert(
            0,
            f"SELECT {cols} FROM (SELECT {', '.join('h.' + c for c, _ in FETCH_COLUMNS)}"
            f" FROM read_parquet([{listed}], hive_partitioning = true, union_by_name = true) h)",
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
