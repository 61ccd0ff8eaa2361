"""The PostgreSQL store for a node of a fleet: it reads its own partitions only, a stale owner's
writes are fenced off, and links across partitions reach their owner exactly once as pages."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import trio
from conftest import fetch_record

from refresher.fleet import partition_of
from refresher.ops._cli import main
from refresher.store import DocumentUpdate, HostUpdate, NewPage, PlanUpdate
from refresher.store._pg_leases import PgLeases
from refresher.store._pg_schema import init_fleet
from refresher.store._postgres import PgStore, PostgresStore, batch_key

P = 8
NOW = 1_700_000_000.0
T0 = 1_000_000.0  # lease times: far from the page times, leases never expire unless told


def host_in(partition: int, prefix: str = "h") -> str:
    """A host key in ``partition``."""
    return next(
        h for i in range(10_000) if partition_of(h := f"{prefix}{i}.example", P) == partition
    )


def page(host: str, path: str = "/", source: str = "link") -> NewPage:
    return NewPage(url=f"http://{host}{path}", host=host, scheme="http", source=source)


class Node:
    """One node: its own store connection and service, and the leases it was granted."""

    def __init__(self, dsn: str, name: str) -> None:
        self.name = name
        self.leases = PgLeases(dsn, max_skew=None)
        self.core = PgStore(dsn, node_id=name, partitions=P)
        self.store = PostgresStore(self.core, flush_interval=0.05)
        self.done = trio.Event()

    def claim(self, n: int, *, at: float = T0, ttl: float = 1e12) -> dict[int, int]:
        got = self.leases.claim_free(self.name, n, ttl, at)
        self.store.set_owned({**self.store.owned(), **got})
        return got

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.store.run(task_status=task_status)
        finally:
            self.done.set()

    async def stop(self) -> None:
        self.store.close()
        await self.done.wait()
        self.core.close()
        self.leases.close()


@pytest.fixture
def dsn(postgres: Callable[..., str]) -> str:
    d = postgres()
    init_fleet(d, partitions=P)
    return d


@pytest.fixture
async def nodes(dsn: str, nursery: trio.Nursery) -> AsyncIterator[Callable[[str], Any]]:
    started: list[Node] = []

    async def start(name: str) -> Node:
        node = Node(dsn, name)
        await nursery.start(node.run)
        started.append(node)
        return node

    yield start
    for node in started:
        await node.stop()


def rows(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as con:
        return con.execute(sql, params).fetchall()


async def test_a_node_loads_only_the_pages_of_its_own_partitions(
    nodes: Callable[[str], Any],
) -> None:
    a, b = await nodes("a"), await nodes("b")
    mine, theirs = a.claim(P // 2), b.claim(P // 2)
    hosts = [host_in(p) for p in range(P)]
    added, _ = await a.store.add_pages([page(h, source="seed") for h in hosts], now=NOW)
    # the pages of b's partitions went to b's inbox; a got its own
    assert {partition_of(r.host, P) for r in added} == set(mine)
    due_a, _ = await a.store.load_due(
        after=(-np.inf, 0), until=np.inf, limit=100, known_hosts=frozenset()
    )
    assert {partition_of(p.host, P) for p in due_a} == set(mine)
    new_b, _, taken = await b.store.drain_inbox(100, now=NOW)
    assert taken == len(theirs) and {partition_of(p.host, P) for p in new_b} == set(theirs)
    due_b, _ = await b.store.load_due(
        after=(-np.inf, 0), until=np.inf, limit=100, known_hosts=frozenset()
    )
    assert {p.url for p in due_b} == {p.url for p in new_b}


async def test_a_stale_owner_cannot_overwrite_the_new_owners_state(
    nodes: Callable[[str], Any], dsn: str
) -> None:
    a, b = await nodes("a"), await nodes("b")
    granted = a.claim(P, at=T0, ttl=10.0)
    lost_p, kept_p = 0, 1
    added, _ = await a.store.add_pages([page(host_in(lost_p)), page(host_in(kept_p))], now=NOW)
    by_partition = {partition_of(r.host, P): r for r in added}
    lost, kept = by_partition[lost_p], by_partition[kept_p]
    # a's lease on every partition expires; b takes one of them (a new epoch), a renews the rest
    taken = b.claim(1, at=T0 + 20)
    assert taken == {lost_p: granted[lost_p] + 1}
    a.leases.renew("a", {p: e for p, e in granted.items() if p != lost_p}, 10.0, T0 + 20)
    await b.store.record(fetch_record(lost.id, lost.host_id, NOW + 5, due_at=NOW + 50))
    await b.store.status(now=NOW)  # committed
    # a still believes it holds everything: its writes to lost_p are refused, kept_p's pass
    await a.store.record(fetch_record(lost.id, lost.host_id, NOW + 9, due_at=NOW + 9999))
    await a.store.record(fetch_record(kept.id, kept.host_id, NOW + 9, due_at=NOW + 90))
    await a.store.update_host(
        HostUpdate(host_id=lost.host_id, next_allowed=NOW + 9999, delay=1, backoff=0, errors=7)
    )
    await a.store.save_plan(
        PlanUpdate(
            page_ids=np.array([lost.id, kept.id]),
            rates=np.array([1.0, 1.0]),
            rate_n=np.array([1.0, 1.0]),
            weights=np.array([1.0, 1.0]),
            target=np.array([1.0, 1.0]),
        ),
        now=NOW + 10,
    )
    assert a.store.statistics().acknowledged == 1
    fencing = a.store.fencing()
    assert (fencing.records, fencing.hosts, fencing.plans) == (1, 1, 1)
    assert rows(dsn, "SELECT due_at, target_rate FROM pages WHERE id = %s", lost.id) == [
        (NOW + 50, None)
    ]
    assert rows(dsn, "SELECT errors FROM hosts WHERE id = %s", lost.host_id) == [(0,)]
    assert rows(dsn, "SELECT node_id, epoch FROM fetches WHERE page_id = %s", lost.id) == [
        ("b", granted[lost_p] + 1)
    ]
    assert rows(dsn, "SELECT due_at, target_rate FROM pages WHERE id = %s", kept.id) == [
        (NOW + 9 + 1.0, 1.0)
    ]


async def test_links_across_partitions_reach_the_owner_exactly_once_as_pages(
    nodes: Callable[[str], Any], dsn: str
) -> None:
    a, b = await nodes("a"), await nodes("b")
    mine, theirs = a.claim(P // 2), b.claim(P // 2)
    (src,), _ = await a.store.add_pages([page(host_in(next(iter(mine))), "/src")], now=NOW)
    targets = [page(host_in(p, "t"), f"/{i}") for p in range(P) for i in range(3)]
    update = DocumentUpdate(
        page_id=src.id,
        new=targets,
        linked=[t.url for t in targets],
        canonical=None,
        noindex=False,
        lastmod=[],
    )
    rows_a, _, _ = await a.store.save_document(update, now=NOW)
    assert {partition_of(r.host, P) for r in rows_a} == set(mine)
    # delivered again (the document fetched twice, or found by another page): at least once
    await a.store.save_document(update, now=NOW + 1)
    foreign = [t for t in targets if partition_of(t.host, P) in theirs]
    assert rows(dsn, "SELECT count(*) FROM inbox")[0][0] == 2 * len(foreign)
    got: list[str] = []
    while True:
        new, _, taken = await b.store.drain_inbox(5, now=NOW + 2)
        got += [p.url for p in new]
        if not taken:
            break
    assert sorted(got) == sorted(t.url for t in foreign)
    assert rows(dsn, "SELECT count(*) FROM inbox") == [(0,)]
    counted = rows(dsn, "SELECT url, count(*) FROM pages GROUP BY url HAVING count(*) > 1")
    assert counted == []
    assert rows(dsn, "SELECT count(*) FROM pages")[0][0] == 1 + len(targets)
    # a link found after the owner added the page is not queued again
    await a.store.save_document(update, now=NOW + 3)
    assert rows(dsn, "SELECT count(*) FROM inbox") == [(0,)]
    assert a.store.fencing().inbox == 2 * len(foreign)


def test_two_drains_at_once_never_take_one_inbox_row(dsn: str) -> None:
    leases = PgLeases(dsn, max_skew=None)
    owned = leases.claim_free("b", P, 1e12, T0)
    writer = PgStore(dsn, node_id="a", partitions=P)
    urls = [page(host_in(p), f"/{i}") for p in range(P) for i in range(25)]
    with writer._con.transaction():  # rows as another node's save_document leaves them
        writer._con.execute(
            "INSERT INTO inbox (partition, url, host, scheme, source, depth, created_at)"
            " SELECT * FROM unnest(%s::int[], %s::text[], %s::text[], %s::text[], %s::text[],"
            " %s::int[], %s::float8[])",
            (
                [partition_of(u.host, P) for u in urls],
                [u.url for u in urls],
                [u.host for u in urls],
                ["http"] * len(urls),
                ["link"] * len(urls),
                [1] * len(urls),
                [NOW] * len(urls),
            ),
        )
    drains = [PgStore(dsn, node_id="b", partitions=P) for _ in range(2)]
    taken: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def drain(i: int) -> None:
        drains[i].owned = owned
        barrier.wait()
        while True:
            new, _, n = drains[i].drain_inbox(7, now=NOW)
            taken[i] += [r.url for r in new]
            if not n:
                return

    threads = [threading.Thread(target=drain, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(taken[0]).isdisjoint(taken[1])
    assert sorted(taken[0] + taken[1]) == sorted(u.url for u in urls)
    for s in (*drains, writer):
        s.close()
    leases.close()


def test_refresher_seed_on_a_fleet_routes_seeds_to_their_owners(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    leases = PgLeases(dsn, max_skew=None)
    held = leases.claim_free("b", 1, 60.0, time.time())  # one partition held by a live node
    (held_p,) = held
    free_p = (held_p + 1) % P
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path}/r.duckdb"\n[control]\nsocket = "{tmp_path}/c.sock"\n'
        f"[fleet]\ndsn = {dsn!r}\nnode_id = 'cli'\npartitions = {P}\n"
    )
    urls = [f"http://{host_in(held_p)}/", f"http://{host_in(free_p)}/"]
    assert main(["seed", "--config", str(config), *urls]) == 0
    out = capsys.readouterr().out
    assert "1 added, 1 sent to their owners' inboxes, 0 already known" in out
    assert rows(dsn, "SELECT url FROM inbox") == [(urls[0],)]
    assert rows(dsn, "SELECT url, partition FROM pages") == [(urls[1], free_p)]
    assert main(["seed", "--config", str(config), urls[1]]) == 0
    assert "0 added, 0 sent to their owners' inboxes, 1 already known" in capsys.readouterr().out
    assert not (tmp_path / "r.duckdb").exists()
    # and `refresher status` reads the fleet
    assert main(["status", "--config", str(config), "--json"]) == 0
    assert '"pages": 1' in capsys.readouterr().out
    leases.close()


def test_a_node_without_a_fleet_in_the_database_is_refused(postgres: Callable[..., str]) -> None:
    from refresher._errors import StoreError

    with pytest.raises(StoreError, match="fleet init"):
        PgStore(postgres(), node_id="a", partitions=P)


async def test_writes_of_a_page_fetched_twice_in_a_batch_add_up(
    nodes: Callable[[str], Any], dsn: str
) -> None:
    a = await nodes("a")
    a.claim(P)
    (row,), _ = await a.store.add_pages([page(host_in(0))], now=NOW)
    for at, changed in ((NOW + 1, True), (NOW + 2, False), (NOW + 3, True)):
        await a.store.record(
            dataclasses.replace(
                fetch_record(row.id, row.host_id, at, due_at=at + 10),
                changed=changed,
                fingerprint=(1 << 64) - 5,
            )
        )
    got, _ = await a.store.load_due(
        after=(-np.inf, 0), until=np.inf, limit=10, known_hosts=frozenset()
    )
    assert got[0].fingerprint == (1 << 64) - 5  # the unsigned simhash survives bigint
    assert rows(dsn, "SELECT fetches, changes, last_change, due_at FROM pages") == [
        (3, 2, NOW + 3, NOW + 13)
    ]


async def test_a_batch_written_while_postgresql_is_down_commits_once_it_is_back() -> None:
    from conftest import PostgresServer, wait_for

    server = PostgresServer()  # its own server: this test stops it
    try:
        dsn = server()
        init_fleet(dsn, partitions=P)
        leases = PgLeases(dsn, max_skew=None)
        core = PgStore(dsn, node_id="a", partitions=P, retry_for=600)
        core.owned = leases.claim_free("a", P, 1e12, T0)
        leases.close()
        (row,), _ = core.add_pages_with_hosts([page(host_in(0))], now=NOW)
        server.halt()
        result: list[int] = []

        async def write() -> None:
            record = fetch_record(row.id, row.host_id, NOW + 1)
            result.append(await trio.to_thread.run_sync(core.write, [record], []))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await wait_for(lambda: core.retries >= 2, what="the store retrying")
            assert result == []  # not acknowledged while PostgreSQL is down
            await trio.to_thread.run_sync(server.start)
        assert result == [1]
        assert rows(dsn, "SELECT page_id FROM fetches") == [(row.id,)]
        core.close()
    finally:
        server.stop()


async def test_a_test_run_killed_with_sigkill_leaves_no_postgresql_behind() -> None:
    from conftest import wait_for

    tests = Path(__file__).parents[1]
    script = (
        f"import sys; sys.path.insert(0, {str(tests)!r}); from conftest import PostgresServer\n"
        "server = PostgresServer(); print(server.data, flush=True); sys.stdin.read()\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert run.stdin is not None and run.stdout is not None
    data = Path((await trio.to_thread.run_sync(run.stdout.readline)).decode().strip())
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    run.kill()  # no teardown runs
    run.wait()
    run.stdin.close()
    run.stdout.close()

    def gone() -> bool:
        try:
            os.kill(postmaster, 0)
        except ProcessLookupError:
            return not data.parent.exists()
        return False

    await wait_for(gone, what="the server stopped and its directory removed")


def test_postgresql_unreachable_at_start_is_a_clear_error_without_the_password() -> None:
    from refresher._errors import StoreError

    with pytest.raises(StoreError, match="cannot connect") as e:
        PgStore("postgresql://u:pw-secret@127.0.0.1:1/f", node_id="a", partitions=P)
    assert "pw-secret" not in str(e.value)


def test_a_batch_whose_commit_was_not_confirmed_is_not_added_twice(dsn: str) -> None:
    leases = PgLeases(dsn, max_skew=None)
    core = PgStore(dsn, node_id="a", partitions=P)
    core.owned = leases.claim_free("a", P, 1e12, T0)
    rows_, _ = core.add_pages_with_hosts([page(host_in(0), f"/{i}") for i in range(3)], now=NOW)
    batch = [fetch_record(r.id, r.host_id, NOW + 1) for r in rows_]
    assert core.write(batch, []) == 3
    # as if the connection broke while that commit went through: the queue sends it again
    core._unsure = batch_key(batch)
    assert core.write(batch, []) == 3
    assert rows(dsn, "SELECT count(*) FROM fetches") == [(3,)]
    assert rows(dsn, "SELECT sum(fetches) FROM pages") == [(3,)]
    # even when its rows were published to Parquet (gone from fetches) before the retry looks
    with psycopg.connect(dsn) as con:
        con.execute("DELETE FROM fetches")
    core._unsure = batch_key(batch)
    assert core.write(batch, []) == 3
    assert rows(dsn, "SELECT count(*) FROM fetches") == [(0,)]
    assert rows(dsn, "SELECT sum(fetches) FROM pages") == [(3,)]
    # a new batch is written as usual
    assert core.write([fetch_record(rows_[0].id, rows_[0].host_id, NOW + 2)], []) == 1
    assert rows(dsn, "SELECT count(*) FROM fetches") == [(1,)]
    core.close()
    leases.close()


def test_a_documents_findings_outlive_a_node_that_dies_before_discovery_stores_them(
    dsn: str,
) -> None:
    """The findings ride in the fetch's batch transaction; a node killed before its discovery
    stored them leaves them to the partition's next owner, which stores them: no link lost."""
    from refresher.store import Findings

    leases = PgLeases(dsn, max_skew=None)
    a = PgStore(dsn, node_id="a", partitions=P)
    a.owned = leases.claim_free("a", P, 5.0, T0)  # a's leases run out at T0 + 5
    source = host_in(0)
    other = host_in(3)
    (src,), _ = a.add_pages_with_hosts([page(source, "/")], now=NOW)
    findings = Findings(
        depth=0,
        url=src.url,
        links=((f"http://{other}/found", "a"), (f"http://{source}/sibling", "a")),
        canonical=None,
        noindex=False,
        lastmod=(),
    )
    record = dataclasses.replace(fetch_record(src.id, src.host_id, NOW + 1), findings=findings)
    assert a.write([record], []) == 1
    # this run's own findings are its discovery's (in its queue) until the grace has passed
    assert a.owed_documents(10, grace=120.0, now=NOW + 2) == []
    assert [o[1:] for o in a.owed_documents(10, grace=120.0, now=time.time() + 121.0)] == [
        (src.id, NOW + 1, findings)
    ]
    a.close()  # kill -9: discovery never stored them
    b = PgStore(dsn, node_id="b", partitions=P)
    b.owned = leases.claim_free("b", P, 1e12, T0 + 10)  # a's leases expired: b holds all
    ((_row, page_id, fetched_at, got),) = b.owed_documents(10, grace=120.0, now=NOW + 3)
    assert (page_id, fetched_at, got) == (src.id, NOW + 1, findings)
    # b's discovery stores what they found and forgets them, in one transaction
    new = [page(other, "/found"), page(source, "/sibling")]
    update = DocumentUpdate(
        page_id=page_id,
        new=new,
        linked=[p.url for p in new],
        canonical=None,
        noindex=False,
        lastmod=(),
        fetched_at=fetched_at,
    )
    b.save_document(update, now=NOW + 4)
    assert b.owed_documents(10, grace=0.0, now=time.time()) == []
    assert {u for (u,) in rows(dsn, "SELECT url FROM pages")} == {src.url} | {p.url for p in new}
    b.close()
    leases.close()


