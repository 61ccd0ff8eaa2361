"""One PostgreSQL connection of a fleet component, used from worker threads one at a time."""

from __future__ import annotations

import contextlib
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
    transaction, psycopg's errors as :class:`StoreError` naming what was being done. A
    connection that broke (the server restarted, the network was cut) is replaced at the next
    :meth:`run`."""

    def __init__(self, dsn: str) -> None:
        self.where = redact(dsn)
        self._dsn = dsn
        self._lock = threading.Lock()
        self._con: psycopg.Connection[Any] = connect(dsn)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def run(self, what: str, fn: Callable[[Any], T]) -> T:
        with self._lock:
            if self._con.closed:
                self._con = connect(self._dsn)
            try:
                with self._con.transaction(), self._con.cursor() as cur:
                    return fn(cur)
            except psycopg.OperationalError as e:
                with contextlib.suppress(psycopg.Error):
                    self._con.close()  # reconnect at the next run
                raise StoreError(f"{what} ({self.where!r}): {describe(e)}") from e
            except psycopg.Error as e:
                raise StoreError(f"{what} ({self.where!r}): {describe(e)}") from e
