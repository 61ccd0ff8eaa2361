"""URL checks and the canonical form used as a page's identity.

Parsing follows the WHATWG URL Standard (the rules browsers use to resolve links), done by
ada-url. A URL is crawlable when it is http(s), has a host that DNS can hold and carries no
credentials. Its canonical form is the WHATWG serialisation plus crawler normalisation:

* scheme and host lowercase, IDNA host names as punycode, a trailing dot in the host dropped;
* the default port dropped, the fragment dropped, an empty query (``?`` alone) dropped;
* percent-encoding normalised: hex digits uppercase, escapes of unreserved characters
  (``A-Z a-z 0-9 - . _ ~``) decoded;
* optionally, known session and tracking parameters removed from the query and from path
  parameters (``;jsessionid=…``): pass ``strip_params`` (e.g. :data:`TRACKING_PARAMS`).

The politeness unit ("host key") is ``host`` or ``host:port`` when the port is not the
scheme's default. Every refusal is an :class:`InvalidURL` whose reason says what is wrong and
what to do; operators see these reasons for seeds.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import ada_url

from refresher._errors import InvalidURL

__all__ = ["MAX_URL_LENGTH", "TRACKING_PARAMS", "CanonicalURL", "canonicalize"]

MAX_URL_LENGTH = 2048
"""Longest URL accepted, in characters, both as given and in canonical form."""

TRACKING_PARAMS: frozenset[str] = frozenset(
    {
        # Campaign and click trackers: they name where a visitor came from, never what the
        # page is, so links that differ only in them are the same page.
        "utm_*",
        "gclid",
        "gclsrc",
        "dclid",
        "gbraid",
        "wbraid",
        "fbclid",
        "msclkid",
        "yclid",
        "twclid",
        "ttclid",
        "igshid",
        "li_fat_id",
        "mc_cid",
        "mc_eid",
        "mkt_tok",
        "_ga",
        "_gl",
        "_hsenc",
        "_hsmi",
        "hsctatracking",
        "oly_anon_id",
        "oly_enc_id",
        "vero_id",
        "vero_conv",
        "rb_clickid",
        "s_cid",
        # Session identifiers put into URLs by servers when cookies are off: each visit mints
        # new ones, which turns one page into endlessly many URLs.
        "sessionid",
        "session_id",
        "sid",
        "phpsessid",
        "jsessionid",
        "aspsessionid",
        "cfid",
        "cftoken",
    }
)
"""Session and tracking parameter names to strip; a trailing ``*`` matches a prefix.

Names are compared case-insensitively, in the query (``?utm_source=x``) and in path
parameters (``/a;jsessionid=x``)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
# HTML strips ASCII whitespace around an href and WHATWG removes tabs and newlines anywhere
# (hrefs wrapped over lines are common and meant). Any other control character, even at the
# ends where WHATWG would strip it, and lone surrogates only come from broken pages or
# binary junk: refused, so that they are counted rather than guessed at.
_EDGE_JUNK = " \t\n\x0c\r"
_REFUSED_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
_IPV4 = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")
_MAX_HOST_LENGTH = 253  # DNS: a name of 255 octets on the wire is 253 characters dotted
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PERCENT_CANONICAL = {
    f"%{b:02X}": (chr(b) if chr(b) in _UNRESERVED else f"%{b:02X}") for b in range(256)
}


@dataclass(frozen=True, slots=True)
class CanonicalURL:
    url: str
    scheme: str
    host: str  # host name (lowercase, ASCII) or IP literal (IPv6 without brackets)
    port: int  # effective port
    host_key: str  # "host" or "host:port" when not the scheme's default


