"""Tests for the URL-seen test: fingerprints, the CLOCK cache against a textbook model, UrlSeen."""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher._errors import ConfigError, StoreError
from refresher.discover._seen import ClockCache, UrlSeen, fingerprint, fingerprints

# --- fingerprints -------------------------------------------------------------------------------


def test_a_fingerprint_is_the_little_endian_signed_blake2b_64_digest() -> None:
    digest = hashlib.blake2b(b"http://example.com/", digest_size=8).digest()
    assert fingerprint("http://example.com/") == int.from_bytes(digest, "little", signed=True)


def test_fingerprints_are_pinned_so_they_stay_stable_across_runs_and_machines() -> None:
    # Stored in DuckDB: a change of hash, byte order or encoding would make every URL new again.
    assert fingerprint("http://example.com/") == 481213410437047035
    assert fingerprint("") == -5426141060434712860


def test_fingerprints_fit_a_signed_bigint() -> None:
    values = [fingerprint(f"http://h{i}.example/p") for i in range(2000)]
    assert all(-(2**63) <= v < 2**63 for v in values)
    assert min(values) < 0 < max(values)


def test_the_array_form_agrees_with_the_scalar_form_in_order() -> None:
    urls = ["http://a.example/", "http://b.example/x?y=1", "http://a.example/", "http://ü.example/"]
    array = fingerprints(urls)
    assert array.dtype == np.int64
    assert array.tolist() == [fingerprint(u) for u in urls]


def test_fingerprints_of_no_urls_is_an_empty_int64_array() -> None:
    array = fingerprints([])
    assert array.dtype == np.int64 and array.shape == (0,)


def test_a_lone_surrogate_still_has_a_fingerprint() -> None:
    assert fingerprint("http://a.example/\udcff") != fingerprint("http://a.example/")
    assert fingerprints(["http://a.example/\udcff"]).tolist() == [
        fingerprint("http://a.example/\udcff")
    ]


# --- the CLOCK cache against a textbook model ---------------------------------------------------


