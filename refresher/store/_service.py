"""The batched writer: one ordered queue in front of a synchronous store, served by one thread.

Both stores use it: the embedded DuckDB file (:class:`refresher.store.StoreService`) and a
fleet's PostgreSQL database (:class:`refresher.store.PostgresStore`). Fetch records and host
updates are queued and committed together in a batch (at most ``flush_interval`` seconds or
``batch_size`` records); a fetch is *acknowledged* when its batch commits. Every other operation
first commits what was queued before it, so it sees every earlier write.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import trio
from numpy.typing import NDArray

from refresher._cpus import every_cpu, no_wakeup_preemption
from refresher._errors import StoreError
from refresher.ops._logging import get_logger
from refresher.store._captures import BatchArchive, Capture, CaptureRow
from refresher.store._interface import (
    DocumentUpdate,
    EstimatorInputs,
    FetchRecord,
    Findings,
    HostRow,
    HostSummary,
    HostUpdate,
    NewPage,
    PageRow,
    PlanUpdate,
    RobotsUpdate,
    StoreStatistics,
    StoreStatus,
)

__all__ = ["BatchedService", "SyncStore"]

T = TypeVar("T")
log = get_logger("store")

#: payload bytes of queued captures that commit their batch early: the archive's copies wait
#: in memory until their batch is written, so large pages must not pile up (bytes)
CAPTURE_BYTES = 32 << 20


class SyncStore(Protocol):
    """The synchronous operations a store offers the batched writer (one thread at a time)."""

    def write(
        self,
        records: Sequence[FetchRecord],
        hosts: Sequence[HostUpdate],
        robots: Sequence[RobotsUpdate] = (),
        captures: Sequence[CaptureRow] = (),
    ) -> int:
        """Commit one batch in one transaction; the number of fetch records written."""
        ...

    def counts(self) -> tuple[int, int, int]: ...

    def load_due(
        self, *, after: tuple[float, int], until: float, limit: int, known_hosts: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]: ...

    def add_pages_with_hosts(
        self, pages: Sequence[NewPage], *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow]]: ...

    def save_document(
        self, update: DocumentUpdate, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]: ...

    def owed_documents(
        self, limit: int, *, grace: float, now: float
    ) -> list[tuple[int, int, float, Findings]]: ...

    def known_fingerprints(self, fps: NDArray[np.int64]) -> NDArray[np.bool_]: ...

    def page_ids(self, urls: NDArray[np.str_]) -> NDArray[np.int64]: ...

    def discovery_scope(self) -> tuple[list[str], dict[str, int]]: ...

    def estimator_inputs(
        self, *, meaningful: bool, links: bool, responses_since: float | None = None
    ) -> EstimatorInputs: ...

    def save_plan(self, plan: PlanUpdate, *, now: float) -> None: ...

    def record_policy(self, policy: str, budget: float, *, now: float) -> None: ...

    def policy_in_force(self, configured: str) -> str: ...

    def switch_policy(self, policy: str, *, configured: str, budget: float, now: float) -> None: ...

    def set_paused(self, host: str, paused: bool) -> bool: ...

    def status(self, *, now: float) -> StoreStatus: ...

    def last_refreshes(self) -> list[tuple[str, float | None, float | None]]: ...

    def host_summary(self, *, now: float, limit: int | None) -> list[HostSummary]: ...


S = TypeVar("S", bound=SyncStore)


def _save_documents(
    store: SyncStore, updates: Sequence[DocumentUpdate], now: float
) -> list[tuple[list[PageRow], dict[int, HostRow], int]]:
    """``store.save_document`` for each update, or the store's own ``save_documents`` (one
    statement of each kind for the lot) when it has one, as the embedded DuckDB store does."""
    batched = getattr(store, "save_documents", None)
    if batched is not None:
        saved: list[tuple[list[PageRow], dict[int, HostRow], int]] = batched(updates, now=now)
        return saved
    return [store.save_document(u, now=now) for u in updates]


@dataclass(slots=True)
class _Call:
    fn: Callable[[Any], Any]
    done: trio.Event
    result: Any = None
    error: BaseException | None = None


class BatchedService(Generic[S]):
    """:class:`refresher.store.Store` over a synchronous store ``S``: an ordered queue served
    by one thread at a time.

    ``record`` and ``update_host`` queue writes that commit in batches (``S.write``); every
    other operation runs on the store in a worker thread after committing everything queued
    before it.
    """

    def __init__(
        self,
        store: S,
        *,
        flush_interval: float = 0.5,
        batch_size: int = 5000,
        archive: BatchArchive | None = None,
    ):
        self.store = store
        #: synced before each batch commits, so an index row never points at a missing record
        self.archive = archive
        self._captures: list[Capture] = []
        self._capture_bytes = 0  # payload bytes queued in _captures
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self._send, self._recv = trio.open_memory_channel[Any](batch_size * 2)
        self._records: list[FetchRecord] = []
        self._hosts: list[HostUpdate] = []
        self._robots: list[RobotsUpdate] = []
        self._acknowledged = 0
        self._batches = 0
        self._last_batch_seconds = 0.0
        self._counts = store.counts()
        self._closed = False
        #: called in the trio thread with each committed batch's size
        self.on_commit: list[Callable[[int], None]] = []
        #: set for a store whose failures may pass (a database server restarting): such a
        #: failure is retried with backoff, writes and calls kept in order, instead of ending
        #: the service; once closed, for at most ``retry_closing`` seconds
        self.transient: Callable[[BaseException], bool] | None = None
        self.retry_closing = 10.0
        self.retries = 0

    async def record(
        self,
        record: FetchRecord,
        capture: Capture | None = None,
        host: HostUpdate | None = None,
    ) -> None:
        """Queue one fetch (with its copy to archive and its host's new state); it is
        acknowledged when its batch commits. One send per fetch: each is a scheduling turn."""
        await self._send.send((record, capture, host))

    async def update_host(self, update: HostUpdate | RobotsUpdate) -> None:
        """Queue new host state (politeness, or a fetched robots.txt); commits with a batch."""
        await self._send.send(update)

    # -- the named operations (refresher.store.Store) ---------------------------------------

    async def load_due(
        self, *, after: tuple[float, int], until: float, limit: int, known_hosts: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        return await self._call(
            lambda s: s.load_due(after=after, until=until, limit=limit, known_hosts=known_hosts)
        )

    async def add_pages(
        self, pages: Sequence[NewPage], *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        return await self._call(lambda s: s.add_pages_with_hosts(pages, now=now))

    async def save_document(
        self, update: DocumentUpdate, *, now: float
    ) -> tuple[list[PageRow], dict[int, HostRow], int]:
        return await self._call(lambda s: s.save_document(update, now=now))

    async def save_documents(
        self, updates: Sequence[DocumentUpdate], *, now: float
    ) -> list[tuple[list[PageRow], dict[int, HostRow], int]]:
        """:meth:`save_document` for each of ``updates`` in order, in one call: one hop to
        the store thread and one commit of the queued writes for the lot."""
        return await self._call(lambda s: _save_documents(s, updates, now))

    async def owed_documents(
        self, limit: int, *, grace: float, now: float | None = None
    ) -> list[tuple[int, int, float, Findings]]:
        at = time.time() if now is None else now
        return await self._call(lambda s: s.owed_documents(limit, grace=grace, now=at))

    async def known_fingerprints(self, fps: NDArray[np.int64]) -> NDArray[np.bool_]:
        found: NDArray[np.bool_] = await self._call(lambda s: s.known_fingerprints(fps))
        return found

    async def discovery_scope(self) -> tuple[list[str], dict[str, int]]:
        return await self._call(lambda s: s.discovery_scope())

    async def estimator_inputs(
        self, *, meaningful: bool, links: bool, responses_since: float | None = None
    ) -> EstimatorInputs:
        return await self._call(
            lambda s: s.estimator_inputs(
                meaningful=meaningful, links=links, responses_since=responses_since
            )
        )

    async def page_ids(self, urls: NDArray[np.str_]) -> NDArray[np.int64]:
        found: NDArray[np.int64] = await self._call(lambda s: s.page_ids(urls))
        return found

    async def save_plan(self, plan: PlanUpdate, *, now: float) -> None:
        await self._call(lambda s: s.save_plan(plan, now=now))

    async def record_policy(self, policy: str, budget: float, *, now: float) -> None:
        await self._call(lambda s: s.record_policy(policy, budget, now=now))

    async def policy_in_force(self, configured: str) -> str:
        return await self._call(lambda s: s.policy_in_force(configured))

    async def switch_policy(
        self, policy: str, *, configured: str, budget: float, now: float
    ) -> None:
        await self._call(
            lambda s: s.switch_policy(policy, configured=configured, budget=budget, now=now)
        )

    async def set_paused(self, host: str, paused: bool) -> bool:
        return await self._call(lambda s: s.set_paused(host, paused))

    async def status(self, *, now: float) -> StoreStatus:
        return await self._call(lambda s: s.status(now=now))

    async def last_refreshes(self) -> list[tuple[str, float | None, float | None]]:
        return await self._call(lambda s: s.last_refreshes())

    async def host_summary(self, *, now: float, limit: int | None) -> list[HostSummary]:
        return await self._call(lambda s: s.host_summary(now=now, limit=limit))

    async def _call(self, fn: Callable[[S], T]) -> T:
        """Run ``fn(store)`` in the store thread, after every write queued before it."""
        call = _Call(fn=fn, done=trio.Event())
        await self._send.send(call)
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    async def flush(self) -> None:
        """Commit every write queued before this call (its fetches are then acknowledged)."""
        await self._call(lambda store: None)

    def close(self) -> None:
        """No more input; ``run`` commits what is queued and returns."""
        if not self._closed:
            self._closed = True
            self._send.close()

    def statistics(self) -> StoreStatistics:
        pages, hosts, fetches = self._counts
        return StoreStatistics(
            pages=pages,
            hosts=hosts,
            fetches=fetches,
            acknowledged=self._acknowledged,
            batches=self._batches,
            queued=len(self._records),
            last_batch_seconds=self._last_batch_seconds,
        )

    async def _flush(self) -> None:
        if not self._records and not self._hosts and not self._robots and not self._captures:
            return
        records, hosts, robots = self._records, self._hosts, self._robots
        captures, archive = self._captures, self.archive
        self._records, self._hosts, self._robots, self._captures = [], [], [], []
        self._capture_bytes = 0
        t0 = time.perf_counter()

        def write(store: S) -> tuple[int, tuple[int, int, int]]:
            # The batch's WARC records first, synced, then the transaction that indexes them;
            # on every CPU (mostly without the GIL: gzip, DuckDB), however the daemon's
            # threads are kept (refresher._cpus), and woken without preempting the event loop
            no_wakeup_preemption()
            with every_cpu():
                synced = archive.write_batch(captures) if archive is not None else ()
                written = store.write(records, hosts, robots, synced)
                return written, store.counts()

        # Shielded: a batch being written is finished even while the daemon shuts down.
        with trio.CancelScope(shield=True):
            written, self._counts = await self._in_store(write)
        self._last_batch_seconds = time.perf_counter() - t0
        self._acknowledged += written
        self._batches += 1
        if records:
            log.debug("batch committed", fetches=written, acknowledged=self._acknowledged)
        for cb in self.on_commit:
            cb(written)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the queue until :meth:`close`; commits what remains before returning."""
        task_status.started()
        deadline = math.inf
        ended = False
        try:
            while not ended:
                items: list[Any] = []
                with trio.move_on_at(deadline):
                    try:
                        items.append(await self._recv.receive())
                    except trio.EndOfChannel:
                        ended = True
                # Take everything already queued in one go: one item per scheduler turn falls
                # behind a hundred busy workers.
                while not ended:
                    try:
                        items.append(self._recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        ended = True
                if not items:  # the oldest queued write waited flush_interval
                    await self._flush()
                    deadline = math.inf
                    continue
                for item in items:
                    if isinstance(item, _Call):
                        await self._flush()
                        deadline = math.inf
                        await self._run_call(item)
                        continue
                    self._queue_write(item)
                    if (
                        len(self._records) >= self.batch_size
                        or self._capture_bytes >= CAPTURE_BYTES
                    ):
                        await self._flush()
                        deadline = math.inf
                    elif deadline == math.inf:
                        deadline = trio.current_time() + self.flush_interval
        finally:
            with trio.CancelScope(shield=True):
                # Drain what was queued but not yet received, then commit it all.
                while True:
                    try:
                        item = self._recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
                    if isinstance(item, _Call):
                        item.error = StoreError("the store is shutting down; try again later")
                        item.done.set()
                    else:
                        self._queue_write(item)
                await self._flush()

    async def _in_store(self, fn: Callable[[S], T]) -> T:
        """``fn(store)`` in a worker thread; a transient failure retried (see ``transient``)."""
        backoff, give_up = 0.0, math.inf
        while True:
            try:
                return await trio.to_thread.run_sync(fn, self.store)
            except Exception as e:
                if self.transient is None or not self.transient(e):
                    raise
                if self._closed:
                    give_up = min(give_up, trio.current_time() + self.retry_closing)
                if trio.current_time() >= give_up:
                    raise
                backoff = min(5.0, max(0.25, backoff * 2))
                self.retries += 1
                log.warning("store unavailable; retrying", error=str(e), retry_in=backoff)
                await trio.sleep(backoff)

    def _queue_write(
        self,
        item: tuple[FetchRecord, Capture | None, HostUpdate | None] | HostUpdate | RobotsUpdate,
    ) -> None:
        if isinstance(item, tuple):
            record, capture, host = item
            self._records.append(record)
            if capture is not None:
                self._captures.append(capture)
                self._capture_bytes += len(capture.payload or b"")
            if host is not None:
                self._hosts.append(host)
        elif isinstance(item, HostUpdate):
            self._hosts.append(item)
        else:
            self._robots.append(item)

    async def _run_call(self, call: _Call) -> None:
        def run_call(store: S) -> Any:
            result = call.fn(store)
            self._counts = store.counts()
            return result

        try:
            with trio.CancelScope(shield=True):
                call.result = await self._in_store(run_call)
        except Exception as e:
            call.error = e
        call.done.set()
