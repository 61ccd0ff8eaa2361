"""Host name resolution for the fetcher: a TTL cache, static overrides, failure backoff.

A crawler resolves the same few thousand host names over and over, and a stub resolver call
costs a thread and a round trip, so answers are cached for ``ttl`` seconds. A name that fails
is remembered too (negative caching) with an exponential backoff per host, so a dead domain
costs one lookup per backoff period rather than one per URL.

Static overrides (config ``dns.static``) pin names to addresses without any lookup; they work
like ``curl --resolve``/``--connect-to``: a value may carry a port, which replaces the port of
the URL for the connection only (the ``Host`` header and TLS name stay the original ones).
That is how tests and simulations point many virtual hosts at one local server.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import trio

from refresher._errors import ConfigError, DNSFailure

__all__ = ["Resolver", "ResolverStatistics", "StaticTarget", "parse_static"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticTarget:
    """Where a statically overridden name connects: ``port`` None keeps the URL's port."""

    ip: str
    port: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolverStatistics:
    """A snapshot of the resolver's counters (counts since the resolver was created)."""

    lookups: int  # calls to the system resolver
    cache_hits: int  # answers served from the positive cache
    static_hits: int  # answers served from static overrides or IP literals
    failures: int  # lookups that failed (each one starts or extends a backoff)
    backoff_hits: int  # requests refused without a lookup because the name is backing off
    entries: int  # names currently cached (positive and negative)


@dataclass(slots=True)
class _Entry:
    ip: str | None  # None: a negative entry
    expires: float  # clock seconds
    failures: int  # consecutive failures, drives the backoff
    error: str  # the last failure's message, repeated while backing off


def _parse_address(value: str) -> tuple[str, int | None] | None:
    """Split "IP", "IP:PORT" or "[v6]:PORT" into (ip, port); None if it is none of those."""
    text = value.strip()
    port_text: str | None = None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            return None
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port_text = rest[1:]
        try:
            if ipaddress.ip_address(host).version != 6:
                return None
        except ValueError:
            return None
    else:
        try:
            ipaddress.ip_address(text)  # a bare IPv4 or IPv6 address
            return text, None
        except ValueError:
            pass
        host, sep, port_text = text.rpartition(":")
        if not sep:
            return None
        try:
            if ipaddress.ip_address(host).version != 4:
                return None  # a v6 address with a port must be bracketed
        except ValueError:
            return None
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host, int(port_text)


def _valid_host_name(name: str) -> bool:
    if not name or len(name) > 253 or name.startswith(".") or name.endswith("."):
        return False
    return all(label and "*" not in label and " " not in label for label in name.split("."))


def parse_static(static: Mapping[str, str]) -> dict[str, StaticTarget]:
    """Validate ``dns.static`` entries; raises ConfigError naming the first bad key.

    Keys are host names, or ``*.suffix`` wildcards that match every name under ``suffix`` and
    ``suffix`` itself. Values are ``IP``, ``IP:PORT`` or ``[IPv6]:PORT``.
    """
    parsed: dict[str, StaticTarget] = {}
    for raw_key, value in static.items():
        key = str(raw_key)
        where = f'dns.static."{key}"'
        name = key.strip().lower()
        bare = name[2:] if name.startswith("*.") else name
        if not _valid_host_name(bare):
            raise ConfigError(
                f"{key!r} is not a host name; write a name like 'a.example' or a wildcard "
                "like '*.sim.test' (the '*' only as the whole first label)",
                key=where,
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"the value must be a string like '127.0.0.1:8080', not {value!r}", key=where
            )
        address = _parse_address(value)
        if address is None:
            raise ConfigError(
                f"{value!r} is not an address; write 'IP', 'IP:PORT' or '[IPv6]:PORT' "
                "with a port from 1 to 65535, e.g. '127.0.0.1:8080' or '[::1]:8080'",
                key=where,
            )
        parsed[name] = StaticTarget(ip=address[0], port=address[1])
    return parsed


_IPV4_CHARACTERS = frozenset("0123456789.")


def _ip_literal(host: str) -> str | None:
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" not in text and not _IPV4_CHARACTERS.issuperset(text):
        return None  # a name (ipaddress would raise twice to say so, on every request)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


