"""``refresher fleet status``: what the fleet's database says about the fleet, read in one
transaction (nodes, leases per node and their ages, the inbox, the coordinator's row).

The fleet's fetch rate is the sum of what the live nodes reported with their last heartbeat
(``statistics.fetches_per_second``); μ, the budget and the unplaced budget are the coordinator
row's as it holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from refresher._errors import StoreError
from refresher.store._pg_dsn import connect, describe

__all__ = ["FleetNodeStatus", "FleetStatus", "node_running", "read_fleet_status"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetNodeStatus:
    node_id: str
    live: bool  # heartbeat younger than the lease ttl and not stopping
    stopping: bool
    heartbeat_age: float  # seconds since its last heartbeat (the database's clock)
    clock_skew: float | None  # seconds, its clock minus the database's at that heartbeat
    partitions: int  # unexpired leases held
    #: seconds since its least recently renewed lease was granted or renewed (None: none held)
    oldest_lease_age: float | None
    fetches_per_second: float | None  # as it reported at its last heartbeat
    statistics: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetStatus:
    now: float  # the database's clock, unix seconds
    partitions: int  # P
    free: int  # partitions with no unexpired lease
    nodes: list[FleetNodeStatus]
    inbox: int  # discovered URLs waiting for their partition's owner
    fetches_per_second: float  # the live nodes' reported rates, summed
    coordinator: dict[str, Any]  # the budget coordinator's row: owner, epoch, mu, …


def read_fleet_status(dsn: str, *, ttl: float) -> FleetStatus:
    """The fleet's state now (``ttl``: the lease ttl, to date a lease's last renewal)."""
    try:
        with connect(dsn) as con, con.transaction(), con.cursor() as cur:
            cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            now = float(cur.fetchone()[0])  # type: ignore[index]
            cur.execute(
                """
                SELECT n.node_id, n.heartbeat_at, n.clock, n.stopping, n.statistics,
                       count(p.partition), min(p.expires_at)
                FROM nodes n LEFT JOIN partitions p
                    ON p.owner = n.node_id AND p.expires_at > %(now)s
                GROUP BY n.node_id ORDER BY n.node_id
                """,
                {"now": now},
            )
            nodes = [_node(row, now=now, ttl=ttl) for row in cur.fetchall()]
            cur.execute(
                "SELECT count(*), count(*) FILTER (WHERE owner IS NULL OR expires_at <= %s) "
                "FROM partitions",
                (now,),
            )
            partitions, free = cur.fetchone()  # type: ignore[misc]
            cur.execute("SELECT count(*) FROM inbox")
            inbox = int(cur.fetchone()[0])  # type: ignore[index]
            cur.execute(
                "SELECT owner, epoch, expires_at, mu, policy, budget, unplaced, solved_at "
                "FROM coordinator"
            )
            names = [d.name for d in cur.description or ()]
            row = cur.fetchone()
            coordinator = dict(zip(names, row, strict=True)) if row else {}
    except psycopg.Error as e:
        raise StoreError(f"reading the fleet's status: {describe(e)}") from e
    rate = sum(n.fetches_per_second or 0.0 for n in nodes if n.live)
    return FleetStatus(
        now=now,
        partitions=int(partitions),
        free=int(free),
        nodes=nodes,
        inbox=inbox,
        fetches_per_second=rate,
        coordinator=coordinator,
    )


def _node(row: tuple[Any, ...], *, now: float, ttl: float) -> FleetNodeStatus:
    node_id, heartbeat_at, clock, stopping, stats, held, first_expiry = row
    stats = dict(stats or {})
    rate = stats.get("fetches_per_second")
    return FleetNodeStatus(
        node_id=str(node_id),
        live=not stopping and heartbeat_at > now - ttl,
        stopping=bool(stopping),
        heartbeat_age=now - float(heartbeat_at),
        clock_skew=None if clock is None else float(clock) - float(heartbeat_at),
        partitions=int(held),
        oldest_lease_age=None if first_expiry is None else now - (float(first_expiry) - ttl),
        fetches_per_second=float(rate) if isinstance(rate, int | float) else None,
        statistics=stats,
    )


def node_running(dsn: str, node_id: str, ttl: float) -> bool:
    """Whether ``node_id`` is live: its heartbeat younger than ``ttl`` and not stopping."""
    try:
        with connect(dsn) as con:
            row = con.execute(
                "SELECT NOT stopping AND heartbeat_at > extract(epoch FROM clock_timestamp()) - %s"
                " FROM nodes WHERE node_id = %s",
                (ttl, node_id),
            ).fetchone()
    except psycopg.Error as e:
        raise StoreError(f"reading the fleet's nodes: {describe(e)}") from e
    return bool(row and row[0])
