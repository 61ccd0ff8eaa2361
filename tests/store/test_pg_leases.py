"""Partition leases on a real PostgreSQL: no two nodes ever hold one partition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from refresher.store._pg_leases import ClockSkewError, HoldOff, PgLeases
from refresher.store._pg_schema import init_fleet

P = 16


@pytest.fixture
def fleet(postgres: Callable[..., str]) -> Iterator[tuple[str, PgLeases, PgLeases]]:
    dsn = postgres()
    init_fleet(dsn, partitions=P)
    a, b = PgLeases(dsn, max_skew=None), PgLeases(dsn, max_skew=None)
    yield dsn, a, b
    a.close()
    b.close()


def test_two_nodes_claiming_at_once_get_disjoint_partitions_covering_all(
    fleet: tuple[str, PgLeases, PgLeases],
) -> None:
    _, a, b = fleet
    now = time.time()
    got: dict[str, dict[int, int]] = {}
    barrier = threading.Barrier(2)

    def claim(name: str, leases: PgLeases) -> None:
        barrier.wait()
        got[name] = leases.claim_free(name, 10, 30.0, now)

    threads = [threading.Thread(target=claim, args=x) for x in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(got["a"]).isdisjoint(got["b"])
    assert len(got["a"]) + len(got["b"]) == P
    assert all(epoch == 1 for g in got.values() for epoch in g.values())
    owners = {p.partition: p.owner for p in a.partitions()}
    assert all(owners[p] == "a" for p in got["a"]) and all(owners[p] == "b" for p in got["b"])


def test_a_claim_skips_rows_another_transaction_holds_instead_of_waiting(
    fleet: tuple[str, PgLeases, PgLeases],
) -> None:
    dsn, a, _ = fleet
    with psycopg.connect(dsn) as other:  # a claim in flight on another connection
        other.execute("SELECT * FROM partitions WHERE partition < 4 FOR UPDATE")
        got = a.claim_free("a", P, 30.0, time.time())
        assert sorted(got) == list(range(4, P))
    assert sorted(a.claim_free("a", P, 30.0, time.time())) == [0, 1, 2, 3]


def test_renewal_keeps_held_leases_and_an_expired_lease_goes_to_another_node_with_a_new_epoch(
    fleet: tuple[str, PgLeases, PgLeases],
) -> None:
    _, a, b = fleet
    t0 = 1_000_000.0
    mine = a.claim_free("a", 4, 10.0, t0)
    assert a.renew("a", mine, 10.0, t0 + 5) == mine
    # b sees nothing free until a's leases expire (t0 + 5 + 10)
    assert set(b.claim_free("b", P, 10.0, t0 + 14)).isdisjoint(mine)
    taken = b.claim_free("b", 2, 10.0, t0 + 16)
    assert set(taken) <= set(mine) and len(taken) == 2
    assert all(taken[p] == mine[p] + 1 for p in taken)
    still = a.renew("a", mine, 10.0, t0 + 16)
    assert set(still) == set(mine) - set(taken)
    # a stale epoch renews nothing, even for a partition a owns again later
    assert a.renew("a", {p: e - 1 for p, e in still.items()}, 10.0, t0 + 17) == {}


def test_released_partitions_are_free_at_once(fleet: tuple[str, PgLeases, PgLeases]) -> None:
    _, a, b = fleet
    now = time.time()
    mine = a.claim_free("a", P, 30.0, now)
    assert b.claim_free("b", P, 30.0, now) == {}
    a.release("a", list(mine)[:5])
    got = b.claim_free("b", P, 30.0, now)
    assert sorted(got) == sorted(list(mine)[:5])
    b.release("a", list(got))  # b cannot release a's (or its own, through a's name)
    assert {p.owner for p in a.partitions() if p.partition in got} == {"b"}


def test_heartbeats_list_the_nodes_with_their_leases(
    fleet: tuple[str, PgLeases, PgLeases],
) -> None:
    _, a, b = fleet
    now = time.time()
    a.claim_free("a", 6, 30.0, now)
    a.heartbeat("a", {"fetches": 3}, now)
    b.heartbeat("b", {}, now, stopping=True)
    rows = {n.node_id: n for n in a.nodes(now)}
    assert rows["a"].partitions == 6 and rows["a"].statistics == {"fetches": 3}
    assert rows["b"].partitions == 0 and rows["b"].stopping
    assert rows["a"].clock == pytest.approx(now)
    assert abs(rows["a"].heartbeat_at - now) < 60


def test_a_node_whose_clock_is_far_off_is_refused(postgres: Callable[..., str]) -> None:
    dsn = postgres()
    init_fleet(dsn, partitions=P)
    leases = PgLeases(dsn, max_skew=5.0)
    try:
        with pytest.raises(ClockSkewError, match="off the database's"):
            leases.claim_free("a", 4, 10.0, time.time() + 3600)
        assert leases.partitions()[0].owner is None
        assert len(leases.claim_free("a", 4, 10.0, time.time())) == 4
    finally:
        leases.close()


def test_a_claim_of_expired_leases_holds_their_hosts_off_until_the_old_stop_plus_their_delay(
    fleet: tuple[str, PgLeases, PgLeases],
) -> None:
    """The holder of an expired lease may have died with its hosts' next-allowed times: each
    host waits its delay from the holder's last possible contact (lapse before the expiry);
    a lease handed back already stored them, and a delay that has passed is left alone."""
    dsn, a, b = fleet
    t0 = 1_000_000.0
    a.claim_free("a", P, 10.0, t0)  # expires at t0 + 10: last contact t0 + 10 - 4
    a.release("a", [1])  # a clean hand-over
    a.renew("a", {2: 1}, 10.0, t0 - 50)  # expired at t0 - 40: longer ago than any delay
    hosts = {  # name: (partition, next_allowed, delay)
        "long.test": (0, t0 + 1, 30.0),  # a long Crawl-delay: t0 + 6 + 30
        "short.test": (0, t0 + 2, 1.0),  # t0 + 7 passed before the claim at t0 + 14
        "unknown.test": (0, 0.0, None),  # never recorded: min_delay, t0 + 6 + 20
        "backoff.test": (0, t0 + 500, 30.0),  # backing off past t0 + 36: kept
        "handed.test": (1, t0 + 1, 30.0),  # handed back: the stored time stands
        "old.test": (2, 0.0, None),  # t0 - 44 + at most 30 passed: left alone
    }
    with psycopg.connect(dsn) as con:
        for name, (partition, next_allowed, delay) in hosts.items():
            con.execute(
                "INSERT INTO hosts (name, partition, scheme, next_allowed, delay)"
                " VALUES (%s, %s, 'http', %s, %s)",
                (name, partition, next_allowed, delay),
            )
    got = b.claim_free("b", 3, 10.0, t0 + 14, HoldOff(lapse=4.0, min_delay=20.0, max_delay=30.0))
    assert sorted(got) == [0, 1, 2]
    with psycopg.connect(dsn) as con:
        after = dict(con.execute("SELECT name, next_allowed FROM hosts").fetchall())
    assert after == {
        "long.test": t0 + 36,
        "short.test": t0 + 2,
        "unknown.test": t0 + 26,
        "backoff.test": t0 + 500,
        "handed.test": t0 + 1,
        "old.test": 0.0,
    }
