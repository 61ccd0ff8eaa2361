"""``refresher demo`` (what ``make run`` runs): the daemon refreshing a small local web.

The demo web (:func:`refresher._site.make_demo_site`) is served on a free loopback port; its
virtual hosts ``h0.sim.test`` … reach the daemon through a static DNS override. The DuckDB file
is left behind (``var/demo.duckdb`` unless ``--store`` says otherwise) to explore.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import trio

from ._config import Config, load_config
from ._daemon import Daemon
from ._logging import get_logger
from ._site import make_demo_site, serve_site

__all__ = ["run_demo"]

log = get_logger("demo")

DEMO_STORE = Path("var/demo.duckdb")


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


async def _demo(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    site = make_demo_site(hosts=args.hosts, pages_per_host=args.pages)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_site, site)
        demo = {
            "store": {"path": str(DEMO_STORE)},
            "crawl": {"seeds": site.urls(), "workers": 16},
            "dns": {"static": {"*.sim.test": f"127.0.0.1:{port}"}},
            "budget": {"fetches_per_second": 5.0},
            "politeness": {"min_delay": 0.5},
            "log": {"progress_interval": 5.0},
        }

        def load() -> Config:
            # The demo ignores /etc/refresher: it must run the same on every machine.
            return load_config(
                args.config, overrides=_merged(demo, overrides), default_file=Path("/nonexistent")
            )

        daemon = Daemon(load)
        log.info("demo web serving", port=port, hosts=args.hosts, pages=len(site.urls()))
        if args.duration is not None:

            async def stop_later() -> None:
                await trio.sleep(args.duration)
                os.kill(os.getpid(), signal.SIGTERM)

            nursery.start_soon(stop_later)
        status = await daemon.run()
        log.info(
            "demo finished; explore the history with DuckDB",
            store=str(daemon.config.store.path),
            try_="duckdb " + str(daemon.config.store.path) + ' "FROM fetch_log LIMIT 10"',
        )
        nursery.cancel_scope.cancel()
    return status


def run_demo(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    return trio.run(_demo, args, overrides)