class TextbookClock:
    """CLOCK as the paper states it: a circle of k items with mark bits and a hand. A hit marks
    its item. An insert into a full circle moves the hand, unmarking, to the first unmarked item,
    replaces it (unmarked) and moves the hand on by one. Deliberately naive: lists and scans."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[int] = []
        self.marks: list[bool] = []
        self.hand = 0
        self.evictions = 0

    def lookup(self, item: int) -> bool:
        if item in self.items:
            self.marks[self.items.index(item)] = True
            return True
        return False

    def insert(self, item: int) -> None:
        if item in self.items:
            return
        if len(self.items) < self.capacity:
            self.items.append(item)
            self.marks.append(False)
            return
        while self.marks[self.hand]:
            self.marks[self.hand] = False
            self.hand = (self.hand + 1) % self.capacity
        self.items[self.hand] = item
        self.marks[self.hand] = False
        self.hand = (self.hand + 1) % self.capacity
        self.evictions += 1


# Few distinct keys so traces repeat themselves; some share their low bits (the index's home
# position) so probe runs collide, wrap round the index and get shifted back on eviction.
keys = st.one_of(
    st.integers(0, 14),
    st.integers(-3, -1),
    st.sampled_from([2**63 - 1, -(2**63), 2**40, 2**40 + 16, -(2**40), 64, 4096]),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("request"), keys),
        st.tuples(st.just("lookup"), keys),
        st.tuples(st.just("insert"), keys),
        st.tuples(st.just("contains"), keys),
        st.tuples(st.just("lookup_many"), st.lists(keys, max_size=40)),
        st.tuples(st.just("insert_many"), st.lists(keys, max_size=6)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 9), trace=operations)
def test_the_clock_cache_hits_and_misses_exactly_like_the_textbook_clock(
    capacity: int, trace: list[tuple[str, int | list[int]]]
) -> None:
    cache, model = ClockCache(capacity), TextbookClock(capacity)
    hits = misses = 0
    for op, arg in trace:
        if op == "request":  # the paper's use: look up, and on a miss insert
            assert isinstance(arg, int)
            hit = cache.lookup(arg)
            assert hit == model.lookup(arg), f"request {arg}"
            if not hit:
                cache.insert(arg)
                model.insert(arg)
            hits, misses = hits + hit, misses + (not hit)
        elif op == "lookup":
            assert isinstance(arg, int)
            hit = cache.lookup(arg)
            assert hit == model.lookup(arg), f"lookup {arg}"
            hits, misses = hits + hit, misses + (not hit)
        elif op == "insert":
            assert isinstance(arg, int)
            cache.insert(arg)
            model.insert(arg)
        elif op == "contains":
            assert (arg in cache) == (arg in model.items)
        elif op == "lookup_many":
            assert isinstance(arg, list)
            mask = cache.lookup_many(np.array(arg, dtype=np.int64))
            assert mask.tolist() == [model.lookup(k) for k in arg], f"lookup_many {arg}"
            hits, misses = hits + sum(mask.tolist()), misses + len(arg) - sum(mask.tolist())
        else:
            assert isinstance(arg, list)
            cache.insert_many(np.array(arg, dtype=np.int64))
            for k in arg:
                model.insert(k)
        assert len(cache) == len(model.items)
    assert sorted(k for k in set(model.items) | {0, 1, -1, 2**62} if k in cache) == sorted(
        model.items
    )
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.evictions) == (hits, misses, model.evictions)
    assert stats.size == len(model.items) and stats.capacity == capacity


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 6), requests=st.lists(st.integers(0, 9), max_size=300))
def test_a_request_trace_hits_and_misses_like_the_textbook_clock(
    capacity: int, requests: list[int]
) -> None:
    # The paper's trace: every request is a lookup, and a miss is inserted. Few keys, long
    # traces: the hand laps the circle many times with bits set in every pattern.
    cache, model = ClockCache(capacity), TextbookClock(capacity)
    outcomes, expected = [], []
    for key in requests:
        outcomes.append(cache.lookup(key))
        expected.append(model.lookup(key))
        if not outcomes[-1]:
            cache.insert(key)
        if not expected[-1]:
            model.insert(key)
    assert outcomes == expected
    assert cache.statistics().evictions == model.evictions


# Keys that share their low bits share their home in the index: one long probe run starting at
# position 0, and one starting at the last position that wraps round. Batches of them go through
# the vectorised probe rounds and the scalar tail of lookup_many.
crowding = st.one_of(
    st.integers(0, 300),
    st.integers(0, 300).map(lambda j: j << 20),
    st.integers(1, 300).map(lambda j: (j << 20) - 1),
)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 64),
    inserted=st.lists(crowding, min_size=1, max_size=150),
    data=st.data(),
)
def test_batched_lookups_agree_with_the_model_on_batches_of_every_size(
    capacity: int, inserted: list[int], data: st.DataObject
) -> None:
    cache, model = ClockCache(capacity), TextbookClock(capacity)
    cache.insert_many(np.array(inserted, dtype=np.int64))
    for k in inserted:
        model.insert(k)
    likely_hits = st.sampled_from(inserted[-capacity:]) | crowding
    for batch in data.draw(st.lists(st.lists(likely_hits, max_size=200), max_size=3)):
        mask = cache.lookup_many(np.array(batch, dtype=np.int64))
        assert mask.tolist() == [model.lookup(k) for k in batch]
    for k in range(301, 301 + capacity):  # evictions now follow the reference bits set above
        cache.insert(k)
        model.insert(k)
        assert len(cache) == len(model.items) and all(k in cache for k in model.items)


def test_a_hit_gives_an_entry_a_second_chance() -> None:
    cache = ClockCache(3)
    cache.insert_many(np.array([1, 2, 3]))
    assert cache.lookup(1)
    cache.insert(4)  # the hand passes 1 (clearing its bit) and evicts 2
    assert 1 in cache and 2 not in cache and 3 in cache and 4 in cache
    cache.insert(5)  # 3 is next round the circle, unreferenced
    assert 3 not in cache and 1 in cache
    cache.insert(6)  # 1 has spent its second chance
    assert 1 not in cache


def test_when_every_bit_is_set_the_hand_goes_round_once_and_evicts_where_it_started() -> None:
    cache = ClockCache(4)
    cache.insert_many(np.array([10, 11, 12, 13]))
    cache.insert(14)  # evicts 10, hand at 11
    assert cache.lookup_many(np.array([11, 12, 13, 14])).all()
    cache.insert(15)
    assert 11 not in cache
    assert [k in cache for k in (12, 13, 14, 15)] == [True] * 4
    assert cache.statistics().evictions == 2


def test_a_lap_that_wraps_round_clears_the_bits_it_passes_before_the_victim() -> None:
    cache = ClockCache(4)
    cache.insert_many(np.array([1, 2, 3, 4, 5]))  # 5 takes slot 0, the hand is at slot 1
    assert cache.lookup_many(np.array([5, 2, 3, 4])).all()
    cache.insert(6)  # a full lap, clearing every bit, then 2 (slot 1) goes
    cache.insert_many(np.array([7, 8]))  # 3 and 4 go, their bits already cleared
    cache.insert(9)  # 5's bit was cleared on the lap: it goes, not 6
    assert 5 not in cache
    assert [k in cache for k in (6, 7, 8, 9)] == [True] * 4


def test_contains_leaves_the_reference_bit_alone() -> None:
    cache = ClockCache(2)
    cache.insert_many(np.array([1, 2]))
    assert 1 in cache
    cache.insert(3)  # 1 was only asked about, never looked up: it goes first
    assert 1 not in cache and 2 in cache
    assert cache.statistics().hits == cache.statistics().misses == 0


def test_contains_answers_false_for_what_cannot_be_a_fingerprint() -> None:
    cache = ClockCache(2)
    cache.insert(5)
    assert np.int64(5) in cache
    assert "5" not in cache and 2**64 not in cache and 5.0 not in cache


def test_inserting_a_cached_fingerprint_changes_nothing() -> None:
    cache = ClockCache(2)
    cache.insert_many(np.array([1, 2, 1, 2, 1]))
    assert len(cache) == 2 and cache.statistics().evictions == 0


def test_a_large_cache_finds_every_fingerprint_it_keeps_and_only_those() -> None:
    rng = np.random.default_rng(7)
    cache = ClockCache(5000)
    stream = rng.integers(-(2**63), 2**63 - 1, 12_000, dtype=np.int64, endpoint=True)
    cache.insert_many(stream)
    kept = stream[-5000:]  # never looked up, so CLOCK evicts first in, first out
    assert cache.lookup_many(kept).all()
    assert not cache.lookup_many(stream[:7000]).any()
    assert [cache.lookup(k) for k in kept[:50].tolist()] == [True] * 50
    stats = cache.statistics()
    assert (stats.size, stats.evictions, stats.hits, stats.misses) == (5000, 7000, 5050, 7000)
    assert stats.hit_rate == pytest.approx(5050 / 12_050)


def test_lookup_many_counts_a_repeated_fingerprint_each_time() -> None:
    cache = ClockCache(4)
    cache.insert(9)
    assert cache.lookup_many(np.array([9, 9, 8])).tolist() == [True, True, False]
    assert (cache.statistics().hits, cache.statistics().misses) == (2, 1)
    assert cache.lookup_many(np.array([], dtype=np.int64)).shape == (0,)


def test_statistics_start_empty_with_a_zero_hit_rate() -> None:
    stats = ClockCache(100).statistics()
    assert (stats.size, stats.hits, stats.misses, stats.evictions, stats.hit_rate) == (
        0,
        0,
        0,
        0,
        0.0,
    )
    assert 17 * 100 <= stats.nbytes <= 25 * 100


@pytest.mark.parametrize("capacity", [0, -1, 2**29 + 1])
def test_an_impossible_capacity_is_refused_with_the_range(capacity: int) -> None:
    with pytest.raises(ConfigError, match="1 to"):
        ClockCache(capacity)


def test_a_fingerprint_outside_int64_is_refused_and_leaves_the_cache_as_it_was() -> None:
    cache = ClockCache(2)
    with pytest.raises(ValueError, match="outside int64"):
        cache.insert(2**63)
    assert len(cache) == 0


# --- UrlSeen in front of a fake store -----------------------------------------------------------


class FakeStore:
    """The store's side of the URL-seen test: a set of fingerprints, with every batch recorded."""

    def __init__(self, known: list[str] = ()) -> None:  # type: ignore[assignment]
        self.fps = {fingerprint(u) for u in known}
        self.batches: list[list[int]] = []

    async def lookup(self, fps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        assert fps.dtype == np.int64
        self.batches.append(fps.tolist())
        return np.array([f in self.fps for f in fps.tolist()], dtype=np.bool_)

    def persist(self, urls: list[str]) -> None:
        self.fps.update(fingerprint(u) for u in urls)


URLS = [f"http://h{i % 3}.example/p{i}" for i in range(10)]


async def test_urls_never_seen_come_back_in_order_after_one_store_batch() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=100, lookup=store.lookup)
    assert await seen.filter_new(URLS) == URLS
    assert store.batches == [fingerprints(URLS).tolist()]


