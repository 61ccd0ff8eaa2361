"""Partition leases in the fleet's PostgreSQL: the SQL of membership.

A partition row holds its lease: ``owner`` (a node id, NULL when free), ``epoch`` and
``expires_at``. Claiming a free or expired partition sets its owner and increments its epoch;
the epoch is the *fencing token*: every batch a node writes checks, in its transaction, that it
still holds each touched partition at the epoch it was granted, so a node that lost a partition
can never overwrite the new owner's state (:mod:`refresher.store._postgres`).

Claims take rows with ``FOR UPDATE SKIP LOCKED``: nodes claiming at once each get different
partitions and never wait for each other. Renewal only extends leases still held at the granted
epoch. All times are unix seconds on the caller's clock; the caller passes ``now``, and
:class:`PgLeases` refuses a ``now`` further than ``max_skew`` seconds from the database's
clock (a node with a clock far off could otherwise hold a lease too long or steal one early).

The membership component (:mod:`refresher.fleet`) uses this through :class:`LeaseStore`; it
calls the synchronous methods from a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from refresher._errors import StoreError
from refresher.ops._logging import get_logger
from refresher.store._pg_dsn import connect, describe

__all__ = ["ClockSkewError", "HoldOff", "LeaseStore", "NodeRow", "PartitionRow", "PgLeases"]

log = get_logger("fleet.leases")


class ClockSkewError(StoreError):
    """The node's clock is too far from the database's to prove a lease."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRow:
    partition: int
    owner: str | None
    epoch: int
    expires_at: float  # unix seconds; 0 when free


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRow:
    node_id: str
    started_at: float
    heartbeat_at: float  # the database's clock at the last heartbeat
    clock: float | None  # the node's own clock then
    stopping: bool
    statistics: dict[str, Any]
    partitions: int  # leases held and not expired at ``now``


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldOff:
    """How a claim holds off the hosts of a partition whose lease expired rather than was
    handed back: its holder may have died, with the next-allowed times of its last requests
    to them. Each such host may be asked no sooner than ``lapse`` before the old lease's
    expiry (the holder's last possible contact: its stop, and the cut of its requests) plus
    its delay (``min_delay`` when none is stored), when that is later than both its stored
    next-allowed time and the claim. A host waits no longer than ``max_delay`` after that
    contact (a longer stored delay, left by a reload that lowered ``max_delay``, is bounded by
    the node's frontier when it reads the host), so the hosts of a lease that expired longer
    ago than that are not read."""

    lapse: float  # seconds
    min_delay: float = 0.0  # seconds
    max_delay: float = math.inf  # seconds


class LeaseStore(Protocol):
    """The lease operations membership needs (synchronous; call from a worker thread)."""

    def claim_free(
        self, node: str, n: int, ttl: float, now: float, hold_off: HoldOff | None = None
    ) -> dict[int, int]:
        """Take up to ``n`` partitions that are free or whose lease expired; {partition:
        epoch} of those granted (each epoch one more than before). With ``hold_off``, the
        hosts of the partitions whose lease expired (not handed back) are held off in the
        claim's transaction (see :class:`HoldOff`)."""
        ...

    def renew(self, node: str, owned: Mapping[int, int], ttl: float, now: float) -> dict[int, int]:
        """Extend to ``now + ttl`` the leases of ``owned`` ({partition: epoch}) still held at
        those epochs; the subset still held."""
        ...

    def release(self, node: str, partitions: Collection[int]) -> None:
        """Hand these partitions back (free at once)."""
        ...

    def heartbeat(
        self, node: str, stats: Mapping[str, Any], now: float, *, stopping: bool = False
    ) -> None:
        """Record that ``node`` is alive, its clock and statistics."""
        ...

    def nodes(self, now: float) -> list[NodeRow]:
        """Every node that ever joined, with the leases it holds at ``now``."""
        ...

    def partitions(self) -> list[PartitionRow]:
        """Every partition's lease."""
        ...


