"""Retention: ``archive.keep_versions`` per page and ``archive.max_bytes`` overall.

A pass (``refresher prune`` on a stopped store, or the daemon every ``archive.prune_interval``)
picks the index rows to drop (:func:`refresher.store._captures.prune_candidates`: versions past
``keep_versions`` per page, then the oldest until the rest fit in ``max_bytes``; the latest
version of every page is never dropped), then per WARC file holding any of them:

* nothing left in it: the rows are deleted, then the file;
* some left: the kept records are copied to a new file (``…-pYYYYmmddHHMMSS.warc.gz``, synced),
  the rows are moved to it in one transaction, then the old file is deleted.

The file being written is never touched. A crash at any point leaves every indexed record
readable: at worst a file no row points at remains (a new copy not yet indexed, or an old file
whose rows moved), which costs space and nothing else.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from refresher._config import Config
from refresher.archive._warc import WARC_SUFFIX, first_record_end, held_files, lock_for_writing
from refresher.ops._logging import get_logger
from refresher.store._duckdb import DuckDBStore, StoreService
from refresher.store._prune import FilePlan, PrunePlan, apply_plan, plan_prune

__all__ = [
    "HistoryPruning",
    "HistoryRetention",
    "PrunePlan",
    "PruneReport",
    "PruneStore",
    "Pruner",
    "SyncPruneStore",
    "apply_plan",
    "plan_prune",
    "prune_absent",
    "prune_now",
]

log = get_logger("retention")


@dataclass(frozen=True, slots=True, kw_only=True)
class PruneReport:
    """What a pass removed."""

    records: int  # index rows (versions and revisits) removed
    bytes_freed: int  # bytes of WARC files removed or rewritten away
    deleted: tuple[str, ...] = ()  # WARC files deleted whole
    rewritten: tuple[tuple[str, str], ...] = ()  # (old, new) file names
    seconds: float = 0.0
    history_rows: int = 0  # fetches deleted by the history retention
    history_export: str | None = None  # the Parquet file they went to


def _copy_kept(directory: Path, plan: FilePlan) -> tuple[str, list[tuple[int, int]]]:
    """Copy the kept records (and the file's leading warcinfo) to a new file; its name and the
    (old offset, new offset) of each record."""
    old = directory / plan.file
    stem = plan.file[: -len(WARC_SUFFIX)] if plan.file.endswith(WARC_SUFFIX) else plan.file
    if "-p" in stem.rsplit("~", 1)[-1]:  # rewritten before: replace the suffix
        stem = stem[: stem.rindex("-p")]
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    n = 0
    while (directory / (new_name := f"{stem}-p{stamp}{n or ''}{WARC_SUFFIX}")).exists():
        n += 1  # rewritten twice within a second
    moves: list[tuple[int, int]] = []
    with old.open("rb") as src, (directory / new_name).open("xb") as dst:
        lock_for_writing(dst.fileno())  # not another writer's recovery to cut while copied
        dst.write(src.read(first_record_end(old)))  # the warcinfo record
        for offset, span in plan.keep:
            src.seek(offset)
            moves.append((offset, dst.tell()))
            dst.write(src.read(span))
        dst.flush()
        os.fsync(dst.fileno())
    return new_name, moves


def rewrite_files(directory: Path, plan: PrunePlan) -> dict[str, tuple[str, list[tuple[int, int]]]]:
    """The file work of a pass (no index change): new copies of partly kept files."""
    return {f.file: _copy_kept(directory, f) for f in plan.files if f.keep}


def _finish(directory: Path, plan: PrunePlan, copies: dict[str, Any], t0: float) -> PruneReport:
    for f in plan.files:
        (directory / f.file).unlink(missing_ok=True)
    report = PruneReport(
        records=plan.records,
        bytes_freed=sum(f.dropped_bytes for f in plan.files),
        deleted=tuple(f.file for f in plan.files if f.file not in copies),
        rewritten=tuple((old, new) for old, (new, _) in copies.items()),
        seconds=time.perf_counter() - t0,
    )
    if report.records:
        log.info(
            "archive pruned",
            records=report.records,
            bytes_freed=report.bytes_freed,
            deleted=list(report.deleted),
            rewritten=[new for _, new in report.rewritten],
        )
    return report


def prune_absent(
    *,
    dsn: str,
    node_id: str,
    absent_after: float,
    base: Path,
    keep_versions: int | None,
    max_bytes: int | None,
) -> list[PruneReport]:
    """A fleet node's pass over the WARC files of the nodes absent longer than
    ``absent_after`` seconds that this machine reaches (under ``base``, or where they noted
    their directory): as each node's own pass (:func:`refresher.store._pg_archive.plan_node_prune`),
    one pass per node at a time fleet-wide, and never a file a live process holds open for
    appending (a node that came back writes to a file of its own). One report per node pruned."""
    from refresher.store._pg_archive import (
        absent_archives,
        apply_absent,
        node_files_lock,
        plan_absent,
    )

    if keep_versions is None and max_bytes is None:
        return []
    reports = []
    for node, directory in absent_archives(dsn, node_id, absent_after=absent_after, base=base):
        with node_files_lock(dsn, node) as free:
            if not free:
                continue  # the node itself, or another live node, is at it
            t0 = time.perf_counter()
            plan = plan_absent(
                dsn,
                node,
                keep_versions=keep_versions,
                max_bytes=max_bytes,
                protect=held_files(directory),
            )
            copies = rewrite_files(directory, plan)
            apply_absent(dsn, node, plan, copies)
            report = _finish(directory, plan, copies, t0)
        if report.records:
            log.info("pruned the archive of an absent node", node=node, records=report.records)
        reports.append(report)
    return reports


class SyncPruneStore(Protocol):
    """A store nobody else prunes meanwhile, called directly (``refresher prune``)."""

    def plan_prune(
        self, *, keep_versions: int | None, max_bytes: int | None, protect: Collection[str] = ()
    ) -> PrunePlan: ...

    def apply_prune(
        self, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
    ) -> None: ...


def prune_now(
    store: SyncPruneStore,
    directory: Path,
    *,
    keep_versions: int | None,
    max_bytes: int | None,
    protect: Collection[str] = (),
    dry_run: bool = False,
    history: Callable[[float], tuple[int, str | None]] | None = None,
) -> PruneReport:
    """A whole pass on a store no daemon prunes (``refresher prune``): ``history(now)`` (the
    history retention) first, then the archive in ``directory``."""
    t0 = time.perf_counter()
    rows, exported = (0, None)
    if history is not None and not dry_run:
        rows, exported = history(time.time())
    plan = store.plan_prune(keep_versions=keep_versions, max_bytes=max_bytes, protect=protect)
    if dry_run:
        return PruneReport(
            records=plan.records, bytes_freed=sum(f.dropped_bytes for f in plan.files)
        )
    copies = rewrite_files(directory, plan)
    store.apply_prune(plan, copies)
    report = _finish(directory, plan, copies, t0)
    return dataclasses.replace(report, history_rows=rows, history_export=exported)


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryRetention:
    """``store.history_retention``: fetches older than ``seconds`` go (each page's latest
    ``keep_per_page`` stay), exported to ``export_dir`` first when set."""

    seconds: float | None
    keep_per_page: int
    export_dir: Path | None = None

    @classmethod
    def from_config(cls, config: Config) -> HistoryRetention:
        return cls(
            seconds=config.store.history_retention,
            keep_per_page=config.estimate.history,
            export_dir=config.store.history_export_dir,
        )

    def apply(self, store: DuckDBStore, now: float) -> tuple[int, str | None]:
        """Prune ``store`` (nobody else writing to it) as of ``now`` (unix seconds)."""
        if self.seconds is None:
            return 0, None
        n, path = store.prune_history(
            before=now - self.seconds, keep_per_page=self.keep_per_page, export_dir=self.export_dir
        )
        return self.logged(n, path)

    async def apply_live(self, store: StoreService, now: float) -> tuple[int, str | None]:
        """:meth:`apply` through a running daemon's store queue."""
        if self.seconds is None:
            return 0, None
        n, path = await store.prune_history(
            before=now - self.seconds, keep_per_page=self.keep_per_page, export_dir=self.export_dir
        )
        return self.logged(n, path)

    @staticmethod
    def logged(n: int, path: Path | None) -> tuple[int, str | None]:
        if n:
            log.info("history pruned", fetches=n, exported=str(path) if path else None)
        return n, str(path) if path else None


class PruneStore(Protocol):
    """What a pass asks of a store (through its queue): both stores' :class:`PruneCalls`."""

    async def plan_prune(
        self,
        *,
        keep_versions: int | None,
        max_bytes: int | None,
        protect: Callable[[], Collection[str]],
    ) -> PrunePlan: ...

    async def apply_prune(
        self, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
    ) -> None: ...


class HistoryPruning(Protocol):
    """``store.history_retention``: one node's (:class:`HistoryRetention`) or a fleet's
    (:class:`refresher.store._pg_retention.FleetHistoryRetention`)."""

    @property
    def seconds(self) -> float | None: ...

    async def apply_live(self, store: Any, now: float) -> tuple[int, str | None]: ...


@dataclass(slots=True)
class Pruner:
    """The daemon's periodic pass: planning and the index change through the store's queue,
    the file copying in a worker thread so the store's queue does not wait on it."""

    store: PruneStore
    directory: Path
    keep_versions: int | None
    max_bytes: int | None
    interval: float  # seconds
    protect: Callable[[], Collection[str]]  # files not to touch (WarcWriter.unsettled)
    history: HistoryPruning | None = None
    archive: bool = True  # False: no archive, only the history is pruned
    #: awaited after a pass that removed anything (the snapshot rebuilds its copies)
    on_change: Callable[[], Awaitable[None]] | None = None
    #: closes the file being written, so that its old versions can go in a later pass
    rotate: Callable[[], None] | None = None
    #: held (in a worker thread) for a whole pass; yields False: skip this pass (a fleet's
    #: backup is copying the files, or another node prunes this one's)
    lock: Callable[[], AbstractContextManager[bool]] | None = None
    #: run (in a worker thread) after the pass over its own files: a fleet node's pass over
    #: the files of nodes absent too long (:func:`prune_absent`)
    others: Callable[[], list[PruneReport]] | None = None
    passes: int = field(default=0)
    last: PruneReport | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            history = self.history is not None and self.history.seconds is not None
            if self.keep_versions is None and self.max_bytes is None and not history:
                continue
            try:
                report = await self.prune()
                if (report.records or report.history_rows) and self.on_change is not None:
                    await self.on_change()
            except Exception:
                log.exception("archive prune failed; the index and files are as they were")

    async def prune(self) -> PruneReport:
        if self.lock is None:
            return await self._prune()
        held = self.lock()
        got = await trio.to_thread.run_sync(held.__enter__)
        try:
            if not got:
                log.info(
                    "retention pass skipped: a fleet backup is copying the files, or another "
                    "node prunes this one's"
                )
                return PruneReport(records=0, bytes_freed=0)
            return await self._prune()
        finally:
            await trio.to_thread.run_sync(held.__exit__, None, None, None)

    async def _prune(self) -> PruneReport:
        t0 = time.perf_counter()
        history = self.history
        rows, exported = (0, None)
        if history is not None:
            rows, exported = await history.apply_live(self.store, time.time())
        if not self.archive:
            self.last = PruneReport(
                records=0, bytes_freed=0, history_rows=rows, history_export=exported
            )
            return self.last
        if self.rotate is not None:
            await trio.to_thread.run_sync(self.rotate)
        plan = await self.store.plan_prune(
            keep_versions=self.keep_versions, max_bytes=self.max_bytes, protect=self.protect
        )
        copies = await trio.to_thread.run_sync(rewrite_files, self.directory, plan)
        await self.store.apply_prune(plan, copies)
        report = await trio.to_thread.run_sync(_finish, self.directory, plan, copies, t0)
        report = dataclasses.replace(report, history_rows=rows, history_export=exported)
        if self.others is not None:
            await trio.to_thread.run_sync(self.others)
        self.passes += 1
        self.last = report
        return report
