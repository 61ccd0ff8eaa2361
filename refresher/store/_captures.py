"""The archive's index: one row per WARC record the archive wrote, and the queries over it.

The WARC files (:mod:`refresher.archive`) hold the copies; this table says where each one is.
It is written in the same transaction as the fetches of its batch, after the archive has synced
the records to disk, so a row never points at a record that is not there. ``captures`` is the
public view (timestamps instead of unix seconds), like ``fetch_log``.

Readers outside the daemon use :func:`open_index`: the store itself when no daemon holds it,
else the snapshot beside it (whose copy of ``warc_records`` lags by one snapshot interval).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import duckdb
import numpy as np

from refresher._errors import StoreError

__all__ = [
    "CAPTURES_MIGRATION",
    "CAPTURE_COLUMNS",
    "BatchArchive",
    "Capture",
    "CaptureRow",
    "CaptureSource",
    "IndexedCapture",
    "LocalIndex",
    "ParquetWriter",
    "captured_files",
    "choose_drops",
    "delete_captures",
    "file_ends",
    "files_of",
    "indexed_capture",
    "insert_captures",
    "latest_captures",
    "lookup_captures",
    "open_index",
    "prune_candidates",
    "query_index",
    "records_in_files",
    "rename_file",
]

#: Schema migration 4: the archive's index and its public view.
CAPTURES_MIGRATION = """
CREATE TABLE warc_records (
    id BIGINT NOT NULL,
    page_id BIGINT NOT NULL,
    url VARCHAR NOT NULL,             -- the page's canonical URL (pages.url)
    target_uri VARCHAR NOT NULL,      -- WARC-Target-URI: the URL last requested
    captured_at DOUBLE NOT NULL,      -- unix seconds, the WARC-Date
    kind VARCHAR NOT NULL,            -- response | revisit
    status SMALLINT,
    mime VARCHAR,                     -- the response's media type
    digest BLOB,                      -- BLAKE2b-128 of the payload, as fetches.digest
    payload_digest VARCHAR,           -- WARC-Payload-Digest, "sha1:BASE32"
    file VARCHAR NOT NULL,            -- WARC file name in the archive directory
    record_offset BIGINT NOT NULL,    -- byte offset of the record's gzip member
    record_length BIGINT NOT NULL,    -- its compressed bytes
    span BIGINT NOT NULL,             -- bytes of the record and its request record
    payload_bytes BIGINT NOT NULL,
    truncated BOOLEAN NOT NULL        -- WARC-Truncated: length
);
CREATE VIEW captures AS
SELECT url,
       make_timestamp(CAST(captured_at * 1e6 AS BIGINT)) AS captured_at,
       kind, status, mime, payload_digest, target_uri, file, record_offset, record_length,
       payload_bytes, truncated
FROM warc_records;
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capture:
    """One fetch as the archive keeps it (:mod:`refresher.archive` writes it as WARC records);
    queued with the fetch's record and written with its batch."""

    page_id: int
    url: str  # the page's canonical URL
    target_uri: str  # the URL last requested
    fetched_at: float  # unix seconds
    kind: Literal["response", "revisit"]
    status: int
    reason: str | None
    http_version: str | None  # "HTTP/1.1"
    headers: tuple[tuple[str, str], ...]  # response header fields as received
    request_headers: tuple[tuple[str, str], ...]
    payload: bytes | None  # decoded; None for a 304
    truncated: bool
    # the payload's SHA-1 (BLAKE2b-128 where an older refresher wrote it): fetches.digest
    digest: bytes | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRow:
    """Where one archived record is: what the index stores."""

    page_id: int
    url: str
    target_uri: str
    captured_at: float  # unix seconds
    kind: str  # response | revisit
    status: int | None
    mime: str | None
    digest: bytes | None
    payload_digest: str | None
    file: str
    offset: int  # bytes
    length: int  # bytes
    span: int  # bytes, the record with its request record
    payload_bytes: int
    truncated: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexedCapture:
    """A capture read back from the index."""

    url: str
    target_uri: str
    captured_at: float  # unix seconds
    kind: str
    status: int | None
    mime: str | None
    digest: bytes | None
    payload_digest: str | None
    file: str
    offset: int
    length: int
    truncated: bool
    node_id: str | None = None  # the fleet node whose WARC files hold it (None: one node)


class CaptureSource(Protocol):
    """Where a reader of the copy finds the index and the WARC files: one node's DuckDB index
    (:class:`LocalIndex`) or a fleet's ``warc_records`` (:class:`refresher.store._pg_archive
    .FleetIndex`)."""

    def lookup(self, keys: Sequence[str], *, at: float | None) -> list[IndexedCapture]:
        """The responses indexed under any of ``keys`` (URL or target URI) at or before
        ``at``, newest first."""
        ...

    def every(self) -> Iterator[IndexedCapture]:
        """Every indexed record (responses and revisits), by URL and time."""
        ...

    def latest(self) -> Iterator[IndexedCapture]:
        """The latest response of every page, by URL."""
        ...

    def locate(self, capture: IndexedCapture) -> Path:
        """The WARC file holding ``capture`` on this machine; :class:`ArchiveUnreachable`
        (one line) when it cannot be reached from here."""
        ...