#: the claim: free or expired leases granted, and the hosts of the expired ones held off until
#: the old holder's last possible contact (expiry − lapse) plus their delay, where that is
#: later than both their stored next-allowed time and now (a long delay: a host's delay that
#: fits in the lapse has passed already); a lapse of infinity holds nothing off
_CLAIM = """
WITH free AS (
    SELECT partition, owner AS holder, expires_at AS expired_at FROM partitions
    WHERE owner IS NULL OR expires_at < %(now)s
    ORDER BY expires_at, partition
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), granted AS (
    UPDATE partitions p
    SET owner = %(node)s, epoch = p.epoch + 1, expires_at = %(now)s + %(ttl)s
    FROM free WHERE p.partition = free.partition
    RETURNING p.partition, p.epoch, free.holder, free.expired_at
), held_off AS (
    UPDATE hosts h
    SET next_allowed = g.expired_at - %(lapse)s + COALESCE(h.delay, %(min_delay)s)
    FROM granted g
    WHERE g.holder IS NOT NULL AND g.expired_at - %(lapse)s + %(max_delay)s > %(now)s
    AND h.partition = g.partition
    AND g.expired_at - %(lapse)s + COALESCE(h.delay, %(min_delay)s)
        > GREATEST(h.next_allowed, %(now)s)
    RETURNING h.id
)
SELECT partition, epoch, (SELECT count(*) FROM held_off) FROM granted
"""


