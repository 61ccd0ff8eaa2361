"""The crawler's HTTP side: one fetch of one page, never raising for what the network does.

Each host gets at most one kept-alive HTTP/1.1 connection (:mod:`refresher.crawl._http1`):
politeness already allows at most one request in flight per host, so there is no pool to
scan, and a request is written from bytes computed once (the fixed header fields when the
fetcher is configured, the request line and ``Host`` once per URL). The response is parsed by
httptools (llhttp). Connections live in an LRU bounded by ``max_open_hosts``; an evicted
host's connection is closed. A kept connection the server has closed meanwhile is replaced,
and a request it fails before any answer is sent once more on a new one (a GET is idempotent).

Names are resolved by :class:`~refresher.crawl._dns.Resolver` (cache, static overrides). The
request goes to the resolved IP and port with the original ``Host`` header, and for https the
original name as TLS SNI and certificate name.

Bodies are decoded here, so that the size cap counts *decoded* bytes and a decompression bomb
stops at the cap without ever inflating more than the cap (zlib's ``max_length``). Everything
a hostile server can do (stall, reset, garbage headers, endless bodies, redirect loops) ends
as a :class:`FetchResult` with an ``error_kind``. httpx serves for what is rare: joining a
redirect's ``Location``, encoding a URL that is not plain ASCII, and the CA bundle (certifi).
"""

from __future__ import annotations

import builtins
import email.utils
import hashlib
import ssl
import string
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import brotli
import httpx
import trio

from refresher._config import FetchConfig
from refresher._errors import (
    BodyTooLarge,
    ConfigError,
    FetchError,
    FetchTimeout,
    InvalidURL,
    ProtocolFailure,
    ReadFailure,
    TooManyRedirects,
)
from refresher.crawl import _http1
from refresher.crawl._dns import Resolver
from refresher.store._interface import is_success

__all__ = [
    "ACCEPT_ENCODING",
    "LEGACY_DIGEST_BYTES",
    "ROBOTS_MAX_BYTES",
    "ROBOTS_MAX_REDIRECTS",
    "FetchResult",
    "Fetcher",
    "FetcherStatistics",
    "body_digest",
    "comparable_digest",
    "parse_retry_after",
]

#: Only what :class:`_Decoder` can decode is advertised (no zstd: not installed).
ACCEPT_ENCODING = "gzip, deflate, br"
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"
#: RFC 9309 §2.5: crawlers parse at least 500 KiB; more is ignored, not an error.
ROBOTS_MAX_BYTES = 500 * 1024
#: RFC 9309 §2.3.1.2: follow at least five consecutive redirects.
ROBOTS_MAX_REDIRECTS = 5

_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_PARSEABLE_TYPES = frozenset(
    {
        "text/html",
        "application/xhtml+xml",
        # sitemaps, plain or gzip-compressed (servers label .xml.gz files variously)
        "application/xml",
        "text/xml",
        "application/gzip",
        "application/x-gzip",
    }
)
# Bodies of non-2xx answers are only read so the connection can be reused; past this many
# bytes it is cheaper to drop the connection than to drain the body.
_DRAIN_BYTES = 64 * 1024
# Closing a response only closes a socket; bounded so a shielded close cannot hang a worker.
_CLOSE_GRACE = 5.0


#: bytes of a digest an older refresher stored: BLAKE2b-128 (now the payload's SHA-1, 20)
LEGACY_DIGEST_BYTES = 16


def body_digest(body: bytes) -> bytes:
    """The 20-byte SHA-1 of a body: the change test compares these, and the archive's
    WARC-Payload-Digest of the body is the same SHA-1 (one hash of each body, not two)."""
    return hashlib.sha1(body).digest()


