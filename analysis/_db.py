"""Opening a run's history (a store or a snapshot) with the freshness views, and the truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from refresher._errors import StoreError
from refresher.store._views import attach_truth, create_views

__all__ = ["open_history", "rows"]


def open_history(db: Path, *, truth: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection to ``db`` (a store no daemon holds, or a snapshot) with the
    freshness views and macros as TEMP objects, and ``truth`` attached when given.

    Raises :class:`StoreError` when the file is missing, locked or not a store.
    """
    if not db.is_file():
        raise StoreError(f"no store or snapshot at {str(db)!r}; give the DuckDB file of a run")
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as e:
        raise StoreError(
            f"cannot open {str(db)!r}: {e}; a running daemon holds its store, so give its "
            "snapshot (snapshot.duckdb beside the store) or stop the daemon"
        ) from e
    try:
        create_views(con, temporary=True)
        if truth is not None:
            attach_truth(con, truth)
    except StoreError:
        con.close()
        raise
    return con


def rows(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
) -> list[dict[str, Any]]:
    """The result of ``sql`` as one dict per row (column name → value)."""
    try:
        cur = con.execute(sql, params or [])
        names = [str(d[0]) for d in cur.description or ()]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    except duckdb.Error as e:
        raise StoreError(f"the analysis query failed: {e}; is this a refresher store?") from e
