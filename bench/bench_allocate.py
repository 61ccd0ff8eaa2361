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

``--warm`` adds, for the optimal policies, ``--repeat`` re-plans as the daemon makes them: each
from the last one's allocation (``warm=``) after every rate has moved (ln λ by a normal draw
of sd 0.066, what bench_replan's re-estimate after half the pages were fetched again moves
it by; the posterior sd of half the pages × √(20/21), one observation more), a new draw each
time; "CPU warm" is the best of them and "warm evals" their mean count of page evaluations
(the solver's passes over pages, counted).

``--no-huge-pages`` stops numpy advising the kernel to back its large arrays with 2 MiB
pages (``madvise``; numpy's default, and the daemon's): every fresh page-sized array a solve
makes costs page faults, more system time with huge pages than without on this machine.
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
from typing import Any

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


def moved(log_rates: np.ndarray, sd: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rates and posterior sds a re-plan sees after half the pages were fetched again."""
    rng = np.random.default_rng(100 + seed)
    again = rng.random(sd.size) < 0.5
    return log_rates + rng.normal(0.0, 0.066, sd.size), np.where(again, sd * (20 / 21) ** 0.5, sd)


class Counted:
    """Counts the pages the solver evaluates (``_Work.evaluate``), where it has one."""

    def __init__(self) -> None:
        self.pages = 0
        from refresher.policies import _solve

        work = getattr(_solve, "_Work", None)
        if work is None:
            return
        evaluate = work.evaluate

        def counted(w: Any, *args: Any, **kwargs: Any) -> Any:
            self.pages += w.f.size
            return evaluate(w, *args, **kwargs)

        work.evaluate = counted


def warm_runs(
    repeat: int,
    solve: Callable[..., policies.Allocation],
    first: policies.Allocation,
    log_rates: np.ndarray,
    sd: np.ndarray,
    counter: Counted,
    logs: bool,
) -> tuple[float, float]:
    """Best CPU seconds and mean page evaluations of ``repeat`` re-plans, each from the last
    (``solve`` takes ln λ when ``logs``, else λ)."""
    cpu, evaluated, last = [], [], first
    for k in range(repeat):
        lr, s = moved(log_rates, sd, k)
        x = lr if logs else np.exp(lr)
        counter.pages = 0
        start = time.process_time()
        last = solve(x, s, warm=last)
        cpu.append(time.process_time() - start)
        evaluated.append(counter.pages)
    return min(cpu, default=math.nan), float(np.mean(evaluated)) if evaluated else math.nan


def timed(
    repeat: int, run: Callable[[], policies.Allocation]
) -> tuple[list[float], list[float], policies.Allocation]:
    """CPU and wall seconds of ``repeat`` + 1 calls (the first one first), and the result."""
    cpu, wall, result = [], [], None
    for _ in range(repeat + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    assert result is not None
    return cpu, wall, result


def _plug_in(
    name: str, rates: np.ndarray, sd: np.ndarray, budget: float, **kw: Any
) -> policies.Allocation:
    """The plug-in split (``sd`` unused: the same call as the expected one's)."""
    return policies.solve(name, rates, budget, **kw)


def memory(library: bool) -> str:
    """Set glibc malloc up as the daemon does (``tune_malloc``) unless ``library`` (its
    defaults: a library user's process); says which."""
    if library:
        return "memory: glibc's defaults (--library)"
    from refresher.ops._daemon import tune_malloc

    return f"memory: as the daemon's (tune_malloc: {tune_malloc()})"


def huge_pages(on: bool) -> str:
    """numpy's advice to the kernel to back its large arrays with 2 MiB pages (its default,
    the daemon's), or not (``--no-huge-pages``); says which."""
    if not on:
        np._core.multiarray._set_madvise_hugepage(False)  # type: ignore[attr-defined]
    return "numpy huge pages: " + ("on (numpy's default, the daemon's)" if on else "off")


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
    parser.add_argument("--warm", action="store_true", help="also re-plans from the last one")
    parser.add_argument(
        "--library",
        action="store_true",
        help="glibc's malloc defaults, not the daemon's tune_malloc",
    )
    parser.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="numpy's large arrays without the kernel's 2 MiB pages (not the daemon's default)",
    )
    args = parser.parse_args()
    print(memory(args.library))
    print(huge_pages(not args.no_huge_pages))
    counter = Counted()
    print(load(), flush=True)
    # build the tables outside the timings (the expected-value table's rows a solve needs
    # are built on its first use: a few hundredths of a second each)
    for name in policies.EXPECTED_POLICIES:
        policies.solve(name, [1.0], 1.0)
        policies.solve_expected(name, np.zeros(81), np.arange(81) * 0.05, 1.0)
    print(
        f"{'pages':>10}  {'policy':<12} {'decide':<9} {'host cap':>9} {'CPU 1st':>8}"
        f" {'CPU best':>8} {'wall 1st':>8} {'wall best':>9} {'capped':>7} {'evals':>6}"
        + (f" {'CPU warm':>8} {'warm evals':>10}" if args.warm else "")
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
                solve = partial(policies.solve_expected, name, budget=budget, **caps)
            else:
                solve = partial(_plug_in, name, budget=budget, **caps)
            counter.pages = 0
            first = log_rates if decide == "expected" else rates
            cpu, wall, result = timed(args.repeat, partial(solve, first, sd))
            evals = counter.pages / (args.repeat + 1)
            capped = 0 if result.capped_hosts is None else int(result.capped_hosts.sum())
            line = (
                f"{pages:>10}  {name:<12} {decide:<9} {label:>9} {cpu[0]:>8.3f}"
                f" {min(cpu[1:], default=math.nan):>8.3f} {wall[0]:>8.3f}"
                f" {min(wall[1:], default=math.nan):>9.3f} {capped:>7} {evals / 1e6:>5.1f}M"
            )
            if args.warm and name in policies.EXPECTED_POLICIES:
                warm, warm_evals = warm_runs(
                    args.repeat, solve, result, log_rates, sd, counter, decide == "expected"
                )
                line += f" {warm:>8.3f} {warm_evals / 1e6:>9.1f}M"
            print(line, flush=True)
    print(load())


if __name__ == "__main__":
    main()
