"""The workers: take a page from the frontier, fetch it politely, record the outcome.

One refresh of one page, in order: robots.txt for the host when it is unknown or expired (a
request of its own, after which the host waits its politeness delay before the page); the robots
check (a disallowed page is recorded as ``denied`` and never requested); the conditional GET;
the outcome (:func:`refresher.crawl._outcome.classify`, pure); processing a new body and the
content-seen test; the politeness delay and backoff; the record to the store; the host back to
the frontier with its new timing and robots (the frontier alone writes its host state); the
links to discovery.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import trio

from refresher._config import Config, DiscoveryConfig
from refresher._cpus import usable_cpus
from refresher._errors import DNSFailure, FetchError
from refresher.archive._keep import Keeper
from refresher.crawl._fetch import Fetcher, FetchResult
from refresher.crawl._frontier import (
    Frontier,
    HostRobots,
    HostState,
    HostTiming,
    Lease,
    next_allowed_after,
)
from refresher.crawl._outcome import GONE_RECHECK, Outcome, classify, meaningful
from refresher.crawl._robots import RobotsRules, rules_for_response
from refresher.discover._content import ContentSeen, document_key
from refresher.discover._discovery import Discovery, Found, findings_of, sitemap_links
from refresher.discover._parse import (
    Document,
    Extracted,
    HtmlLinks,
    Link,
    Processor,
    portable,
    process,
)
from refresher.discover._threads import ParseCrashed, Parsers
from refresher.discover._url import canonicalize
from refresher.ops._logging import get_logger
from refresher.refresh._allocate import Allocator
from refresher.store._interface import FetchRecord, HostUpdate, RobotsUpdate, Store

__all__ = ["Crawler", "CrawlerStatistics"]

log = get_logger("crawl")


#: documents remembered for the content-seen test
_DOCUMENTS_REMEMBERED = 100_000
_NOTHING = Extracted()


def processors(discovery: DiscoveryConfig) -> dict[str, Processor]:
    """The built-in processors as ``[discovery]`` configures them (replacing the defaults)."""
    html = HtmlLinks(
        include_media=discovery.include_media,
        max_links=discovery.max_links_per_page,
        max_url_length=discovery.max_url_length,
        parser=discovery.html_parser,
        max_text=discovery.max_text_chars,
    )
    return {html.name: html}


def _host_update(host_id: int, timing: HostTiming) -> HostUpdate:
    return HostUpdate(
        host_id=host_id,
        next_allowed=timing.next_allowed,
        delay=timing.delay,
        backoff=timing.backoff,
        errors=timing.errors,
    )


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
    abandoned: int = 0  # requests cut on the wire (a fleet node lost their partition's lease)
    # seconds spent, summed over workers, per stage of a refresh (see STAGES)
    stage_seconds: Mapping[str, float] = field(
        default_factory=dict, hash=False, metadata={"metric": "counter"}
    )


#: seconds of requests the wire rate is averaged over
WIRE_WINDOW = 30.0
#: the stages of a refresh whose seconds CrawlerStatistics.stage_seconds sums over workers:
#: a host held by a worker (from its lease to its release), a request on the wire, a body
#: waiting for and being processed (parse), and a fetch waiting for room in the store's queue
STAGES = ("held", "wire", "parse", "record")
#: seconds until a page robots.txt denies is checked again when its host's robots.txt has no
#: expiry (it is checked again when robots.txt is re-fetched otherwise)
DENIED_RECHECK = 3600.0
#: seconds a cancelled worker waits, at most, to queue its host's politeness state (a store
#: queue that is full takes a batch's commit to make room)
STORE_GRACE = 1.0


def crawl_parsers(config: Config) -> Parsers:
    """The crawl's parse stage as ``[discovery]`` sets it (not entered yet)."""
    setting = config.discovery.parse_processes
    auto = setting == "auto"
    # "auto" on one CPU: no second core for a process to use, only a hand-off to pay
    cpus = usable_cpus()
    split = config.discovery.split_cpus and cpus > 1
    # One parse thread per core: libxml2 parses without the GIL, but link resolution and the
    # simhash hold it, and twenty threads taking turns at it spend their time switching
    # (bench/bench_parsers.py measures 1, 2, 8 and 20 threads). Pages of real size go to
    # parse processes, which leave this process's GIL to the fetches.
    return Parsers(
        processes=(cpus if cpus > 1 else 0) if auto else int(setting),
        # split: the processes have CPUs of their own, the threads share the event loop's
        prefer="thread" if auto and not split else "process",
        split=split,
        log_format=config.log.format,
        log_level=config.log.level,
    )


