"""Opening the configured store for a short-lived tool (the CLI on a stopped daemon).

The daemon builds its :class:`StoreService` itself (it also hands it to the snapshotter); every
other program asks :func:`open_store` and sees only the :class:`~refresher.store.Store`
interface, so a second implementation plugs in here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from refresher._config import Config
from refresher.store._duckdb import DuckDBStore, StoreService
from refresher.store._interface import Store

__all__ = ["open_store"]


@asynccontextmanager
async def open_store(config: Config) -> AsyncIterator[Store]:
    """The store that ``config`` names, served until the block ends; what the block queued is
    committed and the file closed on the way out (also on error)."""
    c = config.store
    store = await trio.to_thread.run_sync(lambda: DuckDBStore(c.path, memory_limit=c.memory_limit))
    try:
        service = StoreService(store, flush_interval=c.flush_interval, batch_size=c.batch_size)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            try:
                yield service
            finally:
                service.close()
    finally:
        await trio.to_thread.run_sync(store.close)
