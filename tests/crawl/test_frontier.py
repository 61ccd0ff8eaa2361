"""The Mercator frontier on trio's autojump clock: politeness, budget, priorities, windows."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math

import pytest
import trio

import refresher.crawl._frontier as frontier_module
from refresher.crawl._frontier import (
    DelayLimits,
    Frontier,
    HostRobots,
    HostTiming,
    Pacer,
    next_allowed_after,
)
from refresher.store import HostRow, PageRow, due_after

EPOCH = 1.7e9  # the injected wall clock starts here


def wall() -> float:
    return EPOCH + trio.current_time()


def host_row(i: int) -> HostRow:
    return HostRow(
        id=i,
        name=f"h{i}.test",
        scheme="http",
        next_allowed=0.0,
        delay=None,
        backoff=0.0,
        errors=0,
        robots_status=None,
        robots_body=None,
        robots_expires_at=None,
        paused=False,
    )


def page(i: int, host: int, due: float) -> PageRow:
    return PageRow(
        id=i,
        url=f"http://h{host}.test/p{i}",
        host_id=host,
        host=f"h{host}.test",
        due_at=due,
        etag=None,
        last_modified=None,
        digest=None,
        target_rate=None,
    )


class FakeStore:
    """The frontier's page source over a list, with the store's keyset semantics."""

    def __init__(self, pages: list[PageRow]) -> None:
        self.pages = pages
        self.queries = 0

    async def __call__(self, after, until, limit, known):
        self.queries += 1
        rows = sorted(
            (p for p in self.pages if (p.due_at, p.id) > after and p.due_at <= until),
            key=lambda p: (p.due_at, p.id),
        )[:limit]
        return rows, {p.host_id: host_row(p.host_id) for p in rows if p.host_id not in known}


def make(pages: list[PageRow], **kw) -> tuple[Frontier, FakeStore]:
    source = FakeStore(pages)
    kw.setdefault("budget", 1000.0)
    return Frontier(source=source, wall_clock=wall, **kw), source


async def run_workers(
    frontier: Frontier,
    workers: int,
    *,
    seconds: float,
    delay: float,
    fetch_time: float,
    on_fetch,
    again: float = 5.0,
) -> None:
    async def worker() -> None:
        while (lease := await frontier.acquire()) is not None:
            start = wall()
            on_fetch(lease, "start", start)
            await trio.sleep(fetch_time)
            end = wall()
            on_fetch(lease, "end", end)
            timing = HostTiming(next_allowed=end + delay, delay=delay, backoff=0.0, errors=0)
            frontier.release(lease, next_due=end + again, timing=timing)

    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        for _ in range(workers):
            nursery.start_soon(worker)
        await trio.sleep(seconds)
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_never_two_requests_in_flight_to_one_host_and_gaps_respect_the_delay(autojump_clock):
    pages = [page(i, host=i % 3, due=EPOCH) for i in range(30)]
    frontier, _ = make(pages, back_queues=9)
    in_flight: collections.Counter[int] = collections.Counter()
    events: dict[int, list[tuple[str, float]]] = collections.defaultdict(list)
    overlaps = []

    def on_fetch(lease, what, t):
        h = lease.host.id
        if what == "start":
            in_flight[h] += 1
            if in_flight[h] > 1:
                overlaps.append(h)
        else:
            in_flight[h] -= 1
        events[h].append((what, t))

    await run_workers(frontier, 8, seconds=30, delay=1.0, fetch_time=0.3, on_fetch=on_fetch)
    assert overlaps == []
    for h, evs in events.items():
        starts = [t for w, t in evs if w == "start"]
        ends = [t for w, t in evs if w == "end"]
        assert len(starts) >= 10, f"host {h} fetched only {len(starts)} times"
        gaps = [s - e for e, s in zip(ends, starts[1:], strict=False)]
        assert min(gaps) >= 1.0 - 1e-9


async def test_hosts_near_their_caps_keep_their_planned_rates_when_pages_are_due_as_planned(
    autojump_clock,
):
    # Two hosts planned at 4 of their 5 fetches/s (one page at 3/s, two at 0.5/s), a third at
    # 2/s, B = 10 = the plan. A page often comes due while its host is still held for another
    # one: due one interval after it *was* due (refresher.store.due_after, the workers' rule),
    # it makes that wait up; due one interval after the fetch, each host got 3.72/s.
    rates = {0: (3.0, 0.5, 0.5), 1: (3.0, 0.5, 0.5), 2: (1.0, 1.0)}
    ids = itertools.count()
    pages = [
        dataclasses.replace(page(next(ids), host, EPOCH), target_rate=f)
        for host, fs in rates.items()
        for f in fs
    ]
    frontier, _ = make(pages, budget=10.0, back_queues=9)
    starts: collections.Counter[int] = collections.Counter()

    async def worker() -> None:
        while (lease := await frontier.acquire()) is not None:
            if wall() - EPOCH > 20:  # after the first rounds
                starts[lease.host.id] += 1
            await trio.sleep(0.002)
            end, p = wall(), lease.page
            late = 0.0 if p.new else end - p.due_at  # as Allocator.due_after_fetch
            due = due_after(end, 1 / (p.target_rate or 1.0), late)
            lease = dataclasses.replace(lease, page=dataclasses.replace(p, digest=b"d"))
            timing = HostTiming(next_allowed=end + 0.2, delay=0.2, backoff=0.0, errors=0)
            frontier.release(lease, next_due=due, timing=timing)

    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        for _ in range(8):
            nursery.start_soon(worker)
        await trio.sleep(120)
        frontier.close()
        nursery.cancel_scope.cancel()
    for host, fs in rates.items():  # 100 s at the planned rate, within a round of each page
        assert sum(fs) * 100 - len(fs) <= starts[host] <= sum(fs) * 100 + len(fs), host


async def test_the_budget_is_spent_and_no_more(autojump_clock):
    pages = [page(i, host=i, due=EPOCH) for i in range(2000)]
    frontier, _ = make(pages, budget=10.0, back_queues=300)
    starts: list[float] = []
    await run_workers(
        frontier,
        64,
        seconds=60,
        delay=0.0,
        fetch_time=0.01,
        on_fetch=lambda lease, what, t: starts.append(t) if what == "start" else None,
    )
    # 60 s at 10 fetches/s, plus at most one second of saved credit
    assert 590 <= len(starts) <= 611
    per_second = collections.Counter(int(t - EPOCH) for t in starts)
    assert max(per_second.values()) <= 20


async def test_the_biased_selector_prefers_high_priority_without_starving_low(autojump_clock):
    # Two front queues' worth of work, far more than the budget can fetch.
    pages = [page(i, host=i, due=EPOCH) for i in range(4000)]
    frontier, _ = make(
        pages,
        budget=20.0,
        back_queues=8,
        front_queues=4,
        prioritize=lambda p, now: 0 if p.id % 2 == 0 else 3,
    )
    levels = collections.Counter()
    await run_workers(
        frontier,
        8,
        seconds=30,
        delay=0.0,
        fetch_time=0.01,
        on_fetch=lambda lease, w, t: (
            levels.update(["high" if lease.page.id % 2 == 0 else "low"]) if w == "start" else None
        ),
    )
    assert levels["low"] > 0, "the low-priority queue starved"
    assert levels["high"] > 3 * levels["low"]


async def test_only_pages_due_within_the_window_are_held_and_memory_is_capped(autojump_clock):
    # 1000 pages due one per second over the next 1000 s
    pages = [page(i, host=i % 50, due=EPOCH + i) for i in range(1000)]
    frontier, source = make(pages, window=60.0, max_pages_in_memory=40, back_queues=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        s = frontier.statistics()
        assert s.in_memory == 40  # capped below the 61 pages the window covers
        assert source.queries == 1
        got = []
        for _ in range(100):
            lease = await frontier.acquire()
            assert lease is not None
            got.append(lease.page.id)
            frontier.release(lease, next_due=None)
            assert frontier.statistics().in_memory <= 40
        # pages come out in due order, each no earlier than due
        assert got == sorted(got) and got == list(range(100))
        assert trio.current_time() >= 99
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_page_due_again_inside_the_window_stays_in_memory(autojump_clock):
    pages = [page(1, host=1, due=EPOCH)]
    frontier, _source = make(pages, window=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        times = []
        for _ in range(5):
            lease = await frontier.acquire()
            assert lease is not None
            times.append(wall())
            frontier.release(lease, next_due=wall() + 2.0)
        assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [2.0] * 4
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_reset_takes_the_stores_due_times_and_keeps_the_held_pages_until_then(
    autojump_clock,
):
    pages = [page(i, host=i, due=EPOCH + 30) for i in range(10)]
    frontier, source = make(pages, window=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        assert frontier.statistics().in_memory == 10
        # the store moved every due time to now
        source.pages = [page(i, host=i, due=EPOCH) for i in range(10)]
        frontier.reset()
        assert frontier.statistics().in_memory == 10  # held until the store is read
        lease = await frontier.acquire()
        assert lease is not None and lease.page.due_at == EPOCH
        assert trio.current_time() < 30
        assert frontier.statistics().in_memory == 10
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_reset_with_every_page_held_in_a_workers_hands_reads_once_one_comes_back(
    autojump_clock,
):
    frontier, source = make([page(1, host=1, due=EPOCH)], max_pages_in_memory=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None
        frontier.reset()
        assert await frontier.load() == 0  # no room to read into
        source.pages = [page(1, host=1, due=EPOCH + 5)]  # the plan moved it
        frontier.release(lease, next_due=None)
        assert await frontier.load() == 1
        again = await frontier.acquire()
        assert again is not None and again.page.due_at == EPOCH + 5
        frontier.close()
        nursery.cancel_scope.cancel()


class LimitsSeen(FakeStore):
    """A page source that notes the ``limit`` of every read."""

    def __init__(self, pages: list[PageRow]) -> None:
        super().__init__(pages)
        self.limits: list[int] = []

    async def __call__(self, after, until, limit, known):
        self.limits.append(limit)
        return await super().__call__(after, until, limit, known)


def held_rows(frontier: Frontier) -> dict[int, PageRow]:
    return {e[1]: e[2] for e in frontier._due}


async def test_a_rescan_reads_in_chunks_and_takes_the_plans_fields_into_the_pages_held(
    autojump_clock, monkeypatch
):
    monkeypatch.setattr(frontier_module, "READ_CHUNK", 3)
    old = [dataclasses.replace(page(i, host=i, due=EPOCH + 30), etag="held") for i in range(12)]
    source = LimitsSeen(old)
    frontier = Frontier(source=source, wall_clock=wall, budget=10.0, window=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        assert len(held_rows(frontier)) == 12
        # the plan: 0-5 sooner with a rate, 6-8 out of the window, 9-11 as they were, and
        # 12-14 come in; the store's etag is older than the one the pages held carry
        moved = [
            dataclasses.replace(p, due_at=EPOCH + 1 + p.id, target_rate=0.5, weight=2.0, etag="x")
            for p in old[:6]
        ]
        gone = [dataclasses.replace(p, due_at=EPOCH + 500) for p in old[6:9]]
        new = [page(i, host=i, due=EPOCH + 2) for i in range(12, 15)]
        source.pages = moved + gone + old[9:] + new
        source.limits.clear()
        frontier.reset()
        await frontier.load()
        held = held_rows(frontier)
        assert sorted(held) == [*range(6), *range(9, 15)]
        assert all(held[p.id] == dataclasses.replace(p, etag="held") for p in moved)
        assert all(held[p.id] == p for p in old[9:] + new)
        assert source.limits and max(source.limits) == 3
        assert frontier.statistics().in_memory == 12 and frontier.known_hosts() == set(held)
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_rescan_of_a_plan_that_moves_every_page_holds_no_second_window(
    autojump_clock, monkeypatch
):
    # 12 pages held, the most the frontier may; the plan moves them all out of the window and
    # 12 others in: the read stops a chunk of new rows in, the swap lets the old pages go,
    # and the loader reads the rest of the window on, a chunk at a time
    monkeypatch.setattr(frontier_module, "READ_CHUNK", 3)
    old = [page(i, host=i, due=EPOCH + 30) for i in range(12)]
    source = LimitsSeen(old)
    frontier = Frontier(
        source=source, wall_clock=wall, budget=10.0, window=60.0, max_pages_in_memory=12
    )
    kept: list[int] = []  # rows read and not yet taken, beside the pages held, at each read

    async def noted(after, until, limit, known):
        kept.append(frontier.statistics().in_memory)
        return await LimitsSeen.__call__(source, after, until, limit, known)

    frontier._source = noted
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        source.pages = [dataclasses.replace(p, due_at=EPOCH + 500) for p in old]
        source.pages += [page(i, host=i, due=EPOCH + i - 10) for i in range(12, 24)]
        kept.clear()
        source.limits.clear()
        frontier.reset()
        await frontier.load()
        assert sorted(held_rows(frontier)) == list(range(12, 24))
        assert max(source.limits) == 3
        # one chunk read beside the 12 held, the swap (3 held), the rest loaded on
        assert kept == [12, 3, 6, 9]
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_page_released_while_a_chunked_rescan_reads_keeps_its_releases_due_time(
    autojump_clock, monkeypatch
):
    monkeypatch.setattr(frontier_module, "READ_CHUNK", 2)
    pages = [page(i, host=i, due=EPOCH + i) for i in range(8)]
    source = SlowStore(pages, seconds=1.0)
    frontier = Frontier(source=source, wall_clock=wall, budget=10.0, window=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None and lease.page.id == 0
        frontier.reset()
        await trio.sleep(1.5)  # its row was read (the first chunk) while it was in hand
        assert frontier._fresh is not None  # the rescan is still reading
        frontier.release(lease, next_due=EPOCH + 100)  # beyond the window
        with trio.fail_after(30):  # virtual seconds: the rescan's three more reads
            while frontier._rescan or frontier._fresh is not None:
                await trio.sleep(0.5)
        assert held_rows(frontier)[0].due_at == EPOCH + 100
        assert sorted(held_rows(frontier)) == list(range(8))
        frontier.close()
        nursery.cancel_scope.cancel()


class SlowStore(FakeStore):
    """A page source that takes ``seconds`` per read (a big store, a busy writer)."""

    def __init__(self, pages: list[PageRow], seconds: float) -> None:
        super().__init__(pages)
        self.seconds = seconds

    async def __call__(self, after, until, limit, known):
        await trio.sleep(self.seconds)
        return await super().__call__(after, until, limit, known)


async def test_a_reset_keeps_the_budget_on_the_wire_while_a_slow_store_is_read(autojump_clock):
    # 400 pages due now on 400 hosts, B = 10/s, a store read taking 1.5 s, a re-plan every
    # 2 s: the pages held stay on offer while each re-plan's read is under way, so no token
    # lapses (dropped at once, each read left the workers 1.5 s without a page)
    pages = [page(i, host=i, due=EPOCH) for i in range(400)]
    source = SlowStore(pages, seconds=1.5)
    frontier = Frontier(source=source, wall_clock=wall, budget=10.0, window=60.0)
    fetched: list[float] = []

    async def replans() -> None:
        while True:
            await trio.sleep(2.0)
            frontier.reset()

    def on_fetch(lease, what, t):
        if what == "start":
            fetched.append(t)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(replans)
        await run_workers(
            frontier, 4, seconds=20, delay=0.0, fetch_time=0.1, on_fetch=on_fetch, again=1000
        )
        nursery.cancel_scope.cancel()
    assert source.queries >= 5  # the re-plans read the store meanwhile
    assert frontier.statistics().lapsed == 0.0
    # every token of the 20 s taken but those of the first read's 1.5 s
    assert len(fetched) >= 10 * (20 - 1.5)


async def test_a_closed_frontier_hands_out_nothing(autojump_clock):
    frontier, _ = make([page(1, host=1, due=EPOCH + 100)])
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)

        async def close_later() -> None:
            await trio.sleep(1)
            frontier.close()

        nursery.start_soon(close_later)
        assert await frontier.acquire() is None
        nursery.cancel_scope.cancel()


def politeness(**kw):
    args = dict(
        finished_at=100.0,
        response_time=0.1,
        min_delay=1.0,
        crawl_delay=None,
        factor=10.0,
        max_delay=60.0,
        failed=False,
        errors=0,
        backoff_base=30.0,
        max_backoff=3600.0,
        retry_after=None,
    )
    args.update(kw)
    return next_allowed_after(**args)


@pytest.mark.parametrize(
    ("kw", "delay"),
    [
        ({}, 1.0),  # k·t = 1.0 ties min_delay
        ({"response_time": 0.5}, 5.0),  # Mercator: k × response time
        ({"crawl_delay": 7.0}, 7.0),  # robots Crawl-delay
        ({"response_time": 20.0}, 60.0),  # capped by max_delay
        ({"min_delay": 2.0, "response_time": 0.0}, 2.0),
    ],
)
def test_the_politeness_delay_is_the_largest_of_its_three_sources_capped(kw, delay):
    next_allowed, d, backoff = politeness(**kw)
    assert d == delay and backoff == 0.0 and next_allowed == 100.0 + delay


def test_errors_back_off_exponentially_up_to_the_cap():
    waits = [politeness(failed=True, errors=n)[2] for n in range(1, 10)]
    assert waits[:4] == [30.0, 60.0, 120.0, 240.0]
    assert max(waits) == 3600.0 and waits == sorted(waits)


def test_retry_after_is_honoured_up_to_the_backoff_cap():
    assert politeness(retry_after=120.0)[0] == 220.0
    assert politeness(retry_after=1e9)[0] == 100.0 + 3600.0
    assert math.isclose(politeness(retry_after=0.5)[0], 101.0)


async def test_release_applies_the_hosts_new_timing_and_robots(autojump_clock):
    pages = [page(1, host=1, due=EPOCH), page(2, host=1, due=EPOCH)]
    frontier, _ = make(pages, window=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None
        timing = HostTiming(next_allowed=wall() + 7.0, delay=7.0, backoff=0.0, errors=0)
        robots = HostRobots(rules="rules", agent="bot", status=404, body=b"", expires_at=EPOCH + 9)
        frontier.release(lease, next_due=None, timing=timing, robots=robots)
        assert (lease.host.next_allowed, lease.host.delay) == (timing.next_allowed, 7.0)
        assert (lease.host.robots, lease.host.robots_agent, lease.host.robots_status) == (
            "rules",
            "bot",
            404,
        )
        released = wall()
        second = await frontier.acquire()
        assert second is not None and second.page.id == 2
        assert wall() - released >= 7.0  # the new next_allowed held the host back
        frontier.close()
        nursery.cancel_scope.cancel()


class StoredTiming(FakeStore):
    """A page source whose host rows carry the timing a run before stored: the last request
    ended at EPOCH, then its delay and backoff."""

    def __init__(self, pages: list[PageRow], *, delay: float | None, backoff: float = 0.0):
        super().__init__(pages)
        self.timing = dict(delay=delay, backoff=backoff)

    async def __call__(self, after, until, limit, known):
        rows, hosts = await super().__call__(after, until, limit, known)
        wait = max(self.timing["delay"] or 0.0, self.timing["backoff"])
        return rows, {
            i: dataclasses.replace(h, next_allowed=EPOCH + wait, errors=1, **self.timing)
            for i, h in hosts.items()
        }


async def first_fetch_at(frontier: Frontier, reload: DelayLimits | None = None) -> float:
    """Wall time of the first page handed out; ``reload``: limits set once it is loaded."""
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        if reload is not None:
            frontier.set_limits(reload)
        lease = await frontier.acquire()
        assert lease is not None
        frontier.close()
        nursery.cancel_scope.cancel()
    return wall()


async def test_a_lower_max_delay_set_at_a_reload_frees_a_host_a_stored_delay_holds(
    autojump_clock,
):
    frontier = Frontier(
        source=StoredTiming([page(1, 1, EPOCH)], delay=60.0), budget=10.0, wall_clock=wall
    )
    at = await first_fetch_at(frontier, DelayLimits(min_delay=1.0, max_delay=5.0))
    assert EPOCH + 5.0 <= at < EPOCH + 6.0  # not EPOCH + 60, the delay stored before


async def test_a_host_read_from_the_store_waits_no_longer_than_the_limits_in_force(
    autojump_clock,
):
    limits = DelayLimits(min_delay=1.0, max_delay=5.0, max_backoff=30.0)
    source = StoredTiming([page(1, 1, EPOCH)], delay=60.0, backoff=600.0)
    frontier = Frontier(source=source, budget=10.0, wall_clock=wall, limits=limits)
    at = await first_fetch_at(frontier)
    assert EPOCH + 30.0 <= at < EPOCH + 31.0  # the backoff capped anew, then the delay


def test_the_limits_in_force_are_the_politeness_sections_delays_and_backoff():
    from refresher._config import PolitenessConfig

    p = PolitenessConfig(min_delay=2.0, max_delay=7.0, max_backoff=90.0, backoff_base=3.0)
    limits = DelayLimits.from_config(p)
    assert limits == DelayLimits(min_delay=2.0, max_delay=7.0, max_backoff=90.0)
    assert limits.delay_range() == (2.0, 7.0)


async def test_a_higher_min_delay_set_at_a_reload_holds_a_known_host_longer(autojump_clock):
    frontier = Frontier(
        source=StoredTiming([page(1, 1, EPOCH)], delay=1.0), budget=10.0, wall_clock=wall
    )
    at = await first_fetch_at(frontier, DelayLimits(min_delay=10.0, max_delay=60.0))
    assert at >= EPOCH + 10.0


async def test_a_host_let_go_before_a_reload_is_bounded_when_its_pages_come_back(
    autojump_clock,
):
    # its release's timing (delay 60) is newer than the row the store gives back (never asked)
    pages = [page(1, 1, EPOCH), page(2, 1, EPOCH + 1)]
    frontier, source = make(pages, budget=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None
        source.pages = []  # both pages let go: the host is forgotten, its timing remembered
        frontier.retain(lambda host: False)
        ended = wall()
        timing = HostTiming(next_allowed=ended + 60.0, delay=60.0, backoff=0.0, errors=0)
        frontier.release(lease, next_due=None, timing=timing)
        assert frontier.known_hosts() == frozenset()
        frontier.set_limits(DelayLimits(max_delay=5.0))
        source.pages = [page(2, 1, EPOCH + 1)]
        frontier.retain(None)
        again = await frontier.acquire()
        assert again is not None and again.page.id == 2
        assert ended + 5.0 <= wall() < ended + 6.0
        frontier.close()
        nursery.cancel_scope.cancel()


def test_limits_leave_a_timing_within_them_exactly_as_it_was_and_a_host_never_asked_alone():
    limits = DelayLimits(min_delay=1.0, max_delay=5.0, max_backoff=30.0)
    within = (EPOCH + 0.1, 3.0, 20.0)
    assert limits.bounded(within) is within
    assert limits.bounded((EPOCH + 9.0, None, 0.0)) == (EPOCH + 9.0, None, 0.0)
    assert limits.bounded((EPOCH + 60.0, 60.0, 0.0)) == (EPOCH + 5.0, 5.0, 0.0)
    assert limits.bounded((EPOCH + 0.5, 0.5, 0.0)) == (EPOCH + 1.0, 1.0, 0.0)


async def test_a_host_given_up_is_no_longer_served_and_its_in_flight_fetch_finishes(
    autojump_clock,
):
    pages = [page(i, host=i % 4, due=EPOCH) for i in range(40)]
    frontier, _ = make(pages, back_queues=8)
    owned = {0, 1, 2, 3}

    class OwnedStore(FakeStore):
        async def __call__(self, after, until, limit, known):
            rows, hosts = await super().__call__(after, until, limit, known)
            return [p for p in rows if p.host_id in owned], hosts

    frontier._source = OwnedStore(pages)
    started: list[tuple[int, float]] = []
    in_hands: list[int] = []
    released = trio.Event()

    async def worker() -> None:
        while (lease := await frontier.acquire()) is not None:
            started.append((lease.host.id, trio.current_time()))
            in_hands.append(lease.host.id)
            await trio.sleep(1.0)
            in_hands.remove(lease.host.id)
            end = wall()
            timing = HostTiming(next_allowed=end + 0.5, delay=0.5, backoff=0.0, errors=0)
            frontier.release(lease, next_due=end + 2.0, timing=timing)

    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        for _ in range(4):
            nursery.start_soon(worker)
        await trio.sleep(0.5)
        assert sorted(in_hands) == [0, 1, 2, 3]
        # hosts 2 and 3 go to another node; host 0 was not ours and comes back
        owned = {0, 1}
        frontier.retain(lambda host: int(host[1:].split(".")[0]) in owned)
        given_up_at = trio.current_time()

        async def wait() -> None:
            await frontier.wait_released(lambda host: host in ("h2.test", "h3.test"))
            released.set()

        nursery.start_soon(wait)
        await released.wait()
        # the fetches in flight to 2 and 3 finished, and nothing else was waited for
        assert trio.current_time() == pytest.approx(given_up_at + 0.5)
        await trio.sleep(10)
        late = [h for h, t in started if t > given_up_at]
        assert late and set(late) == {0, 1}
        assert frontier.statistics().hosts_known <= 2
        # a host gained: its due pages are loaded and served
        owned = {0, 1, 2}
        frontier.retain(lambda host: int(host[1:].split(".")[0]) in owned)
        regained_at = trio.current_time()
        await trio.sleep(5)
        assert [h for h, t in started if t > regained_at and h == 2]
        assert not [h for h, t in started if t > given_up_at and h == 3]
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_worker_waiting_for_a_token_drops_a_host_given_up_meanwhile(autojump_clock):
    # 0.5 fetches/s: the second worker waits a second for its token, holding its host
    pages = [page(0, host=0, due=EPOCH), page(1, host=1, due=EPOCH)]
    frontier, _ = make(pages, budget=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        first = await frontier.acquire()
        assert first is not None
        got: list[object] = []

        async def second() -> None:
            got.append(await frontier.acquire())

        nursery.start_soon(second)
        await trio.sleep(0.1)
        other = 1 - first.host.id
        frontier.retain(lambda host: host != f"h{other}.test")
        await trio.sleep(5)
        assert got == []  # nothing of the given-up host was handed out
        assert frontier.statistics().in_memory == 1  # only the first worker's page
        frontier.close()
        await trio.sleep(0)
        nursery.cancel_scope.cancel()


async def test_a_host_let_go_keeps_its_delay_when_a_stale_row_brings_it_back(autojump_clock):
    frontier, _ = make([page(1, host=1, due=EPOCH)], window=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None
        end = wall()
        timing = HostTiming(next_allowed=end + 5.0, delay=5.0, backoff=0.0, errors=0)
        frontier.release(lease, next_due=None, timing=timing)  # the page and the host go
        assert frontier.statistics().hosts_known == 0
        # the store's row was read before this request's timing was committed
        frontier.add([page(2, host=1, due=EPOCH)], {1: host_row(1)})
        again = await frontier.acquire()
        assert again is not None and wall() >= end + 5.0
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_work_conserving_hands_out_a_page_not_yet_due_when_the_pacer_has_a_token(
    autojump_clock,
):
    pages = [page(1, host=1, due=EPOCH + 30), page(2, host=2, due=EPOCH + 40)]
    frontier, _ = make(pages, budget=1.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None and lease.page.id == 1  # the one due soonest
        assert trio.current_time() < 1  # at once, 30 s before it is due
        assert frontier.statistics().early == 1
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_pacer_woken_late_within_its_credit_loses_no_token(autojump_clock):
    pacer = Pacer(6.0)
    assert max(pacer.reserve() for _ in range(7)) == pytest.approx(0.0)  # credit, then pace
    await trio.sleep(0.9)  # an event loop late by most of a second
    # the 5 tokens due meanwhile are there at once, and the pace goes on after them
    late = [pacer.reserve() for _ in range(5)]
    assert max(late) <= trio.current_time()
    assert pacer.reserve() > trio.current_time()
    assert pacer.lapsed() == 0.0


async def test_a_pacer_counts_the_tokens_left_unused_beyond_its_credit(autojump_clock):
    pacer = Pacer(6.0, burst=1.0)
    assert pacer.lapsed() == 0.0  # not started: nothing is owed before the first token
    await trio.sleep(5.0)
    pacer.reserve()  # at 0, with a second of credit: tokens at −1 s … 0 s
    await trio.sleep(3.0)
    # 1 token used, 6 kept as credit, of the 6 + 3 × 6 issued
    assert pacer.lapsed() == pytest.approx(17.0)
    pacer.set_rate(2.0)  # a new pace counts from now, the lapsed ones stay counted
    assert pacer.lapsed() == pytest.approx(17.0)
    await trio.sleep(2.0)
    assert pacer.lapsed() == pytest.approx(21.0)


async def test_the_frontier_counts_the_budget_left_unused_for_want_of_a_page(autojump_clock):
    frontier, _ = make([page(1, host=1, due=EPOCH)], budget=2.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None
        frontier.release(lease, next_due=None)  # nothing more to fetch
        await trio.sleep(10.0)
        # 2 tokens of credit at the start, 20 more in 10 s: one used, 2 kept
        assert frontier.statistics().lapsed == pytest.approx(19.0)
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_without_work_conservation_a_page_waits_until_due(autojump_clock):
    pages = [page(1, host=1, due=EPOCH + 30)]
    frontier, _ = make(pages, budget=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        lease = await frontier.acquire()
        assert lease is not None and trio.current_time() >= 30
        assert frontier.statistics().early == 0
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_work_conservation_never_hands_a_page_to_a_host_politeness_holds(autojump_clock):
    # host 1 may be contacted again only at +20 s; host 2's page is due later but free now
    pages = [page(1, host=1, due=EPOCH + 5), page(2, host=2, due=EPOCH + 50)]
    frontier, _ = make(pages, budget=1.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        frontier._hosts[1].next_allowed = EPOCH + 20
        first = await frontier.acquire()
        assert first is not None and first.page.id == 2 and trio.current_time() < 1
        second = await frontier.acquire()
        assert second is not None and second.page.id == 1
        assert wall() >= EPOCH + 20  # held by politeness, though the pacer had tokens
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_work_conservation_skips_leased_and_paused_hosts(autojump_clock):
    pages = [page(1, host=1, due=EPOCH), page(2, host=1, due=EPOCH + 10)]
    pages += [page(3, host=2, due=EPOCH + 20), page(4, host=3, due=EPOCH + 30)]
    frontier, _ = make(pages, budget=100.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        frontier.set_paused("h2.test", True)
        held = await frontier.acquire()
        assert held is not None and held.page.id == 1
        # host 1 is in a worker's hands and host 2 paused: host 3's page is pulled forward
        lease = await frontier.acquire()
        assert lease is not None and lease.page.id == 4 and trio.current_time() < 1
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_with_work_conservation_due_pages_still_come_first(autojump_clock):
    # 40 pages due now on 40 hosts, 40 due in 100 s on 40 others, B = 4 per second
    pages = [page(i, host=i, due=EPOCH) for i in range(40)]
    pages += [page(i, host=i, due=EPOCH + 100) for i in range(40, 80)]
    frontier, _ = make(pages, budget=4.0, back_queues=100, work_conserving=True)
    got: list[tuple[int, float]] = []
    await run_workers(
        frontier,
        8,
        seconds=15,
        delay=1.0,
        fetch_time=0.01,
        on_fetch=lambda lease, w, t: got.append((lease.page.id, t)) if w == "start" else None,
        again=300.0,
    )
    ids = [i for i, _ in got]
    assert sorted(ids[:40]) == list(range(40))  # every due page before any early one
    assert any(i >= 40 for i in ids[40:])  # then pages due at +100 s, early
    # and the wire stays at B: 15 s at 4 per second, plus a second of credit
    assert 4 * 15 - 1 <= len(got) <= 4 * 16 + 1


async def test_work_conservation_keeps_one_host_to_its_politeness_delay(autojump_clock):
    # a single-host web: ten pages, B far above what one host's delay allows
    pages = [page(i, host=1, due=EPOCH + 100 + i) for i in range(10)]
    frontier, _ = make(pages, budget=100.0, work_conserving=True)
    starts: list[float] = []
    ends: list[float] = []
    await run_workers(
        frontier,
        4,
        seconds=20,
        delay=2.0,
        fetch_time=0.1,
        on_fetch=lambda lease, w, t: (starts if w == "start" else ends).append(t),
    )
    gaps = [s - e for e, s in zip(ends, starts[1:], strict=False)]
    assert len(starts) >= 8 and min(gaps) >= 2.0 - 1e-9  # as fast as politeness allows, no more


async def test_the_work_conserving_loader_looks_ahead_beyond_the_window_up_to_b_times_it(
    autojump_clock,
):
    pages = [page(i, host=i, due=EPOCH + 1000 + i) for i in range(500)]
    frontier, _ = make(pages, budget=2.0, window=60.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        assert frontier.statistics().in_memory == 120  # B × window, though none is due in it
        frontier.close()
        nursery.cancel_scope.cancel()


async def test_a_stale_row_of_a_page_just_released_does_not_bring_it_back_at_once(autojump_clock):
    # the store's row of page 1 still says due now: its fetch's record is not committed yet
    pages = [page(1, host=1, due=EPOCH), page(2, host=2, due=EPOCH + 2)]
    frontier, _ = make(pages, budget=10.0, window=1.0, work_conserving=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        first = await frontier.acquire()
        assert first is not None and first.page.id == 1
        frontier.release(first, next_due=wall() + 10.0)  # beyond the window: dropped
        frontier.reset()
        await frontier.load()
        lease = await frontier.acquire()
        assert lease is not None and lease.page.id == 2  # page 1 is due in 10 s, not now
        frontier.close()
        nursery.cancel_scope.cancel()


def test_a_replanned_copy_carries_every_field_of_the_page_it_copies():
    # spelt out for speed: a field added to PageRow and not to the copy fails here
    values = {
        f.name: f"v{i}" if f.type in ("str", "str | None") else i + 7
        for i, f in enumerate(dataclasses.fields(PageRow))
    }
    values |= {"digest": b"d", "tried": True, "source": "link"}
    row = PageRow(**values)
    copy = frontier_module._replanned(row, 1.5, 2.5, 3.5, 4.5)
    assert copy == dataclasses.replace(row, due_at=1.5, target_rate=2.5, rate=3.5, weight=4.5)
    assert all(getattr(copy, f.name) != f.default for f in dataclasses.fields(PageRow))


def sitemap(i: int, host: int, due: float) -> PageRow:
    return dataclasses.replace(
        page(i, host, due), url=f"http://h{host}.test/sitemap{i}.xml", source="sitemap"
    )


def polite(delay: float) -> HostTiming:
    return HostTiming(next_allowed=wall() + delay, delay=delay, backoff=0.0, errors=0)


async def fetches(frontier: Frontier, count: int, *, delay: float) -> list[tuple[int, float]]:
    """One worker's ``count`` fetches, each 0.1 s then ``delay`` s of politeness: (page id,
    start offset in seconds) in order; the pages are not due again."""
    order = []
    for _ in range(count):
        lease = await frontier.acquire()
        assert lease is not None
        order.append((lease.page.id, wall() - EPOCH))
        await trio.sleep(0.1)
        frontier.release(lease, next_due=None, timing=polite(delay))
    return order


async def fetch_order(
    pages: list[PageRow], count: int, *, delay: float, **kw
) -> list[tuple[int, float]]:
    """:func:`fetches` from a frontier over ``pages`` (``kw`` to :class:`Frontier`)."""
    frontier, _ = make(pages, **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        order = await fetches(frontier, count, delay=delay)
        frontier.close()
        nursery.cancel_scope.cancel()
    return order


async def test_a_sitemap_that_comes_due_takes_its_hosts_next_slot_ahead_of_its_due_pages(
    autojump_clock,
):
    # five seeds due at the start, the host's sitemap due after the first fetch: read at the
    # host's next politeness slot, not a round later behind the seeds
    pages = [page(i, host=0, due=EPOCH) for i in range(5)] + [sitemap(9, host=0, due=EPOCH + 0.05)]
    order = await fetch_order(pages, 6, delay=1.0)
    assert [i for i, _ in order] == [0, 9, 1, 2, 3, 4]
    starts = [t for _, t in order]
    # still polite (the wall clock's float at 1.7e9 s is good to ~1e-7 s)
    assert all(b - a >= 1.1 - 1e-6 for a, b in itertools.pairwise(starts))


async def test_every_sitemap_due_on_a_host_goes_ahead_of_its_other_pages(autojump_clock):
    pages = [page(i, host=0, due=EPOCH) for i in range(3)]
    pages += [sitemap(8, host=0, due=EPOCH + 0.05), sitemap(9, host=0, due=EPOCH + 0.06)]
    order = [i for i, _ in await fetch_order(pages, 5, delay=1.0)]
    assert order[0] == 0 and set(order[1:3]) == {8, 9} and order[3:] == [1, 2]


async def test_a_page_given_back_after_robots_txt_goes_behind_the_sitemap_it_named(autojump_clock):
    # the worker holding host 0's seed fetches its robots.txt, which names a sitemap: the
    # sitemap is added and taken into host 0's back queue (another worker's acquire) before
    # the seed is given back; the sitemap is read next all the same
    pages = [page(i, host=0, due=EPOCH) for i in range(3)] + [page(5, host=1, due=EPOCH)]
    frontier, _ = make(pages)
    async with trio.open_nursery() as nursery:
        await nursery.start(frontier.run)
        seed = await frontier.acquire()
        assert seed is not None and seed.page.id == 0
        frontier.add([sitemap(9, host=0, due=wall())])
        other = await frontier.acquire()
        assert other is not None and other.host.id == 1
        frontier.requeue(seed, timing=polite(1.0))
        order = await fetches(frontier, 4, delay=1.0)
        frontier.close()
        nursery.cancel_scope.cancel()
    assert [i for i, _ in order] == [9, 0, 1, 2]


async def test_a_sitemap_waiting_for_a_back_queue_is_first_in_line_for_one(autojump_clock):
    # one back queue: host 0's seeds hold it one page at a time, the others wait in the front
    # queues, where host 1's sitemap (due later, of the lowest priority) goes ahead of them
    pages = [page(i, host=0, due=EPOCH) for i in range(4)] + [sitemap(9, host=1, due=EPOCH + 0.05)]
    order = await fetch_order(pages, 5, delay=0.0, back_queues=1, prioritize=lambda p, now: 7)
    assert [i for i, _ in order] == [0, 9, 1, 2, 3]
