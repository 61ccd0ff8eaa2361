"""Processing modules by MIME type (Mercator): link extraction, sitemaps, near-duplicate prints.

The crawler hands each fetched :class:`Document` to :func:`process`, which runs every
:class:`Processor` registered for its MIME type and merges what they found into one
:class:`Extracted`. Two processors are built in:

- :class:`HtmlLinks` (``text/html``, ``application/xhtml+xml``): links from ``a``, ``area``,
  ``link``, ``frame``/``iframe`` and ``meta refresh`` (``img``/``script`` on request), resolved
  against ``<base href>``; ``rel=nofollow``, meta robots and ``rel=canonical`` recorded; and the
  64-bit :func:`simhash` of the visible text.
- :class:`Sitemaps` (``application/xml``, ``text/xml``, and ``.xml``/``.xml.gz`` URLs): the
  entries of a ``urlset`` or ``sitemapindex``, gzip or not, with ``<lastmod>`` in Unix seconds.

Third-party processors plug in through the entry-point group ``refresher.processors`` (read
lazily, once) or :func:`register`. Bad input never raises: what cannot be used is skipped and
counted in :attr:`Extracted.skipped` under a short reason. Both built-ins stream, so memory
stays bounded however large or deep the document is: HTML goes through lxml callbacks without
a tree and keeps at most ``max_links`` links; a sitemap goes through pull events, each element
dropped from the tree as soon as it is read.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import string
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from functools import lru_cache
from hashlib import blake2b
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urljoin, urlsplit

import numpy as np
from lxml import etree
from numpy.typing import NDArray

from refresher._errors import ConfigError, InvalidURL
from refresher.discover._url import MAX_URL_LENGTH, canonicalize
from refresher.ops._logging import get_logger

__all__ = [
    "ENTRY_POINT_GROUP",
    "Document",
    "Extracted",
    "HtmlLinks",
    "Link",
    "ParseCounters",
    "ParseStatistics",
    "Processor",
    "Sitemaps",
    "available",
    "hamming",
    "meaningful_change",
    "process",
    "processors_for",
    "register",
    "simhash",
    "unregister",
]

ENTRY_POINT_GROUP = "refresher.processors"

log = get_logger("parse")

_CHUNK = 64 * 1024  # bytes decoded and fed to lxml per step: bounds every transient copy
_MAX_DEPTH = 512  # elements deeper than this are noted ("too_deep"); browsers flatten there


# --------------------------------------------------------------------------- value objects


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


def _frozen_counts(counts: Mapping[str, int] | None = None) -> Mapping[str, int]:
    return MappingProxyType(dict(counts or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Extracted:
    """What processing one document found.

    ``links`` are unique, in document order, at most the processor's ``max_links``.
    ``canonical`` is rel=canonical, recorded and not followed. ``noindex``/``nofollow`` come
    from meta robots and X-Robots-Tag. ``lastmod`` holds sitemap ``(url, Unix seconds UTC)``
    pairs. ``fingerprint`` is the 64-bit :func:`simhash` of the visible text (None without
    text). ``skipped`` counts what was left out or tolerated, by reason: "too_many_links",
    "too_long", "control_chars", "scheme", "idna", "bad_url", "self" (empty or fragment-only
    href), "charset", "parse_error", "too_deep", "too_large", "gzip", "lastmod", "entity",
    "not_sitemap", "processor_error".
    """

    links: tuple[Link, ...] = ()
    canonical: str | None = None
    noindex: bool = False
    nofollow: bool = False
    lastmod: tuple[tuple[str, float], ...] = ()
    fingerprint: int | None = None
    skipped: Mapping[str, int] = field(default_factory=_frozen_counts, hash=False)

    def __post_init__(self) -> None:
        # Whatever a third-party processor passes, the result is immutable.
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "lastmod", tuple(self.lastmod))
        if not isinstance(self.skipped, MappingProxyType):
            object.__setattr__(self, "skipped", _frozen_counts(self.skipped))

    def follow(self) -> tuple[Link, ...]:
        """The links a polite crawler may follow: none under meta robots nofollow, else those
        without rel=nofollow."""
        if self.nofollow:
            return ()
        return tuple(link for link in self.links if not link.nofollow)


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


class _Skip(Exception):
    """A link left out; ``reason`` is the key counted in :attr:`Extracted.skipped`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_EDGE = "".join(map(chr, range(0x21)))  # C0 controls and space, stripped at both ends (WHATWG)
_TAB_NEWLINE = str.maketrans("", "", "\t\n\r")  # removed anywhere in a URL (WHATWG)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_HOST_CHARS = re.compile(r"[a-z0-9_.\-]+")
_HTTP_AUTHORITY = re.compile(r"(https?)://([^/?#]*)", re.IGNORECASE)


