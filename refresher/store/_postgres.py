"""The PostgreSQL store: :class:`refresher.store.Store` for one node of a fleet.

A node owns a set of partitions ({partition: epoch}, granted by the leases of
:mod:`refresher.store._pg_leases` and handed over by membership through
:meth:`PostgresStore.set_owned`). It reads only its own partitions' pages (``load_due``,
``estimator_inputs``), and every write that changes state is **fenced**: the batch's
transaction first reads the touched partitions' lease rows ``FOR SHARE`` and keeps only the
rows of partitions this node still holds at the epoch it was granted; the rest are dropped,
counted (:meth:`PostgresStore.fencing`) and logged. A claim by another node waits for the
share lock, so it sees every batch committed before it and none after: a stale owner never
overwrites a new owner's state.

Writes are batched exactly as in the embedded store (:class:`refresher.store._service
.BatchedService`): the fetches of ``store.flush_interval`` seconds (or ``store.batch_size``
records) in one transaction, the history appended with COPY and pages and hosts updated with
multi-row statements. A fetch is acknowledged when its batch commits.

New pages go to the owner of their host's partition: a page of an owned partition is inserted
and returned (for this node's frontier); one of a partition another live node holds goes to
that partition's ``inbox``, in the same transaction, for the owner's :meth:`drain_inbox`; one
of a partition nobody holds is inserted directly (whoever claims the partition next loads it
with the rest). ``pages.url`` is unique, so a URL delivered twice is one page.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import psycopg
from numpy.typing import NDArray

from refresher._config import Config
from refresher._errors import StoreError
from refresher.discover._seen import fingerprints
from refresher.fleet._partition import partition_of
from refresher.ops._logging import get_logger
from refresher.store._batch import (
    findings_of_doc,
    fold_pages,
    new_page_rows,
    owed_rows,
    page_sets,
)
from refresher.store._captures import BatchArchive, CaptureRow
from refresher.store._change_stats import (
    ESTIMATOR_COLUMNS,
    PAIR_NAMES,
    STAT_COLUMNS,
    RecordArrays,
    fold_arrays,
    pair_column,
    read_statistics,
    record_arrays,
    stat_column,
)
from refresher.store._hosts import summaries, summary_sql_pg
from refresher.store._interface import (
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
    success_sql,
)
from refresher.store._pg_archive import apply_node_prune, plan_node_prune
from refresher.store._pg_dsn import connect, describe, idle_limit, redact
from refresher.store._pg_schema import check_schema
from refresher.store._prune import PruneCalls, PrunePlan
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
    unchanged_reads,
)

__all__ = [
    "Fencing",
    "PgStore",
    "PostgresStore",
    "Routed",
    "batch_key",
    "estimator_sql",
    "seed_fleet",
]

T = TypeVar("T")
log = get_logger("store.pg")

_U64 = 1 << 64
_TIMELINE = (*STAT_COLUMNS, *TIMELINE_COLUMNS)  # what a sitemap read reads of its pages
_TIMELINE_READ = ", ".join(f"coalesce({c}, 'NaN'::float8)" for c in _TIMELINE)
_STAT_SETS = ", ".join(f"{c} = b.{c}" for c in STAT_COLUMNS)
_STAT_ARRAYS = ", %s::float8[]" * len(STAT_COLUMNS)
_SUCCESS = success_sql()
#: the one definition of a due time over a new plan (:func:`next_due`), in SQL
_PLAN_DUE = next_due_sql("b.target", "%s")


def _signed(fp: int | None) -> int | None:
    """An unsigned 64-bit simhash as PostgreSQL's signed bigint."""
    if fp is None:
        return None
    return fp - _U64 if fp >= 1 << 63 else fp


def _unsigned(v: int | None) -> int | None:
    return None if v is None else v + _U64 if v < 0 else v


def batch_key(records: Sequence[FetchRecord]) -> str | None:
    """What names a batch of fetch records (its first record and size); None when empty."""
    if not records:
        return None
    return f"{records[0].page_id}:{records[0].finished_at!r}:{len(records)}"