async def test_urls_seen_before_are_answered_by_the_cache_without_the_store() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=100, lookup=store.lookup)
    await seen.filter_new(URLS)
    assert await seen.filter_new(URLS[::-1]) == []
    assert len(store.batches) == 1
    stats = seen.statistics()
    assert (stats.cache.hits, stats.cache.misses, stats.store_lookups) == (10, 10, 1)


async def test_only_the_misses_go_to_the_store_in_one_batch() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=100, lookup=store.lookup)
    await seen.filter_new(URLS[:4])
    mixed = [URLS[0], URLS[5], URLS[1], URLS[6], URLS[7]]
    assert await seen.filter_new(mixed) == [URLS[5], URLS[6], URLS[7]]
    assert store.batches[1] == fingerprints([URLS[5], URLS[6], URLS[7]]).tolist()


async def test_a_url_repeated_within_a_batch_counts_once() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=100, lookup=store.lookup)
    batch = ["http://a.example/", "http://b.example/", "http://a.example/", "http://a.example/"]
    assert await seen.filter_new(batch) == ["http://a.example/", "http://b.example/"]
    assert store.batches == [fingerprints(["http://a.example/", "http://b.example/"]).tolist()]
    stats = seen.statistics()
    assert (stats.urls, stats.batch_duplicates, stats.new, stats.cache.misses) == (4, 2, 2, 2)


