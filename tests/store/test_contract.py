"""The store contract: both implementations of :class:`refresher.store.Store` (the embedded
DuckDB service and the fleet's PostgreSQL store, owning every partition) behave alike through
the interface alone, under the one definition each of a success, a change and a due time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from conftest import fetch_record
from numpy.typing import NDArray

from refresher.store import (
    NEVER,
    DocumentUpdate,
    FetchRecord,
    Findings,
    HostUpdate,
    NewPage,
    PlanUpdate,
    RobotsUpdate,
    Store,
    StoreService,
    due_after,
    next_due,
)
from refresher.store._duckdb import DuckDBStore
from refresher.store._pg_leases import PgLeases
from refresher.store._pg_schema import init_fleet
from refresher.store._postgres import PgStore, PostgresStore

NOW = 1_700_000_000.0
P = 8
EVERYTHING = (-np.inf, 0)


def page(url: str, host: str = "a.example", source: str = "seed") -> NewPage:
    return NewPage(url=url, host=host, scheme="http", source=source)


def fetch(page_id: int, host_id: int, at: float, **changes: Any) -> FetchRecord:
    record = fetch_record(
        page_id,
        host_id,
        at,
        digest=b"d1",
        changed=False,
        etag='"v1"',
        page_digest=b"d1",
        due_at=at + 100,
    )
    return dataclasses.replace(record, **changes)


async def _serve(nursery: trio.Nursery, service: Any) -> trio.Event:
    done = trio.Event()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await service.run(task_status=task_status)
        finally:
            done.set()

    await nursery.start(run)
    return done


@pytest.fixture(params=["duckdb", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, nursery: trio.Nursery
) -> AsyncIterator[Store]:
    if request.param == "duckdb":
        core: Any = DuckDBStore(tmp_path / "s.duckdb")
        service: Any = StoreService(core, flush_interval=0.05)
    else:
        dsn = request.getfixturevalue("postgres")()
        init_fleet(dsn, partitions=P)
        leases = PgLeases(dsn, max_skew=None)
        owned = leases.claim_free("n1", P, 1e9, time.time())
        leases.close()
        core = PgStore(dsn, node_id="n1", partitions=P)
        service = PostgresStore(core, flush_interval=0.05)
        service.set_owned(owned)
    done = await _serve(nursery, service)
    yield service
    service.close()
    await done.wait()
    core.close()


async def _pages(store: Store, until: float = np.inf) -> dict[str, Any]:
    pages, _ = await store.load_due(
        after=EVERYTHING, until=until, limit=1000, known_hosts=frozenset()
    )
    return {p.url: p for p in pages}


async def test_new_pages_are_due_now_with_their_hosts_and_a_url_is_added_once(
    store: Store,
) -> None:
    rows, hosts = await store.add_pages(
        [
            page("http://a.example/1"),
            page("http://a.example/1"),
            page("http://b.example/", "b.example"),
        ],
        now=NOW,
    )
    assert sorted(r.url for r in rows) == ["http://a.example/1", "http://b.example/"]
    assert all(r.due_at == NOW and r.target_rate is None for r in rows)
    assert {h.name for h in hosts.values()} == {"a.example", "b.example"}
    assert {r.host_id for r in rows} == set(hosts)
    again, _ = await store.add_pages(
        [page("http://a.example/1"), page("http://a.example/2")], now=NOW
    )
    assert [r.url for r in again] == ["http://a.example/2"]
    assert (await store.status(now=NOW)).pages == 3


async def test_a_recorded_fetch_is_acknowledged_and_leaves_the_pages_state(store: Store) -> None:
    (row,), _ = await store.add_pages([page("http://a.example/")], now=NOW)
    await store.record(fetch(row.id, row.host_id, NOW + 10, etag='"e"', due_at=NOW + 500))
    await store.update_host(
        HostUpdate(host_id=row.host_id, next_allowed=NOW + 20, delay=2.5, backoff=0, errors=1)
    )
    got = (await _pages(store))["http://a.example/"]
    assert store.statistics().acknowledged == 1
    assert (got.due_at, got.etag, got.digest) == (NOW + 500, '"e"', b"d1")
    _, hosts = await store.load_due(
        after=EVERYTHING, until=np.inf, limit=10, known_hosts=frozenset()
    )
    host = hosts[row.host_id]
    assert (host.next_allowed, host.delay, host.errors) == (NOW + 20, 2.5, 1)
    status = await store.status(now=NOW + 1000)
    assert (status.fetches, status.last_fetch, status.due_now) == (1, NOW + 10, 1)


async def test_a_page_tried_without_a_copy_is_no_longer_new(store: Store) -> None:
    rows, _ = await store.add_pages(
        [page("http://a.example/new"), page("http://a.example/err")], now=NOW
    )
    assert all(r.new and not r.tried for r in rows)
    by = {r.url: r for r in rows}
    err = by["http://a.example/err"]
    await store.record(
        fetch(
            err.id,
            err.host_id,
            NOW + 5,
            status=500,
            digest=None,
            page_digest=None,
            page_status="error",
        )
    )
    got = await _pages(store)
    assert got["http://a.example/new"].new
    failed = got["http://a.example/err"]
    assert failed.digest is None and failed.tried and not failed.new


async def test_load_due_pages_through_by_due_time_then_id_and_stops_at_until(
    store: Store,
) -> None:
    rows, _ = await store.add_pages([page(f"http://a.example/{i}") for i in range(5)], now=NOW)
    for i, r in enumerate(rows):
        await store.record(fetch(r.id, r.host_id, NOW + 1, due_at=NOW + 100 + (i % 2)))
    first, _ = await store.load_due(
        after=EVERYTHING, until=NOW + 1000, limit=2, known_hosts=frozenset()
    )
    rest, _ = await store.load_due(
        after=(first[-1].due_at, first[-1].id), until=NOW + 100, limit=10, known_hosts=frozenset()
    )
    order = [(p.due_at, p.id) for p in first + rest]
    assert order == sorted(order) and len(order) == 3
    assert all(p.due_at == NOW + 100 for p in first + rest)


async def test_known_hosts_are_not_sent_again_and_a_paused_host_is_not_due(store: Store) -> None:
    rows, _ = await store.add_pages(
        [page("http://a.example/"), page("http://b.example/", "b.example")], now=NOW
    )
    pages, hosts = await store.load_due(
        after=EVERYTHING, until=np.inf, limit=10, known_hosts=frozenset({rows[0].host_id})
    )
    assert len(pages) == 2 and set(hosts) == {rows[1].host_id}
    assert await store.set_paused("a.example", True)
    assert not await store.set_paused("nowhere.example", True)
    assert set(await _pages(store)) == {"http://b.example/"}
    summary = await store.host_summary(now=NOW, limit=None)
    assert (summary[0].host, summary[0].paused) == ("a.example", True)


async def test_robots_txt_is_kept_with_the_host(store: Store) -> None:
    (row,), _ = await store.add_pages([page("http://a.example/")], now=NOW)
    await store.update_host(
        RobotsUpdate(
            host_id=row.host_id,
            status=200,
            body=b"User-agent: *\n",
            fetched_at=NOW,
            expires_at=NOW + 60,
        )
    )
    _, hosts = await store.load_due(
        after=EVERYTHING, until=np.inf, limit=10, known_hosts=frozenset()
    )
    host = hosts[row.host_id]
    assert (host.robots_status, host.robots_body, host.robots_expires_at) == (
        200,
        b"User-agent: *\n",
        NOW + 60,
    )


async def test_success_counts_a_304_and_not_an_error_for_the_last_refresh(store: Store) -> None:
    rows, _ = await store.add_pages(
        [page("http://a.example/ok"), page("http://a.example/nm"), page("http://a.example/err")],
        now=NOW,
    )
    by = {r.url: r for r in rows}
    await store.record(fetch(by["http://a.example/ok"].id, rows[0].host_id, NOW + 5))
    await store.record(
        fetch(
            by["http://a.example/nm"].id,
            rows[0].host_id,
            NOW + 6,
            status=304,
            not_modified=True,
            digest=None,
        )
    )
    await store.record(fetch(by["http://a.example/err"].id, rows[0].host_id, NOW + 7, status=500))
    await store.record(
        fetch(
            by["http://a.example/err"].id,
            rows[0].host_id,
            NOW + 8,
            status=200,
            error_kind="too_large",
        )
    )
    last = {u: t for u, t, _ in await store.last_refreshes()}
    assert last == {
        "http://a.example/ok": NOW + 5,
        "http://a.example/nm": NOW + 6,
        "http://a.example/err": None,
    }


async def test_page_ids_maps_each_known_url_to_its_page_and_the_rest_to_minus_one(
    store: Store,
) -> None:
    (a, b), _ = await store.add_pages(
        [page("http://a.example/1"), page("http://a.example/2")], now=NOW
    )
    urls = np.array(["http://a.example/2", "http://a.example/none", "http://a.example/1"])
    assert (await store.page_ids(urls)).tolist() == [b.id, -1, a.id]
    assert (await store.page_ids(np.array([], dtype=np.str_))).tolist() == []


async def test_the_estimator_sees_pairs_of_successful_fetches_and_their_changes(
    store: Store,
) -> None:
    (a, b), _ = await store.add_pages(
        [page("http://a.example/1"), page("http://a.example/2")], now=NOW
    )
    h = a.host_id
    for rec in (
        fetch(a.id, h, NOW + 10),
        fetch(a.id, h, NOW + 20, status=500),  # not a success: no observation
        fetch(a.id, h, NOW + 30, changed=True, digest=b"d2", meaningful=False),
        fetch(a.id, h, NOW + 40, status=304, not_modified=True, digest=None),
        fetch(b.id, h, NOW + 50, last_modified_at=NOW - 1000),
    ):
        await store.record(rec)
    raw = await store.estimator_inputs(meaningful=False, links=False)
    assert raw.page_ids.tolist() == [a.id, b.id]
    assert raw.last_fetch.tolist() == [NOW + 40, NOW + 50]
    # a: intervals 10→30 (changed) and 30→40 (a 304); the 500 between is no success
    st = raw.stats
    assert st.observations.tolist() == [2, 0] and st.time.tolist() == [30, 0]
    assert st.changes.tolist() == [1, 0] and st.changed_time.tolist() == [20, 0]
    assert np.isnan(st.first_quiet[0]) and st.first_quiet[1] == 1050.0
    meaningful = await store.estimator_inputs(meaningful=True, links=False)
    assert meaningful.stats.changes.tolist() == [0, 0]
    assert meaningful.stats.observations.tolist() == [2, 0]


async def test_the_estimator_sees_each_hosts_mean_response_time_over_recent_fetches(
    store: Store,
) -> None:
    (a, b, c), _ = await store.add_pages(
        [
            page("http://a.example/1"),
            page("http://a.example/2"),
            page("http://c.example/1", host="c.example"),
        ],
        now=NOW,
    )
    for rec in (
        fetch(a.id, a.host_id, NOW + 10, duration=5.0),  # before the window: not counted
        fetch(a.id, a.host_id, NOW + 100, duration=0.02),
        fetch(b.id, b.host_id, NOW + 110, duration=0.06),
        fetch(b.id, b.host_id, NOW + 120, duration=9.0, status=None, error_kind="timeout"),
        fetch(c.id, c.host_id, NOW + 20, duration=0.5),  # c's host: nothing in the window
    ):
        await store.record(rec)
    raw = await store.estimator_inputs(meaningful=False, links=False, responses_since=NOW + 50)
    assert raw.host_response is not None
    # a's host: the two fetches with a response in the window; a timeout is no response
    assert raw.host_response.tolist() == pytest.approx([0.04, 0.04, 0.0])
    unasked = await store.estimator_inputs(meaningful=False, links=False)
    assert unasked.host_response is None


async def test_a_plan_makes_pages_due_by_the_one_definition(store: Store) -> None:
    rows, _ = await store.add_pages([page(f"http://a.example/{i}") for i in range(3)], now=NOW)
    fetched, zero, never = rows
    await store.record(fetch(fetched.id, fetched.host_id, NOW + 10))
    await store.record(fetch(zero.id, zero.host_id, NOW + 20))
    plan = PlanUpdate(
        page_ids=np.array([r.id for r in rows], dtype=np.int64),
        rates=np.array([0.1, 0.2, 0.3]),
        rate_n=np.array([1.0, 2.0, 3.0]),
        weights=np.array([1.0, 1.0, 2.0]),
        target=np.array([0.5, 0.0, 0.25]),
    )
    await store.save_plan(plan, now=NOW + 60)
    got = await _pages(store)
    assert got[fetched.url].due_at == NOW + 10 + 2.0
    assert got[zero.url].due_at == NOW + 20 + NEVER
    assert got[never.url].due_at == NOW  # never fetched: keeps its earlier due time
    assert (got[never.url].target_rate, got[never.url].rate, got[never.url].weight) == (
        0.25,
        0.3,
        2.0,
    )


async def test_a_new_plan_keeps_the_lateness_the_due_times_made_up_by_the_one_definition(
    store: Store,
) -> None:
    # Four pages fetched under a first plan, their due times set by the workers' rule (lateness
    # made up: the due time is earlier than last fetch + 1/f), then re-planned: the store's
    # SQL gives each exactly what next_due gives, in both stores.
    rows, _ = await store.add_pages([page(f"http://a.example/{i}") for i in range(5)], now=NOW)
    first = np.array([0.5, 0.5, 0.1, 0.2, 0.25])

    def plan(target: NDArray[np.float64]) -> PlanUpdate:
        ones = np.ones(len(rows))
        return PlanUpdate(
            page_ids=np.array([r.id for r in rows], dtype=np.int64),
            rates=ones,
            rate_n=ones,
            weights=ones,
            target=target,
        )

    await store.save_plan(plan(first), now=NOW)
    fetched_at = NOW + np.array([10.0, 20.0, 30.0, 40.0])
    late = np.array([0.5, 3.0, 1.0, 0.0])  # s; 3 s is more than half of page 1's 2 s interval
    for r, at, f, lag in zip(rows, fetched_at, first, late, strict=False):
        await store.record(fetch(r.id, r.host_id, at, due_at=due_after(at, 1 / f, lag)))
    before = await _pages(store)
    second = np.array([0.5, 1.0, 0.05, 0.0, 0.25])
    await store.save_plan(plan(second), now=NOW + 60)
    after = await _pages(store)
    urls = [r.url for r in rows]
    expected = next_due(
        np.append(fetched_at, np.nan),
        second,
        due_at=np.array([before[u].due_at for u in urls]),
        planned=first,
        now=NOW + 60,
    )
    assert [after[u].due_at for u in urls] == pytest.approx(expected.tolist(), abs=1e-6)
    # unchanged plan: the made-up lateness stays (0.5 s earlier than last fetch + 2 s)
    assert after[urls[0]].due_at == pytest.approx(NOW + 10 + 2 - 0.5)
    assert after[urls[3]].due_at == pytest.approx(NOW + 40 + NEVER)  # no fetches planned
    assert after[urls[4]].due_at == NOW  # never fetched: due at once


async def test_documents_saved_together_add_what_each_would_alone(store: Store) -> None:
    (a, b), _ = await store.add_pages(
        [page("http://a.example/"), page("http://a.example/b")], now=NOW
    )

    def doc(page_id: int, new: list[NewPage], linked: list[str], **kw: Any) -> DocumentUpdate:
        facts: dict[str, Any] = {"canonical": None, "noindex": False, "lastmod": []}
        return DocumentUpdate(page_id=page_id, new=new, linked=linked, **{**facts, **kw})

    x, b_url, c = "http://a.example/x", "http://a.example/b", "http://c.example/"
    saved = await store.save_documents(
        [
            doc(a.id, [page(x, source="link")], [x, b_url], noindex=True),
            doc(b.id, [page(c, "c.example", "link")], [x, c, b_url, "http://nowhere/"]),
            doc(b.id, [page("http://d.example/", "d.example", "sitemap")], [x], synthetic=True),
        ],
        now=NOW + 1,
    )
    assert [[r.url for r in rows] for rows, _, _ in saved] == [[x], [c], ["http://d.example/"]]
    assert {h.name for h in saved[1][1].values()} == {"c.example"}
    # a: x (its own new page) and b; b: x and c, not itself; a synthetic document: none
    assert [edges for _, _, edges in saved] == [2, 2, 0]
    assert await store.save_documents([], now=NOW + 2) == []
    inputs = await store.estimator_inputs(meaningful=False, links=True)
    assert len(inputs.link_src) == 4


async def test_a_document_adds_new_pages_links_and_facts_once(store: Store) -> None:
    (src,), _ = await store.add_pages([page("http://a.example/")], now=NOW)
    update = DocumentUpdate(
        page_id=src.id,
        new=[
            page("http://a.example/x", source="link"),
            page("http://c.example/", "c.example", "link"),
        ],
        linked=["http://a.example/x", "http://c.example/", "http://a.example/", "http://nowhere/"],
        canonical=None,
        noindex=False,
        lastmod=[],
    )
    rows, hosts, edges = await store.save_document(update, now=NOW + 1)
    assert sorted(r.url for r in rows) == ["http://a.example/x", "http://c.example/"]
    assert "c.example" in {h.name for h in hosts.values()}
    assert edges == 2  # to known pages other than itself
    rows, _, _ = await store.save_document(update, now=NOW + 2)
    assert rows == []
    from refresher.discover._seen import fingerprints

    fps = fingerprints(["http://a.example/x", "http://unknown.example/"])
    assert (await store.known_fingerprints(fps)).tolist() == [True, False]
    seeds, counts = await store.discovery_scope()
    assert seeds == ["a.example"] and counts == {"a.example": 2, "c.example": 1}
    inputs = await store.estimator_inputs(meaningful=False, links=True)
    assert sorted(zip(inputs.link_src.tolist(), inputs.link_dst.tolist(), strict=True)) == sorted(
        (src.id, r.id) for r in (await _pages(store)).values() if r.id != src.id
    )


async def test_a_fetchs_findings_are_owed_until_discovery_saves_that_fetchs_document(
    store: Store,
) -> None:
    (row,), _ = await store.add_pages([page("http://a.example/")], now=NOW)
    findings = Findings(
        depth=0,
        url=row.url,
        links=(("http://a.example/x", "a"), ("/y", "link")),
        canonical="http://a.example/",
        noindex=True,
        lastmod=(("http://a.example/x", NOW - 5),),
    )
    await store.record(fetch(row.id, row.host_id, NOW + 1, findings=findings))
    await store.record(fetch(row.id, row.host_id, NOW + 2))  # nothing found: nothing owed
    assert (await store.status(now=NOW)).owed == 1  # shown in `refresher status`
    # this run's own findings are its discovery's (in its queue) until the grace has passed
    assert await store.owed_documents(10, grace=120.0, now=time.time()) == []
    later = time.time() + 121.0
    taken = await store.owed_documents(10, grace=120.0, now=later)
    assert [o[1:] for o in taken] == [(row.id, NOW + 1, findings)]
    assert await store.owed_documents(10, grace=120.0, now=later + 1) == []  # taken: not again

    def update(fetched_at: float | None) -> DocumentUpdate:
        return DocumentUpdate(
            page_id=row.id,
            new=[],
            linked=[],
            canonical=None,
            noindex=False,
            lastmod=[],
            fetched_at=fetched_at,
        )

    # a document of another fetch of the page, or of none, leaves them owed
    await store.save_documents([update(NOW + 2), update(None)], now=NOW + 3)
    assert len(await store.owed_documents(10, grace=120.0, now=later + 500)) == 1
    await store.save_documents([update(NOW + 1)], now=NOW + 4)
    assert await store.owed_documents(10, grace=0.0, now=later + 1000) == []
    assert (await store.status(now=NOW)).owed == 0
    # deferred (discovery's queue was full): no queue has them, taken at once
    await store.record(fetch(row.id, row.host_id, NOW + 5, findings=findings, deferred=True))
    taken = await store.owed_documents(10, grace=120.0, now=time.time())
    assert [o[1:] for o in taken] == [(row.id, NOW + 5, findings)]
    assert await store.owed_documents(10, grace=120.0, now=time.time()) == []


async def test_the_policy_switch_holds_until_the_config_names_another(store: Store) -> None:
    assert await store.policy_in_force("uniform") == "uniform"
    await store.switch_policy("optimal", configured="uniform", budget=5.0, now=NOW)
    assert await store.policy_in_force("uniform") == "optimal"
    assert await store.policy_in_force("proportional") == "proportional"
    await store.record_policy("optimal", 5.0, now=NOW + 1)


def test_both_stores_implement_the_protocol(tmp_path: Path, postgres: Callable[..., str]) -> None:
    dsn = postgres()
    init_fleet(dsn, partitions=P)
    core = PgStore(dsn, node_id="n1", partitions=P)
    duck = DuckDBStore(tmp_path / "s.duckdb")
    try:
        assert isinstance(PostgresStore(core), Store)
        assert isinstance(StoreService(duck), Store)
    finally:
        core.close()
        duck.close()


async def test_sitemap_lastmods_of_a_host_that_passes_the_trust_test_are_points_of_the_timeline(
    store: Store,
) -> None:
    hosts = ("honest.example", "served.example")  # lastmods: true changes; the read's time
    rows, _ = await store.add_pages(
        [page(f"http://{h}/sitemap.xml", h, source="sitemap") for h in hosts]
        + [page(f"http://{h}/p", h) for h in hosts],
        now=NOW,
    )
    by_url = {r.url: r for r in rows}

    async def read(host: str, at: float, lastmod: float) -> None:
        sitemap = by_url[f"http://{host}/sitemap.xml"]  # a new body each time: a document
        await store.record(fetch(sitemap.id, sitemap.host_id, at, changed=True, digest=b"%d" % at))
        update = DocumentUpdate(
            page_id=sitemap.id,
            new=[],
            linked=[],
            canonical=None,
            noindex=False,
            # a page of another host is no point of this read
            lastmod=[(f"http://{host}/p", lastmod), (f"http://{hosts[0]}/x", at)],
            fetched_at=at,
        )
        await store.save_documents([update], now=at)

    async def stats() -> tuple[list[float], list[float]]:
        inputs = await store.estimator_inputs(meaningful=False, links=False)
        got = dict(zip(inputs.page_ids.tolist(), inputs.stats.observations.tolist(), strict=True))
        times = dict(zip(inputs.page_ids.tolist(), inputs.stats.time.tolist(), strict=True))
        ids = [by_url[f"http://{h}/p"].id for h in hosts]
        return [got[i] for i in ids], [times[i] for i in ids]

    for h in hosts:
        listed = by_url[f"http://{h}/p"]
        await read(h, NOW + 5, NOW - 100 if h == hosts[0] else NOW + 5)
        await store.record(fetch(listed.id, listed.host_id, NOW + 10))
        await store.record(fetch(listed.id, listed.host_id, NOW + 20, changed=True, digest=b"d2"))
    # no check could fail yet: the fetches' pair (10, 20] alone
    assert await stats() == ([1, 1], [10, 10])
    await read(hosts[0], NOW + 30, NOW + 15)  # the change the fetch at NOW + 20 saw: passes
    await read(hosts[1], NOW + 30, NOW + 30)  # claims a change after NOW + 20
    # both pass the check a build time would fail, so both count the read's pair (20, 30]:
    # the change the served one claims is checked by the next fetch
    assert await stats() == ([2, 2], [20, 20])
    for h in hosts:
        listed = by_url[f"http://{h}/p"]
        await store.record(fetch(listed.id, listed.host_id, NOW + 40, digest=b"d2"))
    # served: the change its read claimed was not there, so its host fails and keeps the
    # fetch-only sums; honest: (30, 40] unchanged after a read that said unchanged
    assert await stats() == ([3, 2], [30, 30])
    trust = {
        h.host: (h.sitemap_passed > 0, h.sitemap_failed > 0)
        for h in await store.host_summary(now=NOW, limit=None)
    }
    assert trust == {hosts[0]: (True, False), hosts[1]: (True, True)}  # as status shows them
    # the sitemaps read on their own schedule: the honest host's, found at NOW; not the
    # failed host's (a page like any other again) nor any other page
    inputs = await store.estimator_inputs(meaningful=False, links=False)
    assert inputs.sitemap_since is not None
    since = dict(zip(inputs.page_ids.tolist(), inputs.sitemap_since.tolist(), strict=True))
    assert since.pop(by_url[f"http://{hosts[0]}/sitemap.xml"].id) == NOW
    assert np.isnan(list(since.values())).all()
    # the same body read again (no document): the same lastmods, a point at its fetch
    sitemap = by_url[f"http://{hosts[0]}/sitemap.xml"]
    await store.record(fetch(sitemap.id, sitemap.host_id, NOW + 50, digest=b"%d" % (NOW + 30)))
    assert await stats() == ([4, 2], [40, 30])
