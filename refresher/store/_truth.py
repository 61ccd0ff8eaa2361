"""Writing a simulated web's ground truth: the tables the views' ``true_*`` macros read.

``truth_pages(url, host, rate, created_at)`` (true changes per second, creation time) and
``truth_changes(url, changed_at)`` (every true change, unix seconds of the site's clock), in one
DuckDB file or as two Parquet files in a directory (:func:`refresher.store._views.attach_truth`
reads either). The simulated web (:mod:`refresher.sim._simweb`) collects the arrays; the SQL that
stores them lives here, with the rest of the store's SQL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import duckdb
import numpy as np
from numpy.typing import NDArray

from refresher._errors import StoreError

__all__ = ["write_truth_tables"]

_PAGES_DDL = "CREATE TABLE truth_pages(url VARCHAR, host VARCHAR, rate DOUBLE, created_at DOUBLE)"
_CHANGES_DDL = "CREATE TABLE truth_changes(url VARCHAR, changed_at DOUBLE)"


def _fill(
    con: duckdb.DuckDBPyConnection,
    pages: dict[str, NDArray[np.generic]],
    changes: dict[str, NDArray[np.generic]],
) -> None:
    con.execute(_PAGES_DDL)
    con.execute(_CHANGES_DDL)
    con.register("_pages", pages)
    con.execute("INSERT INTO truth_pages SELECT url, host, rate, created_at FROM _pages")
    con.unregister("_pages")
    con.register("_changes", changes)
    con.execute("INSERT INTO truth_changes SELECT url, changed_at FROM _changes")
    con.unregister("_changes")


def write_truth_tables(
    path: Path,
    fmt: Literal["duckdb", "parquet"],
    *,
    pages: dict[str, NDArray[np.generic]],
    changes: dict[str, NDArray[np.generic]],
) -> None:
    """Write the truth to ``path``, each file replaced atomically (readers see old or new).

    ``pages``: arrays ``url``, ``host``, ``rate``, ``created_at``; ``changes``: ``url``,
    ``changed_at``. ``fmt`` "duckdb": ``path`` is the file; "parquet": a directory."""
    tmp_tag = f".tmp-{os.getpid()}"
    try:
        if fmt == "duckdb":
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + tmp_tag)
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                leftover.unlink(missing_ok=True)
            con = duckdb.connect(str(tmp))
            try:
                _fill(con, pages, changes)
            finally:
                con.close()
            os.replace(tmp, path)
            return
        path.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect()
        try:
            _fill(con, pages, changes)
            # Changes first: a reader between the two renames sees pages it cannot yet join.
            for table in ("truth_changes", "truth_pages"):
                final = path / f"{table}.parquet"
                tmp = path / f"{table}.parquet{tmp_tag}"
                quoted = str(tmp).replace("'", "''")
                con.execute(f"COPY {table} TO '{quoted}' (FORMAT parquet)")
                os.replace(tmp, final)
        finally:
            con.close()
    except (OSError, duckdb.Error) as e:
        raise StoreError(
            f"cannot write the simweb truth to {str(path)!r}: {e}; check that its directory "
            "is writable and has space"
        ) from e
