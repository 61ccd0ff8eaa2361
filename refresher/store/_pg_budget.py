"""The fleet's one budget in PostgreSQL: the coordinator lease, its rounds and the answers.

The ``coordinator`` table has one row: the lease (``owner``, ``epoch``, ``expires_at``), claimed
like a partition lease (free or expired: take it and increment the epoch; held: renew at the
granted epoch), the current ``query`` (a round of :mod:`refresher.fleet._solve`) and the last
``solution`` with its ``mu``, ``policy``, ``budget``, ``unplaced`` and ``solved_at``. Every
write of the coordinator is fenced by its epoch: a coordinator that lost the lease cannot
publish. Each node writes its answer to the current round into its ``demand`` row.

Times are the database's clock (``clock_timestamp()``): the lease does not depend on the
nodes' clocks agreeing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from refresher.store._pg_session import PgSession

__all__ = ["BudgetStore", "CoordinatorRow", "DemandRow", "PgBudget"]

_NOW = "extract(epoch FROM clock_timestamp())::float8"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorRow:
    owner: str | None
    epoch: int
    expires_at: float
    query: dict[str, Any] | None
    solution: dict[str, Any] | None
    now: float  # the database's clock when read


@dataclass(frozen=True, slots=True, kw_only=True)
class DemandRow:
    node_id: str
    epoch: int  # the coordinator epoch the answer is for
    summary: dict[str, Any]
    age: float  # seconds since it was written (the database's clock)


class BudgetStore(Protocol):
    """What the fleet's budget service needs (synchronous; call from a worker thread)."""

    def claim_coordinator(self, node: str, ttl: float) -> int | None:
        """Take the coordinator lease if free or expired, or renew it if ``node`` holds it:
        the epoch held, or None."""
        ...

    def release_coordinator(self, node: str, epoch: int) -> None: ...

    def post_query(self, epoch: int, query: dict[str, Any]) -> bool:
        """Publish the next round (fenced: False if the lease moved on)."""
        ...

    def publish(self, epoch: int, solution: dict[str, Any], *, unplaced: float) -> bool:
        """Publish the fleet's solution (fenced)."""
        ...

    def coordinator(self) -> CoordinatorRow: ...

    def answer(self, node: str, epoch: int, summary: dict[str, Any]) -> None:
        """``node``'s answer to the round of coordinator ``epoch``."""
        ...

    def answers(self) -> list[DemandRow]:
        """Every node's latest answer, with its age."""
        ...

    def close(self) -> None: ...


class PgBudget:
    """:class:`BudgetStore` on one PostgreSQL connection of its own (thread-safe by a lock)."""

    def __init__(self, dsn: str) -> None:
        self._session = PgSession(dsn)
        self._run = self._session.run

    def close(self) -> None:
        self._session.close()

    def claim_coordinator(self, node: str, ttl: float) -> int | None:
        def claim(cur: Any) -> int | None:
            cur.execute(
                f"""
                UPDATE coordinator SET
                    epoch = CASE WHEN owner = %(node)s AND expires_at >= {_NOW}
                                 THEN epoch ELSE epoch + 1 END,
                    owner = %(node)s,
                    expires_at = {_NOW} + %(ttl)s
                WHERE id = 1 AND (owner IS NULL OR owner = %(node)s OR expires_at < {_NOW})
                RETURNING epoch
                """,
                {"node": node, "ttl": ttl},
            )
            row = cur.fetchone()
            return None if row is None else int(row[0])

        epoch: int | None = self._run("claiming the budget coordinator", claim)
        return epoch

    def release_coordinator(self, node: str, epoch: int) -> None:
        self._run(
            "releasing the budget coordinator",
            lambda cur: cur.execute(
                "UPDATE coordinator SET owner = NULL, expires_at = 0"
                " WHERE id = 1 AND owner = %s AND epoch = %s",
                (node, epoch),
            ),
        )

    def post_query(self, epoch: int, query: dict[str, Any]) -> bool:
        def post(cur: Any) -> bool:
            cur.execute(
                "UPDATE coordinator SET query = %s WHERE id = 1 AND epoch = %s",
                (json.dumps(query), epoch),
            )
            return bool(cur.rowcount)

        done: bool = self._run("posting the budget round", post)
        return done

    def publish(self, epoch: int, solution: dict[str, Any], *, unplaced: float) -> bool:
        def publish(cur: Any) -> bool:
            mu = solution.get("mu")
            cur.execute(
                f"UPDATE coordinator SET solution = %s, mu = %s, policy = %s, budget = %s,"
                f" unplaced = %s, solved_at = {_NOW} WHERE id = 1 AND epoch = %s",
                (
                    json.dumps(solution),
                    float(mu) if mu is not None else None,
                    solution.get("policy"),
                    solution.get("budget"),
                    unplaced,
                    epoch,
                ),
            )
            return bool(cur.rowcount)

        done: bool = self._run("publishing the fleet's budget", publish)
        return done

    def coordinator(self) -> CoordinatorRow:
        def read(cur: Any) -> CoordinatorRow:
            cur.execute(
                f"SELECT owner, epoch, expires_at, query, solution, {_NOW}"
                " FROM coordinator WHERE id = 1"
            )
            owner, epoch, expires, query, solution, now = cur.fetchone()
            return CoordinatorRow(
                owner=owner,
                epoch=int(epoch),
                expires_at=float(expires),
                query=query,
                solution=solution,
                now=float(now),
            )

        row: CoordinatorRow = self._run("reading the budget coordinator", read)
        return row

    def answer(self, node: str, epoch: int, summary: dict[str, Any]) -> None:
        self._run(
            "answering the budget round",
            lambda cur: cur.execute(
                f"INSERT INTO demand (node_id, epoch, summary, updated_at)"
                f" VALUES (%s, %s, %s, {_NOW}) ON CONFLICT (node_id) DO UPDATE SET"
                " epoch = excluded.epoch, summary = excluded.summary,"
                " updated_at = excluded.updated_at",
                (node, epoch, json.dumps(summary)),
            ),
        )

    def answers(self) -> list[DemandRow]:
        def read(cur: Any) -> list[DemandRow]:
            cur.execute(f"SELECT node_id, epoch, summary, {_NOW} - updated_at FROM demand")
            return [
                DemandRow(node_id=n, epoch=int(e), summary=s, age=float(a))
                for n, e, s, a in cur.fetchall()
            ]

        rows: list[DemandRow] = self._run("reading the nodes' answers", read)
        return rows
