"""A node's history publisher as a service: repair at start, then roll the tail into Parquet
whenever it is due (:class:`refresher.store._parquet.HistoryPublisher`), and publish the tail
of any node absent longer than ``fleet.absent_after`` (one that never comes back)."""

from __future__ import annotations

import trio

from refresher._errors import StoreError
from refresher.ops._logging import get_logger
from refresher.store._parquet import HistoryPublisher, PublisherStatistics

__all__ = ["HistoryService"]

log = get_logger("fleet.history")


class HistoryService:
    """Runs ``publisher`` every ``interval`` seconds (in a worker thread); a database error
    is logged and retried at the next interval, never lost: the rows stay in the tail.
    ``absent_after`` (seconds; None: never) also publishes absent nodes' tails."""

    def __init__(
        self,
        publisher: HistoryPublisher,
        *,
        interval: float = 30.0,
        absent_after: float | None = None,
    ) -> None:
        self.publisher = publisher
        self.interval = interval
        self.absent_after = absent_after
        self.errors = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.publisher.repair)
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.pass_once()

    async def pass_once(self) -> None:
        """One pass: this node's tail when due, then the absent nodes' tails."""
        try:
            await trio.to_thread.run_sync(self.publisher.publish)
            if self.absent_after is not None:
                await trio.to_thread.run_sync(self.publisher.publish_absent, self.absent_after)
        except StoreError as e:
            self.errors += 1
            log.warning("publishing the history failed; retrying", error=str(e))

    def statistics(self) -> PublisherStatistics:
        return self.publisher.statistics()
