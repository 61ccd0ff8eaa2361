"""Speed, memory and hit rate of the URL-seen test (CLOCK cache of 64-bit fingerprints).

Run from the repository root: ``python bench/bench_seen.py``. Prints, and asserts nothing:

1. lookups per second on hits and on misses, one ``lookup`` call at a time and batched with
   ``lookup_many`` (the goal is ≥ 500,000 lookups/s on hits), inserts per second, fingerprints
   per second, and ``UrlSeen.filter_new`` URLs per second on page-sized batches that all hit;
2. bytes per entry for several capacities (and what a ``dict`` of fingerprints would cost);
3. the hit rate on a synthetic crawl trace with host locality, for several cache sizes
   (the paper: about 50,000 entries give about 80 % hits on a real crawl).

The trace: hosts with Pareto-distributed sizes and Zipf-like popularity; ``--active`` hosts are
crawled at a time (Mercator's back queues), each for a run of pages; every fetched page yields
log-normally many links (median 23, as in the paper), ``--local`` of them to its own host
(mostly its navigation pages), the rest to popular hosts' front pages. Each page's links are
one ``filter_new`` call: duplicates within the page count once, the distinct rest are looked up
and the misses inserted. The paper counted every link, so the second hit-rate column counts the
within-page repeats as hits too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refresher.discover._seen import ClockCache, UrlSeen, fingerprint, fingerprints

I64 = npt.NDArray[np.int64]


def random_fps(rng: np.random.Generator, n: int) -> I64:
    return rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)


def rate(count: int, run: Callable[[], object], repeat: int = 3) -> float:
    """Best of ``repeat`` runs, in operations per second."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return count / best


def speed(capacity: int, lookups: int, rng: np.random.Generator) -> None:
    cache = ClockCache(capacity)
    present = random_fps(rng, capacity)
    start = time.perf_counter()
    cache.insert_many(present)
    fill = capacity / (time.perf_counter() - start)
    hits = rng.choice(present, lookups)
    misses = random_fps(rng, lookups)
    hit_list, miss_list = hits.tolist(), misses.tolist()

    def singles(keys: list[int]) -> Callable[[], object]:
        lookup = cache.lookup
        return lambda: [lookup(k) for k in keys]

    def batches(keys: I64, size: int) -> Callable[[], object]:
        chunks = [keys[i : i + size] for i in range(0, keys.size, size)]
        lookup_many = cache.lookup_many
        return lambda: [lookup_many(c) for c in chunks]

    print(f"\ncapacity {capacity:,} (full), {lookups:,} lookups per run, best of 3")
    print(f"  {'operation':<36} {'per second':>14}")
    print(f"  {'lookup, hits':<36} {rate(lookups, singles(hit_list)):>14,.0f}")
    print(f"  {'lookup, misses':<36} {rate(lookups, singles(miss_list)):>14,.0f}")
    for size in (50, 1_000, 100_000):
        for name, keys in (("hits", hits), ("misses", misses)):
            label = f"lookup_many, batches of {size:,}, {name}"
            print(f"  {label:<36} {rate(lookups, batches(keys, size)):>14,.0f}")
    print(f"  {'insert, filling':<36} {fill:>14,.0f}")
    fresh = random_fps(rng, lookups)
    evicting = rate(lookups, lambda: cache.insert_many(fresh), repeat=1)
    print(f"  {'insert, evicting':<36} {evicting:>14,.0f}")


def memory(rng: np.random.Generator) -> None:
    print(f"\n{'capacity':>10} {'bytes':>12} {'bytes/entry':>12}")
    for capacity in (1_000, 50_000, 1_000_000, 4_000_000):
        nbytes = ClockCache(capacity).nbytes
        print(f"{capacity:>10,} {nbytes:>12,} {nbytes / capacity:>12.1f}")
    # For comparison: a dict fingerprint -> slot, counting its int objects.
    n = 50_000
    keys = random_fps(rng, n).tolist()
    table = {k: i for i, k in enumerate(keys)}
    size = sys.getsizeof(table) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in table.items())
    print(f"(a dict fp -> slot of {n:,} entries with its int objects: {size / n:.0f} bytes/entry)")