class LocalIndex:
    """:class:`CaptureSource` of one node: its DuckDB store, or the snapshot while a daemon
    holds the store (:func:`open_index`), and the archive directory beside it."""

    def __init__(self, store_path: Path, snapshot: Path, *, directory: Path | None = None):
        self.store_path = store_path
        self.snapshot = snapshot
        self._directory = directory

    def _query(self, fn: Callable[[Any], list[IndexedCapture]]) -> list[IndexedCapture]:
        found, self._directory = query_index(
            self.store_path, self.snapshot, fn, directory=self._directory
        )
        return found

    def lookup(self, keys: Sequence[str], *, at: float | None) -> list[IndexedCapture]:
        found = self._query(lambda con: [c for k in keys for c in lookup_captures(con, k, at=at)])
        return sorted(found, key=lambda c: -c.captured_at)

    def every(self) -> Iterator[IndexedCapture]:
        return iter(self._query(lambda con: latest_captures(con)))

    def latest(self) -> Iterator[IndexedCapture]:
        return iter(self._query(lambda con: latest_captures(con, kind="response")))

    def locate(self, capture: IndexedCapture) -> Path:
        if self._directory is None:  # the directory comes with the first query
            self._query(lambda con: [])
        assert self._directory is not None
        return self._directory / capture.file


class BatchArchive(Protocol):
    """What the store writer needs of the archive: the captures of a batch written and made
    durable just before the transaction that indexes them."""

    def write_batch(self, captures: Sequence[Capture]) -> Sequence[CaptureRow]:
        """Append ``captures`` and fsync; the index rows of those now on disk (a capture the
        archive could not keep, a full disk, has none)."""
        ...


def insert_captures(con: Any, rows: Sequence[CaptureRow], *, first: int) -> int:
    """Append ``rows`` (inside the caller's transaction), numbered from ``first`` (the next
    free id, which the store keeps); returns the next free id after them."""
    if not rows:
        return first
    _captures = {
        "id": np.arange(first, first + len(rows), dtype=np.int64),
        "page_id": np.array([r.page_id for r in rows], dtype=np.int64),
        "url": np.array([r.url for r in rows], dtype=object),
        "target_uri": np.array([r.target_uri for r in rows], dtype=object),
        "captured_at": np.array([r.captured_at for r in rows], dtype=np.float64),
        "kind": np.array([r.kind for r in rows], dtype=object),
        "status": np.array([r.status for r in rows], dtype=object),
        "mime": np.array([r.mime for r in rows], dtype=object),
        "digest": np.array([r.digest for r in rows], dtype=object),
        "payload_digest": np.array([r.payload_digest for r in rows], dtype=object),
        "file": np.array([r.file for r in rows], dtype=object),
        "record_offset": np.array([r.offset for r in rows], dtype=np.int64),
        "record_length": np.array([r.length for r in rows], dtype=np.int64),
        "span": np.array([r.span for r in rows], dtype=np.int64),
        "payload_bytes": np.array([r.payload_bytes for r in rows], dtype=np.int64),
        "truncated": np.array([r.truncated for r in rows], dtype=bool),
    }
    # scanned by name (DuckDB's replacement scan), not registered: see DuckDBStore.write
    con.execute(f"INSERT INTO warc_records ({', '.join(_captures)}) SELECT * FROM _captures")
    return first + len(rows)


#: the columns of an :class:`IndexedCapture`, in its field order
CAPTURE_COLUMNS = (
    "url, target_uri, captured_at, kind, status, mime, digest, payload_digest, file,"
    " record_offset, record_length, truncated"
)
_COLUMNS = CAPTURE_COLUMNS


def indexed_capture(r: Sequence[Any]) -> IndexedCapture:
    """A row of :data:`CAPTURE_COLUMNS` (and the node id, a fleet's) as a capture."""
    return IndexedCapture(
        url=r[0],
        target_uri=r[1],
        captured_at=float(r[2]),
        kind=r[3],
        status=None if r[4] is None else int(r[4]),
        mime=r[5],
        digest=None if r[6] is None else bytes(r[6]),
        payload_digest=r[7],
        file=r[8],
        offset=int(r[9]),
        length=int(r[10]),
        truncated=bool(r[11]),
        node_id=r[12] if len(r) > 12 else None,
    )


def _indexed(rows: Sequence[Sequence[Any]]) -> list[IndexedCapture]:
    return [indexed_capture(r) for r in rows]


