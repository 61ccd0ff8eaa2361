"""The first copy's Last-Modified, as a change observation for the estimator.

A page's first fetch has no interval before it, but where the host's Last-Modified is honest
the first copy says that the page did not change from its Last-Modified time to that fetch:
a quiet interval of (first fetch − Last-Modified) seconds. The estimator reads it like any
unchanged interval (Kolobov et al. 2019 use every complete observation of this kind).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from refresher.store._interface import SUCCESS_SQL

__all__ = ["first_fetch_quiet"]


def first_fetch_quiet(con: Any, *, history: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """(page id, seconds from the first copy's Last-Modified to its fetch) for pages whose
    first successful fetch is among their last ``history`` + 1 (the estimator's window) and
    carried a Last-Modified before the fetch."""
    got = con.execute(
        f"""
        WITH ok AS (
            SELECT page_id, finished_at, last_modified_at,
                   row_number() OVER (PARTITION BY page_id ORDER BY finished_at) AS first,
                   count(*) OVER (PARTITION BY page_id) AS n
            FROM fetches
            WHERE {SUCCESS_SQL}
        )
        SELECT page_id, finished_at - last_modified_at AS quiet
        FROM ok
        WHERE first = 1 AND n <= ? + 1 AND last_modified_at IS NOT NULL
          AND isfinite(last_modified_at) AND finished_at > last_modified_at
        ORDER BY page_id
        """,
        [history],
    ).fetchnumpy()
    return (
        np.asarray(got["page_id"], dtype=np.int64),
        np.asarray(got["quiet"], dtype=np.float64),
    )
