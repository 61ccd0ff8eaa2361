"""Time to estimate change rates from fetch histories of 100 k and 1 M pages.

Run from the repository root: ``python bench/bench_estimate.py [pages ...]``. Prints seconds
per call (median of ``--repeat``); asserts nothing. Each page has 20 observations at
exponentially distributed intervals around an hour, rates log-uniform between one change a
week and ten an hour, pages spread over N/100 hosts.

``estimate_statistics`` is what the allocator runs: the same estimate from the per-page
statistics the store keeps (``fold`` is the time to fold the whole history into them, which
the store does batch by batch as fetches are recorded, and the migration once).
``--statistics-only`` skips the history-based calls (for 10 M pages, whose history would not
fit in memory here: the statistics are folded in chunks of 1 M pages). ``--allocator``
estimates from the statistics as the allocator does (``mixture`` and ``fit_spread`` on: the
empirical Bayes rounds, found again under the fitted spread where it moves, and P(static)).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refresher.refresh import _estimate as estimate
from refresher.refresh._estimate_stats import estimate_statistics
from refresher.store import ChangeStatistics, fold_observations
from refresher.store._change_stats import empty_state, read_statistics

HOUR = 3600.0
OBSERVATIONS = 20


def history(pages: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rates = np.exp(rng.uniform(np.log(1.0 / (168 * HOUR)), np.log(10.0 / HOUR), pages))
    shape = (pages, OBSERVATIONS)
    t = np.maximum(rng.exponential(HOUR, shape), 1.0)
    p_change = -np.expm1(-rates[:, None] * t)
    changed = rng.random(shape) < p_change
    since = np.where(changed, -np.log1p(-rng.random(shape) * p_change) / rates[:, None], np.nan)
    return {
        "page": np.repeat(np.arange(pages), OBSERVATIONS),
        "t": t.ravel(),
        "changed": changed.ravel(),
        "since": since.ravel(),
        "host": (max(pages // 100, 1) * rng.random(pages) ** 4).astype(np.intp),
    }


def median_of(repeat: int, run: Callable[[], object]) -> tuple[float, float]:
    """Median wall and CPU seconds of ``run()`` (the CPU time is this process's: on a shared
    machine the wall time also counts the other jobs' turns)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return float(np.median(wall)), float(np.median(cpu))


def statistics(h: dict[str, np.ndarray]) -> ChangeStatistics:
    """The history ``h`` folded into per-page statistics (a first fetch, then one per
    observation; Last-Modified the last change time)."""
    pages = h["host"].size
    t = h["t"].reshape(pages, -1)
    finished = np.concatenate((np.zeros((pages, 1)), np.cumsum(t, axis=1)), axis=1) + 1.7e9
    changed = np.concatenate((np.zeros((pages, 1), bool), h["changed"].reshape(pages, -1)), 1)
    since = np.concatenate((np.full((pages, 1), np.nan), h["since"].reshape(pages, -1)), 1)
    page = np.repeat(np.arange(pages, dtype=np.int64), t.shape[1] + 1)
    c = changed.ravel()
    state = fold_observations(
        empty_state(pages),
        np.arange(pages, dtype=np.int64),
        page,
        finished.ravel(),
        (finished - since).ravel(),
        c,
        c,
    )
    return read_statistics(state, meaningful=False)


def chunked_statistics(pages: int, chunk: int = 1_000_000) -> tuple[ChangeStatistics, np.ndarray]:
    """Statistics of ``pages`` pages folded from histories of ``chunk`` pages at a time, and
    the host per page (as :func:`history` draws them for the whole set)."""
    parts = []
    for i, start in enumerate(range(0, pages, chunk)):
        parts.append(statistics(history(min(chunk, pages - start), seed=i + 1)))
    rng = np.random.default_rng(0)
    host = (max(pages // 100, 1) * rng.random(pages) ** 4).astype(np.intp)
    return ChangeStatistics(
        **{
            f: np.concatenate([getattr(p, f) for p in parts], axis=-1)
            for f in ChangeStatistics.__dataclass_fields__
        }
    ), host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--statistics-only", action="store_true")
    parser.add_argument("--allocator", action="store_true")
    args = parser.parse_args()
    as_allocator = {"mixture": True, "fit_spread": True} if args.allocator else {}
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'pages':>10} {'observations':>13}  {'call':<28} {'seconds':>8} {'CPU s':>8}")
    for pages in args.pages:
        if args.statistics_only:
            start = time.perf_counter()
            stats, host = chunked_statistics(pages)
            fold = time.perf_counter() - start
            n_hosts = int(host.max()) + 1
            seconds, cpu = median_of(
                args.repeat,
                lambda s=stats, h=host, k=n_hosts: estimate_statistics(
                    s, h, k, history=32, **as_allocator
                ),
            )
            head = f"{pages:>10} {pages * OBSERVATIONS:>13}"
            print(f"{head}  {'history + fold':<28} {fold:>8.3f}")
            print(f"{head}  {'estimate_statistics':<28} {seconds:>8.3f} {cpu:>8.3f}", flush=True)
            continue
        h = history(pages)
        n_hosts = int(h["host"].max()) + 1
        trusted = np.ones(n_hosts, dtype=bool)
        calls: dict[str, Callable[[], object]] = {
            "estimate_irregular": lambda h=h, n=pages: estimate.estimate_irregular(
                h["page"], h["t"], h["changed"], n
            ),
            "estimate_from_last_modified": lambda h=h, n=pages: (
                estimate.estimate_from_last_modified(h["page"], h["t"], h["changed"], h["since"], n)
            ),
            "host_prior": lambda h=h, n=n_hosts: estimate.host_prior(
                h["page"], h["t"], h["changed"], h["host"], n
            ),
        }
        for model in estimate.MODELS:
            calls[f"estimate_pages ({model})"] = (
                lambda h=h, n=pages, k=n_hosts, ok=trusted, m=model: estimate.estimate_pages(
                    h["page"],
                    h["t"],
                    h["changed"],
                    n,
                    page_host=h["host"],
                    n_hosts=k,
                    since_change=h["since"],
                    trusted_hosts=ok,
                    model=m,
                )
            )
        start = time.perf_counter()
        stats = statistics(h)
        print(
            f"{pages:>10} {pages * OBSERVATIONS:>13}  {'fold (whole history)':<28}"
            f" {time.perf_counter() - start:>8.3f}",
            flush=True,
        )
        calls["estimate_statistics"] = lambda s=stats, h=h, k=n_hosts: estimate_statistics(
            s, h["host"], k, history=32, **as_allocator
        )
        for name, run in calls.items():
            seconds, cpu = median_of(args.repeat, run)
            print(
                f"{pages:>10} {pages * OBSERVATIONS:>13}  {name:<28} {seconds:>8.3f} {cpu:>8.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