def comparable_digest(stored: bytes | None, r: FetchResult) -> bytes | None:
    """A page's stored digest in the kind ``r.digest`` is: the payload's SHA-1.

    An older refresher stored BLAKE2b-128 (:data:`LEGACY_DIGEST_BYTES`): where ``r``'s payload
    hashes to that, the copy did not change and ``r.digest`` stands for it; otherwise it is
    returned as it is (and differs). So an upgrade makes no page look changed once (but for a
    2xx body of a Content-Encoding the fetch cannot decode, which is not kept: it does once).
    """
    if stored is None or len(stored) != LEGACY_DIGEST_BYTES:
        return stored
    if r.payload is None or r.truncated or r.digest is None:
        return stored
    legacy = hashlib.blake2b(r.payload, digest_size=LEGACY_DIGEST_BYTES).digest()
    return r.digest if legacy == stored else stored


def parse_retry_after(value: str, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP-date), or None.

    ``now`` is the unix wall-clock time the date is measured from (default: the current time).
    A date in the past gives 0.
    """
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResult:
    """What one fetch of one URL produced. ``error_kind`` is None whenever the fetch ended
    with an HTTP response (of any status); ``status`` is the last status seen, if any."""

    url: str
    final_url: str  # the last URL requested (after followed redirects)
    status: int | None
    started_at: float  # unix wall-clock seconds
    finished_at: float  # unix wall-clock seconds
    duration: float  # seconds on trio's monotonic clock; politeness scales its delay by it
    bytes: int  # decoded body bytes read from the last response
    digest: builtins.bytes | None  # body_digest of the body, only for a complete 2xx body
    body: builtins.bytes | None  # the body of a 2xx text/html-ish answer, for the parser; else None
    content_type: str | None
    etag: str | None  # validators to send with the next conditional GET of this URL
    last_modified: str | None
    not_modified: bool  # a 304 in answer to our conditional GET
    redirects: tuple[str, ...] = ()  # every hop followed, in order
    location: str | None = None  # a redirect target not followed (another host, too many)
    retry_after: float | None = None  # seconds, from Retry-After on 429/503
    error_kind: str | None = None  # FetchError.kind
    error: str | None = None  # the FetchError message
    #: the X-Robots-Tag header (several joined with ", "), passed to the processors
    robots_tag: str | None = None
    # -- for the archive (refresher.archive): the last response as received ----------------
    #: the last response's header fields, in order, decoded as latin-1
    headers: tuple[tuple[str, str], ...] = ()
    http_version: str | None = None  # "HTTP/1.1" of the last response, if any
    reason: str | None = None  # its reason phrase
    #: the decoded body of a 2xx answer of any media type (at most fetch.max_body_bytes): what
    #: the archive keeps; ``body`` is the same bytes when the parser wants them
    payload: builtins.bytes | None = None
    truncated: bool = False  # payload stops at the size cap (the body went on)

    @property
    def ok(self) -> bool:
        """A successful fetch, one that refreshes the copy (:func:`refresher.store.is_success`)."""
        return is_success(self.status, not_modified=self.not_modified, error_kind=self.error_kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetcherStatistics:
    """A snapshot of the fetcher's counters since it was created."""

    fetches: int  # fetch() calls finished
    robots_fetches: int  # fetch_robots() calls finished
    requests: int  # HTTP requests sent (every redirect hop and robots request counts)
    outcomes: Mapping[str, int]  # fetch() results: "ok", "not_modified", "redirect",
    # "client_error", "server_error", "other", or an error kind ("timeout", "dns", …)
    bytes: int  # decoded body bytes read over all requests
    open_hosts: int  # per-host transports kept (each holds at most one idle connection)
    evictions: int  # hosts whose transport was closed to stay within max_open_hosts


class _Decoder:
    """Decodes a Content-Encoding chain, producing no more than the caller's limit + 1 bytes
    per call however well the input compresses."""

    def __init__(self, encodings: list[str]) -> None:
        # Encodings are listed in the order they were applied; undo them in reverse.
        self._stages = [
            _BrotliStage() if name == "br" else _ZlibStage(name == "gzip")
            for name in reversed(encodings)
        ]

    def feed(self, data: bytes, limit: int) -> bytes:
        for stage in self._stages:
            data = stage.feed(data, limit)
        return data

    def flush(self, limit: int) -> bytes:
        data = b""
        for stage in self._stages:
            data = stage.feed(data, limit) + stage.flush()
        return data


