"""Sitemap ``<lastmod>`` values as change observations: each page's one timeline of fetches and
sitemap reads, kept beside its fetch-only statistics, and the per-host trust test of the reads.

The form is the offline model's (:func:`analysis.model._timeline`,
:func:`analysis.model.sitemap_checks`). A sitemap read is a point of the page's timeline: it
observes (previous point, read], changed when its lastmod lies after the previous point, and
the lastmod is its Last-Modified. A fetch after reads observes (last read, fetch] only when the
reads since the previous fetch said unchanged (the last read's lastmod is not after the
previous fetch: the content's change, if any, lies after the last read); otherwise it observes
nothing and only starts the next pair (:func:`fold_observations`' ``pairs``), so no span counts
twice: the rule that holds on every host.

The model also pairs a read with a fetch whose own Last-Modified is honest: the page's first
fetch after a read, or one after reads that said "changed", observes (last read, fetch],
changed when its Last-Modified lies after the read. Whether a host's Last-Modified is honest
the estimator decides host-wide at read time (over its window), so the fold keeps these pairs
apart, in five sums of their own (:data:`PAIR_COLUMNS`: their count, and per change
definition their changes and quiet time), and the estimator adds them to the pages whose
changes it times (:func:`refresher.refresh._estimate_stats.evidence`). On the other hosts they
change nothing.

The timeline's sums are the columns of :data:`STAT_COLUMNS` renamed ``tl_…``
(:func:`timeline_column`), three of its own (:data:`EXTRA_COLUMNS`) and the Last-Modified
pairs'. They stay NULL until a page is first listed by a sitemap read, when they start as a
copy of the fetch-only ones (the pairs' at 0): a page never listed costs nothing, and the
estimator reads them (instead of the fetch-only sums) for listed pages of hosts that pass
the trust test, which can change after the fold.

The trust test, per host, checks each read against what the page's own fetches showed, with
bounded per-page state (no scan of the history): a lastmod after its read fails; a read that
says the page changed after its last fetch (a claim, pending until the next fetch) fails when
that next fetch finds the same digest (a lastmod that moves without the content: a serve-time
stamp); a read after a fetch that found a meaningful change fails when its lastmod lies before
the fetch before that one (a lastmod that stays while the content moves: a build time). A
host's reads count once some check passed and none failed (``hosts.sitemap_passed``,
``sitemap_failed``), the model's rule. The two checks take the lenient change definition each
(any new digest is a change seen; only a meaningful change demands a later lastmod), so a page
with a clock in its body does not fail an honest host.

Pure numpy; the stores read and write the columns in their own transactions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from refresher.store._change_stats import (
    PAIR_COLUMNS,
    STAT_COLUMNS,
    RecordArrays,
    fold_observations,
    pair_column,
    stat_column,
)

__all__ = [
    "BATCH_COLUMNS",
    "EXTRA_COLUMNS",
    "LISTED_COLUMN",
    "SITEMAP_SINCE_SQL",
    "TIMELINE_COLUMNS",
    "TOLERANCE",
    "TRUSTED_SQL",
    "TrustCounts",
    "estimator_column_sql",
    "fold_fetch_arrays",
    "fold_fetch_points",
    "fold_read_points",
    "pair_migration_sql",
    "timeline_column",
    "timeline_migration_sql",
    "unchanged_reads",
]

Float = NDArray[np.float64]
Mask = NDArray[np.bool_]

#: seconds: lastmods are whole seconds (W3C datetimes), and clocks differ a little
TOLERANCE = 1.0


def timeline_column(column: str) -> str:
    """The timeline's column of the fetch-only statistics column ``column``."""
    return "tl_" + column.removeprefix("stat_")


#: the timeline's own state: whether its last point is a sitemap read (1.0 or 0.0), the end
#: of the fetch before the page's last fetch (NaN: unknown) and whether that last fetch found
#: a meaningful change (1.0 or 0.0), for the trust test
EXTRA_COLUMNS = ("tl_read", "tl_prev_ok", "tl_moved")
#: the timeline columns schema version 7 added (DuckDB; 5 on PostgreSQL)
_FIRST_COLUMNS = tuple(timeline_column(c) for c in STAT_COLUMNS) + EXTRA_COLUMNS
#: every timeline column of ``pages`` (NULL until the page's first sitemap read), the
#: Last-Modified pairs' (:data:`PAIR_COLUMNS`, version 8; 6) last
TIMELINE_COLUMNS = _FIRST_COLUMNS + PAIR_COLUMNS


