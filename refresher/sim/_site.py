"""A fast local HTTP/1.1 site server with virtual hosts, for tests, the demo and the benchmark.

One loopback port serves many virtual hosts, routed by the ``Host`` header (``h17.sim.test``);
the crawler reaches them through static DNS overrides that pin every name to 127.0.0.1:PORT.
The server is written on trio + h11 because the stdlib ``http.server`` speaks HTTP/1.0 at a
few hundred requests per second, and the benchmark needs the crawler, not the server, to be
the bottleneck at 1,000 fetches per second. Connections are kept alive (the crawler keeps one
per host) and pipelined requests are answered in order. For speed, a plain GET/HEAD head is
parsed by a strict fast path (a subset of what h11 accepts, checked against h11 by the
tests); h11 parses everything else, request bodies included, and rejects what is malformed.
Responses come in a few fixed shapes and are written directly. About 150 µs of CPU per
request in all, some 6,000 requests per second on one core (bench/bench_site.py).

Every page changes as a Poisson process with its own true rate (changes per second). Change
times are drawn lazily from a generator seeded by (site seed, host, path), in a fixed chunk
schedule, so the same seed gives the same change times whatever order they are asked in. The
page body is a pure function of (host, path, version), where the version is the number of
changes up to the moment of the request: that is the ground truth a simulation compares the
crawler's copy against.

Special paths on any host simulate hostile servers for the fetcher's tests; see
:data:`HOSTILE_PATHS`. Every request lands in :class:`RequestLog`, timed on trio's clock from
its first byte to its last response byte, so tests can check politeness at the server.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import itertools
import math
import random
import re
import socket
import struct
import sys
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from functools import partial
from http import HTTPStatus
from typing import Literal
from urllib.parse import parse_qs, urlencode, urlsplit

import h11
import numpy as np
import structlog
import trio

from refresher._errors import ConfigError

__all__ = [
    "HOSTILE_PATHS",
    "SITEMAP_LASTMODS",
    "HostSpec",
    "PageSpec",
    "RequestLog",
    "RequestRecord",
    "Site",
    "SiteStatistics",
    "main",
    "make_demo_site",
    "serve_site",
]
#: What a host's sitemap writes as each entry's ``<lastmod>`` (:attr:`HostSpec.sitemap_lastmod`)
SitemapLastmod = Literal["honest", "date", "build", "now"]
SITEMAP_LASTMODS: tuple[SitemapLastmod, ...] = ("honest", "date", "build", "now")

#: The hostile paths every virtual host (and an unknown host) answers, and what each does.
HOSTILE_PATHS: dict[str, str] = {
    "/hostile/stall": "reads the request and never answers (closes when the client does)",
    "/hostile/slow-body": "headers, then a chunked body of one byte every ?interval= seconds "
    "(default 0.2), forever",
    "/hostile/reset": "part of a status line and headers, then an RST (SO_LINGER 0)",
    "/hostile/garbage": "non-HTTP bytes, then a close",
    "/hostile/endless": "a chunked body that never ends, as fast as the client reads",
    "/hostile/huge": "a body of ?bytes=N bytes (default 10 MiB) with its Content-Length",
    "/hostile/redirect-loop": "301 to itself",
    "/hostile/redirect": "?to=URL&hops=N: N redirects in all (default 1), the last to URL; "
    "?status= picks 301 (default), 302, 303, 307 or 308",
    "/hostile/status": "?code=N (default 500) with ?retry_after=S as Retry-After if given",
    "/hostile/gzip-bomb": "a gzip body of ~1/1000 the size that inflates to ?bytes=N "
    "(default 1 GiB) zero bytes",
}

_RECEIVE_BYTES = 65536
_SEND_CHUNK = 65536
_HUGE_DEFAULT = 10 * 1024 * 1024
_BOMB_DEFAULT = 1024 * 1024 * 1024
_BOMB_BLOCK = 1024 * 1024
_SLOW_BODY_INTERVAL = 0.2  # seconds between bytes of /hostile/slow-body
_DAY = 86400.0
# Chunk sizes for drawing change times: fixed, so the draws never depend on query order.
_FIRST_CHUNK = 16
_MAX_CHUNK = 4096

_WORD_TEXT = (
    "crawler fresh page change rate poisson budget refresh host queue politeness delay "
    "frontier robots agent index link anchor digest content version server client fetch "
    "archive mirror snapshot estimate sample interval optimal uniform proportional freshness "
    "age weight schedule network latency bandwidth cache entry history store record event "
    "signal measure model theory paper result figure table section method data value "
    "north south east west river mountain valley forest ocean island city village market "
    "bridge garden harbor tower station library museum theatre school office factory farm "
    "morning evening winter summer spring autumn weather cloud storm rain snow wind sun moon"
)
_WORDS = _WORD_TEXT.split()


# ----------------------------------------------------------------------------- value objects


@dataclass(frozen=True, slots=True, kw_only=True)
class PageSpec:
    """One page of a virtual host.

    ``path`` is the request target that serves it ("/", "/p3", "/a?b=1"). ``change_rate`` is
    the true rate of its Poisson change process in changes per second (0: never changes).
    ``links`` are rendered verbatim as ``<a href>`` (paths or absolute URLs). ``size`` is the
    approximate body size in bytes.

    ``created_at`` is the clock time (seconds since the epoch) the page appears: before it the
    page answers 404 and is in no sitemap, and its change process starts there (None: it
    exists from the site's start). ``later_links`` are ``(time, link)`` pairs: a link shows
    in every version that came to be at or after its time, so a page gains a link with its
    first change after the time, as a front page lists new articles, and the body stays a
    function of the version.
    """

    path: str
    change_rate: float = 0.0
    links: tuple[str, ...] = ()
    size: int = 2000
    created_at: float | None = None
    later_links: tuple[tuple[float, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """One virtual host.

    ``robots`` is the robots.txt body (None: /robots.txt is 404). ``robots_status`` is the
    status /robots.txt answers with: 2xx serves the body, 3xx redirects ``robots_redirect_hops``
    times (``/robots.txt?hop=1`` …) and then serves the body with 200, anything else is sent
    as is. ``validators``: "honest" sends ETag and Last-Modified and answers If-None-Match /
    If-Modified-Since with 304; "none" sends neither and ignores conditionals; "wrong" sends an
    ETag that changes with every response and a Last-Modified a day in the future, and never
    answers 304. ``response_delay`` is seconds to wait before answering each request.
    ``gzip`` compresses bodies for clients that accept gzip. ``sitemap`` serves
    ``/sitemap.xml``: a urlset of the pages that exist at the request, each with its last true
    change (or its creation) as ``lastmod``; a robots.txt body then ends with its Sitemap line.
    ``sitemap_lastmod`` chooses those lastmods (see :data:`SITEMAP_LASTMODS`): "honest" as
    above; "date" the same as a date alone (``YYYY-MM-DD``, the UTC day, as many real sitemaps
    publish); and two dishonest kinds, "build" (the site's start for every entry: a build time
    that never moves) and "now" (the time of the request for every entry: stamped as served).
    """

    name: str
    pages: tuple[PageSpec, ...]
    robots: str | None = None
    robots_status: int = 200
    robots_redirect_hops: int = 1
    validators: Literal["honest", "none", "wrong"] = "honest"
    response_delay: float = 0.0
    gzip: bool = False
    sitemap: bool = False
    sitemap_lastmod: SitemapLastmod = "honest"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One request as the server saw it.

    ``started`` / ``finished`` are ``trio.current_time()`` of the serving run (seconds,
    monotonic; virtual under a MockClock): the arrival of the request's first byte, and the
    hand-over of its last response byte to the kernel. ``started_wall`` / ``finished_wall`` are
    the site's clock (seconds since the epoch unless a clock was injected). ``status`` is 0
    when no status line was sent (stall, reset, garbage). ``complete`` is False when the
    response was cut short (client gone, hostile path, server cancelled). ``version`` is the
    page version served, None for anything but a page. ``body_bytes`` counts body bytes sent.
    """

    connection: int
    host: str
    target: str
    path: str
    method: str
    status: int
    started: float
    finished: float
    started_wall: float
    finished_wall: float
    version: int | None
    body_bytes: int
    complete: bool
    if_none_match: str | None
    if_modified_since: str | None
    user_agent: str | None
    accept_encoding: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteStatistics:
    """A snapshot of the server's counters (counts since the site was created)."""

    hosts: int
    pages: int
    connections_total: int
    connections_open: int
    requests_total: int  # requests answered or abandoned (the log may hold fewer)
    requests_in_flight: int
    status_counts: dict[int, int]  # responses by status; 0 = no status line sent
    body_bytes_sent: int
    hostile_requests: int
    bad_requests: int  # requests h11 could not parse
    handler_errors: int  # bugs: exceptions in the server itself (tests expect 0)
    log_entries: int
    log_dropped: int  # records pushed out of the bounded log


# ----------------------------------------------------------------------------- request log


class RequestLog:
    """Every request the server handled, oldest first, bounded to ``max_entries`` records.

    Records are appended when a request ends, so they are ordered by ``finished``. The
    politeness helpers look at one host's requests in order of ``started``.
    """

    __slots__ = ("_changed", "_dropped", "_entries", "_total")

    def __init__(self, *, max_entries: int | None = 100_000) -> None:
        if max_entries is not None and max_entries < 1:
            raise ConfigError(
                f"max_entries must be at least 1 or None (unbounded), not {max_entries}",
                key="site.max_log_entries",
            )
        self._entries: deque[RequestRecord] = deque(maxlen=max_entries)
        self._total = 0
        self._dropped = 0
        self._changed: trio.Event | None = None

    @property
    def max_entries(self) -> int | None:
        return self._entries.maxlen

    @property
    def total(self) -> int:
        """Records ever appended, including those dropped or cleared."""
        return self._total

    @property
    def dropped(self) -> int:
        """Records pushed out by the bound (not counting :meth:`clear`)."""
        return self._dropped

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(tuple(self._entries))

    def append(self, record: RequestRecord) -> None:
        if len(self._entries) == self._entries.maxlen:
            self._dropped += 1
        self._entries.append(record)
        self._total += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def clear(self) -> None:
        """Forget every record (``total`` and ``dropped`` keep counting)."""
        self._entries.clear()

    def entries(self, *, host: str | None = None, path: str | None = None) -> list[RequestRecord]:
        """The records, oldest first, optionally for one host and/or one path."""
        return [
            r
            for r in tuple(self._entries)  # a snapshot: the server may append meanwhile
            if (host is None or r.host == host) and (path is None or r.path == path)
        ]

    def hosts(self) -> list[str]:
        """The hosts that appear in the log, sorted."""
        return sorted({r.host for r in tuple(self._entries)})

    def by_start(self, host: str) -> list[RequestRecord]:
        """One host's records in order of arrival."""
        return sorted(self.entries(host=host), key=lambda r: r.started)

    def overlapping(self, host: str) -> list[tuple[RequestRecord, RequestRecord]]:
        """Pairs of one host's requests that were in progress at the same time (politeness)."""
        pairs: list[tuple[RequestRecord, RequestRecord]] = []
        ordered = self.by_start(host)
        busy_until: RequestRecord | None = None
        for record in ordered:
            if busy_until is not None and record.started < busy_until.finished:
                pairs.append((busy_until, record))
            if busy_until is None or record.finished > busy_until.finished:
                busy_until = record
        return pairs

    def gaps(self, host: str) -> list[float]:
        """Seconds from the end of each request to one host to the start of the next."""
        ordered = self.by_start(host)
        return [b.started - a.finished for a, b in itertools.pairwise(ordered)]

    async def wait_until(self, predicate: Callable[[RequestLog], bool]) -> None:
        """Return once ``predicate(log)`` holds, re-checking after each append.

        Call it from the trio run that serves the site; put a deadline around it.
        """
        while not predicate(self):
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()


# ----------------------------------------------------------------------------- change process


def _stable_hash(*parts: str) -> int:
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _ChangeProcess:
    """The change times of one page, drawn lazily; ``version(t)`` counts changes ≤ t.

    Times are kept in a float64 array (8 bytes a change, a quarter of a list of floats): the
    ground truth of a long simulation is all the changes of all pages.
    """

    __slots__ = (
        "_chunk",
        "_hi",
        "_lo",
        "_n",
        "_rng",
        "_seed",
        "_times",
        "_v",
        "rate",
        "start",
    )

    def __init__(self, *, rate: float, start: float, seed: int, key: int) -> None:
        self.rate = rate
        self.start = start
        self._seed = (seed & (2**63 - 1), key)
        # Made on the first draw: a generator costs ~0.1 ms, and many pages are never asked.
        self._rng: np.random.Generator | None = None
        self._times = np.empty(0)  # capacity; the first _n entries are drawn change times
        self._n = 0
        self._chunk = _FIRST_CHUNK
        # The cached answer: version _v holds on [_lo, _hi).
        self._v = 0
        self._lo = start
        self._hi = start if rate > 0 else math.inf

    def _last(self) -> float:
        return float(self._times[self._n - 1]) if self._n else self.start

    def _draw_past(self, t: float) -> None:
        if self._rng is None:
            self._rng = np.random.default_rng(np.random.SeedSequence(list(self._seed)))
        last = self._last()
        while last <= t:
            drawn = np.cumsum(self._rng.exponential(1.0 / self.rate, size=self._chunk)) + last
            if self._n + len(drawn) > len(self._times):
                grown = np.empty(max(2 * len(self._times), self._n + len(drawn)))
                grown[: self._n] = self._times[: self._n]
                self._times = grown
            self._times[self._n : self._n + len(drawn)] = drawn
            self._n += len(drawn)
            last = float(drawn[-1])
            self._chunk = min(self._chunk * 2, _MAX_CHUNK)

    def version(self, t: float) -> int:
        if self._lo <= t < self._hi:
            return self._v
        if t < self.start:
            return 0
        self._draw_past(t)
        v = int(np.searchsorted(self._times[: self._n], t, side="right"))
        self._v = v
        self._lo = self.modified(v)
        self._hi = float(self._times[v])
        return v

    def modified(self, v: int) -> float:
        """When version ``v`` came to be (the start for version 0)."""
        return float(self._times[v - 1]) if v else self.start

    def times_until(self, until: float) -> np.ndarray:
        if self.rate <= 0 or until < self.start:
            return np.empty(0)
        self._draw_past(until)
        n = int(np.searchsorted(self._times[: self._n], until, side="right"))
        return self._times[:n].copy()


# ----------------------------------------------------------------------------- pages and hosts


def _http_date(t: float) -> bytes:
    return formatdate(t, usegmt=True).encode()


def _w3c_datetime(t: float) -> str:
    """``t`` as a W3C datetime in UTC with milliseconds, rounded down (never after ``t``)."""
    ms = math.floor(t * 1000)
    moment = datetime.fromtimestamp(ms // 1000, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


class _Page:
    __slots__ = (
        "_body_cache",
        "_filler",
        "_modified_cache",
        "content_key",
        "etag_key",
        "host",
        "process",
        "spec",
    )

    def __init__(self, host: str, spec: PageSpec, *, seed: int, start: float) -> None:
        self.host = host
        self.spec = spec
        key = _stable_hash(host, spec.path)
        if spec.created_at is not None:
            start = spec.created_at
        self.process = _ChangeProcess(rate=spec.change_rate, start=start, seed=seed, key=key)
        self.content_key = f"{seed}:{host}:{spec.path}"
        self.etag_key = f"{key & 0xFFFFFFFF:08x}"
        self._filler: bytes | None = None
        # Only the latest version's bodies are kept: (version, identity, gzip or None).
        self._body_cache: tuple[int, bytes, bytes | None] | None = None
        self._modified_cache: tuple[int, bytes] = (-1, b"")

    def exists(self, t: float) -> bool:
        return self.spec.created_at is None or t >= self.spec.created_at

    def last_modified(self, v: int) -> bytes:
        """The Last-Modified header of version ``v`` (whole seconds, so rounded down)."""
        if self._modified_cache[0] != v:
            self._modified_cache = (v, _http_date(math.floor(self.process.modified(v))))
        return self._modified_cache[1]

    def body(self, v: int, *, gzipped: bool, links: Callable[[str], str]) -> bytes:
        cached = self._body_cache
        if cached is None or cached[0] != v:
            cached = (v, self._render(v, links), None)
            self._body_cache = cached
        if not gzipped:
            return cached[1]
        if cached[2] is None:
            cached = (v, cached[1], gzip.compress(cached[1], compresslevel=6, mtime=0))
            self._body_cache = cached
        assert cached[2] is not None
        return cached[2]

    def forget_bodies(self) -> None:
        self._body_cache = None
        self._filler = None

    def _render(self, v: int, links: Callable[[str], str]) -> bytes:
        # Only the "news" paragraph and the version line depend on the version, like a real
        # page whose frame stays put while one part is updated.
        title = html.escape(f"{self.host}{self.spec.path}")
        head = (
            f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title>'
            f'</head>\n<body>\n<h1>{title}</h1>\n<p class="version">version {v}</p>\n'
        )
        news = " ".join(random.Random(f"{self.content_key}:{v}").choices(_WORDS, k=40))
        parts = [head, f'<p class="news">{news}</p>\n']
        shown = self.spec.links
        if self.spec.later_links:
            modified = self.process.modified(v)
            later = [link for at, link in self.spec.later_links if at <= modified]
            shown = tuple(dict.fromkeys((*shown, *later)))
        if shown:
            parts.append("<ul>\n")
            for link in shown:
                href = html.escape(links(link))
                parts.append(f'<li><a href="{href}">{html.escape(link)}</a></li>\n')
            parts.append("</ul>\n")
        page = "".join(parts).encode()
        if self._filler is None:
            self._filler = self._make_filler()
        return page + self._filler + b"</body></html>\n"

    def _make_filler(self) -> bytes:
        budget = self.spec.size - 600 - 60 * len(self.spec.links)
        if budget <= 0:
            return b""
        rnd = random.Random(f"{self.content_key}:filler")
        paragraphs: list[str] = []
        used = 0
        while used < budget:
            text = " ".join(rnd.choices(_WORDS, k=60))
            paragraphs.append(f"<p>{text}</p>\n")
            used += len(text) + 8
        return "".join(paragraphs).encode()


class _Host:
    __slots__ = ("pages", "responses", "spec")

    def __init__(self, spec: HostSpec, *, seed: int, start: float) -> None:
        self.spec = spec
        self.pages: dict[str, _Page] = {}
        for page in spec.pages:
            if page.path in self.pages:
                raise ConfigError(
                    f"host {spec.name!r} lists the path {page.path!r} twice; give each page "
                    "its own path",
                    key="site.hosts",
                )
            self.pages[page.path] = _Page(spec.name, page, seed=seed, start=start)
        self.responses = 0  # drives the "wrong" ETag, which changes with every response


def _check_host(spec: HostSpec) -> str:
    name = spec.name.strip().lower().rstrip(".")
    if not name or ":" in name or "/" in name:
        raise ConfigError(
            f"virtual host name {spec.name!r} is not a bare host name; use a name such as "
            "'h1.sim.test' (no scheme, port or path)",
            key="site.hosts",
        )
    if spec.validators not in ("honest", "none", "wrong"):
        raise ConfigError(
            f"host {spec.name!r}: validators must be 'honest', 'none' or 'wrong', not "
            f"{spec.validators!r}",
            key="site.hosts",
        )
    if spec.sitemap_lastmod not in SITEMAP_LASTMODS:
        raise ConfigError(
            f"host {spec.name!r}: sitemap_lastmod must be one of {', '.join(SITEMAP_LASTMODS)}, "
            f"not {spec.sitemap_lastmod!r}",
            key="site.hosts",
        )
    if not 100 <= spec.robots_status <= 599:
        raise ConfigError(
            f"host {spec.name!r}: robots_status {spec.robots_status} is not an HTTP status",
            key="site.hosts",
        )
    if spec.response_delay < 0 or spec.robots_redirect_hops < 1:
        raise ConfigError(
            f"host {spec.name!r}: response_delay must be ≥ 0 and robots_redirect_hops ≥ 1",
            key="site.hosts",
        )
    for page in spec.pages:
        if page.created_at is not None and not math.isfinite(page.created_at):
            raise ConfigError(
                f"host {spec.name!r}: page {page.path!r} has created_at {page.created_at}; "
                "give a finite clock time or None",
                key="site.hosts",
            )
        if not page.path.startswith("/") or page.change_rate < 0 or page.size < 0:
            raise ConfigError(
                f"host {spec.name!r}: page {page.path!r} needs a path starting with '/', a "
                "change_rate ≥ 0 and a size ≥ 0",
                key="site.hosts",
            )
    return name


# ----------------------------------------------------------------------------- requests


@dataclass(slots=True)
class _Request:
    """What the handlers need of one parsed request."""

    method: str
    target: str
    path: str
    query: str
    host: str  # lowercase, without port
    host_header: str  # as sent (with port), for absolute redirect locations
    keep_alive: bool
    if_none_match: str | None = None
    if_modified_since: str | None = None
    user_agent: str | None = None
    accept_encoding: str | None = None


def _make_request(
    method: bytes, target_bytes: bytes, http_version: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> _Request:
    """A request from its parts; header names must be lowercase (both parsers ensure it)."""
    target = target_bytes.decode("latin-1")
    if target.startswith(("http://", "https://")):  # absolute-form
        split = urlsplit(target)
        target = split.path or "/"
        if split.query:
            target += "?" + split.query
    path, _, query = target.partition("?")
    request = _Request(
        method=method.decode("latin-1"),
        target=target,
        path=path,
        query=query,
        host="",
        host_header="",
        # HTTP/1.0 keep-alive is a legacy extension; such clients get one request each.
        keep_alive=http_version == b"1.1",
    )
    for name, value in headers:
        if name == b"host":
            request.host_header = value.decode("latin-1")
            host = request.host_header.lower()
            # "[::1]:8080" keeps its brackets; "name:8080" loses the port.
            end = host.find("]") + 1 if host.startswith("[") else host.find(":")
            request.host = (host if end <= 0 else host[:end]).rstrip(".")
        elif name == b"if-none-match":
            request.if_none_match = value.decode("latin-1")
        elif name == b"if-modified-since":
            request.if_modified_since = value.decode("latin-1")
        elif name == b"user-agent":
            request.user_agent = value.decode("latin-1")
        elif name == b"accept-encoding":
            request.accept_encoding = value.decode("latin-1")
        elif name == b"connection" and b"close" in _tokens(value):
            request.keep_alive = False
    return request


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]


# The fast path accepts a strict subset of what h11 accepts (see _fast_parse); the patterns
# are h11's (h11/_abnf.py) without obs-text, and only GET/HEAD over HTTP/1.1 without a body.
_FAST_REQUEST_LINE = re.compile(rb"(GET|HEAD) (/[\x21-\x7e]*) HTTP/1\.1")
_FAST_HEADER = re.compile(
    rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*([\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?[ \t]*"
)
_HEAD_END = re.compile(rb"\n\r?\n")
_MAX_HEAD = 16 * 1024  # h11's default limit on an incomplete request head, in bytes


def _fast_parse(buffer: bytes) -> tuple[_Request, int] | None:
    """Parse the plain request head at the start of ``buffer``: (request, bytes used).

    None means "not plain": let h11 parse it (and reject it if it is malformed). h11 costs
    about half of the server's time per request, and nearly every request is a plain GET.
    The fast path gives the same request h11 would (tests/sim/test_site.py checks that).
    """
    end = buffer.find(b"\r\n\r\n", 0, _MAX_HEAD)
    if end < 0:
        return None
    lines = buffer[:end].split(b"\r\n")
    line = _FAST_REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        return None
    headers: list[tuple[bytes, bytes]] = []
    hosts = 0
    for text in lines[1:]:
        match = _FAST_HEADER.fullmatch(text)
        if match is None:
            return None
        name = match[1].lower()
        if name == b"host":
            hosts += 1
        elif name in (b"content-length", b"transfer-encoding", b"expect"):
            return None
        headers.append((name, match[2] or b""))
    if hosts != 1:
        return None
    return _make_request(line[1], line[2], b"1.1", headers), end + 4


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class _Exchange:
    """One request being answered: writes the response and notes what went out.

    Responses are serialised here rather than by h11: the server only ever writes a few
    fixed shapes, and h11's per-event validation was half of the cost of a request. Header
    values that come from a request (Location, Retry-After) are checked by :func:`_safe`.
    """

    __slots__ = (
        "body_bytes",
        "close",
        "complete",
        "date",
        "request",
        "status",
        "stream",
        "version",
    )

    def __init__(self, stream: trio.SocketStream, request: _Request, date: bytes) -> None:
        self.stream = stream
        self.request = request
        self.date = date
        self.status = 0  # 0 until a status line is sent
        self.version: int | None = None
        self.body_bytes = 0
        self.complete = False
        self.close = not request.keep_alive  # the connection must close after this request

    def _head(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        self.status = status
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        lines.extend(b"%s: %s\r\n" % header for header in headers)
        lines.append(b"date: %s\r\n" % self.date)
        if self.close:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def send(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> None:
        """A whole response in one write (head and body together)."""
        bodiless = status in (204, 304)
        if not bodiless:
            headers.append((b"content-length", b"%d" % len(body)))
        head = self._head(status, headers)
        if bodiless or self.request.method == "HEAD":
            body = b""
        await self.stream.send_all(head + body if body else head)
        self.body_bytes = len(body)
        self.complete = True

    async def send_text(
        self, status: int, text: str, extra: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), *extra]
        await self.send(status, headers, text.encode())

    async def send_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Only the head, for bodies sent piece by piece after it."""
        await self.stream.send_all(self._head(status, headers))

    async def send_sized(self, headers: list[tuple[bytes, bytes]], size: int, body: bytes) -> None:
        """A 200 with a body of ``size`` bytes: ``body`` repeated and cut to size."""
        headers.append((b"content-length", b"%d" % size))
        await self.send_head(200, headers)
        if self.request.method != "HEAD":
            view = memoryview(body)
            while self.body_bytes < size:
                start = self.body_bytes % len(body)
                piece = view[start : start + min(_SEND_CHUNK, size - self.body_bytes)]
                await self.stream.send_all(piece)
                self.body_bytes += len(piece)
        self.complete = True


def _safe(value: str) -> bytes | None:
    """``value`` as a header value, or None if it holds anything but printable ASCII."""
    if value.isascii() and value.isprintable():
        return value.encode()
    return None


def _accepts_gzip(value: str | None) -> bool:
    if not value:
        return False
    for item in value.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        params = params.replace(" ", "").lower()
        if params.startswith("q="):
            try:
                return float(params[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def _etag_matches(header: str, tag: str) -> bool:
    """Whether If-None-Match ``header`` names version ``tag`` (unquoted, without "-gz").

    Weak comparison (RFC 9110 §13.1.2), and the gzip and identity representations of one
    version match each other: either way the client holds that version's content.
    """
    if header.strip() == "*":
        return True
    for item in header.split(","):
        opaque = item.strip().removeprefix("W/").strip('"').removesuffix("-gz")
        if opaque == tag:
            return True
    return False


def _query(request: _Request) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(request.query, keep_blank_values=True).items()}


def _int_param(params: dict[str, str], name: str, default: int) -> int | None:
    text = params.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return None


def _gzip_bomb(size: int) -> bytes:
    """A valid gzip member of ``size`` zero bytes, built from one repeated deflate block.

    After a full flush the compressor starts from a clean state, so one compressed block of
    zeros can be repeated instead of compressing the whole size (seconds per GiB).
    """
    blocks, rest = divmod(size, _BOMB_BLOCK)
    zeros = bytes(_BOMB_BLOCK)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15)
    ending = tail.compress(bytes(rest)) + tail.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(bytes(rest), crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, size & 0xFFFFFFFF)
    return b"".join([header, block * blocks, ending, trailer])


# ----------------------------------------------------------------------------- the site


class Site:
    """A set of virtual hosts with their change processes, and the server's state.

    ``clock`` gives the wall time (seconds since the epoch) that decides page versions and
    ``Last-Modified``; inject one to move time by hand. Change processes start at ``start``
    (default: the clock at construction). ``link_port``: None renders links verbatim (the
    crawler's DNS overrides supply the port); an int, or "bound" for the port
    :func:`serve_site` binds, is added to absolute links to this site's own hosts that carry
    no port. The request log keeps at most ``max_log_entries`` records (None: unbounded).
    """

    def __init__(
        self,
        hosts: Sequence[HostSpec],
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        link_port: int | Literal["bound"] | None = None,
        max_log_entries: int | None = 100_000,
    ) -> None:
        self.seed = seed
        self.clock = clock
        self.start = clock() if start is None else start
        self._hosts: dict[str, _Host] = {}
        for spec in hosts:
            name = _check_host(spec)
            if name in self._hosts:
                raise ConfigError(
                    f"virtual host {name!r} is listed twice; merge its pages into one HostSpec",
                    key="site.hosts",
                )
            self._hosts[name] = _Host(spec, seed=seed, start=self.start)
        self._link_port_setting = link_port
        self._link_port: int | None = link_port if isinstance(link_port, int) else None
        self.requests = RequestLog(max_entries=max_log_entries)
        self._connections_total = 0
        self._connections_open = 0
        #: the requests being answered, by connection (one at a time on each): (host, started_wall)
        self._on_wire: dict[int, tuple[str, float]] = {}
        self._status_counts: Counter[int] = Counter()
        self._body_bytes = 0
        self._hostile = 0
        self._bad_requests = 0
        self._handler_errors = 0
        self._date: tuple[int, bytes] = (-1, b"")
        self._bombs: dict[int, bytes] = {}
        self._huge_chunk = b"x" * _SEND_CHUNK

    # --- ground truth -----------------------------------------------------------------------

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        return tuple(h.spec for h in self._hosts.values())

    def _page(self, host: str, path: str) -> _Page:
        try:
            return self._hosts[host.lower()].pages[path]
        except KeyError:
            raise ConfigError(
                f"the site has no page {host}{path}; ask for one of Site.urls()", key=None
            ) from None

    def version(self, host: str, path: str, at: float) -> int:
        """The page's version at clock time ``at``: the number of its changes up to ``at``."""
        return self._page(host, path).process.version(at)

    def change_times(self, host: str, path: str, until: float) -> np.ndarray:
        """The page's true change times (clock seconds, ascending) up to ``until``."""
        return self._page(host, path).process.times_until(until)

    def change_rate(self, host: str, path: str) -> float:
        """The page's true change rate (changes per second)."""
        return self._page(host, path).spec.change_rate

    def created_at(self, host: str, path: str) -> float:
        """When the page appeared (clock seconds): its ``created_at``, else the site's start."""
        return self._page(host, path).process.start

    def urls(
        self, *, scheme: str = "http", port: int | None = None, at: float | None = None
    ) -> list[str]:
        """Every page's URL (``port`` None: none in the URL, as the DNS overrides supply it).

        ``at``: only the pages that exist at that clock time (None: every page, future ones too).
        """
        suffix = "" if port is None else f":{port}"
        return [
            f"{scheme}://{name}{suffix}{path}"
            for name, host in self._hosts.items()
            for path, page in host.pages.items()
            if at is None or page.exists(at)
        ]

    def sitemap(self, host: str, at: float) -> bytes:
        """The ``/sitemap.xml`` body of ``host`` at clock time ``at`` (whether or not served)."""
        name = host.lower()
        if name not in self._hosts:
            raise ConfigError(f"the site has no host {host!r}; ask for one of Site.hosts")
        return self._sitemap_body(name, self._hosts[name], at)

    def body(self, host: str, path: str, at: float) -> bytes:
        """The page body (identity encoding) the server sends at clock time ``at``."""
        page = self._page(host, path)
        return page.body(page.process.version(at), gzipped=False, links=self._link)

    def started_in_flight(self, host: str) -> list[float]:
        """When the requests to ``host`` being answered now arrived (the site's clock,
        ``started_wall`` of their records to come), earliest first: a request answered slowly
        is known before its record is."""
        return sorted(t for h, t in tuple(self._on_wire.values()) if h == host)

    def statistics(self) -> SiteStatistics:
        return SiteStatistics(
            hosts=len(self._hosts),
            pages=sum(len(h.pages) for h in self._hosts.values()),
            connections_total=self._connections_total,
            connections_open=self._connections_open,
            requests_total=sum(self._status_counts.values()),
            requests_in_flight=len(self._on_wire),
            status_counts=dict(self._status_counts),
            body_bytes_sent=self._body_bytes,
            hostile_requests=self._hostile,
            bad_requests=self._bad_requests,
            handler_errors=self._handler_errors,
            log_entries=len(self.requests),
            log_dropped=self.requests.dropped,
        )

    # --- serving ----------------------------------------------------------------------------

    def _bound(self, port: int) -> None:
        if self._link_port_setting == "bound" and self._link_port != port:
            self._link_port = port
            for host in self._hosts.values():
                for page in host.pages.values():
                    page.forget_bodies()

    def _link(self, link: str) -> str:
        if self._link_port is None or not link.startswith(("http://", "https://")):
            return link
        scheme, rest = link.split("://", 1)
        netloc, slash, tail = rest.partition("/")
        if ":" in netloc or netloc.lower() not in self._hosts:
            return link
        return f"{scheme}://{netloc}:{self._link_port}{slash}{tail}"

    def _date_header(self) -> bytes:
        now = int(self.clock())
        if now != self._date[0]:
            self._date = (now, _http_date(now))
        return self._date[1]

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        self._connections_total += 1
        connection = self._connections_total
        self._connections_open += 1
        buffer = b""  # received, not yet parsed
        eof = False
        received_at = trio.current_time()
        received_wall = self.clock()
        try:
            while True:
                # A request starts with its first byte: already here if it was pipelined.
                started: float | None = received_at if buffer else None
                started_wall = received_wall
                while not eof and len(buffer) <= _MAX_HEAD and not _HEAD_END.search(buffer):
                    data = await stream.receive_some(_RECEIVE_BYTES)
                    received_at = trio.current_time()
                    received_wall = self.clock()
                    if not data:
                        eof = True
                    elif started is None:
                        started, started_wall = received_at, received_wall
                    buffer += data
                if not buffer:
                    return  # the client closed between requests
                parsed = _fast_parse(buffer)
                if parsed is not None:
                    request, used = parsed
                    buffer = buffer[used:]
                else:
                    slow = await self._parse_with_h11(stream, buffer, eof)
                    if slow is None:
                        return
                    request, buffer, eof = slow
                exchange = _Exchange(stream, request, self._date_header())
                self._on_wire[connection] = (request.host, started_wall)
                try:
                    await self._respond(exchange)
                finally:
                    del self._on_wire[connection]
                    self._record(
                        connection,
                        exchange,
                        received_at if started is None else started,
                        started_wall,
                    )
                if exchange.close or (eof and not buffer):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:
            self._handler_errors += 1
            structlog.get_logger().exception("site.handler_error", connection=connection)
        finally:
            self._connections_open -= 1
            await trio.aclose_forcefully(stream)

    async def _parse_with_h11(
        self, stream: trio.SocketStream, buffer: bytes, eof: bool
    ) -> tuple[_Request, bytes, bool] | None:
        """Parse one request (and skip its body) with h11: (request, leftover bytes, eof).

        None when there is no request to answer: the client closed, or sent something that
        is not HTTP/1.1 (answered with 400 when possible).
        """
        parser = h11.Connection(h11.SERVER)
        parser.receive_data(buffer)
        if eof:
            parser.receive_data(b"")
        request: _Request | None = None
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError:
                await self._bad_request(stream, answer=request is None)
                return None
            if event is h11.NEED_DATA:
                data = await stream.receive_some(_RECEIVE_BYTES)
                eof = not data
                parser.receive_data(data)
            elif isinstance(event, h11.Request):
                request = _make_request(
                    event.method, event.target, event.http_version, event.headers
                )
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None  # h11 sends Request before EndOfMessage
                return request, parser.trailing_data[0], eof
            elif not isinstance(event, h11.Data):
                return None  # ConnectionClosed

    async def _bad_request(self, stream: trio.SocketStream, *, answer: bool) -> None:
        self._bad_requests += 1
        self._status_counts[400] += 1
        if not answer:
            return  # the head was fine and the body broken: too late for a status line
        body = b"malformed HTTP/1.1 request; see RFC 9112\n"
        await stream.send_all(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(body), body)
        )

    def _record(
        self, connection: int, exchange: _Exchange, started: float, started_wall: float
    ) -> None:
        self._status_counts[exchange.status] += 1
        self._body_bytes += exchange.body_bytes
        request = exchange.request
        self.requests.append(
            RequestRecord(
                connection=connection,
                host=request.host,
                target=request.target,
                path=request.path,
                method=request.method,
                status=exchange.status,
                started=started,
                finished=trio.current_time(),
                started_wall=started_wall,
                finished_wall=self.clock(),
                version=exchange.version,
                body_bytes=exchange.body_bytes,
                complete=exchange.complete,
                if_none_match=request.if_none_match,
                if_modified_since=request.if_modified_since,
                user_agent=request.user_agent,
                accept_encoding=request.accept_encoding,
            )
        )

    async def _respond(self, exchange: _Exchange) -> None:
        request = exchange.request
        host = self._hosts.get(request.host)
        if host is not None and host.spec.response_delay > 0:
            await trio.sleep(host.spec.response_delay)
        if request.path.startswith("/hostile/"):
            self._hostile += 1
            await self._hostile_response(exchange)
        elif request.method not in ("GET", "HEAD"):
            text = f"{request.method} is not supported here; use GET or HEAD\n"
            await exchange.send_text(405, text, [(b"allow", b"GET, HEAD")])
        elif host is None:
            await exchange.send_text(404, f"no virtual host {request.host!r} on this server\n")
        elif request.path == "/robots.txt":
            await self._robots(exchange, host.spec)
        elif request.path == "/sitemap.xml" and host.spec.sitemap:
            body = self._sitemap_body(request.host, host, self.clock())
            await exchange.send(200, [(b"content-type", b"application/xml; charset=utf-8")], body)
        else:
            page = host.pages.get(request.target) or host.pages.get(request.path)
            if page is None or not page.exists(self.clock()):
                await exchange.send_text(404, f"no page {request.target} on {request.host}\n")
            else:
                await self._page_response(exchange, host, page)

    async def _page_response(self, exchange: _Exchange, host: _Host, page: _Page) -> None:
        request = exchange.request
        now = self.clock()
        v = page.process.version(now)
        exchange.version = v
        gzipped = host.spec.gzip and _accepts_gzip(request.accept_encoding)
        headers = [(b"content-type", b"text/html; charset=utf-8")]
        validators = host.spec.validators
        if validators == "honest":
            tag = f"{page.etag_key}-{v}"
            headers.append((b"etag", f'"{tag}-gz"'.encode() if gzipped else f'"{tag}"'.encode()))
            headers.append((b"last-modified", page.last_modified(v)))
            if self._not_modified(request, page, v, tag, now):
                await exchange.send(304, headers)
                return
        elif validators == "wrong":
            host.responses += 1
            headers.append((b"etag", f'"{page.etag_key}-{v}-{host.responses}"'.encode()))
            headers.append((b"last-modified", _http_date(now + _DAY)))
        if host.spec.gzip:
            headers.append((b"vary", b"accept-encoding"))
        if gzipped:
            headers.append((b"content-encoding", b"gzip"))
        await exchange.send(200, headers, page.body(v, gzipped=gzipped, links=self._link))

    @staticmethod
    def _not_modified(request: _Request, page: _Page, v: int, tag: str, now: float) -> bool:
        # If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2).
        if request.if_none_match is not None:
            return _etag_matches(request.if_none_match, tag)
        if request.if_modified_since is None:
            return False
        try:
            since = parsedate_to_datetime(request.if_modified_since).timestamp()
        except (TypeError, ValueError, IndexError):
            return False  # not an HTTP-date: ignore the header (RFC 9110 §13.1.3)
        if since > now:
            return False  # a date in the server's future is invalid
        modified = page.process.modified(v)
        second = math.floor(modified)
        if second > since:
            return False
        # Last-Modified has whole seconds: if the previous version began in the same second,
        # the client may hold it, and an honest server cannot say "not modified".
        return not (v > 0 and page.process.modified(v - 1) >= second)

    def _sitemap_body(self, name: str, host: _Host, at: float) -> bytes:
        lines = [
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
        ]
        for path, page in host.pages.items():
            if not page.exists(at):
                continue
            loc = html.escape(self._link(f"http://{name}{path}"))
            lastmod = self._lastmod(host.spec.sitemap_lastmod, page, at)
            lines.append(f"<url><loc>{loc}</loc><lastmod>{lastmod}</lastmod></url>\n")
        lines.append("</urlset>\n")
        return "".join(lines).encode()

    def _lastmod(self, kind: SitemapLastmod, page: _Page, at: float) -> str:
        """A page's sitemap ``<lastmod>`` at clock time ``at`` as a host of ``kind`` writes it."""
        if kind == "build":
            return _w3c_datetime(self.start)
        if kind == "now":
            return _w3c_datetime(at)
        changed = page.process.modified(page.process.version(at))
        if kind == "date":
            return f"{datetime.fromtimestamp(changed, UTC):%Y-%m-%d}"
        return _w3c_datetime(changed)

    async def _robots(self, exchange: _Exchange, spec: HostSpec) -> None:
        status = spec.robots_status
        if 300 <= status < 400:
            hop = _int_param(_query(exchange.request), "hop", 0) or 0
            if hop < spec.robots_redirect_hops:
                location = f"http://{exchange.request.host_header}/robots.txt?hop={hop + 1}"
                extra = [(b"location", _safe(location) or b"/robots.txt")]
                await exchange.send_text(status, f"robots.txt moved to {location}\n", extra)
                return
            status = 200
        if spec.robots is None and status < 400:
            status = 404
        if status < 300 and spec.robots is not None:
            text = spec.robots
            if spec.sitemap:
                sitemap = self._link(f"http://{exchange.request.host}/sitemap.xml")
                text = text.rstrip("\n") + f"\n\nSitemap: {sitemap}\n"
            await exchange.send_text(status, text)
        else:
            await exchange.send_text(status, f"robots.txt answers {status} on this host\n")

    # --- hostile paths ----------------------------------------------------------------------

    async def _hostile_response(self, exchange: _Exchange) -> None:
        request = exchange.request
        params = _query(request)
        name = request.path
        if name == "/hostile/stall":
            exchange.close = True
            while await exchange.stream.receive_some(_RECEIVE_BYTES):
                pass  # never answer; stop when the client closes
        elif name == "/hostile/slow-body":
            await self._slow_body(exchange, params)
        elif name == "/hostile/reset":
            exchange.close = True
            await exchange.stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/ht")
            # SO_LINGER with a zero timeout makes close() send an RST instead of a FIN.
            linger = struct.pack("ii", 1, 0)
            exchange.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            await exchange.stream.aclose()
        elif name == "/hostile/garbage":
            exchange.close = True
            garbage = b"\x00\x01\x02\xff\xfe GARBAGE, not HTTP at all \x7f\r\n" * 8
            await exchange.stream.send_all(garbage)
        elif name == "/hostile/endless":
            exchange.close = True
            chunk = self._huge_chunk[:16384]
            framed = b"%x\r\n%b\r\n" % (len(chunk), chunk)
            await exchange.send_head(200, [*_CHUNKED, (b"content-type", b"text/plain")])
            while True:
                await exchange.stream.send_all(framed)
                exchange.body_bytes += len(chunk)
        elif name == "/hostile/huge":
            size = _int_param(params, "bytes", _HUGE_DEFAULT)
            if size is None or size < 0:
                await exchange.send_text(400, "bytes= must be a whole number ≥ 0\n")
                return
            await exchange.send_sized([(b"content-type", b"text/plain")], size, self._huge_chunk)
        elif name == "/hostile/redirect-loop":
            location = _safe(f"http://{request.host_header}{request.target}")
            await exchange.send_text(301, "moved\n", [(b"location", location or b"/")])
        elif name == "/hostile/redirect":
            await self._redirect_chain(exchange, params)
        elif name == "/hostile/status":
            code = _int_param(params, "code", 500)
            retry_after = _safe(params.get("retry_after", ""))
            if code is None or not 200 <= code <= 599 or retry_after is None:
                text = "use code=N (200 to 599) and optionally retry_after=S (printable ASCII)\n"
                await exchange.send_text(400, text)
                return
            extra = [(b"retry-after", retry_after)] if retry_after else []
            await exchange.send_text(code, f"status {code}\n", extra)
        elif name == "/hostile/gzip-bomb":
            await self._gzip_bomb(exchange, params)
        else:
            text = f"no hostile path {name}; known: {', '.join(HOSTILE_PATHS)}\n"
            await exchange.send_text(404, text)

    async def _slow_body(self, exchange: _Exchange, params: dict[str, str]) -> None:
        try:
            interval = float(params.get("interval", _SLOW_BODY_INTERVAL))
        except ValueError:
            interval = -1.0
        if not 0 <= interval < math.inf:
            await exchange.send_text(400, "interval= must be a number of seconds ≥ 0\n")
            return
        exchange.close = True
        await exchange.send_head(200, [*_CHUNKED, (b"content-type", b"text/plain")])
        while True:
            await trio.sleep(interval)
            await exchange.stream.send_all(b"1\r\nx\r\n")
            exchange.body_bytes += 1

    async def _redirect_chain(self, exchange: _Exchange, params: dict[str, str]) -> None:
        to = params.get("to")
        hops = _int_param(params, "hops", 1)
        status = _int_param(params, "status", 301)
        if not to or hops is None or hops < 1 or status not in (301, 302, 303, 307, 308):
            text = "use ?to=URL&hops=N (N ≥ 1) and optionally status=301|302|303|307|308\n"
            await exchange.send_text(400, text)
            return
        if hops > 1:
            query = urlencode({"to": to, "hops": hops - 1, "status": status})
            location = _safe(f"http://{exchange.request.host_header}/hostile/redirect?{query}")
        else:
            location = _safe(to)
        if location is None:
            await exchange.send_text(400, "to= must be printable ASCII (percent-encode it)\n")
            return
        await exchange.send_text(status, "moved\n", [(b"location", location)])

    async def _gzip_bomb(self, exchange: _Exchange, params: dict[str, str]) -> None:
        size = _int_param(params, "bytes", _BOMB_DEFAULT)
        if size is None or not 0 <= size <= 16 * _BOMB_DEFAULT:
            await exchange.send_text(400, "bytes= must be a whole number from 0 to 16 GiB\n")
            return
        bomb = self._bombs.get(size)
        if bomb is None:
            bomb = await trio.to_thread.run_sync(_gzip_bomb, size)
            if len(self._bombs) >= 4:
                self._bombs.clear()
            self._bombs[size] = bomb
        headers = [(b"content-type", b"text/html"), (b"content-encoding", b"gzip")]
        await exchange.send_sized(headers, len(bomb), bomb)


_CHUNKED = ((b"transfer-encoding", b"chunked"),)


# ----------------------------------------------------------------------------- serving


async def serve_site(
    site: Site,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``site`` on ``host``:``port`` (0: any free port) until cancelled.

    Calls ``task_status.started(port)`` with the port actually bound, so
    ``port = await nursery.start(serve_site, site)`` works.
    """
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; pick another port (0 picks a "
            "free one) or stop the process that holds it",
            key="site.port",
        ) from e
    bound = int(listeners[0].socket.getsockname()[1])
    site._bound(bound)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_listeners, site._serve_connection, listeners))
        task_status.started(bound)


# ----------------------------------------------------------------------------- the demo web


def make_demo_site(
    *,
    hosts: int = 5,
    pages_per_host: int = 20,
    seed: int = 0,
    domain: str = "sim.test",
    mean_change_interval: float = 60.0,
    never_change: float = 0.1,
    links_per_page: int = 6,
    cross_host_links: float = 0.2,
    page_size: int = 2000,
    crawl_delay: float | None = 1.0,
    clock: Callable[[], float] = time.time,
    start: float | None = None,
    link_port: int | Literal["bound"] | None = None,
    max_log_entries: int | None = 100_000,
) -> Site:
    """A small, varied web of ``hosts`` × ``pages_per_host`` pages named ``h0.<domain>`` ….

    Change rates are heavy-tailed: log-normal with σ = 1.5 and mean 1/``mean_change_interval``
    (changes per second) over the pages that change, so most pages change rarely and a few
    often; a fraction ``never_change`` never changes. Page ``/pJ`` links to the next page (so
    every page is reachable from ``/``) and to ``links_per_page − 1`` random others, a fraction
    ``cross_host_links`` of them on other hosts (absolute ``http://`` URLs without a port).
    Hosts vary by index i: i % 3 == 0 has robots.txt rules (Disallow: /private/, where every
    fifth page lives, and, when i % 6 == 0, ``crawl_delay`` seconds of Crawl-delay), i % 3 == 1
    has no robots.txt (404), i % 3 == 2 allows everything; validators are "none" for
    i % 5 == 2, "wrong" for i % 5 == 4 and "honest" otherwise; odd hosts gzip.
    """
    if hosts < 1 or pages_per_host < 1 or mean_change_interval <= 0:
        raise ConfigError(
            "a demo site needs hosts ≥ 1, pages_per_host ≥ 1 and mean_change_interval > 0 "
            f"(got {hosts}, {pages_per_host}, {mean_change_interval})",
            key="site",
        )
    if not 0 <= never_change <= 1 or not 0 <= cross_host_links <= 1:
        raise ConfigError("never_change and cross_host_links are fractions from 0 to 1", key="site")
    rng = np.random.default_rng(np.random.SeedSequence([seed & (2**63 - 1), 0x517E]))
    names = [f"h{i}.{domain}" for i in range(hosts)]
    paths: list[list[str]] = []
    for i in range(hosts):
        private = i % 3 == 0
        paths.append(
            ["/"]
            + [
                f"/private/p{j}" if private and j % 5 == 4 else f"/p{j}"
                for j in range(1, pages_per_host)
            ]
        )
    sigma = 1.5
    mu = -math.log(mean_change_interval) - sigma * sigma / 2
    specs: list[HostSpec] = []
    for i, name in enumerate(names):
        rates = rng.lognormal(mu, sigma, size=pages_per_host)
        rates[rng.random(pages_per_host) < never_change] = 0.0
        pages: list[PageSpec] = []
        own = paths[i]
        extra = max(0, links_per_page - 1)
        # Drawn as arrays: per-link scalar draws made large demo sites slow to build.
        cross = (rng.random((pages_per_host, extra)) < cross_host_links).tolist()
        other_hosts = rng.integers(max(1, hosts - 1), size=(pages_per_host, extra)).tolist()
        picks = rng.integers(pages_per_host, size=(pages_per_host, extra)).tolist()
        for j, path in enumerate(own):
            links = [own[(j + 1) % len(own)]] if len(own) > 1 else []
            for is_cross, other, pick in zip(cross[j], other_hosts[j], picks[j], strict=True):
                if hosts > 1 and is_cross:
                    other += other >= i
                    links.append(f"http://{names[other]}{paths[other][pick]}")
                else:
                    links.append(own[pick])
            pages.append(
                PageSpec(
                    path=path,
                    change_rate=float(rates[j]),
                    links=tuple(dict.fromkeys(links)),
                    size=page_size,
                )
            )
        robots: str | None
        if i % 3 == 0:
            robots = "User-agent: *\nDisallow: /private/\n"
            if i % 6 == 0 and crawl_delay is not None:
                robots += f"Crawl-delay: {crawl_delay:g}\n"
        elif i % 3 == 1:
            robots = None
        else:
            robots = "User-agent: *\nAllow: /\n"
        validators: Literal["honest", "none", "wrong"] = (
            "none" if i % 5 == 2 else "wrong" if i % 5 == 4 else "honest"
        )
        specs.append(
            HostSpec(
                name=name,
                pages=tuple(pages),
                robots=robots,
                validators=validators,
                gzip=i % 2 == 1,
            )
        )
    return Site(
        specs,
        seed=seed,
        clock=clock,
        start=start,
        link_port=link_port,
        max_log_entries=max_log_entries,
    )


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m refresher.sim._site``: serve the demo site until interrupted."""
    parser = argparse.ArgumentParser(
        prog="refresher site",
        description="Serve a simulated web of virtual hosts on one local port. Point the "
        "crawler at it with DNS overrides such as 'h0.sim.test' = '127.0.0.1:PORT'.",
    )
    parser.add_argument("--hosts", type=int, default=5, help="virtual hosts (default 5)")
    parser.add_argument("--pages", type=int, default=20, help="pages per host (default 20)")
    parser.add_argument("--port", type=int, default=8080, help="port; 0 picks a free one")
    parser.add_argument("--bind", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the site (default 0)")
    parser.add_argument("--domain", default="sim.test", help="host names h<i>.<domain>")
    parser.add_argument(
        "--mean-change-interval",
        type=float,
        default=60.0,
        help="1 / mean change rate of changing pages, in seconds (default 60)",
    )
    parser.add_argument(
        "--crawl-delay",
        type=float,
        default=1.0,
        help="Crawl-delay in seconds on every sixth host's robots.txt (default 1; <0: none)",
    )
    parser.add_argument(
        "--links-with-port", action="store_true", help="put the bound port into absolute links"
    )
    parser.add_argument("--port-file", help="write the bound port to this file")
    args = parser.parse_args(argv)

    from refresher.ops._logging import configure_logging, get_logger

    configure_logging()
    log = get_logger("site")
    try:
        site = make_demo_site(
            hosts=args.hosts,
            pages_per_host=args.pages,
            seed=args.seed,
            domain=args.domain,
            mean_change_interval=args.mean_change_interval,
            crawl_delay=None if args.crawl_delay < 0 else args.crawl_delay,
            link_port="bound" if args.links_with_port else None,
        )
    except ConfigError as e:
        print(f"refresher site: {e}", file=sys.stderr)
        return 2

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_site, site, host=args.bind, port=args.port))
            if args.port_file:
                with open(args.port_file, "w") as f:
                    f.write(f"{port}\n")
            names = [h.name for h in site.hosts]
            log.info(
                "site.serving",
                address=f"{args.bind}:{port}",
                port=port,
                hosts=len(names),
                pages=len(site.urls()),
                first=names[0],
                last=names[-1],
                seed=args.seed,
            )

    try:
        trio.run(run)
    except ConfigError as e:
        print(f"refresher site: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
