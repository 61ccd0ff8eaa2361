"""The store's interface: what every other part of refresher may ask of the store, and the rows
that cross it.

:class:`Store` is a :class:`typing.Protocol` with narrow, named operations; nothing else leaves
the store package (no connection, no SQL, no callable run inside the store). It is written for
two implementations: DuckDB, embedded, the default (:class:`refresher.store.StoreService` over
:class:`refresher.store.DuckDBStore`), and later PostgreSQL for a fleet of nodes. The row types
live here, not with an implementation, so that the frontier, the workers, discovery and the
allocator import no database.

The interface also holds the three definitions every part must agree on, each written once:

- a *successful* fetch (a refresh of the copy): :func:`is_success` and its SQL twin
  :func:`success_sql`;
- a *change*: :func:`is_change` (a successful fetch whose body digest differs from the copy's;
  a 304 is never a change), stored as ``fetches.changed``;
- a page's *due time*: :func:`due_after` a fetch, one planned interval (:func:`due_interval`)
  after the time it was due, making up lateness up to :data:`LATE_CREDIT` of an interval;
  :func:`next_due` (in SQL :func:`next_due_sql`) the same over a new plan, which the store's
  :meth:`Store.save_plan` applies to every planned page.

Times are unix seconds; rates are per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from refresher.store._captures import Capture

__all__ = [
    "LATE_CREDIT",
    "NEVER",
    "SUCCESS_SQL",
    "ChangeStatistics",
    "DocumentUpdate",
    "EstimatorInputs",
    "FetchRecord",
    "Findings",
    "HostRow",
    "HostSummary",
    "HostUpdate",
    "NewPage",
    "PageRow",
    "PlanUpdate",
    "RobotsUpdate",
    "Store",
    "StoreStatistics",
    "StoreStatus",
    "due_after",
    "due_interval",
    "is_change",
    "is_success",
    "next_due",
    "next_due_sql",
    "response_join_sql",
    "success_sql",
]

# -- the definitions ---------------------------------------------------------------------------

#: seconds; a page the plan gives no fetches (target rate 0) is due again this long after its
#: last fetch, so even with ``policy.explore = 0`` nothing is forgotten for ever.
NEVER = 30 * 86_400.0


def is_success(status: int | None, *, not_modified: bool, error_kind: str | None = None) -> bool:
    """A fetch that refreshes the copy: a complete 2xx answer, or a 304 to our conditional GET.

    A response cut short (``error_kind`` set, e.g. a body over ``fetch.max_body_bytes``) is not
    a success whatever its status; neither is a 304 we did not ask for."""
    if error_kind is not None or status is None:
        return False
    return 200 <= status < 300 or not_modified


def success_sql(table: str = "") -> str:
    """:func:`is_success` as a SQL condition over the columns of ``fetches`` (named through
    ``table``, an alias, when given)."""
    t = f"{table}." if table else ""
    return f"({t}error_kind IS NULL AND ({t}status BETWEEN 200 AND 299 OR {t}not_modified))"


#: :func:`success_sql` over unqualified columns
SUCCESS_SQL = success_sql()


def is_change(
    status: int | None,
    *,
    not_modified: bool,
    error_kind: str | None,
    digest: bytes | None,
    previous: bytes | None,
) -> bool:
    """A successful fetch whose body differs from the copy's (by digest).

    A 304 is never a change; the first successful fetch of a page (no ``previous`` digest) is not
    one either: there was nothing to differ from."""
    if not_modified or not is_success(status, not_modified=False, error_kind=error_kind):
        return False
    return previous is not None and digest != previous


def due_interval(target_rate: float | None, uniform_interval: float) -> float:
    """Seconds from a page's due time to its next one: its planned interval.

    ``target_rate`` f (fetches per second) > 0: 1/f. f = 0 (the plan gives the page nothing):
    :data:`NEVER`. No plan yet (``None``, a page found since the last solve):
    ``uniform_interval``, the budget spread evenly."""
    if target_rate is None:
        return uniform_interval
    if target_rate > 0:
        return 1.0 / target_rate
    return NEVER


#: the most lateness a due time makes up, as a share of the page's interval: a page is due
#: again at least (1 − this) intervals after a fetch
LATE_CREDIT = 0.5


def due_after(last: float, interval: float, late: float) -> float:
    """A page's next due time (unix seconds) after its fetch at ``last``: one ``interval``
    (seconds, :func:`due_interval`) after the time it was due, ``late`` seconds before the
    fetch.

    Lateness (waiting for the host's next allowed time, a worker, the budget's pacer) is
    made up rather than added to every interval, so a page keeps its planned rate f on the
    wire; only up to :data:`LATE_CREDIT` of an interval: a page far behind (its host down or
    backing off, the daemon stopped, a budget cut) is fetched again at its planned pace from
    now, not in a burst of catch-up fetches. A page fetched early (``late`` < 0) owes
    nothing: due one interval after the fetch. Fetched on time or late, a page's due times
    are never closer than one interval, so it never runs above f on average."""
    return last + interval - min(max(late, 0.0), LATE_CREDIT * interval)


def _intervals(target_rate: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`due_interval` of planned pages (every one has a target rate), vectorised."""
    with np.errstate(divide="ignore"):
        out: NDArray[np.float64] = np.where(
            target_rate > 0, 1.0 / np.maximum(target_rate, 1e-300), NEVER
        )
    return out


