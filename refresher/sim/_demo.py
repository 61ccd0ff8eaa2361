"""``refresher demo`` (what ``make run`` runs): the daemon refreshing a simulated web, live.

The simulated web (:mod:`refresher.sim._simweb`, default configuration: 10 hosts × 30 pages whose
changes are Poisson processes with heavy-tailed rates, compressed so a minute of wall time is
three simulated days) is served on a free loopback port; its virtual hosts ``h0.sim.test`` …
reach the daemon through a static DNS override. Every few seconds a line shows pages tracked,
fetches per second, changes seen, and the estimated and the **true** freshness of the copy
(true: the share of pages whose last successful fetch saw the version the web serves now).
On exit the history stays in ``var/demo.duckdb`` and the truth in ``var/demo-truth.duckdb``;
the next run starts fresh (it removes both: a history only pairs with its own run's truth).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from refresher._config import Config, load_config, merge_tables
from refresher._errors import StoreError
from refresher.ops._daemon import Daemon
from refresher.sim._simweb import SimwebConfig, build_site, serve_simweb, write_truth
from refresher.sim._site import Site
from refresher.store._snapshot import snapshot_path

__all__ = ["DEMO_STORE", "DEMO_TRUTH", "run_demo"]

DEMO_STORE = Path("var/demo.duckdb")
DEMO_TRUTH = Path("var/demo-truth.duckdb")


def _freshness(
    site: Site, rows: list[tuple[str, float | None, float | None]], now: float
) -> tuple[float, float]:
    """(estimated, true) mean freshness over the same pages: those that have a copy and an
    estimate (NaN, NaN when none has). A page found since the last plan has no λ̂ yet; it
    was counted as never changing in the estimate and as it is in the truth."""
    est: list[float] = []
    true: list[float] = []
    for url, last, rate in rows:
        if last is None or rate is None:
            continue
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            same = site.version(parts.hostname or "", path, now) == site.version(
                parts.hostname or "", path, last
            )
        except Exception:
            continue  # a page the web does not have (a sitemap guess, a 404)
        true.append(1.0 if same else 0.0)
        est.append(math.exp(-rate * max(now - last, 0.0)))
    if not true:
        return math.nan, math.nan
    return sum(est) / len(est), sum(true) / len(true)


def _shown(est: float, true: float) -> str:
    if math.isnan(est):
        return "est. --   true --   (no estimate yet)"
    return f"est. {est:.2f} true {true:.2f}"


async def _show(daemon: Daemon, site: Site, interval: float) -> None:
    started = time.monotonic()
    last_t, last_n = started, 0
    while True:
        await trio.sleep(interval)
        status = daemon.status()
        store = daemon.store
        if store is None or "crawler" not in status:
            continue
        try:
            rows = await store.last_refreshes()
        except trio.ClosedResourceError:
            return  # the daemon is stopping: its store takes no more requests
        est, true = _freshness(site, rows, time.time())
        c, s = status["crawler"], status.get("store", {})
        # The rate over this line's own interval (the daemon's progress rate starts at 0).
        now = time.monotonic()
        rate = (c["fetches"] - last_n) / max(now - last_t, 1e-9)
        last_t, last_n = now, c["fetches"]
        print(
            f"[{now - started:5.0f} s] pages {s.get('pages', 0):4d} | "
            f"fetches {c['fetches']:5d} ({rate:4.1f}/s) | "
            f"changed {c['changed']:4d} | 304 {c['not_modified']:4d} | "
            f"errors {c['errors']:3d} | freshness {_shown(est, true)}",
            flush=True,
        )


def start_fresh(config: Config) -> list[Path]:
    """Remove the previous demo run (history, truth beside it, snapshot, WARC files); returns
    the removed.

    A history and its truth only make sense together: the simulated web is new every run, so
    a second run appended to the first history would pair it with the wrong truth. A store
    without a demo truth beside it is not a demo's: refuse to touch it.
    """
    store = config.store.path
    truth = store.parent / DEMO_TRUTH.name
    if store.exists() and not truth.exists():
        raise StoreError(
            f"{str(store)!r} exists but has no {DEMO_TRUTH.name} beside it, so it is not a "
            "demo's history; give the demo another --store"
        )
    names = [store, truth, snapshot_path(config)]
    gone = []
    for path in names:
        for part in (path, path.with_name(path.name + ".wal")):
            if part.exists():
                part.unlink()
                gone.append(part)
    if gone:  # the WARC files of that run go with its history (their index was in it)
        for warc in sorted(config.archive_dir.glob("*.warc.gz")):
            warc.unlink()
            gone.append(warc)
    return gone


async def _demo(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    sim = SimwebConfig(hosts=args.hosts, pages_per_host=args.pages)
    site = build_site(sim)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_simweb(sim, site=site, port=0, task_status=task_status)
        )
        budget = 10.0
        demo: dict[str, Any] = {
            "store": {"path": str(DEMO_STORE)},
            "crawl": {"seeds": [f"http://h{i}.sim.test/" for i in range(sim.hosts)], "workers": 16},
            "dns": {"static": {"*.sim.test": f"127.0.0.1:{port}"}},
            "budget": {"fetches_per_second": budget},
            "policy": {"name": "optimal", "resolve_interval": 10.0},
            "politeness": {"min_delay": 0.2, "response_time_factor": 2.0},
            "snapshot": {"interval": 10.0},
            "log": {"level": "warning", "progress_interval": 5.0},
        }

        def load() -> Config:
            # The demo ignores /etc/refresher: it must run the same on every machine.
            return load_config(
                args.config,
                overrides=merge_tables(demo, overrides),
                default_file=Path("/nonexistent"),
            )

        daemon = Daemon(load)
        print(
            f"refresher demo: a simulated web of {sim.hosts} hosts × {sim.pages_per_host} pages "
            f"on 127.0.0.1:{port} (h0.sim.test …), budget {budget} "
            "fetches/s, policy optimal. Ctrl-C stops.",
            flush=True,
        )
        if args.duration is not None:

            async def stop_later() -> None:
                await trio.sleep(args.duration)
                os.kill(os.getpid(), signal.SIGTERM)

            nursery.start_soon(stop_later)
        nursery.start_soon(_show, daemon, site, 5.0)
        status = await daemon.run()
        nursery.cancel_scope.cancel()
    db = daemon.config.store.path
    truth = db.parent / DEMO_TRUTH.name  # beside the history
    write_truth(site, truth, until=time.time())
    print(
        f"\nThe history is in {db}, the simulated web's truth in {truth}. Try:\n"
        f'  refresher query --store {db} "SELECT host, count(*) AS fetches, '
        'sum(changed::INT) AS changes FROM fetch_log GROUP BY host ORDER BY host"\n'
        f'  refresher query --store {db} "SELECT to_timestamp(window_start) AS since, policy, '
        'budget, freshness, age FROM freshness_by_policy"\n'
        f'  refresher query --store {db} --truth {truth} "SELECT host, freshness, '
        'estimated_freshness FROM true_freshness_by_host()"',
        file=sys.stdout,
    )
    return status


def run_demo(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    where = load_config(
        args.config,
        overrides=merge_tables({"store": {"path": str(DEMO_STORE)}}, overrides),
        default_file=Path("/nonexistent"),
    )
    removed = start_fresh(where)
    if removed:
        print(
            "refresher demo: starting fresh; removed the previous run's "
            + ", ".join(str(p) for p in removed if not p.name.endswith(".wal")),
            flush=True,
        )
    try:
        return trio.run(_demo, args, overrides)
    except KeyboardInterrupt:
        return 0
