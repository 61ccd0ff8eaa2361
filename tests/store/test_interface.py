"""The store's interface: the one definition of success, change and due time, in Python and in
the store's SQL alike; the DuckDB service implements the protocol."""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refresher import FetchResult
from refresher.store import (
    LATE_CREDIT,
    NEVER,
    DuckDBStore,
    Store,
    StoreService,
    due_after,
    due_interval,
    is_change,
    is_success,
    next_due,
)
from refresher.store._interface import success_sql

# (status, not_modified, error_kind) → a success?
CASES = [
    (200, False, None, True),
    (204, False, None, True),
    (299, False, None, True),
    (304, True, None, True),  # a 304 to our conditional GET
    (304, False, None, False),  # a 304 we did not ask for refreshes nothing
    (200, False, "body_too_large", False),  # cut short: not a copy
    (301, False, None, False),
    (404, False, None, False),
    (500, False, None, False),
    (None, False, "connect", False),
]


@pytest.mark.parametrize(("status", "not_modified", "error_kind", "success"), CASES)
def test_success_is_one_definition_in_python_in_the_fetch_result_and_in_sql(
    status: int | None, not_modified: bool, error_kind: str | None, success: bool
) -> None:
    assert is_success(status, not_modified=not_modified, error_kind=error_kind) is success
    result = FetchResult(
        url="http://a.example/",
        final_url="http://a.example/",
        status=status,
        started_at=0.0,
        finished_at=1.0,
        duration=1.0,
        bytes=0,
        digest=None,
        body=None,
        content_type=None,
        etag=None,
        last_modified=None,
        not_modified=not_modified,
        error_kind=error_kind,
    )
    assert result.ok is success
    with duckdb.connect() as con:
        con.execute("CREATE TABLE fetches (status SMALLINT, not_modified BOOLEAN, error_kind TEXT)")
        con.execute("INSERT INTO fetches VALUES (?, ?, ?)", [status, not_modified, error_kind])
        (plain,) = con.execute(f"SELECT {success_sql()} FROM fetches").fetchall()[0]
        (aliased,) = con.execute(f"SELECT {success_sql('f')} FROM fetches f").fetchall()[0]
    assert plain is success and aliased is success


def test_a_change_is_a_successful_fetch_with_a_new_digest_and_never_a_304() -> None:
    def change(status: int | None, digest: bytes | None, previous: bytes | None, **kw: object):
        return is_change(
            status,
            not_modified=bool(kw.get("not_modified", False)),
            error_kind=kw.get("error_kind"),  # type: ignore[arg-type]
            digest=digest,
            previous=previous,
        )

    assert change(200, b"b", b"a")
    assert not change(200, b"a", b"a")
    assert not change(200, b"a", None)  # the first copy: nothing to differ from
    assert not change(304, None, b"a", not_modified=True)
    assert not change(200, None, b"a", error_kind="body_too_large")
    assert not change(500, b"b", b"a")


def test_an_interval_is_one_over_the_planned_rate_and_never_when_the_plan_gives_nothing():
    assert due_interval(0.5, 99.0) == 2.0
    assert due_interval(0.0, 99.0) == NEVER  # planned: no fetches
    assert due_interval(None, 99.0) == 99.0  # not planned yet: the uniform interval


def test_a_page_fetched_late_is_due_one_interval_after_it_was_due_up_to_half_an_interval():
    assert due_after(100.0, 10.0, 0.0) == 110.0  # on time
    assert due_after(100.0, 10.0, 3.0) == 107.0  # 3 s late: due 10 s after 97
    assert due_after(100.0, 10.0, 5.0) == 105.0  # half an interval: made up in full
    assert due_after(100.0, 10.0, 3600.0) == 105.0  # far behind: forgiven, no burst
    assert due_after(100.0, 10.0, -4.0) == 110.0  # early: owes nothing
    assert LATE_CREDIT == 0.5


