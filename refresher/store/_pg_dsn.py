"""The fleet's PostgreSQL connection string: checked once, never shown with its password.

``fleet.dsn`` is a libpq connection string, either a URL (``postgresql://user@host/db``) or
``key=value`` pairs (``host=/run/postgresql dbname=refresher``). :func:`dsn_problem` checks it
with libpq's own rules (through psycopg); :func:`redact` gives the form that may appear in a log
line or an error message; :func:`connect` opens a connection and translates psycopg's errors
into :class:`refresher._errors.StoreError` with the redacted form.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from refresher._errors import StoreError

__all__ = ["connect", "describe", "dsn_problem", "idle_limit", "redact"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SCHEMES = ("postgresql://", "postgres://")
#: libpq keys whose values are secrets
_SECRETS = ("password", "sslpassword")


def dsn_problem(dsn: str) -> str | None:
    """Why ``dsn`` is not a PostgreSQL connection string (with the fix), or None. The message
    never repeats the string: it may hold a password."""
    if _URL.match(dsn) and not dsn.lower().startswith(_SCHEMES):
        return (
            "is a URL but not a postgresql:// one; write postgresql://USER@HOST:PORT/DB "
            "or libpq's key=value form (host=... dbname=...)"
        )
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as e:
        reason = str(e).replace(dsn, redact(dsn)).splitlines()[0] if str(e) else "invalid"
        return (
            f"is not a PostgreSQL connection string ({_scrub(reason)}); write "
            "postgresql://USER@HOST:PORT/DB or libpq's key=value form (host=... dbname=...)"
        )
    ports = str(params.get("port") or "")
    if ports and not all(p.isdigit() and 0 < int(p) < 65536 for p in ports.split(",")):
        return f"port {ports!r} is not a TCP port; write a number from 1 to 65535"
    return None


def redact(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``: safe to log."""
    if _URL.match(dsn):
        # postgresql://user:secret@host/db?password=secret
        out = re.sub(r"(://[^/@:]*):[^@/]*@", r"\1:***@", dsn)
        return re.sub(r"([?&](?:ssl)?password=)[^&]*", r"\1***", out, flags=re.IGNORECASE)
    return _scrub(dsn)


def _scrub(text: str) -> str:
    """Any ``password=…`` left in free text (an error message) blanked."""
    text = re.sub(r"((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", text)
    return re.sub(r"(://[^/@:\s]*):[^@/\s]*@", r"\1:***@", text)


def idle_limit(lease_ttl: float) -> float:
    """Seconds a node's session may sit idle inside a transaction (twice ``lease_ttl``)
    before the server ends it: a node paused or cut off mid-transaction must not hold its
    partitions' lease rows (and keep the others from claiming them) past its leases."""
    return 2 * lease_ttl


def connect(
    dsn: str, *, idle_in_transaction: float | None = None, **kwargs: Any
) -> psycopg.Connection[Any]:
    """A connection to the fleet's database, or a :class:`StoreError` naming it redacted.
    ``idle_in_transaction`` (seconds): the server ends the session when it sits that long
    idle inside a transaction, rolling it back and releasing its locks."""
    try:
        con = psycopg.connect(dsn, **kwargs)
        if idle_in_transaction is not None:
            ms = str(max(1, round(idle_in_transaction * 1000)))
            con.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (ms,)
            )
            if not con.autocommit:
                con.commit()
        return con
    except psycopg.Error as e:
        raise StoreError(
            f"cannot connect to the fleet's PostgreSQL at {redact(dsn)!r}: "
            f"{_scrub(str(e)).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            "; is the server running and fleet.dsn right?"
        ) from e


def describe(e: BaseException) -> str:
    """One line of a psycopg error, with anything like a password blanked."""
    text = str(e).strip()
    return _scrub(text.splitlines()[0]) if text else type(e).__name__