def next_due(
    last_fetch: NDArray[np.float64],
    target_rate: NDArray[np.float64],
    *,
    due_at: NDArray[np.float64],
    planned: NDArray[np.float64],
    now: float,
) -> NDArray[np.float64]:
    """Due times of pages given a new plan (``target_rate``): :func:`due_after` their last
    fetch with the new interval, making up the lateness their stored due time (``due_at``,
    set after that fetch under the previous target rate ``planned``) still made up. A page
    first planned (``planned`` NaN) makes up none; a page never fetched (``last_fetch`` NaN)
    is due ``now`` at the latest. The store applies exactly this in :meth:`Store.save_plan`
    (:func:`next_due_sql`)."""
    interval = _intervals(target_rate)
    owed = np.where(np.isnan(planned), 0.0, last_fetch + _intervals(planned) - due_at)
    owed = np.clip(owed, 0.0, LATE_CREDIT * interval)
    due: NDArray[np.float64] = np.where(
        np.isnan(last_fetch), np.minimum(due_at, now), last_fetch + interval - owed
    )
    return due


def response_join_sql(marker: str) -> str:
    """A join giving each page (``p``) its host's mean response time ``r.response``
    (seconds) over the fetches that got a response and finished at or after the parameter
    ``marker`` (unix seconds); NULL for a host without one. The same for DuckDB and
    PostgreSQL."""
    return (
        "LEFT JOIN (SELECT host_id, avg(duration) AS response FROM fetches"
        f" WHERE finished_at >= {marker} AND status IS NOT NULL GROUP BY host_id) r"
        " ON r.host_id = p.host_id"
    )


def next_due_sql(target: str, now: str) -> str:
    """:func:`next_due` as a SQL expression over the columns of ``pages`` as they stand
    before the update (its previous plan), the new target rate named ``target`` and the
    parameter marker ``now``."""

    def interval(rate: str) -> str:
        return f"(CASE WHEN {rate} > 0 THEN 1.0 / {rate} ELSE {NEVER!r} END)"

    new = interval(target)
    owed = (
        "(CASE WHEN pages.target_rate IS NULL THEN 0.0 ELSE "
        f"pages.last_fetch + {interval('pages.target_rate')} - pages.due_at END)"
    )
    return (
        f"CASE WHEN pages.last_fetch IS NULL THEN least(pages.due_at, {now}) "
        f"ELSE pages.last_fetch + {new} - least(greatest({owed}, 0.0), {LATE_CREDIT!r} * {new}) "
        "END"
    )