#: per sitemap page: the entries its last read listed (NULL: none), which an unchanged
#: re-read repeats (``sitemap_entries``)
LISTED_COLUMN = "sitemap_listed"
#: what a batch of fetches reads of all its pages: the fetch-only statistics, whether the page
#: has a timeline (``tl_n``; the rest of it is read for those pages alone: reading every
#: timeline column of every page cost DuckDB 1.7 ms a batch of 50, 14 %) and its entries
BATCH_COLUMNS = (*STAT_COLUMNS, "tl_n", LISTED_COLUMN)


def timeline_migration_sql(
    double: str = "DOUBLE", integer: str = "INTEGER", bigint: str = "BIGINT"
) -> str:
    """The migration that adds the timeline's columns, the hosts' trust counts and each
    sitemap's entries of its last read (nothing to fill: no read was folded before it)."""
    lines = [f"ALTER TABLE pages ADD COLUMN {c} {double};" for c in _FIRST_COLUMNS]
    lines.append(f"ALTER TABLE pages ADD COLUMN {LISTED_COLUMN} {double};")
    lines += [
        f"ALTER TABLE hosts ADD COLUMN {c} {integer} NOT NULL DEFAULT 0;"
        for c in ("sitemap_passed", "sitemap_failed")
    ]
    lines.append(
        f"CREATE TABLE sitemap_entries (sitemap_id {bigint} NOT NULL, page_id {bigint} NOT NULL,"
        f" lastmod {double} NOT NULL, PRIMARY KEY (sitemap_id, page_id));"
    )
    return "\n".join(lines)


def pair_migration_sql(double: str = "DOUBLE") -> str:
    """The migration that adds the timeline's Last-Modified pairs (:data:`PAIR_COLUMNS`):
    zero for the pages that have a timeline (their pairs before it are not known: the first
    fetches after a read were folded as the start of a pair)."""
    lines = [f"ALTER TABLE pages ADD COLUMN {c} {double};" for c in PAIR_COLUMNS]
    zero = ", ".join(f"{c} = 0" for c in PAIR_COLUMNS)
    lines.append(f"UPDATE pages SET {zero} WHERE tl_n IS NOT NULL;")
    return "\n".join(lines)


def unchanged_reads(
    page_ids: NDArray[np.int64], listed: Float, a: RecordArrays
) -> list[tuple[int, float]]:
    """(sitemap page, read time) of the successful fetches ``a`` (:func:`record_arrays`) that
    found a sitemap page's body unchanged (``listed``: its entries of the last read, per page
    of ``page_ids``, NaN none): they read the same lastmods again, each a point of the listed
    pages' timelines. (A changed body reaches the store as a document, with its new
    lastmods.)"""
    has = np.isfinite(listed) & (listed > 0)
    if not has.any():
        return []
    again = ~a["changed"] & np.isin(a["page"], page_ids[has])
    return sorted(zip(a["page"][again].tolist(), a["finished"][again].tolist(), strict=True))


#: the hosts whose sitemap lastmods count (alias ``h``), the model's rule
TRUSTED_SQL = "(h.sitemap_passed > 0 AND h.sitemap_failed = 0)"


#: per page (aliases ``p``, ``h``): when a sitemap page of a host not found untrusted was
#: found, else NULL (:attr:`refresher.store.EstimatorInputs.sitemap_since`); not for a
#: sitemap whose last read listed no point (its lastmods all coarser than the second, or of
#: other hosts): reading it again on its own schedule would tell nothing
SITEMAP_SINCE_SQL = (
    "CASE WHEN p.source = 'sitemap' AND h.sitemap_failed = 0"
    f" AND coalesce(p.{LISTED_COLUMN}, 1) > 0 THEN p.first_seen END"
)