def canonicalize(
    url: str, *, base: str | None = None, strip_params: frozenset[str] | None = None
) -> CanonicalURL:
    """The canonical form of ``url``, or :class:`InvalidURL` saying what is wrong.

    ``base`` resolves a relative ``url`` (a link on the page at ``base``). ``strip_params``
    names query and path parameters to remove (see :data:`TRACKING_PARAMS`); None keeps all.
    """
    if not isinstance(url, str):
        raise InvalidURL(str(url), "not text; give an absolute http:// or https:// URL")
    if base is not None and url.startswith(_ABSOLUTE):
        # An absolute URL does not depend on its page (WHATWG ignores the base after
        # "http://"): the links a site repeats on every page are canonicalised once.
        _refuse_bad_characters(base, base)
        return _canonical_absolute(url, strip_params)
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(
            _shorten(url), f"longer than {MAX_URL_LENGTH} characters; shorten it or skip it"
        )
    text = url.strip(_EDGE_JUNK)
    if not text and base is None:
        raise InvalidURL(url, "empty URL; give an absolute http:// or https:// URL")
    _refuse_bad_characters(url, text)
    if base is not None:
        _refuse_bad_characters(base, base)
    try:
        href = ada_url.URL(text, base).href
    except ValueError as e:
        raise InvalidURL(url, _why_unparsable(text, base)) from e
    return _canonical(url, href, strip_params)


_ABSOLUTE = ("http://", "https://")


@functools.lru_cache(maxsize=1 << 14)
def _canonical_absolute(url: str, strip_params: frozenset[str] | None) -> CanonicalURL:
    return canonicalize(url, strip_params=strip_params)


def _shorten(url: str) -> str:
    return url[:80] + "…"


def _refuse_bad_characters(url: str, text: str) -> None:
    bad = _REFUSED_CHARS.search(text)
    if bad is None:
        return
    char = bad.group()
    if "\ud800" <= char <= "\udfff":
        raise InvalidURL(
            url,
            f"contains a lone surrogate (U+{ord(char):04X}), which is not valid Unicode; "
            "the text it came from was decoded wrongly, fix or skip it",
        )
    raise InvalidURL(
        url,
        f"contains the control character U+{ord(char):04X}; percent-encode it or remove it",
    )


def _canonical(url: str, href: str, strip_params: frozenset[str] | None) -> CanonicalURL:
    # ``href`` is a WHATWG serialisation, so its parts sit in fixed places: "scheme://", then
    # the authority up to the first "/" (userinfo percent-encodes "/" and "@", a host holds
    # neither), the path up to "?" or "#", the query up to "#". Splitting it here costs far
    # less than asking the parser for each component.
    scheme, sep, rest = href.partition("://")
    if scheme not in _DEFAULT_PORTS or not sep:
        shown = scheme if sep else href.partition(":")[0]
        raise InvalidURL(url, f"scheme {shown!r} is not crawled; use http:// or https://")
    slash = rest.find("/")
    authority, rest = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    rest = rest.partition("#")[0]
    path, _, query = rest.partition("?")
    _, at, hostport = authority.rpartition("@")
    if at:
        raise InvalidURL(url, "contains user credentials; remove them, refresher does not send any")
    host, port_text = _split_host_port(hostport)
    host = _checked_host(url, host)
    default_port = _DEFAULT_PORTS[scheme]
    port = int(port_text) if port_text else default_port
    if port == 0:
        raise InvalidURL(url, "port 0 cannot be connected to; use a port from 1 to 65535")
    host_in_url = f"[{host}]" if ":" in host else host
    host_key = host_in_url if port == default_port else f"{host_in_url}:{port}"
    if "%" in path:
        path = _normalize_percent(path)
    if query and "%" in query:
        query = _normalize_percent(query)
    if strip_params:
        if ";" in path:
            path = _strip_path_params(path, strip_params)
        if query:
            query = _strip_query_params(query, strip_params)
    canonical = f"{scheme}://{host_key}{path}?{query}" if query else f"{scheme}://{host_key}{path}"
    if len(canonical) > MAX_URL_LENGTH:
        raise InvalidURL(
            _shorten(url),
            f"longer than {MAX_URL_LENGTH} characters once percent-encoded; shorten it or skip it",
        )
    return CanonicalURL(url=canonical, scheme=scheme, host=host, port=port, host_key=host_key)


def _split_host_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        end = hostport.index("]")
        return hostport[1:end], hostport[end + 2 :]
    host, _, port = hostport.partition(":")
    return host, port


