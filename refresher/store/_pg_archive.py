"""A fleet's copy: where each node's WARC files live, and reading them through the fleet's index.

Every node keeps its own WARC files in a directory of its own,
``<base>/node=<node id>/`` (:func:`node_archive_dir`), where ``base`` is ``archive.dir`` when
set, else ``<fleet.history_dir>/archive`` (the fleet's shared directory: readers on other
machines reach the files there), else ``archive`` beside ``store.path`` (only that machine
reaches them). Its own directory keeps its start-up recovery and its retention to its own
files. The node notes the directory in ``fleet_meta`` (``archive_dir@<node id>``) and indexes
every record in the fleet's ``warc_records`` with its node id.

:class:`FleetIndex` is the fleet's :class:`refresher.store._captures.CaptureSource`: the index
is read from PostgreSQL (MVCC: a consistent view while the nodes write; ``every`` and
``latest`` stream through a server-side cursor, so memory stays bounded), and a record's file
is looked for in its node's noted directory, then under this machine's own base
(``node=<id>`` below it, the same layout); a file in neither raises one line naming the node
and where it looked.

Retention in a fleet (:func:`plan_node_prune`, :func:`apply_node_prune`) is per node: a node
drops and rewrites only records in its own files (``node_id`` its own), which no other node
writes, so it can never delete what another node's partitions own. Which versions go is
decided over the fleet's index: ``archive.keep_versions`` counts a page's versions on every
node and its latest version, wherever it is, is never dropped; ``archive.max_bytes`` is the
node's own disk. A pass holds :func:`maintenance_lock` shared, so no fleet backup copies
files while they are rewritten.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from refresher._errors import ArchiveUnreachable, StoreError
from refresher.store._captures import (
    CAPTURE_COLUMNS,
    IndexedCapture,
    choose_drops,
    indexed_capture,
)
from refresher.store._parquet import node_directory
from refresher.store._pg_dsn import connect, describe, redact
from refresher.store._prune import PrunePlan, build_plan

if TYPE_CHECKING:
    from refresher._config import Config

__all__ = [
    "FleetIndex",
    "absent_archives",
    "apply_absent",
    "apply_node_prune",
    "archive_base",
    "maintenance_lock",
    "node_archive_dir",
    "node_files_lock",
    "pass_lock",
    "plan_absent",
    "plan_node_prune",
]

_COLUMNS = f"{CAPTURE_COLUMNS}, node_id"
#: rows fetched from a server-side cursor at a time
_CHUNK = 5000
#: advisory lock of the fleet's file maintenance: retention passes hold it shared, a fleet
#: backup exclusive (it copies the files its dump of the index names)
_MAINTENANCE = 0x7266_6D61
#: advisory lock class of "a retention pass over node X's WARC files" (its second key is
#: hashtext(X)): the node's own passes and a live node's pass over it once it is absent
_NODE_FILES = 0x7266_6E66


def archive_base(config: Config) -> Path:
    """Where a fleet's nodes keep their WARC directories, as this config sees it."""
    if config.archive.dir is not None:
        return config.archive.dir
    if config.fleet.history_dir:
        return Path(config.fleet.history_dir) / "archive"
    return config.store.path.parent / "archive"


def node_archive_dir(config: Config, node_id: str | None = None) -> Path:
    """The WARC directory of ``node_id`` (default: this config's node)."""
    return node_directory(archive_base(config), node_id or config.fleet.node_id)


