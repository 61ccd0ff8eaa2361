"""Discovery: from links found in fetched documents to new pages in the frontier.

The crawler hands each processed document here through a bounded queue. A fetched document's
findings also ride in its fetch's record, and the store keeps them until discovery has stored
what they yield (:attr:`DocumentUpdate.fetched_at`). When the queue is full a document is
not dropped: it waits in the store (:meth:`Discovery.defer`) and :meth:`Discovery.replay`
hands it over as the queue empties; beyond :data:`OWED_BACKLOG` such documents the crawler
waits for room (:meth:`Discovery.put`). What a stop or a crash left in the queue is handed
over again at the next start. Only robots.txt's sitemap lists, which no fetch record keeps,
are dropped when the queue is full (counted; they come back with the next robots.txt).
For each document:
every link is canonicalised and screened by the URL filter (scope, limits, spider traps), the
URL-seen test (CLOCK cache, then the store in one batch) keeps the never-seen ones, those become
pages (prior change rate, due now) and go to the frontier; the link edges, rel=canonical, meta
robots noindex and sitemap ``<lastmod>`` values go to the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from refresher._config import DiscoveryConfig
from refresher._errors import StoreError
from refresher.crawl._frontier import Frontier
from refresher.discover._filter import UrlFilter
from refresher.discover._parse import Extracted, Link
from refresher.discover._seen import UrlSeen
from refresher.discover._url import CanonicalURL
from refresher.ops._logging import get_logger
from refresher.refresh._allocate import Allocator
from refresher.store._interface import DocumentUpdate, Findings, NewPage, Store

__all__ = [
    "Discovery",
    "DiscoveryStatistics",
    "Found",
    "findings_of",
    "found_of",
    "sitemap_links",
]

log = get_logger("discover")

#: link kinds that name pages to crawl ("url": a sitemap entry; "sitemap": a sitemap file)
_PAGE_KINDS = frozenset({"a", "area", "frame", "iframe", "link", "url", "redirect", "sitemap"})
_MEDIA_KINDS = frozenset({"img", "script"})
#: documents handled together at most (one URL-seen lookup and one store call for them)
BATCH_DOCUMENTS = 128
#: owed documents read from the store at a time by :meth:`Discovery.replay`
OWED_BATCH = 1000
#: seconds between :meth:`Discovery.replay`'s looks for documents owed to discovery; those
#: this run wrote or took are handed over again only this long after (for a store whose
#: discovery lost them without the process ending)
OWED_EVERY = 5.0
OWED_GRACE = 120.0
#: seconds at least between two looks of :meth:`Discovery.replay`
OWED_SPACING = 1.0
#: documents deferred to the store at most (:meth:`Discovery.defer`); then the crawler waits
OWED_BACKLOG = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """What the crawler found on one page."""

    page_id: int
    depth: int  # the page's own depth; its links are one deeper
    url: str  # where the body came from (the base for relative links)
    extracted: Extracted
    #: not the page's own body (a redirect target, robots.txt Sitemap lines): no page
    #: properties or link edges are recorded for it
    synthetic: bool = False
    #: the fetch that found it (its finished_at); None for robots.txt's sitemaps
    fetched_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryStatistics:
    documents: int
    dropped: int  # robots.txt sitemap lists not processed because the queue was full
    waited: int  # documents the crawler waited to queue (queue full, backlog full)
    deferred: int  # documents left owed in the store while the queue was full
    replayed: int  # documents' findings handed over from the store (deferred, or a run left)
    links: int  # links looked at
    new_pages: int
    edges: int
    queued: int


class Discovery:
    def __init__(
        self,
        *,
        store: Store,
        frontier: Frontier,
        allocator: Allocator,
        url_filter: UrlFilter,
        seen: UrlSeen,
        include_media: bool = False,
        queue: int = 1000,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._frontier = frontier
        self._allocator = allocator
        self.filter = url_filter
        self.seen = seen
        self._kinds = _kinds(include_media)
        self._send, self._recv = trio.open_memory_channel[Found](queue)
        self._wall = wall_clock
        self._documents = 0
        self._dropped = 0
        self._waited = 0
        self._deferred = 0
        self._backlog = 0  # deferred and not handed over yet (about)
        self._wake = trio.Event()  # set when a document is deferred
        self._replayed = 0
        self._busy = False  # a batch is being handled
        self._idle = trio.Event()  # set when a batch ends with nothing queued
        self._links = 0
        self._new = 0
        self._edges = 0

    def configure(self, discovery: DiscoveryConfig) -> None:
        """Take new ``[discovery]`` settings (SIGHUP): the kinds of link followed and the URL
        filter's scope and limits (see :meth:`UrlFilter.configure`)."""
        self._kinds = _kinds(discovery.include_media)
        self.filter.configure(discovery.filter_config())

    def submit(self, found: Found) -> bool:
        """Queue a document's findings; False (counted) when the queue is full."""
        try:
            self._send.send_nowait(found)
        except trio.WouldBlock:
            self._dropped += 1
            return False
        return True

    def defer(self) -> bool:
        """Whether a fetched document's findings should wait in the store (its record marked
        :attr:`FetchRecord.deferred`) instead of in the queue: the queue is full and fewer
        than :data:`OWED_BACKLOG` are deferred already. :meth:`replay` hands them over as the
        queue empties. Beyond the backlog the crawler waits in :meth:`put` (backpressure)."""
        s = self._send.statistics()
        if s.current_buffer_used < s.max_buffer_size or self._backlog >= OWED_BACKLOG:
            return False
        self._deferred += 1
        self._backlog += 1
        self._wake.set()
        return True

    async def put(self, found: Found) -> None:
        """Queue a fetched document's findings, waiting while the queue is full (they are
        owed in the store meanwhile: none is dropped)."""
        try:
            self._send.send_nowait(found)
        except trio.WouldBlock:
            self._waited += 1
            await self._send.send(found)

    async def replay(
        self,
        *,
        every: float = OWED_EVERY,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hand over the documents' findings the store owes to discovery and no queue holds:
        those an earlier run left (it stopped or died before storing them) at once, those
        :meth:`defer` left as soon as the queue has room, and any of this run's left longer
        than :data:`OWED_GRACE`. Looks every ``every`` seconds, or (at most once a second)
        when a document was deferred. At least once: a link found twice is one page."""
        task_status.started()
        while True:
            self._wake = trio.Event()
            try:
                owed = await self._store.owed_documents(OWED_BATCH, grace=OWED_GRACE)
            except StoreError as e:  # a fleet's database away for a while: try again later
                log.warning("reading the owed findings failed; retrying", error=str(e))
                owed = []
            for _row, page_id, fetched_at, findings in owed:
                await self._send.send(found_of(page_id, fetched_at, findings))
            self._replayed += len(owed)
            self._backlog = max(0, self._backlog - len(owed))
            if owed:
                log.info("findings handed to discovery again", documents=len(owed))
            if len(owed) < OWED_BATCH:
                # not a look per deferred document: each look commits the store's batch
                await trio.sleep(OWED_SPACING)
                with trio.move_on_after(every):
                    await self._wake.wait()

    def add_seed_hosts(self, hosts: Iterable[str]) -> None:
        self.filter.add_seed_hosts(hosts)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for found in self._recv:
            # Every document waiting, up to a batch: the store is asked once per batch (the
            # URL-seen lookup, then the pages and edges), not twice per document. Each ask
            # waits for the store writer's batch in progress, and one per document kept
            # discovery at about a document a second while a first pass parsed a hundred.
            batch = [found]
            while len(batch) < BATCH_DOCUMENTS:
                try:
                    batch.append(self._recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            self._busy = True
            try:
                await self.handle_many(batch)
            finally:
                self._busy = False
            if not self._recv.statistics().current_buffer_used:
                self._idle.set()

    async def drain(self) -> None:
        """Wait until every queued document is stored (at a stop: what is stored then is not
        handed over again at the next start; the caller bounds the wait)."""
        while self._busy or self._recv.statistics().current_buffer_used:
            self._idle = trio.Event()
            await self._idle.wait()

    async def handle(self, found: Found) -> int:
        """Process one document's findings; returns the number of new pages."""
        return await self.handle_many([found])

    async def handle_many(self, batch: Sequence[Found]) -> int:
        """Process documents' findings, in order; returns the number of new pages. A page
        linked by several of them is added by the first; the URL filter's limits are checked
        again as each new page is accepted, so a batch cannot overfill a host or a path."""
        self._documents += len(batch)
        screened = [self._screen(found) for found in batch]
        union = list(dict.fromkeys(url for candidates, _, _ in screened for url in candidates))
        fresh = set(await self.seen.filter_new(union)) if union else set()
        updates = []
        for found, (candidates, canonical, linked) in zip(batch, screened, strict=True):
            new = []
            for url, page in candidates.items():
                if url in fresh and self.filter.admit(canonical[url]):
                    new.append(page)
                fresh.discard(url)
            ex = found.extracted
            updates.append(
                DocumentUpdate(
                    page_id=found.page_id,
                    new=new,
                    linked=linked,
                    canonical=ex.canonical,
                    noindex=ex.noindex,
                    lastmod=ex.lastmod,
                    coarse_lastmod=ex.coarse_lastmod,
                    synthetic=found.synthetic,
                    fetched_at=found.fetched_at,
                )
            )
        saved = await self._store.save_documents(updates, now=self._wall())
        added = 0
        for rows, hosts, edges in saved:
            self._edges += edges
            if rows:
                added += len(rows)
                self._frontier.add(rows, hosts)
                self._allocator.pages_added(len(rows))
        self._new += added
        return added

    def _screen(
        self, found: Found
    ) -> tuple[dict[str, NewPage], dict[str, CanonicalURL], list[str]]:
        """A document's links through the URL filter: the candidate pages by URL (first
        occurrence), their canonical URLs, and every linked URL in order (the edges)."""
        depth = found.depth + 1
        candidates: dict[str, NewPage] = {}
        canonical: dict[str, CanonicalURL] = {}
        linked: list[str] = []
        for link in _followed(found.extracted, self._kinds):
            self._links += 1
            url = self.filter.screen(link.url, base=found.url, depth=depth)
            if url is None:
                continue
            linked.append(url.url)
            if url.url not in candidates:
                canonical[url.url] = url
                source = "sitemap" if link.kind == "sitemap" else "link"
                candidates[url.url] = NewPage(
                    url=url.url, host=url.host_key, scheme=url.scheme, source=source, depth=depth
                )
        return candidates, canonical, linked

    def statistics(self) -> DiscoveryStatistics:
        return DiscoveryStatistics(
            documents=self._documents,
            dropped=self._dropped,
            waited=self._waited,
            deferred=self._deferred,
            replayed=self._replayed,
            links=self._links,
            new_pages=self._new,
            edges=self._edges,
            queued=self._recv.statistics().current_buffer_used,
        )


def _kinds(include_media: bool) -> frozenset[str]:
    return _PAGE_KINDS | (_MEDIA_KINDS if include_media else frozenset())


def _followed(ex: Extracted, kinds: frozenset[str]) -> Sequence[Link]:
    return [link for link in ex.follow() if link.kind in kinds]


def findings_of(found: Found) -> Findings:
    """``found`` as the store keeps it with its fetch (the links a polite crawler follows)."""
    ex = found.extracted
    return Findings(
        depth=found.depth,
        url=found.url,
        links=tuple((link.url, link.kind) for link in ex.follow()),
        canonical=ex.canonical,
        noindex=ex.noindex,
        lastmod=ex.lastmod,
        coarse_lastmod=ex.coarse_lastmod,
        synthetic=found.synthetic,
    )


def found_of(page_id: int, fetched_at: float, findings: Findings) -> Found:
    """The :class:`Found` a store's kept ``findings`` stand for (handed to discovery again)."""
    links = tuple(Link(url=u, kind=k, nofollow=False) for u, k in findings.links)
    return Found(
        page_id=page_id,
        depth=findings.depth,
        url=findings.url,
        extracted=Extracted(
            links=links,
            canonical=findings.canonical,
            noindex=findings.noindex,
            lastmod=findings.lastmod,
            coarse_lastmod=findings.coarse_lastmod,
        ),
        synthetic=findings.synthetic,
        fetched_at=fetched_at,
    )


def sitemap_links(urls: Sequence[str]) -> Extracted:
    """Sitemap URLs (from robots.txt) as findings to queue like a page's links."""
    return Extracted(links=tuple(Link(url=u, kind="sitemap", nofollow=False) for u in urls))
