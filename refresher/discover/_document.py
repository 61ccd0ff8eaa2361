"""What the processing modules exchange: the fetched :class:`Document`, the :class:`Link` and
:class:`Extracted` they give back, the :class:`Processor` interface, and the one check that
turns an attribute value into a crawlable absolute URL (shared by HTML and sitemaps)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urljoin, urlsplit

from refresher._errors import InvalidURL
from refresher.discover._url import canonicalize

__all__ = ["Document", "Extracted", "Link", "Processor"]

CHUNK = 64 * 1024  # bytes decoded or fed per step: bounds every transient copy


@dataclass(frozen=True, slots=True, kw_only=True)
class Document:
    """A fetched document. ``url`` is the absolute URL the body finally came from (after
    redirects); ``content_type`` is the raw Content-Type header; ``robots_tag`` the raw
    X-Robots-Tag header, if any (several headers joined with ", ")."""

    url: str
    content_type: str | None
    body: bytes
    robots_tag: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """An outgoing link: absolute http(s), fragment dropped, not yet canonicalised.

    ``kind`` says where it came from: "a", "area", "link", "frame", "iframe", "img", "script",
    "redirect" (meta refresh), "url" (a sitemap's page entry) or "sitemap" (a sitemap index's
    entry). ``nofollow`` is rel=nofollow on the element (on every element that gave this URL).
    """

    url: str
    kind: str
    nofollow: bool = False


def frozen_counts(counts: Mapping[str, int] | None = None) -> Mapping[str, int]:
    return MappingProxyType(dict(counts or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Extracted:
    """What processing one document found.

    ``links`` are unique, in document order, at most the processor's ``max_links``.
    ``canonical`` is rel=canonical, recorded and not followed. ``noindex``/``nofollow`` come
    from meta robots and X-Robots-Tag. ``lastmod`` holds sitemap ``(url, Unix seconds UTC)``
    pairs given to the second, each a change observation of its page; ``coarse_lastmod`` those
    given more coarsely (``YYYY-MM-DD``, ``YYYY-MM``, ``YYYY``, or ``Thh:mm`` without seconds;
    the start of what they name), which the store keeps as the page's ``sitemap_lastmod`` and
    reads as no observation. The store's change checks compare a lastmod with fetch times to
    within :data:`refresher.store._timeline.TOLERANCE` (1 s): a lastmod cut to its day, or
    minute, reads a change after a fetch in the same day (minute) as none, and fails an honest
    host's trust test when the fetch before a change lies in the change's day (minute); one
    failure distrusts the host's sitemaps for good. ``fingerprint`` is the 64-bit
    :func:`simhash` of the visible text (None without text). ``skipped`` counts what was left
    out or tolerated, by reason: "too_many_links", "too_long", "control_chars", "scheme",
    "idna", "bad_url", "self" (empty or fragment-only href), "charset", "parse_error",
    "too_deep", "too_large", "gzip", "lastmod", "entity",
    "not_sitemap", "processor_error", "processor_crashed" (the parse process died).
    """

    links: tuple[Link, ...] = ()
    canonical: str | None = None
    noindex: bool = False
    nofollow: bool = False
    lastmod: tuple[tuple[str, float], ...] = ()
    coarse_lastmod: tuple[tuple[str, float], ...] = ()
    fingerprint: int | None = None
    skipped: Mapping[str, int] = field(default_factory=frozen_counts, hash=False)

    def __post_init__(self) -> None:
        # Whatever a third-party processor passes, the result is immutable.
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "lastmod", tuple(self.lastmod))
        object.__setattr__(self, "coarse_lastmod", tuple(self.coarse_lastmod))
        if not isinstance(self.skipped, MappingProxyType):
            object.__setattr__(self, "skipped", frozen_counts(self.skipped))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # For the parse processes: a read-only mapping does not pickle; a dict does. The
        # links go as plain tuples: unpickling a Link (its dataclass __setstate__) took
        # twice as long as building it again (0.14 against 0.07 ms for 109 links).
        return _extracted, (
            tuple((link.url, link.kind, link.nofollow) for link in self.links),
            self.canonical,
            self.noindex,
            self.nofollow,
            self.lastmod,
            self.coarse_lastmod,
            self.fingerprint,
            dict(self.skipped),
        )

    def follow(self) -> tuple[Link, ...]:
        """The links a polite crawler may follow: none under meta robots nofollow, else those
        without rel=nofollow."""
        if self.nofollow:
            return ()
        return tuple(link for link in self.links if not link.nofollow)


def _extracted(
    links: tuple[tuple[str, str, bool], ...],
    canonical: str | None,
    noindex: bool,
    nofollow: bool,
    lastmod: tuple[tuple[str, float], ...],
    coarse_lastmod: tuple[tuple[str, float], ...],
    fingerprint: int | None,
    skipped: dict[str, int],
) -> Extracted:
    return Extracted(
        links=tuple(Link(url=url, kind=kind, nofollow=no) for url, kind, no in links),
        canonical=canonical,
        noindex=noindex,
        nofollow=nofollow,
        lastmod=lastmod,
        coarse_lastmod=coarse_lastmod,
        fingerprint=fingerprint,
        skipped=skipped,
    )


@runtime_checkable
class Processor(Protocol):
    """A processing module: turns a document of one of ``mime_types`` into an
    :class:`Extracted`. ``process`` must not raise on bad input; count it in ``skipped``."""

    # Read-only members, so a plain class attribute such as ``mime_types = ("text/csv",)``
    # satisfies the protocol.
    @property
    def name(self) -> str: ...

    @property
    def mime_types(self) -> tuple[str, ...]: ...

    def process(self, doc: Document) -> Extracted: ...


# --------------------------------------------------------------------------- URL checks


class Skip(Exception):
    """A link left out; ``reason`` is the key counted in :attr:`Extracted.skipped`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_EDGE = "".join(map(chr, range(0x21)))  # C0 controls and space, stripped at both ends (WHATWG)
