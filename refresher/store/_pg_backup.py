"""``refresher fleet backup DEST`` and ``refresher fleet restore SRC``: the whole fleet, while it
runs, around ``pg_dump``.

A backup is a directory made whole under ``DEST.partial`` and renamed to ``DEST`` (a DEST that
exists is complete)::

    DEST/fleet.dump                          pg_dump's custom format: every table, one snapshot
    DEST/history/node=<id>/day=<d>/….parquet  the published history (fleet.history_dir)
    DEST/archive/node=<id>/….warc.gz         each node's WARC files reachable from here
    DEST/backup.json                         what it holds, and what it could not reach

Consistency: ``pg_dump`` reads the database in one snapshot, and the files are copied after
it. Every Parquet file its manifest lists is still there (the history retention deletes files
only under the fleet's maintenance lock, which the backup holds exclusive; a file published
since is not listed, so a restored fleet never counts it, and its rows are in the dump's
tail), and every WARC record its index names is in the copy (the files are only appended to
while the lock keeps the archive's retention from rewriting them). The nodes go on fetching
meanwhile; their retention passes skip a round.

Restoring (:func:`restore_fleet`) loads the dump into an empty database with ``pg_restore``,
copies the files under the restoring config's ``fleet.history_dir`` and archive base, and notes
there the nodes' new archive directories. A node's files that were not reachable from the
backing-up machine are named in ``backup.json`` and by the command: copy them on that node.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from refresher._errors import StoreError
from refresher.store._parquet import node_directory
from refresher.store._pg_archive import FleetIndex, archive_base, maintenance_lock
from refresher.store._pg_dsn import connect, describe, redact

if TYPE_CHECKING:
    from refresher._config import Config

__all__ = ["FleetBackup", "backup_fleet", "restore_fleet"]

_DUMP = "fleet.dump"
#: how the archive's file names end (refresher.archive's; the store does not import it)
WARC_SUFFIX = ".warc.gz"
_INFO = "backup.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBackup:
    """What a fleet backup holds (or a restore restored)."""

    path: str
    history_files: int  # Parquet files of the published history
    warc_files: dict[str, int]  # node → WARC files copied
    unreachable: dict[str, str] = field(default_factory=dict)  # node → its directory, not here
    bytes: int = 0
    seconds: float = 0.0


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise StoreError(
            f"{name} not found; install PostgreSQL's client programs "
            "(apt-get install postgresql-client) or put them on PATH"
        )
    return found


def _run(tool: str, args: list[str], dsn: str) -> None:
    """``tool`` with ``dsn`` (its password, if any, through the environment, never argv)."""
    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    env = dict(os.environ)
    if password:
        env["PGPASSWORD"] = str(password)
    argv = [_tool(tool), *args, "--dbname", make_conninfo("", **params)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise StoreError(f"{tool} failed on {redact(dsn)!r}: {why}")


def _copy(source: Path, target: Path) -> int:
    """``source`` to ``target``, synced; its bytes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    with target.open("rb") as f:
        os.fsync(f.fileno())
    return target.stat().st_size


def _copy_history(source: Path | None, target: Path | None) -> tuple[int, int]:
    """Every published Parquet file under ``source`` to the same place under ``target`` (in a
    backup, a superset of what the dump's manifest lists); (files, bytes)."""
    if source is None or target is None or not source.is_dir():
        return 0, 0
    files = n = 0
    for path in sorted(source.glob("node=*/day=*/*.parquet")):
        n += _copy(path, target / path.relative_to(source))
        files += 1
    return files, n


def _copy_archives(index: FleetIndex, dest: Path) -> tuple[dict[str, int], dict[str, str], int]:
    """Each node's WARC files from the first of its directories found here."""
    copied: dict[str, int] = {}
    unreachable: dict[str, str] = {}
    total = 0
    for node in sorted(index.noted()):
        found = next((d for d in index.candidates(node) if d.is_dir()), None)
        if found is None:
            unreachable[node] = str(index.noted()[node])
            continue
        files = sorted(found.glob(f"*{WARC_SUFFIX}"))
        for path in files:
            total += _copy(path, node_directory(dest, node) / path.name)
        copied[node] = len(files)
    return copied, unreachable, total


