"""Time to allocate a fetch budget over 1 M and 10 M pages, per policy, with and without caps.

Run from the repository root: ``python bench/bench_allocate.py [pages ...]``. Prints seconds
per allocation (best of ``--repeat``); asserts nothing. The instance: change rates log-normal
around one change a day (σ = 2, a heavy-tailed mix), a budget of one fetch per page per day
on average, pages spread over N/100 hosts with a power-law size distribution, and for the
capped runs a politeness cap per host of one fetch every 2 s (a few of the biggest hosts
bind) or every 100 s (hundreds bind).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refresher import policies

DAY = 86_400.0
BUILTIN = ("uniform", "proportional", "optimal", "optimal-age")
CAPS = (None, 0.5, 0.01)  # fetches per second per host


def instance(pages: int, seed: int = 0) -> tuple[np.ndarray, float, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    rates = rng.lognormal(np.log(1.0 / DAY), 2.0, pages)
    budget = pages / DAY
    n_hosts = max(pages // 100, 1)
    hosts = (n_hosts * rng.random(pages) ** 4).astype(np.intp)
    return rates, budget, hosts, n_hosts


def best_of(repeat: int, *args: Any, **kwargs: Any) -> tuple[float, policies.Allocation]:
    """Best wall time of ``policies.solve(*args, **kwargs)`` over ``repeat`` runs."""
    best, result = math.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        result = policies.solve(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=int, default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    policies.solve("optimal", [1.0], 1.0)  # build the tables outside the timings
    policies.solve("optimal-age", [1.0], 1.0)
    print(f"{'pages':>10}  {'policy':<13} {'host cap':>12} {'seconds':>8} {'capped hosts':>13}")
    for pages in args.pages:
        rates, budget, hosts, n_hosts = instance(pages)
        for name in BUILTIN:
            for cap in CAPS:
                kwargs = {} if cap is None else {"hosts": hosts, "host_caps": np.full(n_hosts, cap)}
                seconds, result = best_of(args.repeat, name, rates, budget, **kwargs)
                capped = result.capped_hosts
                label = "none" if cap is None else f"{cap:g}/s"
                print(
                    f"{pages:>10}  {name:<13} {label:>12} {seconds:>8.3f}"
                    f" {0 if capped is None else int(capped.sum()):>13}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
