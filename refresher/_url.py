"""URL checks and the minimal canonical form used as a page's identity.

A URL is crawlable when it is absolute http(s) with a host. Its canonical form lowercases scheme
and host, encodes IDNA host names, drops the default port and the fragment, and gives an empty
path as ``/``. The politeness unit ("host key") is ``host`` or ``host:port``.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from ._errors import InvalidURL

__all__ = ["MAX_URL_LENGTH", "CanonicalURL", "canonicalize"]

MAX_URL_LENGTH = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]")
_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


@dataclass(frozen=True, slots=True)
class CanonicalURL:
    url: str
    scheme: str
    host: str  # host name (lowercase, ASCII) or IP literal
    port: int  # effective port
    host_key: str  # "host" or "host:port" when not the scheme's default


def canonicalize(url: str) -> CanonicalURL:
    """The canonical form of ``url``, or :class:`InvalidURL` saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise InvalidURL(str(url), "empty URL; give an absolute http:// or https:// URL")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(url[:80] + "…", f"longer than {MAX_URL_LENGTH} characters; shorten it")
    if _BAD_CHARS.search(url.strip()):
        raise InvalidURL(url, "contains spaces or control characters; percent-encode them")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise InvalidURL(url, f"cannot be parsed ({e}); check the host and port") from e
    if port == 0:  # urlsplit accepts it, but nothing can be reached there
        raise InvalidURL(url, "port 0 cannot be connected to; use a port from 1 to 65535")
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidURL(
            url, f"scheme {scheme or '(none)'!r} is not crawled; use http:// or https://"
        )
    raw_host = parts.hostname
    if not raw_host:
        raise InvalidURL(url, "has no host; give an absolute URL such as https://example.org/")
    host = _ascii_host(url, raw_host)
    effective_port = port if port is not None else _DEFAULT_PORTS[scheme]
    show_port = effective_port != _DEFAULT_PORTS[scheme]
    host_in_url = f"[{host}]" if ":" in host else host
    netloc = f"{host_in_url}:{effective_port}" if show_port else host_in_url
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        raise InvalidURL(url, "contains user credentials; refresher does not send them")
    path = parts.path or "/"
    canonical = urllib.parse.urlunsplit((scheme, netloc, path, parts.query, ""))
    return CanonicalURL(
        url=canonical, scheme=scheme, host=host, port=effective_port, host_key=netloc
    )


def _ascii_host(url: str, host: str) -> str:
    if ":" in host:  # IPv6 literal, already validated by urlsplit
        return host.lower()
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError as e:
        raise InvalidURL(url, f"host {host!r} is not a valid domain name ({e})") from e
    ascii_host = ascii_host.rstrip(".")
    labels = ascii_host.split(".")
    if not ascii_host or not all(_HOST_LABEL.match(label) for label in labels):
        raise InvalidURL(url, f"host {host!r} is not a valid domain name or IP address")
    return ascii_host
