"""The archive's commands: ``get``, ``cdx``, ``export``, ``prune`` (registered by
:mod:`refresher.ops._cli`). ``get``, ``cdx`` and ``export`` work while the daemon runs (they read
the snapshot's index and the WARC files; in a fleet, its PostgreSQL index and every node's
files); ``prune`` needs the store, so the daemon stopped (the daemon prunes by itself every
``archive.prune_interval``; in a fleet, the node)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from refresher._config import Config
from refresher._errors import ArchiveError, StoreError
from refresher.archive._archive import Archive
from refresher.archive._export import export
from refresher.archive._retention import HistoryRetention, PruneReport, prune_now
from refresher.store._duckdb import DuckDBStore

__all__ = ["COMMANDS", "add_commands", "run_command"]

COMMANDS = ("get", "cdx", "export", "prune")


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    get = sub.add_parser("get", help="print the archived body of a page (latest, or --at TIME)")
    common(get)
    get.add_argument("url")
    get.add_argument("--at", help="the version current then: ISO 8601 time or unix seconds")
    get.add_argument("--headers", action="store_true", help="print the status and headers too")

    cdx = sub.add_parser("cdx", help="the archive's index as CDXJ (pywb, OutbackCDX)")
    common(cdx)
    cdx.add_argument("--output", type=Path, help="a file instead of stdout")

    exp = sub.add_parser("export", help="the latest version of every page as a dataset")
    common(exp)
    exp.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    exp.add_argument("--output", type=Path, required=True, help="the file to write")
    exp.add_argument("--bodies", action="store_true", help="include the raw bodies")

    prune = sub.add_parser(
        "prune",
        help="apply archive.keep_versions, archive.max_bytes, store.history_retention "
        "(daemon stopped)",
    )
    common(prune)
    prune.add_argument("--keep-versions", type=int, help="override archive.keep_versions")
    prune.add_argument("--max-bytes", type=int, help="override archive.max_bytes")
    prune.add_argument(
        "--history-retention", type=float, help="override store.history_retention (seconds)"
    )
    prune.add_argument("--dry-run", action="store_true", help="report only")


def _when(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as e:
        raise ArchiveError(
            f"--at {text!r} is neither unix seconds nor an ISO 8601 time "
            "(e.g. 2026-11-23T21:00:00Z)"
        ) from e


def run_command(args: argparse.Namespace, config: Config) -> int:
    archive = Archive.from_config(config)
    if args.command == "get":
        version = archive.get(args.url, at=_when(args.at) if args.at else None)
        if version is None:
            when = f" at or before {args.at}" if args.at else ""
            print(
                f"refresher get: no archived version of {args.url}{when}; check the URL "
                "(`refresher cdx` lists them) or wait for the next snapshot",
                file=sys.stderr,
            )
            return 1
        out = sys.stdout.buffer
        if args.headers:
            head = [f"HTTP {version.status}"]
            head += [f"{k}: {v}" for k, v in version.headers]
            head.append(f"X-Refresher-Captured: {version.captured.isoformat()}")
            out.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace"))
        out.write(version.body)
        out.flush()
        return 0
    if args.command == "cdx":
        target = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
        try:
            for line in archive.cdxj():
                target.write(line + "\n")
        finally:
            if args.output:
                target.close()
        return 0
    if args.command == "export":
        n = export(archive, args.output, format=args.format, bodies=args.bodies)
        print(f"{n} pages written to {args.output}")
        return 0
    return _prune(args, config)


def _prune(args: argparse.Namespace, config: Config) -> int:
    a = config.archive
    keep = args.keep_versions if args.keep_versions is not None else a.keep_versions
    max_bytes = args.max_bytes if args.max_bytes is not None else a.max_bytes
    seconds = config.store.history_retention
    if args.history_retention is not None:
        seconds = args.history_retention
    if keep is None and max_bytes is None and seconds is None:
        print(
            "refresher prune: nothing to do; set archive.keep_versions, archive.max_bytes or "
            "store.history_retention (or --keep-versions/--max-bytes/--history-retention)",
            file=sys.stderr,
        )
        return 2
    if config.fleet.enabled:
        report = _prune_fleet_node(config, keep, max_bytes, seconds, dry_run=args.dry_run)
    else:
        report = _prune_store(config, keep, max_bytes, seconds, dry_run=args.dry_run)
    print(json.dumps({"dry_run": args.dry_run, **asdict(report)}, indent=2))
    return 0


def _prune_store(
    config: Config, keep: int | None, max_bytes: int | None, seconds: float | None, *, dry_run: bool
) -> PruneReport:
    history = dataclasses.replace(HistoryRetention.from_config(config), seconds=seconds)
    if not config.store.path.exists():
        raise StoreError(f"no store at {str(config.store.path)!r}; fix store.path or --store")
    try:
        store = DuckDBStore(config.store.path, memory_limit=config.store.memory_limit)
    except StoreError as e:
        raise StoreError(
            f"{e}; a running daemon applies retention itself every archive.prune_interval "
            "seconds (set the keys and `refresher reload`), or stop it to prune now"
        ) from e
    try:
        return prune_now(
            store,
            config.archive_dir,
            keep_versions=keep,
            max_bytes=max_bytes,
            dry_run=dry_run,
            history=partial(history.apply, store),
        )
    finally:
        store.close()


def _prune_fleet_node(
    config: Config, keep: int | None, max_bytes: int | None, seconds: float | None, *, dry_run: bool
) -> PruneReport:
    """This node's own WARC files (the node stopped: a running node prunes itself) and the
    fleet's history (one pass fleet-wide, whatever runs), while no fleet backup runs."""
    from refresher.store._pg_archive import node_archive_dir, pass_lock
    from refresher.store._pg_retention import FleetHistoryRetention
    from refresher.store._pg_status import node_running
    from refresher.store._postgres import PgStore

    f = config.fleet
    if (keep is not None or max_bytes is not None) and node_running(f.dsn, f.node_id, f.lease_ttl):
        raise StoreError(
            f"node {f.node_id!r} is running; it applies archive retention itself every "
            "archive.prune_interval seconds (set the keys and `refresher reload`), or stop it "
            "to prune now"
        )
    history = dataclasses.replace(FleetHistoryRetention.from_config(config), seconds=seconds)
    with pass_lock(f.dsn, f.node_id) as free:
        if not free:
            raise StoreError(
                "a fleet backup is copying the files, or a live node is pruning this stopped "
                "node's; prune when it is done"
            )
        store = PgStore.from_config(config)
        try:
            return prune_now(
                store,
                node_archive_dir(config),
                keep_versions=keep,
                max_bytes=max_bytes,
                dry_run=dry_run,
                history=history.apply,
            )
        finally:
            store.close()