def estimator_column_sql(column: str) -> str:
    """The SQL (aliases ``p`` pages, ``h`` hosts) of one estimator column: the timeline's where
    the page has one and its host is trusted, else the fetch-only one; of a column of
    :data:`PAIR_COLUMNS`, the timeline's there and 0 elsewhere.

    A sitemap page's run of consistent Last-Modified values is all its observations: its
    fetches take no part in the host's Last-Modified test. A sitemap is a list, often made
    as it is served and sent without Last-Modified (as the simulated web does), and one
    such page in the estimator's window distrusted the host's Last-Modified for every page
    of it (the test is host-wide)."""
    listed = f"p.tl_n IS NOT NULL AND {TRUSTED_SQL}"
    if column in PAIR_COLUMNS:
        return f"CASE WHEN {listed} THEN coalesce(p.{column}, 0) ELSE 0 END"
    sitemap = f"WHEN p.source = 'sitemap' THEN p.{stat_column('n')} " if "lm_run" in column else ""
    return f"CASE {sitemap}WHEN {listed} THEN p.{timeline_column(column)} ELSE p.{column} END"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustCounts:
    """Checks of the trust test a fold made, per host: ``host_ids`` (unique) with the checks
    that ``passed`` and ``failed``."""

    host_ids: NDArray[np.int64]
    passed: NDArray[np.int64]
    failed: NDArray[np.int64]

    @staticmethod
    def none() -> TrustCounts:
        empty = np.zeros(0, dtype=np.int64)
        return TrustCounts(host_ids=empty, passed=empty, failed=empty)

    @staticmethod
    def of(host: NDArray[np.int64], passed: Mask, failed: Mask) -> TrustCounts:
        checked = passed | failed
        ids, inverse = np.unique(host[checked], return_inverse=True)
        return TrustCounts(
            host_ids=ids.astype(np.int64),
            passed=np.bincount(inverse, passed[checked], minlength=ids.size).astype(np.int64),
            failed=np.bincount(inverse, failed[checked], minlength=ids.size).astype(np.int64),
        )


def _view(state: dict[str, Float]) -> dict[str, Float]:
    """The timeline's sums under the fetch-only names, as :func:`fold_observations` takes."""
    return {c: state[timeline_column(c)] for c in STAT_COLUMNS}


def _store(out: dict[str, Float], folded: dict[str, Float]) -> None:
    for c, v in folded.items():
        out[timeline_column(c)] = v


def fold_read_points(
    state: dict[str, Float],
    page_ids: NDArray[np.int64],
    page: NDArray[np.int64],
    host: NDArray[np.int64],
    read_at: float,
    lastmod: Float,
) -> tuple[dict[str, Float], TrustCounts]:
    """The pages' columns (fetch-only and timeline, one entry per page of ``page_ids``, sorted
    and unique; not modified) after one sitemap read that finished at ``read_at`` (unix
    seconds) and listed ``page`` (unique, each among ``page_ids``, on ``host``) with these
    lastmods; and the trust test's checks of the read.

    A page listed for the first time starts its timeline as a copy of its fetch-only
    statistics. A read no later than the page's last point is left out (it reached the store
    after a later fetch)."""
    out = {c: v.copy() for c, v in state.items()}
    if page.size == 0:
        return out, TrustCounts.none()
    slot = np.searchsorted(page_ids, page)
    new = ~np.isfinite(out["tl_n"][slot])
    for c in STAT_COLUMNS:
        out[timeline_column(c)][slot[new]] = out[c][slot[new]]
    out["tl_read"][slot[new]] = 0.0
    out["tl_prev_ok"][slot[new]] = np.nan
    out["tl_moved"][slot[new]] = 0.0
    for c in PAIR_COLUMNS:
        out[c][slot[new]] = 0.0
    last_point = out[timeline_column("stat_last_ok")][slot]
    with np.errstate(invalid="ignore"):
        newer = ~(last_point >= read_at)
        failed = newer & (lastmod > read_at + TOLERANCE)
        # the last fetch, before this read, found a meaningful change: the page changed after
        # the fetch before it, and an honest lastmod says so
        prev = out["tl_prev_ok"][slot]
        moved = (out["tl_moved"][slot] == 1.0) & np.isfinite(prev)
        moved &= out["stat_last_ok"][slot] < read_at
        failed |= newer & moved & (lastmod < prev - TOLERANCE)
        passed = newer & moved & ~failed
        changed = lastmod > last_point
    at = np.full(page.size, read_at)
    folded = fold_observations(
        _view(out), page_ids, page[newer], at[newer], lastmod[newer], changed[newer], changed[newer]
    )
    _store(out, folded)
    out["tl_read"][slot[newer]] = 1.0
    return out, TrustCounts.of(host, passed, failed)


