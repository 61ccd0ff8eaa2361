"""A simulated web's ground truth: writing the tables the views' ``true_*`` macros read, and
reading (url, rate) pairs back for ``estimate.known_rates``.

``truth_pages(url, host, rate, created_at)`` (true changes per second, creation time) and
``truth_changes(url, changed_at)`` (every true change, unix seconds of the site's clock), in one
DuckDB file or as two Parquet files in a directory (:func:`refresher.store._views.attach_truth`
reads either). The simulated web (:mod:`refresher.sim._simweb`) collects the arrays; the SQL that
stores them lives here, with the rest of the store's SQL.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import duckdb
import numpy as np
from numpy.typing import NDArray

from refresher._errors import StoreError

__all__ = ["read_rates", "write_truth_tables"]

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


def _rates_source(path: Path) -> str:
    """The SQL relation of (url, rate) rows in ``path``: a Parquet directory's
    ``truth_pages.parquet``, a ``.parquet`` file, a ``.csv`` file with a header, or else a DuckDB
    file's ``truth_pages`` table (attached read-only as ``known``)."""
    quoted = str(path).replace("'", "''")
    if path.is_dir():
        inner = str(path / "truth_pages.parquet").replace("'", "''")
        return f"read_parquet('{inner}')"
    if path.suffix.lower() == ".parquet":
        return f"read_parquet('{quoted}')"
    if path.suffix.lower() == ".csv":
        return f"read_csv('{quoted}', header = true, all_varchar = true)"
    return "known.truth_pages"


def read_rates(path: Path) -> tuple[NDArray[np.str_], NDArray[np.float64]]:
    """The ``url`` and ``rate`` columns (rate as read, changes per second; NaN where a value is
    not a number) of a truth file (:func:`write_truth_tables`: a DuckDB file or a Parquet
    directory), a Parquet file or a CSV file with a ``url,rate`` header. StoreError naming
    what is wrong: no such file, no such table or column."""
    if not path.exists():
        raise StoreError(f"no file {str(path)!r}")
    source = _rates_source(path)
    con = duckdb.connect()
    try:
        if source.startswith("known."):
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS known (READ_ONLY)")
        found = con.execute(
            # the rates as text: a CSV's cast in SQL fails on the first bad value with no
            # row to name, and the caller names the row
            f"SELECT CAST(url AS VARCHAR) AS url, CAST(rate AS VARCHAR) AS rate FROM {source}"
        ).fetchnumpy()
    except duckdb.Error as e:
        first = str(e).splitlines()[0]
        raise StoreError(
            f"cannot read (url, rate) from {str(path)!r}: {first}; give a CSV with a 'url,rate' "
            "header, or a truth file of `refresher simweb --truth` (table truth_pages)"
        ) from e
    finally:
        con.close()
    urls = np.asarray(np.ma.filled(found["url"], ""), dtype=np.str_)
    text = (
        np.ma.filled(found["rate"], None) if np.ma.isMaskedArray(found["rate"]) else found["rate"]
    )
    return urls, np.array([_number(v) for v in text], dtype=np.float64)


def _number(value: object) -> float:
    """A rate as read (text from a CSV file), NaN where it is none."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
