"""One PostgreSQL connection of a fleet component, used from worker threads one at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from refresher._errors import StoreError
from refresher.store._pg_dsn import connect, describe, redact

__all__ = ["PgSession"]

T = TypeVar("T")


class PgSession:
    """A connection of its own, a lock, and :meth:`run`: a function of a cursor in one
    transaction, psycopg's errors as :class:`StoreError` naming what was being done."""

    def __init__(self, dsn: str) -> None:
        self.where = redact(dsn)
        self._lock = threading.Lock()
        self._con: psycopg.Connection[Any] = connect(dsn)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def run(self, what: str, fn: Callable[[Any], T]) -> T:
        with self._lock:
            try:
                with self._con.transaction(), self._con.cursor() as cur:
                    return fn(cur)
            except psycopg.Error as e:
                raise StoreError(f"{what} ({self.where!r}): {describe(e)}") from e