_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")  # removed anywhere in a URL (WHATWG)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_HOST_CHARS = re.compile(r"[a-z0-9_.\-]+")
_CRAWLED_SCHEMES = ("http", "https")  # a link with another scheme is skipped ("scheme")
_HTTP_AUTHORITY = re.compile(r"(https?)://([^/?#]*)", re.IGNORECASE)


def resolve(raw: str, base: str, max_length: int) -> str:
    """``raw`` (an attribute value) made absolute against ``base``, fragment dropped;
    raises :class:`Skip` when it is not a crawlable http(s) URL."""
    url, reason = verdict(raw, base, max_length)
    if reason is not None:
        raise Skip(reason)
    return url


_TOO_LONG = ("", "too_long")


def verdict(raw: str, base: str, max_length: int) -> tuple[str, str | None]:
    """:func:`resolve` without raising: (URL, None), or ("", the reason it is skipped)."""
    if len(raw) > max_length:  # first, so a 10 kB URL costs nothing more
        return _TOO_LONG
    # Only a reference that starts with "?" depends on more of the base than its directory;
    # keyed by the directory, and without the fragment (dropped anyway; "#" stays so edge
    # stripping is unchanged), the verdicts of a site's navigation links are computed once.
    head, mark, fragment = raw.partition("#")
    if mark and fragment and not _CONTROL.search(fragment):
        raw = head + mark
    if "?" in raw and raw.strip(_EDGE).translate(_TAB_NEWLINE).startswith("?"):
        return _verdict(raw, base, max_length)
    site = _site(base)
    if site is None:
        return _verdict(raw, _directory(base), max_length)
    origin, scheme, path, refusal, anywhere = site
    rest, reason = _relative(raw, scheme, path)
    if reason is None:
        url = origin + rest
        if len(url) > max_length:
            return _TOO_LONG
        return (url, None) if refusal is None else ("", refusal)
    if reason is _OWN_HOST:  # the same on every host: judged against a placeholder one
        return _verdict(raw, anywhere, max_length)
    if reason is _SCHEME_ONLY:  # "http:page.html", relative after all: rare
        return _verdict(raw, _directory(base), max_length)
    return "", reason


