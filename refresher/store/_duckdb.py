"""The DuckDB store: pages, hosts, the append-only fetch history, and the batched writer.

Only the daemon opens the file (DuckDB allows one process). Inside the daemon every operation
goes through :class:`StoreService`, one ordered queue served by one worker thread: fetch records
are batched and committed together, and a query first commits what was queued before it, so a
query always sees every write sent earlier. A fetch is *acknowledged* when its batch commits;
after that it survives SIGTERM, SIGKILL and restart. What a crash can lose is exactly the fetches
not yet acknowledged: those in flight and those waiting for their batch (at most
``store.flush_interval`` seconds or ``store.batch_size`` records). A lost fetch left its page's
due time unchanged, so the page is simply fetched again.

A fetched document's findings (its links, canonical, noindex, sitemap lastmod) are kept in
``owed_documents`` in the fetch's own batch and deleted in the transaction in which discovery
stores them (:meth:`DuckDBStore.save_documents`), as a fleet's store does: a crash in between
loses no link; the next run hands the rows to its discovery again
(:meth:`DuckDBStore.owed_documents`).

Times are stored as unix seconds (DOUBLE); the public view ``fetch_log`` shows timestamps (UTC).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import numpy as np

from refresher._errors import StoreError
from refresher.discover._seen import fingerprints
from refresher.ops._logging import get_logger
from refresher.store._batch import (
    findings_of_doc,
    fold_pages,
    new_page_rows,
    owed_rows,
    page_sets,
)
from refresher.store._captures import (
    CAPTURES_MIGRATION,
    CaptureRow,
    file_ends,
    insert_captures,
)
from refresher.store._change_stats import (
    ESTIMATOR_COLUMNS,
    MIGRATION_SQL,
    PAIR_NAMES,
    STAT_COLUMNS,
    RecordArrays,
    fill_from_history,
    fold_arrays,
    moved_statistics,
    pair_column,
    read_statistics,
    record_arrays,
    stat_column,
    state_of,
    statistics_from_history,
)
from refresher.store._history import prune_history
from refresher.store._hosts import host_summary
from refresher.store._interface import (
    SUCCESS_SQL,
    DocumentUpdate,
    EstimatorInputs,
    FetchRecord,
    Findings,
    HostRow,
    HostSummary,
    HostUpdate,
    NewPage,
    PageRow,
    PlanUpdate,
    RobotsUpdate,
    StoreStatus,
    next_due_sql,
    response_join_sql,
)
from refresher.store._prune import PruneCalls, PrunePlan, apply_plan, plan_prune
from refresher.store._service import BatchedService
from refresher.store._timeline import (
    BATCH_COLUMNS,
    LISTED_COLUMN,
    SITEMAP_SINCE_SQL,
    TIMELINE_COLUMNS,
    TrustCounts,
    estimator_column_sql,
    fold_fetch_arrays,
    fold_read_points,
    pair_migration_sql,
    timeline_migration_sql,
    unchanged_reads,
)

__all__ = [
    "FETCH_LOG",
    "SCHEMA_VERSION",
    "DuckDBStore",
    "StoreService",
    "first_row",
]

T = TypeVar("T")
log = get_logger("store")

# Each entry migrates the schema from version i to i + 1. Never edit a released entry: append.
_MIGRATIONS: list[str | Callable[[Any], None]] = [
    """
    CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR);
    CREATE TABLE hosts (
        id INTEGER PRIMARY KEY,
        name VARCHAR NOT NULL UNIQUE,       -- "host" or "host:port": the politeness unit
        scheme VARCHAR NOT NULL,
        next_allowed DOUBLE NOT NULL DEFAULT 0,  -- unix seconds
        delay DOUBLE,                        -- seconds, the last politeness delay
        backoff DOUBLE NOT NULL DEFAULT 0,   -- seconds, the current error backoff
        errors INTEGER NOT NULL DEFAULT 0,   -- consecutive failed fetches
        robots_status INTEGER,               -- HTTP status of robots.txt, NULL = unreachable
        robots_body BLOB,                    -- at most 500 KiB
        robots_fetched_at DOUBLE,
        robots_expires_at DOUBLE,
        paused BOOLEAN NOT NULL DEFAULT false
    );
    CREATE TABLE pages (
        id BIGINT PRIMARY KEY,
        url VARCHAR NOT NULL UNIQUE,
        host_id INTEGER NOT NULL,
        first_seen DOUBLE NOT NULL,
        last_fetch DOUBLE,
        last_change DOUBLE,                  -- last fetch that saw a different digest
        etag VARCHAR,
        last_modified VARCHAR,
        digest BLOB,                         -- of the last successful fetch's body
        fetches INTEGER NOT NULL DEFAULT 0,
        changes INTEGER NOT NULL DEFAULT 0,
        rate DOUBLE,                         -- λ̂, changes per second
        rate_n DOUBLE,                       -- evidence behind λ̂ (effective observations)
        target_rate DOUBLE,                  -- f, fetches per second assigned by the policy
        weight DOUBLE NOT NULL DEFAULT 1,
        due_at DOUBLE NOT NULL,              -- unix seconds
        status VARCHAR NOT NULL DEFAULT 'new',  -- new | ok | not_modified | error | denied | gone
        source VARCHAR NOT NULL DEFAULT 'seed'
    );
    CREATE TABLE fetches (
        id BIGINT NOT NULL,
        page_id BIGINT NOT NULL,
        host_id INTEGER NOT NULL,
        started_at DOUBLE NOT NULL,
        finished_at DOUBLE NOT NULL,
        duration DOUBLE NOT NULL,            -- seconds
        status SMALLINT,                     -- HTTP status; NULL when no response
        bytes BIGINT NOT NULL,
        digest BLOB,
        changed BOOLEAN NOT NULL,
        not_modified BOOLEAN NOT NULL,
        error_kind VARCHAR,                  -- FetchError.kind, 'denied' for robots.txt
        policy VARCHAR NOT NULL,
        final_url VARCHAR,
        redirects SMALLINT NOT NULL
    );
    CREATE TABLE policy_periods (
        started_at DOUBLE NOT NULL,
        policy VARCHAR NOT NULL,
        budget DOUBLE NOT NULL               -- fetches per second
    );
    CREATE VIEW fetch_log AS
    SELECT p.url AS url,
           h.name AS host,
           make_timestamp(CAST(f.started_at * 1e6 AS BIGINT)) AS started_at,
           make_timestamp(CAST(f.finished_at * 1e6 AS BIGINT)) AS finished_at,
           f.status AS status,
           f.changed AS changed,
           f.not_modified AS not_modified,
           f.bytes AS bytes,
           f.policy AS policy,
           f.error_kind AS error_kind,
           f.duration AS duration
    FROM fetches f JOIN pages p ON p.id = f.page_id JOIN hosts h ON h.id = f.host_id;
    """,
]


#: the ``fetch_log`` view's query (since migration 2; a fleet's history has it too:
#: :mod:`refresher.store._parquet`). A change to it needs a new migration.
FETCH_LOG = """
    SELECT p.url AS url,
           h.name AS host,
           make_timestamp(CAST(f.started_at * 1e6 AS BIGINT)) AS started_at,
           make_timestamp(CAST(f.finished_at * 1e6 AS BIGINT)) AS finished_at,
           f.status AS status,
           f.changed AS changed,
           f.not_modified AS not_modified,
           f.bytes AS bytes,
           f.policy AS policy,
           f.error_kind AS error_kind,
           f.duration AS duration,
           f.meaningful AS meaningful
    FROM fetches f JOIN pages p ON p.id = f.page_id JOIN hosts h ON h.id = f.host_id
