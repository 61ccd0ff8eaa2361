"""The daemon's fleet part: membership wired to the store and the frontier, and the inbox.

:class:`FleetNode` opens its own lease connection (:class:`refresher.store._pg_leases.PgLeases`),
runs :class:`refresher.fleet._membership.Membership` and hands its held set to the store
(``set_owned``: the epochs every batch is fenced by) and to the frontier (``retain``: only the
held partitions' hosts are fetched). Giving a partition up waits for the fetches in flight to
its hosts (:meth:`refresher.crawl.Frontier.wait_released`) and commits their batch before the
lease goes. It also drains the node's inbox: pages other nodes discovered for its partitions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from refresher._config import Config
from refresher._errors import StoreError
from refresher.crawl._frontier import Frontier
from refresher.fleet._assignment import CUT_ALLOWANCE, LeaseTiming
from refresher.fleet._membership import Membership, MembershipStatistics, owns_hosts
from refresher.ops._logging import get_logger
from refresher.store._interface import HostRow, PageRow

__all__ = ["FleetNode", "FleetNodeStatistics"]

log = get_logger("fleet")

#: inbox rows taken per transaction
INBOX_BATCH = 1000


class FleetStore(Protocol):
    """What the fleet part asks of :class:`refresher.store.PostgresStore`."""

    def set_owned(self, owned: dict[int, int]) -> None: ...

    async def flush(self) -> None: ...

    async def drain_inbox(
        self, limit: int = ..., *, now: float | None = ...
    ) -> tuple[list[PageRow], dict[int, HostRow], int]: ...

    def fencing(self) -> Any: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetNodeStatistics:
    owned: int  # partitions held and fetched now
    share: int  # partitions this node should hold
    live_nodes: int
    heartbeats: int
    renewals: int
    claimed: int
    shed: int
    lost: int
    self_fenced: int
    heartbeat_failures: int
    reachable: bool
    refused: bool
    clock_skew: float | None
    fenced_records: int  # fetch records the database refused (their partition moved on)
    fenced_hosts: int
    inbox_sent: int  # discovered pages sent to other partitions' inboxes
    inbox_drained: int  # inbox rows taken from this node's partitions


class FleetNode:
    """See the module docstring. ``rate()`` is the node's fetch rate (reported in its
    heartbeat); ``pages_added(n)`` is told of pages the inbox brought in."""

    def __init__(
        self,
        config: Config,
        *,
        store: FleetStore,
        frontier: Frontier,
        rate: Callable[[], float],
        pages_added: Callable[[int], None],
        abandon: Callable[[Callable[[str], bool]], int] = lambda hosts: 0,
        leases: Any = None,
    ) -> None:
        f = config.fleet
        self.config = config
        self.timing = LeaseTiming(ttl=f.lease_ttl, fetch_deadline=config.fetch.timeout)
        self.timing.check()
        self._store = store
        self._frontier = frontier
        self._rate = rate
        self._pages_added = pages_added
        self._abandon = abandon
        self._leases = leases
        self._interval = max(config.store.flush_interval, 0.2)
        self.membership: Membership | None = None
        self._scope = trio.CancelScope()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join the fleet (its first claims published), then beat and drain the inbox until
        :meth:`stop` or cancelled. A database that cannot be reached raises StoreError."""
        f = self.config.fleet
        leases = self._leases
        if leases is None:
            from refresher.store._pg_dsn import idle_limit
            from refresher.store._pg_leases import PgLeases

            # Membership checks the clocks itself, allowing for the round trip (max_skew
            # against one reading of ours would refuse a node for a slow thread hop).
            idle = idle_limit(f.lease_ttl)
            leases = await trio.to_thread.run_sync(
                lambda: PgLeases(f.dsn, max_skew=None, idle_in_transaction=idle)
            )
        try:
            self.membership = Membership(
                leases=leases,
                node_id=f.node_id,
                partitions=f.partitions,
                timing=self.timing,
                serve=self._serve,
                fence=lambda owned: self._store.set_owned(dict(owned)),
                drain=self._drain,
                statistics=lambda: {"fetches_per_second": round(self._rate(), 3)},
                min_delay=self.config.politeness.min_delay,
                max_delay=self.config.politeness.max_delay,
            )
            with self._scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.membership.run)
                    nursery.start_soon(self._inbox)
                    log.info(
                        "joined the fleet",
                        node=f.node_id,
                        partitions=len(self.membership.held),
                        share=self.membership.statistics().share,
                    )
                    task_status.started()
        finally:
            if self._leases is None and hasattr(leases, "close"):
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(leases.close)

    def configure(self, config: Config) -> None:
        """Take a reloaded config's live settings: the politeness delays a claim of an
        expired lease holds the partition's hosts off by (the [fleet] keys are restart-only)."""
        self.config = config
        if self.membership is not None:
            p = config.politeness
            self.membership.set_delays(min_delay=p.min_delay, max_delay=p.max_delay)

    def _serve(self, held: Mapping[int, int]) -> None:
        membership = self.membership
        self._frontier.retain(
            owns_hosts(
                held,
                self.config.fleet.partitions,
                fetching=membership.fetching if membership is not None else None,
            )
        )

    async def _drain(self, partitions: frozenset[int], until: float) -> None:
        # In-flight fetches may finish until the leases' stop (trio time ``until``); what is
        # still on the wire then is cut (the margin has room for a cut, not for a whole fetch:
        # LeaseTiming), so the last request has ended before the lease can expire.
        hosts = owns_hosts(partitions, self.config.fleet.partitions)
        with trio.move_on_at(until):
            await self._frontier.wait_released(hosts)
        cut = self._abandon(hosts)
        if cut:
            log.info("requests cut: their partitions' leases stop", requests=cut)
        # A worker cancelled mid-fetch (drain timeout at shutdown) never releases its host,
        # so the wait is bounded.
        with trio.move_on_after(CUT_ALLOWANCE + self.timing.heartbeat):
            await self._frontier.wait_released(hosts)
        await self._store.flush()

    async def _inbox(self) -> None:
        while True:
            try:
                rows, hosts, taken = await self._store.drain_inbox(INBOX_BATCH)
            except StoreError as e:
                log.warning("draining the inbox failed; retrying", error=str(e))
                taken, rows, hosts = 0, [], {}
            if rows:
                self._frontier.add(rows, hosts)
                self._pages_added(len(rows))
                log.debug("inbox drained", pages=len(rows), taken=taken)
            if taken < INBOX_BATCH:
                await trio.sleep(self._interval)

    async def stop(self) -> None:
        """Hand every partition back (after the in-flight fetches commit) and leave."""
        if self.membership is not None:
            await self.membership.stop()
        self._scope.cancel()

    def statistics(self) -> FleetNodeStatistics:
        m = (
            self.membership.statistics()
            if self.membership is not None
            else MembershipStatistics(
                node_id=self.config.fleet.node_id,
                owned=0,
                share=0,
                live_nodes=0,
                heartbeats=0,
                renewals=0,
                claimed=0,
                shed=0,
                lost=0,
                self_fenced=0,
                heartbeat_failures=0,
                reachable=False,
                clock_skew=None,
                refused=False,
            )
        )
        fencing = self._store.fencing()
        return FleetNodeStatistics(
            owned=m.owned,
            share=m.share,
            live_nodes=m.live_nodes,
            heartbeats=m.heartbeats,
            renewals=m.renewals,
            claimed=m.claimed,
            shed=m.shed,
            lost=m.lost,
            self_fenced=m.self_fenced,
            heartbeat_failures=m.heartbeat_failures,
            reachable=m.reachable,
            refused=m.refused,
            clock_skew=None if m.clock_skew is None or math.isnan(m.clock_skew) else m.clock_skew,
            fenced_records=int(getattr(fencing, "records", 0)),
            fenced_hosts=int(getattr(fencing, "hosts", 0)),
            inbox_sent=int(getattr(fencing, "inbox", 0)),
            inbox_drained=int(getattr(fencing, "drained", 0)),
        )
