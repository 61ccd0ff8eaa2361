"""The per-page change statistics: kept batch by batch as the history grows, filled from the
history by the migration, and equal to a plain reading of the observations."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import fetch_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refresher.store import DuckDBStore, FetchRecord, NewPage, is_success
from refresher.store._change_stats import (
    STAT_COLUMNS,
    empty_state,
    moved_statistics,
    state_of,
    statistics_from_history,
)
from refresher.store._timeline import LISTED_COLUMN, TIMELINE_COLUMNS

NOW = 1_700_000_000.0


def _pages(store: DuckDBStore, n: int) -> tuple[list[int], int]:
    rows = store.add_pages(
        [NewPage(url=f"http://a.test/{i}", host="a.test", scheme="http") for i in range(n)],
        now=NOW,
    )
    return sorted(r.id for r in rows), rows[0].host_id


def _reference(records: list[FetchRecord], page: int, meaningful: bool) -> dict[str, float]:
    """The statistics of ``page`` by reading its observations one by one."""
    ok = sorted(
        (
            r
            for r in records
            if r.page_id == page
            and is_success(r.status, not_modified=r.not_modified, error_kind=r.error_kind)
        ),
        key=lambda r: r.finished_at,
    )
    out = dict.fromkeys(("n", "time", "changes", "changed_time", "quiet_after", "untimed"), 0.0)
    out |= {"log1": 0.0, "log2": 0.0, "log3": 0.0, "lm_run": 0.0, "first_quiet": math.nan}
    if ok and ok[0].last_modified_at is not None and ok[0].finished_at > ok[0].last_modified_at:
        out["first_quiet"] = ok[0].finished_at - ok[0].last_modified_at
    for before, r in itertools.pairwise(ok):
        t = r.finished_at - before.finished_at
        if t <= 0:
            continue
        c = bool(r.meaningful if meaningful and r.meaningful is not None else r.changed)
        lm, lm0 = r.last_modified_at, before.last_modified_at
        out["n"] += 1
        out["time"] += t
        agrees = (
            lm is not None
            and lm0 is not None
            and lm <= r.finished_at + 1
            and lm0 <= before.finished_at + 1
            and (abs(lm - lm0) > 0.5) == c
            and (not c or lm > before.finished_at - 1)
        )
        out["lm_run"] = out["lm_run"] + 1 if agrees else 0.0
        if c:
            out["changes"] += 1
            out["changed_time"] += t
            if lm is None:
                out["untimed"] += 1
            else:
                out["quiet_after"] += min(max(r.finished_at - lm, 0.0), t)
            u = math.log(t)
            out["log1"] += u
            out["log2"] += u * u
            out["log3"] += u**3
    return out


fetch_kind = st.fixed_dictionaries(
    {
        "gap": st.floats(0.0, 5_000.0),
        "changed": st.booleans(),
        "meaningful": st.sampled_from([None, True, False]),
        "lm_age": st.sampled_from([None, 0.0, 3.0, 100.0, 1e5]),
        "error": st.sampled_from([None, None, None, "timeout"]),
        "status": st.sampled_from([200, 200, 200, 404]),
        "not_modified": st.booleans(),
    }
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fetches=st.lists(st.tuples(st.integers(0, 2), fetch_kind), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_statistics_kept_batch_by_batch_equal_a_plain_reading_of_the_history(
    tmp_path_factory: pytest.TempPathFactory, fetches: list, cuts: list[int]
) -> None:
    store = DuckDBStore(tmp_path_factory.mktemp("s") / "s.duckdb")
    try:
        ids, host = _pages(store, 3)
        at = NOW
        records = []
        for page, k in fetches:
            at += k["gap"]
            lm = None if k["lm_age"] is None else at - k["lm_age"]
            records.append(
                fetch_record(
                    ids[page],
                    host,
                    at,
                    changed=k["changed"],
                    meaningful=k["meaningful"],
                    last_modified_at=lm,
                    error_kind=k["error"],
                    status=304 if k["not_modified"] else k["status"],
                    not_modified=k["not_modified"],
                )
            )
        bounds = sorted({0, len(records), *(min(c, len(records)) for c in cuts)})
        for lo, hi in itertools.pairwise(bounds):
            store.write(records[lo:hi], [])
        kept = state_of(store._con, np.array(ids, dtype=np.int64))
        _, folded = statistics_from_history(store._con, np.array(ids, dtype=np.int64))
    finally:
        store.close()
    for c in STAT_COLUMNS:
        np.testing.assert_allclose(kept[c], folded[c], rtol=1e-9, err_msg=c)
    for i, page in enumerate(ids):
        for meaningful in (False, True):
            want = _reference(records, page, meaningful)
            for name, value in want.items():
                col = f"stat_{name}" + ("_m" if meaningful and name not in _COMMON else "")
                assert kept[col][i] == pytest.approx(value, rel=1e-9, nan_ok=True), (col, page)


_COMMON = {"n", "time", "first_quiet"}


def _history(store: DuckDBStore, ids: list[int], host: int) -> None:
    rng = np.random.default_rng(3)
    at = NOW
    records = []
    for _ in range(60):
        at += float(rng.exponential(100.0))
        page = ids[int(rng.integers(len(ids)))]
        changed = bool(rng.random() < 0.4)
        records.append(fetch_record(page, host, at, changed=changed, last_modified_at=at - 5.0))
    store.write(records, [])


def _downgrade(path: Path) -> None:
    """Make the store at ``path`` look like one written before the statistics (version 4)."""
    import duckdb

    con = duckdb.connect(str(path))
    try:
        for c in STAT_COLUMNS:
            con.execute(f"ALTER TABLE pages DROP COLUMN {c}")
        con.execute("DROP TABLE owed_documents")  # version 6
        for c in (*TIMELINE_COLUMNS, LISTED_COLUMN):  # version 7
            con.execute(f"ALTER TABLE pages DROP COLUMN {c}")
        con.execute("DROP TABLE sitemap_entries")
        con.execute("ALTER TABLE hosts DROP COLUMN sitemap_passed")
        con.execute("ALTER TABLE hosts DROP COLUMN sitemap_failed")
        con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    finally:
        con.close()


def test_a_store_from_before_the_statistics_gets_them_from_its_history(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = DuckDBStore(path)
    try:
        ids, host = _pages(store, 4)
        _history(store, ids, host)
        before = store.estimator_inputs(meaningful=False, links=False)
    finally:
        store.close()
    _downgrade(path)
    old = DuckDBStore(path, read_only=True)  # read-only: folded from the history on reading
    try:
        assert old.schema_version() == 4
        unmigrated = old.estimator_inputs(meaningful=False, links=False)
    finally:
        old.close()
    store = DuckDBStore(path)  # migrated: the columns filled from the history
    try:
        migrated = store.estimator_inputs(meaningful=False, links=False)
        assert store.schema_version() >= 5
    finally:
        store.close()
    assert before.stats.observations.sum() > 0
    for got in (unmigrated, migrated):
        for field in dataclasses.fields(before.stats):
            want = getattr(before.stats, field.name)
            value = getattr(got.stats, field.name)
            if value is None:  # a store without the timeline's pairs: none
                value = np.zeros_like(want)
            np.testing.assert_allclose(value, want, rtol=1e-9)


def test_only_the_statistics_some_page_moved_are_written_back_nan_equal_to_nan() -> None:
    state = empty_state(3)  # stat_last_ok and the other times NaN, the sums 0
    folded = {c: v.copy() for c, v in state.items()}
    folded["stat_last_ok"][1] = NOW
    folded["stat_changes_m"][2] = 1.0
    moved = moved_statistics(state, folded)
    assert sorted(moved) == sorted(["stat_last_ok", "stat_changes_m"])
    assert moved["stat_last_ok"] is folded["stat_last_ok"]
    assert moved_statistics(state, {c: v.copy() for c, v in state.items()}) == {}
