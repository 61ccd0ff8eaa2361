"""Membership: a node's heartbeat and its partition leases, without an operator.

:class:`Membership` is a trio service. Every heartbeat (``lease_ttl / 3``) it writes the node's
row and renews the leases it holds in one transaction, reads which nodes are live and who holds
what, and takes one step of the assignment rule (:func:`refresher.fleet._assignment.plan_step`):
claim its share of free or expired partitions, or shed surplus partitions a few at a time when
a node joins. Each change of the held set, ``{partition: epoch}``, goes to ``publish`` (the
daemon hands it to the store, which fences every write by those epochs, and to the frontier,
which serves only those partitions' hosts).

Self-fencing: a lease granted or renewed by a statement sent at monotonic time t is fetched
only until ``t + ttl − margin`` (:class:`refresher.fleet._assignment.LeaseTiming`); a partition
whose renewal has not come back by then is dropped from the held set at once, so the node has
stopped fetching its hosts before the database can give it to another node. When PostgreSQL is
unreachable the heartbeat keeps retrying with backoff; every partition runs out of margin and
is dropped, and once the database answers again the node claims its share anew (its pages
resume from the stored state).

Shedding and stopping (:meth:`Membership.stop`): the partitions leave the held set first (no
new fetch starts), then ``drain`` waits until the fetches in flight to their hosts have finished
and been queued, and the store's release commits those queued writes before it frees the
leases: the next owner resumes from state that includes them.

A node whose clock is further than ``lease_ttl / 4`` from the database's is refused: at start
with an error, later by stepping out of the fleet (held set empty, marked stopping) until the
clocks agree again; both are logged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import trio

from refresher._errors import StoreError
from refresher.fleet._assignment import LeaseTiming, plan_step, share
from refresher.fleet._partition import partition_of
from refresher.ops._logging import get_logger

__all__ = [
    "ClockSkewError",
    "FleetView",
    "LeaseStore",
    "Membership",
    "MembershipStatistics",
    "owns_hosts",
]

log = get_logger("fleet")


class ClockSkewError(StoreError):
    """This node's clock is too far from the fleet database's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """What one heartbeat reads back, in the same transaction as it wrote."""

    db_now: float  # the database's clock, unix seconds
    live: frozenset[str]  # nodes with a heartbeat younger than the ttl, not stopping
    owners: Mapping[int, str]  # partition → holder, for unexpired leases only
    held: Mapping[int, int]  # this node's leases renewed now: partition → epoch


class LeaseStore(Protocol):
    """The fleet database's lease operations a node needs (implemented in ``refresher/store``)."""

    async def heartbeat(
        self,
        node_id: str,
        *,
        clock: float,
        ttl: float,
        held: Mapping[int, int],
        stopping: bool,
        statistics: Mapping[str, Any],
    ) -> FleetView:
        """Write the node's row (heartbeat at the database's now, ``clock`` the node's own),
        renew the leases in ``held`` still granted to it at those epochs until now + ``ttl``,
        and read the fleet; one transaction. Raises StoreError when the database fails."""
        ...

    async def claim(
        self, node_id: str, *, count: int, ttl: float, held: frozenset[int]
    ) -> dict[int, int]:
        """Take up to ``count`` partitions that are free, expired, or this node's but not in
        ``held`` (each epoch + 1, expiring at now + ``ttl``; skipping rows another node is
        claiming); the ones granted, with their epochs."""
        ...

    async def release(self, node_id: str, partitions: Mapping[int, int]) -> None:
        """Commit the writes queued so far, then free those of ``partitions`` still granted to
        this node at those epochs."""
        ...

    async def leave(self, node_id: str) -> None:
        """Mark the node stopping: it no longer counts among the live nodes."""
        ...


