"""The archive's commands: ``get``, ``cdx``, ``export``, ``prune`` (registered by
:mod:`refresher.ops._cli`). ``get``, ``cdx`` and ``export`` work while the daemon runs (they read
the snapshot's index and the WARC files); ``prune`` needs the store, so the daemon stopped (the
daemon prunes by itself every ``archive.prune_interval``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from refresher._config import Config
from refresher._errors import ArchiveError, StoreError
from refresher.archive._archive import Archive
from refresher.archive._export import export
from refresher.archive._retention import HistoryRetention, prune_now
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
    history = HistoryRetention.from_config(config)
    if args.history_retention is not None:
        history = dataclasses.replace(history, seconds=args.history_retention)
    if keep is None and max_bytes is None and history.seconds is None:
        print(
            "refresher prune: nothing to do; set archive.keep_versions, archive.max_bytes or "
            "store.history_retention (or --keep-versions/--max-bytes/--history-retention)",
            file=sys.stderr,
        )
        return 2
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
        report = prune_now(
            store,
            config.archive_dir,
            keep_versions=keep,
            max_bytes=max_bytes,
            dry_run=args.dry_run,
            history=history,
        )
    finally:
        store.close()
    print(json.dumps({"dry_run": args.dry_run, **asdict(report)}, indent=2))
    return 0