def lookup_captures(
    con: Any, url: str, *, at: float | None = None, kind: str | None = "response"
) -> list[IndexedCapture]:
    """The captures of ``url`` at or before ``at`` (unix seconds), newest first."""
    sql = f"SELECT {_COLUMNS} FROM warc_records WHERE (url = ? OR target_uri = ?)"
    params: list[Any] = [url, url]
    if at is not None:
        sql += " AND captured_at <= ?"
        params.append(at)
    if kind is not None:
        sql += " AND kind = ?"
        params.append(kind)
    return _indexed(con.execute(sql + " ORDER BY captured_at DESC, id DESC", params).fetchall())


def latest_captures(con: Any, *, kind: str | None = None) -> list[IndexedCapture]:
    """Every capture (``kind`` None) in URL and time order, or the latest ``kind`` per page."""
    if kind is None:
        sql = f"SELECT {_COLUMNS} FROM warc_records ORDER BY url, captured_at, id"
        return _indexed(con.execute(sql).fetchall())
    sql = (
        f"SELECT {_COLUMNS} FROM warc_records WHERE kind = ?"
        " QUALIFY row_number() OVER (PARTITION BY page_id ORDER BY captured_at DESC, id DESC) = 1"
        " ORDER BY url"
    )
    return _indexed(con.execute(sql, [kind]).fetchall())


def file_ends(con: Any) -> dict[str, int]:
    """Per WARC file, the end of its last indexed record group (bytes)."""
    rows = con.execute(
        "SELECT file, max(record_offset + span) FROM warc_records GROUP BY file"
    ).fetchall()
    return {str(f): int(e) for f, e in rows}


def captured_files(con: Any) -> dict[str, int]:
    """Per WARC file, the bytes its indexed record groups take."""
    rows = con.execute("SELECT file, sum(span) FROM warc_records GROUP BY file").fetchall()
    return {str(f): int(n) for f, n in rows}


def prune_candidates(con: Any, *, keep_versions: int | None, max_bytes: int | None) -> list[int]:
    """Ids of index rows to drop: past ``keep_versions`` responses per page (with the revisits
    older than the oldest kept response), then the oldest until the rest fit in ``max_bytes``.
    The latest response of every page is never a candidate."""
    keep = keep_versions if keep_versions is not None else 2**62
    rows = con.execute(
        """
        WITH ranked AS (
            SELECT id, page_id, captured_at, span, kind,
                   sum(CASE WHEN kind = 'response' THEN 1 ELSE 0 END) OVER (
                       PARTITION BY page_id ORDER BY captured_at DESC, id DESC
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS newer_responses
            FROM warc_records
        )
        SELECT id, span,
               -- a revisit belongs to the version before it: it goes when that version goes
               CASE WHEN kind = 'response' THEN newer_responses > ? ELSE newer_responses >= ?
               END AS over,
               kind = 'response' AND newer_responses = 1 AS latest
        FROM ranked ORDER BY captured_at, id
        """,
        [keep, keep],
    ).fetchall()
    return choose_drops(rows, max_bytes=max_bytes)


def choose_drops(rows: Sequence[Sequence[Any]], *, max_bytes: int | None) -> list[int]:
    """Of ``rows`` (id, span, past keep_versions, a page's latest response), oldest first:
    those past ``keep_versions``, then the oldest until the rest fit in ``max_bytes`` bytes,
    never a page's latest response."""
    drop = [int(r[0]) for r in rows if r[2] and not r[3]]
    if max_bytes is not None:
        dropped = set(drop)
        total = sum(int(r[1]) for r in rows if int(r[0]) not in dropped)
        for r in rows:
            if total <= max_bytes:
                break
            if int(r[0]) not in dropped and not r[3]:
                drop.append(int(r[0]))
                dropped.add(int(r[0]))
                total -= int(r[1])
    return drop


def records_in_files(con: Any, files: Sequence[str]) -> list[tuple[int, str, int, int]]:
    """``(id, file, offset, span)`` of every indexed record in ``files``, by file and offset."""
    if not files:
        return []
    con.register("_files", {"file": np.array(list(files), dtype=object)})
    try:
        rows = con.execute(
            "SELECT id, file, record_offset, span FROM warc_records SEMI JOIN _files USING (file)"
            " ORDER BY file, record_offset"
        ).fetchall()
    finally:
        con.unregister("_files")
    return [(int(i), str(f), int(o), int(s)) for i, f, o, s in rows]


def files_of(con: Any, ids: Sequence[int]) -> list[str]:
    """The WARC files holding the records ``ids``."""
    if not ids:
        return []
    con.register("_ids", {"id": np.array(list(ids), dtype=np.int64)})
    try:
        rows = con.execute(
            "SELECT DISTINCT file FROM warc_records SEMI JOIN _ids USING (id) ORDER BY file"
        ).fetchall()
    finally:
        con.unregister("_ids")
    return [str(r[0]) for r in rows]