@contextlib.asynccontextmanager
async def parse_stage(config: Config) -> AsyncIterator[Parsers]:
    """The crawl's parse stage entered, its processes started at once when a large page
    goes to a process first (:meth:`Parsers.warm`): their imports then overlap the daemon's
    start-up (the store, the seeds) instead of the first second of crawling, when the large
    pages waited for the threads on the event loop's CPU (the first pass's ramp,
    bench/README.md)."""
    parsers = crawl_parsers(config)
    async with parsers:
        parsers.warm()
        yield parsers


class Crawler:
    """Owns the worker tasks; ``run`` returns once the frontier is closed and all are done."""

    def __init__(
        self,
        *,
        config: Config,
        frontier: Frontier,
        fetcher: Fetcher,
        store: Store,
        allocator: Allocator,
        discovery: Discovery | None = None,
        wall_clock: Callable[[], float] = time.time,
        keeper: Keeper | None = None,
        parsers: Parsers | None = None,
    ) -> None:
        """``parsers``: a parse stage already entered (``async with``) by the caller, who
        ends it after :meth:`run` (:func:`parse_stage`); by default the crawler makes its own
        in :meth:`run`."""
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
        # start times (trio clock) of the requests in the last WIRE_WINDOW seconds
        self._wire: deque[float] = deque()
        self._wire_since: float | None = None  # when run() began
        self._discovery = discovery
        self._keeper = keeper  # the archive and the change feed
        self._seen = ContentSeen(_DOCUMENTS_REMEMBERED)
        self._builtins = processors(config.discovery)
        self._own_parsers = parsers is None
        self._parsing = parsers if parsers is not None else crawl_parsers(config)
        self.idle = trio.Event()  # set when every worker has stopped
        # host id → (host name, the cancel scope of its request on the wire): at most one each
        self._on_wire_now: dict[int, tuple[str, trio.CancelScope]] = {}
        self._abandoned = 0
        self._stages = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def _timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._stages[stage] += time.perf_counter() - t0

    @property
    def parsers(self) -> Parsers:
        """The parse stage's threads and processes (their ``statistics()``: calls by kind)."""
        return self._parsing

    def abandon(self, hosts: Callable[[str], bool]) -> int:
        """Cut the requests on the wire to the hosts ``hosts`` accepts; how many were cut.

        A fleet node calls this the moment it can no longer prove its lease on their partition,
        so that its last request to them has ended before another node may take them: the
        self-fencing margin then needs no room for a whole fetch. Nothing of a cut request is
        recorded (its page keeps its due time in the store, for the partition's next owner);
        the connection is closed, never reused."""
        cut = 0
        for name, scope in list(self._on_wire_now.values()):
            if hosts(name):
                scope.cancel()
                cut += 1
        self._abandoned += cut
        return cut

    @contextmanager
    def _wire_scope(self, lease: Lease) -> Iterator[trio.CancelScope]:
        scope = trio.CancelScope()
        self._on_wire_now[lease.host.id] = (lease.host.name, scope)
        try:
            with scope:
                yield scope
        finally:
            del self._on_wire_now[lease.host.id]

    async def _give_up(self, lease: Lease) -> None:
        """Release the host of a request :meth:`abandon` cut: no fetch recorded, but the host's
        delay counted from the cut is stored before the host is released. The host was
        contacted until now, and the partition's next owner knows its politeness only from
        the store: the lease is handed back once the released hosts' writes have committed."""
        log.info("request abandoned", url=lease.page.url)
        await self._let_go(lease)

    async def _let_go(self, lease: Lease) -> None:
        """Release ``lease`` with no fetch recorded (its page keeps its due time in the store)
        after storing its host's delay counted from now (:meth:`_fallback_timing`): the host
        may have been contacted until now, and the next run or a partition's next owner knows
        its politeness only from the store. Every path that ends a refresh without a record
        comes here: a cut request, a bug, a cancellation (the write is shielded, for at most
        :data:`STORE_GRACE` seconds). The host is released even when the write fails."""
        timing = self._fallback_timing(lease.host)
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(STORE_GRACE):
                await self._store.update_host(_host_update(lease.host.id, timing))
        except trio.ClosedResourceError:
            pass  # the store is closed (the daemon is stopping): the next run starts afresh
        except Exception:
            log.exception("host timing not stored", host=lease.host.name)
        finally:
            self._frontier.release(lease, next_due=None, timing=timing)

    def configure(self, config: Config) -> None:
        """Take new politeness, robots, user agent and link-extraction settings (SIGHUP)."""
        self.config = config
        self._builtins = processors(config.discovery)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._wire_since = trio.current_time()
        # threads and processes start with the first parse; every parse is awaited before
        # the block ends, so nothing is left to wait for then
        stage = self._parsing if self._own_parsers else contextlib.nullcontext(self._parsing)
        async with stage, trio.open_nursery() as nursery:
            for _ in range(self.config.crawl.workers):
                nursery.start_soon(self._worker)
            task_status.started()
        self.idle.set()

    async def _worker(self) -> None:
        while (lease := await self._frontier.acquire()) is not None:
            found = await self._hold(lease)
            if found is not None:
                await self._hand_over(found)

    async def _hold(self, lease: Lease) -> Found | None:
        """Refresh ``lease``'s page and release its host, exactly once on every path (a
        second release would free the host while another worker may hold it); the findings
        to hand to discovery once the host is free, if any."""
        self._busy += 1
        t0 = time.perf_counter()
        try:
            return await self._refresh(lease)
        except Exception:
            # A bug must not stop the crawl: the page keeps its due time in the store.
            log.exception("refresh failed", url=lease.page.url)
            await self._let_go(lease)
            return None
        except BaseException:
            # Cancelled mid-fetch (drain deadline passed): nothing is recorded, the page
            # keeps its due time in the store and is fetched again after restart.
            await self._let_go(lease)
            raise
        finally:
            self._busy -= 1
            self._stages["held"] += time.perf_counter() - t0

    async def _hand_over(self, found: Found) -> None:
        """Give a fetch's findings to discovery, waiting while its queue is full (the crawl
        slows to discovery's pace rather than drop links). Their host is released already:
        a cancellation here has nothing to give back, and the findings stay owed in the
        store, written with the fetch, until discovery has stored them."""
        assert self._discovery is not None
        try:
            await self._discovery.put(found)
        except Exception:
            log.exception("findings not handed to discovery; the store owes them", url=found.url)

    # -- one refresh -----------------------------------------------------------------------

    async def _refresh(self, lease: Lease) -> Found | None:
        """Refresh ``lease``'s page and release its host: the findings for discovery."""
        host, page = lease.host, lease.page
        if host.paused:  # paused while this worker waited for a budget token
            self._frontier.requeue(lease)
            return None
        now = self._wall()
        agent = self.config.crawl.user_agent
        robots: HostRobots | None = None
        rules: RobotsRules | None = host.robots if host.robots_agent == agent else None
        if rules is None or (host.robots_expires_at or 0.0) <= now:
            if host.robots_body is not None and (host.robots_expires_at or 0.0) > now:
                # Known and fresh, but not parsed yet (a restart) or for another user agent.
                rules = rules_for_response(host.robots_status, host.robots_body, agent)
                robots = HostRobots(
                    rules=rules,
                    agent=agent,
                    status=host.robots_status,
                    body=host.robots_body,
                    expires_at=host.robots_expires_at,
                )
            else:
                with self._wire_scope(lease) as scope:
                    fetched = await self._fetch_robots(lease)
                if scope.cancelled_caught:
                    await self._give_up(lease)
                    return None
                if isinstance(fetched, FetchResult):  # the host name does not resolve
                    return await self._record(lease, fetched, None)
                # The robots request counts against the host's politeness; the page waits.
                timing, robots = fetched
                self._frontier.requeue(lease, timing=timing, robots=robots)
                return None
        assert rules is not None
        if not rules.allowed(page.url):
            await self._record_denied(lease, now, robots)
            return None
        self._on_wire()
        with self._wire_scope(lease) as scope, self._timed("wire"):
            result = await self._fetcher.fetch(
                page.url, etag=page.etag, last_modified=page.last_modified
            )
        if scope.cancelled_caught:
            await self._give_up(lease)
            return None
        return await self._record(lease, result, robots)

    async def _fetch_robots(self, lease: Lease) -> tuple[HostTiming, HostRobots] | FetchResult:
        """Fetch the host's robots.txt: the host's new timing and robots. The page's failed
        fetch when the host name does not resolve, to be recorded as such (kind "dns", the
        host backs off, the lease is released) rather than as an unreachable robots.txt, which
        would deny every page."""
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
            return _failed(page.url, error, started, self._wall(), elapsed)
        rules = rules_for_response(status, body, c.crawl.user_agent)
        now = self._wall()
        ok = status is not None and status < 500
        expires = now + (c.robots.expiry if ok else c.robots.retry_after_failure)
        robots = HostRobots(
            rules=rules, agent=c.crawl.user_agent, status=status, body=body, expires_at=expires
        )
        timing = self._timing(
            host, rules, finished_at=now, response_time=elapsed, failed=False, retry_after=None
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
        await self._store.update_host(_host_update(host.id, timing))
        if self._discovery is not None and c.discovery.sitemaps:
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
        return timing, robots

    def _timing(
        self,
        host: HostState,
        rules: RobotsRules | None,
        *,
        finished_at: float,
        response_time: float,
        failed: bool,
        retry_after: float | None,
    ) -> HostTiming:
        """The host's politeness state after a request that ended at ``finished_at``."""
        p = self.config.politeness
        errors = host.errors + 1 if failed else 0
        next_allowed, delay, backoff = next_allowed_after(
            finished_at=finished_at,
            response_time=response_time,
            min_delay=p.min_delay,
            crawl_delay=rules.crawl_delay if rules is not None else None,
            factor=p.response_time_factor,
            max_delay=p.max_delay,
            failed=failed,
            errors=errors,
            backoff_base=p.backoff_base,
            max_backoff=p.max_backoff,
            retry_after=retry_after,
        )
        return HostTiming(next_allowed=next_allowed, delay=delay, backoff=backoff, errors=errors)

    def _fallback_timing(self, host: HostState) -> HostTiming:
        """A host's timing when its refresh failed before one was computed (a bug, a
        cancellation): its usual delay from now, so a failing refresh cannot hammer it."""
        delay = max(self.config.politeness.min_delay, host.delay or 0.0)
        return HostTiming(
            next_allowed=self._wall() + delay, delay=delay, backoff=host.backoff, errors=host.errors
        )

    async def _record_denied(self, lease: Lease, now: float, robots: HostRobots | None) -> None:
        page, host = lease.page, lease.host
        self._denied += 1
        # Out of the plan (the allocator leaves denied pages out) until robots.txt may have
        # changed: looked at again when it is re-fetched, or on a slow schedule of its own.
        known = robots.expires_at if robots is not None else host.robots_expires_at
        expires = known or 0.0
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
        lease = self._frontier.update_page(lease, tried=True)
        self._frontier.release(lease, next_due=due, robots=robots)

    async def _record(
        self, lease: Lease, r: FetchResult, robots: HostRobots | None
    ) -> Found | None:
        """Record the fetch and release the host: the findings for discovery, which are
        handed over once the host is free (no release left to do if that wait is cut)."""
        page, host = lease.page, lease.host
        o = classify(page, r)
        self._count(o, r)
        rules = robots.rules if robots is not None else host.robots
        timing = self._timing(
            host,
            rules,
            finished_at=r.finished_at,
            response_time=r.duration,
            failed=o.failed,
            retry_after=r.retry_after,
        )
        extracted = await self._process(r) if o.process else None
        if extracted is not None:
            fingerprint = extracted.fingerprint
        elif o.success and r.body is not None:
            fingerprint = page.fingerprint  # the body of last time: the same text
        else:
            fingerprint = None
        duplicate_of = self._content_seen(page.id, r, o, extracted)
        change = meaningful(o, page.fingerprint, fingerprint)
        self._meaningful += bool(change)
        if o.due:
            due = self._allocator.due_after_fetch(page, r.finished_at)
        else:
            due = r.finished_at + GONE_RECHECK
        capture = None
        if self._keeper is not None:
            capture = self._keeper.keep(
                page_id=page.id,
                url=page.url,
                result=r,
                previous_digest=o.previous_digest,
                etag=page.etag,
                last_modified=page.last_modified,
                meaningful=change,
            )
        # The findings travel with the fetch's record: the store keeps them in the fetch's
        # transaction until discovery has stored them (no link lost to a crash).
        found = self._found(lease, r, extracted, duplicate_of)
        record = self._fetch_record(lease, r, o, due, fingerprint, change, duplicate_of)
        # Discovery's queue full: the findings wait in the store, handed over as it empties.
        deferred = found is not None and self._discovery is not None and self._discovery.defer()
        if found is not None:
            record = replace(record, findings=findings_of(found), deferred=deferred)
        with self._timed("record"):
            await self._store.record(record, capture, _host_update(host.id, timing))
        lease = self._frontier.update_page(
            lease,
            etag=o.etag,
            last_modified=o.last_modified,
            digest=o.digest,
            fingerprint=fingerprint if fingerprint is not None else page.fingerprint,
            tried=True,
        )
        # A gone page is out of the plan (the allocator leaves it out) and due again only on
        # its slow schedule: it may come back.
        self._frontier.release(lease, next_due=due, timing=timing, robots=robots)
        # Waits while the queue is full (the deferred backlog is full too, or the queue filled
        # since), after the release: the crawl slows to discovery's pace rather than drop links.
        return None if deferred else found

    def _count(self, o: Outcome, r: FetchResult) -> None:
        self._fetches += 1
        self._bytes += r.bytes
        self._errors += r.error_kind is not None
        self._changed += o.changed
        self._not_modified += o.status == "not_modified"

    async def _process(self, r: FetchResult) -> Extracted:
        assert r.body is not None
        doc = Document(
            url=r.final_url, content_type=r.content_type, body=r.body, robots_tag=r.robots_tag
        )
        # lxml work is CPU-bound: off the event loop, on the parse threads or processes.
        job = functools.partial(process, doc, builtins=self._builtins)
        try:
            with self._timed("parse"):
                return await self._parsing.run(job, size=len(r.body), portable=portable())
        except ParseCrashed:
            log.error("the page's parse process died; its links are not taken", url=r.final_url)
            return Extracted(skipped={"processor_crashed": 1})

    def _content_seen(
        self, page_id: int, r: FetchResult, o: Outcome, extracted: Extracted | None
    ) -> int | None:
        """Another page that recently yielded this document (content-seen), if any."""
        if not o.success or r.digest is None:
            return None
        if extracted is not None:
            return self._seen.test(page_id, document_key(r.digest, extracted))
        if r.body is None:  # a body no processor reads: its bytes are all it yields
            return self._seen.test(page_id, document_key(r.digest, _NOTHING))
        return self._seen.again(page_id)  # the body of last time, not processed again

    def _fetch_record(
        self,
        lease: Lease,
        r: FetchResult,
        o: Outcome,
        due: float,
        fingerprint: int | None,
        change: bool | None,
        duplicate_of: int | None,
    ) -> FetchRecord:
        page = lease.page
        return FetchRecord(
            page_id=page.id,
            host_id=lease.host.id,
            started_at=r.started_at,
            finished_at=r.finished_at,
            duration=r.duration,
            status=r.status,
            body_bytes=r.bytes,
            digest=r.digest,
            changed=o.changed,
            not_modified=r.not_modified,
            error_kind=r.error_kind,
            policy=self._allocator.policy,
            final_url=r.final_url if r.final_url != page.url else r.location,
            redirects=len(r.redirects),
            etag=o.etag,
            last_modified=o.last_modified,
            page_digest=o.digest,
            page_status=o.status,
            due_at=due,
            fingerprint=fingerprint,
            meaningful=change,
            duplicate_of=duplicate_of,
            last_modified_at=o.last_modified_at,
        )

    def _found(
        self, lease: Lease, r: FetchResult, extracted: Extracted | None, duplicate_of: int | None
    ) -> Found | None:
        """What the fetch gives discovery, if anything."""
        if self._discovery is None:
            return None
        if extracted is not None and duplicate_of is None:
            # Content-seen: a document another page yielded recently (same bytes, same
            # resolved links) is processed once, and an unchanged body has no new links.
            found, synthetic = extracted, False
        elif r.location is not None:
            link = Link(url=r.location, kind="redirect", nofollow=False)
            found, synthetic = Extracted(links=(link,)), True
        else:
            return None
        return Found(
            page_id=lease.page.id,
            depth=lease.page.depth,
            url=r.final_url,
            extracted=found,
            synthetic=synthetic,
            fetched_at=r.finished_at,
        )

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
            duplicates=self._seen.statistics().duplicates,
            wire_rate=self.wire_rate(),
            abandoned=self._abandoned,
            stage_seconds=dict(self._stages),
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
