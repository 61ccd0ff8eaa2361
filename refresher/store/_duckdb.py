"""The DuckDB store: pages, hosts, the append-only fetch history, and the batched writer.

Only the daemon opens the file (DuckDB allows one process). Inside the daemon every operation
goes through :class:`StoreService`, one ordered queue served by one worker thread: fetch records
are batched and committed together, and a query first commits what was queued before it, so a
query always sees every write sent earlier. A fetch is *acknowledged* when its batch commits;
after that it survives SIGTERM, SIGKILL and restart. What a crash can lose is exactly the fetches
not yet acknowledged: those in flight and those waiting for their batch (at most
``store.flush_interval`` seconds or ``store.batch_size`` records). A lost fetch left its page's
due time unchanged, so the page is simply fetched again.

Times are stored as unix seconds (DOUBLE); the public view ``fetch_log`` shows timestamps (UTC).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import numpy as np
import trio

from refresher._errors import StoreError
from refresher.discover._seen import fingerprints
from refresher.ops._logging import get_logger
from refresher.store._captures import (
    CAPTURES_MIGRATION,
    BatchArchive,
    CaptureRow,
    insert_captures,
)

__all__ = [
    "SCHEMA_VERSION",
    "FetchRecord",
    "HostRow",
    "HostUpdate",
    "NewPage",
    "PageRow",
    "RobotsUpdate",
    "Store",
    "StoreService",
    "StoreStatistics",
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
    con.execute(
        """
        CREATE OR REPLACE VIEW fetch_log AS
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
        FROM fetches f JOIN pages p ON p.id = f.page_id JOIN hosts h ON h.id = f.host_id;
        """
    )


_MIGRATIONS.append(_migrate_2)
# 3: Last-Modified of each fetch as unix seconds: change times for the estimator.
_MIGRATIONS.append("ALTER TABLE fetches ADD COLUMN last_modified_at DOUBLE;")
# 4: the archive's index (refresher.store._captures).
_MIGRATIONS.append(CAPTURES_MIGRATION)
SCHEMA_VERSION = len(_MIGRATIONS)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewPage:
    url: str  # canonical
    host: str  # host key
    scheme: str
    source: str = "seed"
    depth: int = 0  # links from a seed


@dataclass(frozen=True, slots=True, kw_only=True)
class PageRow:
    """What the frontier and a worker need of one page."""

    id: int
    url: str
    host_id: int
    host: str
    due_at: float  # unix seconds
    etag: str | None
    last_modified: str | None
    digest: bytes | None
    target_rate: float | None  # fetches per second
    depth: int = 0
    fingerprint: int | None = None  # simhash of the last body
    rate: float | None = None  # λ̂, changes per second
    weight: float = 1.0
    source: str = "seed"  # seed | link | sitemap


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRow:
    id: int
    name: str
    scheme: str
    next_allowed: float
    delay: float | None
    backoff: float
    errors: int
    robots_status: int | None
    robots_body: bytes | None
    robots_expires_at: float | None
    paused: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRecord:
    """One finished fetch and the page state it leaves behind."""

    page_id: int
    host_id: int
    started_at: float  # unix seconds
    finished_at: float
    duration: float  # seconds
    status: int | None
    body_bytes: int
    digest: bytes | None
    changed: bool
    not_modified: bool
    error_kind: str | None
    policy: str
    final_url: str | None
    redirects: int
    # page state after the fetch
    etag: str | None
    last_modified: str | None
    page_digest: bytes | None
    page_status: str
    due_at: float
    # content: near-duplicate fingerprint, meaningful change, exact duplicate of another page
    fingerprint: int | None = None
    meaningful: bool | None = None
    duplicate_of: int | None = None
    #: the response's Last-Modified (a 304's: the stored one), unix seconds
    last_modified_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostUpdate:
    host_id: int
    next_allowed: float  # unix seconds
    delay: float
    backoff: float
    errors: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsUpdate:
    host_id: int
    status: int | None  # None: unreachable
    body: bytes
    fetched_at: float  # unix seconds
    expires_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatistics:
    pages: int
    hosts: int
    fetches: int  # rows in the history
    acknowledged: int  # fetches committed by this process
    batches: int
    queued: int  # fetches waiting for their batch
    last_batch_seconds: float


def first_row(result: Any) -> tuple[Any, ...] | None:
    """The first row of a DuckDB result, consuming it all.

    DuckDB 2 keeps a partly fetched result open and then refuses ``register``; fetch it all.
    """
    rows = result.fetchall()
    return tuple(rows[0]) if rows else None


class Store:
    """Synchronous access to the DuckDB file. Use from one thread at a time."""

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
            self.con = duckdb.connect(
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
        self._next_page = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM pages")
        self._next_host = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM hosts")
        self._next_fetch = self._scalar("SELECT coalesce(max(id), 0) + 1 FROM fetches")

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = first_row(self.con.execute(sql, list(params)))
        return int(row[0]) if row and row[0] is not None else 0

    def _migrate(self) -> None:
        tables = {
            r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        }
        version = 0
        if "meta" in tables:
            row = first_row(self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'"))
            version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{str(self.path)!r} has schema version {version}, newer than this refresher "
                f"understands ({SCHEMA_VERSION}); upgrade refresher"
            )
        for target in range(version, SCHEMA_VERSION):
            try:
                self.con.execute("BEGIN")
                step = _MIGRATIONS[target]
                if callable(step):
                    step(self.con)
                else:
                    self.con.execute(step)
                self.con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(target + 1)]
                )
                self.con.execute("COMMIT")
            except duckdb.Error as e:
                self.con.execute("ROLLBACK")
                raise StoreError(
                    f"migrating {str(self.path)!r} to version {target + 1}: {e}"
                ) from e
            log.info("schema migrated", version=target + 1, path=str(self.path))

    def schema_version(self) -> int:
        row = first_row(self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'"))
        return int(row[0]) if row else 0

    def close(self) -> None:
        # Read-only or already closed: nothing to fold into the file.
        with contextlib.suppress(duckdb.Error):
            self.con.execute("CHECKPOINT")
        self.con.close()

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
        self.con.register("_new_hosts", batch)
        self.con.execute(
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
        self.con.execute("BEGIN")
        try:
            self._ensure_hosts(unique)
            urls = [p.url for p in unique]
            batch = {
                "url": np.array(urls, dtype=object),
                "host": np.array([p.host for p in unique], dtype=object),
                "source": np.array([p.source for p in unique], dtype=object),
                "depth": np.array([p.depth for p in unique], dtype=np.int32),
                "fp": fingerprints(urls),
            }
            self.con.register("_new_pages", batch)
            rows = self.con.execute(
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
            self.con.execute("COMMIT")
        except duckdb.Error as e:
            self.con.execute("ROLLBACK")
            raise StoreError(f"adding pages: {e}") from e
        finally:
            # Unregistered after the transaction ended, so a failure shows its own cause.
            for view in ("_new_hosts", "_new_pages"):
                with contextlib.suppress(duckdb.Error):
                    self.con.unregister(view)
        self._next_page += len(rows)
        by_url = {p.url: p for p in unique}
        return [
            PageRow(
                id=int(i),
                url=u,
                host_id=int(h),
                host=by_url[u].host,
                due_at=now,
                etag=None,
                last_modified=None,
                digest=None,
                target_rate=None,
                depth=by_url[u].depth,
                source=by_url[u].source,
            )
            for i, u, h in rows
        ]

    def known_fingerprints(self, fps: np.ndarray) -> np.ndarray:
        """Which of these URL fingerprints the store has (bool mask, same order)."""
        if len(fps) == 0:
            return np.zeros(0, dtype=bool)
        self.con.register("_fps", {"fp": fps})
        try:
            found = self.con.execute(
                "SELECT fp FROM _fps SEMI JOIN pages ON pages.url_fp = _fps.fp"
            ).fetchnumpy()["fp"]
        finally:
            self.con.unregister("_fps")
        return np.isin(fps, found)

    def add_links(self, src: int, urls: Sequence[str], *, now: float) -> int:
        """Record edges from page ``src`` to the known pages among ``urls``; returns how many."""
        if not urls:
            return 0
        self.con.register("_dst", {"url": np.array(list(urls), dtype=object)})
        try:
            rows = self.con.execute(
                """
                INSERT INTO links SELECT ?, p.id, ? FROM _dst JOIN pages p ON p.url = _dst.url
                WHERE p.id <> ? RETURNING dst
                """,
                [src, now, src],
            ).fetchall()
        finally:
            self.con.unregister("_dst")
        return len(rows)

    def save_document(
        self,
        page_id: int,
        *,
        canonical: str | None,
        noindex: bool,
        lastmod: Sequence[tuple[str, float]],
    ) -> None:
        """What processing a page's body found that belongs to pages, not to the history."""
        self.con.execute(
            "UPDATE pages SET canonical = ?, noindex = ? WHERE id = ?",
            [canonical, noindex, page_id],
        )
        if lastmod:
            self.con.register(
                "_lm",
                {
                    "url": np.array([u for u, _ in lastmod], dtype=object),
                    "t": np.array([t for _, t in lastmod], dtype=np.float64),
                },
            )
            try:
                self.con.execute(
                    """
                    UPDATE pages SET sitemap_lastmod = greatest(coalesce(sitemap_lastmod, 0), m.t)
                    FROM (SELECT url, max(t) AS t FROM _lm GROUP BY url) m
                    WHERE pages.url = m.url
                    """
                )
            finally:
                self.con.unregister("_lm")

    def due_pages(self, *, after: tuple[float, int], until: float, limit: int) -> list[PageRow]:
        """Pages with (due_at, id) > ``after`` and due_at ≤ ``until``, earliest first."""
        rows = self.con.execute(
            """
            SELECT p.id, p.url, p.host_id, h.name, p.due_at, p.etag, p.last_modified,
                   p.digest, p.target_rate, p.depth, p.fingerprint, p.rate, p.weight,
                   p.source
            FROM pages p JOIN hosts h ON h.id = p.host_id
            WHERE p.status <> 'gone' AND NOT h.paused
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
            )
            for r in rows
        ]

    def hosts(self, ids: Iterable[int]) -> dict[int, HostRow]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        rows = self.con.execute(
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
        self.con.execute(
            """
            UPDATE hosts SET robots_status = ?, robots_body = ?, robots_fetched_at = ?,
                             robots_expires_at = ?
            WHERE id = ?
            """,
            [status, body, fetched_at, expires_at, host_id],
        )

    def set_paused(self, host: str, paused: bool) -> bool:
        rows = self.con.execute(
            "UPDATE hosts SET paused = ? WHERE name = ? RETURNING id", [paused, host]
        ).fetchall()
        return bool(rows)

    def count_pages(self) -> int:
        return self._scalar("SELECT count(*) FROM pages WHERE status <> 'gone'")

    def get_meta(self, key: str) -> str | None:
        row = first_row(self.con.execute("SELECT value FROM meta WHERE key = ?", [key]))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str | None) -> None:
        if value is None:
            self.con.execute("DELETE FROM meta WHERE key = ?", [key])
        else:
            self.con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

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
            self.con.execute(
                "SELECT policy, budget FROM policy_periods ORDER BY started_at DESC LIMIT 1"
            )
        )
        if last is None or last[0] != policy or last[1] != budget:
            self.con.execute("INSERT INTO policy_periods VALUES (?, ?, ?)", [now, policy, budget])

    # -- the history -------------------------------------------------------------------------

    def write(
        self,
        records: Sequence[FetchRecord],
        hosts: Sequence[HostUpdate],
        robots: Sequence[RobotsUpdate] = (),
        captures: Sequence[CaptureRow] = (),
    ) -> None:
        """Append ``records`` and update pages, hosts and robots.txt, in one transaction, with
        the index rows of the archived records (synced to disk before)."""
        n = len(records)
        fetches = {
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
        # A page fetched twice within one batch: the later state wins, the counts add up.
        last: dict[int, FetchRecord] = {}
        counts: dict[int, list[int]] = {}
        changed_at: dict[int, float] = {}
        for r in records:
            last[r.page_id] = r
            c = counts.setdefault(r.page_id, [0, 0, 0])
            c[0] += 1
            c[2] += bool(r.meaningful)
            if r.changed:
                c[1] += 1
                changed_at[r.page_id] = r.finished_at
        pages_ = list(last.values())
        page_batch = {
            "id": np.array([r.page_id for r in pages_], dtype=np.int64),
            "last_fetch": np.array([r.finished_at for r in pages_], dtype=np.float64),
            "changed_at": np.array(
                [changed_at.get(r.page_id, math.nan) for r in pages_], dtype=np.float64
            ),
            "etag": np.array([r.etag for r in pages_], dtype=object),
            "last_modified": np.array([r.last_modified for r in pages_], dtype=object),
            "digest": np.array([r.page_digest for r in pages_], dtype=object),
            "n": np.array([counts[r.page_id][0] for r in pages_], dtype=np.int32),
            "x": np.array([counts[r.page_id][1] for r in pages_], dtype=np.int32),
            "status": np.array([r.page_status for r in pages_], dtype=object),
            "due_at": np.array([r.due_at for r in pages_], dtype=np.float64),
            "m": np.array([counts[r.page_id][2] for r in pages_], dtype=np.int32),
            "fingerprint": np.array([r.fingerprint for r in pages_], dtype=object),
            "duplicate_of": np.array([r.duplicate_of for r in pages_], dtype=object),
        }
        latest_host = list({h.host_id: h for h in hosts}.values())
        host_batch = {
            "id": np.array([h.host_id for h in latest_host], dtype=np.int32),
            "next_allowed": np.array([h.next_allowed for h in latest_host], dtype=np.float64),
            "delay": np.array([h.delay for h in latest_host], dtype=np.float64),
            "backoff": np.array([h.backoff for h in latest_host], dtype=np.float64),
            "errors": np.array([h.errors for h in latest_host], dtype=np.int32),
        }
        con = self.con
        try:
            con.execute("BEGIN")
            if n:
                con.register("_f", fetches)
                con.execute(f"INSERT INTO fetches ({', '.join(fetches)}) SELECT * FROM _f")
                con.unregister("_f")
                con.register("_p", page_batch)
                con.execute(
                    """
                    UPDATE pages SET last_fetch = _p.last_fetch,
                        last_change = coalesce(_p.changed_at, pages.last_change),
                        etag = _p.etag, last_modified = _p.last_modified, digest = _p.digest,
                        fetches = pages.fetches + _p.n, changes = pages.changes + _p.x,
                        status = _p.status, due_at = _p.due_at,
                        meaningful_changes = pages.meaningful_changes + _p.m,
                        fingerprint = coalesce(_p.fingerprint, pages.fingerprint),
                        duplicate_of = _p.duplicate_of
                    FROM _p WHERE pages.id = _p.id
                    """
                )
                con.unregister("_p")
            if latest_host:
                con.register("_h", host_batch)
                con.execute(
                    """
                    UPDATE hosts SET next_allowed = _h.next_allowed, delay = _h.delay,
                        backoff = _h.backoff, errors = _h.errors
                    FROM _h WHERE hosts.id = _h.id
                    """
                )
                con.unregister("_h")
            insert_captures(con, captures)
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

    def counts(self) -> tuple[int, int, int]:
        """(pages, hosts, fetches)."""
        row = first_row(
            self.con.execute(
                "SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM hosts),"
                " (SELECT count(*) FROM fetches)"
            )
        )
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])


@dataclass(slots=True)
class _Call:
    fn: Callable[[Store], Any]
    done: trio.Event
    result: Any = None
    error: BaseException | None = None


class StoreService:
    """The daemon's one door to the store: an ordered queue served by one thread.

    ``record`` and ``update_host`` queue writes that commit in batches; ``call`` runs a
    function on the :class:`Store` after committing everything queued before it.
    """

    def __init__(
        self,
        store: Store,
        *,
        flush_interval: float = 0.5,
        batch_size: int = 5000,
        archive: BatchArchive | None = None,
    ):
        self.store = store
        #: synced before each batch commits, so an index row never points at a missing record
        self.archive = archive
        self._captures: list[CaptureRow] = []
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self._send, self._recv = trio.open_memory_channel[Any](batch_size * 2)
        self._records: list[FetchRecord] = []
        self._hosts: list[HostUpdate] = []
        self._robots: list[RobotsUpdate] = []
        self._acknowledged = 0
        self._batches = 0
        self._last_batch_seconds = 0.0
        self._counts = store.counts()
        self._closed = False
        #: called in the trio thread with each committed batch's size
        self.on_commit: list[Callable[[int], None]] = []

    async def record(self, record: FetchRecord, capture: CaptureRow | None = None) -> None:
        """Queue one fetch (and where the archive wrote its copy); it is acknowledged when its
        batch commits."""
        if capture is not None:  # first: the record's batch holds it (or an earlier one does)
            await self._send.send(capture)
        await self._send.send(record)

    async def update_host(self, update: HostUpdate | RobotsUpdate) -> None:
        """Queue new host state (politeness, or a fetched robots.txt); commits with a batch."""
        await self._send.send(update)

    async def call(self, fn: Callable[[Store], T]) -> T:
        """Run ``fn(store)`` in the store thread, after every write queued before it."""
        call = _Call(fn=fn, done=trio.Event())
        await self._send.send(call)
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def close(self) -> None:
        """No more input; ``run`` commits what is queued and returns."""
        if not self._closed:
            self._closed = True
            self._send.close()

    def statistics(self) -> StoreStatistics:
        pages, hosts, fetches = self._counts
        return StoreStatistics(
            pages=pages,
            hosts=hosts,
            fetches=fetches,
            acknowledged=self._acknowledged,
            batches=self._batches,
            queued=len(self._records),
            last_batch_seconds=self._last_batch_seconds,
        )

    async def _flush(self) -> None:
        if not self._records and not self._hosts and not self._robots and not self._captures:
            return
        records, hosts, robots = self._records, self._hosts, self._robots
        captures, archive = self._captures, self.archive
        self._records, self._hosts, self._robots, self._captures = [], [], [], []
        t0 = time.perf_counter()

        def write(store: Store) -> tuple[int, int, int]:
            synced = archive.sync(captures) if archive is not None else ()
            store.write(records, hosts, robots, synced)
            return store.counts()  # count(*) of whole tables is metadata to DuckDB: cheap

        # Shielded: a batch being written is finished even while the daemon shuts down.
        with trio.CancelScope(shield=True):
            self._counts = await trio.to_thread.run_sync(write, self.store)
        self._last_batch_seconds = time.perf_counter() - t0
        self._acknowledged += len(records)
        self._batches += 1
        if records:
            log.debug("batch committed", fetches=len(records), acknowledged=self._acknowledged)
        for cb in self.on_commit:
            cb(len(records))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the queue until :meth:`close`; commits what remains before returning."""
        task_status.started()
        deadline = math.inf
        ended = False
        try:
            while not ended:
                items: list[Any] = []
                with trio.move_on_at(deadline):
                    try:
                        items.append(await self._recv.receive())
                    except trio.EndOfChannel:
                        ended = True
                # Take everything already queued in one go: one item per scheduler turn falls
                # behind a hundred busy workers.
                while not ended:
                    try:
                        items.append(self._recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        ended = True
                if not items:  # the oldest queued write waited flush_interval
                    await self._flush()
                    deadline = math.inf
                    continue
                for item in items:
                    if isinstance(item, _Call):
                        await self._flush()
                        deadline = math.inf
                        await self._run_call(item)
                        continue
                    self._queue_write(item)
                    if len(self._records) >= self.batch_size:
                        await self._flush()
                        deadline = math.inf
                    elif deadline == math.inf:
                        deadline = trio.current_time() + self.flush_interval
        finally:
            with trio.CancelScope(shield=True):
                # Drain what was queued but not yet received, then commit it all.
                while True:
                    try:
                        item = self._recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
                    if isinstance(item, _Call):
                        item.error = StoreError("the store is shutting down; try again later")
                        item.done.set()
                    else:
                        self._queue_write(item)
                await self._flush()

    def _queue_write(self, item: FetchRecord | HostUpdate | RobotsUpdate | CaptureRow) -> None:
        if isinstance(item, FetchRecord):
            self._records.append(item)
        elif isinstance(item, CaptureRow):
            self._captures.append(item)
        elif isinstance(item, HostUpdate):
            self._hosts.append(item)
        else:
            self._robots.append(item)

    async def _run_call(self, call: _Call) -> None:
        def run_call(store: Store) -> Any:
            result = call.fn(store)
            self._counts = store.counts()
            return result

        try:
            with trio.CancelScope(shield=True):
                call.result = await trio.to_thread.run_sync(run_call, self.store)
        except Exception as e:
            call.error = e
        call.done.set()