def strings(rng: np.random.Generator, n: int) -> None:
    urls = [f"http://host{rng.integers(10_000)}.example/path/{i}/page.html" for i in range(n)]
    one_by_one = rate(n, lambda: [fingerprint(u) for u in urls])
    print(f"\n{'fingerprint (one URL)':<36} {one_by_one:>14,.0f}")
    print(f"{'fingerprints (array)':<36} {rate(n, lambda: fingerprints(urls)):>14,.0f}")

    async def known(fps: I64) -> npt.NDArray[np.bool_]:
        return np.zeros(fps.size, dtype=np.bool_)

    seen = UrlSeen(capacity=n, lookup=known)
    pages = [urls[i : i + 40] for i in range(0, n, 40)]

    async def all_pages() -> None:
        for page in pages:
            await seen.filter_new(page)

    trio.run(all_pages)  # the first pass inserts; the timed ones all hit
    per_second = rate(n, lambda: trio.run(all_pages))
    print(f"{'filter_new, pages of 40, all hits':<36} {per_second:>14,.0f}  URLs/s")


def crawl_trace(
    rng: np.random.Generator, *, hosts: int, pages: int, active: int, local: float
) -> list[I64]:
    """One array of link fingerprints per fetched page, in crawl order."""
    sizes = np.minimum(1 + (rng.pareto(1.1, hosts) * 30).astype(np.int64), 50_000)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    slot_host = np.zeros(active, dtype=np.int64)
    slot_left = np.zeros(active, dtype=np.int64)
    page_host = np.empty(pages, dtype=np.int64)
    for i in range(pages):
        slot = i % active
        if slot_left[slot] == 0:  # this back queue takes a new host, popular hosts more often
            host = int(hosts * rng.random() ** 3)
            slot_host[slot] = host
            slot_left[slot] = min(int(sizes[host]), 1 + int(rng.geometric(1 / 40)))
        page_host[i] = slot_host[slot]
        slot_left[slot] -= 1
    links = np.minimum(rng.lognormal(np.log(23), 1.0, pages).astype(np.int64) + 1, 2_000)
    source = np.repeat(page_host, links)
    inside = rng.random(source.size) < local
    target = np.where(inside, source, (hosts * rng.random(source.size) ** 3).astype(np.int64))
    # Within a host, links favour low page numbers (navigation); across hosts, front pages.
    skew = np.where(inside, 3.0, 8.0)
    page = (sizes[target] * rng.random(source.size) ** skew).astype(np.int64)
    ids = (offsets[target] + page).astype(np.uint64)
    fps = (ids * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # spread like real fingerprints
    return np.split(fps, np.cumsum(links)[:-1])


def hit_rates(trace: list[I64], capacities: list[int]) -> None:
    total = sum(p.size for p in trace)
    distinct_pages = []
    for p in trace:
        _, first = np.unique(p, return_index=True)
        distinct_pages.append(p[np.sort(first)])
    lookups = sum(p.size for p in distinct_pages)
    repeats = total - lookups
    everything = np.concatenate(distinct_pages)
    infinite = lookups - np.unique(everything).size
    print(
        f"\ntrace: {len(trace):,} pages, {total:,} links, {repeats / total:.1%} repeats within "
        f"a page, {lookups:,} lookups, {np.unique(everything).size:,} distinct URLs"
    )
    print(f"{'entries':>10} {'hit rate':>9} {'per link':>9} {'evictions':>10} {'MB':>6} {'s':>6}")
    for capacity in capacities:
        cache = ClockCache(capacity)
        start = time.perf_counter()
        for p in distinct_pages:
            cache.insert_many(p[~cache.lookup_many(p)])
        seconds = time.perf_counter() - start
        s = cache.statistics()
        print(
            f"{capacity:>10,} {s.hit_rate:>9.1%} {(s.hits + repeats) / total:>9.1%} "
            f"{s.evictions:>10,} {s.nbytes / 1e6:>6.1f} {seconds:>6.1f}"
        )
    print(
        f"{'infinite':>10} {infinite / lookups:>9.1%} {(infinite + repeats) / total:>9.1%}"
        f" {0:>10} {'':>6} {'':>6}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lookups", type=int, default=500_000, help="per timed run")
    parser.add_argument("--pages", type=int, default=40_000, help="fetched pages in the trace")
    parser.add_argument("--hosts", type=int, default=20_000)
    parser.add_argument("--active", type=int, default=30, help="hosts crawled at a time")
    parser.add_argument("--local", type=float, default=0.8, help="share of links within host")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000],
        help="cache sizes for the hit-rate table",
    )
    parser.add_argument("--speed-capacities", type=int, nargs="*", default=[50_000, 1_000_000])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for capacity in args.speed_capacities:
        speed(capacity, args.lookups, rng)
    memory(rng)
    strings(rng, 100_000)
    trace = crawl_trace(
        np.random.default_rng(1),
        hosts=args.hosts,
        pages=args.pages,
        active=args.active,
        local=args.local,
    )
    hit_rates(trace, args.sizes)


if __name__ == "__main__":
    main()
