"""Which discovered links are worth crawling: scope, limits and spider-trap defences.

A link found on a page goes through :func:`~refresher.discover._url.canonicalize`, then
:meth:`UrlFilter.check`, then the URL-seen test; a URL that is new is recorded with
:meth:`UrlFilter.accept`. :meth:`UrlFilter.screen` does the first two steps for a raw ``href``.

A link is cut, with a short reason counted per reason and per host, when it is

* ``invalid_*``: not a crawlable URL (``invalid_scheme`` for mailto: or javascript: links,
  ``invalid_length``, ``invalid_characters``, ``invalid_host``, ``invalid_port``,
  ``invalid_credentials``, ``invalid_other``), counted by :meth:`screen` only;
* ``scheme``: a scheme not in ``schemes``;
* ``too_long``: longer than ``max_url_length`` characters;
* ``out_of_scope``: on a host that is not a seed's host (exact host key), not in
  ``allowed_hosts`` and not in or under one of ``allowed_domains``;
* ``excluded`` / ``not_included``: matched by an ``exclude`` pattern, or by none of the
  ``include`` patterns when there are some;
* ``too_deep``: more than ``max_depth`` links away from a seed;
* ``host_full``: on a host that already has ``max_pages_per_host`` accepted pages;
* ``trap_repeated_segments``: a path segment repeated more than ``max_repeated_segments``
  times (``/a/b/a/b/a/b``, relative links that loop);
* ``trap_query_space``: more than ``max_query_params`` query parameters, or a path that
  already has ``max_query_variants_per_path`` accepted query strings (sort orders, filters,
  session ids, page numbers without end);
* ``trap_calendar``: a date in the path or query further than ``calendar_window_days`` from
  today (calendars link to next month forever), or three or more dates in one URL. A date
  in the past followed by more path (``/2015/05/a-post``) is a dated page, not a calendar
  view, and is kept.

Every check is a few dict lookups and string splits of one URL: it runs for each link found.
Memory is bounded except for the per-host page counts, which grow with the hosts in scope.
"""

from __future__ import annotations

import datetime
import heapq
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Generic, TypeVar

from refresher._errors import ConfigError, InvalidURL
from refresher.discover._url import MAX_URL_LENGTH, TRACKING_PARAMS, CanonicalURL, canonicalize

__all__ = ["CUT_REASONS", "FilterConfig", "FilterStatistics", "UrlFilter"]

CUT_REASONS = (
    "invalid_scheme",
    "invalid_length",
    "invalid_characters",
    "invalid_host",
    "invalid_port",
    "invalid_credentials",
    "invalid_other",
    "scheme",
    "too_long",
    "out_of_scope",
    "excluded",
    "not_included",
    "too_deep",
    "host_full",
    "trap_repeated_segments",
    "trap_query_space",
    "trap_calendar",
)
"""Every reason :meth:`UrlFilter.check` and :meth:`UrlFilter.screen` can give."""

_TOP_HOSTS = 20  # hosts listed in statistics()
_HOST_CUT_ENTRIES = 4096  # (host, reason) pairs counted at most
_MAX_DATES = 3  # this many dates in one URL make a run of date segments
_KNOWN_SCHEMES = frozenset({"http", "https"})

# canonicalize()'s reasons begin with fixed words; the order matters ("port" before "host").
_INVALID_KINDS = (
    ("longer than", "invalid_length"),
    ("contains the control", "invalid_characters"),
    ("contains a lone surrogate", "invalid_characters"),
    ("scheme", "invalid_scheme"),
    ("contains user credentials", "invalid_credentials"),
    ("port", "invalid_port"),
    ("host", "invalid_host"),
    ("has no host", "invalid_host"),
    ("the IPv6", "invalid_host"),
)