# -- the rows ----------------------------------------------------------------------------------


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
    #: fetched (or denied by robots.txt) at least once, whatever came of it: with no copy
    #: (``digest`` None) a page is new only until its first try (:attr:`new`)
    tried: bool = False

    @property
    def new(self) -> bool:
        """Never tried: no copy, and no schedule of its own yet."""
        return self.digest is None and not self.tried


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
class Findings:
    """What a fetched document yielded for discovery, carried by its :class:`FetchRecord`:
    the store keeps it in the fetch's own transaction until discovery has stored what it
    found (:attr:`DocumentUpdate.fetched_at`), so a process that dies in between loses no link
    (the next run, or in a fleet the partition's next owner, hands the findings to its
    discovery again: :meth:`Store.owed_documents`)."""

    depth: int  # the page's depth; its links are one deeper
    url: str  # the base for relative links (where the body came from)
    links: tuple[tuple[str, str], ...]  # (URL, kind) of the links a polite crawler follows
    canonical: str | None = None
    noindex: bool = False
    lastmod: tuple[tuple[str, float], ...] = ()  # (URL, sitemap <lastmod>, unix seconds)
    #: lastmods not given to the second (a date alone): ``pages.sitemap_lastmod`` only
    coarse_lastmod: tuple[tuple[str, float], ...] = ()
    synthetic: bool = False  # not the page's own body (a redirect's target)


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
    #: what the document yielded for discovery (None: nothing to discover)
    findings: Findings | None = None
    #: discovery's queue was full: the findings wait in the store, free for
    #: :meth:`Store.owed_documents` to hand over at once, instead of in the queue
    deferred: bool = False


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
class DocumentUpdate:
    """What processing one fetched document found: new pages, link edges, page facts."""

    page_id: int
    new: Sequence[NewPage]  # pages to add (those already known are skipped)
    linked: Sequence[str]  # canonical URLs the document links to (edges to known pages)
    canonical: str | None  # rel=canonical, recorded
    noindex: bool
    lastmod: Sequence[tuple[str, float]]  # (URL, sitemap <lastmod> in unix seconds)
    #: lastmods not given to the second (a date alone, ``Thh:mm``): kept as the pages'
    #: ``sitemap_lastmod`` but no point of their timelines (:class:`refresher.discover.Extracted`)
    coarse_lastmod: Sequence[tuple[str, float]] = ()
    #: findings with no document of their own (robots.txt sitemaps): new pages only
    synthetic: bool = False
    #: the fetch (its finished_at) whose :class:`Findings` these are, if any: the store
    #: forgets them in this update's transaction
    fetched_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeStatistics:
    """Per page, the sufficient statistics of its change observations, which the store keeps up
    to date as each fetch is recorded (in the fetch's batch transaction), so that a re-plan
    reads one row per page instead of the history.

    An *observation* is a pair of consecutive successful fetches of a page (:func:`is_success`):
    an interval of t seconds, changed or not (one change definition: raw or meaningful, as
    asked), with each fetch's Last-Modified (unix seconds) when it had one. The sums run over
    all of a page's observations (the estimator weighs them down to ``estimate.history``).
    Arrays, one entry per page, in the order of :attr:`EstimatorInputs.page_ids`.
    """

    observations: NDArray[np.float64]  # n, intervals observed
    time: NDArray[np.float64]  # Σ t, seconds
    changes: NDArray[np.float64]  # X, intervals that saw a change
    changed_time: NDArray[np.float64]  # Σ t over the changed intervals
    #: Σ over changed intervals whose later fetch had a Last-Modified of
    #: min(max(fetch − Last-Modified, 0), t): the quiet time after the change, seconds
    quiet_after: NDArray[np.float64]
    untimed: NDArray[np.float64]  # changed intervals whose later fetch had no Last-Modified
    #: observations since the last whose Last-Modified did not move exactly with the content
    #: (:func:`last_modified_agrees`); = ``observations`` when there was none
    lm_run: NDArray[np.float64]
    #: Σ ln t, Σ (ln t)², Σ (ln t)³ over the changed intervals (t in seconds), shape (3, pages)
    log_moments: NDArray[np.float64]
    #: seconds from the first copy's Last-Modified to its fetch (a quiet interval before the
    #: first observation), NaN when the first successful fetch had no earlier Last-Modified
    first_quiet: NDArray[np.float64]
    #: the sitemap timeline's pairs that only a trusted Last-Modified can time (a page's
    #: first fetch after a read, or a fetch after reads that said "changed";
    #: :mod:`refresher.store._timeline`): their count, changes and quiet time (Σ t less the
    #: changed intervals' time before the change), seconds; None: none (the estimator adds
    #: them to pages whose changes are timed)
    paired: NDArray[np.float64] | None = None
    paired_changes: NDArray[np.float64] | None = None
    paired_quiet: NDArray[np.float64] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimatorInputs:
    """What an allocation pass reads: arrays over the pages neither gone nor denied (those are
    out of the plan), sorted by id, and their change statistics; no estimate yet."""

    page_ids: NDArray[np.int64]
    page_host: NDArray[np.int64]  # host id per page
    last_fetch: NDArray[np.float64]  # unix seconds, NaN when never fetched
    host_delay: NDArray[np.float64]  # seconds, the host's last politeness delay (0: none yet)
    stats: ChangeStatistics
    link_src: NDArray[np.int64]  # distinct link edges (page ids); empty unless asked for
    link_dst: NDArray[np.int64]
    #: seconds per page: its host's mean response time over the fetches with a response since
    #: ``responses_since`` (0: none); None when not asked for
    host_response: NDArray[np.float64] | None = None
    #: unix seconds per page: when a sitemap page (``source = 'sitemap'``) of a host whose
    #: sitemaps have not failed the trust test was found (NaN for every other page), read on
    #: a schedule of its own (:func:`refresher.refresh._allocate.sitemap_reads`); None: no
    #: schedule (a store before the sitemap timelines)
    sitemap_since: NDArray[np.float64] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanUpdate:
    """An allocation's result, per page (same order): the store makes each page due at
    :func:`next_due` of its last fetch *at the time of saving*."""

    page_ids: NDArray[np.int64]
    rates: NDArray[np.float64]  # λ̂, changes per second
    rate_n: NDArray[np.float64]  # its evidence
    weights: NDArray[np.float64]
    target: NDArray[np.float64]  # f, fetches per second


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatistics:
    pages: int
    hosts: int
    fetches: int  # rows in the history
    acknowledged: int  # fetches committed by this process
    batches: int
    queued: int  # fetches waiting for their batch
    last_batch_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSummary:
    """One host's line in ``refresher status``."""

    host: str
    pages: int
    fetches: int  # fetches recorded for its pages, all time
    errors: int  # consecutive failed fetches now
    paused: bool
    #: seconds until the host may be fetched again after errors or Retry-After; 0 when not
    backoff_left: float
    #: checks of its sitemaps' lastmods against its pages' fetches that passed and failed
    #: (:mod:`refresher.store._timeline`): its lastmods count once one passed and none failed
    sitemap_passed: int = 0
    sitemap_failed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatus:
    """A summary of the stored state, for ``refresher status`` on a stopped daemon."""

    pages: int
    hosts: int
    fetches: int
    next_due: float | None  # unix seconds
    last_fetch: float | None
    due_now: int
    #: fetched documents whose findings wait for discovery to store them (``owed_documents``)
    owed: int = 0