def test_findings_of_a_partition_the_node_no_longer_holds_wait_for_its_owner(dsn: str) -> None:
    from refresher.store import Findings

    leases = PgLeases(dsn, max_skew=None)
    a = PgStore(dsn, node_id="a", partitions=P)
    a.owned = leases.claim_free("a", P, 5.0, T0)
    (src,), _ = a.add_pages_with_hosts([page(host_in(1), "/")], now=NOW)
    findings = Findings(depth=0, url=src.url, links=(), canonical="http://x.example/")
    record = dataclasses.replace(fetch_record(src.id, src.host_id, NOW + 1), findings=findings)
    assert a.write([record], []) == 1
    b = PgStore(dsn, node_id="b", partitions=P)
    b.owned = leases.claim_free("b", P, 1e12, T0 + 10)  # the partition moved on
    update = DocumentUpdate(
        page_id=src.id,
        new=[],
        linked=[],
        canonical=findings.canonical,
        noindex=False,
        lastmod=(),
        fetched_at=NOW + 1,
    )
    a.save_document(update, now=NOW + 2)  # a's discovery, too late: fenced, kept for b
    assert [o[1] for o in b.owed_documents(10, grace=120.0, now=NOW + 3)] == [src.id]
    # and should a hold the partition again, its own run no longer has them in flight
    assert [o[1] for o in a.owed_documents(10, grace=120.0, now=NOW + 3)] == [src.id]
    assert rows(dsn, "SELECT canonical FROM pages") == [(None,)]
    a.close()
    b.close()
    leases.close()


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan tree."""
    return [plan, *(n for child in plan.get("Plans", []) for n in _plan_nodes(child))]


def test_the_hosts_recent_response_times_read_the_last_300_s_of_the_tail_by_an_index(
    dsn: str,
) -> None:
    """At every solve the allocator asks for each host's mean response time over the last
    300 s; ``fetches`` holds the tail of the history (all of it without fleet.history_dir):
    a day of it here, 200,000 fetches, of which the window holds ~700."""
    from refresher.store._change_stats import ESTIMATOR_COLUMNS, stat_column
    from refresher.store._postgres import estimator_sql

    leases = PgLeases(dsn, max_skew=None)
    store = PgStore(dsn, node_id="a", partitions=P)
    store.owned = leases.claim_free("a", P, 1e12, T0)
    pages, _ = store.add_pages_with_hosts(
        [page(host_in(k % P, prefix=f"r{k}-")) for k in range(16)], now=NOW - 86_400
    )
    ids = [p.id for p in pages]
    with psycopg.connect(dsn) as con:
        # fetch i is of page i mod 16; in the window page k's host answers in (k + 1) × 10 ms,
        # before it in 5 s
        con.execute(
            """
            INSERT INTO fetches (page_id, host_id, started_at, finished_at, duration, status,
                                 bytes, changed, not_modified, policy, redirects, node_id,
                                 epoch, partition)
            SELECT g.id, g.host_id, t - 1, t,
                   CASE WHEN t >= %(now)s - 300 THEN 0.01 * (1 + i %% 16) ELSE 5 END,
                   200, 100, false, false, 'uniform', 0, 'a', 1, g.partition
            FROM (SELECT i, %(now)s - 86400 + i * 86400.0 / 200000 AS t
                  FROM generate_series(1, 200000) i) s
            JOIN pages g ON g.id = (%(ids)s::bigint[])[1 + i %% 16]
            """,
            {"now": NOW, "ids": ids},
        )
        con.execute("ANALYZE fetches")
        columns = [stat_column(c, False) for c in ESTIMATOR_COLUMNS]
        ((explained,),) = con.execute(
            f"EXPLAIN (FORMAT JSON) {estimator_sql(columns)}",
            (NOW - 300, sorted(store.owned)),
        ).fetchall()
    nodes = _plan_nodes(explained[0]["Plan"])
    scans = [n["Node Type"] for n in nodes if n.get("Relation Name") == "fetches"]
    assert scans and "Seq Scan" not in scans and "Parallel Seq Scan" not in scans, scans
    assert "fetches_finished" in {n.get("Index Name") for n in nodes}
    inputs = store.estimator_inputs(meaningful=False, links=False, responses_since=NOW - 300)
    assert inputs.host_response is not None
    by_page = dict(zip(inputs.page_ids.tolist(), inputs.host_response.tolist(), strict=True))
    assert [by_page[i] for i in ids] == pytest.approx([0.01 * (k + 1) for k in range(16)])
    store.close()
    leases.close()