@lru_cache(maxsize=1 << 14)
def _verdict(raw: str, base: str, max_length: int) -> tuple[str, str | None]:
    """(URL, None) or ("", the reason it is skipped): :func:`resolve`, without raising."""
    try:
        return _resolved(raw, base, max_length), None
    except Skip as e:
        return "", e.reason


def _screened(raw: str) -> tuple[str, str | None]:
    """``raw`` with its edges stripped and tabs and newlines removed, as URL parsers read it:
    (the text, None), or ("", why no URL comes of it: "self" or "control_chars")."""
    text = raw.strip(_EDGE).translate(_TAB_NEWLINE)
    if not text or text.startswith("#"):
        return "", "self"
    if _CONTROL.search(text):
        return "", "control_chars"
    return text, None


def _resolved(raw: str, base: str, max_length: int) -> str:
    text, reason = _screened(raw)
    if reason is not None:
        raise Skip(reason)
    scheme = _SCHEME.match(text)
    if scheme and scheme.group()[:-1].lower() not in _CRAWLED_SCHEMES:
        raise Skip("scheme")
    # Browsers percent-encode spaces in paths; in a host the encoded space fails the host test.
    text = text.replace(" ", "%20")
    try:
        if "/." in text or not text.startswith(("/", "http://", "https://")) or text[:2] == "//":
            ref = text.partition("#")[0]
            url = _joined(base if ref[0] == "?" else _directory(base), ref)
        elif text[0] == "/":  # the usual href, and urljoin is slow: the base's origin + path
            url = _origin(base) + text.partition("#")[0]
        else:  # absolute, without dot segments: nothing to resolve
            url = text.partition("#")[0]
    except ValueError as e:
        raise Skip("bad_url") from e
    authority = _HTTP_AUTHORITY.match(url)
    if authority is None:
        raise Skip("bad_url" if url[:5].lower() in ("http:", "https") else "scheme")
    if len(url) > max_length:
        raise Skip("too_long")
    reason = _netloc_refusal(authority.group(1).lower(), authority.group(2))
    if reason is not None:
        raise Skip(reason)
    return url


# A relative reference without a scheme or host ("a.html", "../b/", "/c") resolves to the
# base's origin followed by a path that depends on the base's scheme and directory path
# only, never on its host: the sites of a crawl that share their layout (mirrors, one
# software's sites, the hosts of the docs web) share these verdicts, where verdicts keyed by
# the whole directory missed the cache on every new host (28 misses per docs page under
# 20 host names, each a urljoin). What depends on the host (the length, the authority's
# verdict) is added per page by verdict().
# _relative()'s reasons for the references it leaves to _verdict(): one that names its host
# ("//h/p", "https://h/p") or a scheme that is not crawled, whose verdict depends on the
# base's scheme at most; and one with an http(s) scheme or "//" but no host, which is
# relative to the base's host.
_OWN_HOST = "own host"
_SCHEME_ONLY = "scheme only"
_PLACEHOLDER_HOST = "x"  # the host of the base a path is resolved against, cut off after


