"""A whole re-plan on a DuckDB store of 1 M or 10 M pages: store read, estimate, plan, save.

Run from the repository root: ``python bench/bench_replan.py [pages ...]``. Prints seconds
(median of ``--repeat``, wall and this process's CPU) per step; asserts nothing.

The store (built with SQL in a temp dir, pages over N/100 hosts with a power-law size
distribution, the third of the hosts that the power law makes biggest, about three quarters of
the pages, with a politeness delay of 100 s) has per-page
change statistics as the store keeps them: 20 observations per page at a regular interval
around an hour, rates log-uniform from one change a week to ten an hour, no Last-Modified.
``--history K`` instead writes K + 1 successful fetches per page into the history and lets
the schema migration fold them into the statistics (timed: a store from before them), which
is also what a refresher before the statistics needs to re-plan (run this script with that
refresher's tree first on ``sys.path`` to time it: it reads the history when its store has
no statistics).

Steps, as the daemon's allocator makes them (``policy.decide = "expected"``, weights
"none": no links in the synthetic store): ``read`` (``estimator_inputs``), ``estimate``
(λ̂, posterior and P(static) per page), ``plan`` (the optimal policy's expected-value split
under host caps, 5 % exploration), ``report`` (the rate each page is saved with, counting its
chance of never changing: ``reported_rates``), ``save`` (``save_plan``: λ̂, f and due time per
page). The first plan of a process also builds the rows of the expected-value table it
needs, and starts cold: ``first plan`` is printed apart. Before each later pass half of the
pages (another half each time) are fetched once more at their interval, a change drawn at
their rate, and folded into their statistics, as the daemon's re-plan after
``policy.replan_share`` = 0.5 of the pages sees them (not timed); that pass's plan starts
from the last one's levels (``Plan.warm``) as the daemon's does, or cold with ``--cold``.
The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb  # sql-ok: builds the synthetic store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_allocate import memory  # the daemon's malloc settings

from refresher.refresh._allocate import InputSettings, plan, reported_rates
from refresher.store import DuckDBStore, PlanUpdate

HOUR = 3600.0
NOW = 1_800_000_000.0
DELAY = 100.0  # seconds: the capped hosts' politeness delay


def build(path: Path, pages: int, history: int) -> float:
    """The synthetic store at ``path``; returns the seconds the statistics took (the
    migration's fold with ``history``, else 0: written directly)."""
    DuckDBStore(path).close()
    hosts = max(pages // 100, 1)
    con = duckdb.connect(str(path))  # sql-ok: synthetic store
    try:
        names = "SELECT column_name FROM duckdb_columns() WHERE table_name = 'pages'"
        got = con.execute(names).fetchall()  # sql-ok: synthetic store
        columns = {r[0] for r in got}
        con.execute(  # sql-ok: synthetic store
            "INSERT INTO hosts (id, name, scheme, delay) SELECT i, 'h' || i || '.test', 'http', "
            "CASE WHEN i < $h / 3 THEN $d ELSE 1.0 END FROM range(0, $h) t(i)",
            {"h": hosts, "d": DELAY},
        )
        # host of page i: power law in i's hash; a third of the hosts (the smallest ids, which
        # the power law makes the biggest) carry the 100 s delay
        con.execute(  # sql-ok: synthetic store
            """
            CREATE TEMP TABLE _p AS
            SELECT i AS id,
                   least(CAST(floor($h * pow(hash(i) / 18446744073709551615.0, 4)) AS INTEGER),
                         $h - 1) AS host_id,
                   exp(ln(1 / (168 * 3600.0))
                       + (hash(i + 7) / 18446744073709551615.0) * ln(1680)) AS rate,
                   3600.0 * (0.5 + hash(i + 13) / 18446744073709551615.0) AS interval
            FROM range(1, $n + 1) t(i)
            """,
            {"h": hosts, "n": pages},
        )
        con.execute(  # sql-ok: synthetic store
            f"""
            INSERT INTO pages (id, url, host_id, first_seen, due_at, last_fetch, fetches, status)
            SELECT id, 'http://h' || host_id || '.test/' || id, host_id, $now - 86400, $now,
                   $now - random() * interval, {history + 1 if history else 21}, 'ok'
            FROM _p
            """,
            {"now": NOW},
        )
        if history:
            con.execute(  # sql-ok: synthetic store
                """
                INSERT INTO fetches (id, page_id, host_id, started_at, finished_at, duration,
                                     status, bytes, changed, not_modified, policy, redirects)
                SELECT row_number() OVER (), id, host_id, t - 0.1, t, 0.1, 200, 100,
                       k > 0 AND random() < 1 - exp(-rate * interval), false, 'uniform', 0
                FROM (SELECT id, host_id, rate, interval, k,
                             $now - 86400 + k * interval AS t
                      FROM _p, range(0, $k + 1) r(k))
                """,
                {"now": NOW, "k": history},
            )
        elif "stat_n" in columns:
            # what 20 observations at the page's interval leave, changes at their expectation
            con.execute(  # sql-ok: synthetic store
                """
                UPDATE pages SET stat_n = 20, stat_time = 20 * _p.interval,
                    stat_changes = x, stat_changed_time = x * _p.interval,
                    stat_untimed = x, stat_lm_run = 0,
                    stat_log1 = x * ln(_p.interval), stat_log2 = x * pow(ln(_p.interval), 2),
                    stat_log3 = x * pow(ln(_p.interval), 3),
                    stat_changes_m = x, stat_changed_time_m = x * _p.interval,
                    stat_untimed_m = x, stat_lm_run_m = 0,
                    stat_log1_m = x * ln(_p.interval), stat_log2_m = x * pow(ln(_p.interval), 2),
                    stat_log3_m = x * pow(ln(_p.interval), 3),
                    stat_last_ok = pages.last_fetch
                FROM (SELECT id, interval,
                             round(20 * (1 - exp(-rate * interval))) AS x FROM _p) _p
                WHERE pages.id = _p.id
                """
            )
        con.execute("CHECKPOINT")  # sql-ok: synthetic store
    finally:
        con.close()
    if not history:
        return 0.0
    # a store from before the statistics: drop them and let the migration fold the history
    con = duckdb.connect(str(path))  # sql-ok: synthetic store
    try:
        stat = [c for c in columns if c.startswith("stat_")]
        for c in stat:
            con.execute(f"ALTER TABLE pages DROP COLUMN {c}")  # sql-ok: synthetic store
        if stat:
            old = "UPDATE meta SET value = '4' WHERE key = 'schema_version'"
            con.execute(old)  # sql-ok: synthetic store
    finally:
        con.close()
    start = time.perf_counter()
    DuckDBStore(path).close()
    return time.perf_counter() - start


# a page's rate and interval, as ``build`` draws them from its id
_RATE = "exp(ln(1 / (168 * 3600.0)) + (hash(id + 7) / 18446744073709551615.0) * ln(1680))"
_INTERVAL = "3600.0 * (0.5 + hash(id + 13) / 18446744073709551615.0)"


def fetched_again(path: Path, salt: int) -> None:
    """Half of the pages (by the hash of id and ``salt``) fetched once more, one interval
    after their last fetch, changed with probability 1 − e^(−λ·interval) (drawn from the
    hash too), folded into the raw statistics as the store folds an observation without
    Last-Modified."""
    con = duckdb.connect(str(path))  # sql-ok: synthetic store
    try:
        con.execute(  # sql-ok: synthetic store
            f"""
            UPDATE pages SET stat_n = stat_n + 1, stat_time = stat_time + _q.iv,
                stat_changes = stat_changes + _q.c, stat_changed_time = stat_changed_time
                    + _q.c * _q.iv, stat_untimed = stat_untimed + _q.c,
                stat_log1 = stat_log1 + _q.c * ln(_q.iv),
                stat_log2 = stat_log2 + _q.c * pow(ln(_q.iv), 2),
                stat_log3 = stat_log3 + _q.c * pow(ln(_q.iv), 3),
                stat_last_ok = stat_last_ok + _q.iv
            FROM (SELECT id, iv, CASE WHEN hash(id * 7 + $s) / 18446744073709551615.0
                                      < 1 - exp(-rate * iv) THEN 1 ELSE 0 END AS c
                  FROM (SELECT id, {_RATE} AS rate, {_INTERVAL} AS iv FROM pages)
                  WHERE hash(id * 3 + $s) % 2 = 0) _q
            WHERE pages.id = _q.id
            """,
            {"s": salt},
        )
        con.execute("CHECKPOINT")  # sql-ok: synthetic store
    finally:
        con.close()


def timed(run: Callable[[], Any]) -> tuple[Any, float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    out = run()
    return out, time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=int, default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument(
        "--cold", action="store_true", help="every plan from scratch, not from the last one's"
    )
    parser.add_argument(
        "--library",
        action="store_true",
        help="glibc's malloc defaults, not the daemon's tune_malloc",
    )
    args = parser.parse_args()
    print(memory(args.library))
    settings = InputSettings(weights="none", min_delay=1.0)
    reads_history = "history" in inspect.signature(DuckDBStore.estimator_inputs).parameters
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'pages':>10}  {'step':<14} {'seconds':>8} {'CPU s':>8}")
    for pages in args.pages:
        scratch = Path(tempfile.mkdtemp(prefix="replan-", dir=args.dir))
        try:
            t0 = time.perf_counter()
            fold = build(scratch / "s.duckdb", pages, args.history)
            print(f"{pages:>10}  {'build':<14} {time.perf_counter() - t0:>8.1f}", flush=True)
            if args.history:
                print(f"{pages:>10}  {'migrate':<14} {fold:>8.3f}", flush=True)
            store = DuckDBStore(scratch / "s.duckdb", memory_limit="1GB")
            steps: dict[str, list[tuple[float, float]]] = {}
            budget = pages / 86_400.0
            warm = {"warm": None} if "warm" in inspect.signature(plan).parameters else {}
            try:
                for i in range(args.repeat + 1):
                    if i:  # half the pages fetched again since the last plan
                        store.close()
                        fetched_again(scratch / "s.duckdb", i)
                        store = DuckDBStore(scratch / "s.duckdb", memory_limit="1GB")
                    extra = {"history": settings.history} if reads_history else {}
                    raw, *read = timed(
                        lambda e=extra, s=store: s.estimator_inputs(
                            meaningful=False, links=False, **e
                        )
                    )
                    inputs, *est = timed(lambda r=raw: settings.estimate(r))
                    result, *solve = timed(
                        lambda x=inputs, b=budget, w=warm: plan(
                            x, "optimal", b, explore=0.05, decide="expected", **w
                        )
                    )
                    if warm and not args.cold:
                        warm["warm"] = result.warm
                    stored, *report = timed(lambda x=inputs, r=result: reported_rates(x, r.target))
                    update = PlanUpdate(
                        page_ids=inputs.page_ids,
                        rates=stored,
                        rate_n=inputs.rate_n,
                        weights=inputs.weights,
                        target=result.target,
                    )
                    _, *save = timed(lambda u=update, s=store: s.save_plan(u, now=NOW))
                    if i == 0:
                        print(f"{pages:>10}  {'first plan':<14} {solve[0]:>8.3f} {solve[1]:>8.3f}")
                        if args.repeat == 0:  # the first pass's other steps, for lack of more
                            firsts = (("read", read), ("estimate", est), ("report", report))
                            for name, v in (*firsts, ("save", save)):
                                print(
                                    f"{pages:>10}  {name + ' (1st)':<14} {v[0]:>8.3f} {v[1]:>8.3f}"
                                )
                        continue
                    parts = (("read", read), ("estimate", est), ("plan", solve), ("report", report))
                    for name, value in (*parts, ("save", save)):
                        steps.setdefault(name, []).append((value[0], value[1]))
                    total = (
                        read[0] + est[0] + solve[0] + report[0] + save[0],
                        read[1] + est[1] + solve[1] + report[1] + save[1],
                    )
                    steps.setdefault("re-plan", []).append(total)
            finally:
                store.close()
            for name, values in steps.items():
                wall = statistics.median(v[0] for v in values)
                cpu = statistics.median(v[1] for v in values)
                print(f"{pages:>10}  {name:<14} {wall:>8.3f} {cpu:>8.3f}", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