def _resolve(raw: str, base: str, max_length: int) -> str:
    """``raw`` (an attribute value) made absolute against ``base``, fragment dropped;
    raises :class:`_Skip` when it is not a crawlable http(s) URL."""
    if len(raw) > max_length:  # first, so a 10 kB URL costs nothing more
        raise _Skip("too_long")
    text = raw.strip(_EDGE).translate(_TAB_NEWLINE)
    if not text or text.startswith("#"):
        raise _Skip("self")
    if _CONTROL.search(text):
        raise _Skip("control_chars")
    scheme = _SCHEME.match(text)
    if scheme and scheme.group()[:-1].lower() not in ("http", "https"):
        raise _Skip("scheme")
    # Browsers percent-encode spaces in paths; in a host the encoded space fails the host test.
    text = text.replace(" ", "%20")
    try:
        if "/." in text or not text.startswith(("/", "http://", "https://")) or text[:2] == "//":
            url = urljoin(base, text).partition("#")[0]
        elif text[0] == "/":  # the usual href, and urljoin is slow: the base's origin + path
            url = _origin(base) + text.partition("#")[0]
        else:  # absolute, without dot segments: nothing to resolve
            url = text.partition("#")[0]
    except ValueError as e:
        raise _Skip("bad_url") from e
    authority = _HTTP_AUTHORITY.match(url)
    if authority is None:
        raise _Skip("bad_url" if url[:5].lower() in ("http:", "https") else "scheme")
    if len(url) > max_length:
        raise _Skip("too_long")
    reason = _netloc_refusal(authority.group(1).lower(), authority.group(2))
    if reason is not None:
        raise _Skip(reason)
    return url


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


# --------------------------------------------------------------------------- charsets