class _BrotliStage:
    """Brotli (RFC 7932), its output bounded per call by the decompressor's own limit; a corrupt
    stream raises ``zlib.error``, as the other stages do."""

    def __init__(self) -> None:
        self._obj = brotli.Decompressor()

    def feed(self, data: bytes, limit: int) -> bytes:
        if not data or self._obj.is_finished():
            return b""  # trailing bytes after the stream are ignored, as for gzip
        try:
            # the output stops growing once it reaches the limit (it may pass it by a block);
            # past the limit the caller stops, so the rest is never asked for
            out: bytes = self._obj.process(data, output_buffer_limit=limit + 1)
        except brotli.error as e:
            raise zlib.error(f"brotli: {e}") from e
        return out[: limit + 1]

    def flush(self) -> bytes:
        return b""


class _ZlibStage:
    def __init__(self, gzip: bool) -> None:
        self._gzip = gzip
        self._wbits = zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS
        self._obj = zlib.decompressobj(self._wbits)
        self._started = False
        self._between = False  # a gzip member ended; another may follow
        self._done = False

    def feed(self, data: bytes, limit: int) -> bytes:
        out: list[bytes] = []
        produced = 0
        while data and produced <= limit and not self._done:
            if self._between:
                if not data.startswith(b"\x1f"):
                    self._done = True  # trailing bytes after the stream are ignored
                    break
                self._obj = zlib.decompressobj(self._wbits)  # the next gzip member
                self._between = False
            try:
                chunk = self._obj.decompress(data, limit + 1 - produced)
            except zlib.error:
                if self._gzip or self._started:
                    raise
                # "deflate" is meant to be zlib-wrapped, but many servers send raw deflate.
                self._wbits = -zlib.MAX_WBITS
                self._obj = zlib.decompressobj(self._wbits)
                self._started = True
                continue
            self._started = True
            out.append(chunk)
            produced += len(chunk)
            if self._obj.eof:
                data = self._obj.unused_data
                self._between = self._gzip
                self._done = not self._gzip
            else:
                # Non-empty only when max_length cut the output, i.e. the limit is passed.
                data = self._obj.unconsumed_tail
        return b"".join(out)

    def flush(self) -> bytes:
        return b"" if self._done or self._between else self._obj.flush()


Headers = list[tuple[bytes, bytes]]


def _content_encodings(headers: Headers) -> list[str] | None:
    """The Content-Encoding chain, or None if it has an encoding this module cannot decode."""
    names: list[str] = []
    for field_value in _http1.field_values(headers, b"content-encoding"):
        for value in field_value.split(b","):
            name = value.strip().lower()
            if name in (b"", b"identity"):
                continue
            if name in (b"gzip", b"x-gzip"):
                names.append("gzip")
            elif name == b"deflate":
                names.append("deflate")
            elif name == b"br":
                names.append("br")
            else:
                return None
    return names


def _raw_header(headers: Headers, name: bytes) -> str | None:
    # Latin-1 round-trips any bytes, so a validator is sent back exactly as it came.
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _joined_header(headers: Headers, name: bytes) -> str | None:
    """Every value of a header field, joined with ", " (as httpx's ``Headers.get``)."""
    values = _http1.field_values(headers, name)
    if not values:
        return None
    return (values[0] if len(values) == 1 else b", ".join(values)).decode("latin-1")


def _header_bytes(value: str | None) -> bytes | None:
    if value is None or "\r" in value or "\n" in value:
        return None
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return None


@dataclass(frozen=True, slots=True)
class _Target:
    """A URL taken apart once: what a request to it needs."""

    url: str  # without its fragment
    scheme: str
    host: str  # lower case; an IPv6 address without brackets
    port: int
    key: str  # the politeness unit: host, or host:port for a non-default port
    netloc: bytes  # the Host header
    path: bytes  # the request target: path and query


# What may stand in a URL as it is sent (RFC 3986's characters, "%" included); anything else
# (non-ASCII, spaces, quotes) is encoded by httpx first.
_PLAIN = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")


