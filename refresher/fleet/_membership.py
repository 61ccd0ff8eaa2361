"""Membership: a node's heartbeat and its partition leases, without an operator.

:class:`Membership` is a trio service. Every heartbeat (``lease_ttl / 3``) it writes the node's
row and renews the leases it holds (one thread hop), reads which nodes are live and who holds
what, and takes one step of the assignment rule (:func:`refresher.fleet._assignment.plan_step`):
claim its share of free or expired partitions, or shed surplus partitions a few at a time when
a node joins. Each change of the held set, ``{partition: epoch}``, goes to ``fence`` (the
store, which accepts a write only for a partition still held at that epoch) and then to
``serve`` (the frontier, which fetches only those partitions' hosts).

Self-fencing: a lease granted or renewed by a statement sent at monotonic time t is fetched
only until ``t + ttl − margin`` (:class:`refresher.fleet._assignment.LeaseTiming`); a partition
whose renewal has not come back by then is dropped from the held set at once, so the node has
stopped fetching its hosts before the database can give it to another node. When PostgreSQL is
unreachable the heartbeat keeps retrying with backoff; every partition runs out of margin and
is dropped, and once the database answers again the node claims its share anew (its pages
resume from the stored state).

Shedding and stopping (:meth:`Membership.stop`): the partitions leave the held set first (no
new fetch starts), then ``drain`` waits until the fetches in flight to their hosts have finished
(those still on the wire when the lease's margin runs out are cut) and their batch has
committed, and only then are the leases freed: the next owner resumes from state that includes
them. A lease lost or run out of margin is drained the same way, in the background, its
requests on the wire cut at once; the store keeps accepting its writes meanwhile, and the
database refuses them once another node holds it (the epoch moved).

A node whose clock is further than ``lease_ttl / 4`` from the database's is refused: at start
with an error, later by stepping out of the fleet (held set empty, marked stopping) until the
clocks agree again; both are logged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import trio

from refresher._errors import StoreError
from refresher.fleet._assignment import LeaseTiming, plan_step, share
from refresher.fleet._partition import partition_of
from refresher.ops._logging import get_logger
from refresher.store._pg_leases import ClockSkewError, HoldOff, LeaseStore

__all__ = [
    "ClockSkewError",
    "FleetView",
    "Membership",
    "MembershipStatistics",
    "exchange",
    "owns_hosts",
]

log = get_logger("fleet")

#: seconds a joining node waits for its first heartbeat and claim. It holds no lease yet, so
#: no margin needs the tight deadline of the later heartbeats (``lease_ttl / 3``): a database
#: slow to answer a node's first statements (a loaded machine, a cold connection) delays the
#: start instead of failing it; one that does not answer in this long fails it.
JOIN_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """What one heartbeat wrote and read back."""

    db_now: float  # the database's clock at the heartbeat, unix seconds
    live: frozenset[str]  # nodes with a heartbeat younger than the ttl, not stopping
    owners: Mapping[int, str]  # partition → holder, for unexpired leases only
    held: Mapping[int, int]  # this node's leases renewed now: partition → epoch
    skew: float = 0.0  # seconds, the database's clock minus ours (± half the round trip)
    released: int = 0  # leases of a claim this node gave up on, freed now


def exchange(
    leases: LeaseStore,
    node_id: str,
    *,
    clock: Callable[[], float],
    ttl: float,
    max_skew: float,
    held: Mapping[int, int],
    stopping: bool,
    statistics: Mapping[str, Any],
    abandoned: float | None = None,
    known: Mapping[int, int] | None = None,
) -> FleetView:
    """One heartbeat (synchronous, for a worker thread): write the node's row, check the
    clocks, renew ``held``, read the nodes and the leases. Raises ClockSkewError (after the
    heartbeat, which then marks the node stopping) when the clocks disagree.

    ``abandoned``: the database's time just before a claim this node gave up waiting for (it
    may have been granted all the same). Leases of this node that it does not hold, at an
    epoch it never held (``known``: the last epoch it held of each partition), granted at or
    after that time, are that claim's: nobody fetches them, so they are freed now (and claimed
    again at once, at a new epoch) rather than left idle until they expire.

    The database stamps the heartbeat with its clock somewhere between the node's clock
    readings before and after the statement: only a stamp outside that interval widened by
    ``max_skew`` is a skew (a slow round trip is not)."""
    before = clock()
    leases.heartbeat(node_id, statistics, before, stopping=stopping)
    after = clock()
    nodes = leases.nodes(after)
    me = next((n for n in nodes if n.node_id == node_id), None)
    db_now = me.heartbeat_at if me is not None else before
    if not before - max_skew <= db_now <= after + max_skew:
        if not stopping:  # out of the live set at once: the others must not wait for it
            leases.heartbeat(node_id, statistics, clock(), stopping=True)
        off = before - db_now if db_now < before else after - db_now
        raise ClockSkewError(
            f"this node's clock is {off:+.3f} s off the fleet database's; more than "
            f"{max_skew:g} s (fleet.lease_ttl / 4) is refused: synchronise it (NTP)"
        )
    # Lease times are on the database's clock: ours, corrected by the skew just measured.
    skew = db_now - (before + after) / 2
    renewed = leases.renew(node_id, held, ttl, clock() + skew) if held and not stopping else {}
    live = frozenset(n.node_id for n in nodes if not n.stopping and n.heartbeat_at > db_now - ttl)
    if stopping:
        live -= {node_id}
    rows = [r for r in leases.partitions() if r.owner is not None and r.expires_at > db_now]
    stray = []
    if abandoned is not None and not stopping:
        stray = [
            r.partition
            for r in rows
            if r.owner == node_id
            and r.partition not in renewed
            and (known or {}).get(r.partition) != r.epoch
            and r.expires_at >= abandoned + ttl
        ]
        leases.release(node_id, stray)
    owners = {r.partition: r.owner for r in rows if r.owner and r.partition not in stray}
    return FleetView(
        db_now=db_now, live=live, owners=owners, held=renewed, skew=skew, released=len(stray)
    )


def owns_hosts(
    held: Collection[int],
    partitions: int,
    *,
    fetching: Callable[[int], bool] | None = None,
) -> Callable[[str], bool]:
    """A predicate over host keys: the host's partition is in ``held`` (and, given
    ``fetching``, its lease still lets this node start a request now)."""
    owned = frozenset(held)
    known: dict[str, int] = {}  # the frontier asks once per page loaded: hash a host once

    def owns(host: str) -> bool:
        partition = known.get(host)
        if partition is None:
            if len(known) >= 100_000:
                known.clear()
            partition = known[host] = partition_of(host, partitions)
        return partition in owned and (fetching is None or fetching(partition))

    return owns


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipStatistics:
    node_id: str
    owned: int  # partitions held and fetched now
    share: int  # partitions this node should hold
    live_nodes: int
    heartbeats: int
    renewals: int  # leases renewed
    claimed: int  # leases granted to this node
    shed: int  # partitions handed back to let another node have its share
    lost: int  # leases found taken by another node (fenced)
    self_fenced: int  # partitions dropped because their renewal did not come back in time
    heartbeat_failures: int
    reachable: bool  # the last heartbeat succeeded
    clock_skew: float | None  # seconds, the database's clock minus ours
    refused: bool  # stepped out of the fleet: the clock is too far off


@dataclass(slots=True)
class _Counters:
    heartbeats: int = 0
    renewals: int = 0
    claimed: int = 0
    shed: int = 0
    lost: int = 0
    self_fenced: int = 0
    failures: int = 0
    live: frozenset[str] = field(default_factory=frozenset)


class Membership:
    """A node's membership in the fleet; see the module docstring.

    ``serve(held)`` is called (in the trio thread) with the held set ``{partition: epoch}``
    whenever it changes: only those partitions' hosts may be fetched. ``fence(leases)`` gets
    the leases whose writes the store may commit: the held set, and leases given up while
    fetches to their hosts may still be in flight. ``drain(partitions, until)`` must return once no
    fetch of those partitions' hosts is in flight and their results are committed, cutting the
    requests still on the wire at ``until`` (trio time: the earliest stop of those leases)."""

    def __init__(
        self,
        *,
        leases: LeaseStore,
        node_id: str,
        partitions: int,
        timing: LeaseTiming,
        serve: Callable[[Mapping[int, int]], None],
        fence: Callable[[Mapping[int, int]], None],
        drain: Callable[[frozenset[int], float], Awaitable[None]],
        statistics: Callable[[], Mapping[str, Any]] = dict,
        wall_clock: Callable[[], float] = time.time,
        max_backoff: float | None = None,
        run_sync: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
        min_delay: float = 0.0,
        max_delay: float = math.inf,
    ) -> None:
        self._leases = leases
        # seconds: a host's delay when none is stored, and the longest one stored
        self._delays = (min_delay, max_delay)
        self.node_id = node_id
        self.partitions = partitions
        self.timing = timing
        self._serve = serve
        self._fence = fence
        self._draining: dict[int, int] = {}  # given up, fetches in flight may still commit
        self._drain = drain
        self._node_statistics = statistics
        self._wall = wall_clock
        self._max_backoff = max_backoff if max_backoff is not None else max(timing.ttl, 1.0)
        self._held: dict[int, int] = {}  # partition → epoch
        self._stop_at: dict[int, float] = {}  # partition → trio time its fetching stops
        self._known: dict[int, int] = {}  # partition → the last epoch this node held of it
        #: the database's time before a claim given up on (PostgreSQL may have granted it)
        self._abandoned: float | None = None
        self._shedding = False
        self._stopping = False
        self._refused = False
        self._reachable = False
        self._skew: float | None = None
        self._share = 0
        self._c = _Counters()
        self._deadline_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()
        self._last_sent = -math.inf
        self._run_sync = run_sync or _in_thread

    # -- the held set ------------------------------------------------------------------------

    @property
    def held(self) -> Mapping[int, int]:
        """The partitions this node fetches now, with their epochs."""
        return dict(self._held)

    def fetching(self, partition: int) -> bool:
        """Whether a request to ``partition``'s hosts may start now: its lease's stop (trio
        time) has not passed. The held set changes only when the self-fencing task runs; a
        process resumed after a pause (SIGSTOP, a VM frozen) may dispatch before it does,
        to a partition another node has taken meanwhile."""
        return self._stop_at.get(partition, -math.inf) > trio.current_time()

    def _set(
        self,
        held: dict[int, int],
        stop_at: dict[int, float],
        *,
        settle: bool = True,
        cut_now: bool = False,
    ) -> dict[int, int]:
        """Make ``held`` the held set; returns the leases given up, {partition: epoch}.

        The store hears first (its reads must cover a partition before the frontier loads
        it), and keeps accepting the writes of given-up leases until their in-flight fetches
        are drained (:meth:`_settle`, started here unless ``settle`` is False): the database
        still refuses any whose epoch moved on."""
        old, old_stop = self._held, self._stop_at
        self._held, self._stop_at = held, stop_at
        self._known.update(held)
        self._deadline_changed.set()
        if held == old:
            return {}
        gone = {p: e for p, e in old.items() if held.get(p) != e}
        # requests on the wire are cut at the earliest stop (at once for a lost lease)
        until = (
            -math.inf
            if cut_now
            else min((old_stop.get(p, -math.inf) for p in gone), default=-math.inf)
        )
        self._draining.update(gone)
        self._fence({**self._draining, **held})
        self._serve(dict(held))
        if gone and settle and self._nursery is not None:
            self._nursery.start_soon(self._settle, gone, until)
        return gone

    async def _settle(self, gone: Mapping[int, int], until: float) -> None:
        """Wait until the fetches in flight to ``gone``'s hosts are queued and committed (those
        on the wire at ``until``, trio time, cut), then stop accepting their writes."""
        try:
            await self._drain(frozenset(gone), until)
        except StoreError as error:
            # Their writes stay accepted until then; the database still fences them.
            log.warning("draining given-up partitions failed", error=str(error))
            return
        for p, epoch in gone.items():
            if self._draining.get(p) == epoch:
                del self._draining[p]
        self._fence({**self._draining, **self._held})

    def _drop(self, partitions: Collection[int], *, settle: bool = True) -> dict[int, int]:
        gone = set(partitions)
        return self._set(
            {p: e for p, e in self._held.items() if p not in gone},
            {p: t for p, t in self._stop_at.items() if p not in gone},
            settle=settle,
        )

    # -- the service -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join the fleet (the first heartbeat must succeed, with the clocks agreeing), then
        beat until cancelled or :meth:`stop`."""
        self.timing.check()
        await self._beat(first=True)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._self_fence)
            task_status.started()
            await self._beat_forever()

    async def _beat_forever(self) -> None:
        backoff = 0.0
        while not self._stopping:
            # Every heartbeat from the last one's start: a slow round trip must not delay the
            # next renewal and eat the margin.
            if backoff:
                await trio.sleep(backoff)
            else:
                await trio.sleep_until(self._last_sent + self.timing.heartbeat)
            if self._stopping:
                return
            try:
                await self._beat(first=False)
                backoff = 0.0
            except StoreError as e:
                self._c.failures += 1
                self._reachable = False
                backoff = min(self._max_backoff, max(backoff * 2, self.timing.heartbeat / 2))
                log.warning(
                    "fleet heartbeat failed; retrying",
                    error=str(e),
                    retry_in=round(backoff, 3),
                    held=len(self._held),
                )

    async def _self_fence(self) -> None:
        """Drop each partition when its margin runs out without a renewal."""
        while True:
            self._deadline_changed = trio.Event()
            now = trio.current_time()
            late = [p for p, t in self._stop_at.items() if t <= now]
            if late:
                self._c.self_fenced += len(late)
                log.warning(
                    "lease renewal late; stopped fetching its partitions",
                    partitions=len(late),
                    held=len(self._held) - len(late),
                )
                self._drop(late)
                continue
            with trio.move_on_at(min(self._stop_at.values(), default=math.inf)):
                await self._deadline_changed.wait()

    async def _beat(self, *, first: bool) -> None:
        async with self._lock:
            try:
                await self._beat_locked(first=first)
            except trio.TooSlowError as e:  # a claim the database did not answer in time
                raise StoreError("the fleet database did not answer a claim in time") from e

    async def _beat_locked(self, *, first: bool) -> None:
        if self._stopping:
            return
        sent = self._last_sent = trio.current_time()
        wait = JOIN_TIMEOUT if first else max(self.timing.heartbeat, 0.1)
        view = await self._exchange(wait, first=first)
        if view is None:
            return
        self._skew = view.skew
        if view.released:
            log.info(
                "leases of a claim given up on freed to be claimed again",
                partitions=view.released,
            )
        if self._abandoned is not None and view.db_now > self._abandoned + self.timing.ttl:
            self._abandoned = None  # whatever that claim was granted has expired by now
        if self._refused:
            log.info("clock agrees again; rejoining the fleet", skew=round(self._skew, 3))
            self._refused = False
            return
        self._renewed(view, sent)
        self._c.live = view.live
        self._share = share(self.partitions, view.live | {self.node_id}, self.node_id)
        if self._shedding:
            return
        # Leases still ours in the table but no longer fetched (self-fenced while the
        # database was away) count as free: claimed again once expired, with a new epoch.
        owners: dict[int, str | None] = {
            p: (None if o == self.node_id and p not in self._held else o)
            for p, o in view.owners.items()
        }
        step = plan_step(
            partitions=self.partitions,
            node=self.node_id,
            live=view.live | {self.node_id},
            owners=owners,
        )
        if step.claim:
            await self._claim(step.claim, skew=view.skew, wait=wait, first=first)
        elif step.shed and self._nursery is not None:
            self._shedding = True
            self._nursery.start_soon(self._shed, frozenset(step.shed))

    async def _exchange(self, wait: float, *, first: bool) -> FleetView | None:
        """One heartbeat's exchange with the fleet database, waiting ``wait`` seconds at most;
        None when this node's clock is too far off to take part (it steps out)."""
        call = partial(
            exchange,
            self._leases,
            self.node_id,
            clock=self._wall,
            ttl=self.timing.ttl,
            max_skew=self.timing.max_skew,
            held=dict(self._held),
            stopping=self._refused,
            statistics=self._statistics_row(),
            abandoned=self._abandoned,
            known=dict(self._known),
        )
        skewed: ClockSkewError | None = None
        try:
            with trio.fail_after(wait):
                view: FleetView = await self._run_sync(call)
        except trio.TooSlowError as e:
            raise StoreError(
                f"the fleet database did not answer a heartbeat within {wait:.3g} s"
            ) from e
        except ClockSkewError as e:
            skewed = e
        # answered: with a view, or with the clocks found too far apart
        self._c.heartbeats += 1
        self._reachable = True
        if skewed is None:
            return view
        if first:
            raise skewed
        if not self._refused:
            log.error("clock too far off; stepping out of the fleet", error=str(skewed))
            self._refused = True
            await self._hand_back(frozenset(self._held))
        return None

    async def _claim(self, count: int, *, skew: float, wait: float, first: bool) -> None:
        """Claim ``count`` free partitions (the database's clock is ours plus ``skew``
        seconds), waiting ``wait`` seconds for the answer."""
        sent = trio.current_time()
        leases, node, ttl = self._leases, self.node_id, self.timing.ttl
        wall = self._wall
        # A lease that expired had a holder that may have died with its hosts' timing:
        # it contacted them until its stop plus the cut of its requests at the latest,
        # one heartbeat before the expiry; each host waits its delay from there.
        shortest, longest = self._delays
        hold_off = HoldOff(lapse=self.timing.heartbeat, min_delay=shortest, max_delay=longest)

        def claim() -> dict[int, int]:
            return leases.claim_free(node, count, ttl, wall() + skew, hold_off)

        asked = wall() + skew
        try:
            with trio.fail_after(wait):
                granted: dict[int, int] = await self._run_sync(claim)
        except trio.TooSlowError:
            # The database may grant it all the same: the next heartbeat frees what it
            # did. The renewals went through: the next heartbeat keeps its time (a retry
            # after a backoff could come after the held leases' margin ran out).
            self._abandoned = asked if self._abandoned is None else self._abandoned
            if first:
                raise
            self._c.failures += 1
            log.warning(
                "the fleet database did not answer a claim in time; claiming again at the "
                "next heartbeat",
                waited=wait,
            )
            return
        if granted:
            self._c.claimed += len(granted)
            stop = self.timing.stop_at(sent)
            self._set(
                {**self._held, **granted},
                {**self._stop_at, **dict.fromkeys(granted, stop)},
            )

    def _renewed(self, view: FleetView, sent: float) -> None:
        """Keep the leases the heartbeat renewed (at their epochs), until their new stop."""
        stop = self.timing.stop_at(sent)
        kept: dict[int, int] = {}
        lost = 0
        for p, epoch in self._held.items():
            if view.held.get(p) == epoch:
                kept[p] = epoch
            else:
                lost += 1
        if lost:
            self._c.lost += lost
            log.warning("leases lost to another node; stopped fetching them", partitions=lost)
        self._c.renewals += len(kept)
        self._set(kept, dict.fromkeys(kept, stop), cut_now=lost > 0)

    async def _shed(self, partitions: frozenset[int]) -> None:
        try:
            count = await self._hand_back(partitions)
            self._c.shed += count
            if count:
                log.info("partitions shed", partitions=count, held=len(self._held))
        except StoreError as e:
            # The leases expire on their own; nothing is fetched from them meanwhile.
            log.warning("releasing shed partitions failed", error=str(e))
        finally:
            self._shedding = False

    async def _hand_back(self, partitions: frozenset[int]) -> int:
        """Stop fetching ``partitions``, let their in-flight fetches finish and commit, then
        free their leases; returns how many were handed back."""
        until = min((self._stop_at.get(p, -math.inf) for p in partitions), default=-math.inf)
        epochs = self._drop(partitions, settle=False)
        if not epochs:
            return 0
        await self._settle(epochs, until)
        try:
            with trio.fail_after(self.timing.ttl):
                release = partial(self._leases.release, self.node_id, list(epochs))
                await self._run_sync(release)
        except trio.TooSlowError as e:
            raise StoreError("the fleet database did not answer the release in time") from e
        return len(epochs)

    async def stop(self) -> None:
        """Leave the fleet at once: stop fetching, let the in-flight fetches finish and commit,
        free every lease, and mark the node stopping. For a clean shutdown (SIGTERM)."""
        try:
            # Bounded: with the database away the leases expire on their own.
            with trio.CancelScope(shield=True), trio.fail_after(2 * self.timing.ttl):
                async with self._lock:  # no heartbeat or claim in progress from here on
                    self._stopping = True
                    count = await self._hand_back(frozenset(self._held))
                    leave = partial(
                        self._leases.heartbeat,
                        self.node_id,
                        self._statistics_row(),
                        self._wall(),
                        stopping=True,
                    )
                    with trio.fail_after(self.timing.ttl):
                        await self._run_sync(leave)
            log.info("left the fleet; partitions handed back", partitions=count)
        except (StoreError, trio.TooSlowError) as e:
            log.warning(
                "leaving the fleet failed; the leases expire on their own", error=str(e) or "slow"
            )
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- statistics --------------------------------------------------------------------------

    def set_delays(self, *, min_delay: float, max_delay: float) -> None:
        """The politeness delays (seconds) a claim of an expired lease holds hosts off by:
        live, from ``politeness.min_delay`` and ``max_delay`` at a reload."""
        self._delays = (min_delay, max_delay)

    def _statistics_row(self) -> dict[str, Any]:
        return {"membership": _plain(self.statistics()), **self._node_statistics()}

    def statistics(self) -> MembershipStatistics:
        c = self._c
        return MembershipStatistics(
            node_id=self.node_id,
            owned=len(self._held),
            share=self._share,
            live_nodes=len(c.live),
            heartbeats=c.heartbeats,
            renewals=c.renewals,
            claimed=c.claimed,
            shed=c.shed,
            lost=c.lost,
            self_fenced=c.self_fenced,
            heartbeat_failures=c.failures,
            reachable=self._reachable,
            clock_skew=self._skew,
            refused=self._refused,
        )


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a worker thread, given up on (left to finish alone) when cancelled: a
    database that hangs must not hold the heartbeat's deadline."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def _plain(stats: MembershipStatistics) -> dict[str, Any]:
    return asdict(stats)
