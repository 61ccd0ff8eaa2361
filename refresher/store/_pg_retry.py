"""Which failures of the fleet's database pass: the server restarting or out of reach.

A :class:`refresher._errors.StoreError` raised from psycopg's ``OperationalError`` (a lost
connection, a refused connect, a cancelled statement) is retried by the store's queue
(:attr:`refresher.store._service.BatchedService.transient`); any other error (a constraint, a
bug) still ends the operation at once.
"""

from __future__ import annotations

import psycopg

__all__ = ["unavailable"]


def unavailable(error: BaseException) -> bool:
    """``error`` (or what it was raised from) says the database could not be reached."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, psycopg.OperationalError):
            return True
        seen.add(id(e))
        e = e.__cause__
    return False