def _checked_host(url: str, host: str) -> str:
    """``host`` as WHATWG serialised it, held to what DNS can resolve."""
    name = _dns_host(host)
    if name is None:
        raise InvalidURL(
            url,
            f"host {host!r} is not a valid domain name or IP address (labels are letters, "
            "digits, '_' and inner '-', 1 to 63 characters); check the host",
        )
    return name


@functools.lru_cache(maxsize=4096)  # links mostly stay on a few hosts: most calls are hits
def _dns_host(host: str) -> str | None:
    if ":" in host or _IPV4.match(host):
        return host  # an IP literal, already checked and normalised by the parser
    name = host[:-1] if host.endswith(".") else host  # the root label: same name in DNS
    if len(name) > _MAX_HOST_LENGTH or not _DNS_NAME.fullmatch(name):
        return None
    return name


def _normalize_percent(part: str) -> str:
    return _PERCENT.sub(lambda m: _PERCENT_CANONICAL[m.group().upper()], part)


@functools.lru_cache(maxsize=16)
def _param_matcher(strip_params: frozenset[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    exact = frozenset(p.lower() for p in strip_params if not p.endswith("*"))
    prefixes = tuple(p[:-1].lower() for p in strip_params if p.endswith("*"))
    return exact, prefixes


def _is_stripped(param: str, strip_params: frozenset[str]) -> bool:
    exact, prefixes = _param_matcher(strip_params)
    name = param.partition("=")[0].lower()
    return name in exact or (bool(prefixes) and name.startswith(prefixes))


def _strip_query_params(query: str, strip_params: frozenset[str]) -> str:
    kept = [p for p in query.split("&") if p and not _is_stripped(p, strip_params)]
    return "&".join(kept)


def _strip_path_params(path: str, strip_params: frozenset[str]) -> str:
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if ";" in segment:
            head, *params = segment.split(";")
            kept = [p for p in params if not _is_stripped(p, strip_params)]
            segments[i] = ";".join([head, *kept])
    return "/".join(segments)


def _why_unparsable(text: str, base: str | None) -> str:
    """A reason, for operators, why the WHATWG parser refused ``text``."""
    scheme_match = _SCHEME.match(text)
    if scheme_match is None:
        if base is None:
            return (
                "scheme '(none)' is not crawled; give an absolute URL starting with "
                "http:// or https://"
            )
        if not ada_url.URL.can_parse(base):
            return f"the base URL {base!r} cannot be parsed; resolve links against a valid URL"
        return "cannot be resolved against the base URL; check it for typos"
    scheme = scheme_match.group(1).lower()
    if scheme not in _DEFAULT_PORTS:
        return f"scheme {scheme!r} is not crawled; use http:// or https://"
    authority = re.split(r"[/\\?#]", text[scheme_match.end() :].lstrip("/\\"), maxsplit=1)[0]
    hostport = authority.rpartition("@")[2]
    if not hostport:
        return "has no host; give an absolute URL such as https://example.org/"
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return "the IPv6 address is not closed with ']'; check the host and port"
        host, port = hostport[1:end], hostport[end + 1 :].removeprefix(":")
        if not _port_problem(port):
            return f"host [{host}] is not a valid IPv6 address; check the host and port"
    else:
        host, _, port = hostport.partition(":")
    if problem := _port_problem(port):
        return problem
    if any(c.isspace() for c in host):
        return f"host {host!r} contains spaces or control characters; remove them"
    if not host.isascii() or "xn--" in host.lower() or "%" in host:
        return (
            f"host {host!r} is not a valid internationalised domain name (IDNA rules); "
            "check its spelling"
        )
    if _IPV4.match(host) or host.replace(".", "").isdigit():
        return f"host {host!r} is not a valid IPv4 address; check the host and port"
    return f"host {host!r} is not a valid host name; check the host and port"


def _port_problem(port: str) -> str | None:
    if not port:
        return None
    if not port.isascii() or not port.isdigit():
        return f"port {port!r} is not a number; check the host and port"
    if int(port) > 65535:
        return f"port {port} is above 65535; check the host and port"
    return None
