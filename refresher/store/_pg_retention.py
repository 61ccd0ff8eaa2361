"""History retention in a fleet: ``store.history_retention`` over the Parquet history's day
partitions and PostgreSQL's tail.

A pass removes, for every node, the published files of the days that ended before the cutoff
(``now − history_retention``; whole days, by the manifest ``history_files``) and the tail's
fetch records that finished before it. With ``store.history_export_dir`` set, the day files
are first copied there (same ``node=…/day=…`` layout, synced) and the tail's old rows written
there as ``fetches-TIMESTAMP.parquet`` in the transaction that deletes them. A day's files are
taken out of the manifest in one transaction before they are deleted, so a reader never sees
a listed file missing for good, and a crash between leaves only files no reader counts.

Unlike one node's pass, nothing is kept back per page: the estimator reads the per-page
statistics in ``pages``, which a pass does not touch. History rows are facts that no
partition's state depends on, and every node applies the same cutoff, so any node may run the
pass: one at a time fleet-wide (an advisory try-lock; the others skip that round), while no
fleet backup runs (the maintenance lock, held by the caller's pass).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from refresher.ops._logging import get_logger
from refresher.store._parquet import (
    FETCH_COLUMNS,
    READER_GRACE,
    copy_out,
    day_of,
    note_retired,
    retired_files,
    write_parquet,
)
from refresher.store._pg_session import PgSession

if TYPE_CHECKING:
    from refresher._config import Config

__all__ = ["FleetHistoryRetention"]

log = get_logger("retention")

#: advisory lock of "a history retention pass runs": one node at a time
_RETENTION_LOCK = 0x7266_7274


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetHistoryRetention:
    """``store.history_retention`` for a fleet (see the module docstring)."""

    dsn: str
    seconds: float | None
    history_dir: Path | None
    export_dir: Path | None = None

    @classmethod
    def from_config(cls, config: Config) -> FleetHistoryRetention:
        return cls(
            dsn=config.fleet.dsn,
            seconds=config.store.history_retention,
            history_dir=Path(config.fleet.history_dir) if config.fleet.history_dir else None,
            export_dir=config.store.history_export_dir,
        )

    def apply(self, now: float) -> tuple[int, str | None]:
        """One pass as of ``now`` (unix seconds): the fetch records removed (files' and
        tail's) and where they were exported; (0, None) when another node runs a pass."""
        if self.seconds is None:
            return 0, None
        cutoff = now - self.seconds
        session = PgSession(self.dsn)
        try:
            got = session.run(
                "locking the history retention",
                lambda cur: _one(cur, "SELECT pg_try_advisory_lock(%s)", (_RETENTION_LOCK,)),
            )
            if not got:
                return 0, None
            days = self._days(session, cutoff, now)
            tail = self._tail(session, cutoff)
            self._sweep(session, now)
        finally:
            session.close()  # the lock goes with the session
        removed = days + tail
        if removed:
            log.info(
                "fleet history pruned",
                fetches=removed,
                in_files=days,
                in_tail=tail,
                before=cutoff,
                exported=str(self.export_dir) if self.export_dir else None,
            )
        return removed, str(self.export_dir) if removed and self.export_dir else None

    async def apply_live(self, store: Any, now: float) -> tuple[int, str | None]:
        """:meth:`apply` from a daemon (its store is not needed: the pass has a connection of
        its own, so the node's batches do not wait for it)."""
        return await trio.to_thread.run_sync(self.apply, now)

    def _days(self, session: PgSession, cutoff: float, now: float) -> int:
        """The published files of the days that ended by ``cutoff`` out of the manifest (their
        files deleted :data:`READER_GRACE` later, by :meth:`_sweep`); their rows."""
        listed: list[tuple[str, int]] = session.run(
            "reading the history's manifest",
            lambda cur: _all(
                cur,
                "SELECT path, rows FROM history_files WHERE day < %s::date ORDER BY path",
                (day_of(cutoff),),
            ),
        )
        if not listed:
            return 0
        if self.history_dir is None:
            log.warning(
                "old history files not pruned: set fleet.history_dir in this config",
                files=len(listed),
            )
            return 0
        paths = [str(p) for p, _ in listed]
        if self.export_dir is not None:
            for rel in paths:
                _copy_synced(self.history_dir / rel, self.export_dir / rel)
        # Noted before they leave the manifest: a crash between leaves a note of files still
        # listed (the sweep drops those), never unlisted files nobody will delete.
        retired = retired_files(self.history_dir)
        note_retired(self.history_dir, retired | dict.fromkeys(paths, now))
        session.run(
            "forgetting old history files",
            lambda cur: cur.execute("DELETE FROM history_files WHERE path = ANY(%s)", (paths,)),
        )
        return sum(int(n) for _, n in listed)

    def _sweep(self, session: PgSession, now: float) -> int:
        """Delete the retired files whose grace has passed (those no longer listed); the
        number deleted. A query that listed one before it was retired has had
        :data:`READER_GRACE` seconds to read it."""
        if self.history_dir is None:
            return 0
        retired = retired_files(self.history_dir)
        due = sorted(p for p, at in retired.items() if at <= now - READER_GRACE)
        if not due:
            return 0
        listed = {
            p
            for p, _ in session.run(
                "reading the history's manifest",
                lambda cur: _all(
                    cur, "SELECT path, rows FROM history_files WHERE path = ANY(%s)", (due,)
                ),
            )
        }
        for rel in due:
            if rel not in listed:  # still listed: its pass rolled back; noted again later
                path = self.history_dir / rel
                path.unlink(missing_ok=True)
                _remove_if_empty(path.parent)
            del retired[rel]
        note_retired(self.history_dir, retired)
        return len(due) - len(listed)

    def _tail(self, session: PgSession, cutoff: float) -> int:
        """The tail's fetch records that finished before ``cutoff``, exported first."""

        def prune(cur: Any) -> int:
            cur.execute(
                "CREATE TEMP TABLE _old ON COMMIT DROP AS"
                " SELECT id FROM fetches WHERE finished_at < %s",
                (cutoff,),
            )
            n = int(_one(cur, "SELECT count(*) FROM _old", None))
            if n and self.export_dir is not None:
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                with tempfile.TemporaryDirectory(prefix="rfret") as tmp:
                    csv = Path(tmp) / "old.csv"
                    columns = ", ".join(c for c, _ in FETCH_COLUMNS)
                    copy_out(
                        cur,
                        f"SELECT {columns} FROM fetches WHERE id IN (SELECT id FROM _old)"
                        " ORDER BY id",
                        None,
                        csv,
                    )
                    write_parquet(csv, self.export_dir / f"fetches-{stamp}.parquet")
            if n:
                cur.execute("DELETE FROM fetches WHERE id IN (SELECT id FROM _old)")
            return n

        pruned: int = session.run("pruning the history's tail", prune)
        return pruned


def _one(cur: Any, sql: str, params: Any) -> Any:
    cur.execute(sql, params)
    return cur.fetchone()[0]


def _all(cur: Any, sql: str, params: Any) -> list[tuple[str, int]]:
    cur.execute(sql, params)
    return [(str(a), int(b)) for a, b in cur.fetchall()]


def _copy_synced(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` (made whole under a temporary name, synced, renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f".{target.name}.tmp"
    shutil.copyfile(source, temp)
    with temp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(temp, target)


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (or gone): leave it
        directory.rmdir()