# WHATWG labels Python does not know, and Python codecs the web means something else by
# (a page labelled ISO-8859-1 or US-ASCII is decoded as windows-1252 by every browser).
_LABELS = {
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "ms932": "cp932",
    "windows-874": "cp874",
    "x-mac-roman": "mac-roman",
    "x-mac-cyrillic": "mac-cyrillic",
    "x-gbk": "gb18030",
    "x-euc-jp": "euc_jp",
}
_SUPERSETS = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso8859-11": "cp874",
    "utf-16": "utf-16-le",  # WHATWG's "utf-16"; Python's would demand a byte order mark
}
# The web's encodings (WHATWG Encoding Standard) as Python names; anything else is refused,
# so a page cannot pick unicode_escape, utf-7 or a bytes-to-bytes codec.
_WEB_CODECS = frozenset(
    {
        "utf-8",
        "utf-16-le",
        "utf-16-be",
        "cp866",
        "koi8-r",
        "koi8-u",
        "mac-roman",
        "mac-cyrillic",
        "cp874",
        "gb18030",
        "big5hkscs",
        "euc_jp",
        "iso2022_jp",
        "cp932",
        "cp949",
        *(f"iso8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
        *(f"cp{n}" for n in range(1250, 1259)),
    }
)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CHARSET_PARAM = re.compile(r"""charset\s*=\s*["']?\s*([^\s"';,]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE
)
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9_.\-]+)""")
_PRESCAN = 4096  # bytes searched for <meta charset>; WHATWG says 1024, real pages go further


def _codec(label: str) -> str | None:
    """The Python codec for a charset label, or None when it is not a web encoding."""
    name = label.strip().strip("\"'").lower()
    name = _LABELS.get(name, name)
    try:
        name = codecs.lookup(name).name
    except (LookupError, ValueError):  # ValueError: a NUL in the label (found by fuzzing)
        return None
    name = _SUPERSETS.get(name, name)
    return name if name in _WEB_CODECS else None


def _decodes(body: bytes, codec: str, start: int) -> bool:
    """Whether ``body[start:]`` is valid ``codec``, checked in chunks (no full copy)."""
    decoder = codecs.getincrementaldecoder(codec)("strict")
    view = memoryview(body)
    try:
        for i in range(start, len(body), 16 * _CHUNK):
            decoder.decode(view[i : i + 16 * _CHUNK])
        decoder.decode(b"", True)
    except UnicodeError:
        return False
    return True


def _choose_charset(
    body: bytes, content_type: str | None, skipped: Counter[str]
) -> tuple[str, int, str]:
    """(codec, bytes to skip, errors) for an HTML body.

    A byte order mark wins (as in browsers), then the Content-Type charset, then
    ``<meta charset>``/http-equiv or the XML declaration in the first bytes. A declared
    charset that does not decode the body is a lie ("charset"): UTF-8 is used when it fits,
    else the declared one with replacement characters. Without a declaration: UTF-8 when it
    fits, else windows-1252 (the web's default). Unknown labels count "charset" and are passed
    over.
    """
    for bom, codec in _BOMS:
        if body.startswith(bom):
            errors = "strict" if _decodes(body, codec, len(bom)) else "replace"
            if errors == "replace":
                skipped["charset"] += 1
            return codec, len(bom), errors
    declared = None
    labels: list[tuple[str, bool]] = []  # (label, found in the document)
    if content_type and (m := _CHARSET_PARAM.search(content_type)):
        labels.append((m.group(1), False))
    head = body[:_PRESCAN]
    for pattern in (_META_CHARSET, _XML_ENCODING):
        if m2 := pattern.search(head):
            labels.append((m2.group(1).decode("ascii"), True))
    for label, in_document in labels:
        declared = _codec(label)
        if declared is not None:
            if in_document and declared.startswith("utf-16"):
                declared = "utf-8"  # a UTF-16 page cannot declare itself in ASCII (WHATWG)
            break
        skipped["charset"] += 1
    if declared is not None:
        if _decodes(body, declared, 0):
            return declared, 0, "strict"
        skipped["charset"] += 1
        if declared != "utf-8" and _decodes(body, "utf-8", 0):
            return "utf-8", 0, "strict"
        return declared, 0, "replace"
    if _decodes(body, "utf-8", 0):
        return "utf-8", 0, "strict"
    return "cp1252", 0, "replace"


def _decoded_chunks(body: bytes, codec: str, start: int, errors: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder(codec)(errors)
    view = memoryview(body)
    for i in range(start, len(body), _CHUNK):
        text = decoder.decode(view[i : i + _CHUNK])
        if text:
            yield text
    tail = decoder.decode(b"", True)
    if tail:
        yield tail


# --------------------------------------------------------------------------- simhash

# Tokenising works on UTF-8 bytes: bytes.translate and bytes.split run several times faster
# than str.translate (slow on any non-ASCII text) or a \w+ regex. ASCII punctuation
# separates words, every digit reads as "0", and the white space bytes.split does not know
# becomes a space first.
_BYTE_TABLE = bytes.maketrans(
    (string.punctuation + string.digits).encode(),
    b" " * len(string.punctuation) + b"0" * len(string.digits),
)
_UNICODE_SPACE = re.compile("[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_PUNCTUATION = frozenset(string.punctuation)
_LONGEST_WORD = 256  # characters looked back for the start of a word cut by a batch end
_SHINGLE = 3  # words per shingle
_BLOCK = 8192  # token hashes combined per numpy step (the bit matrix is _BLOCK x 64 bytes)
_FLUSH = 64 * 1024  # characters of one text run held before tokenising part of it
_U64 = np.uint64


def _separates(char: str) -> bool:
    return char in _PUNCTUATION or char.isspace()  # as the tokeniser splits


def _hash_token(token: bytes) -> int:
    return int.from_bytes(blake2b(token, digest_size=8).digest(), "little")


# Words repeat, so their hashes are cached; only short ones, so the cache stays small.
_cached_token_hash = lru_cache(maxsize=1 << 14)(_hash_token)
_CACHED_TOKEN = 48  # bytes


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser on arrays (uint64 arithmetic wraps, as the hash wants)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


class _Simhash:
    """Streams text into the simhash of its 3-word shingles.

    Tokens are the text lowercased, split at white space and ASCII punctuation, with every
    digit read as "0": a changed date, time or counter leaves the fingerprint as it was (the
    raw digest still records that change). Each token is hashed (blake2b, 8 bytes), a
    shingle's hash mixes the hashes of its three tokens, and each bit of the fingerprint is
    the majority over the shingles.
    """

    __slots__ = ("_carry", "_counts", "_hashes", "_parts", "_shingles", "_size", "_tokens")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self._hashes: list[int] = []
        self._carry: NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        self._counts: NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        self._shingles = 0
        self._tokens = 0

    def feed(self, text: str) -> None:
        """Add text; a word may go on from the previous call (lxml splits text nodes
        anywhere). Text is tokenised in batches of about ``_FLUSH`` characters."""
        if len(text) > _FLUSH:
            for i in range(0, len(text), _FLUSH):
                self.feed(text[i : i + _FLUSH])
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size >= _FLUSH:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        joined = "".join(self._parts)
        cut = len(joined)
        if not final:  # keep back a word that may go on in the next call
            stop = max(cut - _LONGEST_WORD, 0)
            while cut > stop and not _separates(joined[cut - 1]):
                cut -= 1
            if cut == stop:  # no separator near the end: cut the overlong word anywhere
                cut = len(joined)
        self._parts = [joined[cut:]] if cut < len(joined) else []
        self._size = len(joined) - cut
        self._words(joined[:cut])

    def value(self) -> int | None:
        self._flush(final=True)
        self._combine()
        if self._tokens == 0:
            return None
        if self._shingles == 0:  # fewer tokens than a shingle: they make the one shingle
            self._add_bits(self._shingle_hashes(self._carry, whole=True))
        bits = (2 * self._counts - self._shingles) > 0
        packed = np.packbits(bits.astype(np.uint8), bitorder="little")
        return int.from_bytes(packed.tobytes(), "little")

    def _words(self, text: str) -> None:
        text = text.lower()
        if not text.isascii():
            text = _UNICODE_SPACE.sub(" ", text)
        words = text.encode("utf-8", "surrogatepass").translate(_BYTE_TABLE).split()
        if not words:
            return
        self._tokens += len(words)
        hashes = self._hashes
        if len(max(words, key=len)) <= _CACHED_TOKEN:
            hashes.extend(map(_cached_token_hash, words))
        else:
            hashes.extend(
                _cached_token_hash(w) if len(w) <= _CACHED_TOKEN else _hash_token(w) for w in words
            )
        if len(hashes) >= _BLOCK:
            self._combine()

    def _combine(self) -> None:
        if not self._hashes:
            return
        fresh = np.fromiter(self._hashes, dtype=np.uint64, count=len(self._hashes))
        self._hashes.clear()
        seq = np.concatenate((self._carry, fresh))
        if seq.size >= _SHINGLE:
            self._add_bits(self._shingle_hashes(seq, whole=False))
            seq = seq[-(_SHINGLE - 1) :]
        self._carry = seq.copy()

    @staticmethod
    def _shingle_hashes(seq: NDArray[np.uint64], *, whole: bool) -> NDArray[np.uint64]:
        if whole:  # one shingle of all of seq (shorter than _SHINGLE)
            seq = seq.reshape(1, -1)
            h = _mix(seq[:, 0] ^ _U64(0x9E3779B97F4A7C15))
            for j in range(1, seq.shape[1]):
                h = _mix(h ^ seq[:, j])
            return h
        n = seq.size - _SHINGLE + 1
        h = _mix(seq[:n] ^ _U64(0x9E3779B97F4A7C15))
        for j in range(1, _SHINGLE):
            h = _mix(h ^ seq[j : j + n])
        return h

    def _add_bits(self, hashes: NDArray[np.uint64]) -> None:
        as_bytes = hashes.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
        bits = np.unpackbits(as_bytes, axis=1, bitorder="little")
        self._counts += bits.sum(axis=0, dtype=np.int64)
        self._shingles += hashes.size


def simhash(text: str) -> int | None:
    """The 64-bit simhash (0 ≤ value < 2**64) of ``text``'s 3-word shingles; None when the
    text has no words. Every digit reads as "0" (see :func:`meaningful_change`)."""
    h = _Simhash()
    h.feed(text)
    return h.value()


def hamming(a: int, b: int) -> int:
    """The number of bits in which two fingerprints differ."""
    return (a ^ b).bit_count()


def meaningful_change(old: int | None, new: int | None, *, threshold: int = 3) -> bool:
    """Whether a page's text changed in substance: its simhash moved more than ``threshold``
    bits, or text appeared or vanished. Numbers are masked in the fingerprint, so a new
    timestamp or counter is never meaningful on its own (the raw digest still sees it); a
    few edited words move a few bits, a different article about half of them."""
    if old is None or new is None:
        return (old is None) != (new is None)
    return hamming(old, new) > threshold


# --------------------------------------------------------------------------- HTML


_INVISIBLE = frozenset({"script", "style", "template", "noscript"})
_MEDIA_RELS = frozenset(
    {
        "stylesheet",
        "icon",
        "apple-touch-icon",
        "apple-touch-icon-precomposed",
        "mask-icon",
        "preload",
        "modulepreload",
        "preconnect",
        "dns-prefetch",
        "manifest",
    }
)
_REFRESH_URL = re.compile(r"""^\s*[\d.]*\s*[;,]?\s*(?:url\s*=\s*)?["']?([^"']*)""", re.I)


def _robots_directives(value: str) -> tuple[bool, bool]:
    """(noindex, nofollow) in a meta robots content or an X-Robots-Tag value; directives
    for a named user agent ("otherbot: noindex") are not ours and are passed over."""
    noindex = nofollow = False
    agent_specific = False
    for raw in value.split(","):
        token = raw.strip().lower()
        name, colon, rest = token.partition(":")
        if colon and name.strip() not in ("unavailable_after", "max-snippet", "max-image-preview"):
            agent_specific = name.strip() not in ("robots", "*")
            token = rest.strip()
        if agent_specific:
            continue
        if token in ("noindex", "none"):
            noindex = True
        if token in ("nofollow", "none"):
            nofollow = True
    return noindex, nofollow


class _HtmlTarget:
    """lxml parser target: sees each element once, keeps links and text statistics only."""

    def __init__(self, owner: HtmlLinks, url: str, skipped: Counter[str]) -> None:
        self._owner = owner
        self._base = url
        self._base_seen = False
        self.skipped = skipped
        self.links: dict[str, tuple[str, bool]] = {}
        self._full = False
        self.canonical: str | None = None
        self.noindex = False
        self.nofollow = False
        self.text = _Simhash()
        self.started = False
        self._gap = False
        self._depth = 0
        self._deep = False
        self._hidden = 0

    # lxml's target protocol
    # These run once per element or text node of a page that may have millions: keep them lean.
    def start(self, tag: str, attrib: Mapping[str, str]) -> None:
        self.started = True
        self._gap = True  # an element boundary ends a word
        self._depth += 1
        if self._depth > _MAX_DEPTH and not self._deep:
            self._deep = True
            self.skipped["too_deep"] += 1
        if tag in _INVISIBLE:
            self._hidden += 1
        handler = _ELEMENT_HANDLERS.get(tag)
        if handler is not None:
            handler(self, tag, attrib)

    def end(self, tag: str) -> None:
        self._depth -= 1
        self._gap = True
        if self._hidden and tag in _INVISIBLE:
            self._hidden -= 1

    def data(self, data: str) -> None:
        if not self._hidden:
            if self._gap:
                self._gap = False
                data = " " + data
            self.text.feed(data)

    def close(self) -> None:
        return None

    # elements
    def _anchor(self, tag: str, attrib: Mapping[str, str]) -> None:
        self._add(attrib.get("href"), tag, "nofollow" in _rels(attrib))

    def _frame(self, tag: str, attrib: Mapping[str, str]) -> None:
        self._add(attrib.get("src"), tag, False)

    def _media(self, tag: str, attrib: Mapping[str, str]) -> None:
        if self._owner.include_media:
            self._add(attrib.get("src"), tag, False)

    def _link(self, tag: str, attrib: Mapping[str, str]) -> None:
        rels = _rels(attrib)
        href = attrib.get("href")
        if "canonical" in rels:
            if self.canonical is None and href is not None:
                self.canonical = self._resolve(href)
            return
        if rels & _MEDIA_RELS and not self._owner.include_media:
            return
        self._add(href, tag, "nofollow" in rels)

    def _base_href(self, tag: str, attrib: Mapping[str, str]) -> None:
        href = attrib.get("href")
        if self._base_seen or href is None:
            return
        self._base_seen = True  # only the first <base href> counts (HTML)
        base = self._resolve(href)
        if base is not None:
            self._base = base

    def _meta(self, tag: str, attrib: Mapping[str, str]) -> None:
        content = attrib.get("content")
        if content is None:
            return
        name = attrib.get("name", "").strip().lower()
        if name == "robots":
            noindex, nofollow = _robots_directives(content)
            self.noindex |= noindex
            self.nofollow |= nofollow
        elif attrib.get("http-equiv", "").strip().lower() == "refresh":
            m = _REFRESH_URL.match(content)
            if m and m.group(1).strip():
                self._add(m.group(1), "redirect", False)

    def _resolve(self, raw: str) -> str | None:
        try:
            return _resolve(raw, self._base, self._owner.max_url_length)
        except _Skip as e:
            self.skipped[e.reason] += 1
            return None

    def _add(self, raw: str | None, kind: str, nofollow: bool) -> None:
        if raw is None:
            return
        if self._full:  # past the cap nothing is resolved: a 100,000-link page stays cheap
            self.skipped["too_many_links"] += 1
            return
        url = self._resolve(raw)
        if url is None:
            return
        seen = self.links.get(url)
        if seen is None:
            if len(self.links) >= self._owner.max_links:
                self._full = True
                self.skipped["too_many_links"] += 1
                return
            self.links[url] = (kind, nofollow)
        elif seen[1] and not nofollow:  # followable when any element linking it is
            self.links[url] = (seen[0], False)


def _rels(attrib: Mapping[str, str]) -> frozenset[str]:
    rel = attrib.get("rel")
    return frozenset(rel.lower().split()) if rel else frozenset()


_ELEMENT_HANDLERS = {
    "a": _HtmlTarget._anchor,
    "area": _HtmlTarget._anchor,
    "link": _HtmlTarget._link,
    "frame": _HtmlTarget._frame,
    "iframe": _HtmlTarget._frame,
    "img": _HtmlTarget._media,
    "script": _HtmlTarget._media,
    "base": _HtmlTarget._base_href,
    "meta": _HtmlTarget._meta,
}


class HtmlLinks:
    """Link extraction and the text fingerprint for HTML (lxml, streaming, no tree).

    ``include_media`` adds ``img``/``script`` sources and stylesheet/icon ``link``s;
    ``max_links`` caps the links kept per page (link elements past the cap count
    "too_many_links"); ``max_url_length`` (characters) refuses longer URLs ("too_long").
    """

    name = "html-links"
    mime_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")

    def __init__(
        self,
        *,
        include_media: bool = False,
        max_links: int = 10_000,
        max_url_length: int = MAX_URL_LENGTH,
    ) -> None:
        if max_links < 0 or max_url_length < 1:
            raise ValueError(
                f"max_links={max_links}, max_url_length={max_url_length}: "
                "give max_links ≥ 0 and max_url_length ≥ 1"
            )
        self.include_media = include_media
        self.max_links = max_links
        self.max_url_length = max_url_length

    def __repr__(self) -> str:
        return (
            f"HtmlLinks(include_media={self.include_media}, max_links={self.max_links}, "
            f"max_url_length={self.max_url_length})"
        )

    def process(self, doc: Document) -> Extracted:
        skipped: Counter[str] = Counter()
        codec, start, errors = _choose_charset(doc.body, doc.content_type, skipped)
        target = _HtmlTarget(self, doc.url, skipped)
        parser = etree.HTMLParser(target=target, no_network=True, huge_tree=False)
        try:
            for text in _decoded_chunks(doc.body, codec, start, errors):
                parser.feed(text)
            parser.close()
        except etree.LxmlError:
            # lxml refuses an empty document; anything else it refuses is counted
            if target.started:
                skipped["parse_error"] += 1
        except UnicodeError:  # a codec that fails even with errors="replace"
            skipped["charset"] += 1
        noindex, nofollow = target.noindex, target.nofollow
        if doc.robots_tag:
            header_noindex, header_nofollow = _robots_directives(doc.robots_tag)
            noindex |= header_noindex
            nofollow |= header_nofollow
        return Extracted(
            links=tuple(
                Link(url=url, kind=kind, nofollow=nf) for url, (kind, nf) in target.links.items()
            ),
            canonical=target.canonical,
            noindex=noindex,
            nofollow=nofollow,
            fingerprint=target.text.value(),
            skipped=skipped,
        )


# --------------------------------------------------------------------------- sitemaps

_GZIP_MAGIC = b"\x1f\x8b"
_W3C_DATETIME = re.compile(
    r"""(\d{4})(?:-(\d{2})(?:-(\d{2})
        (?:[T ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?
           \s*(Z|[+-]\d{2}:?\d{2})?)?)?)?""",
    re.VERBOSE | re.IGNORECASE,
)


def _lastmod_seconds(text: str) -> float | None:
    """A W3C datetime (``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD``, with ``Thh:mm[:ss[.s]]`` and a
    zone ``Z``/``±hh:mm``) in Unix seconds; a time without zone is read as UTC. None when
    invalid."""
    m = _W3C_DATETIME.fullmatch(text.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    tz = UTC
    if zone and zone.upper() != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        if offset >= timedelta(hours=24):
            return None
        tz = timezone(sign * offset)
    try:
        moment = datetime(
            int(year),
            int(month or 1),
            int(day or 1),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            tzinfo=tz,
        )
    except ValueError:
        return None
    return moment.timestamp() + (float(fraction) if fraction else 0.0)


def _sitemap_bytes(body: bytes, limit: int, skipped: Counter[str]) -> Iterator[bytes]:
    """The body in chunks, gunzipped when it is gzip, cut at ``limit`` bytes ("too_large")."""
    produced = 0
    if not body.startswith(_GZIP_MAGIC):
        chunks: Iterable[bytes] = (body[i : i + _CHUNK] for i in range(0, len(body), _CHUNK))
    else:
        chunks = _gunzip(body, skipped)
    for chunk in chunks:
        produced += len(chunk)
        if produced > limit:
            skipped["too_large"] += 1
            yield chunk[: len(chunk) - (produced - limit)]
            return
        yield chunk


def _gunzip(body: bytes, skipped: Counter[str]) -> Iterator[bytes]:
    """Decompress gzip members one bounded chunk at a time (a zip bomb never lands in
    memory at once)."""
    pending = body
    try:
        while pending.startswith(_GZIP_MAGIC):
            d = zlib.decompressobj(wbits=31)
            while not d.eof:
                out = d.decompress(pending, _CHUNK)
                pending = d.unconsumed_tail
                if out:
                    yield out
                elif not pending:
                    skipped["gzip"] += 1  # truncated stream
                    return
            pending = d.unused_data
    except zlib.error:
        skipped["gzip"] += 1


def _xml_error_reason(message: str) -> str:
    lowered = message.lower()
    if "entity" in lowered or "amplification" in lowered:
        return "entity"  # libxml2 stops entity-expansion attacks even unexpanded
    if "depth" in lowered:
        return "too_deep"
    return "parse_error"


def _local(tag: object) -> str:
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


class _SitemapReader:
    """Consumes lxml pull events. Every element is dropped from the tree as soon as it ends,
    unless an entry still needs it (its ``loc`` and ``lastmod``), so the tree never holds more
    than one entry whatever the document nests or repeats."""

    def __init__(self, owner: Sitemaps, url: str, skipped: Counter[str]) -> None:
        self._owner = owner
        self._url = url
        self.skipped = skipped
        self.root: Any = None
        self.kind = ""
        self._entry_tag = ""  # "{namespace}url" or "{namespace}sitemap", as the root's
        self._loc = self._lastmod = ""
        self._depth = 0  # of the element an event is about; the root is 1
        self._markup = False  # an element inside this entry's loc or lastmod
        self.links: dict[str, str] = {}
        self.lastmod: dict[str, float] = {}

    def take(self, events: Iterable[tuple[str, Any]]) -> bool:
        """Handle events; False once the document turned out not to be a sitemap."""
        for event, element in events:
            if event == "start":
                self._depth += 1
                if self.root is None:
                    self.root = element
                    name = _local(element.tag)
                    if name not in ("urlset", "sitemapindex"):
                        self.skipped["not_sitemap"] += 1
                        return False
                    self.kind = "url" if name == "urlset" else "sitemap"
                    namespace = element.tag[: -len(name)]
                    self._entry_tag = namespace + self.kind
                    self._loc, self._lastmod = namespace + "loc", namespace + "lastmod"
                continue
            depth = self._depth
            self._depth -= 1
            if depth == 1:
                continue
            if depth == 2:  # an entry (or something else) at the top level
                if element.tag == self._entry_tag:
                    self._entry(element)
                self._markup = False
            elif depth == 3 and element.tag in (self._loc, self._lastmod):
                continue  # kept until its entry ends
            elif depth == 4 and element.getparent().tag in (self._loc, self._lastmod):
                self._markup = True
            element.getparent().remove(element)
        return True

    def _entry(self, element: Any) -> None:
        loc = lastmod = None
        for child in element:
            if child.tag == self._loc and loc is None:
                if len(child):  # an entity reference left unexpanded
                    self.skipped["entity"] += 1
                    return
                loc = (child.text or "").strip()
            elif child.tag == self._lastmod and lastmod is None:
                lastmod = child.text or ""
        if self._markup or not loc:  # no URL, or one that markup cut into pieces
            self.skipped["bad_url"] += 1
            return
        try:
            url = _resolve(loc, self._url, self._owner.max_url_length)
        except _Skip as e:
            self.skipped[e.reason] += 1
            return
        if url in self.links:
            return
        if len(self.links) >= self._owner.max_entries:
            self.skipped["too_many_links"] += 1
            return
        self.links[url] = self.kind
        if lastmod is not None:
            seconds = _lastmod_seconds(lastmod)
            if seconds is None:
                self.skipped["lastmod"] += 1
            else:
                self.lastmod[url] = seconds


class Sitemaps:
    """XML sitemaps (sitemaps.org): ``urlset`` entries come back as ``Link(kind="url")``,
    ``sitemapindex`` entries as ``Link(kind="sitemap")``, and each valid ``<lastmod>`` as a
    ``(url, Unix seconds)`` pair. Gzip bodies are decompressed in bounded chunks.

    ``max_entries`` caps the entries kept ("too_many_links" past it); ``max_bytes`` caps the
    (decompressed) bytes read ("too_large"). Entities are never expanded, DTDs and the network
    never loaded, so neither XXE nor entity expansion can reach anything.
    """

    name = "sitemaps"
    mime_types: tuple[str, ...] = ("application/xml", "text/xml")

    def __init__(
        self,
        *,
        max_entries: int = 50_000,
        max_bytes: int = 50 * 1024 * 1024,
        max_url_length: int = MAX_URL_LENGTH,
    ) -> None:
        if max_entries < 0 or max_bytes < 1 or max_url_length < 1:
            raise ValueError(
                f"max_entries={max_entries}, max_bytes={max_bytes}, "
                f"max_url_length={max_url_length}: give max_entries ≥ 0 and the others ≥ 1"
            )
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_url_length = max_url_length

    def __repr__(self) -> str:
        return f"Sitemaps(max_entries={self.max_entries}, max_bytes={self.max_bytes})"

    def process(self, doc: Document) -> Extracted:
        skipped: Counter[str] = Counter()
        reader = _SitemapReader(self, doc.url, skipped)
        parser = etree.XMLPullParser(
            events=("start", "end"),
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
        )
        try:
            for chunk in _sitemap_bytes(doc.body, self.max_bytes, skipped):
                parser.feed(chunk)
                if not reader.take(parser.read_events()):
                    break
            else:
                if "too_large" not in skipped and "gzip" not in skipped:
                    parser.close()  # only a complete document must be well-formed at its end
                    reader.take(parser.read_events())
        except etree.LxmlError as e:
            # XML errors are fatal (recovering would invent URLs from broken markup); the
            # entries completed before the error still count.
            with contextlib.suppress(etree.LxmlError):
                reader.take(parser.read_events())
            skipped[_xml_error_reason(str(e))] += 1
        return Extracted(
            links=tuple(Link(url=url, kind=kind) for url, kind in reader.links.items()),
            lastmod=tuple(reader.lastmod.items()),
            skipped=skipped,
        )


# --------------------------------------------------------------------------- registry

_BUILTIN: dict[str, Processor] = {p.name: p for p in (HtmlLinks(), Sitemaps())}
_registered: dict[str, Processor] = {}
_plugins: dict[str, Processor] | None = None  # the entry points, loaded on first use


def _check(obj: object, where: str) -> Processor:
    if (
        not isinstance(obj, Processor)
        or not isinstance(obj.name, str)
        or not obj.name
        or not isinstance(obj.mime_types, tuple)
        or not all(isinstance(m, str) for m in obj.mime_types)
    ):
        raise TypeError(
            f"{where} gave {obj!r}, which is not a processor: it needs a non-empty str `name`, "
            "a tuple of str `mime_types` and a `process(doc)` method"
        )
    return obj


def _load_plugins() -> dict[str, Processor]:
    global _plugins
    if _plugins is None:
        loaded: dict[str, Processor] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            where = f"entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r}"
            try:
                obj = ep.load()
                # A class has the protocol's attributes too; it is the factory, not the processor.
                if isinstance(obj, type) or (not isinstance(obj, Processor) and callable(obj)):
                    obj = obj()
                loaded[_check(obj, where).name] = obj
            except Exception as e:
                raise ConfigError(
                    f"processor {ep.name!r} failed to load from {where}: {e}; "
                    "fix or uninstall that package"
                ) from e
        _plugins = loaded
    return _plugins


def _all(builtins: Mapping[str, Processor] | None = None) -> dict[str, Processor]:
    merged = {**_BUILTIN, **(builtins or {}), **_load_plugins()}
    merged.update(_registered)
    return merged


def register(processor: Processor) -> None:
    """Use ``processor`` for its ``mime_types`` from now on. A processor of the same name is
    replaced, a built-in too: ``register(HtmlLinks(include_media=True))``."""
    _registered[_check(processor, "register()").name] = processor


def unregister(name: str) -> None:
    """Undo :func:`register` for ``name`` (a replaced built-in comes back)."""
    _registered.pop(name, None)


def available() -> tuple[str, ...]:
    """Every processor name: the built-ins first, then the others sorted. Reading the entry
    points happens here at the latest; call this at startup so a broken plug-in stops the
    daemon with :class:`ConfigError` instead of surfacing at the first document."""
    names = _all()
    return (*_BUILTIN, *sorted(set(names) - set(_BUILTIN)))


def _mime(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


def _accepts(processor: Processor, mime: str) -> bool:
    major = mime.partition("/")[0]
    for declared in processor.mime_types:
        m = declared.lower()
        if m == mime or m == "*/*" or (m.endswith("/*") and m[:-2] == major):
            return True
    return False


_SITEMAP_SUFFIXES = (".xml", ".xml.gz")
_HTML_MIMES = frozenset(HtmlLinks.mime_types)


def processors_for(
    content_type: str | None,
    *,
    url: str | None = None,
    builtins: Mapping[str, Processor] | None = None,
) -> tuple[Processor, ...]:
    """The processors for a document, by the MIME type of ``content_type``. A URL ending in
    ``.xml`` or ``.xml.gz`` (as a robots.txt Sitemap line gives) also gets the sitemap
    processor, whatever the server called the type, unless it is HTML. ``builtins`` replaces
    built-ins by name for this call (the daemon's configured ``HtmlLinks``); plug-ins and
    :func:`register` still take precedence."""
    mime = _mime(content_type)
    everyone = _all(builtins)
    chosen = [p for p in everyone.values() if mime and _accepts(p, mime)]
    sitemaps = everyone.get("sitemaps")
    if (
        url
        and sitemaps is not None
        and sitemaps not in chosen
        and mime not in _HTML_MIMES
        and url.partition("#")[0].partition("?")[0].lower().endswith(_SITEMAP_SUFFIXES)
    ):
        chosen.append(sitemaps)
    return tuple(chosen)


def _sniff(body: bytes) -> str | None:
    """A MIME type for a body served without one (only what the built-ins handle)."""
    head = body[:1024].lstrip().lower()
    if head.startswith(b"<?xml") and (b"<urlset" in head or b"<sitemapindex" in head):
        return "application/xml"
    if head.startswith((b"<!doctype html", b"<html")):
        return "text/html"
    return None


def process(doc: Document, *, builtins: Mapping[str, Processor] | None = None) -> Extracted:
    """Run every processor for ``doc`` and merge the results: links in processor order without
    repeats, flags or-ed, the first canonical and fingerprint, counts added. A processor that
    raises is logged and counted ("processor_error"); nothing propagates. ``builtins`` as in
    :func:`processors_for`."""
    chosen = processors_for(doc.content_type, url=doc.url, builtins=builtins)
    if not chosen and _mime(doc.content_type) in ("", "application/octet-stream"):
        sniffed = _sniff(doc.body)
        if sniffed is not None:
            chosen = processors_for(sniffed, builtins=builtins)
    results: list[Extracted] = []
    for processor in chosen:
        try:
            result = processor.process(doc)
            if not isinstance(result, Extracted):
                raise TypeError(f"process() returned {type(result).__name__}, not Extracted")
        except Exception:
            log.exception("processor_failed", processor=processor.name, url=doc.url)
            result = Extracted(skipped={"processor_error": 1})
        results.append(result)
    return _merge(results)


def _merge(results: list[Extracted]) -> Extracted:
    if len(results) == 1:
        return results[0]
    links: dict[str, Link] = {}
    skipped: Counter[str] = Counter()
    lastmod: dict[str, float] = {}
    for r in results:
        for link in r.links:
            links.setdefault(link.url, link)
        skipped.update(r.skipped)
        for url, seconds in r.lastmod:
            lastmod.setdefault(url, seconds)
    return Extracted(
        links=tuple(links.values()),
        canonical=next((r.canonical for r in results if r.canonical), None),
        noindex=any(r.noindex for r in results),
        nofollow=any(r.nofollow for r in results),
        lastmod=tuple(lastmod.items()),
        fingerprint=next((r.fingerprint for r in results if r.fingerprint is not None), None),
        skipped=skipped,
    )


# --------------------------------------------------------------------------- counters


@dataclass(frozen=True, slots=True, kw_only=True)
class ParseStatistics:
    """Totals over processed documents: ``links`` kept, pages marked ``noindex``/``nofollow``,
    and ``skipped`` summed by reason."""

    documents: int
    links: int
    noindex: int
    nofollow: int
    skipped: Mapping[str, int] = field(hash=False)


class ParseCounters:
    """Adds up :class:`Extracted` results for the crawler's statistics."""

    def __init__(self) -> None:
        self._documents = 0
        self._links = 0
        self._noindex = 0
        self._nofollow = 0
        self._skipped: Counter[str] = Counter()

    def add(self, extracted: Extracted) -> None:
        self._documents += 1
        self._links += len(extracted.links)
        self._noindex += extracted.noindex
        self._nofollow += extracted.nofollow
        self._skipped.update(extracted.skipped)

    def statistics(self) -> ParseStatistics:
        return ParseStatistics(
            documents=self._documents,
            links=self._links,
            noindex=self._noindex,
            nofollow=self._nofollow,
            skipped=_frozen_counts(self._skipped),
        )
