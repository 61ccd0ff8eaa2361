"""Which partitions a node should hold, and when it must stop fetching them: pure functions.

Partitions map to nodes through leases (owner, epoch, expiry) in the fleet's database. Every
node runs the same rule against the same table, one *step* per heartbeat, without talking to
the others:

- **Its share.** With N live nodes (sorted by node id) and P partitions, the first P mod N nodes
  hold ⌈P/N⌉ partitions and the others ⌊P/N⌋: the shares add up to P (:func:`share`).
- **Claim.** A node under its share claims free partitions (no owner, or an expired lease, or an
  owner that is no longer live) up to its share.
- **Shed.** A node over its share releases surplus partitions, but only as many as the other
  live nodes are missing, and at most ``max_shed`` per step: a joining node takes partitions
  over a few heartbeats rather than all at once (sticky, like Kafka's cooperative rebalancing),
  and a partition keeps its owner whenever the split allows it.

A partition is given only by the database (the claim is one conditional ``UPDATE``), so two
nodes never hold one; these functions only decide what to ask for.

The timing (:class:`LeaseTiming`): a node renews its leases every ``ttl / 3`` and stops fetching
a partition's hosts at ``granted_at + ttl − margin`` on its own monotonic clock, where
``granted_at`` is the moment it *sent* the statement that granted or renewed the lease and the
margin covers one heartbeat plus :data:`CUT_ALLOWANCE`: at that moment the node also cuts its
requests on the wire to the partition's hosts (:meth:`refresher.crawl.Crawler.abandon`), so its
last request to them has ended before the database can give the partition to another node.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from refresher._errors import ConfigError

__all__ = ["CUT_ALLOWANCE", "LeaseTiming", "Step", "plan_step", "share", "shares"]


def shares(partitions: int, live: Collection[str]) -> dict[str, int]:
    """How many of ``partitions`` each live node should hold: ⌈P/N⌉ for the first P mod N nodes
    by node id, ⌊P/N⌋ for the rest; the shares add up to P (empty when no node is live)."""
    nodes = sorted(set(live))
    if not nodes:
        return {}
    base, extra = divmod(partitions, len(nodes))
    return {node: base + (1 if i < extra else 0) for i, node in enumerate(nodes)}


def share(partitions: int, live: Collection[str], node: str) -> int:
    """``node``'s share (see :func:`shares`); 0 when it is not among ``live``."""
    return shares(partitions, live).get(node, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """What one node asks for in one step."""

    claim: int  # how many free partitions to claim
    shed: tuple[int, ...]  # which of its partitions to release


def default_max_shed(share_: int) -> int:
    """Partitions shed per step: a quarter of the node's share, at least one."""
    return max(1, math.ceil(share_ / 4))


def plan_step(
    *,
    partitions: int,
    node: str,
    live: Collection[str],
    owners: Mapping[int, str | None],
    max_shed: int | None = None,
) -> Step:
    """One step of ``node``: how many partitions to claim and which to shed.

    ``live`` are the nodes whose heartbeat is fresh (``node`` among them); ``owners`` maps a
    partition to its holder when its lease is unexpired (partitions absent or mapped to None are
    free). Holders that are not live count as free: their leases expire soon."""
    live_set = set(live) | {node}
    quota = shares(partitions, live_set)
    held: dict[str, list[int]] = {n: [] for n in live_set}
    free = 0
    for p in range(partitions):
        owner = owners.get(p)
        if owner is None or owner not in live_set:
            free += 1
        else:
            held[owner].append(p)
    mine = held[node]
    target = quota[node]
    if len(mine) < target:
        return Step(claim=min(target - len(mine), free), shed=())
    surplus = len(mine) - target
    if surplus == 0:
        return Step(claim=0, shed=())
    # Others' need not met by free partitions: what shedding can give them.
    missing = sum(max(0, quota[n] - len(held[n])) for n in live_set if n != node)
    wanted = max(0, missing - free)
    limit = default_max_shed(target) if max_shed is None else max_shed
    count = min(surplus, wanted, limit)
    # The highest-numbered ones: every node sheds the same way, so the split stays sticky.
    return Step(claim=0, shed=tuple(sorted(mine)[len(mine) - count :]))


#: seconds allowed between a node's stop and its last request to the partition's hosts having
#: ended: the requests are cut, not waited for (a cancel and a socket close take milliseconds;
#: the rest is room for a loaded event loop)
CUT_ALLOWANCE = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTiming:
    """When to renew and when to stop, for a lease of ``ttl`` seconds and fetches that take at
    most ``fetch_deadline`` seconds (``fetch.timeout``, the total deadline of one request).

    A node stops a partition by cutting its requests on the wire, so the margin needs the
    longest fetch only when it is shorter than :data:`CUT_ALLOWANCE`."""

    ttl: float
    fetch_deadline: float

    @property
    def heartbeat(self) -> float:
        """Seconds between renewals."""
        return self.ttl / 3

    @property
    def margin(self) -> float:
        """Seconds before the lease's expiry at which the node stops fetching."""
        return self.heartbeat + min(self.fetch_deadline, CUT_ALLOWANCE)

    @property
    def max_skew(self) -> float:
        """Seconds the node's clock may differ from the database's."""
        return self.ttl / 4

    def stop_at(self, granted_at: float) -> float:
        """The monotonic time at which a lease granted or renewed by a statement sent at
        ``granted_at`` (same clock) stops being fetched."""
        return granted_at + self.ttl - self.margin

    def check(self) -> None:
        """Refuse a ttl that leaves no time to fetch between renewals (ConfigError)."""
        # Renewed every ttl/3, a lease must outlive one missed renewal before the stop.
        if self.ttl - self.margin <= self.heartbeat:
            cut = min(self.fetch_deadline, CUT_ALLOWANCE)
            raise ConfigError(
                f"{self.ttl:g} s is too short: a node must stop fetching (and cut its requests, "
                f"allowed {cut:g} s) one heartbeat (ttl/3) before its lease expires and still "
                f"fetch between renewals; set lease_ttl above {3 * cut:g} s",
                key="fleet.lease_ttl",
            )
