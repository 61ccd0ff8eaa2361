"""Per-page change statistics: the estimator's sufficient statistics, kept as fetches are recorded.

Each page row carries, for both change definitions (raw: a new digest; meaningful:
``coalesce(meaningful, changed)``), the sums :class:`refresher.store.ChangeStatistics` lists,
plus the time and Last-Modified of its last successful fetch (to pair the next one with) and
its first copy's quiet time. :func:`fold_observations` is the one definition of how fetches
update them (pure numpy, no SQL, so that every store implementation folds alike); this module
also holds the DuckDB side: reading and writing the columns in the writer's batch transaction,
and filling them from the history when a store is migrated (or read, read-only, before it was).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from refresher.store._interface import SUCCESS_SQL, ChangeStatistics, FetchRecord, is_success

__all__ = [
    "COMMON_COLUMNS",
    "ESTIMATOR_COLUMNS",
    "MIGRATION_SQL",
    "PAIR_COLUMNS",
    "PAIR_NAMES",
    "STAT_COLUMNS",
    "VARIANT_COLUMNS",
    "RecordArrays",
    "empty_state",
    "fill_from_history",
    "fold_arrays",
    "fold_observations",
    "last_modified_agrees",
    "moved_statistics",
    "pair_column",
    "read_statistics",
    "record_arrays",
    "stat_column",
    "state_of",
    "statistics_from_history",
    "write_state",
]

Float = NDArray[np.float64]
Mask = NDArray[np.bool_]
#: a batch's successful fetches as the folds take them (:func:`record_arrays`)
RecordArrays = dict[str, NDArray[Any]]

#: per page, whatever the change definition: observations, Σ t, the last successful fetch
#: (finished_at, Last-Modified; NaN before) and the first copy's quiet time (NaN if none)
COMMON_COLUMNS = ("n", "time", "last_ok", "last_lm", "first_quiet")
#: per page and change definition (see :class:`refresher.store.ChangeStatistics`)
VARIANT_COLUMNS = (
    "changes",
    "changed_time",
    "quiet_after",
    "untimed",
    "lm_run",
    "log1",
    "log2",
    "log3",
)
_NAN_COLUMNS = ("last_ok", "last_lm", "first_quiet")
#: what the estimator reads (:class:`refresher.store.ChangeStatistics`)
ESTIMATOR_COLUMNS = ("n", "time", "first_quiet", *VARIANT_COLUMNS)


def stat_column(name: str, meaningful: bool = False) -> str:
    """The column of statistic ``name`` (of :data:`COMMON_COLUMNS` or :data:`VARIANT_COLUMNS`,
    the latter for the raw or the meaningful change definition)."""
    if name in COMMON_COLUMNS:
        return f"stat_{name}"
    return f"stat_{name}_m" if meaningful else f"stat_{name}"


#: every statistics column of ``pages``
STAT_COLUMNS = tuple(stat_column(c) for c in COMMON_COLUMNS) + tuple(
    stat_column(c, m) for m in (False, True) for c in VARIANT_COLUMNS
)

#: the sitemap timeline's pairs only a trusted Last-Modified times (:mod:`._timeline`): per
#: page their count, and per change definition their changes and quiet time
PAIR_NAMES = ("n", "changes", "quiet")


def pair_column(name: str, meaningful: bool = False) -> str:
    """The column of the timeline's Last-Modified pairs' statistic ``name`` (of ``n``,
    ``changes``, ``quiet``; the latter two for the raw or the meaningful change definition)."""
    if name == "n":
        return "tl_pair_n"
    return f"tl_pair_{name}_m" if meaningful else f"tl_pair_{name}"


#: every column of those pairs (NULL until the page's first sitemap read, as the timeline's)
PAIR_COLUMNS = ("tl_pair_n", *(pair_column(c, m) for c in PAIR_NAMES[1:] for m in (False, True)))

#: the migration that adds the columns (their values: :func:`fill_from_history`)
MIGRATION_SQL = "\n".join(
    f"ALTER TABLE pages ADD COLUMN {col} DOUBLE"
    + ("" if col.removeprefix("stat_") in _NAN_COLUMNS else " NOT NULL DEFAULT 0")
    + ";"
    for col in STAT_COLUMNS
)


def last_modified_agrees(
    fetched: Float,
    previous: Float,
    last_modified: Float,
    previous_last_modified: Float,
    changed: Mask,
    *,
    tolerance: float = 1.0,
) -> Mask:
    """Per observation: do its Last-Modified values tell its change time? Both fetches had
    one, none lies in the future (beyond ``tolerance`` seconds of clock skew), the value moved
    only when the content did, and a changed page's value lies after the previous fetch.

    A changed page whose value did not move is consistent when that value lies within
    ``tolerance`` of the previous fetch: HTTP dates have whole seconds, so two changes in the
    same second, one before the previous fetch and one after it, read the same date. A host
    with pages changing about once a second shows that often, and before it made the whole
    host untrusted."""
    present = np.isfinite(last_modified) & np.isfinite(previous_last_modified)
    with np.errstate(invalid="ignore"):
        # HTTP dates have whole seconds, sitemap lastmods any precision (the timeline's points,
        # ._timeline): values less than a second apart are the same date
        moved = np.abs(last_modified - previous_last_modified) >= 1.0
        ok = (
            present
            & (last_modified <= fetched + tolerance)
            & (previous_last_modified <= previous + tolerance)
            & (changed | ~moved)
            & (~changed | (last_modified > previous - tolerance))
        )
    return np.asarray(ok, dtype=bool)


def empty_state(n: int) -> dict[str, Float]:
    """Statistics of ``n`` pages never fetched successfully."""
    return {
        c: np.full(n, np.nan if c.removeprefix("stat_") in _NAN_COLUMNS else 0.0)
        for c in STAT_COLUMNS
    }


def fold_observations(
    state: dict[str, Float],
    page_ids: NDArray[np.int64],
    page: NDArray[np.int64],
    finished: Float,
    last_modified: Float,
    changed: Mask,
    meaningful: Mask,
    pairs: Mask | None = None,
) -> dict[str, Float]:
    """The statistics of the pages ``page_ids`` (sorted, unique) after these successful
    fetches (one entry per fetch, any order; ``last_modified`` NaN where none; ``changed``
    raw, ``meaningful`` as ``coalesce(meaningful, changed)``), from ``state`` (columns of
    :data:`STAT_COLUMNS`, one entry per page of ``page_ids``; not modified).

    A fetch pairs with the page's previous successful one (in the batch or, for its first
    there, ``stat_last_ok``); a pair whose later fetch finished no later than the earlier
    is skipped, as in the history. An entry whose ``pairs`` is False (default: all True)
    observes nothing: it only starts the next pair (a point where the page's state is known
    but its change since the previous point is not)."""
    out = {c: v.copy() for c, v in state.items()}
    if page.size == 0:
        return out
    pairs = np.ones(page.size, dtype=bool) if pairs is None else np.asarray(pairs, dtype=bool)
    page, finished, lm, changed, meaningful, pairs = _by_page_then_time(
        page, finished, last_modified, changed, meaningful, pairs
    )
    variants = ((False, changed), (True, meaningful))
    same = np.zeros(page.size, dtype=bool)
    same[1:] = page[1:] == page[:-1]
    starts = np.flatnonzero(~same)  # each page's first fetch here
    runs = np.diff(np.append(starts, page.size))
    slot = np.repeat(np.searchsorted(page_ids, page[starts]), runs)
    if not (slot < page_ids.size).all() or not (page_ids[slot] == page).all():
        raise ValueError("every fetch's page must be among page_ids")
    k = page_ids.size
    prev = np.where(same, np.roll(finished, 1), state["stat_last_ok"][slot])
    prev_lm = np.where(same, np.roll(lm, 1), state["stat_last_lm"][slot])
    # the first successful fetch ever: its Last-Modified opens a quiet interval
    first = ~same & ~np.isfinite(prev)
    with np.errstate(invalid="ignore"):
        quiet = first & np.isfinite(lm) & (finished > lm)
    out["stat_first_quiet"][slot[quiet]] = (finished - lm)[quiet]
    with np.errstate(invalid="ignore"):
        obs = np.isfinite(prev) & (finished > prev) & pairs
    last = np.ones(page.size, dtype=bool)
    last[:-1] = page[:-1] != page[1:]
    later = ~(state["stat_last_ok"][slot[last]] > finished[last])  # never move back in time
    out["stat_last_ok"][slot[last][later]] = finished[last][later]
    out["stat_last_lm"][slot[last][later]] = lm[last][later]
    if not obs.any():
        return out
    s, t = slot[obs], (finished - prev)[obs]
    at, before, lm_o, lm_b = finished[obs], prev[obs], lm[obs], prev_lm[obs]
    out["stat_n"] += np.bincount(s, minlength=k)
    out["stat_time"] += np.bincount(s, t, minlength=k)
    timed = np.isfinite(lm_o)
    after = np.where(timed, np.minimum(np.maximum(at - np.where(timed, lm_o, 0.0), 0.0), t), 0.0)
    u = np.log(t)
    first_obs = np.ones(s.size, dtype=bool)
    first_obs[1:] = s[1:] != s[:-1]
    begin = np.flatnonzero(first_obs)
    # 0-based rank of each observation among its page's
    rank = np.arange(s.size) - np.repeat(begin, np.diff(np.append(begin, s.size)))
    count = np.bincount(s, minlength=k)
    for m, cc in variants:
        c = cc[obs]
        sums = {
            "changes": c,
            "changed_time": np.where(c, t, 0.0),
            "quiet_after": np.where(c, after, 0.0),
            "untimed": c & ~timed,
            "log1": np.where(c, u, 0.0),
            "log2": np.where(c, u * u, 0.0),
            "log3": np.where(c, u * u * u, 0.0),
        }
        for name, values in sums.items():
            out[stat_column(name, m)] += np.bincount(s, values, minlength=k)
        # the run of observations since the last whose Last-Modified disagreed
        bad = ~last_modified_agrees(at, before, lm_o, lm_b, c)
        last_bad = np.full(k, -1)
        np.maximum.at(last_bad, s[bad], rank[bad])
        run = stat_column("lm_run", m)
        out[run] = np.where(last_bad >= 0, count - 1 - last_bad, out[run] + count)
    return out


def _by_page_then_time(page: NDArray[np.int64], finished: Float, *columns: Any) -> tuple[Any, ...]:
    """The fetches' columns ordered by page, then finish time (the migration and most batches
    read them so already: then as they are)."""
    step, later = page[1:] - page[:-1], finished[1:] >= finished[:-1]
    if bool(((step > 0) | ((step == 0) & later)).all()):
        return (page, finished, *columns)
    order = np.lexsort((finished, page))
    return (page[order], finished[order], *(c[order] for c in columns))


def record_arrays(records: Sequence[FetchRecord]) -> RecordArrays:
    """The successful ones of ``records`` as the folds take them: ``page``, ``host``,
    ``finished``, ``last_modified`` (NaN where none), ``changed`` and ``meaningful``
    (``coalesce(meaningful, changed)``)."""
    ok = [
        r
        for r in records
        if is_success(r.status, not_modified=r.not_modified, error_kind=r.error_kind)
    ]
    return {
        "page": np.array([r.page_id for r in ok], dtype=np.int64),
        "host": np.array([r.host_id for r in ok], dtype=np.int64),
        "finished": np.array([r.finished_at for r in ok], dtype=np.float64),
        "last_modified": np.array(
            [np.nan if r.last_modified_at is None else r.last_modified_at for r in ok],
            dtype=np.float64,
        ),
        "changed": np.array([r.changed for r in ok], dtype=bool),
        "meaningful": np.array(
            [r.changed if r.meaningful is None else r.meaningful for r in ok], dtype=bool
        ),
    }


def fold_arrays(
    state: dict[str, Float], page_ids: NDArray[np.int64], a: RecordArrays
) -> dict[str, Float]:
    """:func:`fold_observations` over a batch's successful fetches, as :func:`record_arrays`
    gives them (computed once a batch: the sitemap timeline's folds take the same)."""
    return fold_observations(
        state,
        page_ids,
        a["page"],
        a["finished"],
        a["last_modified"],
        a["changed"],
        a["meaningful"],
    )


def state_of(
    con: Any, page_ids: NDArray[np.int64], columns: Sequence[str] = STAT_COLUMNS
) -> dict[str, Float]:
    """The stored ``columns`` (NaN for NULL) of ``page_ids`` (sorted, unique; all must
    exist)."""
    _stat_ids = {"id": page_ids}  # scanned by name (DuckDB's replacement scan)
    got = con.execute(
        f"SELECT {', '.join(_read(c) for c in columns)} FROM pages"
        " SEMI JOIN _stat_ids ON pages.id = _stat_ids.id ORDER BY pages.id"
    ).fetchnumpy()
    return {c: np.asarray(got[c], dtype=np.float64) for c in columns}


def moved_statistics(state: dict[str, Float], folded: dict[str, Float]) -> dict[str, Float]:
    """The columns of ``folded`` that differ from ``state`` for some page (NaN equals NaN):
    the only ones a batch has to write back."""
    return {c: v for c, v in folded.items() if not np.array_equal(v, state[c], equal_nan=True)}


def _read(column: str) -> str:
    return f"coalesce({column}, 'NaN'::DOUBLE) AS {column}"


def statistics_from_history(
    con: Any, page_ids: NDArray[np.int64] | None = None
) -> tuple[NDArray[np.int64], dict[str, Float]]:
    """The statistics folded from the stored history, for ``page_ids`` (default: every page);
    (page ids sorted, columns)."""
    if page_ids is None:
        page_ids = np.asarray(
            con.execute("SELECT id FROM pages ORDER BY id").fetchnumpy()["id"], dtype=np.int64
        )
    state = empty_state(page_ids.size)
    if page_ids.size == 0:
        return page_ids, state
    con.register("_stat_ids", {"id": page_ids})
    try:
        rows = con.execute(
            f"""
            SELECT page_id, finished_at, coalesce(last_modified_at, 'NaN'::DOUBLE) AS lm,
                   changed, coalesce(meaningful, changed) AS meaningful
            FROM fetches SEMI JOIN _stat_ids ON fetches.page_id = _stat_ids.id
            WHERE {SUCCESS_SQL}
            -- fetches finished at the same time pair in the order they were recorded (id),
            -- as the batches folded them: a sort without it may put them either way
            ORDER BY page_id, finished_at, id
            """
        ).fetchnumpy()
    finally:
        con.unregister("_stat_ids")
    return page_ids, fold_observations(
        state,
        page_ids,
        np.asarray(rows["page_id"], dtype=np.int64),
        np.asarray(rows["finished_at"], dtype=np.float64),
        np.asarray(rows["lm"], dtype=np.float64),
        np.asarray(rows["changed"], dtype=bool),
        np.asarray(rows["meaningful"], dtype=bool),
    )


def write_state(con: Any, page_ids: NDArray[np.int64], state: dict[str, Float]) -> None:
    """Store the statistics of ``page_ids`` (inside the caller's transaction)."""
    con.register("_stat", {"id": page_ids, **state})
    try:
        sets = ", ".join(f"{c} = _stat.{c}" for c in STAT_COLUMNS)
        con.execute(f"UPDATE pages SET {sets} FROM _stat WHERE pages.id = _stat.id")
    finally:
        con.unregister("_stat")


def fill_from_history(con: Any, *, chunk: int = 1 << 20) -> None:
    """The migration's second half: every page's statistics from its stored history, in
    chunks of pages holding about ``chunk`` fetches."""
    got = con.execute("SELECT id, fetches FROM pages WHERE fetches > 0 ORDER BY id").fetchnumpy()
    ids = np.asarray(got["id"], dtype=np.int64)
    fetches = np.asarray(got["fetches"], dtype=np.int64)
    start = 0
    cum = np.cumsum(fetches)
    while start < ids.size:
        base = cum[start - 1] if start else 0
        end = max(int(np.searchsorted(cum, base + chunk, side="right")), start + 1)
        page_ids, state = statistics_from_history(con, ids[start:end])
        write_state(con, page_ids, state)
        start = end


def read_statistics(columns: dict[str, Any], *, meaningful: bool) -> ChangeStatistics:
    """:class:`ChangeStatistics` from the columns of a query (read with NaN for NULL; the
    timeline's Last-Modified pairs where the query has their columns, :func:`pair_column`)."""

    def col(name: str) -> Float:
        return np.asarray(columns[stat_column(name, meaningful)], dtype=np.float64)

    def pair(name: str) -> Float | None:
        column = pair_column(name, meaningful)
        return np.asarray(columns[column], dtype=np.float64) if column in columns else None

    return ChangeStatistics(
        paired=pair("n"),
        paired_changes=pair("changes"),
        paired_quiet=pair("quiet"),
        observations=col("n"),
        time=col("time"),
        changes=col("changes"),
        changed_time=col("changed_time"),
        quiet_after=col("quiet_after"),
        untimed=col("untimed"),
        lm_run=col("lm_run"),
        log_moments=np.stack([col("log1"), col("log2"), col("log3")]),
        first_quiet=col("first_quiet"),
    )