"""


def _migrate_2(con: Any) -> None:
    """Discovery: depth, URL fingerprints, near-duplicate fingerprints, link edges."""
    con.execute(
        """
        ALTER TABLE pages ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE pages ADD COLUMN url_fp BIGINT;
        ALTER TABLE pages ADD COLUMN fingerprint UBIGINT;   -- simhash of the last body
        ALTER TABLE pages ADD COLUMN meaningful_changes INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE pages ADD COLUMN canonical VARCHAR;      -- rel=canonical, recorded
        ALTER TABLE pages ADD COLUMN noindex BOOLEAN NOT NULL DEFAULT false;
        ALTER TABLE pages ADD COLUMN duplicate_of BIGINT;    -- a page serving the same body
        ALTER TABLE pages ADD COLUMN sitemap_lastmod DOUBLE; -- latest <lastmod>, unix seconds
        ALTER TABLE fetches ADD COLUMN meaningful BOOLEAN;   -- changed beyond the simhash threshold
        ALTER TABLE fetches ADD COLUMN fingerprint UBIGINT;
        CREATE TABLE links (src BIGINT NOT NULL, dst BIGINT NOT NULL, found_at DOUBLE NOT NULL);
        """
    )
    urls = [r[0] for r in con.execute("SELECT url FROM pages").fetchall()]
    if urls:
        con.register("_fps", {"url": np.array(urls, dtype=object), "fp": fingerprints(urls)})
        con.execute("UPDATE pages SET url_fp = _fps.fp FROM _fps WHERE pages.url = _fps.url")
        con.unregister("_fps")
    con.execute(f"CREATE OR REPLACE VIEW fetch_log AS {FETCH_LOG};")


_MIGRATIONS.append(_migrate_2)
# 3: Last-Modified of each fetch as unix seconds: change times for the estimator.
_MIGRATIONS.append("ALTER TABLE fetches ADD COLUMN last_modified_at DOUBLE;")
# 4: the archive's index (refresher.store._captures).
_MIGRATIONS.append(CAPTURES_MIGRATION)


def _migrate_5(con: Any) -> None:
    """Per-page change statistics (refresher.store._change_stats), folded from the history."""
    con.execute(MIGRATION_SQL)
    fill_from_history(con)


_MIGRATIONS.append(_migrate_5)
# 6: the documents owed to discovery, written in their fetch's batch (as a fleet's store does)
_MIGRATIONS.append(
    """
    CREATE TABLE owed_documents (
        page_id BIGINT NOT NULL,
        fetched_at DOUBLE NOT NULL,          -- the fetch that found it (finished_at)
        run VARCHAR NOT NULL,                -- the daemon's run that wrote or last took it
        created_at DOUBLE NOT NULL,          -- unix seconds, written or last taken
        document VARCHAR NOT NULL            -- JSON: links, canonical, noindex, lastmod, …
    );
    """
)
# 7: sitemap reads as points of each listed page's timeline, and the hosts' trust counts
# (refresher.store._timeline)
_MIGRATIONS.append(timeline_migration_sql())
# 8: the timeline's pairs only a trusted Last-Modified times (refresher.store._timeline)
_MIGRATIONS.append(pair_migration_sql())
#: the first schema version with per-page change statistics
STATISTICS_VERSION = 5
#: the first schema version with sitemap timelines
TIMELINE_VERSION = 7
#: the first schema version with the timeline's Last-Modified pairs
PAIR_VERSION = 8
SCHEMA_VERSION = len(_MIGRATIONS)
#: pages per transaction of :meth:`DuckDBStore.save_plan`
_PLAN_SLICE = 1 << 20
#: the one definition of a due time over a new plan (:func:`next_due`), in SQL
_PLAN_DUE = next_due_sql("_plan.target", "?")


def first_row(result: Any) -> tuple[Any, ...] | None:
    """The first row of a DuckDB result, consuming it all.

    DuckDB 2 keeps a partly fetched result open and then refuses ``register``; fetch it all.
    """
    rows = result.fetchall()
    return tuple(rows[0]) if rows else None


class DuckDBStore:
    """Synchronous access to the DuckDB file. Use from one thread at a time.

    Inside the daemon, use it only through :class:`StoreService`; the CLI uses it on a stopped
    store, through :func:`refresher.store.open_store`.
    """

    def __init__(self, path: Path, *, memory_limit: str = "256MB", read_only: bool = False):
        self.path = path
        if not read_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(
                    f"cannot create the store directory {str(path.parent)!r}: {e}; "
                    "fix store.path or the directory's permissions"
                ) from e
        try:
            self._con = duckdb.connect(
                str(path), read_only=read_only, config={"memory_limit": memory_limit}
            )
        except duckdb.Error as e:
            msg = str(e)
            if "lock" in msg.lower():
                raise StoreError(
                    f"{str(path)!r} is in use by another process (a running daemon?); "
                    "talk to it with `refresher status`/`refresher seed`, or stop it first"
                ) from e
            raise StoreError(f"cannot open the store {str(path)!r}: {msg}") from e
        if not read_only:
            self._migrate()
        #: this process's run: the owed documents it wrote or took (its discovery has them)
        self.run = uuid.uuid4().hex[:16]
        self._in_transaction = False
        self._next_page = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM pages")
        self._next_host = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM hosts")
        self._next_fetch = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM fetches")
        self._next_capture = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM warc_records")
        #: whether a sitemap read was ever folded (asked at the first batch; see _has_timelines)
        self._timelines: bool | None = None

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = first_row(self._con.execute(sql, list(params)))
        return int(row[0]) if row and row[0] is not None else 0

    def _migrate(self) -> None:
        tables = {
            r[0] for r in self._con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        }
        version = 0
        if "meta" in tables:
            row = first_row(
                self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'")
            )
            version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{str(self.path)!r} has schema version {version}, newer than this refresher "
                f"understands ({SCHEMA_VERSION}); upgrade refresher"
            )
        for target in range(version, SCHEMA_VERSION):
            try:
                self._con.execute("BEGIN")
                step = _MIGRATIONS[target]
                if callable(step):
                    step(self._con)
                else:
                    self._con.execute(step)
                self._con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(target + 1)]
                )
                self._con.execute("COMMIT")
            except duckdb.Error as e:
                self._con.execute("ROLLBACK")
                raise StoreError(
                    f"migrating {str(self.path)!r} to version {target + 1}: {e}"
                ) from e
            log.info("schema migrated", version=target + 1, path=str(self.path))

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[None]:
        """The block in one transaction; inside another one, part of that one."""
        if self._in_transaction:
            yield
            return
        self._con.execute("BEGIN")
        self._in_transaction = True
        try:
            yield
            self._con.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(duckdb.Error):
                self._con.execute("ROLLBACK")
            if isinstance(e, duckdb.Error):
                raise StoreError(f"{what}: {e}") from e
            raise
        finally:
            self._in_transaction = False

    def schema_version(self) -> int:
        row = first_row(self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'"))
        return int(row[0]) if row else 0

    def close(self) -> None:
        # Read-only or already closed: nothing to fold into the file.
        with contextlib.suppress(duckdb.Error):
            self._con.execute("CHECKPOINT")
        self._con.close()

    # -- pages and hosts ---------------------------------------------------------------------

    def _ensure_hosts(self, pages: Sequence[NewPage]) -> None:
        # http:// and https:// on their default ports share one host key (one politeness unit)
        # and hosts.name is unique: keep one row per name, with the first scheme seen.
        schemes: dict[str, str] = {}
        for p in pages:
            schemes.setdefault(p.host, p.scheme)
        names = sorted(schemes.items())
        if not names:
            return
        batch = {
            "name": np.array([n for n, _ in names], dtype=object),
            "scheme": np.array([s for _, s in names], dtype=object),
        }
        self._con.register("_new_hosts", batch)
        self._con.execute(
            """
            INSERT INTO hosts (id, name, scheme)
            SELECT ? + row_number() OVER (ORDER BY n.name) - 1, n.name, n.scheme
            FROM _new_hosts n ANTI JOIN hosts h ON h.name = n.name
            """,
            [self._next_host],
        )
        self._next_host = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM hosts")

    def add_pages(self, pages: Sequence[NewPage], *, now: float) -> list[PageRow]:
        """Insert the pages not yet known, due at ``now``; returns the inserted ones."""
        unique = list({p.url: p for p in pages}.values())
        if not unique:
            return []
        try:
            with self._transaction("adding pages"):
                self._ensure_hosts(unique)
                urls = [p.url for p in unique]
                batch = {
                    "url": np.array(urls, dtype=object),
                    "host": np.array([p.host for p in unique], dtype=object),
                    "source": np.array([p.source for p in unique], dtype=object),
                    "depth": np.array([p.depth for p in unique], dtype=np.int32),
                    "fp": fingerprints(urls),
                }
                self._con.register("_new_pages", batch)
                rows = self._con.execute(
                    """
                    INSERT INTO pages (id, url, host_id, first_seen, due_at, source, depth, url_fp)
                    SELECT ? + row_number() OVER (ORDER BY n.url) - 1, n.url, h.id, ?, ?, n.source,
                           n.depth, n.fp
                    FROM _new_pages n JOIN hosts h ON h.name = n.host
                    ANTI JOIN pages p ON p.url = n.url
                    RETURNING id, url, host_id
                    """,
                    [self._next_page, now, now],
                ).fetchall()
        finally:
            # Unregistered after the transaction ended, so a failure shows its own cause.
            for view in ("_new_hosts", "_new_pages"):
                with contextlib.suppress(duckdb.Error):
                    self._con.unregister(view)
        self._next_page += len(rows)
        return new_page_rows(rows, unique, now=now)

    def known_fingerprints(self, fps: np.ndarray) -> np.ndarray:
        """Which of these URL fingerprints the store has (bool mask, same order)."""
        if len(fps) == 0:
            return np.zeros(0, dtype=bool)
        self._con.register("_fps", {"fp": fps})
        try:
            found = self._con.execute(
                "SELECT fp FROM _fps SEMI JOIN pages ON pages.url_fp = _fps.fp"
            ).fetchnumpy()["fp"]
        finally:
            self._con.unregister("_fps")
        return np.isin(fps, found)

    def page_ids(self, urls: np.ndarray) -> np.ndarray:
        """Each URL's page id, −1 where the store has no such page (``estimate.known_rates``)."""
        out = np.full(urls.size, -1, dtype=np.int64)
        if urls.size == 0:
            return out
        self._con.register("_known", {"url": urls.astype(object), "i": np.arange(urls.size)})
        try:
            got = self._con.execute(
                "SELECT k.i, p.id FROM _known k JOIN pages p ON p.url = k.url"
            ).fetchnumpy()
        finally:
            self._con.unregister("_known")
        out[np.asarray(got["i"], dtype=np.intp)] = np.asarray(got["id"], dtype=np.int64)
        return out

    def add_links(self, src: int, urls: Sequence[str], *, now: float) -> int:
        """Record edges from page ``src`` to the known pages among ``urls``; returns how many."""
        if not urls:
            return 0
        self._con.register("_dst", {"url": np.array(list(urls), dtype=object)})
        try:
            rows = self._con.execute(
                """
                INSERT INTO links SELECT ?, p.id, ? FROM _dst JOIN pages p ON p.url = _dst.url
                WHERE p.id <> ? RETURNING dst
                """,
                [src, now, src],
            ).fetchall()
        finally:
            self._con.unregister("_dst")
        return len(rows)

    def _save_lastmod(
        self,
        lastmod: Sequence[tuple[str, float]],
        coarse: Sequence[tuple[str, float]],
        sitemap: int,
        read_at: float | None,
    ) -> None:
        """Sitemap ``<lastmod>`` values (unix seconds) of pages by URL; the latest is kept.
        With the read's time (the sitemap fetch's end), each of ``lastmod`` (given to the
        second; not the ``coarse`` ones) is also a point of its page's timeline
        (:meth:`_fold_read`)."""
        every = [*lastmod, *coarse]
        self._con.register(
            "_lm",
            {
                "url": np.array([u for u, _ in every], dtype=object),
                "t": np.array([t for _, t in every], dtype=np.float64),
                "exact": np.arange(len(every)) < len(lastmod),
            },
        )
        try:
            self._con.execute(
                """
                UPDATE pages SET sitemap_lastmod = greatest(coalesce(sitemap_lastmod, 0), m.t)
                FROM (SELECT url, max(t) AS t FROM _lm GROUP BY url) m
                WHERE pages.url = m.url
                """
            )
            if read_at is not None:
                self._fold_read(sitemap, read_at)
        finally:
            self._con.unregister("_lm")

    def due_pages(self, *, after: tuple[float, int], until: float, limit: int) -> list[PageRow]:
        """Pages with (due_at, id) > ``after`` and due_at ≤ ``until``, earliest first (a
        gone or denied page is due at its re-check)."""
        rows = self._con.execute(
            """
            SELECT p.id, p.url, p.host_id, h.name, p.due_at, p.etag, p.last_modified,
                   p.digest, p.target_rate, p.depth, p.fingerprint, p.rate, p.weight,
                   p.source, p.status <> 'new'
            FROM pages p JOIN hosts h ON h.id = p.host_id
            WHERE NOT h.paused
              AND (p.due_at, p.id) > (?, ?) AND p.due_at <= ?
            ORDER BY p.due_at, p.id
            LIMIT ?
            """,
            [after[0], after[1], until, limit],
        ).fetchall()
        return [
            PageRow(
                id=r[0],
                url=r[1],
                host_id=r[2],
                host=r[3],
                due_at=r[4],
                etag=r[5],
                last_modified=r[6],
                digest=r[7],
                target_rate=r[8],
                depth=r[9],
                fingerprint=r[10],
                rate=r[11],
                weight=r[12],
                source=r[13],
                tried=r[14],
            )
            for r in rows
        ]

    def hosts(self, ids: Iterable[int]) -> dict[int, HostRow]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        rows = self._con.execute(
            """
            SELECT id, name, scheme, next_allowed, delay, backoff, errors, robots_status,
                   robots_body, robots_expires_at, paused
            FROM hosts WHERE list_contains(?, id)
            """,
            [wanted],
        ).fetchall()
        return {
            r[0]: HostRow(
                id=r[0],
                name=r[1],
                scheme=r[2],
                next_allowed=r[3],
                delay=r[4],
                backoff=r[5],
                errors=r[6],
                robots_status=r[7],
                robots_body=r[8],
                robots_expires_at=r[9],
                paused=r[10],
            )
            for r in rows
        }

    def save_robots(
        self, host_id: int, *, status: int | None, body: bytes, fetched_at: float, expires_at: float
    ) -> None:
        self._con.execute(
            """
            UPDATE hosts SET robots_status = ?, robots_body = ?, robots_fetched_at = ?,
                             robots_expires_at = ?
            WHERE id = ?
            """,
            [status, body, fetched_at, expires_at, host_id],
        )

    def set_paused(self, host: str, paused: bool) -> bool:
        rows = self._con.execute(
            "UPDATE hosts SET paused = ? WHERE name = ? RETURNING id", [paused, host]
        ).fetchall()
        return bool(rows)

    def count_pages(self) -> int:
        return self._scalar("SELECT count(*) FROM pages WHERE status <> 'gone'")

    def get_meta(self, key: str) -> str | None:
        row = first_row(self._con.execute("SELECT value FROM meta WHERE key = ?", [key]))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str | None) -> None:
        if value is None:
            self._con.execute("DELETE FROM meta WHERE key = ?", [key])
        else:
            self._con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    def switch_policy(self, policy: str, *, configured: str, budget: float, now: float) -> None:
        """Record an operator's switch to ``policy`` (made while ``configured`` was the
        config's name): it holds across restarts until the config names another policy."""
        self.set_meta("policy", policy)
        self.set_meta("policy_configured", configured)
        self.record_policy(policy, budget, now=now)

    def policy_in_force(self, configured: str) -> str:
        """The operator's last switch, unless the config has named another policy since."""
        switched = self.get_meta("policy")
        if switched is not None and self.get_meta("policy_configured") == configured:
            return switched
        return configured

    def record_policy(self, policy: str, budget: float, *, now: float) -> None:
        last = first_row(
            self._con.execute(
                "SELECT policy, budget FROM policy_periods ORDER BY started_at DESC LIMIT 1"
            )
        )
        if last is None or last[0] != policy or last[1] != budget:
            self._con.execute("INSERT INTO policy_periods VALUES (?, ?, ?)", [now, policy, budget])

    # -- the history -------------------------------------------------------------------------

    def write(
        self,
        records: Sequence[FetchRecord],
        hosts: Sequence[HostUpdate],
        robots: Sequence[RobotsUpdate] = (),
        captures: Sequence[CaptureRow] = (),
    ) -> int:
        """Append ``records`` and update pages, hosts and robots.txt, in one transaction, with
        the index rows of the archived records (synced to disk before); returns how many
        records.

        Each statement scans its batch's numpy columns through DuckDB's replacement scan (a
        local variable named in the SQL) rather than ``register``/``unregister``: a view
        created and dropped in the catalog cost ~0.5 ms per statement, a third of a batch's
        fixed cost."""
        n = len(records)
        con = self._con
        try:
            con.execute("BEGIN")
            if n:
                _f = self._fetch_columns(records)
                con.execute(f"INSERT INTO fetches ({', '.join(_f)}) SELECT * FROM _f")
                self._update_pages(records)
            latest_host = list({h.host_id: h for h in hosts}.values())
            if latest_host:
                _h = {
                    "id": np.array([h.host_id for h in latest_host], dtype=np.int32),
                    "next_allowed": np.array(
                        [h.next_allowed for h in latest_host], dtype=np.float64
                    ),
                    "delay": np.array([h.delay for h in latest_host], dtype=np.float64),
                    "backoff": np.array([h.backoff for h in latest_host], dtype=np.float64),
                    "errors": np.array([h.errors for h in latest_host], dtype=np.int32),
                }
                con.execute(
                    """
                    UPDATE hosts SET next_allowed = _h.next_allowed, delay = _h.delay,
                        backoff = _h.backoff, errors = _h.errors
                    FROM _h WHERE hosts.id = _h.id
                    """
                )
            next_capture = insert_captures(con, captures, first=self._next_capture)
            self._insert_owed(records)
            for rb in robots:
                self.save_robots(
                    rb.host_id,
                    status=rb.status,
                    body=rb.body,
                    fetched_at=rb.fetched_at,
                    expires_at=rb.expires_at,
                )
            con.execute("COMMIT")
        except duckdb.Error as e:
            con.execute("ROLLBACK")
            raise StoreError(f"writing {n} fetch records to {str(self.path)!r}: {e}") from e
        self._next_fetch += n
        self._next_capture = next_capture
        return n

    def _fetch_columns(self, records: Sequence[FetchRecord]) -> dict[str, np.ndarray]:
        """The ``fetches`` rows of ``records``, numbered from the next free id."""
        n = len(records)
        return {
            "id": np.arange(self._next_fetch, self._next_fetch + n, dtype=np.int64),
            "page_id": np.array([r.page_id for r in records], dtype=np.int64),
            "host_id": np.array([r.host_id for r in records], dtype=np.int32),
            "started_at": np.array([r.started_at for r in records], dtype=np.float64),
            "finished_at": np.array([r.finished_at for r in records], dtype=np.float64),
            "duration": np.array([r.duration for r in records], dtype=np.float64),
            "status": np.array([r.status for r in records], dtype=object),
            "bytes": np.array([r.body_bytes for r in records], dtype=np.int64),
            "digest": np.array([r.digest for r in records], dtype=object),
            "changed": np.array([r.changed for r in records], dtype=bool),
            "not_modified": np.array([r.not_modified for r in records], dtype=bool),
            "error_kind": np.array([r.error_kind for r in records], dtype=object),
            "policy": np.array([r.policy for r in records], dtype=object),
            "final_url": np.array([r.final_url for r in records], dtype=object),
            "redirects": np.array([r.redirects for r in records], dtype=np.int16),
            "meaningful": np.array([r.meaningful for r in records], dtype=object),
            "fingerprint": np.array([r.fingerprint for r in records], dtype=object),
            "last_modified_at": np.array(
                [math.nan if r.last_modified_at is None else r.last_modified_at for r in records],
                dtype=np.float64,
            ),
        }

    def _update_pages(self, records: Sequence[FetchRecord]) -> None:
        """The state ``records`` leave their pages in (inside :meth:`write`'s transaction): a
        page fetched twice within one batch: the later state wins, the counts add up. The
        change statistics are read and folded here; a statistic no page of the batch moved
        is not written (on a first pass 18 of 21, on a refresh without changes 14: each
        column an UPDATE writes costs DuckDB ~0.1 ms a batch). The records become arrays
        once, for every fold of the batch."""
        fold = fold_pages(records)
        pages_ = sorted(fold.last, key=lambda r: r.page_id)
        page_ids = np.array([r.page_id for r in pages_], dtype=np.int64)
        timelines = self._has_timelines()
        state = state_of(self._con, page_ids, BATCH_COLUMNS if timelines else STAT_COLUMNS)
        arrays = record_arrays(records)
        moved = moved_statistics(state, fold_arrays(state, page_ids, arrays))
        if timelines:
            self._fold_timeline(state, page_ids, arrays)
        _p = moved | {
            "id": page_ids,
            "last_fetch": np.array([r.finished_at for r in pages_], dtype=np.float64),
            "changed_at": np.array(
                [fold.changed_at.get(r.page_id, math.nan) for r in pages_], dtype=np.float64
            ),
            "etag": np.array([r.etag for r in pages_], dtype=object),
            "last_modified": np.array([r.last_modified for r in pages_], dtype=object),
            "digest": np.array([r.page_digest for r in pages_], dtype=object),
            "n": np.array([fold.fetches[r.page_id] for r in pages_], dtype=np.int32),
            "x": np.array([fold.changes[r.page_id] for r in pages_], dtype=np.int32),
            "status": np.array([r.page_status for r in pages_], dtype=object),
            "due_at": np.array([r.due_at for r in pages_], dtype=np.float64),
            "m": np.array([fold.meaningful[r.page_id] for r in pages_], dtype=np.int32),
            "fingerprint": np.array([r.fingerprint for r in pages_], dtype=object),
            "duplicate_of": np.array([r.duplicate_of for r in pages_], dtype=object),
        }
        stat_sets = "".join(f"{c} = _p.{c}, " for c in moved)
        self._con.execute(
            f"""
            UPDATE pages SET {stat_sets}{page_sets("_p")}
            FROM _p WHERE pages.id = _p.id
            """
        )
        if timelines:
            for sitemap, read_at in unchanged_reads(page_ids, state[LISTED_COLUMN], arrays):
                self._fold_listed(self._entries(sitemap), read_at)

    def _has_timelines(self) -> bool:
        """Whether any sitemap read was folded into this store (a page with a timeline, or a
        sitemap page with entries): until one is, a batch reads only the fetch-only statistics
        (the two columns more cost ~0.3 ms of a 10-12 ms batch of 50). Asked once; this
        process is the file's one writer, and :meth:`_fold_read` sets it."""
        if self._timelines is None:
            self._timelines = bool(
                self._scalar(
                    "SELECT EXISTS (SELECT 1 FROM pages"
                    f" WHERE tl_n IS NOT NULL OR {LISTED_COLUMN} IS NOT NULL)"
                )
            )
        return self._timelines

    def _fold_timeline(
        self, state: dict[str, np.ndarray], page_ids: np.ndarray, arrays: RecordArrays
    ) -> None:
        """The sitemap timelines of the batch's listed pages, and the trust checks of their
        pending claims (:mod:`refresher.store._timeline`; inside :meth:`write`'s
        transaction). Pages never listed by a sitemap read cost one read of NULLs."""
        active = np.isfinite(state["tl_n"])
        if not active.any():
            return
        ids = page_ids[active]
        before = {c: state[c][active] for c in STAT_COLUMNS}
        before |= state_of(self._con, ids, TIMELINE_COLUMNS)
        folded, counts = fold_fetch_arrays(before, ids, arrays)
        moved = moved_statistics(
            {c: before[c] for c in TIMELINE_COLUMNS}, {c: folded[c] for c in TIMELINE_COLUMNS}
        )
        if moved:
            self._write_timeline(ids, moved)
        self._add_trust(counts)

    def _write_timeline(self, page_ids: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        _tl = {"id": page_ids, **columns}  # scanned by name (DuckDB's replacement scan)
        sets = ", ".join(f"{c} = _tl.{c}" for c in columns)
        self._con.execute(f"UPDATE pages SET {sets} FROM _tl WHERE pages.id = _tl.id")

    def _add_trust(self, counts: TrustCounts) -> None:
        """Add a fold's trust checks to its hosts' counts."""
        if counts.host_ids.size == 0:
            return
        _trust = {  # scanned by name (DuckDB's replacement scan)
            "id": counts.host_ids,
            "passed": counts.passed,
            "failed": counts.failed,
        }
        self._con.execute(
            "UPDATE hosts SET sitemap_passed = sitemap_passed + _trust.passed,"
            " sitemap_failed = sitemap_failed + _trust.failed FROM _trust"
            " WHERE hosts.id = _trust.id"
        )

    def _fold_read(self, sitemap: int, read_at: float) -> None:
        """A sitemap read as points of its listed pages' timelines (the lastmods given to the
        second in ``_lm``, registered by :meth:`_save_lastmod`): the pages of the sitemap's own
        host only, so a read touches only its host's rows (a fleet node's own partition). Its
        entries are kept for the unchanged re-reads (:func:`unchanged_reads`)."""
        self._timelines = True  # every later batch reads whether its pages have timelines
        got = self._con.execute(
            """
            SELECT p.id AS page_id, p.host_id, m.t AS lastmod
            FROM (SELECT url, max(t) AS t FROM _lm WHERE exact GROUP BY url) m
            JOIN pages p ON p.url = m.url
            WHERE p.host_id = (SELECT host_id FROM pages WHERE id = ?) ORDER BY p.id
            """,
            [sitemap],
        ).fetchnumpy()
        self._fold_listed(got, read_at)
        self._con.execute("DELETE FROM sitemap_entries WHERE sitemap_id = ?", [sitemap])
        _entries = {"page_id": got["page_id"], "lastmod": got["lastmod"]}  # by name
        self._con.execute(
            "INSERT INTO sitemap_entries SELECT ?, page_id, lastmod FROM _entries", [sitemap]
        )
        self._con.execute(
            f"UPDATE pages SET {LISTED_COLUMN} = ? WHERE id = ?", [len(got["page_id"]), sitemap]
        )

    def _entries(self, sitemap: int) -> dict[str, np.ndarray]:
        """The entries of the sitemap's last read (of pages that still exist)."""
        return self._con.execute(
            "SELECT e.page_id, p.host_id, e.lastmod FROM sitemap_entries e"
            " JOIN pages p ON p.id = e.page_id WHERE e.sitemap_id = ? ORDER BY e.page_id",
            [sitemap],
        ).fetchnumpy()

    def _fold_listed(self, entries: dict[str, np.ndarray], read_at: float) -> None:
        """Fold one read of these entries (page_id sorted, host_id, lastmod) at ``read_at``.
        Only the timeline columns the read moved are written (a read after each page's fetch
        moves 5 of 24: -2.6 % CPU a batch of 50 on bench_timeline's sitemap web)."""
        ids = np.asarray(entries["page_id"], dtype=np.int64)
        if ids.size == 0:
            return
        state = state_of(self._con, ids, STAT_COLUMNS + TIMELINE_COLUMNS)
        hosts = np.asarray(entries["host_id"], dtype=np.int64)
        lastmods = np.asarray(entries["lastmod"], dtype=np.float64)
        folded, counts = fold_read_points(state, ids, ids, hosts, read_at, lastmods)
        moved = moved_statistics(
            {c: state[c] for c in TIMELINE_COLUMNS}, {c: folded[c] for c in TIMELINE_COLUMNS}
        )
        if moved:
            self._write_timeline(ids, moved)
        self._add_trust(counts)

    def counts(self) -> tuple[int, int, int]:
        """(pages, hosts, fetches)."""
        row = first_row(
            self._con.execute(
                "SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM hosts),"
                " (SELECT count(*) FROM fetches)"
            )
        )
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    # -- the named operations of the interface (synchronous; see refresher.store.Store) --------

    def load_due(
        self, *, after: tuple[float, int], until: float, limit: int, known_hosts: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        pages = self.due_pages(after=after, until=until, limit=limit)
        return pages, self.hosts({p.host_id for p in pages} - known_hosts)

    def add_pages_with_hosts(
        self, pages: Sequence[NewPage], *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        rows = self.add_pages(pages, now=now)
        return rows, self.hosts({r.host_id for r in rows})

    def save_document(
        self, update: DocumentUpdate, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        return self.save_documents([update], now=now)[0]

    def save_documents(
        self, updates: Sequence[DocumentUpdate], *, now: float
    ) -> list[tuple[list[PageRow], dict[int, HostRow], int]]:
        """:meth:`save_document` for each of ``updates``, with one statement of each kind for
        them all: the new pages, the edges (one join against the pages, not one a document)
        and the pages' facts. A page is new in one update at most (discovery adds it with the
        first document that links it), so adding them all first changes no edge.

        One transaction, which also deletes the owed documents of the updates' fetches
        (:attr:`DocumentUpdate.fetched_at`): discovery has stored all they found."""
        with self._transaction("saving documents"):
            rows, hosts = self.add_pages_with_hosts([p for u in updates for p in u.new], now=now)
            pairs = [(u.page_id, url) for u in updates if not u.synthetic for url in u.linked]
            edges = self._add_edges(pairs, now=now) if pairs else {}
            own = [u for u in updates if not u.synthetic]
            if own:
                self._save_flags({u.page_id: (u.canonical, u.noindex) for u in own})
            for u in own:
                if u.lastmod or u.coarse_lastmod:
                    self._save_lastmod(u.lastmod, u.coarse_lastmod, u.page_id, u.fetched_at)
            self._forget_owed(updates)
        by_url = {r.url: r for r in rows}
        out = []
        for u in updates:
            mine = [by_url.pop(p.url) for p in u.new if p.url in by_url]
            count = 0 if u.synthetic else edges.get(u.page_id, 0)
            out.append((mine, {r.host_id: hosts[r.host_id] for r in mine}, count))
            edges.pop(u.page_id, None)  # a page's document twice in a batch: counted once
        return out

    def _insert_owed(self, records: Sequence[FetchRecord]) -> None:
        """Keep the records' findings until discovery has stored them (in the fetch's batch)."""
        rows = owed_rows(records, self.run)
        if not rows:
            return
        _owed = {  # scanned by name (DuckDB's replacement scan): see write
            "page_id": np.array([r.page_id for r, _, _ in rows], dtype=np.int64),
            "fetched_at": np.array([r.finished_at for r, _, _ in rows], dtype=np.float64),
            "run": np.array([run for _, run, _ in rows], dtype=object),
            "document": np.array([doc for _, _, doc in rows], dtype=object),
        }
        self._con.execute(
            "INSERT INTO owed_documents (page_id, fetched_at, run, created_at, document)"
            " SELECT page_id, fetched_at, run, ?, document FROM _owed",
            [time.time()],
        )

    def _forget_owed(self, updates: Sequence[DocumentUpdate]) -> None:
        """Delete the owed documents of these updates' fetches: discovery stored them."""
        done = [(u.page_id, u.fetched_at) for u in updates if u.fetched_at is not None]
        if not done:
            return
        _done = {  # scanned by name (DuckDB's replacement scan): see write
            "page_id": np.array([p for p, _ in done], dtype=np.int64),
            "fetched_at": np.array([t for _, t in done], dtype=np.float64),
        }
        self._con.execute(
            "DELETE FROM owed_documents o USING _done d"
            " WHERE o.page_id = d.page_id AND o.fetched_at = d.fetched_at"
        )

    def owed_documents(
        self, limit: int, *, grace: float, now: float
    ) -> list[tuple[int, int, float, Findings]]:
        """Take up to ``limit`` findings owed to discovery, oldest fetch first: those an
        earlier run left (it stopped or died before its discovery stored them), and this
        run's own older than ``grace`` seconds. Taken rows become this run's, so they are not
        handed out again for ``grace`` seconds (while discovery has them); the same contract
        as a fleet's store. (row id, page id, fetched_at, findings)."""
        with self._transaction("taking the findings owed to discovery"):
            rows = self._con.execute(
                "SELECT rowid, page_id, fetched_at, document FROM owed_documents"
                " WHERE run <> ? OR created_at < ? ORDER BY fetched_at, page_id LIMIT ?",
                [self.run, now - grace, limit],
            ).fetchall()
            if rows:
                self._con.execute(
                    "UPDATE owed_documents SET run = ?, created_at = ?"
                    " WHERE list_contains(?, rowid)",
                    [self.run, now, [int(r[0]) for r in rows]],
                )
        return [(int(i), int(p), float(t), findings_of_doc(json.loads(d))) for i, p, t, d in rows]

    def _add_edges(self, pairs: Sequence[tuple[int, str]], *, now: float) -> dict[int, int]:
        """Edges from each source page to the known page at each URL: per source, how many."""
        _edges = {  # scanned by name (DuckDB's replacement scan): see write
            "src": np.array([src for src, _ in pairs], dtype=np.int64),
            "url": np.array([url for _, url in pairs], dtype=object),
        }
        rows = self._con.execute(
            """
            INSERT INTO links SELECT e.src, p.id, ? FROM _edges e JOIN pages p ON p.url = e.url
            WHERE p.id <> e.src RETURNING src
            """,
            [now],
        ).fetchall()
        return dict(Counter(src for (src,) in rows))

    def _save_flags(self, flags: dict[int, tuple[str | None, bool]]) -> None:
        """Each page's canonical URL and noindex flag (the last document of a page wins)."""
        _flags = {  # scanned by name (DuckDB's replacement scan): see write
            "id": np.array(list(flags), dtype=np.int64),
            "canonical": np.array([c for c, _ in flags.values()], dtype=object),
            "noindex": np.array([n for _, n in flags.values()], dtype=bool),
        }
        self._con.execute(
            "UPDATE pages SET canonical = f.canonical, noindex = f.noindex FROM _flags f"
            " WHERE pages.id = f.id"
        )

    def discovery_scope(self) -> tuple[list[str], dict[str, int]]:
        seeds = self._con.execute(
            "SELECT DISTINCT h.name FROM pages p JOIN hosts h ON h.id = p.host_id"
            " WHERE p.source = 'seed'"
        ).fetchall()
        counts = self._con.execute(
            "SELECT h.name, count(*) FROM pages p JOIN hosts h ON h.id = p.host_id GROUP BY h.name"
        ).fetchall()
        return [r[0] for r in seeds], {r[0]: int(r[1]) for r in counts}

    def estimator_inputs(
        self, *, meaningful: bool, links: bool, responses_since: float | None = None
    ) -> EstimatorInputs:
        version = self.schema_version()
        current, timeline = version >= STATISTICS_VERSION, version >= TIMELINE_VERSION
        columns = [stat_column(c, meaningful) for c in ESTIMATOR_COLUMNS]
        if version >= PAIR_VERSION:
            columns += [pair_column(c, meaningful) for c in PAIR_NAMES]
        # the sitemap timeline's sums where the page's host passes the trust test
        value = estimator_column_sql if timeline else (lambda c: f"p.{c}")
        stat_sql = (
            "".join(f", coalesce({value(c)}, 'NaN'::DOUBLE) AS {c}" for c in columns)
            if current
            else ""
        )
        if timeline:
            stat_sql += f", coalesce({SITEMAP_SINCE_SQL}, 'NaN'::DOUBLE) AS sitemap_since"
        # not asked for: +inf, a join over no fetch
        since = math.inf if responses_since is None else responses_since
        pages = self._con.execute(
            f"""
            SELECT p.id, p.host_id, coalesce(p.last_fetch, 'NaN'::DOUBLE) AS last_fetch,
                   coalesce(h.delay, 0) AS delay,
                   coalesce(r.response, 0) AS response{stat_sql}
            FROM pages p JOIN hosts h ON h.id = p.host_id {response_join_sql("?")}
            WHERE p.status NOT IN ('gone', 'denied') ORDER BY p.id
            """,
            [since],
        ).fetchnumpy()
        ids = np.asarray(pages["id"], dtype=np.int64)
        stats: dict[str, Any] = pages
        if not current:  # a store read-only before its migration: fold its history now
            stats = statistics_from_history(self._con, ids)[1]
        edges: dict[str, Any] = {"src": (), "dst": ()}
        if links:
            edges = self._con.execute("SELECT DISTINCT src, dst FROM links").fetchnumpy()
        return EstimatorInputs(
            page_ids=ids,
            page_host=np.asarray(pages["host_id"], dtype=np.int64),
            last_fetch=np.asarray(pages["last_fetch"], dtype=np.float64),
            host_delay=np.asarray(pages["delay"], dtype=np.float64),
            host_response=(
                None if responses_since is None else np.asarray(pages["response"], dtype=np.float64)
            ),
            stats=read_statistics(stats, meaningful=meaningful),
            link_src=np.asarray(edges["src"], dtype=np.int64),
            link_dst=np.asarray(edges["dst"], dtype=np.int64),
            sitemap_since=(
                np.asarray(pages["sitemap_since"], dtype=np.float64) if timeline else None
            ),
        )

    def save_plan(self, plan: PlanUpdate, *, now: float) -> None:
        """See :meth:`refresher.store.Store.save_plan`: SQL of :func:`next_due` over the last
        fetch as stored when saving (fetches may have committed since the inputs were read);
        a page never fetched keeps an earlier due time.

        Saved in slices of :data:`_PLAN_SLICE` pages, each its own transaction: an update of
        ten million rows at once needs more than ``store.memory_limit`` for its undo data. A
        crash between slices leaves some pages on the previous plan until the next one."""
        for start in range(0, max(plan.page_ids.size, 1), _PLAN_SLICE):
            part = slice(start, start + _PLAN_SLICE)
            batch = {
                "id": plan.page_ids[part],
                "rate": plan.rates[part],
                "rate_n": plan.rate_n[part],
                "weight": plan.weights[part],
                "target": plan.target[part],
            }
            self._con.register("_plan", batch)
            try:
                self._con.execute(
                    f"""
                    UPDATE pages SET rate = _plan.rate, rate_n = _plan.rate_n,
                        weight = _plan.weight, target_rate = _plan.target,
                        due_at = {_PLAN_DUE}
                    FROM _plan WHERE pages.id = _plan.id
                    """,
                    [now],
                )
            finally:
                self._con.unregister("_plan")

    def status(self, *, now: float) -> StoreStatus:
        pages, hosts, fetches = self.counts()
        row = first_row(
            self._con.execute(
                "SELECT min(due_at), max(last_fetch), count(*) FILTER (WHERE due_at <= ?),"
                " (SELECT count(*) FROM owed_documents) FROM pages",
                [now],
            )
        )
        return StoreStatus(
            pages=pages,
            hosts=hosts,
            fetches=fetches,
            next_due=row[0] if row else None,
            last_fetch=row[1] if row else None,
            due_now=int(row[2]) if row else 0,
            owed=int(row[3]) if row else 0,
        )

    def last_refreshes(self) -> list[tuple[str, float | None, float | None]]:
        rows = self._con.execute(
            f"""
            SELECT p.url, max(f.finished_at), any_value(p.rate)
            FROM pages p LEFT JOIN (SELECT * FROM fetches WHERE {SUCCESS_SQL}) f
              ON f.page_id = p.id
            GROUP BY p.url
            """
        ).fetchall()
        return [(str(u), t, r) for u, t, r in rows]

    def host_summary(self, *, now: float, limit: int | None) -> list[HostSummary]:
        return host_summary(self._con, now=now, limit=limit)

    def archive_file_ends(self) -> dict[str, int]:
        """Per WARC file, the end of its last indexed record (bytes): where recovery cuts."""
        return file_ends(self._con)

    def prune_history(
        self, *, before: float, keep_per_page: int, export_dir: Path | None = None
    ) -> tuple[int, Path | None]:
        """:func:`refresher.store._history.prune_history` on this store."""
        return prune_history(
            self._con, before=before, keep_per_page=keep_per_page, export_dir=export_dir
        )

    def plan_prune(
        self, *, keep_versions: int | None, max_bytes: int | None, protect: Collection[str] = ()
    ) -> PrunePlan:
        """The archive index rows a retention pass drops (reads only)."""
        return plan_prune(
            self._con, keep_versions=keep_versions, max_bytes=max_bytes, protect=protect
        )

    def apply_prune(
        self, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
    ) -> None:
        """A retention pass's index change, in one transaction (``copies``: rewritten files)."""
        apply_plan(self._con, plan, copies)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A second connection to the same database (for the snapshot, in this package)."""
        return self._con.cursor()


class StoreService(PruneCalls, BatchedService[DuckDBStore]):
    """The DuckDB implementation of :class:`refresher.store.Store`: the daemon's one door to
    the file, the batched writer (:class:`refresher.store._service.BatchedService`) in front of
    a :class:`DuckDBStore`, with the DuckDB-only operations below."""

    async def prune_history(
        self, *, before: float, keep_per_page: int, export_dir: Path | None = None
    ) -> tuple[int, Path | None]:
        return await self._call(
            lambda s: s.prune_history(
                before=before, keep_per_page=keep_per_page, export_dir=export_dir
            )
        )

    async def cursor(self) -> duckdb.DuckDBPyConnection:
        """A second connection to the database, made after every queued write committed (for
        :mod:`refresher.store._snapshot`; DuckDB only, not part of the interface)."""
        return await self._call(lambda s: s.cursor())