class FleetIndex:
    """The fleet's copy for a reader (``refresher get/cdx/export`` with ``fleet.dsn``): see the
    module docstring. ``base`` is where this machine finds the nodes' directories when their
    noted ones are not here (default: :func:`archive_base` of the reader's config)."""

    def __init__(self, dsn: str, *, base: Path) -> None:
        self.dsn = dsn
        self.base = base
        self._noted: dict[str, Path] | None = None

    def _read(self, what: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        def rows(cur: Any) -> list[tuple[Any, ...]]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        result: list[tuple[Any, ...]] = _run(self.dsn, what, rows)
        return result

    def _stream(self, what: str, sql: str) -> Iterator[IndexedCapture]:
        """``sql``'s rows through a server-side cursor, :data:`_CHUNK` at a time (one
        snapshot: the cursor lives in one transaction)."""
        try:
            with (
                connect(self.dsn) as con,
                con.transaction(),
                con.cursor(name="rf_captures") as cur,
            ):
                cur.itersize = _CHUNK
                cur.execute(sql)
                for row in cur:
                    yield indexed_capture(row)
        except psycopg.Error as e:
            raise StoreError(f"{what} ({redact(self.dsn)!r}): {describe(e)}") from e

    def lookup(self, keys: Sequence[str], *, at: float | None) -> list[IndexedCapture]:
        sql = (
            f"SELECT {_COLUMNS} FROM warc_records"
            " WHERE (url = ANY(%s) OR target_uri = ANY(%s)) AND kind = 'response'"
        )
        params: list[Any] = [list(keys), list(keys)]
        if at is not None:
            sql += " AND captured_at <= %s"
            params.append(at)
        rows = self._read(
            "reading the fleet's archive index", sql + " ORDER BY captured_at DESC, id DESC", params
        )
        return [indexed_capture(r) for r in rows]

    def every(self) -> Iterator[IndexedCapture]:
        return self._stream(
            "reading the fleet's archive index",
            f"SELECT {_COLUMNS} FROM warc_records ORDER BY url, captured_at, id",
        )

    def latest(self) -> Iterator[IndexedCapture]:
        return self._stream(
            "reading the fleet's archive index",
            f"SELECT {_COLUMNS} FROM (SELECT DISTINCT ON (page_id) * FROM warc_records"
            " WHERE kind = 'response' ORDER BY page_id, captured_at DESC, id DESC) t"
            " ORDER BY url",
        )

    def noted(self) -> dict[str, Path]:
        """Each node's WARC directory as the node noted it (on its own machine)."""
        if self._noted is None:
            rows = self._read(
                "reading the nodes' archive directories",
                "SELECT key, value FROM fleet_meta WHERE key LIKE 'archive\\_dir@%%'",
            )
            self._noted = {str(k).split("@", 1)[1]: Path(str(v)) for k, v in rows}
        return self._noted

    def candidates(self, node_id: str) -> list[Path]:
        """Where ``node_id``'s WARC files may be on this machine, in the order looked at."""
        out = [self.noted()[node_id]] if node_id in self.noted() else []
        mine = node_directory(self.base, node_id)
        return out if mine in out else [*out, mine]

    def locate(self, capture: IndexedCapture) -> Path:
        node = capture.node_id or ""
        places = self.candidates(node)
        for directory in places:
            path = directory / capture.file
            if path.exists():
                return path
        raise ArchiveUnreachable(
            f"the WARC file {capture.file!r} of node {node!r} is not reachable from this "
            f"machine (looked in {', '.join(repr(str(p)) for p in places)}); mount the fleet's "
            f"shared directory here as fleet.history_dir, or read it on node {node!r}"
        )


def plan_node_prune(
    cur: Any,
    node_id: str,
    *,
    keep_versions: int | None,
    max_bytes: int | None,
    protect: Collection[str] = (),
) -> PrunePlan:
    """What a retention pass of ``node_id`` removes from its own files (reads only); see the
    module docstring. ``protect``: files not to touch (the one being written)."""
    if keep_versions is None and max_bytes is None:
        return PrunePlan(files=())
    keep = keep_versions if keep_versions is not None else 2**62
    cur.execute(
        """
        WITH ranked AS (
            SELECT w.id, w.node_id, w.span, w.kind, w.captured_at,
                   sum(CASE WHEN w.kind = 'response' THEN 1 ELSE 0 END) OVER (
                       PARTITION BY w.page_id ORDER BY w.captured_at DESC, w.id DESC
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS newer
            FROM warc_records w
            WHERE w.page_id IN (SELECT page_id FROM warc_records WHERE node_id = %(node)s)
        )
        SELECT id, span,
               -- a revisit belongs to the version before it: it goes when that version goes
               CASE WHEN kind = 'response' THEN newer > %(keep)s ELSE newer >= %(keep)s END,
               kind = 'response' AND newer = 1
        FROM ranked WHERE node_id = %(node)s ORDER BY captured_at, id
        """,
        {"node": node_id, "keep": keep},
    )
    drop = set(choose_drops(cur.fetchall(), max_bytes=max_bytes))
    cur.execute(
        "SELECT DISTINCT file FROM warc_records WHERE node_id = %s AND id = ANY(%s)",
        (node_id, sorted(drop)),
    )
    files = sorted(str(f) for (f,) in cur.fetchall() if str(f) not in protect)
    cur.execute(
        "SELECT id, file, record_offset, span FROM warc_records"
        " WHERE node_id = %s AND file = ANY(%s) ORDER BY file, record_offset",
        (node_id, files),
    )
    return build_plan(drop, [(int(i), str(f), int(o), int(n)) for i, f, o, n in cur.fetchall()])


def apply_node_prune(
    cur: Any,
    node_id: str,
    plan: PrunePlan,
    copies: dict[str, tuple[str, list[tuple[int, int]]]],
) -> None:
    """The index change of a pass of ``node_id`` (in the caller's transaction): its dropped
    rows deleted, the kept rows of rewritten files pointed at their copies."""
    for f in plan.files:
        cur.execute(
            "DELETE FROM warc_records WHERE node_id = %s AND id = ANY(%s)",
            (node_id, list(f.drop)),
        )
        if f.file in copies:
            new, moves = copies[f.file]
            cur.execute(
                "UPDATE warc_records SET file = %s, record_offset = m.new"
                " FROM unnest(%s::bigint[], %s::bigint[]) AS m(old, new)"
                " WHERE node_id = %s AND file = %s AND record_offset = m.old",
                (new, [m[0] for m in moves], [m[1] for m in moves], node_id, f.file),
            )


@contextmanager
def _session_lock(dsn: str, what: str, *statements: tuple[str, Any]) -> Iterator[bool]:
    """Run ``statements`` on a connection of their own and yield the last one's boolean
    answer while the block runs (True when it answers nothing, as a waiting
    ``pg_advisory_lock`` does once it holds the lock); the session's advisory locks go with
    the connection when the block ends."""
    con = connect(dsn, autocommit=True)
    try:
        answer = None
        try:
            for sql, params in statements:
                cur = con.execute(sql, params)
                row = cur.fetchone() if cur.description else None
                answer = None if row is None else row[0]
        except psycopg.Error as e:
            raise StoreError(f"{what} ({redact(dsn)!r}): {describe(e)}") from e
        yield answer is None or bool(answer)
    finally:
        con.close()


def maintenance_lock(
    dsn: str, *, exclusive: bool = False, timeout: float = 600.0
) -> AbstractContextManager[bool]:
    """The fleet's file maintenance lock on a connection of its own, held while the block
    runs: shared (retention passes; yields False at once when a backup holds it) or exclusive
    (a backup; waits up to ``timeout`` seconds for running passes)."""
    what = "taking the fleet's maintenance lock"
    if exclusive:
        return _session_lock(
            dsn,
            what,
            (f"SET lock_timeout = '{int(timeout * 1000)}ms'", None),
            ("SELECT pg_advisory_lock(%s)", (_MAINTENANCE,)),
        )
    return _session_lock(dsn, what, ("SELECT pg_try_advisory_lock_shared(%s)", (_MAINTENANCE,)))


def node_files_lock(dsn: str, node_id: str) -> AbstractContextManager[bool]:
    """The lock on ``node_id``'s WARC files for a retention pass, on a connection of its own,
    held while the block runs; yields False at once when another pass holds it."""
    return _session_lock(
        dsn,
        f"locking node {node_id!r}'s WARC files",
        ("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_NODE_FILES, node_id)),
    )


@contextmanager
def pass_lock(dsn: str, node_id: str) -> Iterator[bool]:
    """What a fleet node's own retention pass holds: the maintenance lock (shared) and its own
    files' lock; yields False when either is held elsewhere (a fleet backup copying the files,
    a live node pruning this node's files while it was absent)."""
    with maintenance_lock(dsn) as free, node_files_lock(dsn, node_id) as mine:
        yield free and mine


def _run(dsn: str, what: str, fn: Any) -> Any:
    """``fn(cursor)`` in one transaction on a connection of its own."""
    try:
        with connect(dsn) as con, con.transaction(), con.cursor() as cur:
            return fn(cur)
    except psycopg.Error as e:
        raise StoreError(f"{what} ({redact(dsn)!r}): {describe(e)}") from e


def absent_archives(
    dsn: str, node_id: str, *, absent_after: float, base: Path
) -> list[tuple[str, Path]]:
    """The nodes other than ``node_id`` whose last heartbeat is older than ``absent_after``
    seconds (the database's clock) and that have records in the fleet's index, with their WARC
    directory where this machine reaches it (those it does not reach are left out)."""

    def read(cur: Any) -> list[str]:
        cur.execute(
            "SELECT n.node_id FROM nodes n WHERE n.node_id <> %s"
            " AND n.heartbeat_at < extract(epoch FROM clock_timestamp()) - %s"
            " AND EXISTS (SELECT 1 FROM warc_records w WHERE w.node_id = n.node_id)"
            " ORDER BY 1",
            (node_id, absent_after),
        )
        return [str(r[0]) for r in cur.fetchall()]

    index = FleetIndex(dsn, base=base)
    out = []
    for node in _run(dsn, "looking for absent nodes' WARC files", read):
        reachable = [d for d in index.candidates(node) if d.is_dir()]
        if reachable:
            out.append((node, reachable[0]))
    return out


def plan_absent(
    dsn: str,
    node_id: str,
    *,
    keep_versions: int | None,
    max_bytes: int | None,
    protect: Collection[str],
) -> PrunePlan:
    """:func:`plan_node_prune` of another node's files, on a connection of its own."""
    plan: PrunePlan = _run(
        dsn,
        f"planning the retention of node {node_id!r}'s WARC files",
        lambda cur: plan_node_prune(
            cur, node_id, keep_versions=keep_versions, max_bytes=max_bytes, protect=protect
        ),
    )
    return plan


def apply_absent(
    dsn: str, node_id: str, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
) -> None:
    """:func:`apply_node_prune` of another node's files, in one transaction of its own."""
    _run(
        dsn,
        f"pruning node {node_id!r}'s archive index",
        lambda cur: apply_node_prune(cur, node_id, plan, copies),
    )
