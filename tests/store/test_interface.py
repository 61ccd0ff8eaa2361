"""The store's interface: the one definition of success, change and due time, in Python and in
the store's SQL alike; the DuckDB service implements the protocol."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from refresher import FetchResult
from refresher.store import (
    NEVER,
    DuckDBStore,
    Store,
    StoreService,
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


def test_a_due_time_is_one_interval_after_the_last_fetch_and_never_when_the_plan_gives_nothing():
    assert due_interval(0.5, 99.0) == 2.0
    assert due_interval(0.0, 99.0) == NEVER  # planned: no fetches
    assert due_interval(None, 99.0) == 99.0  # not planned yet: the uniform interval
    due = next_due(np.array([10.0, 20.0, np.nan]), np.array([0.1, 0.0, 0.3]), now=5.0)
    assert due.tolist() == [20.0, 20.0 + NEVER, 5.0]


def test_the_duckdb_service_implements_the_store_interface(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        service = StoreService(store)
        assert isinstance(service, Store)
        assert not hasattr(service, "call") and not hasattr(store, "con")
    finally:
        store.close()
