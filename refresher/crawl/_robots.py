"""robots.txt parsing and matching (RFC 9309), pure: bytes and a status in, rules out.

The fetcher gets ``/robots.txt`` (following at most 5 redirects) and hands the outcome to
:func:`rules_for_response`, which applies RFC 9309 §2.3.1: a 2xx body is parsed, a 4xx means
"no robots.txt" (allow all), a 5xx or no answer at all means "disallow all until a retry
succeeds". The daemon caches the returned :class:`RobotsRules` per host, with an expiry.

Parsing follows RFC 9309 and Google's reference parser (github.com/google/robotstxt), whose
RFC test cases run against this module (``tests/data/robots_google_cases.json``):

- lines end at CR, LF or CRLF; a (partial) UTF-8 byte order mark at the start is skipped;
  ``#`` starts a comment; at most :data:`MAX_ROBOTS_BYTES` are parsed, lines are cut at
  16,663 bytes (Google's limit, so one absurd line cannot make matching slow);
- a line is ``key: value``; a missing colon is tolerated when the line is exactly two words
  ("disallow /"); keys are case-insensitive and Google's frequent typos are accepted
  ("useragent", "disalow", "site-map", …);
- a group is one or more user-agent lines followed by its members; allow, disallow and
  Crawl-delay lines are members (a user-agent line after one starts a new group), Sitemap and
  unknown lines are not (they end nothing); groups naming the same agent merge;
  the value of a user-agent line is read up to the first character outside ``[A-Za-z_-]`` and
  compared case-insensitively with our product token; if no group names us, the ``*`` groups
  apply; if none does either, everything is allowed;
- the longest matching pattern wins (length in octets after normalisation), allow wins ties;
  ``*`` matches any run of characters, ``$`` at the end of a pattern anchors it;
- patterns and URLs are normalised the same way before comparison: octets outside ASCII, controls,
  space and the characters never valid raw in a URL (``"<>\\^`{|}``, a ``%`` not starting an
  escape) are percent-encoded, escapes get upper-case hex. Escapes are never decoded, so
  ``%2F`` stays different from ``/`` and ``%62`` from ``b``, as RFC 9309 and Google require.

Where we differ from Google's matcher, on purpose: we percent-encode the URL as well (Google
leaves that to its caller, and refresher's canonical URLs keep non-ASCII paths as given, so a
``Disallow: /ツ`` would otherwise not stop a fetch of ``/ツ``); :meth:`RobotsRules.parse` takes a
full User-Agent header and obeys its product token; ``Allow: /dir/index.html`` does not also
allow ``/dir/`` (a Google extension RFC 9309 does not have; we stay on the polite side).
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "MAX_ROBOTS_BYTES",
    "RobotsRule",
    "RobotsRules",
    "is_valid_product_token",
    "product_token",
    "rules_for_response",
]

MAX_ROBOTS_BYTES = 500 * 1024
"""Bytes of a robots.txt body that are parsed; the rest is ignored (RFC 9309 §2.5)."""

# Google's line buffer holds 2083 * 8 bytes including the terminating NUL, and the last writable
# slot is kept for it, so 2083 * 8 - 1 bytes of a line survive.
_MAX_LINE_BYTES = 2083 * 8 - 1

_BOM = b"\xef\xbb\xbf"
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_WHITESPACE = b" \t"
_TOKEN = re.compile(r"[A-Za-z_-]*")
_TOKEN_BYTES = re.compile(rb"[A-Za-z_-]*")
_DELAY = re.compile(rb"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")

# Characters that stay as they are: unreserved, reserved (they carry meaning, so "?" and "%3F"
# must stay different), and "#" (gone from both sides by the time we compare anyway).
_SAFE = r"A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]#"
_NEEDS_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}|[^" + _SAFE.encode() + rb"]")
_ALREADY_CLEAN = re.compile(r"(?:[" + _SAFE + r"]|%[0-9A-F]{2})*")

_Kind = Literal["user-agent", "allow", "disallow", "sitemap", "crawl-delay", "unknown"]
_USER_AGENT_KEYS = (b"user-agent", b"useragent", b"user agent")
_DISALLOW_KEYS = (b"disallow", b"dissallow", b"dissalow", b"disalow", b"diasllow", b"disallaw")
_SITEMAP_KEYS = (b"sitemap", b"site-map")
_CRAWL_DELAY_KEYS = frozenset((b"crawl-delay", b"crawl delay", b"crawldelay"))


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsRule:
    """One allow or disallow line of our group. ``pattern`` is normalised, with ``*``/``$``."""

    allow: bool
    pattern: str
    # The pattern cut at its "*"s (trailing "$" removed), so matching needs no parsing.
    _parts: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _anchored: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        anchored = self.pattern.endswith("$")
        body = self.pattern[:-1] if anchored else self.pattern
        object.__setattr__(self, "_anchored", anchored)
        object.__setattr__(self, "_parts", tuple(body.split("*")))

    def matches(self, path: str) -> bool:
        """Whether the pattern matches ``path`` (normalised path, params and query)."""
        parts = self._parts
        first = parts[0]
        if len(parts) == 1:
            return path == first if self._anchored else path.startswith(first)
        if not path.startswith(first):
            return False
        # Taking the leftmost occurrence of each literal run is optimal for "*"-only globs: it
        # leaves the most room for the runs after it.
        pos = len(first)
        for part in parts[1:-1]:
            found = path.find(part, pos)
            if found < 0:
                return False
            pos = found + len(part)
        last = parts[-1]
        if self._anchored:
            return len(path) - len(last) >= pos and path.endswith(last)
        return path.find(last, pos) >= 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsRules:
    """What one host's robots.txt says to our user agent. Immutable; share it freely.

    ``rules`` are our group's lines, most specific first (longest pattern; allow before
    disallow at equal length), so the first match decides. ``crawl_delay`` is in seconds, for
    our group (or the ``*`` group when none names us); ``None`` when absent or invalid.
    ``sitemaps`` are the absolute http(s) URLs of the Sitemap lines, in order, without repeats.
    """

    rules: tuple[RobotsRule, ...] = ()
    crawl_delay: float | None = None
    sitemaps: tuple[str, ...] = ()

    @classmethod
    def allow_all(cls) -> RobotsRules:
        """Rules that allow every URL (no robots.txt: 4xx)."""
        return _ALLOW_ALL

    @classmethod
    def disallow_all(cls) -> RobotsRules:
        """Rules that allow only ``/robots.txt`` (server error or unreachable)."""
        return _DISALLOW_ALL

    @classmethod
    def parse(cls, body: bytes, user_agent: str) -> RobotsRules:
        """Parse a robots.txt body for ``user_agent`` (a full User-Agent header or a token).

        Only the first :data:`MAX_ROBOTS_BYTES` are read; a line cut by that limit is dropped,
        since a truncated pattern is a different (shorter, broader) rule. Never raises on
        malformed input: what cannot be read is ignored, as RFC 9309 asks.
        """
        if len(body) > MAX_ROBOTS_BYTES:
            body = body[:MAX_ROBOTS_BYTES]
            last_break = max(body.rfind(b"\n"), body.rfind(b"\r"))
            body = body[: last_break + 1]
        return _build(body, product_token(user_agent).lower())

    def allowed(self, url: str) -> bool:
        """Whether we may fetch ``url``: an absolute URL, or a path with optional query.

        ``/robots.txt`` itself is always allowed.
        """
        if not self.rules:  # no robots.txt (4xx), or one with no line for us: the common case
            return True
        path = _escape(_path_params_query(url))
        if path.partition("?")[0] == "/robots.txt":
            return True
        for rule in self.rules:
            if rule.matches(path):
                return rule.allow
        return True


_ALLOW_ALL = RobotsRules()
_DISALLOW_ALL = RobotsRules(rules=(RobotsRule(allow=False, pattern="/"),))


def product_token(user_agent: str) -> str:
    """The product token of a User-Agent header: "refresher/0.1 (+https://x)" -> "refresher".

    That is the leading run of ``[A-Za-z_-]`` (RFC 9309 §2.2.1); empty when there is none, in
    which case no group names us and only ``*`` groups apply.
    """
    match = _TOKEN.match(user_agent.strip())
    return match.group() if match else ""


def is_valid_product_token(token: str) -> bool:
    """Whether ``token`` is a product token a robots.txt can name: non-empty ``[A-Za-z_-]+``."""
    return bool(token) and product_token(token) == token


def rules_for_response(status: int | None, body: bytes, user_agent: str) -> RobotsRules:
    """The rules implied by fetching ``/robots.txt`` (RFC 9309 §2.3.1).

    ``status`` is the final HTTP status after redirects, or ``None`` when there was no answer
    (DNS or connect failure, timeout, more than 5 redirects). 2xx: the body is parsed. 4xx: no
    robots.txt, everything allowed; except 429, which says "too many requests" and is treated
    as a server error, as Google does, so a rate-limiting host is left alone until a retry
    succeeds. 5xx, ``None`` and anything else (a 3xx left over, 1xx): disallow all.
    """
    if status is None:
        return _DISALLOW_ALL
    if 200 <= status <= 299:
        return RobotsRules.parse(body, user_agent)
    if 400 <= status <= 499 and status != 429:
        return _ALLOW_ALL
    return _DISALLOW_ALL


def _build(body: bytes, token: str) -> RobotsRules:
    """Resolve the groups that apply to ``token`` (lower case) into :class:`RobotsRules`."""
    # Rules and delays collected for groups naming us ("specific") and for "*" groups ("global");
    # a group naming both feeds only the specific side, as in Google's matcher.
    specific: list[RobotsRule] = []
    global_: list[RobotsRule] = []
    delays: dict[bool, float] = {}
    ever_specific = False
    in_specific = in_global = False
    members_seen = False  # a member line (rule, Crawl-delay) since the last user-agent line
    sitemaps: dict[str, None] = {}

    for _line, kind, value in _directives(body):
        if kind == "user-agent":
            if members_seen:
                in_specific = in_global = members_seen = False
            if value[:1] == b"*" and (len(value) == 1 or value[1:2].isspace()):
                in_global = True
            else:
                name = _TOKEN_BYTES.match(value)
                agent = name.group().decode("ascii").lower() if name else ""
                if agent and agent == token:
                    in_specific = ever_specific = True
        elif kind in ("allow", "disallow", "crawl-delay"):
            if not (in_specific or in_global):
                continue  # outside any group, or in a group for other agents
            members_seen = True
            if kind == "crawl-delay":
                delay = _parse_delay(value)
                if delay is not None:
                    # Several delays for one side (merged groups): the largest is the polite one.
                    delays[in_specific] = max(delay, delays.get(in_specific, 0.0))
                continue
            pattern = _escape_pattern(value)
            if pattern:  # an empty pattern matches with priority 0: it never decides
                rule = RobotsRule(allow=kind == "allow", pattern=pattern)
                (specific if in_specific else global_).append(rule)
        elif kind == "sitemap":
            url = _sitemap_url(value)
            if url is not None:
                sitemaps[url] = None

    chosen = specific if ever_specific else global_
    ordered = sorted(dict.fromkeys(chosen), key=lambda r: (-len(r.pattern), not r.allow))
    return RobotsRules(
        rules=tuple(ordered),
        crawl_delay=delays.get(ever_specific),
        sitemaps=tuple(sitemaps),
    )


def _directives(body: bytes) -> Iterator[tuple[int, _Kind, bytes]]:
    """The directive lines of ``body`` as (line number from 1, kind, raw value)."""
    bom = 0
    while bom < len(_BOM) and body[bom : bom + 1] == _BOM[bom : bom + 1]:
        bom += 1
    for number, line in enumerate(_LINE_BREAK.split(body[bom:]), start=1):
        parsed = _key_value(line[:_MAX_LINE_BYTES])
        if parsed is not None:
            yield number, _kind(parsed[0]), parsed[1]


def _key_value(line: bytes) -> tuple[bytes, bytes] | None:
    """Split a line into (key, value), or ``None`` for blank, comment or unreadable lines."""
    line = line.partition(b"#")[0].strip()
    if not line:
        return None
    key, colon, value = line.partition(b":")
    if not colon:
        # "disallow /": a missing colon is accepted when the line is exactly two words.
        gaps = [p for p in (line.find(b" "), line.find(b"\t")) if p >= 0]
        if not gaps:
            return None
        key, value = line[: min(gaps)], line[min(gaps) :].lstrip(_WHITESPACE)
        if b" " in value or b"\t" in value:
            return None
    key = key.strip()
    if not key:
        return None
    return key, value.strip()


def _kind(key: bytes) -> _Kind:
    # Google matches key prefixes, so "user-agents" or "disallowed" count as well.
    lowered = key.lower()
    if lowered.startswith(_USER_AGENT_KEYS):
        return "user-agent"
    if lowered.startswith(b"allow"):
        return "allow"
    if lowered.startswith(_DISALLOW_KEYS):
        return "disallow"
    if lowered.startswith(_SITEMAP_KEYS):
        return "sitemap"
    if lowered in _CRAWL_DELAY_KEYS:
        return "crawl-delay"
    return "unknown"


def _escape_bytes(raw: bytes) -> str:
    def one(match: re.Match[bytes]) -> bytes:
        found = match.group()
        return found.upper() if len(found) == 3 else b"%%%02X" % found[0]

    return _NEEDS_ESCAPE.sub(one, raw).decode("ascii")


def _escape_pattern(raw: bytes) -> str:
    """A rule's value normalised for comparison (see the module docstring)."""
    return _escape_bytes(raw)