# A number in a path is weak evidence of a year: 1900-2099 count, followed or not by a month
# ("/2031/5/"); other years from 1000 to 2999 only with a two-digit month after them
# ("/2345/01/": calendars run on past 2099, while "/thread/1234/5" is a thread's page 5).
_YEAR = re.compile(r"(?:19|20)[0-9]{2}")
_ANY_YEAR = re.compile(r"[12][0-9]{3}")
_MONTH = re.compile(r"0?[1-9]|1[0-2]")
_MONTH_2 = re.compile(r"0[1-9]|1[0-2]")
_DAY = re.compile(r"0?[1-9]|[12][0-9]|3[01]")
# One token: 2024-05, 2024_05_31 (the same separator twice); more may follow it. Not "." as
# a separator: "2019.05" is far more often a version than a date.
_DATE_TOKEN = re.compile(r"([12][0-9]{3})([-_])(0[1-9]|1[0-2])(?:\2(0[1-9]|[12][0-9]|3[01]))?")
# Not "y" or "m": those are as often coordinates (image maps) or modes.
_YEAR_NAMES = frozenset({"year", "yr"})
_MONTH_NAMES = frozenset({"month", "mon", "mo"})

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterConfig:
    """Scope, limits and trap defences for discovered links (the ``[discovery]`` section)."""

    #: host keys crawled besides the seeds' hosts ("example.org", "example.org:8080")
    allowed_hosts: tuple[str, ...] = ()
    #: domains crawled with all their subdomains ("example.org" allows "www.example.org")
    allowed_domains: tuple[str, ...] = ()
    #: regular expressions (Python syntax, searched in the canonical URL); when any are
    #: given, a URL must match one of them
    include: tuple[str, ...] = ()
    #: regular expressions; a URL matching any of them is not crawled
    exclude: tuple[str, ...] = ()
    #: URL schemes crawled: "http", "https" or both
    schemes: tuple[str, ...] = ("http", "https")
    #: characters in a canonical URL at most (at most 2048)
    max_url_length: int = MAX_URL_LENGTH
    #: links from a seed at most (a seed is depth 0, a link on it depth 1)
    max_depth: int = 10
    #: pages accepted per host at most
    max_pages_per_host: int = 100_000
    #: times one path segment may occur in a path ("/a/b/a/b/a" has "a" three times)
    max_repeated_segments: int = 2
    #: parameters in a query at most
    max_query_params: int = 10
    #: distinct query strings accepted per path at most
    max_query_variants_per_path: int = 100
    #: days from today beyond which a date in a URL marks a calendar trap; 0 turns it off
    calendar_window_days: int = 730
    #: remove known session and tracking parameters (utm_*, fbclid, sessionid, …) from links
    strip_tracking_params: bool = True

    def __post_init__(self) -> None:
        for name in ("allowed_hosts", "allowed_domains", "include", "exclude", "schemes"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(
                    f"expected a list of strings, got {value!r}", key=f"discovery.{name}"
                )
        for name in ("include", "exclude"):
            _compile_patterns(getattr(self, name), f"discovery.{name}")
        _host_keys(self.allowed_hosts, "discovery.allowed_hosts")
        _domains(self.allowed_domains)
        unknown = sorted(set(self.schemes) - _KNOWN_SCHEMES)
        if unknown or not self.schemes:
            raise ConfigError(
                f"schemes {unknown or self.schemes!r} cannot be crawled; "
                'list "http", "https" or both',
                key="discovery.schemes",
            )
        if not 1 <= self.max_url_length <= MAX_URL_LENGTH:
            raise ConfigError(
                f"must be from 1 to {MAX_URL_LENGTH}, got {self.max_url_length}",
                key="discovery.max_url_length",
            )
        for name in (
            "max_depth",
            "max_pages_per_host",
            "max_repeated_segments",
            "max_query_params",
            "max_query_variants_per_path",
            "calendar_window_days",
        ):
            value = getattr(self, name)
            least = 1 if name in ("max_pages_per_host", "max_repeated_segments") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"must be a whole number of at least {least}, got {value!r}; fix the value",
                    key=f"discovery.{name}",
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterStatistics:
    """A snapshot of the filter's counters since it was created."""

    checked: int = field(metadata={"metric": "counter"})  # links checked (check, screen)
    accepted: int = field(metadata={"metric": "counter"})  # pages recorded by accept()
    cut: int = field(metadata={"metric": "counter"})  # links cut, all reasons
    cuts: Mapping[str, int] = field(metadata={"metric": "counter"})  # links cut, by reason
    hosts: int  # hosts with accepted pages
    full_hosts: int  # hosts at max_pages_per_host
    tracked_paths: int  # paths whose query strings are counted (bounded)
    #: the hosts with the most links cut (at most 20), and their counts; approximate for
    #: hosts that rarely appear, since rare hosts are forgotten to bound memory
    cuts_by_host: Mapping[str, int]
    cut_reasons_by_host: Mapping[str, Mapping[str, int]]  # the same hosts, by reason


class _CappedCounts(Generic[K]):
    """Counts per key, for at most ``capacity`` keys: when full, the lower half is dropped.

    Keys that keep coming back (a trap, a host producing junk) stay; rare keys are forgotten
    and start again from zero. Amortised, an add costs O(log capacity).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = max(2, capacity)
        self._counts: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, key: K) -> int:
        return self._counts.get(key, 0)

    def add(self, key: K) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        if len(counts) > self._capacity:
            keep = heapq.nlargest(self._capacity // 2, counts.items(), key=lambda kv: kv[1])
            self._counts = dict(keep)

    def items(self) -> Iterable[tuple[K, int]]:
        return self._counts.items()


class UrlFilter:
    """Decides, per discovered link, whether it is crawled; counts what it cuts.

    ``seeds_hosts`` are host keys ("host" or "host:port"); the other parameters are those of
    :class:`FilterConfig`. ``today`` gives the date calendar traps are measured from;
    ``max_tracked_paths`` bounds the paths whose query strings are counted.
    """

    def __init__(
        self,
        *,
        seeds_hosts: Iterable[str],
        allowed_hosts: Iterable[str] = (),
        allowed_domains: Iterable[str] = (),
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        schemes: Iterable[str] = ("http", "https"),
        max_url_length: int = MAX_URL_LENGTH,
        max_depth: int = 10,
        max_pages_per_host: int = 100_000,
        max_repeated_segments: int = 2,
        max_query_params: int = 10,
        max_query_variants_per_path: int = 100,
        calendar_window_days: int = 730,
        strip_tracking_params: bool = True,
        today: Callable[[], datetime.date] = datetime.date.today,
        max_tracked_paths: int = 100_000,
    ) -> None:
        self.config = FilterConfig(
            allowed_hosts=tuple(allowed_hosts),
            allowed_domains=tuple(allowed_domains),
            include=tuple(include),
            exclude=tuple(exclude),
            schemes=tuple(schemes),
            max_url_length=max_url_length,
            max_depth=max_depth,
            max_pages_per_host=max_pages_per_host,
            max_repeated_segments=max_repeated_segments,
            max_query_params=max_query_params,
            max_query_variants_per_path=max_query_variants_per_path,
            calendar_window_days=calendar_window_days,
            strip_tracking_params=strip_tracking_params,
        )
        self._seed_hosts: set[str] = set()
        self._hosts: set[str] = set()
        self.add_seed_hosts(seeds_hosts)
        self._strip = TRACKING_PARAMS if strip_tracking_params else None
        self.configure(self.config)
        self._today = today
        self._pages: dict[str, int] = {}
        self._variants: _CappedCounts[int] = _CappedCounts(max_tracked_paths)
        self._host_cuts: _CappedCounts[tuple[str, str]] = _CappedCounts(_HOST_CUT_ENTRIES)
        self._cuts: Counter[str] = Counter()
        self._checked = 0
        self._accepted = 0

    @classmethod
    def from_config(
        cls,
        config: FilterConfig,
        *,
        seeds_hosts: Iterable[str],
        today: Callable[[], datetime.date] = datetime.date.today,
    ) -> UrlFilter:
        return cls(seeds_hosts=seeds_hosts, today=today, **asdict(config))

    def configure(self, config: FilterConfig) -> None:
        """Take new scope, limits and trap settings (SIGHUP); counts and seed hosts stay.

        ``strip_tracking_params`` is restart-only: it changes the identity of pages, and seeds
        and links must canonicalise alike, so the running value is kept."""
        c = replace(config, strip_tracking_params=self.config.strip_tracking_params)
        hosts = set(_host_keys(c.allowed_hosts, "discovery.allowed_hosts"))
        domains = frozenset(_domains(c.allowed_domains))
        include = _compile_patterns(c.include, "discovery.include")
        exclude = _compile_patterns(c.exclude, "discovery.exclude")
        self.config = c
        self._hosts = hosts | self._seed_hosts
        self._domains, self._include, self._exclude = domains, include, exclude
        self._schemes = frozenset(c.schemes)
        self._window = datetime.timedelta(days=c.calendar_window_days)

    @property
    def strip_params(self) -> frozenset[str] | None:
        """The parameters links lose in :func:`canonicalize` (None: all are kept)."""
        return self._strip

    def add_seed_hosts(self, hosts: Iterable[str]) -> None:
        """Put these host keys in scope (seeds added while running)."""
        for host in hosts:
            self._seed_hosts.add(host.lower())
            self._hosts.add(host.lower())

    def set_pages(self, pages_per_host: Mapping[str, int]) -> None:
        """Start from these page counts per host key (the store's, after a restart)."""
        self._pages.update(pages_per_host)

    def screen(self, href: str, *, base: str | None, depth: int) -> CanonicalURL | None:
        """The canonical URL of a link if it passes :meth:`check`, else None (counted).

        ``base`` is the URL of the page the link is on; ``depth`` the link's depth.
        """
        try:
            url = canonicalize(href, base=base, strip_params=self._strip)
        except InvalidURL as e:
            self._checked += 1
            self._cuts[_invalid_kind(e.reason)] += 1
            return None
        return None if self.check(url, depth=depth) else url

    def check(self, url: CanonicalURL, *, depth: int) -> str | None:
        """None when ``url``, found ``depth`` links from a seed, is crawled; else the reason.

        A cut is counted, per reason and per host; call this once per link found.
        """
        self._checked += 1
        why = self._why_cut(url, depth)
        if why is not None:
            self._cuts[why] += 1
            self._host_cuts.add((url.host_key, why))
        return why

    def admit(self, url: CanonicalURL) -> bool:
        """:meth:`accept` ``url`` unless its host or its path filled up since it was screened
        (discovery screens the links of a batch of documents before accepting any); such a
        late cut is counted as one at screening would be."""
        why = self._filled(url)
        if why is not None:
            self._cuts[why] += 1
            self._host_cuts.add((url.host_key, why))
            return False
        self.accept(url)
        return True

    def _filled(self, url: CanonicalURL) -> str | None:
        """The limit that the pages accepted so far leave ``url`` no room under, if any."""
        c = self.config
        if self._pages.get(url.host_key, 0) >= c.max_pages_per_host:
            return "host_full"
        _, query = _path_and_query(url)
        if query and self._variants.get(_path_key(url)) >= c.max_query_variants_per_path:
            return "trap_query_space"
        return None

    def accept(self, url: CanonicalURL) -> None:
        """Record ``url`` as a new page: it counts towards its host's and its path's limits."""
        self._accepted += 1
        self._pages[url.host_key] = self._pages.get(url.host_key, 0) + 1
        _, query = _path_and_query(url)
        if query:
            self._variants.add(_path_key(url))

    def statistics(self) -> FilterStatistics:
        per_host: dict[str, dict[str, int]] = {}
        for (host, reason), count in self._host_cuts.items():
            per_host.setdefault(host, {})[reason] = count
        top = heapq.nlargest(_TOP_HOSTS, per_host.items(), key=lambda kv: sum(kv[1].values()))
        limit = self.config.max_pages_per_host
        return FilterStatistics(
            checked=self._checked,
            accepted=self._accepted,
            cut=sum(self._cuts.values()),
            cuts=dict(self._cuts),
            hosts=len(self._pages),
            full_hosts=sum(1 for n in self._pages.values() if n >= limit),
            tracked_paths=len(self._variants),
            cuts_by_host={host: sum(reasons.values()) for host, reasons in top},
            cut_reasons_by_host=dict(top),
        )

    def _why_cut(self, url: CanonicalURL, depth: int) -> str | None:
        c = self.config
        if url.scheme not in self._schemes:
            return "scheme"
        if len(url.url) > c.max_url_length:
            return "too_long"
        if not self._in_scope(url):
            return "out_of_scope"
        if self._exclude and any(p.search(url.url) for p in self._exclude):
            return "excluded"
        if self._include and not any(p.search(url.url) for p in self._include):
            return "not_included"
        if depth > c.max_depth:
            return "too_deep"
        if self._pages.get(url.host_key, 0) >= c.max_pages_per_host:
            return "host_full"
        path, query = _path_and_query(url)
        segments = path.split("/")
        if len(segments) > c.max_repeated_segments + 1 and _repeats(
            segments, c.max_repeated_segments
        ):
            return "trap_repeated_segments"
        params = query.split("&") if query else []
        if len(params) > c.max_query_params:
            return "trap_query_space"
        if c.calendar_window_days and self._is_calendar(segments, params):
            return "trap_calendar"
        if params and self._variants.get(_path_key(url)) >= c.max_query_variants_per_path:
            return "trap_query_space"
        return None

    def _in_scope(self, url: CanonicalURL) -> bool:
        if url.host_key in self._hosts:
            return True
        if not self._domains:
            return False
        # Walk up the host's parents (a few labels) rather than over all allowed domains.
        name = url.host
        while True:
            if name in self._domains:
                return True
            dot = name.find(".")
            if dot < 0:
                return False
            name = name[dot + 1 :]

    def _is_calendar(self, segments: list[str], params: list[str]) -> bool:
        dates: list[tuple[datetime.date, datetime.date, bool]] = []
        _path_dates(segments, dates)
        if params:
            _query_dates(params, dates)
        if not dates:
            return False
        if len(dates) >= _MAX_DATES:
            return True
        today = self._today()
        for first, last, is_view in dates:
            if first - today > self._window:
                return True
            if is_view and today - last > self._window:
                return True
        return False


def _path_and_query(url: CanonicalURL) -> tuple[str, str]:
    rest = url.url[len(url.scheme) + 3 + len(url.host_key) :]
    path, _, query = rest.partition("?")
    return path, query


def _path_key(url: CanonicalURL) -> int:
    # A hash, not the string: a bounded table of ints costs a fraction of the URLs' memory,
    # and a rare collision only shares a variant count between two paths.
    path, _ = _path_and_query(url)
    return hash((url.host_key, path))


def _repeats(segments: list[str], limit: int) -> bool:
    seen: dict[str, int] = {}
    for segment in segments:
        if segment:
            n = seen.get(segment, 0) + 1
            if n > limit:
                return True
            seen[segment] = n
    return False


def _path_dates(segments: list[str], out: list[tuple[datetime.date, datetime.date, bool]]) -> None:
    """Dates in a path as (earliest day, latest day, is a calendar view: nothing follows)."""
    i, n = 0, len(segments)
    while i < n:
        segment = segments[i]
        if segment[:1].isdigit():
            parts = _year_month_day(segments, i)
            if parts:
                i += len(parts)
                out.append((*_date_span(parts), not any(segments[i:])))
                continue
            m = _DATE_TOKEN.match(segment)
            if m:
                is_view = m.end() == len(segment) and not any(segments[i + 1 :])
                out.append((*_date_span(_token_parts(m)), is_view))
        i += 1


def _year_month_day(segments: list[str], i: int) -> list[int]:
    """The year, month and day in ``segments`` from ``i`` on ("2031", "05", "17"), or []."""
    year = segments[i]
    following = segments[i + 1] if i + 1 < len(segments) else ""
    if _YEAR.fullmatch(year):
        if not _MONTH.fullmatch(following):
            return [int(year)]
    elif not (_ANY_YEAR.fullmatch(year) and _MONTH_2.fullmatch(following)):
        return []
    parts = [int(year), int(following)]
    if i + 2 < len(segments) and _DAY.fullmatch(segments[i + 2]):
        parts.append(int(segments[i + 2]))
    return parts


def _token_parts(m: re.Match[str]) -> list[int]:
    day = m.group(4)
    return [int(m.group(1)), int(m.group(3))] + ([int(day)] if day else [])


def _query_dates(params: list[str], out: list[tuple[datetime.date, datetime.date, bool]]) -> None:
    year = month = None
    for param in params:
        name, _, value = param.partition("=")
        if not value or not value[0].isdigit():
            continue
        name = name.lower()
        if name in _YEAR_NAMES and _ANY_YEAR.fullmatch(value):
            year = int(value)
        elif name in _MONTH_NAMES and _MONTH.fullmatch(value):
            month = int(value)
        else:
            m = _DATE_TOKEN.match(value)
            if m:
                out.append((*_date_span(_token_parts(m)), True))
    if year is not None:
        out.append((*_date_span([year] if month is None else [year, month]), True))


def _date_span(parts: list[int]) -> tuple[datetime.date, datetime.date]:
    """The first and last day of a year, a month or a day."""
    year = parts[0]
    if len(parts) == 1:
        return datetime.date(year, 1, 1), datetime.date(year, 12, 31)
    month = parts[1]
    first = datetime.date(year, month, 1)
    if len(parts) == 2:
        following = datetime.date(year + month // 12, month % 12 + 1, 1)
        return first, following - datetime.timedelta(days=1)
    day = min(parts[2], 28) if month == 2 else min(parts[2], 30 if month in (4, 6, 9, 11) else 31)
    return datetime.date(year, month, day), datetime.date(year, month, day)


def _invalid_kind(reason: str) -> str:
    for prefix, kind in _INVALID_KINDS:
        if reason.startswith(prefix):
            return kind
    return "invalid_other"


def _compile_patterns(patterns: Iterable[str], key: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ConfigError(
                f"{pattern!r} is not a valid regular expression ({e}); fix the pattern", key=key
            ) from e
    return tuple(compiled)


def _host_keys(hosts: Iterable[str], key: str) -> list[str]:
    """Host keys as canonicalize() writes them ("Bücher.example" -> "xn--bcher-kva.example").

    Port 80 or 443 written out means the scheme's default port: the plain host key.
    """
    keys = []
    for host in hosts:
        try:
            url = canonicalize(f"http://{host}/")
        except InvalidURL as e:
            raise ConfigError(f"{host!r} is not a host name: {e.reason}", key=key) from e
        if url.url != f"http://{url.host_key}/":
            raise ConfigError(
                f"{host!r} is not a host name; give a name such as example.org or example.org:8080",
                key=key,
            )
        keys.append(url.host_key if url.port not in (80, 443) else url.host)
    return keys


def _domains(domains: Iterable[str]) -> list[str]:
    """Domain names in canonical form; a leading "*." or "." is allowed and ignored."""
    key = "discovery.allowed_domains"
    names = []
    for domain in domains:
        bare = domain.removeprefix("*.").removeprefix(".")
        (name,) = _host_keys([bare], key)
        if ":" in name and not name.startswith("["):
            raise ConfigError(f"{domain!r} has a port; give the domain alone", key=key)
        names.append(name)
    return names
