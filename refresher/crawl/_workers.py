"""The workers: take a page from the frontier, fetch it politely, record the outcome.

One refresh of one page, in order: robots.txt for the host when it is unknown or expired (a
request of its own, after which the host waits its politeness delay before the page); the robots
check (a disallowed page is recorded as ``denied`` and never requested); the conditional GET;
the change test (digest of the body against the last successful fetch; a 304 is never a
change); the politeness delay and backoff; the record to the store; the host back to the
frontier.
"""

from __future__ import annotations

import email.utils
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from refresher._config import Config
from refresher._errors import DNSFailure, FetchError
from refresher.archive._keep import Keeper
from refresher.crawl._fetch import Fetcher, FetchResult
from refresher.crawl._frontier import Frontier, HostState, Lease, next_allowed_after
from refresher.crawl._robots import RobotsRules, rules_for_response
from refresher.discover._discovery import Discovery, Found, sitemap_links
from refresher.discover._parse import Document, Extracted, Link, meaningful_change, process
from refresher.discover._url import canonicalize
from refresher.ops._logging import get_logger
from refresher.refresh._allocate import Allocator
from refresher.store._duckdb import FetchRecord, HostUpdate, RobotsUpdate, StoreService

__all__ = ["Crawler", "CrawlerStatistics"]

log = get_logger("crawl")


def _http_date(value: str | None) -> float | None:
    """An HTTP date as unix seconds; None when absent or unreadable."""
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


#: bodies remembered for the content-seen test (16-byte digest → page id)
_DIGESTS_REMEMBERED = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class CrawlerStatistics:
    workers: int
    busy: int  # workers holding a lease
    fetches: int  # page fetches finished since start
    changed: int
    not_modified: int
    errors: int  # fetches with an error kind
    denied: int  # pages robots.txt kept us from
    robots_fetches: int
    bytes: int
    meaningful: int  # changes beyond the near-duplicate threshold
    duplicates: int  # fetches whose body another page served recently (processed once)
    # requests per second put on the wire (pages and robots.txt) over the last WIRE_WINDOW s
    wire_rate: float = 0.0


#: seconds of requests the wire rate is averaged over
WIRE_WINDOW = 30.0
#: seconds until a page robots.txt denies is checked again when its host's robots.txt has no
#: expiry (it is checked again when robots.txt is re-fetched otherwise)
DENIED_RECHECK = 3600.0


