"""The assignment rule: shares, claims and sheds, run step by step against a model of the lease
table (a partition is given only when free, as the database's conditional UPDATE does)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher._config import Config
from refresher._errors import ConfigError
from refresher.fleet._assignment import CUT_ALLOWANCE, LeaseTiming, plan_step, share, shares


class LeaseTable:
    """The partitions table: owner per partition (None: free or expired)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.owner: dict[int, str | None] = dict.fromkeys(range(partitions))
        self.moves = 0  # partitions that went from one node to another

    def held(self, node: str) -> int:
        return sum(1 for o in self.owner.values() if o == node)

    def round(self, live: list[str], rng: random.Random) -> bool:
        """Every live node plans from the same snapshot, then the sheds and the claims reach
        the database in a random order; True when nothing changed."""
        snapshot = dict(self.owner)
        plans = {
            n: plan_step(partitions=self.partitions, node=n, live=live, owners=snapshot)
            for n in live
        }
        changed = False
        for node, step in plans.items():
            for p in step.shed:
                assert self.owner[p] == node, "a node shed a partition it does not hold"
                self.owner[p] = None
                changed = True
        order = list(live)
        rng.shuffle(order)
        for node in order:
            free = [p for p, o in self.owner.items() if o is None or o not in live]
            for p in free[: plans[node].claim]:
                previous = self.owner[p]
                # the conditional UPDATE: only a free (or dead owner's, expired) partition
                assert previous is None or previous not in live
                self.owner[p] = node
                changed = True
        return not changed

    def converge(self, live: list[str], rng: random.Random) -> int:
        """Rounds until the split is stable; fails after a bound."""
        for rounds in range(1, 4 * self.partitions + 20):
            if self.round(live, rng):
                return rounds
        raise AssertionError("no convergence")


def test_shares_add_up_to_p_and_differ_by_at_most_one():
    s = shares(10, ["c", "a", "b"])
    assert s == {"a": 4, "b": 3, "c": 3}
    assert share(10, ["a", "b", "c"], "d") == 0
    assert shares(10, []) == {}


@settings(max_examples=150, deadline=None)
@given(
    partitions=st.integers(1, 80),
    first=st.integers(1, 5),
    events=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=6),
    seed=st.integers(0, 2**32),
)
def test_repeated_steps_converge_to_an_even_split_as_nodes_join_and_leave(
    partitions, first, events, seed
):
    rng = random.Random(seed)
    table = LeaseTable(partitions)
    live = [f"n{i}" for i in range(first)]
    table.converge(live, rng)
    for join, who in events:
        name = f"n{who}"
        if join and name not in live:
            live.append(name)
        elif not join and name in live and len(live) > 1:
            live.remove(name)
            # a dead node's leases expire
            for p, o in table.owner.items():
                if o == name:
                    table.owner[p] = None
        table.converge(live, rng)
        expected = shares(partitions, live)
        assert {n: table.held(n) for n in live} == expected
        assert all(o in live for o in table.owner.values())


@settings(max_examples=100, deadline=None)
@given(partitions=st.integers(1, 200), nodes=st.integers(1, 6), seed=st.integers(0, 2**32))
def test_a_joining_node_moves_only_its_own_share_and_gradually(partitions, nodes, seed):
    rng = random.Random(seed)
    table = LeaseTable(partitions)
    live = [f"n{i}" for i in range(nodes)]
    table.converge(live, rng)
    before = dict(table.owner)
    live.append("new")
    snapshot = dict(table.owner)
    table.converge(live, rng)
    moved = sum(1 for p in range(partitions) if table.owner[p] != before[p])
    # sticky: only what the newcomer takes changes hands
    assert moved == share(partitions, live, "new")
    # gradual: one step sheds at most a quarter of a node's share (at least one)
    for n in live[:-1]:
        step = plan_step(partitions=partitions, node=n, live=live, owners=snapshot)
        assert len(step.shed) <= max(1, -(-share(partitions, live, n) // 4))


def test_a_stable_split_stays_put():
    table = LeaseTable(16)
    live = ["a", "b", "c"]
    table.converge(live, random.Random(1))
    for n in live:
        step = plan_step(partitions=16, node=n, live=live, owners=table.owner)
        assert step.claim == 0 and step.shed == ()


def test_a_node_sheds_nothing_while_the_newcomer_can_take_free_partitions():
    owners: dict[int, str | None] = dict.fromkeys(range(8), "a")
    owners[7] = None
    step = plan_step(partitions=8, node="a", live=["a", "b"], owners=owners)
    # b misses 4 and one is free: a sheds at most 3 over time, here a quarter of its share
    assert step.shed == (6,)
    owners.update({4: "b", 5: "b", 6: "b", 7: "b"})
    assert plan_step(partitions=8, node="a", live=["a", "b"], owners=owners).shed == ()


def test_the_stop_comes_one_heartbeat_and_one_cut_before_the_expiry():
    t = LeaseTiming(ttl=3.0, fetch_deadline=0.5)
    assert t.heartbeat == pytest.approx(1.0)
    assert t.stop_at(100.0) == pytest.approx(100.0 + 3.0 - 1.0 - 0.5)
    assert t.max_skew == pytest.approx(0.75)
    t.check()
    # requests are cut at the stop, not waited for: a long fetch timeout needs no longer lease
    long = LeaseTiming(ttl=10.0, fetch_deadline=30.0)
    long.check()
    assert long.margin == pytest.approx(10.0 / 3 + CUT_ALLOWANCE)
    with pytest.raises(ConfigError, match=r"fleet.lease_ttl.*above 3 s"):
        LeaseTiming(ttl=2.5, fetch_deadline=30.0).check()


def test_the_issues_default_lease_ttl_works_with_the_default_fetch_timeout():
    assert Config().fleet.lease_ttl == 10.0
    LeaseTiming(ttl=Config().fleet.lease_ttl, fetch_deadline=Config().fetch.timeout).check()


def test_a_node_refuses_to_run_with_a_lease_ttl_too_short_to_stop_in_time(tmp_path):
    from conftest import cli

    config = tmp_path / "r.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path}/r.duckdb"\n[fetch]\ntimeout = 30.0\n'
        '[fleet]\ndsn = "postgresql://refresher@127.0.0.1:1/fleet"\nlease_ttl = 2.0\n'
    )
    done = cli("run", "--config", str(config))
    assert done.returncode == 1
    errors = [line for line in done.stdout.splitlines() if "cannot run" in line]
    assert len(errors) == 1 and "fleet.lease_ttl" in errors[0]
    assert "cannot connect" not in done.stdout  # refused before the database is tried
    assert not list(tmp_path.glob("*.duckdb"))
