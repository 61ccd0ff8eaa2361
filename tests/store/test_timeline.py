"""Sitemap reads as points of a page's one timeline (the offline model's fold), kept beside the
fetch-only statistics, and the per-host trust test of the reads from per-page state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from conftest import fetch_record
from hypothesis import given
from hypothesis import strategies as st

from refresher.refresh._estimate_stats import evidence
from refresher.store import DocumentUpdate, DuckDBStore, NewPage
from refresher.store._change_stats import (
    PAIR_COLUMNS,
    STAT_COLUMNS,
    empty_state,
    fold_observations,
    pair_column,
    stat_column,
)
from refresher.store._pg_leases import PgLeases
from refresher.store._pg_schema import init_fleet
from refresher.store._postgres import PgStore
from refresher.store._timeline import (
    TIMELINE_COLUMNS,
    fold_fetch_points,
    fold_read_points,
    timeline_column,
)

HOST = 7
NOW = 1_700_000_000.0
# one event: ("fetch", gap, changed, meaningful, Last-Modified back from it or None)
# or ("read", gap, lastmod back from the read)
_FETCH = st.tuples(
    st.just("fetch"),
    st.floats(0.5, 50.0),
    st.booleans(),
    st.booleans(),
    st.none() | st.floats(0.0, 100.0),
)
_READ = st.tuples(st.just("read"), st.floats(0.5, 50.0), st.floats(-2.0, 100.0))


def _state(n: int = 1) -> dict[str, np.ndarray]:
    state = empty_state(n)
    state |= {c: np.full(n, np.nan) for c in TIMELINE_COLUMNS}
    return state


def _one(value: float | bool, dtype: type = np.float64) -> np.ndarray:
    return np.array([value], dtype=dtype)


def _fetch(state: dict[str, np.ndarray], at: float, changed: bool, **kw: object) -> dict:
    """One successful fetch of page 0 folded as a store's batch folds it: the timeline from
    the fetch-only state before the fetch, then the fetch-only statistics."""
    lm = kw.get("lm")
    meaningful = bool(kw.get("meaningful", changed))
    ids, page = np.array([0]), np.array([0])
    args = (_one(at), _one(np.nan if lm is None else lm), _one(changed, bool))
    out, counts = fold_fetch_points(
        state, ids, page, np.array([HOST]), *args, _one(meaningful, bool)
    )
    fetch_only = fold_observations(
        {c: state[c] for c in STAT_COLUMNS}, ids, page, *args, _one(meaningful, bool)
    )
    out |= fetch_only
    out["_passed"] = _one(float(counts.passed.sum()))
    out["_failed"] = _one(float(counts.failed.sum()))
    return out


def _read(state: dict[str, np.ndarray], at: float, lastmod: float) -> dict:
    ids = np.array([0])
    out, counts = fold_read_points(state, ids, ids, np.array([HOST]), at, _one(lastmod))
    out["_passed"] = _one(float(counts.passed.sum()))
    out["_failed"] = _one(float(counts.failed.sum()))
    return out


def _reference(events: list[tuple], *, honest: bool = False) -> dict[str, np.ndarray]:
    """The model's timeline of the events (``analysis.model._timeline``), folded at once: on
    a host whose Last-Modified the fold does not know to be honest, or (``honest``, every
    fetch has one) on one whose Last-Modified is honest, where a fetch after reads pairs
    with the last read also when it is the page's first or the reads said "changed",
    changed when its Last-Modified lies after the read (and, by each definition, since its
    previous fetch if any)."""
    at, lm, changed, meaningful, pairs = [], [], [], [], []
    prior_fetch = -1
    for j, (kind, t, *rest) in enumerate(events):
        at.append(t)
        if kind == "read":
            lm.append(rest[0])
            c = j > 0 and rest[0] > at[j - 1]
            changed.append(c)
            meaningful.append(c)
            pairs.append(True)
            continue
        c, m, fetch_lm = rest
        lm.append(np.nan if fetch_lm is None else fetch_lm)
        pairs.append(True)
        if j > 0 and events[j - 1][0] == "read":
            told = prior_fetch >= 0 and not lm[j - 1] > at[prior_fetch]
            if honest and not told:
                first = prior_fetch < 0
                c, m = (fetch_lm > at[j - 1] and (x or first) for x in (c, m))
            pairs[j] = honest or told
        changed.append(c)
        meaningful.append(m)
        prior_fetch = j
    n = len(at)
    return fold_observations(
        empty_state(1),
        np.array([0]),
        np.zeros(n, dtype=np.int64),
        np.array(at),
        np.array(lm),
        np.array(changed),
        np.array(meaningful),
        np.array(pairs),
    )


def _fold_drawn(drawn: list[tuple]) -> tuple[dict[str, np.ndarray], list[tuple]]:
    """The drawn events folded one at a time as a store folds them, and the events at their
    times: ("read", at, lastmod) or ("fetch", at, changed, meaningful, Last-Modified)."""
    state, clock, events = _state(), 1000.0, []
    for event in drawn:
        clock += event[1]
        if event[0] == "read":
            lastmod = clock - event[2]
            events.append(("read", clock, lastmod))
            state = _read(state, clock, lastmod)
        else:
            _, _, changed, meaningful, back = event
            lm = None if back is None else clock - back
            events.append(("fetch", clock, changed, meaningful, lm))
            state = _fetch(state, clock, changed, meaningful=meaningful, lm=lm)
    return state, events


@given(st.lists(st.one_of(_FETCH, _READ), min_size=1, max_size=12))
def test_reads_and_fetches_folded_one_at_a_time_equal_the_models_timeline_folded_at_once(
    drawn: list[tuple],
) -> None:
    state, events = _fold_drawn(drawn)
    if not any(e[0] == "read" for e in events):
        assert np.isnan(state["tl_n"]).all()  # never listed: no timeline at all
        return
    want = _reference(events)
    for c in STAT_COLUMNS:
        np.testing.assert_allclose(state[timeline_column(c)], want[c], rtol=1e-9, err_msg=c)


@given(st.lists(st.one_of(_FETCH.filter(lambda e: e[4] is not None), _READ), max_size=12))
def test_the_timeline_with_its_last_modified_pairs_equals_the_models_on_an_honest_host(
    drawn: list[tuple],
) -> None:
    # what the estimator reads of a page whose changes are timed: observations, changes and
    # quiet time (Σ t − changed time + quiet after the changes), by each change definition
    state, events = _fold_drawn(drawn)
    if not any(e[0] == "read" for e in events):
        return
    want = _reference(events, honest=True)
    np.testing.assert_allclose(state["tl_n"] + state["tl_pair_n"], want["stat_n"])
    for m in (False, True):
        got_quiet = state[timeline_column(stat_column("time"))] + state[pair_column("quiet", m)]
        got_quiet += state[timeline_column(stat_column("quiet_after", m))]
        got_quiet -= state[timeline_column(stat_column("changed_time", m))]
        quiet = want["stat_time"] - want[stat_column("changed_time", m)]
        quiet += want[stat_column("quiet_after", m)]
        np.testing.assert_allclose(got_quiet, quiet, rtol=1e-9, atol=1e-9)
        got = state[timeline_column(stat_column("changes", m))] + state[pair_column("changes", m)]
        np.testing.assert_allclose(got, want[stat_column("changes", m)])
        assert state[timeline_column(stat_column("untimed", m))][0] == 0
    for c in ("stat_last_ok", "stat_last_lm", "stat_first_quiet"):
        np.testing.assert_allclose(state[timeline_column(c)], want[c], err_msg=c)


def test_a_first_fetch_after_a_read_pairs_with_it_by_its_last_modified() -> None:
    state = _read(_state(), 100.0, 50.0)
    state = _fetch(state, 110.0, True, lm=105.0)  # changed at 105, after the read
    assert state["tl_n"][0] == 0  # the fetch-only rule: it only starts the next pair
    assert (state["tl_pair_n"][0], state["tl_pair_changes"][0]) == (1, 1)
    assert state["tl_pair_quiet"][0] == 5.0  # (105, 110]
    quiet = _fetch(_read(_state(), 100.0, 50.0), 110.0, True, lm=50.0)
    assert (quiet["tl_pair_changes"][0], quiet["tl_pair_quiet"][0]) == (0, 10.0)
    no_lm = _fetch(_read(_state(), 100.0, 50.0), 110.0, True)
    assert no_lm["tl_pair_n"][0] == 0


def test_a_lastmod_to_the_millisecond_agrees_with_the_http_date_of_the_same_change() -> None:
    # changed at 105.7: the fetch at 110 reads Last-Modified 105 (whole seconds), the read
    # at 120 the lastmod 105.7; the host's Last-Modified stays trusted on the timeline
    state = _fetch(_read(_state(), 90.0, 50.0), 100.0, False, lm=50.0)
    state = _fetch(state, 110.0, True, lm=105.0)
    state = _fetch(_read(state, 120.0, 105.7), 130.0, False, lm=105.0)
    assert state["tl_n"][0] == 3
    assert state["tl_lm_run"][0] == state["tl_n"][0]


def test_a_fetch_after_reads_that_said_changed_pairs_by_its_last_modified() -> None:
    state = _read(_fetch(_state(), 100.0, False, lm=90.0), 120.0, 115.0)  # changed at 115
    again = _fetch(state, 130.0, True, lm=125.0)  # and again at 125
    assert (again["tl_pair_n"][0], again["tl_pair_changes_m"][0]) == (1, 1)
    assert again["tl_pair_quiet"][0] == 5.0
    # the content did not change meaningfully since the fetch at 100: nor after the read
    clock = _fetch(state, 130.0, True, meaningful=False, lm=125.0)
    assert (clock["tl_pair_changes"][0], clock["tl_pair_changes_m"][0]) == (1, 0)
    assert clock["tl_pair_quiet_m"][0] == 10.0


def test_a_page_listed_for_the_first_time_starts_its_timeline_from_its_fetches() -> None:
    state = _fetch(_state(), 100.0, False)
    state = _fetch(state, 110.0, True)
    assert np.isnan(state["tl_n"][0])
    state = _read(state, 120.0, 105.0)
    # the fetch pair (100, 110], then the read: no change after 110
    assert state["tl_n"][0] == 2 and state["stat_n"][0] == 1
    assert state["tl_changes"][0] == 1 and state["tl_time"][0] == 20.0


def test_a_fetch_after_reads_that_said_changed_only_starts_the_next_pair() -> None:
    state = _read(_fetch(_state(), 100.0, False), 120.0, 115.0)  # changed at 115
    state = _fetch(state, 130.0, True)
    # (100, 120] changed from the read; (120, 130] unknown: the change the fetch saw may be
    # the one the read told
    assert state["tl_n"][0] == 1 and state["tl_time"][0] == 20.0
    assert state["stat_n"][0] == 1 and state["stat_time"][0] == 30.0


def test_a_fetch_after_reads_that_said_unchanged_places_its_change_after_the_last_read() -> None:
    state = _read(_fetch(_state(), 100.0, False), 120.0, 90.0)
    state = _fetch(state, 130.0, True)
    assert state["tl_n"][0] == 2 and state["tl_changes"][0] == 1
    assert state["tl_changed_time"][0] == 10.0  # (120, 130]


def test_a_read_that_reaches_the_store_after_a_later_fetch_is_left_out() -> None:
    state = _read(_fetch(_state(), 100.0, False), 120.0, 90.0)
    state = _fetch(state, 130.0, False)
    late = _read(state, 125.0, 90.0)
    for c in TIMELINE_COLUMNS:
        np.testing.assert_array_equal(late[c], state[c])


def test_a_lastmod_that_moves_without_the_content_fails_at_the_next_fetch() -> None:
    state = _fetch(_state(), 100.0, False)
    state = _read(state, 120.0, 120.0)  # stamped as served: claims a change after 100
    assert state["_failed"][0] == 0 and state["_passed"][0] == 0
    assert _fetch(state, 130.0, False)["_failed"][0] == 1
    assert _fetch(state, 130.0, True)["_passed"][0] == 1


def test_a_lastmod_that_stays_while_the_content_moves_fails_at_the_next_read() -> None:
    listed = _read(_state(), 90.0, 50.0)  # the checks need the page's fetches since a read
    state = _fetch(_fetch(listed, 100.0, False), 110.0, True)  # changed in (100, 110]
    assert _read(state, 120.0, 50.0)["_failed"][0] == 1  # a build time
    honest = _read(state, 120.0, 105.0)
    assert honest["_passed"][0] == 1 and honest["_failed"][0] == 0
    # a new digest without a meaningful change asks nothing of the lastmod (a clock in the page)
    clock = _fetch(_fetch(listed, 100.0, False), 110.0, True, meaningful=False)
    assert _read(clock, 120.0, 50.0)["_failed"][0] == 0


def test_a_lastmod_after_its_read_fails() -> None:
    state = _read(_fetch(_state(), 100.0, False), 120.0, 200.0)
    assert state["_failed"][0] == 1


def _listed_store(path: Path) -> tuple[DuckDBStore, dict[str, int]]:
    """A store whose sitemap of a.test was read once (at NOW + 1), listing a page of its own
    host and one of another's; the pages' ids by URL."""
    store = DuckDBStore(path)
    rows = store.add_pages(
        [
            NewPage(url=u, host=u.split("/")[2], scheme="http")
            for u in ("http://a.test/sitemap.xml", "http://a.test/p", "http://b.test/p")
        ],
        now=NOW,
    )
    ids = {r.url: r.id for r in rows}
    update = DocumentUpdate(
        page_id=ids["http://a.test/sitemap.xml"],
        new=[],
        linked=[],
        canonical=None,
        noindex=False,
        lastmod=[("http://a.test/p", NOW - 10), ("http://b.test/p", NOW - 10)],
        fetched_at=NOW + 1,
    )
    store.save_documents([update], now=NOW + 1)
    return store, ids


def test_a_sitemap_read_folds_only_the_pages_of_its_own_host(tmp_path: Path) -> None:
    store, _ = _listed_store(tmp_path / "s.duckdb")
    try:
        got = dict(store._con.execute("SELECT url, tl_n FROM pages").fetchall())
        assert got["http://a.test/p"] == 0.0  # listed: a timeline of one point
        assert got["http://b.test/p"] is None  # another host's (on a fleet, maybe another node's)
    finally:
        store.close()


def test_a_store_reopened_after_a_sitemap_read_still_folds_fetches_into_the_timelines(
    tmp_path: Path,
) -> None:
    # a store asks once whether any read was folded, and until then reads no timeline column
    store, ids = _listed_store(tmp_path / "s.duckdb")
    page = ids["http://a.test/p"]
    host = int(store._con.execute("SELECT host_id FROM pages WHERE id = ?", [page]).fetchone()[0])
    store.write([fetch_record(page, host, NOW + 5)], [])  # after the read: starts a pair
    store.close()
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        store.write([fetch_record(page, host, NOW + 10)], [])
        got = store._con.execute("SELECT tl_n, tl_time FROM pages WHERE id = ?", [page])
        assert got.fetchone() == (1.0, 5.0)  # the pair (NOW + 5, NOW + 10]
    finally:
        store.close()


Query = Callable[[str], list[tuple[Any, ...]]]


def _read_of(sitemap: int, at: float, lastmod: list[tuple[str, float]]) -> DocumentUpdate:
    """The document of a sitemap read at ``at`` that lists these (URL, lastmod)."""
    return DocumentUpdate(
        page_id=sitemap,
        new=[],
        linked=[],
        canonical=None,
        noindex=False,
        lastmod=lastmod,
        fetched_at=at,
    )


@pytest.fixture(params=["duckdb", "postgres"])
def core(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Query]]:
    """Either store's synchronous core (the PostgreSQL one owning every partition) and a
    query of its tables."""
    if request.param == "duckdb":
        duck = DuckDBStore(tmp_path / "s.duckdb")
        yield duck, lambda sql: duck._con.execute(sql).fetchall()
        duck.close()
        return
    dsn = request.getfixturevalue("postgres")()
    init_fleet(dsn, partitions=8)
    leases = PgLeases(dsn, max_skew=None)
    pg = PgStore(dsn, node_id="n1", partitions=8)
    pg.owned = leases.claim_free("n1", 8, 1e12, NOW)

    def query(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as con:
            return con.execute(sql).fetchall()

    yield pg, query
    pg.close()
    leases.close()


def test_a_lastmod_given_to_the_day_is_kept_but_is_no_point_of_the_timeline(
    core: tuple[Any, Query],
) -> None:
    store, query = core
    urls = ("http://a.test/sitemap.xml", "http://a.test/day", "http://a.test/exact")
    dates = "http://a.test/dates.xml"  # a sitemap of coarse lastmods alone
    rows, _ = store.add_pages_with_hosts(
        [NewPage(url=u, host="a.test", scheme="http") for u in urls[1:]]
        + [
            NewPage(url=u, host="a.test", scheme="http", source="sitemap") for u in (urls[0], dates)
        ],
        now=NOW,
    )
    ids = {r.url: r.id for r in rows}
    day = ids["http://a.test/day"]
    host = rows[0].host_id
    # the day's page changed between its fetches at NOW + 2 and NOW + 5: read to the second,
    # its midnight would fail the host as a build time does
    store.write([fetch_record(day, host, NOW + 2)], [])
    store.write([fetch_record(day, host, NOW + 5, changed=True, digest=b"e")], [])
    midnight = NOW // 86400 * 86400
    for at in (NOW + 6, NOW + 7):
        update = dataclasses.replace(
            _read_of(ids[urls[0]], at, [("http://a.test/exact", NOW - 10)]),
            coarse_lastmod=[("http://a.test/day", midnight)],
        )
        store.save_document(update, now=at)
        store.save_document(dataclasses.replace(update, page_id=ids[dates], lastmod=[]), now=at)
    got = dict(query("SELECT url, sitemap_lastmod FROM pages"))
    assert (got["http://a.test/day"], got["http://a.test/exact"]) == (midnight, NOW - 10)
    got = dict(query("SELECT url, tl_n FROM pages"))
    assert got["http://a.test/day"] is None  # no timeline: its fetches alone count
    assert got["http://a.test/exact"] == 1.0  # two reads: the pair (NOW + 6, NOW + 7]
    assert query("SELECT page_id FROM sitemap_entries") == [(ids["http://a.test/exact"],)]
    assert query("SELECT sitemap_listed FROM pages WHERE url = 'http://a.test/sitemap.xml'") == [
        (1,)
    ]
    assert query("SELECT sitemap_passed, sitemap_failed FROM hosts") == [(0, 0)]
    # only the sitemap whose reads are points is read on the sitemaps' own schedule
    inputs = store.estimator_inputs(meaningful=False, links=False)
    since = dict(zip(inputs.page_ids.tolist(), inputs.sitemap_since.tolist(), strict=True))
    assert since[ids[urls[0]]] == NOW and np.isnan(since[ids[dates]])


def test_a_first_fetch_after_a_read_pairs_in_the_store_and_counts_where_the_host_is_trusted(
    core: tuple[Any, Query],
) -> None:
    store, query = core
    urls = ("http://a.test/sitemap.xml", "http://a.test/p")
    rows, _ = store.add_pages_with_hosts(
        [NewPage(url=u, host="a.test", scheme="http") for u in urls], now=NOW
    )
    ids = {r.url: r.id for r in rows}
    page, host = ids[urls[1]], rows[0].host_id
    store.save_document(_read_of(ids[urls[0]], NOW + 1, [(urls[1], NOW - 10)]), now=NOW + 1)
    # the page's first fetch, its Last-Modified after the read: (NOW + 1, NOW + 5] changed
    store.write([fetch_record(page, host, NOW + 5, last_modified_at=NOW + 3)], [])
    got = query(
        f"SELECT tl_n, tl_pair_n, tl_pair_changes, tl_pair_quiet FROM pages WHERE id = {page}"
    )
    assert got == [(0.0, 1.0, 1.0, 2.0)]

    def paired() -> list[float]:
        inputs = store.estimator_inputs(meaningful=True, links=False)
        at = inputs.page_ids.tolist().index(page)
        stats = inputs.stats
        assert stats.paired is not None and stats.paired_changes is not None
        return [float(stats.paired[at]), float(stats.paired_changes[at])]

    assert paired() == [0.0, 0.0]  # the host's sitemap not trusted yet: the fetches alone
    query("UPDATE hosts SET sitemap_passed = 1 RETURNING id")  # a check passed
    assert paired() == [1.0, 1.0]


def test_a_store_from_before_the_last_modified_pairs_gets_them_at_zero(tmp_path: Path) -> None:
    store, ids = _listed_store(tmp_path / "s.duckdb")  # listed at NOW + 1
    for c in PAIR_COLUMNS:  # the store as schema version 7 made it
        store._con.execute(f"ALTER TABLE pages DROP COLUMN {c}")
    store._con.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    store.close()
    store = DuckDBStore(tmp_path / "s.duckdb")
    try:
        got = dict(store._con.execute("SELECT url, tl_pair_n FROM pages").fetchall())
        assert (got["http://a.test/p"], got["http://b.test/p"]) == (0.0, None)
        page = ids["http://a.test/p"]
        host = store._scalar(f"SELECT host_id FROM pages WHERE id = {page}")
        store.write([fetch_record(page, host, NOW + 5, last_modified_at=NOW - 10)], [])
        got = store._con.execute(f"SELECT tl_pair_n, tl_pair_quiet FROM pages WHERE id = {page}")
        assert got.fetchone() == (1.0, 4.0)  # (NOW + 1, NOW + 5], no change
    finally:
        store.close()


def test_a_sitemap_sent_without_last_modified_leaves_its_hosts_last_modified_test_alone(
    core: tuple[Any, Query],
) -> None:
    store, _ = core
    pages = [NewPage(url="http://a.test/p", host="a.test", scheme="http")]
    pages.append(
        NewPage(url="http://a.test/sitemap.xml", host="a.test", scheme="http", source="sitemap")
    )
    rows, _ = store.add_pages_with_hosts(pages, now=NOW)
    page, sitemap, host = rows[0].id, rows[1].id, rows[0].host_id
    lm = {"last_modified_at": NOW - 10}
    store.write([fetch_record(page, host, NOW + 1, **lm), fetch_record(sitemap, host, NOW + 1)], [])
    again = {"changed": True, "digest": b"e"}
    store.write(
        [
            fetch_record(page, host, NOW + 9, last_modified_at=NOW + 5, **again),
            fetch_record(sitemap, host, NOW + 9, **again),  # no Last-Modified
        ],
        [],
    )
    inputs = store.estimator_inputs(meaningful=False, links=False)
    at = inputs.page_ids.tolist().index(sitemap)
    assert inputs.stats.lm_run[at] == inputs.stats.observations[at] == 1
    hosts = np.zeros(inputs.page_ids.size, dtype=np.intp)
    assert evidence(inputs.stats, hosts, 1, history=32).trusted[0]
