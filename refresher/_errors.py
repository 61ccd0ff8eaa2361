"""The one error tree of refresher.

Every error refresher raises on purpose derives from :class:`RefresherError`. Library errors
(httpx, duckdb, tomllib, OS errors) are translated once, at the boundary where they occur, with
``raise … from e``, so callers only ever catch these::

    RefresherError
    ├── ConfigError          bad configuration: names the key and the fix
    ├── InvalidURL           a URL that cannot be crawled (seed, link, redirect target)
    ├── StoreError           the DuckDB file cannot be opened, migrated or written
    ├── ArchiveError         a WARC file cannot be written or a record read back
    │   └── ArchiveUnreachable  a record's file is not reachable from this machine (a fleet's)
    ├── ControlError         the control endpoint cannot be reached or refused a request
    └── FetchError           one fetch failed; ``kind`` is the short name stored in history
        ├── FetchTimeout     the total deadline for the fetch passed      (kind "timeout")
        ├── DNSFailure       the host name did not resolve                (kind "dns")
        ├── ConnectFailure   no connection (refused, unreachable, TLS)    (kind "connect")
        ├── ReadFailure      the connection broke while reading           (kind "read")
        ├── ProtocolFailure  the server sent something that is not HTTP   (kind "protocol")
        ├── BodyTooLarge     the body passed ``fetch.max_body_bytes``     (kind "too_large")
        └── TooManyRedirects more hops than ``fetch.max_redirects``       (kind "redirects")

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "ArchiveError",
    "ArchiveUnreachable",
    "BodyTooLarge",
    "ConfigError",
    "ConnectFailure",
    "ControlError",
    "DNSFailure",
    "FetchError",
    "FetchTimeout",
    "InvalidURL",
    "ProtocolFailure",
    "ReadFailure",
    "RefresherError",
    "StoreError",
    "TooManyRedirects",
]


class RefresherError(Exception):
    """Base of every error refresher raises on purpose."""


class ConfigError(RefresherError):
    """The configuration is invalid. ``key`` is the dotted key at fault, if one is."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


class InvalidURL(RefresherError):
    """A URL that refresher cannot crawl. ``url`` is the offending text."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url!r}: {reason}")
        self.url = url
        self.reason = reason


class StoreError(RefresherError):
    """The DuckDB store cannot be opened, migrated or written."""


class ArchiveError(RefresherError):
    """A WARC file cannot be written, or a record in it cannot be read back."""


class ArchiveUnreachable(ArchiveError):
    """A record's WARC file is not on this machine (a fleet node keeps it elsewhere)."""


class ControlError(RefresherError):
    """The control endpoint of a running daemon failed or refused a request.

    ``kind`` says which, so callers never read the message: "unreachable" (no daemon answers,
    or the connection broke), "protocol" (the peer's answer is not a control answer),
    "bad_request" (the daemon refused a malformed request), "unknown_host", "unknown_policy",
    "fleet" (the op is for one node's embedded store, and the daemon is a node of a fleet:
    ``backup``), "internal" (the daemon failed while answering)."""

    KINDS = frozenset(
        {
            "unreachable",
            "protocol",
            "bad_request",
            "unknown_host",
            "unknown_policy",
            "fleet",
            "internal",
        }
    )

    def __init__(self, message: str, *, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.kind = kind if kind in self.KINDS else "bad_request"


class FetchError(RefresherError):
    """One fetch failed. ``kind`` is the short, stable name recorded in the history."""

    kind = "error"


class FetchTimeout(FetchError):
    kind = "timeout"


class DNSFailure(FetchError):
    kind = "dns"


class ConnectFailure(FetchError):
    kind = "connect"


class ReadFailure(FetchError):
    kind = "read"


class ProtocolFailure(FetchError):
    kind = "protocol"


class BodyTooLarge(FetchError):
    kind = "too_large"


class TooManyRedirects(FetchError):
    kind = "redirects"