@lru_cache(maxsize=1 << 14)
def _relative(raw: str, scheme: str, path: str) -> tuple[str, str | None]:
    """What :func:`_resolved` makes of ``raw`` on a page of a directory with this scheme
    and path (up to its last "/"), less the origin: (the rest of the URL, None), ("", why it
    is skipped), or ("", :data:`_OWN_HOST` or :data:`_SCHEME_ONLY`) for a reference with
    a scheme or host."""
    text, reason = _screened(raw)
    if reason is not None:
        return "", reason
    scheme_given = _SCHEME.match(text)
    if scheme_given:
        if scheme_given.group()[:-1].lower() not in _CRAWLED_SCHEMES:
            return "", _OWN_HOST  # refused whatever the base
        return "", _OWN_HOST if _names_host(text, scheme_given.end()) else _SCHEME_ONLY
    if _names_host(text, 0):
        return "", _OWN_HOST
    if text[:2] == "//":  # "///p": no host of its own, urljoin takes the base's
        return "", _SCHEME_ONLY
    text = text.replace(" ", "%20")  # as _resolved()
    ref = text.partition("#")[0]
    if "/." not in text and text[0] == "/":
        # the usual href: the attribute value itself when nothing was stripped, so this
        # cache holds no second copy of it (a 100,000-link page stays within its memory)
        return (raw if ref == raw else ref), None
    # urljoin takes the host of the result from the base and resolves the path without it
    placeholder = f"{scheme}://{_PLACEHOLDER_HOST}"
    try:
        joined = urljoin(placeholder + path, ref)
    except ValueError:
        return "", "bad_url"
    return joined[len(placeholder) :], None


def _names_host(text: str, at: int) -> bool:
    """Whether ``text`` has an authority that is not empty at ``at`` (as urlsplit reads it)."""
    return text[at : at + 2] == "//" and text[at + 2 : at + 3] not in ("", "/", "?", "#")


@lru_cache(maxsize=256)  # a page's links share its base: computed once, not once a link
def _site(base: str) -> tuple[str, str, str, str | None, str] | None:
    """(origin, scheme, directory path, why the origin is refused or None, the directory
    on a placeholder host) of the directory of ``base``, for :func:`_relative`; None when
    that directory is not an http(s) URL urlsplit takes (its links take :func:`_verdict`,
    which says why)."""
    directory = _directory(base)
    try:
        parts = urlsplit(directory)
    except ValueError:
        return None
    if parts.scheme not in _CRAWLED_SCHEMES:
        return None
    return (
        f"{parts.scheme}://{parts.netloc}",
        parts.scheme,
        parts.path,
        _netloc_refusal(parts.scheme, parts.netloc),
        f"{parts.scheme}://{_PLACEHOLDER_HOST}{parts.path}",
    )


# References with a scheme but no host, and the rare pages _site() leaves out, are judged
# against the page's directory, and these joins are cached by directory.
@lru_cache(maxsize=1 << 15)
def _joined(base: str, ref: str) -> str:
    return urljoin(base, ref)


@lru_cache(maxsize=256)  # a page's links share its base: computed once, not once a link
def _directory(base: str) -> str:
    """``base`` up to the last "/" of its path, without query and fragment: what a
    relative reference that does not start with "?" is resolved against (RFC 3986, 5.2)."""
    cut = base.partition("#")[0].partition("?")[0]
    path_at = cut.find("/", cut.find("://") + 3)
    return cut if path_at < 0 else cut[: cut.rfind("/") + 1]


@lru_cache(maxsize=256)
def _origin(base: str) -> str:
    parts = urlsplit(base)
    return f"{parts.scheme}://{parts.netloc}"


@lru_cache(maxsize=4096)
def _netloc_refusal(scheme: str, netloc: str) -> str | None:
    """Why URLs with this scheme and authority cannot be crawled, or None. The path and
    query were already checked, so the verdict depends on these two only and is cached."""
    try:
        host = urlsplit(f"{scheme}://{netloc}/").hostname
    except ValueError:
        return "bad_url"
    if not host:
        return "bad_url"
    if ":" not in host:  # not an IPv6 literal (urlsplit checked those)
        try:
            # Decoding back catches xn-- labels that are not punycode or do not round-trip.
            ascii_host = host.encode("idna")
            ascii_host.decode("idna")
        except UnicodeError:
            return "idna"
        if _HOST_CHARS.fullmatch(ascii_host.decode("ascii").lower()) is None:
            return "idna"
    try:
        canonicalize(f"{scheme}://{netloc}/")  # the URL module judges credentials, ports, labels
    except InvalidURL:
        return "bad_url"
    return None
