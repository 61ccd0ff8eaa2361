"""The Mercator frontier, adapted to refreshing.

Pages enter from the store in due-time windows (only pages due within ``window`` seconds are held
in memory, at most ``max_pages_in_memory``), wait in a heap until due, then go to one of K *front
queues* by priority. A *biased selector* moves pages from the front queues to *back queues*, one
FIFO per host, keeping about ``back_queues`` hosts active. A min-heap holds each active host that
is not in a worker's hands, keyed by its next-allowed time. :meth:`Frontier.acquire` gives a
worker the root host's next page once the host may be contacted and the refresh budget has a token;
the host leaves the heap until :meth:`Frontier.release`, so never two requests are in flight to one
host. The budget is a pacer at B fetches per second (with at most one second of saved credit).

Sitemaps go first (:data:`URGENT_SOURCES`): a due sitemap page joins the *urgent lane* at the
head of its host's back queue (and of front queue 0 while it waits for one), ahead of the
host's other pages (the latest due first among sitemaps: :func:`_enqueue`), so it takes the
host's next politeness slot instead of waiting behind every page due on the host (at a cold
start, a whole round of seeds). A page a worker gives
back (:meth:`requeue`: robots.txt fetched for it first) goes back behind the lane, so the
sitemaps that robots.txt named are read next. Only the order within a host changes: its
politeness, the budget and the hosts' order stay as they were.

Work-conserving (``work_conserving=True``, the daemon's ``frontier.work_conserving``): when the
pacer has a token, no page is due on a host politeness allows now and the front queues are empty,
the page due soonest among the hosts allowed now (not in a worker's hands, not paused, past their
next-allowed time, nothing queued) is handed out early, so B requests go on the wire whenever
pages and politeness allow. Only the due gate is relaxed; an early page owes nothing
(:func:`refresher.store.due_after`: due one interval after the fetch). The loader then also looks
ahead beyond the window, up to B × window pages held, so there is something to pull forward.

A re-plan moves due times in the store, which alone computes them
(:func:`refresher.store.next_due`): :meth:`Frontier.reset` has the loader read the window anew and
swap the rows in for the pages held not in a worker's hands, with no wait in between. The pages
held stay on offer while the store is read, so a re-plan leaves no worker without a page. The
store is read :data:`READ_CHUNK` rows at a time, of a page held only what a plan changes is kept
from its row (40 bytes), and rows of pages not held only up to the room beside the pages held
(:meth:`_swap`): the read costs about two chunks of rows beyond the pages held, not a second
copy of the window.

In a fleet the frontier serves only the hosts its node holds: :meth:`Frontier.retain` takes the
node's ownership as a predicate over host keys, drops the held pages of every host it refuses
(fetches already in a worker's hands finish; their pages are not kept) and reloads, so the pages
of hosts gained come in; :meth:`Frontier.wait_released` waits until no refused host is in a
worker's hands. Ownership is the fleet's business, not the frontier's: it sees one predicate.

A host's timing comes from the store (its last request's next-allowed time, delay and backoff),
made under the politeness settings of its time. The frontier bounds it by the settings in force
(:class:`DelayLimits`) when it takes a host in, and every known host's at once when a reload
changes them (:meth:`Frontier.set_limits`): a lower ``max_delay`` frees a host that a longer
delay stored before still holds.

Times given to and kept by the frontier are unix seconds (wall clock); sleeping converts them to
trio's clock, so tests may run the frontier on ``autojump_clock`` with an injected wall clock.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from refresher.store._interface import HostRow, PageRow

if TYPE_CHECKING:
    from refresher._config import PolitenessConfig

__all__ = [
    "URGENT_SOURCES",
    "DelayLimits",
    "Frontier",
    "FrontierStatistics",
    "HostRobots",
    "HostState",
    "HostTiming",
    "Lease",
    "Pacer",
    "PageSource",
    "next_allowed_after",
]

#: Work conservation looks at this many of the pages due soonest for one whose host is
#: allowed now (a bound on the cost of a try when those hosts are all held).
EARLY_SCAN = 32
#: How far ahead (seconds) the work-conserving loader looks: every page with a due time.
LOOK_AHEAD = 1e9

#: Rows read from the store at a time: a load, and a re-plan's rescan, hold at most this many
#: rows (with DuckDB's copy of them) beyond the pages held.
READ_CHUNK = 32768

#: Page sources (:attr:`PageRow.source`) fetched ahead of their host's other due pages: a
#: sitemap read is one request that tells of every page it lists, so it takes the host's next
#: politeness slot (the head of its back queue, and of front queue 0 while it waits for one).
URGENT_SOURCES = frozenset({"sitemap"})

#: Seconds a released page's next due time is remembered against a stale row of it.
RELEASE_MEMORY = 10.0
#: At most this many released pages remembered (about 100 bytes each).
RELEASE_ENTRIES = 100_000

#: ``source(after, until, limit, known)`` → the pages with (due_at, id) > after and
#: due_at ≤ until, earliest first, at most ``limit``; and the rows of their hosts whose ids are
#: not in ``known``.
PageSource = Callable[
    [tuple[float, int], float, int, frozenset[int]],
    Awaitable[tuple[list[PageRow], Mapping[int, HostRow]]],
]


def next_allowed_after(
    *,
    finished_at: float,
    response_time: float,
    min_delay: float,
    crawl_delay: float | None,
    factor: float,
    max_delay: float,
    failed: bool,
    errors: int,
    backoff_base: float,
    max_backoff: float,
    retry_after: float | None,
) -> tuple[float, float, float]:
    """Politeness after one fetch: ``(next_allowed, delay, backoff)``, all in seconds.

    The delay is max(min_delay, Crawl-delay, k × response time), capped by ``max_delay``.
    After ``errors`` consecutive failures (counting this one) the host waits
    ``backoff_base × 2^(errors−1)`` more, capped by ``max_backoff``; a Retry-After is honoured
    up to ``max_backoff``.
    """
    delay = max(min_delay, crawl_delay or 0.0, factor * response_time)
    delay = min(delay, max(max_delay, min_delay))
    backoff = 0.0
    if failed and errors > 0:
        backoff = min(max_backoff, backoff_base * 2.0 ** min(errors - 1, 60))
    if retry_after is not None:
        backoff = max(backoff, min(max_backoff, retry_after))
    return finished_at + max(delay, backoff), delay, backoff


#: A host's timing: (next_allowed unix seconds, delay seconds or None if never asked,
#: backoff seconds).
Timing = tuple[float, float | None, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class DelayLimits:
    """The politeness settings in force, in seconds: a host's delay is kept within
    [``min_delay``, max(``max_delay``, ``min_delay``)] and its backoff at most
    ``max_backoff``, as :func:`next_allowed_after` makes them. The defaults bind nothing."""

    min_delay: float = 0.0
    max_delay: float = math.inf
    max_backoff: float = math.inf

    @classmethod
    def from_config(cls, politeness: PolitenessConfig) -> DelayLimits:
        """The limits ``[politeness]`` sets (at the start and at each reload)."""
        return cls(
            min_delay=politeness.min_delay,
            max_delay=politeness.max_delay,
            max_backoff=politeness.max_backoff,
        )

    def delay_range(self) -> tuple[float, float]:
        """(lowest, highest) delay in force, seconds: the one range every stored delay is
        taken within, by the frontier here and by the plan's host caps."""
        return self.min_delay, max(self.max_delay, self.min_delay)

    def bounded(self, timing: Timing) -> Timing:
        """``(next_allowed, delay, backoff)`` as the last request would have left them under
        these limits (a delay or backoff stored under others: before a reload, or by another
        run). The request ended at the next-allowed time less the longer of delay and backoff,
        as :func:`next_allowed_after` adds it. A host never asked (no delay) is left alone."""
        next_allowed, delay, backoff = timing
        if delay is None:
            return timing
        low, high = self.delay_range()
        bounded = min(max(delay, low), high)
        capped = min(backoff, self.max_backoff)
        if (bounded, capped) == (delay, backoff):
            return timing  # exactly as it was: no rounding through the request's end
        ended = next_allowed - max(delay, backoff)
        return ended + max(bounded, capped), bounded, capped

    def bound(self, host: HostState) -> bool:
        """Bound ``host``'s timing (:meth:`bounded`); returns whether it changed."""
        timing = (host.next_allowed, host.delay, host.backoff)
        host.next_allowed, host.delay, host.backoff = self.bounded(timing)
        return host.delay != timing[1] or host.backoff != timing[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTiming:
    """A host's politeness state after a request: handed to :meth:`Frontier.release` (or
    :meth:`Frontier.requeue`), which alone writes it into the frontier's :class:`HostState`."""

    next_allowed: float  # unix seconds
    delay: float  # seconds
    backoff: float  # seconds
    errors: int  # consecutive failures


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRobots:
    """A host's robots.txt as last fetched, and its rules parsed for ``agent``."""

    rules: Any  # refresher.crawl._robots.RobotsRules
    agent: str  # the user agent the rules were matched for
    status: int | None  # None: unreachable
    body: bytes | None
    expires_at: float | None  # unix seconds


@dataclass(slots=True, eq=False)
class HostState:
    """What the frontier knows of one host while it has pages in memory.

    Workers read it through their lease; only the frontier writes it (their new timing and
    robots come back as values with the release).
    """

    id: int
    name: str
    scheme: str
    next_allowed: float = 0.0  # unix seconds
    delay: float | None = None  # seconds
    backoff: float = 0.0  # seconds
    errors: int = 0
    robots: Any = None  # parsed rules (refresher.crawl._robots.RobotsRules) once known
    robots_agent: str | None = None  # the user agent ``robots`` was matched for
    robots_status: int | None = None
    robots_body: bytes | None = None
    robots_expires_at: float | None = None
    paused: bool = False
    queue: deque[PageRow] = field(default_factory=deque)  # the back queue
    in_memory: int = 0  # pages of this host held by the frontier
    leased: bool = False
    active: bool = False  # owns a back queue slot
    token: int = 0  # the heap entry carrying this token is the valid one

    @classmethod
    def from_row(cls, row: HostRow) -> HostState:
        return cls(
            id=row.id,
            name=row.name,
            scheme=row.scheme,
            next_allowed=row.next_allowed,
            delay=row.delay,
            backoff=row.backoff,
            errors=row.errors,
            robots_status=row.robots_status,
            robots_body=row.robots_body,
            robots_expires_at=row.robots_expires_at,
            paused=row.paused,
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """One page handed to a worker, with its host held until release."""

    page: PageRow
    host: HostState


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontierStatistics:
    in_memory: int  # pages held
    waiting: int  # pages not yet due
    front: tuple[int, ...]  # pages per front queue, highest priority first
    back: int  # pages in back queues
    active_hosts: int
    ready_hosts: int  # in the heap
    leased: int  # hosts in workers' hands
    hosts_known: int
    dispatched: int  # pages handed to workers since start
    cursor: float  # unix seconds: pages due up to here have been loaded
    backing_off: int = 0  # known hosts waiting out an error backoff now
    paused: int = 0  # known hosts paused
    early: int = 0  # pages handed out before they were due (work conservation)
    lapsed: float = 0.0  # budget tokens left unused beyond the pacer's one second of credit


class Pacer:
    """Hands out at most ``rate`` tokens per second, with ``burst`` seconds of saved credit.

    A token is late, not lost, while the credit holds it: a worker woken late (a busy event
    loop) takes the tokens due meanwhile at once. Credit beyond ``burst`` seconds lapses:
    :meth:`lapsed` counts those tokens, the budget left unspent for want of a page a host
    may take (or of the CPU to hand it out for more than ``burst`` seconds)."""

    def __init__(self, rate: float, *, burst: float = 1.0) -> None:
        self.rate = rate
        self.burst = burst
        self._next = -math.inf  # trio time of the next free token
        self._lapsed = 0.0  # tokens lapsed up to the last reservation

    def set_rate(self, rate: float) -> None:
        if self._next == -math.inf:  # nothing reserved yet (perhaps outside trio): no credit
            self.rate = rate
            return
        now = trio.current_time()
        lapsing = self._lapsing(now)  # counted at the rate it lapsed at
        if lapsing:
            self._lapsed += lapsing
            self._next = now - self.burst  # what the next reservation would take anyway
        self.rate = rate

    def _lapsing(self, now: float) -> float:
        """Tokens lapsed since the last reservation: credit older than ``burst`` seconds."""
        if self._next == -math.inf:  # nothing reserved yet: the pacer has not started
            return 0.0
        return max(0.0, now - self.burst - self._next) * self.rate

    def reserve(self) -> float:
        """Take the next token: the trio time at which it may be used."""
        now = trio.current_time()
        self._lapsed += self._lapsing(now)
        t = max(self._next, now - self.burst)
        self._next = t + 1.0 / self.rate
        return t

    def lapsed(self) -> float:
        """Tokens that lapsed unused since the first reservation (fractional). Before the
        first there is nothing to lapse, and no trio clock is asked: a frontier's statistics
        may be read outside ``trio.run``."""
        if self._next == -math.inf:
            return 0.0
        return self._lapsed + self._lapsing(trio.current_time())

    def free_at(self) -> float:
        """The trio time from which a token may be used at once."""
        return self._next


class Frontier:
    """Mercator's frontier; see the module docstring."""

    def __init__(
        self,
        *,
        source: PageSource,
        budget: float,
        front_queues: int = 8,
        back_queues: int = 192,
        window: float = 60.0,
        max_pages_in_memory: int = 100_000,
        prioritize: Callable[[PageRow, float], int] | None = None,
        wall_clock: Callable[[], float] = time.time,
        seed: int = 0,
        work_conserving: bool = False,
        limits: DelayLimits = DelayLimits(),
    ) -> None:
        self._source = source
        self._limits = limits
        self.work_conserving = work_conserving
        self.pacer = Pacer(budget)
        self.k = front_queues
        self.max_back = back_queues
        self.window = window
        self.max_pages = max_pages_in_memory
        self._prioritize = prioritize or (lambda page, now: 0)
        self._wall = wall_clock
        self._rng = random.Random(seed)
        self._due: list[tuple[float, int, PageRow]] = []
        self._front: list[deque[PageRow]] = [deque() for _ in range(front_queues)]
        self._ready: list[tuple[float, int, int, HostState]] = []
        self._seq = 0
        self._overflow: tuple[float, int] = (math.inf, 0)
        self._epoch = 0
        self._hosts: dict[int, HostState] = {}
        self._paged: set[int] = set()  # ids of pages held
        self._active = 0
        self._leased = 0
        self._dispatched = 0
        self._early = 0  # pages handed out before they were due (work conservation)
        self._cursor: tuple[float, int] = (-math.inf, -1)
        # Idle workers park here. A released host wakes one of them, not all: with hundreds
        # of workers a broadcast made each re-check the queues for every release.
        self._waiters = trio.lowlevel.ParkingLot()
        self._timer_at = math.inf  # wall time the earliest timed waiter wakes at
        self._load_now = trio.Event()
        self._closed = False
        self._closed_event = trio.Event()
        #: trio time of the loader's last pass
        self.last_pass = math.inf
        self._owns: Callable[[str], bool] | None = None  # None: every host (a single node)
        self._unleased = trio.lowlevel.ParkingLot()  # woken whenever a host leaves a worker
        #: (next_allowed unix s, delay s, backoff s) of hosts let go while next_allowed was
        #: still ahead: a host row loaded meanwhile may predate its last request's timing,
        #: which is still being committed
        self._departed: dict[int, Timing] = {}
        #: next due time (unix s) of pages let go by release, with when: a page row loaded
        #: meanwhile may predate the fetch's record, and pulled forward be fetched again at once
        self._released: OrderedDict[int, tuple[float, float]] = OrderedDict()
        self._rescan = False  # the loader's next pass reads the window anew (:meth:`reset`)
        #: while a rescan reads the store: next due time (unix s) of each page released
        #: meanwhile, newer than the row the read may bring of it
        self._fresh: dict[int, float] | None = None

    # -- time ------------------------------------------------------------------------------

    def _to_trio(self, wall: float) -> float:
        return wall - self._wall() + trio.current_time()

    def _poke(self, *, everyone: bool = True) -> None:
        if everyone:
            self._waiters.unpark_all()
        else:
            self._waiters.unpark(count=1)

    # -- input -----------------------------------------------------------------------------

    def known_hosts(self) -> frozenset[int]:
        return frozenset(self._hosts)

    def add(self, pages: Iterable[PageRow], hosts: Mapping[int, HostRow] = {}) -> int:
        """Hold ``pages`` (skipping those already held); returns how many were taken.

        ``hosts`` must contain a row for every host the frontier does not know yet.
        """
        taken = 0
        for page in pages:
            if page.id in self._paged or not self.owns(page.host):
                continue
            host = self._hosts.get(page.host_id)
            if (host is None and page.host_id not in hosts) or len(self._paged) >= self.max_pages:
                # The store still has it; make the loader look again from here.
                key = (page.due_at, page.id - 1)
                self._cursor = min(self._cursor, key)
                self._overflow = min(self._overflow, key)
                continue
            page = self._not_before_release(page)
            if host is None:
                host = self._known_host(hosts[page.host_id])
                self._hosts[page.host_id] = host
            host.in_memory += 1
            self._paged.add(page.id)
            heapq.heappush(self._due, (page.due_at, page.id, page))
            taken += 1
        if taken:
            self._poke()
        return taken

    def _known_host(self, row: HostRow) -> HostState:
        """A host the frontier takes in, its timing within the limits in force."""
        host = HostState.from_row(row)
        # A row read while this host's last request was being recorded is older than what
        # the frontier knew when it let the host go.
        departed = self._departed.pop(host.id, None)
        if departed is not None and departed[0] > host.next_allowed:
            host.next_allowed, host.delay, host.backoff = departed
        self._limits.bound(host)
        return host

    def set_limits(self, limits: DelayLimits) -> None:
        """Take reloaded politeness settings: every known host's timing is bounded by them at
        once (a lower ``max_delay`` frees a host a longer delay stored before still holds;
        a higher ``min_delay`` holds one longer), and so is every host taken in later."""
        self._limits = limits
        for host in self._hosts.values():
            if limits.bound(host) and host.queue and not host.leased and not host.paused:
                self._push_ready(host)  # its heap entry was keyed by the old time
        self._poke()

    def _not_before_release(self, page: PageRow) -> PageRow:
        """``page`` due no earlier than its release said, when released in the last
        :data:`RELEASE_MEMORY` seconds (its row may predate the fetch's record)."""
        memo = self._released.pop(page.id, None)
        if memo is None or memo[1] < self._wall() - RELEASE_MEMORY:
            return page
        return _due_no_earlier(page, memo[0])

    def reset(self) -> None:
        """Take every held page's due time anew from the store: they changed there (a new
        allocation, a host paused or resumed).

        The loader's next pass reads the window from the start and swaps it in for the pages
        held, at once (:meth:`_swap`): until then the pages held stay on offer, so the workers
        keep the budget on the wire while the store is read (at scale, dropping them first
        left the frontier empty for the whole read, at every re-plan)."""
        self._rescan = True
        self._load_now.set()

    def _empty_queue(self, host: HostState) -> None:
        """Drop the pages of ``host``'s back queue (its leased page stays with its worker)."""
        for page in list(host.queue):
            self._drop(page)
        host.queue.clear()
        if host.active and not host.leased:
            host.active = False
            self._active -= 1

    def _reload(self) -> None:
        """After pages were dropped: forget hosts left with nothing ready, and load anew."""
        self._ready = [e for e in self._ready if e[3].queue]
        heapq.heapify(self._ready)
        self._cursor = (-math.inf, -1)
        self._epoch += 1
        self._load_now.set()
        self._poke()

    def owns(self, host: str) -> bool:
        """Whether this node serves ``host`` (a host key) now."""
        return self._owns is None or self._owns(host)

    def retain(self, owns: Callable[[str], bool] | None) -> None:
        """Serve from now on only the hosts ``owns`` accepts (None: all of them).

        The held pages of the other hosts are dropped at once: no new request to them starts.
        Requests already in a worker's hands finish and are recorded; their pages are not kept.
        Then the loader starts over, bringing in the due pages of hosts newly accepted (the
        page source must already serve the new set)."""
        self._owns = owns

        def keep(page: PageRow) -> bool:
            if self.owns(page.host):
                return True
            self._drop(page)
            return False

        self._due = [e for e in self._due if keep(e[2])]
        heapq.heapify(self._due)
        for i, q in enumerate(self._front):
            self._front[i] = deque(page for page in q if keep(page))
        for host in list(self._hosts.values()):
            if not self.owns(host.name):
                self._empty_queue(host)
        self._reload()

    async def wait_released(self, hosts: Callable[[str], bool]) -> None:
        """Return once no host that ``hosts`` accepts is in a worker's hands."""
        while any(h.leased and hosts(h.name) for h in self._hosts.values()):
            await self._unleased.park()

    def _drop(self, page: PageRow) -> None:
        self._paged.discard(page.id)
        host = self._hosts[page.host_id]
        host.in_memory -= 1
        if host.in_memory == 0 and not host.leased:
            self._forget_host(host)

    def set_budget(self, budget: float) -> None:
        self.pacer.set_rate(budget)

    def set_paused(self, host_name: str, paused: bool) -> None:
        for host in self._hosts.values():
            if host.name == host_name:
                host.paused = paused
                if not paused and host.active and host.queue and not host.leased:
                    self._push_ready(host)
        self._poke()

    # -- flow ------------------------------------------------------------------------------

    def _refill(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, _, page = heapq.heappop(self._due)
            if page.source in URGENT_SOURCES:  # ahead of every page waiting for a back queue
                _enqueue(self._front[0], page)
                continue
            level = min(max(self._prioritize(page, now), 0), self.k - 1)
            self._front[level].append(page)
        while self._active < self.max_back:
            picked = self._select()
            if picked is None:
                return
            host = self._hosts[picked.host_id]
            _enqueue(host.queue, picked)
            if not host.active:
                host.active = True
                self._active += 1
                if not host.leased and not host.paused:
                    self._push_ready(host)

    def _push_ready(self, host: HostState) -> None:
        host.token += 1
        self._seq += 1
        heapq.heappush(self._ready, (host.next_allowed, self._seq, host.token, host))

    def _select(self) -> PageRow | None:
        """Mercator's biased selector: queue i is picked with weight 2^−i among non-empty ones."""
        levels = [i for i, q in enumerate(self._front) if q]
        if not levels:
            return None
        weights = [2.0**-i for i in levels]
        level = self._rng.choices(levels, weights)[0]
        return self._front[level].popleft()

    async def acquire(self) -> Lease | None:
        """The next page to fetch, with its host held; None once the frontier is closed."""
        while not self._closed:
            now = self._wall()
            self._refill(now)
            wake = math.inf
            if self._ready:
                t, _, token, host = self._ready[0]
                if token != host.token or host.leased or host.paused or not host.queue:
                    heapq.heappop(self._ready)
                    continue
                if t <= now:
                    heapq.heappop(self._ready)
                    host.leased = True
                    self._leased += 1
                    page = host.queue.popleft()
                    try:
                        await self._token(self.pacer.reserve())
                    except BaseException:
                        host.queue.appendleft(page)
                        self._unlease(host)
                        raise
                    if self._closed:
                        host.queue.appendleft(page)
                        self._unlease(host)
                        return None
                    if not self.owns(host.name):
                        # The host was given up while this worker waited for a token.
                        self._forget(page, host)
                        self._unlease(host)
                        continue
                    self._dispatched += 1
                    # Hand on: another worker takes the next ready host or the timer.
                    self._poke(everyone=False)
                    return Lease(page, host)
                wake = t
            if self._due:
                wake = min(wake, self._due[0][0])
                if self.work_conserving and not any(self._front):
                    early = self._pull_forward(now)
                    if early is None:
                        continue  # a page pulled forward: its host is at the heap's root
                    wake = min(wake, early)
            await self._park(wake)
        return None

    async def _token(self, at: float) -> None:
        """Wait until trio time ``at``, a token's, or until the frontier closes: at a low
        budget a worker could otherwise sit out the whole drain deadline. A token free now
        (a busy crawl, below the budget) costs a checkpoint only, not a cancel scope with
        its deadline: that was ~1 % of the event loop's time on a docs web (py-spy)."""
        if at <= trio.current_time():
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_at(at):
            await self._closed_event.wait()

    def _pull_forward(self, now: float) -> float | None:
        """Work conservation, with nothing due on a host allowed now: put the page due soonest
        whose host is allowed now into that host's back queue, ready at once, if the pacer has
        a token now; returns None if it did, else the wall time worth waking at for another
        try (the token's, or the earliest next-allowed time of the hosts looked at).

        Looks at the :data:`EARLY_SCAN` pages due soonest, so the cost stays bounded when
        those all belong to hosts held (one host behind its delay, say)."""
        if self._active >= len(self._hosts):
            # Every host is held (an active host has a queue or is leased): none can take a
            # page early, and its release wakes a worker. A first pass over a few hosts is this
            # at every acquire; popping and pushing back the scan's pages cost the event loop
            # about 5 % of its time on a docs web (py-spy, 20 hosts).
            return math.inf
        skipped: list[tuple[float, int, PageRow]] = []
        wake = math.inf
        try:
            while self._due and len(skipped) < EARLY_SCAN:
                entry = heapq.heappop(self._due)
                host = self._hosts[entry[2].host_id]
                held = host.leased or host.paused or bool(host.queue)
                if held or host.next_allowed > now:
                    if not held:  # free once its politeness delay has passed
                        wake = min(wake, host.next_allowed)
                    skipped.append(entry)
                    continue
                token = self.pacer.free_at() - trio.current_time()
                if token > 0:
                    skipped.append(entry)
                    return min(wake, now + token)
                host.queue.append(entry[2])
                if not host.active:
                    host.active = True
                    self._active += 1
                self._push_ready(host)
                self._early += 1
                return None
        finally:
            for entry in skipped:
                heapq.heappush(self._due, entry)
        return wake

    async def _park(self, wake: float) -> None:
        """Wait to be woken, and until ``wake`` (wall seconds) only when no other worker
        waits for an earlier time: one timed waiter, not every idle worker, wakes when a
        host's politeness delay or a page's due time passes."""
        if wake >= self._timer_at:
            await self._waiters.park()
            return
        self._timer_at = wake
        try:
            with trio.move_on_at(self._to_trio(wake)):
                await self._waiters.park()
        finally:
            if self._timer_at == wake:
                self._timer_at = math.inf

    def _forget_host(self, host: HostState) -> None:
        """Let ``host`` go (no page of it held), remembering until when it must be left alone."""
        self._hosts.pop(host.id, None)
        now = self._wall()
        if host.next_allowed > now:
            if len(self._departed) >= 10_000:
                self._departed = {i: t for i, t in self._departed.items() if t[0] > now}
            self._departed[host.id] = (host.next_allowed, host.delay, host.backoff)

    def _remember_release(self, page_id: int, next_due: float) -> None:
        """Keep ``next_due`` of a page released now for :data:`RELEASE_MEMORY` seconds, at
        most :data:`RELEASE_ENTRIES` of them, oldest forgotten first (O(1) per release)."""
        now = self._wall()
        memo = self._released
        memo.pop(page_id, None)
        memo[page_id] = (next_due, now)
        while memo and (
            len(memo) > RELEASE_ENTRIES or next(iter(memo.values()))[1] < now - RELEASE_MEMORY
        ):
            memo.popitem(last=False)

    def _forget(self, page: PageRow, host: HostState) -> None:
        """``page`` (out of every queue, its host leased) is held no more."""
        self._paged.discard(page.id)
        host.in_memory -= 1

    def _unlease(self, host: HostState) -> None:
        host.leased = False
        self._leased -= 1
        self._unleased.unpark_all()
        if host.queue:
            if not host.paused:
                self._push_ready(host)
        elif host.active:
            host.active = False
            self._active -= 1
        if host.in_memory == 0:
            self._forget_host(host)
        self._poke(everyone=False)

    def release(
        self,
        lease: Lease,
        *,
        next_due: float | None,
        timing: HostTiming | None = None,
        robots: HostRobots | None = None,
    ) -> None:
        """Give the host back with its new ``timing`` and ``robots`` (None: unchanged).

        ``next_due`` (unix seconds) keeps the page in memory when it falls inside the loaded
        window; otherwise, or when None, the page is dropped and the store brings it back.
        """
        page, host = lease.page, lease.host
        _apply(host, timing, robots)
        if next_due is not None and self._fresh is not None:
            self._fresh[page.id] = next_due
        if next_due is not None and self.work_conserving:
            # a reset or a reload may bring an older row of it before the record is committed
            self._remember_release(page.id, next_due)
        # While a rescan reads the store, the page stays whatever its due time: its row may
        # have been read already, as the page was in a worker's hands, and the swap keeps it.
        keep = self._fresh is not None or (next_due is not None and next_due <= self._cursor[0])
        if next_due is not None and keep and self.owns(host.name):
            heapq.heappush(self._due, (next_due, page.id, _with_due(page, next_due)))
        else:
            self._forget(page, host)
        self._unlease(host)

    def requeue(
        self, lease: Lease, *, timing: HostTiming | None = None, robots: HostRobots | None = None
    ) -> None:
        """Give the host back with the page at the head of its back queue, still held; with
        its new ``timing`` and ``robots`` as :meth:`release`."""
        _apply(lease.host, timing, robots)
        if self.owns(lease.host.name):
            _put_back(lease.host.queue, lease.page)
        else:
            self._forget(lease.page, lease.host)
        self._unlease(lease.host)

    def update_page(self, lease: Lease, **changes: Any) -> Lease:
        """A lease whose page carries new state (validators, digest) for its next fetch."""
        return Lease(_replace(lease.page, **changes), lease.host)

    def close(self) -> None:
        """Stop handing out work; :meth:`acquire` returns None from now on."""
        self._closed = True
        self._closed_event.set()
        self._poke()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the loader --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load due pages from the store ahead of time, until closed."""
        await self.load()
        self.last_pass = trio.current_time()
        task_status.started()
        while not self._closed:
            # At least every 5 s, so the watchdog can tell a stalled loader (last_pass).
            with trio.move_on_after(min(max(self.window / 4, 0.05), 5.0)):
                await self._load_now.wait()
            self._load_now = trio.Event()
            await self.load()
            self.last_pass = trio.current_time()

    async def load(self) -> int:
        """One loading pass; returns the number of pages taken.

        Pages due within the window, at most ``max_pages_in_memory``; work-conserving, then
        the pages due soonest after them until B × window pages are held, something to pull
        forward when too few are due."""
        now = self._wall()
        if self._rescan:
            taken = await self._swap(now + self.window)
            if self._cursor[0] < now + self.window:  # cut short: the rest of the window
                taken += await self._load(now + self.window, self.max_pages)
        else:
            taken = await self._load(now + self.window, self.max_pages)
        if self.work_conserving:
            ahead = min(self.max_pages, math.ceil(self.pacer.rate * self.window))
            if len(self._paged) < ahead and self._cursor[0] < now + LOOK_AHEAD:
                taken += await self._load(now + LOOK_AHEAD, ahead)
        return taken

    async def _load(self, until: float, cap: int) -> int:
        """Load the pages after the cursor due by ``until`` (unix s) while fewer than ``cap``
        are held, :data:`READ_CHUNK` rows a read; returns the number taken."""
        taken, epoch = 0, self._epoch
        while (room := min(cap - len(self._paged), READ_CHUNK)) > 0:
            pages, hosts = await self._source(self._cursor, until, room, self.known_hosts())
            if epoch != self._epoch:
                return taken  # reset while loading: the next pass starts over
            taken += self.add(pages, hosts)
            reached = (pages[-1].due_at, pages[-1].id) if len(pages) >= room else (until, 2**62)
            self._cursor = min(max(self._cursor, reached), self._overflow)
            self._overflow = (math.inf, 0)
            if len(pages) < room or self._cursor < reached:  # the end, or a row not taken
                break
        return taken

    async def _swap(self, until: float) -> int:
        """A rescan (:meth:`reset`): read the pages due by ``until`` (unix s) from the start,
        then, with no wait in between, drop the pages held but not in a worker's hands and
        take the rows read in their place; returns the number taken.

        The store is read :data:`READ_CHUNK` rows at a time. Of a page held when its row
        comes, only what a plan changes is kept (:class:`_Replanned`, 40 bytes), the rest of
        the row let go: the pages held already carry it, as new as the store's or newer (a
        record is queued for the store as its page is released with it). Rows of pages not
        held are kept whole, as many as there is room for beside the pages held (one chunk at
        least); past them the read ends there, the pages held it has not reached are let go,
        and :meth:`load` reads the rest of the window on at once. So the read holds the pages
        held and about two chunks of rows more, however much the plan moved.

        A page released while the store is read stays held and keeps its release's due
        time when later than its row's (the row may predate the fetch's record)."""
        self._rescan = False
        epoch, self._fresh = self._epoch, {}
        room = self.max_pages - self._leased_pages()
        if room <= 0:  # every page held is in a worker's hands: read once one comes back
            self._rescan = True
            return 0
        replanned, rows, hosts = _Replanned(), list[PageRow](), dict[int, HostRow]()
        after, reached = (-math.inf, -1), (until, 2**62)
        # rows of pages not held, at most: past them the read ends, the swap lets go of the
        # pages held it has not read yet, and the loader reads on from there at once
        spare = max(self.max_pages - len(self._paged), READ_CHUNK)
        try:
            while (want := min(room - len(replanned) - len(rows), READ_CHUNK)) > 0:
                if len(rows) >= spare:
                    break
                known = self.known_hosts() | hosts.keys()
                pages, found = await self._source(after, until, want, frozenset(known))
                if epoch != self._epoch:
                    break
                hosts.update(found)
                rows.extend(replanned.take(pages, self._paged))
                if len(pages) < want:
                    reached = (until, 2**62)
                    break
                after = reached = (pages[-1].due_at, pages[-1].id)
            fresh = self._fresh
        finally:
            self._fresh = None
        if epoch != self._epoch:  # retain() started over meanwhile: rescan on the next pass
            self._rescan = True
            return 0
        taken = self._take_replanned(replanned, fresh)
        rows.reverse()  # a page read twice (moved on between two reads): its later row wins
        taken += self.add([_due_no_earlier(p, fresh.get(p.id)) for p in rows], hosts)
        for host in list(self._hosts.values()):
            if host.in_memory == 0 and not host.leased:
                self._forget_host(host)
        self._cursor = min(reached, self._overflow)
        self._overflow = (math.inf, 0)
        self._poke()
        return taken

    def _leased_pages(self) -> int:
        """Pages held in workers' hands: neither waiting, in a front queue nor a back queue."""
        queued = len(self._due) + sum(map(len, self._front))
        return len(self._paged) - queued - sum(len(h.queue) for h in self._hosts.values())

    def _take_replanned(self, replanned: _Replanned, fresh: Mapping[int, float]) -> int:
        """The swap: every page held but not in a worker's hands waits for its due time anew
        with what the rescan read of it (``replanned``), or with its release's due time when
        released during the read (``fresh``, kept when later); the others are let go (the
        hosts stay known); returns how many took a row read."""
        idle = [e[2] for e in self._due]
        self._due = []
        for q in self._front:
            idle.extend(q)
            q.clear()
        for host in self._hosts.values():
            idle.extend(host.queue)
            host.queue.clear()
            if host.active and not host.leased:
                host.active = False
                self._active -= 1
        found = replanned.find(np.fromiter((p.id for p in idle), np.int64, len(idle)))
        taken = 0
        while idle:  # a chunk at a time from the end: each old row goes as its copy comes
            cut = max(len(idle) - READ_CHUNK, 0)
            block = idle[cut:]
            del idle[cut:]
            copies = replanned.copies(block, found[cut:])
            found = found[:cut]
            for page, copy in zip(block, copies, strict=True):
                if copy is not None:
                    page = self._not_before_release(copy)
                    taken += 1
                elif page.id not in fresh:
                    self._paged.discard(page.id)
                    self._hosts[page.host_id].in_memory -= 1
                    continue
                page = _due_no_earlier(page, fresh.get(page.id))
                self._due.append((page.due_at, page.id, page))
        heapq.heapify(self._due)
        self._ready = [e for e in self._ready if e[3].queue]
        heapq.heapify(self._ready)
        return taken

    def statistics(self) -> FrontierStatistics:
        now = self._wall()
        return FrontierStatistics(
            in_memory=len(self._paged),
            waiting=len(self._due),
            front=tuple(len(q) for q in self._front),
            back=sum(len(h.queue) for h in self._hosts.values()),
            active_hosts=self._active,
            ready_hosts=len(self._ready),
            leased=self._leased,
            hosts_known=len(self._hosts),
            dispatched=self._dispatched,
            early=self._early,
            lapsed=self.pacer.lapsed(),
            cursor=self._cursor[0],
            backing_off=sum(1 for h in self._hosts.values() if h.errors and h.next_allowed > now),
            paused=sum(1 for h in self._hosts.values() if h.paused),
        )


class _Replanned:
    """What a rescan read of pages the frontier holds: what a plan changes of each (its due
    time, target rate, λ̂ and weight), in arrays, 40 bytes a page."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray[Any, Any]] = []
        self._rows: np.ndarray[Any, Any] | None = None  # sorted by id, once read
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def take(self, pages: list[PageRow], held: Container[int]) -> list[PageRow]:
        """Keep the plan's fields of ``pages`` held; returns the others."""
        mine = [p for p in pages if p.id in held]
        if mine:
            chunk = np.empty(len(mine), dtype=_REPLANNED)
            chunk["id"] = [p.id for p in mine]
            chunk["due_at"] = [p.due_at for p in mine]
            chunk["target_rate"] = [_nan(p.target_rate) for p in mine]
            chunk["rate"] = [_nan(p.rate) for p in mine]
            chunk["weight"] = [p.weight for p in mine]
            self._chunks.append(chunk)
            self._count += len(mine)
        return [p for p in pages if p.id not in held] if mine else pages

    def find(self, ids: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """For each of ``ids``, the index of its row here (−1: none was read); the rows are
        fixed from here on."""
        rows = np.concatenate(self._chunks) if self._chunks else np.empty(0, dtype=_REPLANNED)
        self._chunks = []
        # a page moved on between two reads: its later row comes last, and is the one found
        rows.sort(order="id", kind="stable")
        self._rows = rows
        if not rows.size:
            return np.full(ids.size, -1, dtype=np.int64)
        at = np.searchsorted(rows["id"], ids, side="right") - 1
        hit = (at >= 0) & (rows["id"][np.maximum(at, 0)] == ids)
        return np.where(hit, at, -1).astype(np.int64)

    def copies(
        self, pages: list[PageRow], at: np.ndarray[Any, np.dtype[np.int64]]
    ) -> list[PageRow | None]:
        """``pages`` with the fields their rows (indices ``at`` from :meth:`find`) carry; None
        for a page whose row was not read."""
        assert self._rows is not None
        rows = self._rows[np.maximum(at, 0)] if self._rows.size else self._rows[:0]
        if not rows.size:
            return [None] * len(pages)
        fields = zip(
            at.tolist(),
            rows["due_at"].tolist(),
            rows["target_rate"].tolist(),
            rows["rate"].tolist(),
            rows["weight"].tolist(),
            strict=True,
        )
        return [
            _replanned(p, due, _none(target), _none(rate), weight) if i >= 0 else None
            for p, (i, due, target, rate, weight) in zip(pages, fields, strict=True)
        ]


def _replanned(
    page: PageRow, due_at: float, target_rate: float | None, rate: float | None, weight: float
) -> PageRow:
    """``page`` with a plan's fields: :func:`dataclasses.replace`, spelt out (four times as
    fast, for a rescan's every page; a test checks that every field is carried)."""
    return PageRow(
        id=page.id,
        url=page.url,
        host_id=page.host_id,
        host=page.host,
        due_at=due_at,
        etag=page.etag,
        last_modified=page.last_modified,
        digest=page.digest,
        target_rate=target_rate,
        depth=page.depth,
        fingerprint=page.fingerprint,
        rate=rate,
        weight=weight,
        source=page.source,
        tried=page.tried,
    )


_REPLANNED = np.dtype(
    [
        ("id", np.int64),
        ("due_at", np.float64),
        ("target_rate", np.float64),
        ("rate", np.float64),
        ("weight", np.float64),
    ]
)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _none(value: float) -> float | None:
    return None if math.isnan(value) else value


def _lane(queue: deque[PageRow]) -> int:
    """How many urgent pages (:data:`URGENT_SOURCES`) lead ``queue``: its urgent lane."""
    n = 0
    for page in queue:
        if page.source not in URGENT_SOURCES:
            break
        n += 1
    return n


def _enqueue(queue: deque[PageRow], page: PageRow) -> None:
    """Queue ``page`` last; an urgent page first, in the urgent lane at the head (a sitemap
    comes before the host's other due pages). O(1): first in the lane, not last, since a
    deque inserts in the middle in time linear in the distance from its ends (a sitemap
    index's thousands of sitemaps coming due at once, each put last of the lane, would
    cost the square of their number)."""
    if page.source in URGENT_SOURCES:
        queue.appendleft(page)
    else:
        queue.append(page)


def _put_back(queue: deque[PageRow], page: PageRow) -> None:
    """Put ``page``, just taken from the head of ``queue``, back first, but behind the urgent
    lane when it is not urgent itself: a sitemap that came due meanwhile (found in the
    robots.txt just fetched for it) goes first. Linear in the lane's length, once per page
    given back (robots.txt fetched first: once per host and expiry)."""
    if page.source in URGENT_SOURCES or not queue or queue[0].source not in URGENT_SOURCES:
        queue.appendleft(page)
    else:
        queue.insert(_lane(queue), page)


def _apply(host: HostState, timing: HostTiming | None, robots: HostRobots | None) -> None:
    if timing is not None:
        host.next_allowed, host.delay = timing.next_allowed, timing.delay
        host.backoff, host.errors = timing.backoff, timing.errors
    if robots is not None:
        host.robots, host.robots_agent = robots.rules, robots.agent
        host.robots_status, host.robots_body = robots.status, robots.body
        host.robots_expires_at = robots.expires_at


def _replace(page: PageRow, **changes: Any) -> PageRow:
    return dataclasses.replace(page, **changes)


def _with_due(page: PageRow, due: float) -> PageRow:
    return dataclasses.replace(page, due_at=due)


def _due_no_earlier(page: PageRow, due: float | None) -> PageRow:
    """``page`` due no earlier than ``due`` (unix s; None: as it is): a release's due time
    wins over an older row of the page read meanwhile."""
    return page if due is None or due <= page.due_at else _with_due(page, due)