def _escape(text: str) -> str:
    """A URL path normalised the same way as patterns."""
    if _ALREADY_CLEAN.fullmatch(text):
        return text
    return _escape_bytes(text.encode("utf-8", "surrogatepass"))


def _path_params_query(url: str) -> str:
    """The path, params and query of ``url`` (scheme, authority and fragment removed).

    Always starts with ``/``; ``/`` when the URL has no path. Follows Google's reading: text
    before the first ``/``, ``?`` or ``;`` is an authority, even without a scheme.
    """
    start = 2 if url.startswith("//") else 0
    early_path = _find_first_of(url, "/?;", start)
    protocol_end = url.find("://", start)
    if protocol_end < 0 or (0 <= early_path < protocol_end):
        protocol_end = start
    else:
        protocol_end += 3
    path_start = _find_first_of(url, "/?;", protocol_end)
    if path_start < 0:
        return "/"
    hash_pos = url.find("#", start)
    if 0 <= hash_pos < path_start:
        return "/"
    path = url[path_start : hash_pos if hash_pos >= 0 else len(url)]
    return path if path.startswith("/") else "/" + path


def _find_first_of(text: str, chars: str, start: int) -> int:
    positions = [p for p in (text.find(c, start) for c in chars) if p >= 0]
    return min(positions) if positions else -1


def _parse_delay(value: bytes) -> float | None:
    """Seconds from a Crawl-delay value; ``None`` unless it is a plain non-negative number."""
    if not _DELAY.fullmatch(value):
        return None
    delay = float(value)
    return delay if math.isfinite(delay) else None


def _sitemap_url(value: bytes) -> str | None:
    """The Sitemap value if it is an absolute http(s) URL, else ``None``."""
    text = value.decode("utf-8", "replace")
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return None
    return text