def _parse_url(url: str) -> _Target:
    if not _PLAIN.issuperset(url):
        try:
            url = str(httpx.URL(url))
        except (httpx.InvalidURL, UnicodeError, ValueError) as e:
            raise InvalidURL(url, f"cannot be parsed ({e}); give an absolute http(s) URL") from e
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as e:
        raise InvalidURL(url, f"cannot be parsed ({e}); give an absolute http(s) URL") from e
    scheme = parts.scheme
    default = _DEFAULT_PORTS.get(scheme)
    if default is None or not host:
        raise InvalidURL(url, "only absolute http:// and https:// URLs with a host are fetched")
    name = f"[{host}]" if ":" in host else host
    netloc = name if port is None or port == default else f"{name}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return _Target(
        url=url.partition("#")[0],
        scheme=scheme,
        host=host,
        port=default if port is None else port,
        key=host if port is None or port == default else f"{host}:{port}",
        netloc=netloc.encode("ascii"),
        path=path.encode("ascii"),
    )


def _redirect_target(current: _Target, location: str) -> _Target | None:
    try:
        joined = httpx.URL(current.url).join(location.strip()).copy_with(fragment=None)
        if joined.scheme not in _DEFAULT_PORTS or not joined.raw_host:
            return None
        return _parse_url(str(joined))
    except (httpx.InvalidURL, InvalidURL, UnicodeError, ValueError):
        return None


@dataclass(slots=True)
class _Slot:
    """A host's kept connection (None while there is none)."""

    conn: _http1.Connection | None = None
    busy: bool = False  # a request is on the connection
    users: int = 0


@dataclass(slots=True)
class _Progress:
    """What a fetch has seen so far, so a failure half-way still records it."""

    final_url: str
    status: int | None = None
    headers: Headers | None = None
    bytes: int = 0
    redirects: list[str] = field(default_factory=list)
    location: str | None = None
    http_version: str | None = None
    reason: str | None = None
    partial: builtins.bytes | None = None  # a 2xx body cut at the cap, for the archive


@dataclass(slots=True, kw_only=True)
class _Reply:
    status: int
    headers: Headers
    size: int
    digest: bytes | None
    body: bytes | None
    payload: bytes | None = None


def _check_settings(
    *, user_agent: str, timeout: float, max_body_bytes: int, max_redirects: int, max_open_hosts: int
) -> None:
    """ConfigError for an impossible setting, naming the config key it comes from (the daemon
    derives ``max_open_hosts`` from ``crawl.workers``, so that one is named as an argument)."""
    if not user_agent.strip() or "\r" in user_agent or "\n" in user_agent:
        raise ConfigError(
            "must be a non-empty single line naming the crawler and a contact URL",
            key="crawl.user_agent",
        )
    if not timeout > 0:
        raise ConfigError(
            f"must be a positive number of seconds, got {timeout}", key="fetch.timeout"
        )
    for key, number, least in (
        ("fetch.max_body_bytes", max_body_bytes, 1),
        ("fetch.max_redirects", max_redirects, 0),
    ):
        if number < least:
            raise ConfigError(f"must be at least {least}, got {number}", key=key)
    if max_open_hosts < 1:
        raise ConfigError(
            f"Fetcher(max_open_hosts={max_open_hosts}): keep at least 1 host's connection open"
        )


