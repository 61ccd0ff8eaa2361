"""XML sitemaps (sitemaps.org): the entries of a ``urlset`` or ``sitemapindex``, gzip or not,
with ``<lastmod>`` in Unix seconds (apart: those not given to the second). Read from lxml pull
events, each element dropped as soon as it is read, so memory stays bounded however large or
deep the document is."""

from __future__ import annotations

import contextlib
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from lxml import etree

from refresher.discover._document import CHUNK, Document, Extracted, Link, Skip, resolve
from refresher.discover._url import MAX_URL_LENGTH

__all__ = ["Sitemaps"]


_GZIP_MAGIC = b"\x1f\x8b"
_W3C_DATETIME = re.compile(
    r"""(\d{4})(?:-(\d{2})(?:-(\d{2})
        (?:[T ](\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?
           \s*(Z|[+-]\d{2}:?\d{2})?)?)?)?""",
    re.VERBOSE | re.IGNORECASE,
)


def _lastmod_seconds(text: str) -> tuple[float, bool] | None:
    """A W3C datetime (``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD``, with ``Thh:mm[:ss[.s]]`` and a
    zone ``Z``/``±hh:mm``) in Unix seconds, the start of what it names (midnight, the first of
    the month); a time without zone is read as UTC. With it, whether the datetime is given to
    the second: only such a lastmod is a change observation (see :class:`Extracted`). None
    when invalid."""
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
    return moment.timestamp() + (float(fraction) if fraction else 0.0), second is not None


def _sitemap_bytes(body: bytes, limit: int, skipped: Counter[str]) -> Iterator[bytes]:
    """The body in chunks, gunzipped when it is gzip, cut at ``limit`` bytes ("too_large")."""
    produced = 0
    if not body.startswith(_GZIP_MAGIC):
        chunks: Iterable[bytes] = (body[i : i + CHUNK] for i in range(0, len(body), CHUNK))
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
                out = d.decompress(pending, CHUNK)
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
        self.lastmod: dict[str, float] = {}  # given to the second
        self.coarse: dict[str, float] = {}  # a date, month, year or hh:mm without seconds

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
            url = resolve(loc, self._url, self._owner.max_url_length)
        except Skip as e:
            self.skipped[e.reason] += 1
            return
        if url in self.links:
            return
        if len(self.links) >= self._owner.max_entries:
            self.skipped["too_many_links"] += 1
            return
        self.links[url] = self.kind
        if lastmod is not None:
            read = _lastmod_seconds(lastmod)
            if read is None:
                self.skipped["lastmod"] += 1
            else:
                (self.lastmod if read[1] else self.coarse)[url] = read[0]


class Sitemaps:
    """XML sitemaps (sitemaps.org): ``urlset`` entries come back as ``Link(kind="url")``,
    ``sitemapindex`` entries as ``Link(kind="sitemap")``, and each valid ``<lastmod>`` as a
    ``(url, Unix seconds)`` pair: in ``lastmod`` when given to the second, else (a date alone,
    ``Thh:mm`` without seconds) in ``coarse_lastmod``. Gzip bodies are decompressed in bounded
    chunks.

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
            coarse_lastmod=tuple(reader.coarse.items()),
            skipped=skipped,
        )