def delete_captures(con: Any, ids: Sequence[int]) -> list[tuple[str, int, int]]:
    """Delete index rows ``ids``; returns ``(file, offset, span)`` of each deleted record."""
    if not ids:
        return []
    con.register("_drop", {"id": np.array(ids, dtype=np.int64)})
    try:
        gone = con.execute(
            "SELECT file, record_offset, span FROM warc_records SEMI JOIN _drop USING (id)"
        ).fetchall()
        con.execute("DELETE FROM warc_records WHERE id IN (SELECT id FROM _drop)")
    finally:
        con.unregister("_drop")
    return [(str(f), int(o), int(s)) for f, o, s in gone]


def rename_file(con: Any, old: str, new: str, moves: Sequence[tuple[int, int]]) -> None:
    """Point the records of WARC file ``old`` at ``new``: ``moves`` maps old → new offsets."""
    con.register(
        "_moves",
        {
            "old": np.array([m[0] for m in moves], dtype=np.int64),
            "new": np.array([m[1] for m in moves], dtype=np.int64),
        },
    )
    try:
        con.execute(
            "UPDATE warc_records SET file = ?, record_offset = _moves.new FROM _moves"
            " WHERE warc_records.file = ? AND warc_records.record_offset = _moves.old",
            [new, old],
        )
    finally:
        con.unregister("_moves")


class ParquetWriter:
    """Rows added in chunks to a scratch DuckDB file beside ``path`` (memory stays bounded by a
    chunk), written to ``path`` as one Parquet file by :meth:`close`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._scratch = path.with_name(f".{path.name}.scratch.duckdb")
        self._scratch.unlink(missing_ok=True)
        self._con = duckdb.connect(str(self._scratch))
        self._created = False

    def add(self, columns: dict[str, Any]) -> None:
        """Append a chunk: column name → numpy array, the same columns every time."""
        self._con.register("_chunk", columns)
        try:
            if self._created:
                self._con.execute("INSERT INTO export SELECT * FROM _chunk")
            else:
                self._con.execute("CREATE TABLE export AS SELECT * FROM _chunk")
                self._created = True
        except duckdb.Error as e:
            raise StoreError(f"exporting to {str(self.path)!r}: {e}; check free space") from e
        finally:
            self._con.unregister("_chunk")

    def close(self) -> None:
        try:
            if self._created:
                target = "'" + str(self.path).replace("'", "''") + "'"
                self._con.execute(f"COPY export TO {target} (FORMAT parquet)")
        except duckdb.Error as e:
            raise StoreError(f"writing {str(self.path)!r}: {e}; check the path and space") from e
        finally:
            self._con.close()
            self._scratch.unlink(missing_ok=True)
            self._scratch.with_name(self._scratch.name + ".wal").unlink(missing_ok=True)


def open_index(store_path: Path, snapshot: Path) -> tuple[Any, Path]:
    """A read-only connection holding ``warc_records``: the store, or the snapshot when a
    running daemon holds the store. Returns it and the file it reads."""
    if not store_path.exists():
        raise StoreError(f"no store at {str(store_path)!r}; fix the path or run the daemon")
    try:
        return duckdb.connect(str(store_path), read_only=True), store_path
    except duckdb.Error as e:
        if "lock" not in str(e).lower():
            raise StoreError(f"cannot open the store {str(store_path)!r}: {e}") from e
    if not snapshot.exists():
        raise StoreError(
            f"a running daemon holds {str(store_path)!r} and there is no snapshot at "
            f"{str(snapshot)!r}; set snapshot.interval above 0 and wait one interval"
        )
    try:
        return duckdb.connect(str(snapshot), read_only=True), snapshot
    except duckdb.Error as e:
        raise StoreError(f"cannot open the snapshot {str(snapshot)!r}: {e}") from e


def query_index(
    store_path: Path,
    snapshot: Path,
    fn: Callable[[Any], list[IndexedCapture]],
    *,
    directory: Path | None = None,
) -> tuple[list[IndexedCapture], Path]:
    """``fn`` over the index (:func:`open_index`), and the WARC directory: ``directory``, else
    where the daemon recorded it (meta ``archive_dir``), else "archive" beside the store.

    A store from before the archive has no index: nothing archived, ``fn`` gives []."""
    con, _source = open_index(store_path, snapshot)
    try:
        if directory is None:
            row = con.execute("SELECT value FROM meta WHERE key = 'archive_dir'").fetchall()
            directory = Path(row[0][0]) if row else store_path.parent / "archive"
        try:
            return fn(con), directory
        except duckdb.CatalogException:
            return [], directory
    finally:
        con.close()