class PgLeases:
    """:class:`LeaseStore` on one PostgreSQL connection (its own; thread-safe by a lock)."""

    def __init__(
        self, dsn: str, *, max_skew: float | None = 5.0, idle_in_transaction: float | None = None
    ) -> None:
        self._dsn = dsn
        self.max_skew = max_skew
        self._idle = idle_in_transaction
        self._lock = threading.Lock()
        self._con: psycopg.Connection[Any] = connect(dsn, idle_in_transaction=self._idle)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def _run(self, what: str, fn: Any) -> Any:
        """``fn(cursor)`` in one transaction, psycopg's errors as :class:`StoreError`."""
        with self._lock:
            try:
                if self._con.closed:  # lost with the server: membership retries through here
                    self._con = connect(self._dsn, idle_in_transaction=self._idle)
                with self._con.transaction(), self._con.cursor() as cur:
                    return fn(cur)
            except psycopg.Error as e:
                raise StoreError(f"{what}: {describe(e)}") from e

    def _check_clock(self, cur: Any, now: float) -> None:
        if self.max_skew is None:
            return
        cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        db_now = float(cur.fetchone()[0])
        if abs(now - db_now) > self.max_skew:
            raise ClockSkewError(
                f"this node's clock is {now - db_now:+.1f} s off the database's (at most "
                f"±{self.max_skew} s); synchronise it (NTP) before it takes leases"
            )

    def claim_free(
        self, node: str, n: int, ttl: float, now: float, hold_off: HoldOff | None = None
    ) -> dict[int, int]:
        if n <= 0:
            return {}

        def claim(cur: Any) -> tuple[dict[int, int], int]:
            self._check_clock(cur, now)
            cur.execute(
                _CLAIM,
                {
                    "now": now,
                    "n": n,
                    "node": node,
                    "ttl": ttl,
                    "lapse": hold_off.lapse if hold_off is not None else math.inf,
                    "min_delay": hold_off.min_delay if hold_off is not None else 0.0,
                    "max_delay": hold_off.max_delay if hold_off is not None else 0.0,
                },
            )
            rows = cur.fetchall()
            return {int(p): int(e) for p, e, _ in rows}, int(rows[0][2]) if rows else 0

        granted: dict[int, int]
        granted, held_off = self._run("claiming partitions", claim)
        if granted:
            log.info(
                "partitions claimed", node=node, partitions=len(granted), hosts_held_off=held_off
            )
        return granted

    def renew(self, node: str, owned: Mapping[int, int], ttl: float, now: float) -> dict[int, int]:
        if not owned:
            return {}
        parts = list(owned)

        def renew(cur: Any) -> dict[int, int]:
            self._check_clock(cur, now)
            cur.execute(
                """
                UPDATE partitions p SET expires_at = %(now)s + %(ttl)s
                FROM unnest(%(parts)s::int[], %(epochs)s::bigint[]) AS o(partition, epoch)
                WHERE p.partition = o.partition AND p.epoch = o.epoch AND p.owner = %(node)s
                RETURNING p.partition, p.epoch
                """,
                {
                    "now": now,
                    "ttl": ttl,
                    "node": node,
                    "parts": parts,
                    "epochs": [owned[p] for p in parts],
                },
            )
            return {int(p): int(e) for p, e in cur.fetchall()}

        held: dict[int, int] = self._run("renewing leases", renew)
        if len(held) < len(owned):
            log.warning(
                "leases lost", node=node, lost=sorted(set(owned) - set(held))[:20], held=len(held)
            )
        return held

    def release(self, node: str, partitions: Collection[int]) -> None:
        if not partitions:
            return
        self._run(
            "releasing partitions",
            lambda cur: cur.execute(
                "UPDATE partitions SET owner = NULL, expires_at = 0"
                " WHERE owner = %s AND partition = ANY(%s)",
                (node, list(partitions)),
            ),
        )
        log.info("partitions released", node=node, partitions=len(partitions))

    def heartbeat(
        self, node: str, stats: Mapping[str, Any], now: float, *, stopping: bool = False
    ) -> None:
        self._run(
            "heartbeat",
            lambda cur: cur.execute(
                """
                INSERT INTO nodes (node_id, started_at, heartbeat_at, clock, stopping, statistics)
                VALUES (%(node)s, %(now)s, extract(epoch FROM clock_timestamp()), %(now)s,
                        %(stopping)s, %(stats)s::jsonb)
                ON CONFLICT (node_id) DO UPDATE SET
                    heartbeat_at = excluded.heartbeat_at, clock = excluded.clock,
                    stopping = excluded.stopping, statistics = excluded.statistics,
                    started_at = CASE WHEN nodes.stopping AND NOT excluded.stopping
                                      THEN excluded.started_at ELSE nodes.started_at END
                """,
                {
                    "node": node,
                    "now": now,
                    "stopping": stopping,
                    "stats": json.dumps(dict(stats), default=str),
                },
            ),
        )

    def nodes(self, now: float) -> list[NodeRow]:
        def read(cur: Any) -> list[NodeRow]:
            cur.execute(
                """
                SELECT n.node_id, n.started_at, n.heartbeat_at, n.clock, n.stopping,
                       n.statistics,
                       (SELECT count(*) FROM partitions p
                        WHERE p.owner = n.node_id AND p.expires_at >= %s)
                FROM nodes n ORDER BY n.node_id
                """,
                (now,),
            )
            return [
                NodeRow(
                    node_id=r[0],
                    started_at=float(r[1]),
                    heartbeat_at=float(r[2]),
                    clock=None if r[3] is None else float(r[3]),
                    stopping=bool(r[4]),
                    statistics=dict(r[5] or {}),
                    partitions=int(r[6]),
                )
                for r in cur.fetchall()
            ]

        rows: list[NodeRow] = self._run("reading nodes", read)
        return rows

    def partitions(self) -> list[PartitionRow]:
        def read(cur: Any) -> list[PartitionRow]:
            cur.execute("SELECT partition, owner, epoch, expires_at FROM partitions ORDER BY 1")
            return [
                PartitionRow(partition=int(p), owner=o, epoch=int(e), expires_at=float(x))
                for p, o, e, x in cur.fetchall()
            ]

        rows: list[PartitionRow] = self._run("reading partitions", read)
        return rows
