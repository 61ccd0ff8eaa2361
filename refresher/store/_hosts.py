"""Hosts as an operator sees them: the busiest, the paused and those in backoff."""

from __future__ import annotations

from typing import Any

from refresher.store._interface import HostSummary

__all__ = ["HostSummary", "host_summary", "summaries", "summary_sql_pg"]


_SUMMARY = """
WITH per_host AS (
    SELECT h.name, count(p.id) AS pages, coalesce(sum(p.fetches), 0) AS fetches, h.errors,
           h.paused, h.sitemap_passed, h.sitemap_failed,
           CASE WHEN h.errors > 0 THEN greatest(h.next_allowed - $now, 0) ELSE 0 END AS backoff_left
    FROM hosts h LEFT JOIN pages p ON p.host_id = h.id
    GROUP BY h.id, h.name, h.errors, h.paused, h.next_allowed, h.sitemap_passed, h.sitemap_failed
), ranked AS (
    SELECT *, row_number() OVER (ORDER BY fetches DESC, name) AS rank FROM per_host
)
SELECT name, pages, fetches, errors, paused, backoff_left, sitemap_passed, sitemap_failed
FROM ranked
WHERE $limit IS NULL OR rank <= $limit OR paused OR backoff_left > 0
ORDER BY paused DESC, backoff_left > 0 DESC, fetches DESC, name
"""


def summaries(rows: Any) -> list[HostSummary]:
    """Rows of the summary query as :class:`HostSummary` (both stores)."""
    return [
        HostSummary(
            host=str(r[0]),
            pages=int(r[1]),
            fetches=int(r[2]),
            errors=int(r[3]),
            paused=bool(r[4]),
            backoff_left=float(r[5]),
            sitemap_passed=int(r[6]),
            sitemap_failed=int(r[7]),
        )
        for r in rows
    ]


def summary_sql_pg() -> str:
    """The summary query in PostgreSQL's (psycopg's) parameter style."""
    return _SUMMARY.replace("$now", "%(now)s").replace("$limit", "%(limit)s::int")


def host_summary(con: Any, *, now: float, limit: int | None = 10) -> list[HostSummary]:
    """The ``limit`` busiest hosts (all when None), and every paused host or host in backoff.

    ``now`` is unix seconds; paused hosts come first, then those in backoff, then by fetches.
    """
    return summaries(con.execute(_SUMMARY, {"now": now, "limit": limit}).fetchall())
