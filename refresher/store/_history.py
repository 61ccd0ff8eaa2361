"""History retention: fetches older than ``store.history_retention`` seconds are deleted, after
an export to Parquet when ``store.history_export_dir`` is set.

Each page's latest ``keep_per_page`` fetches are always kept, however old: the estimator reads
at most ``estimate.history`` observations a page, so λ̂ is the same after a pass. The page
counters (``pages.fetches``, ``changes``, ``first_seen``, ``last_change``) are kept in
``pages`` and are not recounted, so they go on summarising the whole history. The freshness
views over a window that reaches back past the retention period see fewer refreshes there.

A running daemon's snapshot copies ``fetches`` incrementally: after a pass that deleted rows,
the daemon makes its next snapshot a rebuild (:meth:`Snapshotter.rebuild_next`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import duckdb

from refresher._errors import StoreError

__all__ = ["prune_history"]


def prune_history(
    con: Any, *, before: float, keep_per_page: int, export_dir: Path | None = None
) -> tuple[int, Path | None]:
    """Delete the fetches that finished before ``before`` (unix seconds), but each page's
    latest ``keep_per_page``; export them to a Parquet file in ``export_dir`` first.
    Returns the rows deleted and the file written (None without an export or rows)."""
    target: Path | None = None
    try:
        con.execute("BEGIN")
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _old_fetches AS
            SELECT id FROM (
                SELECT id, finished_at,
                       row_number() OVER (PARTITION BY page_id ORDER BY id DESC) AS newer
                FROM fetches)
            WHERE newer > ? AND finished_at < ?
            """,
            [keep_per_page, before],
        )
        n = int(con.execute("SELECT count(*) FROM _old_fetches").fetchall()[0][0])
        if n and export_dir is not None:
            export_dir.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            target = export_dir / f"fetches-{stamp}.parquet"
            literal = "'" + str(target).replace("'", "''") + "'"
            con.execute(
                "COPY (SELECT f.* FROM fetches f SEMI JOIN _old_fetches o ON f.id = o.id"
                f" ORDER BY f.id) TO {literal} (FORMAT parquet)"
            )
        if n:
            con.execute("DELETE FROM fetches WHERE id IN (SELECT id FROM _old_fetches)")
        con.execute("DROP TABLE _old_fetches")
        con.execute("COMMIT")
    except (duckdb.Error, OSError) as e:
        con.execute("ROLLBACK")
        raise StoreError(
            f"history retention failed, nothing deleted: {e}; check store.history_export_dir "
            "and free space"
        ) from e
    return n, target