def _nan_none(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


@dataclass(frozen=True, slots=True, kw_only=True)
class Fencing:
    """What fencing refused since the store opened."""

    records: int  # fetch records of partitions no longer held at their epoch
    hosts: int  # host and robots.txt updates likewise
    plans: int  # planned pages and documents' links and facts likewise
    inbox: int  # links written to other partitions' inboxes
    drained: int  # inbox rows taken by this node


@dataclass(frozen=True, slots=True, kw_only=True)
class Routed:
    """Where new pages went: inserted (this node's partitions, or nobody's), to an owner's inbox,
    or already known."""

    rows: list[PageRow]  # inserted into partitions this node owns
    elsewhere: int  # inserted into partitions nobody holds
    inboxed: int  # written to the inbox of a partition another node holds
    known: int


_PAGE_COLUMNS = (
    "p.id, p.url, p.host_id, h.name, p.due_at, p.etag, p.last_modified, p.digest, "
    "p.target_rate, p.depth, p.fingerprint, p.rate, p.weight, p.source, p.status <> 'new'"
)


def _page_row(r: Sequence[Any]) -> PageRow:
    return PageRow(
        id=int(r[0]),
        url=r[1],
        host_id=int(r[2]),
        host=r[3],
        due_at=float(r[4]),
        etag=r[5],
        last_modified=r[6],
        digest=None if r[7] is None else bytes(r[7]),
        target_rate=r[8],
        depth=int(r[9]),
        fingerprint=_unsigned(r[10]),
        rate=r[11],
        weight=float(r[12]),
        source=r[13],
        tried=bool(r[14]),
    )


def estimator_sql(columns: Sequence[str]) -> str:
    """The statement of :meth:`PgStore.estimator_inputs` (parameters: the start of the
    response-time window, unix seconds, and the partitions): each page of the partitions with
    its host's delay and mean response time and the change statistics ``columns``."""
    # the sitemap timeline's sums where the page's host passes the trust test
    stats = ", ".join(f"coalesce({estimator_column_sql(c)}, 'NaN'::float8)" for c in columns)
    return f"""
        SELECT p.id, p.host_id, coalesce(p.last_fetch, 'NaN'::float8),
               coalesce(h.delay, 0), coalesce(r.response, 0),
               coalesce({SITEMAP_SINCE_SQL}, 'NaN'::float8), {stats}
        FROM pages p JOIN hosts h ON h.id = p.host_id {response_join_sql("%s")}
        WHERE p.partition = ANY(%s) AND p.status NOT IN ('gone', 'denied')
        ORDER BY p.id
        """


class PgStore:
    """Synchronous access to the fleet's database for one node (its own connection). Use it
    through :class:`PostgresStore`, whose queue calls it from one thread at a time."""

    def __init__(
        self,
        dsn: str,
        *,
        node_id: str,
        partitions: int,
        retry_for: float = 2.0,
        idle_in_transaction: float | None = None,
    ) -> None:
        self.dsn = dsn
        #: seconds the server lets this session sit idle inside a transaction (see connect)
        self.idle_in_transaction = idle_in_transaction
        #: seconds a transaction is retried here while PostgreSQL is unreachable (a blip);
        #: longer outages are the queue's to retry (BatchedService.transient)
        self.retry_for = retry_for
        #: transactions run again after a lost connection
        self.retries = 0
        #: the first record of a batch whose commit is unknown (the connection broke)
        self._unsure: str | None = None
        self.node_id = node_id
        #: this process's run of the node (names the findings it leaves for discovery)
        self.run = uuid.uuid4().hex[:16]
        self.partitions = partitions
        #: {partition: epoch} this node holds; replaced whole by set_owned (atomic)
        self.owned: dict[int, int] = {}
        self.dropped_records = 0
        self.dropped_hosts = 0
        self.dropped_plans = 0
        self.inboxed = 0
        self.drained = 0
        self._counts = (0, 0, 0)
        self._counted_at = -math.inf
        self._con = self._connect()

    @classmethod
    def from_config(cls, config: Config) -> PgStore:
        f = config.fleet
        return cls(
            f.dsn,
            node_id=f.node_id,
            partitions=f.partitions,
            idle_in_transaction=idle_limit(f.lease_ttl),
        )

    def _connect(self) -> psycopg.Connection[Any]:
        con = connect(self.dsn, autocommit=True, idle_in_transaction=self.idle_in_transaction)
        try:
            check_schema(con, partitions=self.partitions, dsn=self.dsn)
        except BaseException:
            con.close()
            raise
        return con

    def close(self) -> None:
        self._con.close()

    # -- plumbing ----------------------------------------------------------------------------

    def _tx(self, what: str, fn: Callable[[Any], T]) -> T:
        """``fn(cursor)`` in one transaction; psycopg's errors as :class:`StoreError`.

        While PostgreSQL cannot be reached (or the transaction was rolled back by a deadlock
        or a serialisation failure), the transaction is run again on a new connection, with a
        backoff doubling from 0.1 s to 5 s, for at most ``retry_for`` seconds: the queue in
        front stops taking fetches meanwhile, and nothing it holds is lost."""
        delay = 0.1
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                if self._con.closed:
                    self._con = self._connect()
                with self._con.transaction(), self._con.cursor() as cur:
                    return fn(cur)
            except (psycopg.OperationalError, StoreError) as e:
                lost = isinstance(e, psycopg.OperationalError) or isinstance(
                    e.__cause__, psycopg.OperationalError
                )
                if not lost:
                    raise  # a StoreError with another cause: no fleet here, another schema
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"{what} on {redact(self.dsn)!r}: {describe(e)}; PostgreSQL unreachable "
                        f"for {self.retry_for:g} s"
                    ) from e
                self.retries += 1
                log.warning(
                    "PostgreSQL unreachable, retrying", what=what, delay=delay, error=describe(e)
                )
                with contextlib.suppress(psycopg.Error):
                    self._con.close()
                time.sleep(delay)  # in the store's worker thread: the queue waits
                delay = min(delay * 2, 5.0)
            except psycopg.Error as e:
                raise StoreError(f"{what} on {redact(self.dsn)!r}: {describe(e)}") from e

    def _held(self, cur: Any, partitions: Iterable[int]) -> set[int]:
        """The fence: of ``partitions``, those this node still holds at its granted epoch,
        share-locked until the transaction ends (a claim waits for it)."""
        owned = self.owned
        wanted = sorted({p for p in partitions if p in owned})
        if not wanted:
            return set()
        cur.execute(
            "SELECT partition, epoch FROM partitions"
            " WHERE partition = ANY(%s) AND owner = %s ORDER BY partition FOR SHARE",
            (wanted, self.node_id),
        )
        return {int(p) for p, e in cur.fetchall() if owned.get(int(p)) == int(e)}

    # -- pages and hosts ---------------------------------------------------------------------

    def _hosts(self, cur: Any, ids: Iterable[int]) -> dict[int, HostRow]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        cur.execute(
            """
            SELECT id, name, scheme, next_allowed, delay, backoff, errors, robots_status,
                   robots_body, robots_expires_at, paused
            FROM hosts WHERE id = ANY(%s)
            """,
            (wanted,),
        )
        return {
            int(r[0]): HostRow(
                id=int(r[0]),
                name=r[1],
                scheme=r[2],
                next_allowed=float(r[3]),
                delay=r[4],
                backoff=float(r[5]),
                errors=int(r[6]),
                robots_status=r[7],
                robots_body=None if r[8] is None else bytes(r[8]),
                robots_expires_at=r[9],
                paused=bool(r[10]),
            )
            for r in cur.fetchall()
        }

    def _insert_pages(self, cur: Any, pages: Sequence[NewPage], now: float) -> list[PageRow]:
        """Insert the pages (and their hosts) not yet known; the inserted rows."""
        if not pages:
            return []
        schemes: dict[str, str] = {}
        for p in pages:
            schemes.setdefault(p.host, p.scheme)
        names = sorted(schemes)  # one order everywhere: concurrent inserts cannot deadlock
        cur.execute(
            "INSERT INTO hosts (name, partition, scheme)"
            " SELECT * FROM unnest(%s::text[], %s::int[], %s::text[])"
            " ON CONFLICT (name) DO NOTHING",
            (names, [partition_of(n, self.partitions) for n in names], [schemes[n] for n in names]),
        )
        pages = sorted(pages, key=lambda p: p.url)
        urls = [p.url for p in pages]
        cur.execute(
            """
            INSERT INTO pages (url, host_id, partition, first_seen, due_at, source, depth, url_fp)
            SELECT n.url, h.id, h.partition, %s, %s, n.source, n.depth, n.fp
            FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::bigint[])
                 AS n(url, host, source, depth, fp)
            JOIN hosts h ON h.name = n.host
            ORDER BY n.url
            ON CONFLICT (url) DO NOTHING
            RETURNING id, url, host_id
            """,
            (
                now,
                now,
                urls,
                [p.host for p in pages],
                [p.source for p in pages],
                [p.depth for p in pages],
                [int(x) for x in fingerprints(urls)],
            ),
        )
        return new_page_rows(cur.fetchall(), pages, now=now)

    def _route(self, cur: Any, pages: Sequence[NewPage], now: float) -> Routed:
        """New pages to their owners (see the module's doc), in the caller's transaction."""
        unique = list({p.url: p for p in pages}.values())
        if not unique:
            return Routed(rows=[], elsewhere=0, inboxed=0, known=0)
        owned = self.owned
        part = {p.url: partition_of(p.host, self.partitions) for p in unique}
        others = sorted({part[p.url] for p in unique} - set(owned))
        live: set[int] = set()
        if others:
            cur.execute(
                "SELECT partition FROM partitions WHERE partition = ANY(%s)"
                " AND owner IS NOT NULL AND owner <> %s AND expires_at >= %s",
                (others, self.node_id, now),
            )
            live = {int(r[0]) for r in cur.fetchall()}
        mine = [p for p in unique if part[p.url] in owned]
        inbox = [p for p in unique if part[p.url] in live]
        direct = [p for p in unique if part[p.url] not in owned and part[p.url] not in live]
        inboxed = 0
        if inbox:
            cur.execute(
                """
                INSERT INTO inbox (partition, url, host, scheme, source, depth, created_at)
                SELECT n.partition, n.url, n.host, n.scheme, n.source, n.depth, %s
                FROM unnest(%s::int[], %s::text[], %s::text[], %s::text[], %s::text[],
                            %s::int[]) AS n(partition, url, host, scheme, source, depth)
                WHERE NOT EXISTS (SELECT 1 FROM pages WHERE pages.url = n.url)
                """,
                (
                    now,
                    [part[p.url] for p in inbox],
                    [p.url for p in inbox],
                    [p.host for p in inbox],
                    [p.scheme for p in inbox],
                    [p.source for p in inbox],
                    [p.depth for p in inbox],
                ),
            )
            inboxed = int(cur.rowcount)
            self.inboxed += inboxed
        rows = self._insert_pages(cur, mine, now)
        inserted = self._insert_pages(cur, direct, now)
        return Routed(
            rows=rows,
            elsewhere=len(inserted),
            inboxed=inboxed,
            known=len(unique) - len(rows) - len(inserted) - inboxed,
        )

    def add_pages_with_hosts(
        self, pages: Sequence[NewPage], *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        def add(cur: Any) -> tuple[list[PageRow], dict[int, HostRow]]:
            rows = self._route(cur, pages, now).rows
            return rows, self._hosts(cur, {r.host_id for r in rows})

        return self._tx("adding pages", add)

    def seed(self, pages: Sequence[NewPage], *, now: float) -> Routed:
        """Route seeds like any new pages (for ``refresher seed`` when no daemon runs here)."""
        return self._tx("adding seeds", lambda cur: self._route(cur, pages, now))

    def drain_inbox(
        self, limit: int, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        """Take up to ``limit`` inbox rows of partitions this node holds (``SKIP LOCKED``: two
        drains never take one row), add the pages not yet known and delete the rows, in one
        transaction; the new pages, their hosts and the number of rows taken."""

        def drain(cur: Any) -> tuple[list[PageRow], dict[int, HostRow], int]:
            held = self._held(cur, self.owned)
            if not held:
                return [], {}, 0
            cur.execute(
                """
                DELETE FROM inbox WHERE id IN (
                    SELECT id FROM inbox WHERE partition = ANY(%s)
                    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING url, host, scheme, source, depth
                """,
                (sorted(held), limit),
            )
            taken = [
                NewPage(url=u, host=h, scheme=s, source=src, depth=int(d))
                for u, h, s, src, d in cur.fetchall()
            ]
            rows = self._insert_pages(cur, list({p.url: p for p in taken}.values()), now)
            return rows, self._hosts(cur, {r.host_id for r in rows}), len(taken)

        rows, hosts, taken = self._tx("draining the inbox", drain)
        self.drained += taken
        return rows, hosts, taken

    def known_fingerprints(self, fps: NDArray[np.int64]) -> NDArray[np.bool_]:
        if len(fps) == 0:
            return np.zeros(0, dtype=bool)

        def read(cur: Any) -> list[int]:
            cur.execute(
                "SELECT DISTINCT url_fp FROM pages WHERE url_fp = ANY(%s)",
                ([int(x) for x in fps],),
            )
            return [int(r[0]) for r in cur.fetchall()]

        found = self._tx("looking up URLs", read)
        return np.isin(fps, np.array(found, dtype=np.int64))

    def page_ids(self, urls: NDArray[np.str_]) -> NDArray[np.int64]:
        """Each URL's page id, −1 where the store has no such page (``estimate.known_rates``)."""
        if urls.size == 0:
            return np.full(0, -1, dtype=np.int64)

        def read(cur: Any) -> dict[str, int]:
            cur.execute("SELECT url, id FROM pages WHERE url = ANY(%s)", (urls.tolist(),))
            return {str(u): int(i) for u, i in cur.fetchall()}

        found = self._tx("looking up the known-rate URLs", read)
        return np.array([found.get(str(u), -1) for u in urls], dtype=np.int64)

    def save_document(
        self, update: DocumentUpdate, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        def save(cur: Any) -> tuple[list[PageRow], dict[int, HostRow], int]:
            rows = self._route(cur, update.new, now).rows
            hosts = self._hosts(cur, {r.host_id for r in rows})
            if update.synthetic and update.fetched_at is None:
                return rows, hosts, 0  # robots.txt's sitemaps: new pages only
            cur.execute("SELECT partition FROM pages WHERE id = %s", (update.page_id,))
            found = cur.fetchone()
            if found is None or not self._held(cur, [int(found[0])]):
                # The partition moved on: its owner hands the findings to its discovery again
                # (at once: no run has them in flight any more).
                self.dropped_plans += 1
                if update.fetched_at is not None:
                    cur.execute(
                        "UPDATE owed_documents SET run = '' WHERE page_id = %s AND fetched_at = %s",
                        (update.page_id, update.fetched_at),
                    )
                return rows, hosts, 0
            if update.fetched_at is not None:  # discovery has it all now
                cur.execute(
                    "DELETE FROM owed_documents WHERE page_id = %s AND fetched_at = %s",
                    (update.page_id, update.fetched_at),
                )
            if update.synthetic:
                return rows, hosts, 0
            edges = 0
            if update.linked:
                cur.execute(
                    "INSERT INTO links (src, dst, found_at)"
                    " SELECT %s, p.id, %s FROM pages p WHERE p.url = ANY(%s) AND p.id <> %s",
                    (update.page_id, now, list(update.linked), update.page_id),
                )
                edges = cur.rowcount
            cur.execute(
                "UPDATE pages SET canonical = %s, noindex = %s WHERE id = %s",
                (update.canonical, update.noindex, update.page_id),
            )
            # every lastmod is the page's sitemap_lastmod; only those given to the second
            # are points of its timeline (a sitemap of coarse ones lists none)
            every = [*update.lastmod, *update.coarse_lastmod]
            if every:
                cur.execute(
                    """
                    UPDATE pages SET sitemap_lastmod = greatest(coalesce(sitemap_lastmod, 0), m.t)
                    FROM (SELECT url, max(t) AS t
                          FROM unnest(%s::text[], %s::float8[]) AS l(url, t) GROUP BY url) m
                    WHERE pages.url = m.url
                    """,
                    ([u for u, _ in every], [t for _, t in every]),
                )
                if update.fetched_at is not None:
                    _fold_read(cur, update.page_id, update.lastmod, update.fetched_at)
            return rows, hosts, edges

        return self._tx("saving a document", save)

    def discovery_scope(self) -> tuple[list[str], dict[str, int]]:
        def read(cur: Any) -> tuple[list[str], dict[str, int]]:
            cur.execute(
                "SELECT DISTINCT h.name FROM pages p JOIN hosts h ON h.id = p.host_id"
                " WHERE p.source = 'seed'"
            )
            seeds = [r[0] for r in cur.fetchall()]
            cur.execute(
                "SELECT h.name, count(*) FROM pages p JOIN hosts h ON h.id = p.host_id"
                " GROUP BY h.name"
            )
            return seeds, {r[0]: int(r[1]) for r in cur.fetchall()}

        return self._tx("reading the discovery scope", read)

    # -- the crawl ---------------------------------------------------------------------------

    def load_due(
        self, *, after: tuple[float, int], until: float, limit: int, known_hosts: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        owned = sorted(self.owned)
        if not owned:
            return [], {}

        def read(cur: Any) -> tuple[list[PageRow], dict[int, HostRow]]:
            cur.execute(
                f"""
                SELECT {_PAGE_COLUMNS}
                FROM pages p JOIN hosts h ON h.id = p.host_id
                WHERE p.partition = ANY(%s) AND p.status <> 'gone' AND NOT h.paused
                  AND (p.due_at, p.id) > (%s, %s) AND p.due_at <= %s
                ORDER BY p.due_at, p.id
                LIMIT %s
                """,
                (owned, after[0], after[1], until, limit),
            )
            pages = [_page_row(r) for r in cur.fetchall()]
            return pages, self._hosts(cur, {p.host_id for p in pages} - known_hosts)

        return self._tx("loading due pages", read)

    def write(
        self,
        records: Sequence[FetchRecord],
        hosts: Sequence[HostUpdate],
        robots: Sequence[RobotsUpdate] = (),
        captures: Sequence[CaptureRow] = (),
    ) -> int:
        """One fenced batch in one transaction: the fetches (COPY), their pages' state, the
        hosts' politeness and robots.txt, the archive's index rows; the number of records
        written (the others' partitions are no longer this node's)."""
        if not records and not hosts and not robots and not captures:
            return 0

        # A batch whose commit may have happened as the connection broke is checked first
        # when it comes again (retried here or by the queue): it must not be added twice.
        # Its key is noted in node_batches in its own transaction (its rows may be published
        # to Parquet, and gone from fetches, before the retry looks).
        key = batch_key(records)
        unsure = key is not None and key == self._unsure

        def write(cur: Any) -> tuple[int, int, int]:
            nonlocal unsure
            check, unsure = unsure, True
            if check and (already := self._committed(cur, key)) is not None:
                # the connection broke as the batch committed: it is in, do not add it twice
                log.info("batch found committed on retry", node=self.node_id, records=already)
                return already, 0, 0
            host_ids = {r.host_id for r in records} | {h.host_id for h in hosts}
            host_ids |= {r.host_id for r in robots}
            cur.execute("SELECT id, partition FROM hosts WHERE id = ANY(%s)", (sorted(host_ids),))
            part = {int(i): int(p) for i, p in cur.fetchall()}
            held = self._held(cur, part.values())
            keep = [r for r in records if part.get(r.host_id) in held]
            keep_hosts = [h for h in hosts if part.get(h.host_id) in held]
            keep_robots = [r for r in robots if part.get(r.host_id) in held]
            kept_pages = {r.page_id for r in keep}
            dropped_pages = {r.page_id for r in records} - kept_pages
            keep_captures = [c for c in captures if c.page_id not in dropped_pages]
            if keep:
                self._copy_fetches(cur, keep, part)
                self._update_pages(cur, keep)
            if keep_hosts:
                self._update_hosts(cur, keep_hosts)
            for rb in keep_robots:
                cur.execute(
                    "UPDATE hosts SET robots_status = %s, robots_body = %s,"
                    " robots_fetched_at = %s, robots_expires_at = %s WHERE id = %s",
                    (rb.status, rb.body, rb.fetched_at, rb.expires_at, rb.host_id),
                )
            if keep_captures:
                self._insert_captures(cur, keep_captures)
            self._insert_owed(cur, keep, part)
            self._note_batch(cur, key, len(keep))
            return (
                len(keep),
                len(records) - len(keep),
                len(hosts) + len(robots) - len(keep_hosts) - len(keep_robots),
            )

        self._unsure = key
        written, lost, lost_hosts = self._tx(f"writing {len(records)} fetch records", write)
        self._unsure = None
        if lost or lost_hosts:
            self.dropped_records += lost
            self.dropped_hosts += lost_hosts
            log.warning(
                "stale writes refused",
                node=self.node_id,
                records=lost,
                hosts=lost_hosts,
                reason="partition no longer held at its epoch",
            )
        return written

    def _copy_fetches(self, cur: Any, records: Sequence[FetchRecord], part: dict[int, int]) -> None:
        """The batch's fetch records into ``fetches``, stamped with this node and the epoch at
        which it holds each record's partition (``part``: host id to partition)."""
        owned = self.owned
        with cur.copy(
            "COPY fetches (page_id, host_id, started_at, finished_at, duration, status,"
            " bytes, digest, changed, not_modified, error_kind, policy, final_url,"
            " redirects, meaningful, fingerprint, last_modified_at, node_id, epoch,"
            " partition) FROM STDIN"
        ) as copy:
            for r in records:
                p = part[r.host_id]
                copy.write_row(
                    (
                        r.page_id,
                        r.host_id,
                        r.started_at,
                        r.finished_at,
                        r.duration,
                        r.status,
                        r.body_bytes,
                        r.digest,
                        r.changed,
                        r.not_modified,
                        r.error_kind,
                        r.policy,
                        r.final_url,
                        r.redirects,
                        r.meaningful,
                        _signed(r.fingerprint),
                        r.last_modified_at,
                        self.node_id,
                        owned[p],
                        p,
                    )
                )

    def _update_hosts(self, cur: Any, hosts: Sequence[HostUpdate]) -> None:
        """Each host's politeness state as its last update in the batch left it."""
        latest = list({h.host_id: h for h in hosts}.values())
        cur.execute(
            """
            UPDATE hosts SET next_allowed = b.next_allowed, delay = b.delay,
                backoff = b.backoff, errors = b.errors
            FROM unnest(%s::bigint[], %s::float8[], %s::float8[], %s::float8[],
                        %s::int[]) AS b(id, next_allowed, delay, backoff, errors)
            WHERE hosts.id = b.id
            """,
            (
                [h.host_id for h in latest],
                [h.next_allowed for h in latest],
                [h.delay for h in latest],
                [h.backoff for h in latest],
                [h.errors for h in latest],
            ),
        )

    def _committed(self, cur: Any, key: str | None) -> int | None:
        """The records the batch ``key`` wrote if it is this node's last committed batch (a
        batch commits whole), else None."""
        cur.execute("SELECT batch, written FROM node_batches WHERE node_id = %s", (self.node_id,))
        row = cur.fetchone()
        return int(row[1]) if row is not None and row[0] == key else None

    def _update_pages(self, cur: Any, records: Sequence[FetchRecord]) -> None:
        fold = fold_pages(records)  # a page fetched twice: the later state, counts added
        rows = sorted(fold.last, key=lambda r: r.page_id)
        page_ids = np.array([r.page_id for r in rows], dtype=np.int64)
        # the change statistics, read and folded inside this transaction
        state = _page_state(cur, page_ids, BATCH_COLUMNS)
        arrays = record_arrays(records)  # once, for every fold of the batch
        stats = fold_arrays(state, page_ids, arrays)
        _fold_timeline(cur, state, page_ids, arrays)
        cur.execute(
            f"""
            UPDATE pages SET {page_sets("b")}, {_STAT_SETS}
            FROM unnest(%s::bigint[], %s::float8[], %s::float8[], %s::text[], %s::text[],
                        %s::bytea[], %s::int[], %s::int[], %s::text[], %s::float8[],
                        %s::int[], %s::bigint[], %s::bigint[]{_STAT_ARRAYS})
                 AS b(id, last_fetch, changed_at, etag, last_modified, digest, n, x, status,
                      due_at, m, fingerprint, duplicate_of, {", ".join(STAT_COLUMNS)})
            WHERE pages.id = b.id
            """,
            (
                [r.page_id for r in rows],
                [r.finished_at for r in rows],
                [fold.changed_at.get(r.page_id) for r in rows],
                [r.etag for r in rows],
                [r.last_modified for r in rows],
                [r.page_digest for r in rows],
                [fold.fetches[r.page_id] for r in rows],
                [fold.changes[r.page_id] for r in rows],
                [r.page_status for r in rows],
                [r.due_at for r in rows],
                [fold.meaningful[r.page_id] for r in rows],
                [_signed(r.fingerprint) for r in rows],
                [r.duplicate_of for r in rows],
                *([float(x) for x in stats[c]] for c in STAT_COLUMNS),
            ),
        )
        for sitemap, read_at in unchanged_reads(page_ids, state[LISTED_COLUMN], arrays):
            _fold_entries(cur, sitemap, read_at)

    def _insert_captures(self, cur: Any, rows: Sequence[CaptureRow]) -> None:
        with cur.copy(
            "COPY warc_records (node_id, page_id, url, target_uri, captured_at, kind, status,"
            " mime, digest, payload_digest, file, record_offset, record_length, span,"
            " payload_bytes, truncated) FROM STDIN"
        ) as copy:
            for c in rows:
                copy.write_row(
                    (
                        self.node_id,
                        c.page_id,
                        c.url,
                        c.target_uri,
                        c.captured_at,
                        c.kind,
                        c.status,
                        c.mime,
                        c.digest,
                        c.payload_digest,
                        c.file,
                        c.offset,
                        c.length,
                        c.span,
                        c.payload_bytes,
                        c.truncated,
                    )
                )

    def _note_batch(self, cur: Any, key: str | None, written: int) -> None:
        """This node's last committed batch, in its transaction (:meth:`_committed`)."""
        if key is not None:
            cur.execute(
                "INSERT INTO node_batches (node_id, batch, written) VALUES (%s, %s, %s)"
                " ON CONFLICT (node_id) DO UPDATE SET batch = excluded.batch,"
                " written = excluded.written",
                (self.node_id, key, written),
            )

    def _insert_owed(
        self, cur: Any, records: Sequence[FetchRecord], partition: dict[int, int]
    ) -> None:
        """Keep the records' findings until discovery has stored them (in the fetch's batch;
        ``partition``: host id → partition)."""
        rows = owed_rows(records, self.run)
        if not rows:
            return
        cur.execute(
            "INSERT INTO owed_documents"
            " (page_id, partition, fetched_at, node_id, run, created_at, document)"
            " SELECT o.page_id, o.partition, o.fetched_at, %s, o.run, %s, o.document"
            " FROM unnest(%s::bigint[], %s::int[], %s::float8[], %s::text[], %s::jsonb[])"
            " AS o(page_id, partition, fetched_at, run, document)",
            (
                self.node_id,
                time.time(),
                [r.page_id for r, _, _ in rows],
                [partition[r.host_id] for r, _, _ in rows],
                [r.finished_at for r, _, _ in rows],
                [run for _, run, _ in rows],
                [doc for _, _, doc in rows],
            ),
        )

    def owed_documents(
        self, limit: int, *, grace: float, now: float
    ) -> list[tuple[int, int, float, Findings]]:
        """Take findings owed to discovery in the partitions this node holds: those another
        node or run left (it died before its discovery stored them, or its discovery was
        fenced off), and this run's own older than ``grace`` seconds (its discovery dropped
        them). Taken rows become this run's, so they are not handed out again for ``grace``
        seconds (while this node's discovery has them). (row id, page id, fetched_at,
        findings), oldest first."""
        owned = sorted(self.owned)
        if not owned:
            return []

        def take(cur: Any) -> list[tuple[int, int, float, Findings]]:
            cur.execute(
                """
                UPDATE owed_documents SET run = %(run)s, created_at = %(now)s
                WHERE id IN (
                    SELECT id FROM owed_documents
                    WHERE partition = ANY(%(owned)s)
                      AND (run <> %(run)s OR created_at < %(now)s - %(grace)s)
                    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                RETURNING id, page_id, fetched_at, document
                """,
                {"run": self.run, "now": now, "owned": owned, "grace": grace, "limit": limit},
            )
            got = [
                (int(i), int(p), float(t), findings_of_doc(doc)) for i, p, t, doc in cur.fetchall()
            ]
            return sorted(got, key=lambda o: o[0])

        return self._tx("taking the findings owed to discovery", take)

    def archive_file_ends(self) -> dict[str, int]:
        """Per WARC file of this node, the end of its last indexed record group (bytes): where
        the archive's recovery cuts a half-written tail."""

        def read(cur: Any) -> dict[str, int]:
            cur.execute(
                "SELECT file, max(record_offset + span) FROM warc_records WHERE node_id = %s "
                "GROUP BY file",
                (self.node_id,),
            )
            return {str(f): int(e) for f, e in cur.fetchall()}

        return self._tx("reading the archive's index", read)

    def plan_prune(
        self, *, keep_versions: int | None, max_bytes: int | None, protect: Collection[str] = ()
    ) -> PrunePlan:
        """The archive index rows a retention pass of this node drops from its own files
        (reads only; :func:`refresher.store._pg_archive.plan_node_prune`)."""
        return self._tx(
            "planning the archive's retention",
            lambda cur: plan_node_prune(
                cur,
                self.node_id,
                keep_versions=keep_versions,
                max_bytes=max_bytes,
                protect=protect,
            ),
        )

    def apply_prune(
        self, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
    ) -> None:
        """A retention pass's index change, in one transaction (``copies``: rewritten files)."""
        self._tx(
            "pruning the archive's index",
            lambda cur: apply_node_prune(cur, self.node_id, plan, copies),
        )

    def set_meta(self, key: str, value: str) -> None:
        """Note a fact of this node (``archive_dir``) in ``fleet_meta`` as ``key@node_id``."""

        def write(cur: Any) -> None:
            cur.execute(
                "INSERT INTO fleet_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (f"{key}@{self.node_id}", value),
            )

        self._tx("noting the archive directory", write)

    def counts(self) -> tuple[int, int, int]:
        """(pages, hosts, fetches) of this node's partitions; counted at most every 10 s (a
        count is a scan in PostgreSQL), else the last count."""
        now = time.monotonic()
        if now - self._counted_at < 10.0:
            return self._counts
        owned = sorted(self.owned)

        def count(cur: Any) -> tuple[int, int, int]:
            cur.execute(
                "SELECT (SELECT count(*) FROM pages WHERE partition = ANY(%(o)s)),"
                " (SELECT count(*) FROM hosts WHERE partition = ANY(%(o)s)),"
                " (SELECT count(*) FROM fetches WHERE partition = ANY(%(o)s))",
                {"o": owned},
            )
            r = cur.fetchone()
            return int(r[0]), int(r[1]), int(r[2])

        self._counts = self._tx("counting", count)
        self._counted_at = now
        return self._counts

    # -- the allocation ----------------------------------------------------------------------

    def estimator_inputs(
        self, *, meaningful: bool, links: bool, responses_since: float | None = None
    ) -> EstimatorInputs:
        """The pages of this node's partitions and their change statistics, and their hosts'
        mean response times since ``responses_since``."""
        # not asked for: +inf, a join over no fetch
        since = math.inf if responses_since is None else responses_since
        owned = sorted(self.owned)
        columns = [stat_column(c, meaningful) for c in ESTIMATOR_COLUMNS]
        columns += [pair_column(c, meaningful) for c in PAIR_NAMES]

        def read(cur: Any) -> EstimatorInputs:
            cur.execute(estimator_sql(columns), (since, owned))
            pages = np.array(cur.fetchall(), dtype=np.float64).reshape(-1, 6 + len(columns))
            edges: NDArray[np.int64] = np.zeros((0, 2), dtype=np.int64)
            if links:
                cur.execute(
                    "SELECT DISTINCT l.src, l.dst FROM links l JOIN pages p ON p.id = l.src"
                    " WHERE p.partition = ANY(%s)",
                    (owned,),
                )
                edges = np.array(cur.fetchall(), dtype=np.int64).reshape(-1, 2)
            stats = {c: pages[:, 6 + k] for k, c in enumerate(columns)}
            return EstimatorInputs(
                page_ids=pages[:, 0].astype(np.int64),
                page_host=pages[:, 1].astype(np.int64),
                last_fetch=pages[:, 2].copy(),
                host_delay=pages[:, 3].copy(),
                host_response=None if responses_since is None else pages[:, 4].copy(),
                stats=read_statistics(stats, meaningful=meaningful),
                link_src=edges[:, 0].astype(np.int64),
                link_dst=edges[:, 1].astype(np.int64),
                sitemap_since=pages[:, 5].copy(),
            )

        return self._tx("reading the estimator's inputs", read)

    def save_plan(self, plan: PlanUpdate, *, now: float) -> None:
        """See :meth:`refresher.store.Store.save_plan`; fenced: pages of partitions no longer
        held at their epoch keep their plan."""

        def save(cur: Any) -> int:
            held = sorted(self._held(cur, self.owned))
            cur.execute(
                f"""
                UPDATE pages SET rate = b.rate, rate_n = b.rate_n, weight = b.weight,
                    target_rate = b.target, due_at = {_PLAN_DUE}
                FROM unnest(%s::bigint[], %s::float8[], %s::float8[], %s::float8[],
                            %s::float8[]) AS b(id, rate, rate_n, weight, target)
                WHERE pages.id = b.id AND pages.partition = ANY(%s)
                """,
                (
                    now,
                    [int(x) for x in plan.page_ids],
                    [float(x) for x in plan.rates],
                    [float(x) for x in plan.rate_n],
                    [float(x) for x in plan.weights],
                    [float(x) for x in plan.target],
                    held,
                ),
            )
            return len(plan.page_ids) - int(cur.rowcount)

        refused = self._tx("saving the plan", save)
        if refused:
            self.dropped_plans += refused
            log.warning("stale plan rows refused", node=self.node_id, pages=refused)

    def _meta(self, cur: Any, key: str) -> str | None:
        cur.execute("SELECT value FROM fleet_meta WHERE key = %s", (key,))
        row = cur.fetchone()
        return None if row is None else str(row[0])

    def _record_policy(self, cur: Any, policy: str, budget: float, now: float) -> None:
        cur.execute("SELECT policy, budget FROM policy_periods ORDER BY started_at DESC LIMIT 1")
        last = cur.fetchone()
        if last is None or last[0] != policy or last[1] != budget:
            cur.execute("INSERT INTO policy_periods VALUES (%s, %s, %s)", (now, policy, budget))

    def record_policy(self, policy: str, budget: float, *, now: float) -> None:
        self._tx("recording the policy", lambda cur: self._record_policy(cur, policy, budget, now))

    def policy_in_force(self, configured: str) -> str:
        def read(cur: Any) -> str:
            switched = self._meta(cur, "policy")
            if switched is not None and self._meta(cur, "policy_configured") == configured:
                return switched
            return configured

        return self._tx("reading the policy", read)

    def switch_policy(self, policy: str, *, configured: str, budget: float, now: float) -> None:
        def switch(cur: Any) -> None:
            cur.execute(
                "INSERT INTO fleet_meta (key, value) VALUES ('policy', %s),"
                " ('policy_configured', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (policy, configured),
            )
            self._record_policy(cur, policy, budget, now)

        self._tx("switching the policy", switch)

    # -- operations --------------------------------------------------------------------------

    def set_paused(self, host: str, paused: bool) -> bool:
        def pause(cur: Any) -> bool:
            cur.execute("UPDATE hosts SET paused = %s WHERE name = %s", (paused, host))
            return bool(cur.rowcount)

        return self._tx("pausing a host", pause)

    def status(self, *, now: float) -> StoreStatus:
        """The whole fleet's pages."""

        def read(cur: Any) -> StoreStatus:
            cur.execute(
                "SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM hosts),"
                " (SELECT count(*) FROM fetches), min(due_at), max(last_fetch),"
                " count(*) FILTER (WHERE due_at <= %s), (SELECT count(*) FROM owed_documents)"
                " FROM pages",
                (now,),
            )
            r = cur.fetchone()
            return StoreStatus(
                pages=int(r[0]),
                hosts=int(r[1]),
                fetches=int(r[2]),
                next_due=r[3],
                last_fetch=r[4],
                due_now=int(r[5]),
                owed=int(r[6]),
            )

        return self._tx("reading the status", read)

    def last_refreshes(self) -> list[tuple[str, float | None, float | None]]:
        def read(cur: Any) -> list[tuple[str, float | None, float | None]]:
            cur.execute(
                f"""
                SELECT p.url, max(f.finished_at), max(p.rate)
                FROM pages p LEFT JOIN (SELECT * FROM fetches WHERE {_SUCCESS}) f
                  ON f.page_id = p.id
                GROUP BY p.url
                """
            )
            return [(str(u), t, r) for u, t, r in cur.fetchall()]

        return self._tx("reading the last refreshes", read)

    def host_summary(self, *, now: float, limit: int | None) -> list[HostSummary]:
        def read(cur: Any) -> list[HostSummary]:
            cur.execute(summary_sql_pg(), {"now": now, "limit": limit})
            return summaries(cur.fetchall())

        return self._tx("summarising hosts", read)


class PostgresStore(PruneCalls, BatchedService[PgStore]):
    """:class:`refresher.store.Store` on the fleet's PostgreSQL for one node: the batched
    writer (:class:`refresher.store._service.BatchedService`) in front of a :class:`PgStore`,
    with the fleet's own operations below."""

    def __init__(
        self,
        store: PgStore,
        *,
        flush_interval: float = 0.5,
        batch_size: int = 5000,
        archive: BatchArchive | None = None,
    ) -> None:
        super().__init__(
            store, flush_interval=flush_interval, batch_size=batch_size, archive=archive
        )

    @classmethod
    def connect(cls, config: Config, *, archive: BatchArchive | None = None) -> PostgresStore:
        """The store ``config`` names (its ``[fleet]`` and ``[store]`` batching); blocking:
        call it in a worker thread from trio."""
        return cls(
            PgStore.from_config(config),
            flush_interval=config.store.flush_interval,
            batch_size=config.store.batch_size,
            archive=archive,
        )

    def set_owned(self, owned: dict[int, int]) -> None:
        """The partitions this node holds now, {partition: epoch} (from membership). Takes
        effect at once for reads; a batch checks each partition's epoch when it commits."""
        self.store.owned = dict(owned)

    def owned(self) -> dict[int, int]:
        return dict(self.store.owned)

    async def drain_inbox(
        self, limit: int = 1000, *, now: float | None = None
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        """Pages discovered by other nodes for this node's partitions: up to ``limit`` inbox
        rows taken, the new pages among them added (as :meth:`add_pages`), the rows deleted,
        all in one transaction; (new pages, their hosts, rows taken)."""
        at = time.time() if now is None else now
        return await self._call(lambda s: s.drain_inbox(limit, now=at))

    def fencing(self) -> Fencing:
        s = self.store
        return Fencing(
            records=s.dropped_records,
            hosts=s.dropped_hosts,
            plans=s.dropped_plans,
            inbox=s.inboxed,
            drained=s.drained,
        )


def seed_fleet(config: Config, pages: Sequence[NewPage], *, now: float) -> Routed:
    """``refresher seed`` on a fleet with no daemon here: each seed goes to its partition's
    owner (its inbox) when a node holds the partition, else straight into ``pages``."""
    core = PgStore(
        config.fleet.dsn, node_id=config.fleet.node_id, partitions=config.fleet.partitions
    )
    try:
        return core.seed(pages, now=now)
    finally:
        with contextlib.suppress(psycopg.Error):
            core.close()


def _page_state(
    cur: Any, page_ids: NDArray[np.int64], columns: Sequence[str]
) -> dict[str, NDArray[np.float64]]:
    """The stored ``columns`` (NaN for NULL) of ``page_ids`` (sorted, unique; all must exist),
    as :func:`refresher.store._change_stats.state_of` reads them from DuckDB."""
    read = ", ".join(f"coalesce({c}, 'NaN'::float8)" for c in columns)
    cur.execute(
        f"SELECT {read} FROM pages WHERE id = ANY(%s) ORDER BY id", ([int(i) for i in page_ids],)
    )
    got = np.array(cur.fetchall(), dtype=np.float64).reshape(-1, len(columns))
    return {c: got[:, k].copy() for k, c in enumerate(columns)}


def _fold_timeline(
    cur: Any,
    state: dict[str, NDArray[np.float64]],
    page_ids: NDArray[np.int64],
    arrays: RecordArrays,
) -> None:
    """The sitemap timelines of a batch's listed pages (``state``: the batch's read of
    :data:`BATCH_COLUMNS`, before its fetches), and the trust checks of their pending claims;
    pages never listed by a sitemap read cost nothing more."""
    active = np.isfinite(state["tl_n"])
    if not active.any():
        return
    ids = page_ids[active]
    before = {c: state[c][active] for c in STAT_COLUMNS}
    before |= _page_state(cur, ids, TIMELINE_COLUMNS)
    timeline, counts = fold_fetch_arrays(before, ids, arrays)
    _write_timeline(cur, ids, {c: timeline[c] for c in TIMELINE_COLUMNS})
    _add_trust(cur, counts)


def _write_timeline(
    cur: Any, page_ids: NDArray[np.int64], columns: dict[str, NDArray[np.float64]]
) -> None:
    """Store the timeline columns of ``page_ids`` (:mod:`refresher.store._timeline`)."""
    names = list(columns)
    cur.execute(
        f"UPDATE pages SET {', '.join(f'{c} = b.{c}' for c in names)}"
        f" FROM unnest(%s::bigint[]{', %s::float8[]' * len(names)}) AS b(id, {', '.join(names)})"
        " WHERE pages.id = b.id",
        ([int(i) for i in page_ids], *([float(x) for x in columns[c]] for c in names)),
    )


def _add_trust(cur: Any, counts: TrustCounts) -> None:
    """Add a fold's trust checks to its hosts' counts (hosts of this node's partitions: a
    fetch's own, or a sitemap's, whose read folds only its own host's pages)."""
    if counts.host_ids.size == 0:
        return
    cur.execute(  # by id: two transactions updating the same hosts take their locks alike
        "UPDATE hosts SET sitemap_passed = sitemap_passed + c.passed,"
        " sitemap_failed = sitemap_failed + c.failed"
        " FROM (SELECT * FROM unnest(%s::bigint[], %s::int[], %s::int[]) AS c(id, passed, failed)"
        " ORDER BY id) c WHERE hosts.id = c.id",
        (
            [int(i) for i in counts.host_ids],
            [int(i) for i in counts.passed],
            [int(i) for i in counts.failed],
        ),
    )


def _fold_read(
    cur: Any, sitemap: int, lastmod: Sequence[tuple[str, float]], read_at: float
) -> None:
    """A sitemap read as points of its listed pages' timelines: the pages of the sitemap's own
    host only (so of this node's partition). Its entries are kept for the unchanged
    re-reads (:func:`unchanged_reads`)."""
    cur.execute(
        f"""
        SELECT p.id, p.host_id, m.t, {_TIMELINE_READ}
        FROM (SELECT url, max(t) AS t
              FROM unnest(%s::text[], %s::float8[]) AS l(url, t) GROUP BY url) m
        JOIN pages p ON p.url = m.url
        WHERE p.host_id = (SELECT host_id FROM pages WHERE id = %s) ORDER BY p.id
        """,
        ([u for u, _ in lastmod], [t for _, t in lastmod], sitemap),
    )
    got = _fold_rows(cur, cur.fetchall(), read_at)
    cur.execute("DELETE FROM sitemap_entries WHERE sitemap_id = %s", (sitemap,))
    cur.execute(
        "INSERT INTO sitemap_entries (sitemap_id, page_id, lastmod)"
        " SELECT %s, e.page_id, e.lastmod FROM unnest(%s::bigint[], %s::float8[])"
        " AS e(page_id, lastmod)",
        (sitemap, [int(i) for i in got[:, 0]], [float(t) for t in got[:, 2]]),
    )
    cur.execute(
        f"UPDATE pages SET {LISTED_COLUMN} = %s WHERE id = %s", (int(got.shape[0]), sitemap)
    )


def _fold_entries(cur: Any, sitemap: int, read_at: float) -> None:
    """A sitemap read again with the same body: its last read's entries at ``read_at``."""
    cur.execute(
        f"""
        SELECT e.page_id, p.host_id, e.lastmod, {_TIMELINE_READ}
        FROM sitemap_entries e JOIN pages p ON p.id = e.page_id
        WHERE e.sitemap_id = %s ORDER BY e.page_id
        """,
        (sitemap,),
    )
    _fold_rows(cur, cur.fetchall(), read_at)


def _fold_rows(cur: Any, rows: list[Any], read_at: float) -> NDArray[np.float64]:
    """Fold one read at ``read_at`` of the rows (page id, host id, lastmod, the page's
    statistics and timeline columns), sorted by page; the rows as an array."""
    got = np.array(rows, dtype=np.float64).reshape(-1, 3 + len(_TIMELINE))
    if got.shape[0] == 0:
        return got
    ids = got[:, 0].astype(np.int64)
    state = {c: got[:, 3 + k].copy() for k, c in enumerate(_TIMELINE)}
    folded, counts = fold_read_points(
        state, ids, ids, got[:, 1].astype(np.int64), read_at, got[:, 2].copy()
    )
    _write_timeline(cur, ids, {c: folded[c] for c in TIMELINE_COLUMNS})
    _add_trust(cur, counts)
    return got