class Resolver:
    """Resolves host names to one address to connect to, with caching and overrides.

    ``ttl`` is how long (seconds) a successful answer is reused. A failure is cached for
    ``negative_ttl`` seconds, doubling with each consecutive failure of the same name up to
    ``max_negative_ttl``; meanwhile :meth:`resolve` raises :class:`DNSFailure` at once. At most
    ``max_entries`` names are cached (least recently used evicted). ``clock`` returns seconds
    and exists so tests can move time.
    """

    def __init__(
        self,
        *,
        static: Mapping[str, str] | None = None,
        ttl: float = 300.0,
        negative_ttl: float = 5.0,
        max_negative_ttl: float = 300.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if ttl < 0 or negative_ttl < 0 or max_negative_ttl < negative_ttl:
            raise ConfigError(
                "dns ttl and negative ttl must be >= 0 and max_negative_ttl >= negative_ttl; "
                f"got ttl={ttl}, negative_ttl={negative_ttl}, max_negative_ttl={max_negative_ttl}",
                key="dns",
            )
        if max_entries < 1:
            raise ConfigError(f"must be at least 1, got {max_entries}", key="dns.max_entries")
        targets = parse_static(static or {})
        self._exact = {k: v for k, v in targets.items() if not k.startswith("*.")}
        # Longest suffix first, so "*.a.sim.test" wins over "*.sim.test".
        self._wildcards = sorted(
            ((k[2:], v) for k, v in targets.items() if k.startswith("*.")),
            key=lambda item: -len(item[0]),
        )
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_negative_ttl = max_negative_ttl
        self._max_entries = max_entries
        self._clock = clock
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        # One lookup per name at a time: later callers wait for the first one's answer.
        self._pending: dict[str, trio.Event] = {}
        self._lookups = 0
        self._cache_hits = 0
        self._static_hits = 0
        self._failures = 0
        self._backoff_hits = 0

    def static_target(self, host: str) -> StaticTarget | None:
        """The static override for ``host`` (exact name first, then the longest wildcard)."""
        name = host.lower().rstrip(".")
        target = self._exact.get(name)
        if target is not None:
            return target
        for suffix, wildcard in self._wildcards:
            if name == suffix or name.endswith("." + suffix):
                return wildcard
        return None

    async def resolve(self, host: str, port: int) -> tuple[str, int]:
        """Return ``(ip, port)`` to connect to for ``host:port``; raises DNSFailure."""
        name = host.lower().rstrip(".")
        literal = _ip_literal(name)
        if literal is not None:
            self._static_hits += 1
            return literal, port
        target = self.static_target(name)
        if target is not None:
            self._static_hits += 1
            return target.ip, port if target.port is None else target.port
        while True:
            entry = self._cache.get(name)
            now = self._clock()
            if entry is not None and now < entry.expires:
                self._cache.move_to_end(name)
                if entry.ip is not None:
                    self._cache_hits += 1
                    return entry.ip, port
                self._backoff_hits += 1
                raise DNSFailure(
                    f"{entry.error} (cached failure; the next lookup of {host!r} is in "
                    f"{entry.expires - now:.1f} s)"
                )
            pending = self._pending.get(name)
            if pending is None:
                break
            await pending.wait()
        done = self._pending[name] = trio.Event()
        try:
            return await self._lookup(name, host, port, entry)
        finally:
            del self._pending[name]
            done.set()

    async def _lookup(
        self, name: str, host: str, port: int, entry: _Entry | None
    ) -> tuple[str, int]:
        failures = 0 if entry is None or entry.ip is not None else entry.failures
        try:
            ip = await self._getaddrinfo(name, port)
        except DNSFailure as e:
            self._failures += 1
            failures += 1
            backoff = min(self._negative_ttl * 2 ** (failures - 1), self._max_negative_ttl)
            self._store(name, _Entry(None, self._clock() + backoff, failures, str(e)))
            raise
        self._store(name, _Entry(ip, self._clock() + self._ttl, 0, ""))
        return ip, port

    async def _getaddrinfo(self, name: str, port: int) -> str:
        # RFC 6761 §6.4: ".invalid" never resolves, so answer without asking anyone.
        if name == "invalid" or name.endswith(".invalid"):
            raise DNSFailure(
                f"{name!r} is under the reserved .invalid domain and never resolves; "
                "fix the URL or add a dns.static override"
            )
        self._lookups += 1
        try:
            infos = await trio.socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise DNSFailure(
                f"could not resolve {name!r}: {e}; check the host name, the system resolver, "
                "or add a dns.static override"
            ) from e
        # IPv4 first: the fetcher connects to this one address (no happy eyeballs), and a
        # machine without an IPv6 route would otherwise fail every dual-stack host.
        for family, _type, _proto, _canonname, sockaddr in sorted(
            infos, key=lambda info: info[0] != socket.AF_INET
        ):
            if family in (socket.AF_INET, socket.AF_INET6):
                return str(sockaddr[0])
        raise DNSFailure(
            f"{name!r} resolved to no address; check its DNS records or add a dns.static override"
        )

    def _store(self, name: str, entry: _Entry) -> None:
        self._cache[name] = entry
        self._cache.move_to_end(name)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)

    def statistics(self) -> ResolverStatistics:
        """A snapshot of the counters."""
        return ResolverStatistics(
            lookups=self._lookups,
            cache_hits=self._cache_hits,
            static_hits=self._static_hits,
            failures=self._failures,
            backoff_hits=self._backoff_hits,
            entries=len(self._cache),
        )
