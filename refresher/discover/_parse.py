"""Processing modules by MIME type (Mercator): the registry that hands each fetched
:class:`Document` to its processors and merges what they found into one :class:`Extracted`.

The processors and their parts live beside this module, one concern each: ``_document``
(the value objects and URL resolution), ``_charset``, ``_html`` (:class:`HtmlLinks`: links,
robots directives and the text print), ``_simhash`` and ``_sitemaps`` (:class:`Sitemaps`).

Third-party processors plug in through the entry-point group ``refresher.processors`` (read
lazily, once) or :func:`register`. Bad input never raises: what cannot be used is skipped and
counted in :attr:`Extracted.skipped` under a short reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from refresher._errors import ConfigError
from refresher.discover._document import Document, Extracted, Link, Processor, frozen_counts
from refresher.discover._html import HtmlLinks
from refresher.discover._simhash import hamming, meaningful_change, simhash
from refresher.discover._sitemaps import Sitemaps
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
    "portable",
    "process",
    "processors_for",
    "register",
    "simhash",
    "unregister",
]

ENTRY_POINT_GROUP = "refresher.processors"

log = get_logger("parse")


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


def portable() -> bool:
    """Whether :func:`process` runs the same in a fresh process (the parse processes): not
    while a processor :func:`register`-ed at run time replaces or adds to the others, since
    it exists only in this process (the built-ins and entry points load there too)."""
    return not _registered


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
    coarse: dict[str, float] = {}
    for r in results:
        for link in r.links:
            links.setdefault(link.url, link)
        skipped.update(r.skipped)
        for url, seconds in r.lastmod:
            lastmod.setdefault(url, seconds)
        for url, seconds in r.coarse_lastmod:
            coarse.setdefault(url, seconds)
    return Extracted(
        links=tuple(links.values()),
        canonical=next((r.canonical for r in results if r.canonical), None),
        noindex=any(r.noindex for r in results),
        nofollow=any(r.nofollow for r in results),
        lastmod=tuple(lastmod.items()),
        # a URL given to the second by one processor is not also a coarse one
        coarse_lastmod=tuple((u, t) for u, t in coarse.items() if u not in lastmod),
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
            skipped=frozen_counts(self._skipped),
        )