class Fetcher:
    """Fetches pages and robots.txt files over per-host keep-alive connections.

    ``timeout`` (seconds) is the total deadline of one fetch: DNS, connect, TLS, headers, body
    and every redirect hop. ``max_body_bytes`` caps the decoded body. ``max_redirects``
    same-host hops are followed. At most ``max_open_hosts`` hosts keep a connection open.
    ``keepalive_expiry`` (seconds) is how long an idle connection is kept. ``verify`` is
    True (system trust via certifi), False, or an :class:`ssl.SSLContext`.
    """

    def __init__(
        self,
        *,
        user_agent: str,
        resolver: Resolver,
        timeout: float = 30.0,
        max_body_bytes: int = 10_485_760,
        max_redirects: int = 5,
        max_open_hosts: int = 256,
        verify: bool | ssl.SSLContext = True,
        keepalive_expiry: float = 60.0,
    ) -> None:
        _check_settings(
            user_agent=user_agent,
            timeout=timeout,
            max_body_bytes=max_body_bytes,
            max_redirects=max_redirects,
            max_open_hosts=max_open_hosts,
        )
        self._user_agent = user_agent.encode("latin-1", errors="replace")
        self._resolver = resolver
        self._timeout = timeout
        self._max_body = max_body_bytes
        self._max_redirects = max_redirects
        self._max_open_hosts = max_open_hosts
        self._verify = verify
        self._ssl_context: ssl.SSLContext | None = (
            verify if isinstance(verify, ssl.SSLContext) else None
        )
        self._keepalive_expiry = keepalive_expiry
        # how a connection is opened; fuzz/fuzz.py puts in-memory connections here
        self._connect = _http1.connect
        self._fields = self._fixed_fields()
        self._slots: OrderedDict[tuple[str, str, int], _Slot] = OrderedDict()
        self._closed = False
        self._fetches = 0
        self._robots_fetches = 0
        self._requests = 0
        self._bytes = 0
        self._evictions = 0
        self._outcomes: dict[str, int] = {}

    def configure(self, fetch: FetchConfig, *, user_agent: str) -> None:
        """Take new ``[fetch]`` settings and ``crawl.user_agent`` (SIGHUP): every fetch that
        starts from now on uses them. Raises :class:`ConfigError` and changes nothing when one
        is impossible."""
        _check_settings(
            user_agent=user_agent,
            timeout=fetch.timeout,
            max_body_bytes=fetch.max_body_bytes,
            max_redirects=fetch.max_redirects,
            max_open_hosts=self._max_open_hosts,
        )
        self._user_agent = user_agent.encode("latin-1", errors="replace")
        self._fields = self._fixed_fields()
        self._timeout = fetch.timeout
        self._max_body = fetch.max_body_bytes
        self._max_redirects = fetch.max_redirects

    def _fixed_fields(self) -> bytes:
        """The header fields every request carries after ``Host``, as sent."""
        return b"".join(
            (
                b"User-Agent: ",
                self._user_agent,
                b"\r\nAccept: ",
                ACCEPT.encode(),
                b"\r\nAccept-Encoding: ",
                ACCEPT_ENCODING.encode(),
                b"\r\n",
            )
        )

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every open connection. Fetching afterwards opens new ones."""
        slots = list(self._slots.values())
        self._slots.clear()
        for slot in slots:
            if slot.conn is not None:
                await slot.conn.aclose()

    def statistics(self) -> FetcherStatistics:
        """A snapshot of the counters."""
        return FetcherStatistics(
            fetches=self._fetches,
            robots_fetches=self._robots_fetches,
            requests=self._requests,
            outcomes=dict(self._outcomes),
            bytes=self._bytes,
            open_hosts=len(self._slots),
            evictions=self._evictions,
        )

    # -- connections --------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext:
        # Built once and shared: loading the CA bundle per host would cost milliseconds each.
        if self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context(verify=self._verify is not False)
        return self._ssl_context

    def _slot(self, key: tuple[str, str, int]) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        else:
            self._slots.move_to_end(key)
        return slot

    async def _evict(self) -> None:
        # Hosts in use are skipped (closing would break their request); the cap may be passed
        # for a moment and is restored when they finish.
        excess = len(self._slots) - self._max_open_hosts
        if excess <= 0:
            return
        victims = [key for key, slot in self._slots.items() if slot.users == 0][:excess]
        closing = [self._slots.pop(key).conn for key in victims]
        self._evictions += len(closing)
        for conn in closing:
            if conn is not None:
                await conn.aclose()

    async def _connection(
        self, slot: _Slot, target: _Target, address: tuple[str, int]
    ) -> _http1.Connection:
        """The slot's kept connection if it can still carry a request, else a new one."""
        conn = slot.conn
        if conn is not None:
            if (
                conn.address == address
                and trio.current_time() - conn.idle_since <= self._keepalive_expiry
                and not conn.looks_closed()
            ):
                return conn
            slot.conn = None
            await conn.aclose()
        conn = slot.conn = await self._open(target, address)
        return conn

    async def _open(self, target: _Target, address: tuple[str, int]) -> _http1.Connection:
        """A new connection to ``address`` for ``target`` (TLS for https, with its host name)."""
        https = target.scheme == "https"
        return await self._connect(
            *address,
            server_hostname=target.host if https else None,
            context=self._context() if https else None,
        )

    # -- one request ---------------------------------------------------------------------------

    async def _exchange(
        self,
        target: _Target,
        progress: _Progress,
        *,
        extra_fields: bytes,
        limit: int,
        truncate: bool,
    ) -> _Reply:
        """Send one GET and read its body (at most ``limit`` decoded bytes for a 2xx).

        Over the limit: BodyTooLarge, or with ``truncate`` the body is cut at the limit.
        """
        address = await self._resolver.resolve(target.host, target.port)
        head = b"".join(
            (
                b"GET ",
                target.path,
                b" HTTP/1.1\r\nHost: ",
                target.netloc,
                b"\r\n",
                self._fields,
                extra_fields,
                b"\r\n",
            )
        )
        progress.final_url = target.url
        progress.status = None
        progress.headers = None
        progress.bytes = 0
        progress.partial = None
        slot = self._slot((target.scheme, target.host, target.port))
        slot.users += 1
        own = not slot.busy  # else: a second request to a busy host gets a connection of its own
        slot.busy = slot.busy or own
        conn: _http1.Connection | None = None
        response: _http1.Response | None = None
        try:
            for attempt in (1, 2):
                if own:
                    conn = await self._connection(slot, target, address)
                else:
                    conn = await self._open(target, address)
                try:
                    response = await conn.exchange(head)
                except _http1.Stale:
                    # the server closed the kept connection while it was idle: once more anew
                    if own:
                        slot.conn = None
                    await conn.aclose()
                    conn = None
                    if attempt == 2:
                        raise ReadFailure("the server closed the connection twice") from None
                    continue
                finally:
                    self._requests += conn is not None
                break
            assert response is not None and conn is not None
            progress.status = response.status
            progress.headers = response.headers
            progress.http_version = response.http_version
            progress.reason = response.reason.decode("latin-1")
            reply, complete = await self._read_body(response, progress, limit, truncate)
            if complete and response.reusable and own:
                conn.idle_since = trio.current_time()
                conn = None  # kept
            return reply
        except FetchError as e:
            where = f"GET {target.url}" + (
                f" ({address[0]}:{address[1]})" if address[0] != target.host else ""
            )
            raise type(e)(f"{where}: {e}") from e
        finally:
            if response is not None:
                response.close()
            slot.busy = slot.busy and not own
            slot.users -= 1
            if conn is not None:  # broken, cancelled, or not to be reused
                if own and slot.conn is conn:
                    slot.conn = None
                await conn.aclose()
            await self._evict()

    async def _read_body(
        self,
        response: _http1.Response,
        progress: _Progress,
        limit: int,
        truncate: bool,
    ) -> tuple[_Reply, bool]:
        """Read, decode and hash the body; and whether it was read to its end.

        ``truncate`` (robots.txt): stop quietly at ``limit`` and keep whatever the body is;
        otherwise passing ``limit`` raises BodyTooLarge and only a text/html-ish body is kept
        (for the parser)."""
        status = response.status
        headers = response.headers
        success = 200 <= status < 300
        if not success:
            # Read only to reuse the connection; a big error page just closes it.
            limit, truncate = min(limit, _DRAIN_BYTES), True
        encodings = _content_encodings(headers)
        media = (_joined_header(headers, b"content-type") or "").split(";")[0].strip().lower()
        # Every 2xx body is kept for the archive; the parser gets the text/html-ish ones.
        keep = success and encodings is not None
        parseable = truncate or media in _PARSEABLE_TYPES or not media
        declared = _joined_header(headers, b"content-length") or ""
        if not truncate and not encodings and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(
                f"Content-Length {declared} is over the {limit}-byte cap "
                "(fetch.max_body_bytes); raise the cap to fetch this page"
            )
        decoder = _Decoder(encodings) if encodings else None
        hasher = hashlib.sha1()  # body_digest, as the body arrives
        parts: list[bytes] = []
        raw_count = count = 0
        complete = True

        def too_large(what: str) -> BodyTooLarge:
            return BodyTooLarge(
                f"the {what} is over the {limit}-byte cap (fetch.max_body_bytes); "
                "raise the cap to fetch this page"
            )

        def take(data: bytes) -> None:
            nonlocal count
            if len(data) > limit - count:
                if not truncate:
                    if keep:  # archived truncated, marked WARC-Truncated: length
                        progress.partial = b"".join([*parts, data[: limit - count]])
                    raise too_large("body")
                data = data[: limit - count]
            count += len(data)
            progress.bytes = count
            self._bytes += len(data)
            if keep:
                parts.append(data)  # hashed once joined: one pass, one release of the GIL
            elif success:
                hasher.update(data)

        try:
            while pieces := await response.read():
                for raw in pieces:
                    raw_count += len(raw)
                    take(decoder.feed(raw, limit - count) if decoder else raw)
                # The encoded stream is capped too: a compressed stream that inflates to
                # nothing must not be read forever.
                if raw_count > limit and not truncate:
                    raise too_large("encoded body")
                if truncate and (count >= limit or raw_count > limit):
                    complete = False
                    break
            else:
                if decoder:
                    take(decoder.flush(limit - count))
        except zlib.error as e:
            raise ProtocolFailure(f"the body could not be decoded ({e})") from e
        payload = b"".join(parts) if keep and (complete or truncate) else None
        if payload is not None:
            hasher.update(payload)
        reply = _Reply(
            status=status,
            headers=headers,
            size=count,
            digest=hasher.digest() if success and complete else None,
            body=payload if parseable else None,
            payload=payload,
        )
        return reply, complete

    # -- fetches -------------------------------------------------------------------------------

    async def fetch(
        self, url: str, *, etag: str | None = None, last_modified: str | None = None
    ) -> FetchResult:
        """Fetch ``url`` once (conditional GET with the given validators).

        Never raises :class:`FetchError`: failures are results with ``error_kind``. Raises
        :class:`InvalidURL` for a URL that is not absolute http(s). Cancellation propagates.
        """
        start = _parse_url(url)
        started_at = time.time()
        t0 = trio.current_time()
        progress = _Progress(final_url=start.url)
        conditional = b""
        if (value := _header_bytes(etag)) is not None:
            conditional += b"If-None-Match: " + value + b"\r\n"
        if (value := _header_bytes(last_modified)) is not None:
            conditional += b"If-Modified-Since: " + value + b"\r\n"
        reply: _Reply | None = None
        failure: FetchError | None = None
        with trio.move_on_after(self._timeout) as deadline:
            try:
                reply = await self._follow(start, progress, conditional)
            except FetchError as e:
                failure = e
        if deadline.cancelled_caught:
            failure = FetchTimeout(
                f"GET {progress.final_url}: no complete answer within the {self._timeout} s "
                "deadline (fetch.timeout); the host is slow or stalled, it is retried later"
            )
        finished_at = time.time()
        duration = trio.current_time() - t0
        headers = reply.headers if reply is not None else progress.headers
        status = reply.status if reply is not None else progress.status
        not_modified = status == 304 and bool(conditional) and failure is None
        result_etag = _raw_header(headers, b"etag") if headers is not None else None
        result_modified = _raw_header(headers, b"last-modified") if headers is not None else None
        if not_modified:
            # A 304 need not repeat the validators; keep the ones that earned it.
            result_etag = result_etag or etag
            result_modified = result_modified or last_modified
        retry_after = None
        if headers is not None and status in (429, 503):
            value_text = _joined_header(headers, b"retry-after")
            if value_text is not None:
                retry_after = parse_retry_after(value_text, now=finished_at)
        result = FetchResult(
            url=url,
            final_url=progress.final_url,
            status=status,
            started_at=started_at,
            finished_at=finished_at,
            duration=duration,
            bytes=progress.bytes if reply is None else reply.size,
            digest=reply.digest if reply is not None else None,
            body=reply.body if reply is not None else None,
            content_type=_joined_header(headers, b"content-type") if headers else None,
            robots_tag=_joined_header(headers, b"x-robots-tag") if headers else None,
            etag=result_etag,
            last_modified=result_modified,
            not_modified=not_modified,
            redirects=tuple(progress.redirects),
            location=progress.location,
            retry_after=retry_after,
            error_kind=failure.kind if failure is not None else None,
            error=str(failure) if failure is not None else None,
            **_as_received(reply, progress, headers),
        )
        self._fetches += 1
        outcome = result.error_kind or _outcome(result)
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
        return result

    async def _follow(self, start: _Target, progress: _Progress, conditional: bytes) -> _Reply:
        current = start
        while True:
            reply = await self._exchange(
                current, progress, extra_fields=conditional, limit=self._max_body, truncate=False
            )
            location = _raw_header(reply.headers, b"location")
            if reply.status not in _REDIRECT_STATUSES or location is None:
                return reply
            target = _redirect_target(current, location)
            progress.location = target.url if target is not None else location
            # Politeness is per host: another host's page waits for that host's turn.
            if target is None or target.key != start.key:
                return reply
            if len(progress.redirects) >= self._max_redirects:
                raise TooManyRedirects(
                    f"GET {start.url}: more than {self._max_redirects} redirects "
                    f"(fetch.max_redirects), the last to {target.url}; the site may loop"
                )
            progress.redirects.append(target.url)
            progress.location = None
            current = target

    async def fetch_robots(
        self, scheme: str, host: str, port: int | None
    ) -> tuple[int | None, bytes]:
        """GET ``scheme://host[:port]/robots.txt``; returns ``(status, body)``.

        Follows up to 5 redirects to any host (RFC 9309) and reads at most 500 KiB of body
        (the rest is ignored). ``status`` is None when the file could not be fetched: no
        answer, the deadline passed, or too many redirects; the body is then empty.
        """
        status, body, _error = await self.fetch_robots_or_error(scheme, host, port)
        return status, body

    async def fetch_robots_or_error(
        self, scheme: str, host: str, port: int | None
    ) -> tuple[int | None, bytes, FetchError | None]:
        """:meth:`fetch_robots`, and the error that left ``status`` None, if one did."""
        netloc = f"[{host}]" if ":" in host else host
        if port is not None and port != _DEFAULT_PORTS.get(scheme):
            netloc = f"{netloc}:{port}"
        url = _parse_url(f"{scheme}://{netloc}/robots.txt")
        progress = _Progress(final_url=url.url)
        answer: tuple[int | None, bytes] = (None, b"")
        error: FetchError | None = None
        with trio.move_on_after(self._timeout) as deadline:
            try:
                for _hop in range(ROBOTS_MAX_REDIRECTS + 1):
                    reply = await self._exchange(
                        url, progress, extra_fields=b"", limit=ROBOTS_MAX_BYTES, truncate=True
                    )
                    location = _raw_header(reply.headers, b"location")
                    target = None if location is None else _redirect_target(url, location)
                    if reply.status not in _REDIRECT_STATUSES or target is None:
                        answer = (reply.status, reply.body or b"")
                        break
                    url = target
            except FetchError as e:
                error = e
        if deadline.cancelled_caught and error is None:
            error = FetchTimeout(f"robots.txt of {host}: no answer within {self._timeout} s")
        self._robots_fetches += 1
        return answer[0], answer[1], error


def _as_received(
    reply: _Reply | None, progress: _Progress, headers: Headers | None
) -> dict[str, Any]:
    """The FetchResult fields the archive needs: the last response as received."""
    raw = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers) if headers else ()
    payload = reply.payload if reply is not None else progress.partial
    return {
        "headers": raw,
        "http_version": progress.http_version,
        "reason": progress.reason,
        "payload": payload,
        "truncated": reply is None and progress.partial is not None,
    }


def _outcome(result: FetchResult) -> str:
    status = result.status or 0
    if result.not_modified:
        return "not_modified"
    if 200 <= status < 300:
        return "ok"
    if 300 <= status < 400:
        return "redirect"
    if 400 <= status < 500:
        return "client_error"
    if 500 <= status < 600:
        return "server_error"
    return "other"
