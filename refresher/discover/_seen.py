"""The URL-seen test of Broder, Najork & Wiener: a CLOCK cache of 64-bit fingerprints.

Every link a page yields must be checked against the set of URLs already known before it may
become a new page. The persistent set lives in the store; :class:`UrlSeen` puts a small
:class:`ClockCache` in front of it so most tests are answered in memory (the paper: about 50,000
entries answer about 80 % of the tests of a large crawl), and sends the misses of one call to
the store in one batched lookup.

A URL is reduced to a 64-bit fingerprint (:func:`fingerprint`, BLAKE2b with an 8-byte digest read
as a little-endian signed integer), so it fits a DuckDB ``BIGINT`` and is the same on every run
and every machine. Two URLs share a fingerprint with probability about n²/2⁶⁵ for n URLs
(about 3 × 10⁻⁶ for ten million), which the paper accepts as well.

The cache keeps its entries in flat arrays, so an entry costs 17 to 25 bytes (8 for the
fingerprint, 1 for the reference bit, 8 to 16 for a linear-probing index of 32-bit slot numbers
kept at most half full) instead of the hundred-odd bytes of a Python ``dict`` entry.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import trio

from refresher._errors import ConfigError, StoreError

__all__ = [
    "ClockCache",
    "ClockStatistics",
    "SeenLookup",
    "UrlSeen",
    "UrlSeenStatistics",
    "fingerprint",
    "fingerprints",
]

#: ``lookup(fps)`` → a boolean mask: which of these fingerprints (int64, distinct) the store
#: already holds. One call is one batch; the mask has the length of ``fps``.
SeenLookup = Callable[[npt.NDArray[np.int64]], Awaitable[npt.NDArray[np.bool_]]]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_MAX_CAPACITY = 1 << 29  # slot numbers and index positions stay within int32
#: A numpy call costs about as much as a dozen scalar probes, so batches smaller than
#: _BATCH_FROM, and probe rounds with fewer than _ROUND_FROM keys left, go one key at a time.
_BATCH_FROM = 48
_ROUND_FROM = 24

# numpy views share the memory of these arrays; check once that the type codes have the width
# the views assume.
assert array("q").itemsize == 8 and array("i").itemsize == 4


def fingerprint(url: str) -> int:
    """The 64-bit fingerprint of ``url``, in [-2⁶³, 2⁶³) (a DuckDB ``BIGINT``).

    The URL is hashed as given: canonicalise it first so equal URLs have equal text.
    """
    digest = hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def fingerprints(urls: Sequence[str]) -> npt.NDArray[np.int64]:
    """The fingerprints of ``urls`` as an int64 array, in order (see :func:`fingerprint`)."""
    blake2b = hashlib.blake2b
    joined = b"".join(
        [blake2b(u.encode("utf-8", "surrogatepass"), digest_size=8).digest() for u in urls]
    )
    return np.frombuffer(joined, dtype="<i8").astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockStatistics:
    """A snapshot of a :class:`ClockCache`; counts are since it was made."""

    capacity: int  # entries
    size: int  # entries held
    hits: int  # lookups that found their fingerprint
    misses: int  # lookups that did not
    evictions: int  # entries pushed out by inserts
    hit_rate: float  # hits / (hits + misses); 0.0 before the first lookup
    nbytes: int  # bytes of the cache's arrays (fingerprints, reference bits, index)


class ClockCache:
    """CLOCK (second-chance) cache of 64-bit fingerprints, fixed capacity.

    Slots form a circle with one reference bit each. A lookup that hits sets the bit of its slot.
    An insert into a full cache moves the hand round the circle, clearing set bits, to the first
    slot whose bit is clear; that entry is evicted, the new one takes its slot with a clear bit,
    and the hand moves one past it. Until the cache is full, inserts fill the slots in order.

    An index of 32-bit slot numbers (open addressing, linear probing, at most half full, deletion
    by backward shift) finds a fingerprint's slot. Its home position is the fingerprint's low
    bits, as in Mercator: fingerprints from :func:`fingerprint` are uniform, and so are small
    counters; keys that share their low bits (multiples of a power of two) would probe long runs.

    :meth:`lookup` and :meth:`insert` work on one Python ``int``; :meth:`lookup_many` answers a
    whole array at numpy speed and has the same effect as :meth:`lookup` on each element in turn.
    """

    def __init__(self, capacity: int) -> None:
        if not 1 <= capacity <= _MAX_CAPACITY:
            raise ConfigError(
                f"a URL-seen cache holds 1 to {_MAX_CAPACITY} entries, not {capacity}; "
                "choose a capacity in that range (about 50,000 serves a large crawl)"
            )
        self._capacity = capacity
        bits = max(2, (2 * capacity - 1).bit_length())  # index size ≥ 2 × capacity
        self._mask = (1 << bits) - 1
        # array.array for fast scalar access from Python, numpy views of the same memory for the
        # vectorised path; neither is ever resized, so the views stay valid.
        self._fps = array("q", bytes(8 * capacity))
        self._ref = bytearray(capacity)
        self._index = array("i", [-1]) * (1 << bits)
        self._fps_np = np.frombuffer(self._fps, dtype=np.int64)
        self._ref_np = np.frombuffer(self._ref, dtype=np.uint8)
        self._index_np = np.frombuffer(self._index, dtype=np.int32)
        self._size = 0
        self._hand = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache's arrays (about 17 to 25 per entry of capacity)."""
        return len(self._fps) * 8 + len(self._ref) + len(self._index) * 4

    def __len__(self) -> int:
        return self._size

    def __contains__(self, fp: object) -> bool:
        """Whether ``fp`` is cached; unlike :meth:`lookup` it neither counts nor sets a bit."""
        if not isinstance(fp, int | np.integer):
            return False
        fp = int(fp)
        return _INT64_MIN <= fp <= _INT64_MAX and self._slot_of(fp) >= 0

    def _slot_of(self, fp: int) -> int:
        return self._find(fp, fp & self._mask)

    def _find(self, fp: int, i: int) -> int:
        """The slot of ``fp``, probing from index position ``i`` on; -1 if not cached."""
        index, fps, mask = self._index, self._fps, self._mask
        while True:
            slot = index[i]
            if slot < 0 or fps[slot] == fp:
                return slot
            i = (i + 1) & mask

    def lookup(self, fp: int) -> bool:
        """Whether ``fp`` is cached; a hit sets its reference bit. Counts a hit or a miss."""
        # _slot_of inlined: this is the hot path the ≥ 500,000 lookups/s goal is about.
        index, fps, mask = self._index, self._fps, self._mask
        i = fp & mask
        while True:
            slot = index[i]
            if slot < 0:
                self._misses += 1
                return False
            if fps[slot] == fp:
                self._ref[slot] = 1
                self._hits += 1
                return True
            i = (i + 1) & mask

    def lookup_many(self, fps: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which of ``fps`` (a 1-D int64 array) are cached, as a boolean mask.

        The same effect as :meth:`lookup` on each element in order: hits set reference bits and
        every element counts as a hit or a miss (a repeated element counts each time).
        """
        keys = np.ascontiguousarray(fps, dtype=np.int64).reshape(-1)
        if keys.size < _BATCH_FROM:
            lookup = self.lookup
            return np.array([lookup(k) for k in keys.tolist()], dtype=np.bool_)
        index, fingerprints, mask = self._index_np, self._fps_np, self._mask
        # All keys probe their home position at once. Slot -1 (empty) reads the last slot's
        # fingerprint; ``occupied`` masks that out, which is cheaper than avoiding the read.
        position = keys & mask
        slots = index[position]
        occupied = slots >= 0
        found: npt.NDArray[np.bool_] = occupied & (fingerprints[slots] == keys)
        self._ref_np[slots[found]] = 1
        # The keys that met another key probe on: vectorised while many, then one by one.
        pending = np.flatnonzero(occupied ^ found)
        position = (position[pending] + 1) & mask
        while pending.size >= _ROUND_FROM:
            slots = index[position]
            occupied = slots >= 0
            hit = occupied & (fingerprints[slots] == keys[pending])
            found[pending[hit]] = True
            self._ref_np[slots[hit]] = 1
            go_on = occupied ^ hit
            pending, position = pending[go_on], (position[go_on] + 1) & mask
        for i, key, start in zip(
            pending.tolist(), keys[pending].tolist(), position.tolist(), strict=True
        ):
            slot = self._find(key, start)
            if slot >= 0:
                found[i] = True
                self._ref[slot] = 1
        hits = int(np.count_nonzero(found))
        self._hits += hits
        self._misses += keys.size - hits
        return found

    def insert(self, fp: int) -> None:
        """Cache ``fp`` (in [-2⁶³, 2⁶³)) with a clear reference bit, evicting by CLOCK when full.

        Inserting a fingerprint already cached changes nothing.
        """
        if not _INT64_MIN <= fp <= _INT64_MAX:
            raise ValueError(f"fingerprint {fp} is outside int64; use fingerprint() to make one")
        index, fps, mask = self._index, self._fps, self._mask
        i = fp & mask
        while (slot := index[i]) >= 0:
            if fps[slot] == fp:
                return
            i = (i + 1) & mask
        if self._size < self._capacity:
            slot = self._size
            self._size += 1
        else:
            slot = self._advance_hand()
            self._unindex(slot)
            self._evictions += 1
            # The backward shift may have emptied a position earlier in fp's probe run.
            i = fp & mask
            while index[i] >= 0:
                i = (i + 1) & mask
        index[i] = slot
        fps[slot] = fp
        self._ref[slot] = 0

    def insert_many(self, fps: npt.ArrayLike) -> None:
        """:meth:`insert` each of ``fps`` (a 1-D int64 array) in order."""
        insert = self.insert
        for fp in np.asarray(fps, dtype=np.int64).reshape(-1).tolist():
            insert(fp)

    def _advance_hand(self) -> int:
        """Move the hand to the next slot with a clear bit, clearing the set bits it passes;
        return that slot and leave the hand one past it."""
        ref, hand = self._ref, self._hand
        # bytearray.find scans in C: the sweep costs no Python loop however many bits are set.
        victim = ref.find(0, hand)
        if victim < 0:
            ref[hand:] = bytes(self._capacity - hand)
            victim = ref.find(0)  # ≤ hand, since ref[hand] is clear now
            ref[:victim] = bytes(victim)
        else:
            ref[hand:victim] = bytes(victim - hand)
        self._hand = victim + 1 if victim + 1 < self._capacity else 0
        return victim

    def _unindex(self, slot: int) -> None:
        """Remove ``slot``'s entry from the index, shifting later entries of its probe run back
        so every remaining entry stays reachable from its home position without tombstones."""
        index, fps, mask = self._index, self._fps, self._mask
        hole = fps[slot] & mask
        while index[hole] != slot:
            hole = (hole + 1) & mask
        j = hole
        while True:
            j = (j + 1) & mask
            other = index[j]
            if other < 0:
                break
            home = fps[other] & mask
            # The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            if (home <= hole or home > j) if hole < j else (j < home <= hole):
                index[hole] = other
                hole = j
        index[hole] = -1

    def statistics(self) -> ClockStatistics:
        lookups = self._hits + self._misses
        return ClockStatistics(
            capacity=self._capacity,
            size=self._size,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            hit_rate=self._hits / lookups if lookups else 0.0,
            nbytes=self.nbytes,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class UrlSeenStatistics:
    """A snapshot of a :class:`UrlSeen`; counts are since it was made."""

    cache: ClockStatistics  # its hit rate is the share of distinct tests answered in memory
    urls: int  # URLs given to filter_new
    batch_duplicates: int  # of those, repeats of a URL earlier in the same call
    store_lookups: int  # batched store lookups (at most one per call)
    store_checked: int  # fingerprints sent to the store (the cache's misses)
    store_hits: int  # of those, known to the store
    new: int  # URLs returned as never seen before


class UrlSeen:
    """Cache in front of the store: ``await seen.filter_new(urls)`` returns the URLs never seen
    before (and marks them seen).

    Misses are checked against the store in ONE batched lookup per call; every miss, new or
    known to the store, then enters the cache, since the link is likely to come again. The store
    stays the authority: the caller must persist the new URLs (add them as pages), or a URL the
    cache has since evicted will be new again. Calls are serialised, so concurrent calls never
    both return one URL.
    """

    def __init__(self, *, capacity: int, lookup: SeenLookup) -> None:
        self._cache = ClockCache(capacity)
        self._lookup = lookup
        self._lock = trio.Lock()
        self._urls = 0
        self._batch_duplicates = 0
        self._store_lookups = 0
        self._store_checked = 0
        self._store_hits = 0
        self._new = 0

    @property
    def cache(self) -> ClockCache:
        return self._cache

    async def filter_new(self, urls: Sequence[str]) -> list[str]:
        """The URLs of ``urls`` never seen before, in order of first occurrence; duplicates
        within the call count once. Raises what the store lookup raises (nothing is marked
        seen then) and :class:`StoreError` if it answers with a mask of the wrong length."""
        self._urls += len(urls)
        if not urls:
            return []
        # A dict keeps first occurrences in order, faster than numpy for the links of one page.
        first: dict[int, int] = {}
        for i, fp in enumerate(fingerprints(urls).tolist()):
            first.setdefault(fp, i)
        distinct = np.fromiter(first, dtype=np.int64, count=len(first))
        self._batch_duplicates += len(urls) - distinct.size
        async with self._lock:
            missed = np.flatnonzero(~self._cache.lookup_many(distinct))
            if missed.size == 0:
                return []
            checked = distinct[missed]
            self._store_lookups += 1
            known = np.asarray(await self._lookup(checked), dtype=np.bool_).reshape(-1)
            if known.size != checked.size:
                raise StoreError(
                    f"the URL-seen lookup answered {known.size} flags for {checked.size} "
                    "fingerprints; it must return one flag per fingerprint, in order"
                )
            self._cache.insert_many(checked)
        self._store_checked += checked.size
        self._store_hits += int(np.count_nonzero(known))
        where = list(first.values())
        new = [urls[where[m]] for m in missed[~known].tolist()]
        self._new += len(new)
        return new

    def statistics(self) -> UrlSeenStatistics:
        return UrlSeenStatistics(
            cache=self._cache.statistics(),
            urls=self._urls,
            batch_duplicates=self._batch_duplicates,
            store_lookups=self._store_lookups,
            store_checked=self._store_checked,
            store_hits=self._store_hits,
            new=self._new,
        )