class Crawler:
    """Owns the worker tasks; ``run`` returns once the frontier is closed and all are done."""

    def __init__(
        self,
        *,
        config: Config,
        frontier: Frontier,
        fetcher: Fetcher,
        store: StoreService,
        allocator: Allocator,
        discovery: Discovery | None = None,
        wall_clock: Callable[[], float] = time.time,
        keeper: Keeper | None = None,
    ) -> None:
        self.config = config
        self._frontier = frontier
        self._fetcher = fetcher
        self._store = store
        self._allocator = allocator
        self._wall = wall_clock
        self._busy = 0
        self._fetches = 0
        self._changed = 0
        self._not_modified = 0
        self._errors = 0
        self._denied = 0
        self._robots = 0
        self._bytes = 0
        self._meaningful = 0
        self._duplicates = 0
        # start times (trio clock) of the requests in the last WIRE_WINDOW seconds
        self._wire: deque[float] = deque()
        self._wire_since: float | None = None  # when run() began
        self._discovery = discovery
        self._keeper = keeper  # the archive and the change feed
        self._digests: OrderedDict[bytes, int] = OrderedDict()
        # One parse thread per core: libxml2 parses without the GIL, but link resolution
        # and the simhash hold it, and twenty threads taking turns at it spend their time
        # switching (bench/bench_parsers.py measures 1, 2, 8 and 20 threads).
        self._parsing = trio.CapacityLimiter(os.cpu_count() or 1)
        self.idle = trio.Event()  # set when every worker has stopped

    def configure(self, config: Config) -> None:
        """Take new politeness, fetch and robots settings (SIGHUP)."""
        self.config = config

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._wire_since = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(self.config.crawl.workers):
                nursery.start_soon(self._worker)
            task_status.started()
        self.idle.set()

    async def _worker(self) -> None:
        while (lease := await self._frontier.acquire()) is not None:
            self._busy += 1
            try:
                await self._refresh(lease)
            except Exception:
                # A bug must not stop the crawl: the page keeps its due time in the store.
                log.exception("refresh failed", url=lease.page.url)
                self._frontier.release(lease, next_due=None)
            except BaseException:
                # Cancelled mid-fetch (drain deadline passed): nothing is recorded, the page
                # keeps its due time in the store and is fetched again after restart.
                self._frontier.release(lease, next_due=None)
                raise
            finally:
                self._busy -= 1

    # -- one refresh -----------------------------------------------------------------------

    async def _refresh(self, lease: Lease) -> None:
        host, page = lease.host, lease.page
        if host.paused:  # paused while this worker waited for a budget token
            self._frontier.requeue(lease)
            return
        now = self._wall()
        if host.robots is None or (host.robots_expires_at or 0.0) <= now:
            if host.robots_body is not None and (host.robots_expires_at or 0.0) > now:
                host.robots = rules_for_response(
                    host.robots_status, host.robots_body, self.config.crawl.user_agent
                )
            else:
                if await self._fetch_robots(lease):
                    # The robots request counts against the host's politeness; the page waits.
                    self._frontier.requeue(lease)
                return
        rules: RobotsRules = host.robots
        if not rules.allowed(page.url):
            await self._record_denied(lease, now)
            return
        self._on_wire()
        result = await self._fetcher.fetch(
            page.url, etag=page.etag, last_modified=page.last_modified
        )
        await self._record(lease, result)

    async def _fetch_robots(self, lease: Lease) -> bool:
        """Fetch the host's robots.txt; False when the host name does not resolve, which is
        recorded as the page's failed fetch (kind "dns", the host backs off) rather than as
        an unreachable robots.txt, which would deny every page."""
        host, page = lease.host, lease.page
        c = self.config
        target = canonicalize(page.url)
        t0, started = trio.current_time(), self._wall()
        self._on_wire()
        status, body, error = await self._fetcher.fetch_robots_or_error(
            target.scheme, target.host, target.port
        )
        elapsed = trio.current_time() - t0
        self._robots += 1
        if isinstance(error, DNSFailure):
            await self._record(lease, _failed(page.url, error, started, self._wall(), elapsed))
            return False
        rules = rules_for_response(status, body, c.crawl.user_agent)
        now = self._wall()
        ok = status is not None and status < 500
        expires = now + (c.robots.expiry if ok else c.robots.retry_after_failure)
        host.robots, host.robots_status, host.robots_body = rules, status, body
        host.robots_expires_at = expires
        self._politeness(
            host, finished_at=now, response_time=elapsed, failed=False, retry_after=None
        )
        log.info(
            "robots.txt fetched",
            host=host.name,
            status=status,
            bytes=len(body),
            crawl_delay=rules.crawl_delay,
        )
        await self._store.update_host(
            RobotsUpdate(
                host_id=host.id, status=status, body=body, fetched_at=now, expires_at=expires
            )
        )
        await self._store.update_host(self._host_update(host))
        if self._discovery is not None and self.config.discovery.sitemaps:
            sitemaps = list(rules.sitemaps) or [f"{target.scheme}://{host.name}/sitemap.xml"]
            self._discovery.submit(
                Found(
                    page_id=page.id,
                    depth=-1,  # sitemaps are as near as seeds
                    url=page.url,
                    extracted=sitemap_links(sitemaps),
                    synthetic=True,
                )
            )

        return True

    def _politeness(
        self,
        host: HostState,
        *,
        finished_at: float,
        response_time: float,
        failed: bool,
        retry_after: float | None,
    ) -> None:
        p = self.config.politeness
        host.errors = host.errors + 1 if failed else 0
        crawl_delay = host.robots.crawl_delay if host.robots is not None else None
        host.next_allowed, host.delay, host.backoff = next_allowed_after(
            finished_at=finished_at,
            response_time=response_time,
            min_delay=p.min_delay,
            crawl_delay=crawl_delay,
            factor=p.response_time_factor,
            max_delay=p.max_delay,
            failed=failed,
            errors=host.errors,
            backoff_base=p.backoff_base,
            max_backoff=p.max_backoff,
            retry_after=retry_after,
        )

    @staticmethod
    def _host_update(host: HostState) -> HostUpdate:
        return HostUpdate(
            host_id=host.id,
            next_allowed=host.next_allowed,
            delay=host.delay or 0.0,
            backoff=host.backoff,
            errors=host.errors,
        )

    async def _record_denied(self, lease: Lease, now: float) -> None:
        page, host = lease.page, lease.host
        self._denied += 1
        # Out of the plan (the allocator leaves denied pages out) until robots.txt may have
        # changed: looked at again when it is re-fetched, or on a slow schedule of its own.
        expires = host.robots_expires_at or 0.0
        due = expires if expires > now else now + DENIED_RECHECK
        record = FetchRecord(
            page_id=page.id,
            host_id=host.id,
            started_at=now,
            finished_at=now,
            duration=0.0,
            status=None,
            body_bytes=0,
            digest=None,
            changed=False,
            not_modified=False,
            error_kind="denied",
            policy=self._allocator.policy,
            final_url=None,
            redirects=0,
            etag=page.etag,
            last_modified=page.last_modified,
            page_digest=page.digest,
            page_status="denied",
            due_at=due,
        )
        await self._store.record(record)
        self._frontier.release(lease, next_due=due)

    async def _record(self, lease: Lease, r: FetchResult) -> None:
        page, host = lease.page, lease.host
        self._fetches += 1
        self._bytes += r.bytes
        ok = r.status is not None and 200 <= r.status < 300
        changed = ok and page.digest is not None and r.digest != page.digest
        failed = r.error_kind is not None or (
            r.status is not None and (r.status >= 500 or r.status == 429)
        )
        if r.error_kind is not None:
            self._errors += 1
        self._changed += changed
        self._not_modified += r.not_modified
        self._politeness(
            host,
            finished_at=r.finished_at,
            response_time=r.duration,
            failed=failed,
            retry_after=r.retry_after,
        )
        if ok:
            etag, last_modified, digest = r.etag, r.last_modified, r.digest
        elif r.not_modified:
            etag = r.etag or page.etag
            last_modified = r.last_modified or page.last_modified
            digest = page.digest
        else:
            etag, last_modified, digest = page.etag, page.last_modified, page.digest
        if r.error_kind is not None:
            status = "error"
        elif ok:
            status = "ok"
        elif r.not_modified:
            status = "not_modified"
        else:
            status = f"http_{r.status}"
        extracted, fingerprint, meaningful, duplicate_of = None, None, None, None
        if ok:
            if r.body is not None and r.digest != page.digest:
                doc = Document(url=r.final_url, content_type=r.content_type, body=r.body)
                # lxml work is CPU-bound: off the event loop, one thread per core.
                extracted = await trio.to_thread.run_sync(process, doc, limiter=self._parsing)
                fingerprint = extracted.fingerprint
            elif r.body is not None:
                # The same body as last time: the same links and fingerprint; skip the parse.
                fingerprint = page.fingerprint
            meaningful = changed and (
                meaningful_change(page.fingerprint, fingerprint)
                if fingerprint is not None or page.fingerprint is not None
                else True  # no text to compare: every change counts
            )
            duplicate_of = self._content_seen(page.id, r.digest)
        elif r.not_modified:
            meaningful = False
        if page.source == "sitemap" and r.status in (404, 410):
            status = "gone"  # a guessed /sitemap.xml that is not there: not fetched again
        due = r.finished_at + self._allocator.interval(page)
        record = FetchRecord(
            page_id=page.id,
            host_id=host.id,
            started_at=r.started_at,
            finished_at=r.finished_at,
            duration=r.duration,
            status=r.status,
            body_bytes=r.bytes,
            digest=r.digest,
            changed=changed,
            not_modified=r.not_modified,
            error_kind=r.error_kind,
            policy=self._allocator.policy,
            final_url=r.final_url if r.final_url != page.url else r.location,
            redirects=len(r.redirects),
            etag=etag,
            last_modified=last_modified,
            page_digest=digest,
            page_status=status,
            due_at=due,
            fingerprint=fingerprint,
            meaningful=meaningful,
            duplicate_of=duplicate_of,
            last_modified_at=_http_date(last_modified) if ok or r.not_modified else None,
        )
        self._meaningful += bool(meaningful)
        capture = None
        if self._keeper is not None:
            capture = await self._keeper.keep(
                page_id=page.id,
                url=page.url,
                result=r,
                previous_digest=page.digest,
                etag=page.etag,
                last_modified=page.last_modified,
                meaningful=meaningful,
            )
        await self._store.record(record, capture)
        await self._store.update_host(self._host_update(host))
        lease = self._frontier.update_page(
            lease,
            etag=etag,
            last_modified=last_modified,
            digest=digest,
            fingerprint=fingerprint if fingerprint is not None else page.fingerprint,
        )
        # A gone page is not due again: the loader skips it too.
        self._frontier.release(lease, next_due=None if status == "gone" else due)
        if self._discovery is None:
            return
        if extracted is not None and duplicate_of is None:
            # Content-seen: a body already served by another page is processed once, and an
            # unchanged body has no links we have not seen.
            self._discovery.submit(
                Found(page_id=page.id, depth=page.depth, url=r.final_url, extracted=extracted)
            )
        elif r.location is not None:
            redirect = Extracted(links=(Link(url=r.location, kind="redirect", nofollow=False),))
            self._discovery.submit(
                Found(
                    page_id=page.id,
                    depth=page.depth,
                    url=r.final_url,
                    extracted=redirect,
                    synthetic=True,
                )
            )

    def _content_seen(self, page_id: int, digest: bytes | None) -> int | None:
        """Another page that served this exact body recently, if any (a bounded memory)."""
        if digest is None:
            return None
        other = self._digests.get(digest)
        if other is None or other == page_id:
            self._digests[digest] = page_id
            self._digests.move_to_end(digest)
            if len(self._digests) > _DIGESTS_REMEMBERED:
                self._digests.popitem(last=False)
            return None
        self._duplicates += 1
        return other

    def _on_wire(self) -> None:
        now = trio.current_time()
        self._wire.append(now)
        while self._wire and self._wire[0] < now - WIRE_WINDOW:
            self._wire.popleft()

    def wire_rate(self) -> float:
        """Requests per second over the last WIRE_WINDOW seconds (or since start)."""
        if self._wire_since is None:
            return 0.0
        now = trio.current_time()
        while self._wire and self._wire[0] < now - WIRE_WINDOW:
            self._wire.popleft()
        span = min(WIRE_WINDOW, now - self._wire_since)
        return len(self._wire) / span if span > 0 else 0.0

    def statistics(self) -> CrawlerStatistics:
        return CrawlerStatistics(
            workers=self.config.crawl.workers,
            busy=self._busy,
            fetches=self._fetches,
            changed=self._changed,
            not_modified=self._not_modified,
            errors=self._errors,
            denied=self._denied,
            robots_fetches=self._robots,
            bytes=self._bytes,
            meaningful=self._meaningful,
            duplicates=self._duplicates,
            wire_rate=self.wire_rate(),
        )


def _failed(
    url: str, error: FetchError, started: float, finished: float, took: float
) -> FetchResult:
    """A fetch of ``url`` that ``error`` ended before any response (times: unix seconds)."""
    return FetchResult(
        url=url,
        final_url=url,
        status=None,
        started_at=started,
        finished_at=finished,
        duration=took,
        bytes=0,
        digest=None,
        body=None,
        content_type=None,
        etag=None,
        last_modified=None,
        not_modified=False,
        error_kind=error.kind,
        error=str(error),
    )
