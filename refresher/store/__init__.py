"""Stage 3, store: the only owner of SQL.

interface (the :class:`Store` protocol every other part uses, the rows that cross it, and the
one definition each of a successful fetch, a change and a due time), duckdb (the embedded
implementation: pages, hosts, the append-only fetch history, the batched writer), views
(freshness and age in SQL), snapshot (consistent copies for live queries), captures (the
archive's index of WARC records), history (retention of old fetches), prune (the archive
retention's index side), change_stats (the per-page statistics the estimator reads), truth
(a simulated web's truth tables); service (the batched writer both stores share). For a fleet:
postgres (the PostgreSQL implementation for one node, fenced by partition leases, with the
inbox of links for other nodes), pg_leases (the leases' SQL), pg_schema (the fleet's schema and
``refresher fleet init``), pg_dsn (the connection string, never shown with its password).
"""

from typing import TYPE_CHECKING, Any

from refresher.store._change_stats import fold_observations, last_modified_agrees
from refresher.store._duckdb import SCHEMA_VERSION, DuckDBStore, StoreService
from refresher.store._interface import (
    LATE_CREDIT,
    NEVER,
    ChangeStatistics,
    DocumentUpdate,
    EstimatorInputs,
    FetchRecord,
    Findings,
    HostRow,
    HostSummary,
    HostUpdate,
    NewPage,
    PageRow,
    PlanUpdate,
    RobotsUpdate,
    Store,
    StoreStatistics,
    StoreStatus,
    due_after,
    due_interval,
    is_change,
    is_success,
    next_due,
    next_due_sql,
)
from refresher.store._open import open_store

if TYPE_CHECKING:
    from refresher.store._pg_leases import LeaseStore, PgLeases
    from refresher.store._postgres import Fencing, PostgresStore

#: the fleet's names, imported on first use: a single node never loads psycopg
_FLEET = {
    "Fencing": "refresher.store._postgres",
    "LeaseStore": "refresher.store._pg_leases",
    "PgLeases": "refresher.store._pg_leases",
    "PostgresStore": "refresher.store._postgres",
}


def __getattr__(name: str) -> Any:
    if name in _FLEET:
        import importlib

        return getattr(importlib.import_module(_FLEET[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LATE_CREDIT",
    "NEVER",
    "SCHEMA_VERSION",
    "ChangeStatistics",
    "DocumentUpdate",
    "DuckDBStore",
    "EstimatorInputs",
    "Fencing",
    "FetchRecord",
    "Findings",
    "HostRow",
    "HostSummary",
    "HostUpdate",
    "LeaseStore",
    "NewPage",
    "PageRow",
    "PgLeases",
    "PlanUpdate",
    "PostgresStore",
    "RobotsUpdate",
    "Store",
    "StoreService",
    "StoreStatistics",
    "StoreStatus",
    "due_after",
    "due_interval",
    "fold_observations",
    "is_change",
    "is_success",
    "last_modified_agrees",
    "next_due",
    "next_due_sql",
    "open_store",
]
