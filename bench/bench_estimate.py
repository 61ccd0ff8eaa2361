"""Time to estimate change rates from fetch histories of 100 k and 1 M pages.

Run from the repository root: ``python bench/bench_estimate.py [pages ...]``. Prints seconds
per call (best of ``--repeat``); asserts nothing. Each page has 20 observations at
exponentially distributed intervals around an hour, rates log-uniform between one change a
week and ten an hour, pages spread over N/100 hosts.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refresher.refresh import _estimate as estimate

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


def best_of(repeat: int, run: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"{'pages':>10} {'observations':>13}  {'call':<28} {'seconds':>8}")
    for pages in args.pages:
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
        for name, run in calls.items():
            seconds = best_of(args.repeat, run)
            print(f"{pages:>10} {pages * OBSERVATIONS:>13}  {name:<28} {seconds:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