# -- the interface -----------------------------------------------------------------------------


@runtime_checkable
class Store(Protocol):
    """Everything the rest of refresher asks of the store.

    Writes (:meth:`record`, :meth:`update_host`) are queued and committed in batches; a fetch is
    *acknowledged* when its batch commits and then survives SIGTERM, SIGKILL and restart. Every
    other operation first commits what was queued before it, so it sees every earlier write.
    """

    # -- the crawl ---------------------------------------------------------------------------

    async def load_due(
        self, *, after: tuple[float, int], until: float, limit: int, known_hosts: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        """Pages with (due_at, id) > ``after`` and due_at ≤ ``until`` (earliest first, at most
        ``limit``, none of a paused host; a gone page only when its slow re-check is due), and
        the rows of their hosts not in ``known_hosts``."""
        ...

    async def record(
        self,
        record: FetchRecord,
        capture: Capture | None = None,
        host: HostUpdate | None = None,
    ) -> None:
        """Queue one finished fetch (and the page state it leaves), with the copy to archive
        (``capture``; the archive writes it with the batch, before the transaction that
        indexes it) and its host's new politeness state (``host``), if any. Its batch also
        folds the fetch into its page's :class:`ChangeStatistics` (both change definitions),
        in the same transaction."""
        ...

    async def update_host(self, update: HostUpdate | RobotsUpdate) -> None:
        """Queue a host's new politeness state or its fetched robots.txt."""
        ...

    # -- discovery ---------------------------------------------------------------------------

    async def add_pages(
        self, pages: Sequence[NewPage], *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        """Insert the pages not yet known, due ``now``; the inserted rows and their hosts."""
        ...

    async def save_document(
        self, update: DocumentUpdate, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        """Store what one document yielded: the new pages (rows and hosts, as
        :meth:`add_pages`) and the number of link edges recorded."""
        ...

    async def save_documents(
        self, updates: Sequence[DocumentUpdate], *, now: float
    ) -> list[tuple[list[PageRow], dict[int, HostRow], int]]:
        """:meth:`save_document` for each of ``updates``, in order, as one operation."""
        ...

    async def owed_documents(
        self, limit: int, *, grace: float, now: float | None = None
    ) -> list[tuple[int, int, float, Findings]]:
        """Take up to ``limit`` documents' findings owed to discovery (kept with their fetch's
        record, :attr:`FetchRecord.findings`, until a :class:`DocumentUpdate` with its
        ``fetched_at`` is saved): those an earlier run (or, in a fleet, another node) left,
        and this run's own taken or written more than ``grace`` seconds before ``now``
        (default: the time of the call). Taken rows are this run's from then on. (row id, page
        id, fetched_at, findings) each, oldest first."""
        ...

    async def known_fingerprints(self, fps: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Which of these URL fingerprints belong to stored pages (same order)."""
        ...

    async def discovery_scope(self) -> tuple[list[str], dict[str, int]]:
        """The hosts of seed pages, and the number of pages of every host."""
        ...

    # -- the allocation ----------------------------------------------------------------------

    async def estimator_inputs(
        self, *, meaningful: bool, links: bool, responses_since: float | None = None
    ) -> EstimatorInputs:
        """The pages and their :class:`ChangeStatistics` (kept by :meth:`record`, see
        :func:`refresher.store.fold_observations`) an allocation pass estimates from.
        ``meaningful``: a change is a meaningful one (``coalesce(meaningful, changed)``)
        instead of any new digest; ``links``: read the link edges too (for PageRank
        weights); ``responses_since`` (unix seconds): each page's host's mean response time
        over the fetches since then (:func:`response_join_sql`)."""
        ...

    async def page_ids(self, urls: NDArray[np.str_]) -> NDArray[np.int64]:
        """Each URL's page id, −1 where the store has no such page (``estimate.known_rates``,
        one lookup of the lot)."""
        ...

    async def save_plan(self, plan: PlanUpdate, *, now: float) -> None:
        """Store λ̂, evidence, weight and target rate per page; make each due at
        :func:`next_due`."""
        ...

    async def record_policy(self, policy: str, budget: float, *, now: float) -> None:
        """Note the policy and budget (fetches per second) in force from ``now``."""
        ...

    async def policy_in_force(self, configured: str) -> str:
        """The operator's last switch, unless the config has named another policy since."""
        ...

    async def switch_policy(
        self, policy: str, *, configured: str, budget: float, now: float
    ) -> None:
        """An operator's switch to ``policy`` (made while the config named ``configured``)."""
        ...

    # -- operations --------------------------------------------------------------------------

    async def set_paused(self, host: str, paused: bool) -> bool:
        """Pause or resume a host; False when no such host is stored."""
        ...

    async def status(self, *, now: float) -> StoreStatus:
        """Counts and due times of the stored pages."""
        ...

    async def host_summary(self, *, now: float, limit: int | None) -> list[HostSummary]:
        """The ``limit`` busiest hosts (all when None), and every paused host or host in
        backoff; paused first, then those in backoff, then by fetches."""
        ...

    async def last_refreshes(self) -> list[tuple[str, float | None, float | None]]:
        """Per page: (URL, the time of its last successful fetch or None, λ̂ or None)."""
        ...

    def statistics(self) -> StoreStatistics:
        """A snapshot of the store's counters (no I/O)."""
        ...
