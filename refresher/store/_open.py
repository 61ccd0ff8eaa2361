"""Opening the configured store for a short-lived tool (the CLI on a stopped daemon).

The daemon builds its :class:`StoreService` itself (it also hands it to the snapshotter); every
other program asks :func:`open_store` and sees only the :class:`~refresher.store.Store`
interface, so a second implementation plugs in here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from refresher._config import Config
from refresher.store._duckdb import DuckDBStore, StoreService
from refresher.store._interface import Store
from refresher.store._service import BatchedService

__all__ = ["open_store"]


@asynccontextmanager
async def _served(service: BatchedService[Any], close: Callable[[], None]) -> AsyncIterator[Store]:
    """``service`` run until the block ends, then ``close`` (in a thread), also on error."""
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            try:
                yield service
            finally:
                service.close()
    finally:
        await trio.to_thread.run_sync(close)


@asynccontextmanager
async def open_store(config: Config) -> AsyncIterator[Store]:
    """The store that ``config`` names, served until the block ends; what the block queued is
    committed and the file closed on the way out (also on error). With ``fleet.dsn`` set, the
    fleet's PostgreSQL store, owning no partition: reads see the whole fleet, fetch state is
    not written."""
    if config.fleet.enabled:
        from refresher.store._postgres import PostgresStore

        fleet = await trio.to_thread.run_sync(lambda: PostgresStore.connect(config))
        async with _served(fleet, fleet.store.close) as served:
            yield served
        return
    c = config.store
    store = await trio.to_thread.run_sync(lambda: DuckDBStore(c.path, memory_limit=c.memory_limit))
    try:
        service = StoreService(store, flush_interval=c.flush_interval, batch_size=c.batch_size)
    except BaseException:
        store.close()
        raise
    async with _served(service, store.close) as served:
        yield served