def backup_fleet(config: Config, dest: Path) -> FleetBackup:
    """Back the fleet ``config`` names up to the new directory ``dest`` (see the module
    docstring); the nodes may run meanwhile."""
    t0 = time.perf_counter()
    if dest.exists():
        raise StoreError(f"{str(dest)!r} exists; give a new directory name or remove it first")
    if not dest.parent.is_dir():
        raise StoreError(f"no directory {str(dest.parent)!r}; create it or give another DEST")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    f = config.fleet
    history = Path(f.history_dir) if f.history_dir else None
    try:
        with maintenance_lock(f.dsn, exclusive=True):
            _run("pg_dump", ["--format", "custom", "--file", str(partial / _DUMP)], f.dsn)
            files, history_bytes = _copy_history(history, partial / "history")
            index = FleetIndex(f.dsn, base=archive_base(config))
            copied, unreachable, warc_bytes = _copy_archives(index, partial / "archive")
        result = FleetBackup(
            path=str(dest),
            history_files=files,
            warc_files=copied,
            unreachable=unreachable,
            bytes=(partial / _DUMP).stat().st_size + history_bytes + warc_bytes,
            seconds=time.perf_counter() - t0,
        )
        info = {**asdict(result), "fleet": redact(f.dsn), "made_at": time.time()}
        (partial / _INFO).write_text(json.dumps(info, indent=2))
        os.replace(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return result


def restore_fleet(config: Config, source: Path) -> FleetBackup:
    """Restore the backup ``source`` into the empty database ``config`` names, its files under
    the config's ``fleet.history_dir`` (and archive base); the nodes stopped."""
    t0 = time.perf_counter()
    f = config.fleet
    if not (source / _DUMP).is_file():
        raise StoreError(f"{str(source)!r} is not a fleet backup (no {_DUMP} in it)")
    if _has_fleet(f.dsn):
        raise StoreError(
            f"the database {redact(f.dsn)!r} already holds a fleet; restore into a new, "
            "empty database (createdb) and point fleet.dsn at it"
        )
    history = Path(f.history_dir) if f.history_dir else None
    if history is None and (source / "history").is_dir():
        raise StoreError(
            "the backup holds a Parquet history; set fleet.history_dir to where it goes"
        )
    _run(
        "pg_restore",
        ["--no-owner", "--no-privileges", "--exit-on-error", str(source / _DUMP)],
        f.dsn,
    )
    files, n = _copy_history(source / "history", history)
    copied: dict[str, int] = {}
    base = archive_base(config)
    for directory in sorted((source / "archive").glob("node=*")):
        node = directory.name.split("=", 1)[1]
        target = node_directory(base, node)
        for path in sorted(directory.glob(f"*{WARC_SUFFIX}")):
            n += _copy(path, target / path.name)
        copied[node] = len(list(directory.glob(f"*{WARC_SUFFIX}")))
        _note_archive(f.dsn, node, target)
    info = json.loads((source / _INFO).read_text()) if (source / _INFO).is_file() else {}
    return FleetBackup(
        path=str(source),
        history_files=files,
        warc_files=copied,
        unreachable=dict(info.get("unreachable", {})),
        bytes=n,
        seconds=time.perf_counter() - t0,
    )


def _has_fleet(dsn: str) -> bool:
    try:
        with connect(dsn) as con:
            row = con.execute("SELECT to_regclass('fleet_meta') IS NOT NULL").fetchone()
    except psycopg.Error as e:
        raise StoreError(f"reading {redact(dsn)!r}: {describe(e)}") from e
    return bool(row and row[0])


def _note_archive(dsn: str, node: str, directory: Path) -> None:
    """Where ``node``'s WARC files are now (readers look there first)."""
    with contextlib.closing(connect(dsn)) as con, con.transaction():
        con.execute(
            "INSERT INTO fleet_meta (key, value) VALUES (%s, %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (f"archive_dir@{node}", str(directory.resolve())),
        )
