"""Time to allocate a fetch budget over 1 M and 10 M pages, per policy, with and without caps.

Run from the repository root: ``python bench/bench_allocate.py [pages ...]``. Prints, per
allocation, the CPU seconds of this process (the figure to compare on a shared machine) and
the wall seconds, of the row's first call and the best of ``--repeat`` more, and the load
average before and after; asserts nothing. The instance: change rates log-normal around one
change a day (σ = 2, a heavy-tailed mix), a budget of one fetch per page per day on average,
pages spread over N/100 hosts with a power-law size distribution, and for the capped runs a
politeness cap per host of one fetch every 2 s (a few of the biggest hosts bind) or every
100 s (hundreds of hosts with a third of the pages bind). ``decide`` "plug-in" takes the
rates as exact (``policies.solve``); "expected" maximises the expected value under a
log-normal posterior per page whose sd is uniform in [0.1, 1.5] (``policies.solve_expected``,
the daemon's default ``policy.decide``). ``--only`` keeps the rows whose policy, decide or
cap label contains each given word.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refresher import policies

DAY = 86_400.0
BUILTIN = ("uniform", "proportional", "optimal", "optimal-age")
CAPS = (None, 0.5, 0.01)  # fetches per second per host
SD = (0.1, 1.5)  # the posterior sd of ln λ, uniform between these


def instance(pages: int, seed: int = 0) -> tuple[np.ndarray, float, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    rates = rng.lognormal(np.log(1.0 / DAY), 2.0, pages)
    budget = pages / DAY
    n_hosts = max(pages // 100, 1)
    hosts = (n_hosts * rng.random(pages) ** 4).astype(np.intp)
    return rates, budget, hosts, n_hosts


def timed(repeat: int, run: Callable[[], policies.Allocation]) -> tuple[list[float], ...]:
    """CPU and wall seconds of ``repeat`` + 1 calls (the first one first), and the result."""
    cpu, wall, result = [], [], None
    for _ in range(repeat + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    assert result is not None
    capped = result.capped_hosts
    return cpu, wall, [0.0 if capped is None else float(capped.sum())]


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def rows() -> list[tuple[str, str, float | None]]:
    out: list[tuple[str, str, float | None]] = []
    for name in BUILTIN:
        for decide in ("plug-in", "expected"):
            if decide == "expected" and name not in policies.EXPECTED_POLICIES:
                continue
            out.extend((name, decide, cap) for cap in CAPS)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=int, default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    print(load(), flush=True)
    # build the tables outside the timings (the expected-value table's rows a solve needs
    # are built on its first use: a few hundredths of a second each)
    for name in policies.EXPECTED_POLICIES:
        policies.solve(name, [1.0], 1.0)
        policies.solve_expected(name, np.zeros(81), np.arange(81) * 0.05, 1.0)
    print(
        f"{'pages':>10}  {'policy':<12} {'decide':<9} {'host cap':>9} {'CPU 1st':>8}"
        f" {'CPU best':>8} {'wall 1st':>8} {'wall best':>9} {'capped':>7}"
    )
    for pages in args.pages:
        rates, budget, hosts, n_hosts = instance(pages)
        sd = np.random.default_rng(1).uniform(*SD, pages)
        log_rates = np.log(rates)
        for name, decide, cap in rows():
            label = "none" if cap is None else f"{cap:g}/s"
            if not all(w in f"{name} {decide} {label}" for w in args.only):
                continue
            caps = {} if cap is None else {"hosts": hosts, "host_caps": np.full(n_hosts, cap)}
            if decide == "expected":
                run = partial(policies.solve_expected, name, log_rates, sd, budget, **caps)
            else:
                run = partial(policies.solve, name, rates, budget, **caps)
            cpu, wall, (capped,) = timed(args.repeat, run)
            best_cpu = min(cpu[1:], default=math.nan)
            best_wall = min(wall[1:], default=math.nan)
            print(
                f"{pages:>10}  {name:<12} {decide:<9} {label:>9} {cpu[0]:>8.3f}"
                f" {best_cpu:>8.3f} {wall[0]:>8.3f} {best_wall:>9.3f} {capped:>7.0f}",
                flush=True,
            )
    print(load())


if __name__ == "__main__":
    main()