def fold_fetch_points(
    state: dict[str, Float],
    page_ids: NDArray[np.int64],
    page: NDArray[np.int64],
    host: NDArray[np.int64],
    finished: Float,
    last_modified: Float,
    changed: Mask,
    meaningful: Mask,
) -> tuple[dict[str, Float], TrustCounts]:
    """The timeline columns after these successful fetches (as :func:`fold_observations` takes
    them, with each fetch's ``host``), from ``state`` holding the fetch-only columns as they
    were *before* these fetches; and the trust test's checks of the pages' pending claims.
    Pages without a timeline (``tl_n`` NaN) are left as they are."""
    out = {c: v.copy() for c, v in state.items()}
    if page.size == 0:
        return out, TrustCounts.none()
    order = np.lexsort((finished, page))
    page, host, finished = page[order], host[order], finished[order]
    lm, changed, meaningful = last_modified[order], changed[order], meaningful[order]
    slot = np.searchsorted(page_ids, page)
    keep = np.isfinite(out["tl_n"][slot])
    if not keep.any():
        return out, TrustCounts.none()
    page, host, finished, lm = page[keep], host[keep], finished[keep], lm[keep]
    changed, meaningful, slot = changed[keep], meaningful[keep], slot[keep]
    same = np.zeros(page.size, dtype=bool)
    same[1:] = page[1:] == page[:-1]
    # the page's previous fetch: in the batch, or the last one before it
    prev = np.where(same, np.roll(finished, 1), out["stat_last_ok"][slot])
    last_point = out[timeline_column("stat_last_ok")][slot]
    with np.errstate(invalid="ignore"):
        after_read = ~same & (out["tl_read"][slot] == 1.0) & (finished > last_point)
        # the reads since the previous fetch said the page changed after it
        claim = after_read & (out[timeline_column("stat_last_lm")][slot] > prev)
    pairs = ~after_read | (np.isfinite(prev) & ~claim)
    folded = fold_observations(_view(out), page_ids, page, finished, lm, changed, meaningful, pairs)
    _store(out, folded)
    _fold_pairs(out, slot, after_read & ~pairs, last_point, finished, lm, changed, meaningful, prev)
    last = np.ones(page.size, dtype=bool)
    last[:-1] = page[:-1] != page[1:]
    with np.errstate(invalid="ignore"):
        moved_on = last & ~(last_point > finished)  # never move back in time
    out["tl_read"][slot[moved_on]] = 0.0
    out["tl_prev_ok"][slot[moved_on]] = prev[moved_on]
    out["tl_moved"][slot[moved_on]] = meaningful[moved_on].astype(np.float64)
    return out, TrustCounts.of(host, claim & changed, claim & ~changed)


def _fold_pairs(
    out: dict[str, Float],
    slot: NDArray[np.intp],
    unpaired: Mask,
    read_at: Float,
    finished: Float,
    lm: Float,
    changed: Mask,
    meaningful: Mask,
    prev: Float,
) -> None:
    """Add to :data:`PAIR_COLUMNS` (in place) the pairs (last read, fetch] of the ``unpaired``
    fetches (a page's first, or one after reads that said "changed") that have a
    Last-Modified: changed when it lies after the read (then also against the previous fetch,
    if any, by the change definition), its quiet time as :func:`fold_observations` counts it
    for a timed change. What the offline model folds on a host whose Last-Modified is honest;
    the estimator adds them where a page's changes are timed, so the fold needs no verdict."""
    with np.errstate(invalid="ignore"):
        use = unpaired & np.isfinite(lm)
    if not use.any():
        return
    s, r, at, lm = slot[use], read_at[use], finished[use], lm[use]
    t = at - r
    with np.errstate(invalid="ignore"):
        moved = lm > r
    first = ~np.isfinite(prev[use])
    after = np.minimum(np.maximum(at - lm, 0.0), t)
    n = pair_column("n")
    out[n][s] = np.nan_to_num(out[n][s]) + 1.0  # one such pair per page in a batch
    for m, content in ((False, changed[use]), (True, meaningful[use])):
        c = moved & (content | first)
        for name, value in (("changes", c.astype(np.float64)), ("quiet", np.where(c, after, t))):
            column = pair_column(name, m)
            out[column][s] = np.nan_to_num(out[column][s]) + value


def fold_fetch_arrays(
    state: dict[str, Float], page_ids: NDArray[np.int64], a: RecordArrays
) -> tuple[dict[str, Float], TrustCounts]:
    """:func:`fold_fetch_points` over the fetches ``a`` (:func:`record_arrays`, the batch's
    one copy) of ``page_ids`` (others left out)."""
    ours = np.isin(a["page"], page_ids)
    return fold_fetch_points(
        state,
        page_ids,
        a["page"][ours],
        a["host"][ours],
        a["finished"][ours],
        a["last_modified"][ours],
        a["changed"][ours],
        a["meaningful"][ours],
    )