def test_a_new_plan_keeps_the_lateness_a_due_time_made_up_and_never_fetched_pages_stay_due():
    due = next_due(
        np.array([10.0, 20.0, 30.0, 40.0, np.nan]),
        np.array([0.1, 0.0, 0.5, 0.2, 0.3]),
        due_at=np.array([18.0, 28.0, 37.0, 45.0, 2.0]),
        planned=np.array([0.1, 0.1, 0.1, np.nan, 0.1]),
        now=5.0,
    )
    # 2 s made up, kept; f = 0: never, 2 s still made up; a shorter interval (2 s) makes up
    # at most half of it; first planned: nothing made up; never fetched: due at its time
    assert due.tolist() == [18.0, 20.0 + NEVER - 2.0, 31.0, 45.0, 2.0]


_times = st.floats(0.0, 1e6, allow_nan=False)
_intervals = st.floats(1e-3, 1e4, allow_nan=False)
_rates = st.one_of(st.just(0.0), st.floats(1e-6, 10.0))  # fetches/s; 0: the plan gives none


@given(last=_times, interval=_intervals, late=st.floats(-1e4, 1e6, allow_nan=False))
def test_a_due_time_is_never_sooner_than_half_an_interval_after_a_fetch_nor_later_than_one(
    last: float, interval: float, late: float
) -> None:
    due = due_after(last, interval, late)
    assert last + (1 - LATE_CREDIT) * interval - 1e-6 <= due <= last + interval + 1e-6
    if 0 <= late <= LATE_CREDIT * interval:  # lateness made up in full
        assert due == pytest.approx(last - late + interval, abs=1e-6)


@given(
    interval=_intervals,
    lateness=st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=2, max_size=200),
)
def test_a_page_never_runs_above_its_planned_rate_and_keeps_it_while_half_an_interval_late(
    interval: float, lateness: list[float]
) -> None:
    # Fetch after fetch, each late by some share of the interval. Its due times stay at least
    # an interval apart, so catching up never fetches it faster than planned, however far
    # behind it fell (a host down, backing off); while no fetch is more than half an interval
    # late, the nth fetch lands within an interval of n intervals: on plan. Under "one
    # interval after the fetch" the lateness would add up instead.
    due, dues, fetched = 0.0, [0.0], []
    for share in lateness:
        at = due + share * interval
        fetched.append(at)
        due = due_after(at, interval, at - due)
        dues.append(due)
    assert all(b - a >= interval * (1 - 1e-9) for a, b in itertools.pairwise(dues))
    assert all(
        b - a >= (1 - LATE_CREDIT) * interval * (1 - 1e-9) for a, b in itertools.pairwise(fetched)
    )
    if max(lateness) <= LATE_CREDIT:
        assert fetched[-1] <= len(fetched) * interval * (1 + 1e-9)


@given(
    st.lists(
        st.tuples(_times, _rates, st.floats(0.0, 1e3)),
        min_size=1,
        max_size=30,
    )
)
def test_a_plan_that_keeps_every_rate_keeps_every_due_time(
    pages: list[tuple[float, float, float]],
) -> None:
    # A re-plan with the same f (every minute) leaves the workers' due times alone: no page
    # loses the lateness it made up.
    last = np.array([p[0] for p in pages])
    rate = np.array([p[1] for p in pages])
    late = np.array([p[2] for p in pages])
    interval = np.array([due_interval(f, 1.0) for f in rate])
    due_at = np.array([due_after(a, i, x) for a, i, x in zip(last, interval, late, strict=True)])
    again = next_due(last, rate, due_at=due_at, planned=rate, now=0.0)
    assert again == pytest.approx(due_at, rel=1e-12, abs=1e-6)


def test_the_duckdb_service_implements_the_store_interface(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        service = StoreService(store)
        assert isinstance(service, Store)
        assert not hasattr(service, "call") and not hasattr(store, "con")
    finally:
        store.close()