async def test_urls_the_store_knows_are_not_new_and_are_cached_afterwards() -> None:
    store = FakeStore(known=URLS[:5])
    seen = UrlSeen(capacity=100, lookup=store.lookup)
    assert await seen.filter_new(URLS) == URLS[5:]
    assert await seen.filter_new(URLS[:5]) == []
    assert len(store.batches) == 1
    stats = seen.statistics()
    assert (stats.store_checked, stats.store_hits, stats.new) == (10, 5, 5)


async def test_an_evicted_url_is_checked_again_and_the_store_decides() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=2, lookup=store.lookup)
    new = await seen.filter_new(["http://a.example/", "http://b.example/", "http://c.example/"])
    store.persist(new)  # the caller's part: new URLs become pages
    assert await seen.filter_new(["http://a.example/"]) == []
    assert store.batches[-1] == [fingerprint("http://a.example/")]
    assert seen.statistics().cache.evictions >= 1


async def test_an_empty_batch_asks_nobody() -> None:
    store = FakeStore()
    seen = UrlSeen(capacity=10, lookup=store.lookup)
    assert await seen.filter_new([]) == []
    assert store.batches == [] and seen.statistics().cache.misses == 0


async def test_a_failing_store_marks_nothing_seen() -> None:
    store = FakeStore()
    broken = True

    async def lookup(fps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        if broken:
            raise StoreError("the store is closed; reopen it")
        return await store.lookup(fps)

    seen = UrlSeen(capacity=10, lookup=lookup)
    with pytest.raises(StoreError, match="closed"):
        await seen.filter_new(URLS[:3])
    broken = False
    assert await seen.filter_new(URLS[:3]) == URLS[:3]


async def test_a_store_answer_of_the_wrong_length_is_refused() -> None:
    async def lookup(fps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return np.zeros(fps.size + 1, dtype=np.bool_)

    seen = UrlSeen(capacity=10, lookup=lookup)
    with pytest.raises(StoreError, match="4 flags for 3 fingerprints"):
        await seen.filter_new(URLS[:3])
    assert len(seen.cache) == 0


async def test_concurrent_calls_never_both_return_a_url() -> None:
    store = FakeStore()
    release = trio.Event()

    async def slow_lookup(fps: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        await release.wait()
        return await store.lookup(fps)

    seen = UrlSeen(capacity=100, lookup=slow_lookup)
    results: list[list[str]] = []

    async def call() -> None:
        results.append(await seen.filter_new(URLS))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert sorted(results, key=len) == [[], URLS]
    assert len(store.batches) == 1