def owns_hosts(held: Collection[int], partitions: int) -> Callable[[str], bool]:
    """A predicate over host keys: the host's partition is in ``held``."""
    owned = frozenset(held)
    return lambda host: partition_of(host, partitions) in owned


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

    ``publish(held)`` is called (in the trio thread) with the held set ``{partition: epoch}``
    whenever it changes; ``drain(partitions)`` must return once no fetch of those partitions'
    hosts is in flight and their results are queued to the store."""

    def __init__(
        self,
        *,
        leases: LeaseStore,
        node_id: str,
        partitions: int,
        timing: LeaseTiming,
        publish: Callable[[Mapping[int, int]], None],
        drain: Callable[[frozenset[int]], Awaitable[None]],
        statistics: Callable[[], Mapping[str, Any]] = dict,
        wall_clock: Callable[[], float] = time.time,
        max_backoff: float | None = None,
    ) -> None:
        self._leases = leases
        self.node_id = node_id
        self.partitions = partitions
        self.timing = timing
        self._publish = publish
        self._drain = drain
        self._node_statistics = statistics
        self._wall = wall_clock
        self._max_backoff = max_backoff if max_backoff is not None else max(timing.ttl, 1.0)
        self._held: dict[int, int] = {}  # partition → epoch
        self._stop_at: dict[int, float] = {}  # partition → trio time its fetching stops
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

    # -- the held set ------------------------------------------------------------------------

    @property
    def held(self) -> Mapping[int, int]:
        """The partitions this node fetches now, with their epochs."""
        return dict(self._held)

    def _set(self, held: dict[int, int], stop_at: dict[int, float]) -> None:
        changed = held != self._held
        self._held, self._stop_at = held, stop_at
        self._deadline_changed.set()
        if changed:
            self._publish(dict(held))

    def _drop(self, partitions: Collection[int]) -> None:
        gone = set(partitions)
        if gone & self._held.keys():
            self._set(
                {p: e for p, e in self._held.items() if p not in gone},
                {p: t for p, t in self._stop_at.items() if p not in gone},
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
            await trio.sleep(backoff or self.timing.heartbeat)
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
            await self._beat_locked(first=first)

    async def _beat_locked(self, *, first: bool) -> None:
        if self._stopping:
            return
        sent, wall_sent = trio.current_time(), self._wall()
        wait = max(self.timing.heartbeat, 0.1)
        try:
            with trio.fail_after(wait):
                view = await self._leases.heartbeat(
                    self.node_id,
                    clock=wall_sent,
                    ttl=self.timing.ttl,
                    held=dict(self._held),
                    stopping=self._refused,
                    statistics=self._statistics_row(),
                )
        except trio.TooSlowError as e:
            raise StoreError(
                f"the fleet database did not answer a heartbeat within {wait:.3g} s"
            ) from e
        wall_back = self._wall()
        self._c.heartbeats += 1
        self._reachable = True
        skew = view.db_now - (wall_sent + wall_back) / 2
        self._skew = skew
        if abs(skew) > self.timing.max_skew + (wall_back - wall_sent) / 2:
            message = (
                f"this node's clock is {skew:+.3f} s off the fleet database's; more than "
                f"{self.timing.max_skew:g} s (fleet.lease_ttl / 4) is refused: synchronise it "
                "(NTP)"
            )
            if first:
                raise ClockSkewError(message)
            if not self._refused:
                log.error("clock too far off; stepping out of the fleet", skew=round(skew, 3))
                self._refused = True
                await self._hand_back(frozenset(self._held))
            return
        if self._refused:
            log.info("clock agrees again; rejoining the fleet", skew=round(skew, 3))
            self._refused = False
        self._renewed(view, sent)
        self._c.live = view.live
        self._share = share(self.partitions, view.live | {self.node_id}, self.node_id)
        if self._shedding:
            return
        # Leases still ours in the table but no longer fetched (self-fenced while the
        # database was away) count as free: the claim takes them back with a new epoch.
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
            sent = trio.current_time()
            granted = await self._leases.claim(
                self.node_id, count=step.claim, ttl=self.timing.ttl, held=frozenset(self._held)
            )
            if granted:
                self._c.claimed += len(granted)
                stop = self.timing.stop_at(sent)
                self._set(
                    {**self._held, **granted},
                    {**self._stop_at, **dict.fromkeys(granted, stop)},
                )
                log.info("partitions claimed", partitions=len(granted), held=len(self._held))
        elif step.shed and self._nursery is not None:
            self._shedding = True
            self._nursery.start_soon(self._shed, frozenset(step.shed))

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
        self._set(kept, dict.fromkeys(kept, stop))

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
        epochs = {p: e for p, e in self._held.items() if p in partitions}
        if not epochs:
            return 0
        self._drop(epochs)
        await self._drain(frozenset(epochs))
        try:
            with trio.fail_after(self.timing.ttl):
                await self._leases.release(self.node_id, epochs)
        except trio.TooSlowError as e:
            raise StoreError("the fleet database did not answer the release in time") from e
        return len(epochs)

    async def stop(self) -> None:
        """Leave the fleet at once: stop fetching, let the in-flight fetches finish and commit,
        free every lease, and mark the node stopping. For a clean shutdown (SIGTERM)."""
        try:
            with trio.CancelScope(shield=True):
                async with self._lock:  # no heartbeat or claim in progress from here on
                    self._stopping = True
                    count = await self._hand_back(frozenset(self._held))
                    await self._leases.leave(self.node_id)
            log.info("left the fleet; partitions handed back", partitions=count)
        except StoreError as e:
            log.warning("leaving the fleet failed; the leases expire on their own", error=str(e))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- statistics --------------------------------------------------------------------------

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


def _plain(stats: MembershipStatistics) -> dict[str, Any]:
    return asdict(stats)
