"""Link extraction and the text print for HTML (:class:`HtmlLinks`).

A page is parsed into a tree in one C call that releases the GIL, so parse workers in threads
really run in parallel: by Lexbor (selectolax; the default, ``discovery.html_parser =
"lexbor"``), the HTML5 tree builder browsers follow, or by libxml2 (lxml, ``"lxml"``). Links
are then read from the few link elements (a CSS selection, or ``Element.iter`` over their
tags, in document order) and the visible text joined in C and tokenised in batches for the
simhash. No Python runs per element or text node during parsing (lxml's target parsers call
back into Python for every tag, and many such threads spend their time fighting over the GIL).
Both trees feed the same :class:`_Links` rules and the same text rules.

Pages Lexbor refuses (nesting that would make its tree builder slow,
:mod:`refresher.discover._lexbor`) go to libxml2; pages libxml2 will not build a tree for
(nesting deeper than its limit, markup after the end of the document) go through the
streaming parser: a parser target that keeps only links and text statistics, so memory stays
bounded however large or deep the page is. Huge pages (``_TREE_MAX`` bytes and more) take the
same trees one at a time in a process (``_HUGE_TREE``), and stream beyond ``_HUGE_TREE_MAX``
bytes or ``_HUGE_TREE_TAGS`` tags, where a tree's memory would pass its bound.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from lxml import etree

from refresher.discover._charset import choose_charset, decoded_chunks
from refresher.discover._document import Document, Extracted, Link, verdict
from refresher.discover._lexbor import NoTree, lexbor_tree, tag_count
from refresher.discover._simhash import _Simhash
from refresher.discover._url import MAX_URL_LENGTH

__all__ = ["MAX_TEXT", "PARSERS", "HtmlLinks"]

#: the tree builders HtmlLinks can use (``discovery.html_parser``), the default first
PARSERS = ("lexbor", "lxml")

#: characters of a page's visible text its simhash reads by default, the first ones
#: (``discovery.max_text_chars``): what a multi-megabyte page costs beyond this is the
#: tokenising and hashing of text a change there would move by a few shingles at most
MAX_TEXT = 1024 * 1024
_MAX_DEPTH = 512  # elements deeper than this are noted ("too_deep"); browsers flatten there
#: Pages of this many bytes and more are huge, and take a tree one at a time: below it every
#: parse thread (one per core) may hold a tree at once, each up to ~85 bytes per byte of
#: tag-dense markup (1 MiB of "<p>x": +85 MiB; 3.9 MiB, the bound before: +316 MiB per
#: thread). Real pages this large are few (Python docs 2 of 530, Rust std 18 of 2,475).
_TREE_MAX = 1024 * 1024
#: One huge page's tree at a time in a process: a tree takes up to ~500 bytes per tag (Lexbor
#: and libxml2 alike: the Node.js API docs' all.html, 8.0 MiB and 363,653 "<", +132 MiB of
#: peak RSS; 10 MiB of "<a href=x>y</a>" +513 MiB), so parse threads building several would
#: add up. Its parse runs in C without the GIL: the other threads' smaller pages go on.
_HUGE_TREE = threading.Lock()
#: Huge pages beyond either bound stream, whose memory does not grow with the page. A tree
#: takes ~500 bytes per "<" at most (10 MiB of "<p>x": +814 MiB), hence the bound on tags
#: (~250 MiB); attributes cost ~110 bytes each without a "<" (5 MiB of "<i a0 a1 ...>":
#: +201 MiB, so ~400 at 10), hence the bound on bytes: the fetch's default body cap. The
#: Python and Node.js docs have ~45,000 "<" per MiB: such pages up to that cap take a tree.
_HUGE_TREE_MAX = 10 * 1024 * 1024  # bytes
_HUGE_TREE_TAGS = 512 * 1024  # "<" bytes
#: One page streams at a time in a process: the streaming parser calls back into Python for
#: every tag and text, and two such pages in two parse threads pass the GIL back and forth at
#: every callback (two 8.2 MB pages at once: 891-904 CPU ms, one after the other 527-531).
_STREAMING = threading.Lock()
_TEXT_BATCH = 4096  # text nodes joined per simhash feed
_VERDICTS_KEPT = 4096  # distinct link values per page whose verdicts are kept for repeats


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


class _Attributes(Protocol):
    """What a handler reads of an element: lxml's attribute mapping, the element itself, or
    Lexbor's attribute dict."""

    def get(self, key: str, default: Any = ..., /) -> Any: ...


class _Links:
    """Collects a page's links, canonical and robots flags from its elements, seen in
    document order (by the tree walk or the streaming target alike)."""

    __slots__ = (
        "_base",
        "_base_seen",
        "_full",
        "_owner",
        "_verdicts",
        "canonical",
        "links",
        "nofollow",
        "noindex",
        "skipped",
    )

    def __init__(self, owner: HtmlLinks, url: str, skipped: Counter[str]) -> None:
        self._owner = owner
        self._base = url
        self._base_seen = False
        self.skipped = skipped
        self.links: dict[str, tuple[str, bool]] = {}
        self._full = False
        # A page repeats its link values (a docs page links 200 times to 40 pages): each
        # distinct value is judged once per page, against the page's current base.
        self._verdicts: dict[str, tuple[str, str | None]] = {}
        self.canonical: str | None = None
        self.noindex = False
        self.nofollow = False

    def element(self, tag: str, attrib: _Attributes) -> None:
        handler = _ELEMENT_HANDLERS.get(tag)
        if handler is not None:
            handler(self, tag, attrib)

    def _anchor(self, tag: str, attrib: _Attributes) -> None:
        self._add(attrib.get("href"), tag, "nofollow" in _rels(attrib))

    def _frame(self, tag: str, attrib: _Attributes) -> None:
        self._add(attrib.get("src"), tag, False)

    def _media(self, tag: str, attrib: _Attributes) -> None:
        if self._owner.include_media:
            self._add(attrib.get("src"), tag, False)

    def _link(self, tag: str, attrib: _Attributes) -> None:
        rels = _rels(attrib)
        href = attrib.get("href")
        if "canonical" in rels:
            if self.canonical is None and href is not None:
                self.canonical = self._resolve(href)
            return
        if rels & _MEDIA_RELS and not self._owner.include_media:
            return
        self._add(href, tag, "nofollow" in rels)

    def _base_href(self, tag: str, attrib: _Attributes) -> None:
        href = attrib.get("href")
        if self._base_seen or href is None:
            return
        self._base_seen = True  # only the first <base href> counts (HTML)
        base = self._resolve(href)
        if base is not None:
            self._base = base
            self._verdicts.clear()  # judged against the old base

    def _meta(self, tag: str, attrib: _Attributes) -> None:
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
        url, reason = verdict(raw, self._base, self._owner.max_url_length)
        if reason is not None:
            self.skipped[reason] += 1
            return None
        return url

    def _add(self, raw: str | None, kind: str, nofollow: bool) -> None:
        if raw is None:
            return
        if self._full:  # past the cap nothing is resolved: a 100,000-link page stays cheap
            self.skipped["too_many_links"] += 1
            return
        if raw[:1] == "#" and len(raw) <= self._owner.max_url_length:
            # A fragment of this page (a third of a documentation page's link elements):
            # what verdict() says, without looking it up.
            self.skipped["self"] += 1
            return
        judged = self._verdicts.get(raw)
        if judged is None:
            judged = verdict(raw, self._base, self._owner.max_url_length)
            if len(self._verdicts) < _VERDICTS_KEPT:
                self._verdicts[raw] = judged
        url, reason = judged
        if reason is not None:
            self.skipped[reason] += 1
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


def _rels(attrib: _Attributes) -> frozenset[str]:
    rel = attrib.get("rel")
    return frozenset(rel.lower().split()) if rel else frozenset()


_ELEMENT_HANDLERS = {
    "a": _Links._anchor,
    "area": _Links._anchor,
    "link": _Links._link,
    "frame": _Links._frame,
    "iframe": _Links._frame,
    "img": _Links._media,
    "script": _Links._media,
    "base": _Links._base_href,
    "meta": _Links._meta,
}
_LINK_TAGS = tuple(_ELEMENT_HANDLERS)
_LINK_SELECTOR = ", ".join(_LINK_TAGS)


def _feed_links(found: _Links, elements: Iterable[tuple[Any, Any]]) -> None:
    """Hands a tree's link elements, (tag, attributes) in document order, to ``found``."""
    add = found._add
    for tag, attrib in elements:
        if tag == "a":  # most link elements: _Links._anchor without the two calls
            rel = attrib.get("rel")
            add(attrib.get("href"), tag, rel is not None and "nofollow" in _rels(attrib))
        else:
            found.element(tag, attrib)


# --------------------------------------------------------------------------- the tree path


class _NoTree(Exception):
    """libxml2 gave no usable tree (too deep, or an error): the page streams instead."""


_parsers = threading.local()  # one parser per thread: lxml serialises users of one parser


def _tree_parser() -> etree.HTMLParser:
    parser: etree.HTMLParser | None = getattr(_parsers, "parser", None)
    if parser is None:
        # Comments and processing instructions are dropped while parsing, so the text on
        # either side of one joins up as the streaming target sees it.
        parser = etree.HTMLParser(
            encoding="utf-8", remove_comments=True, remove_pis=True, no_network=True
        )
        _parsers.parser = parser
    return parser


def _utf8(body: bytes, codec: str, start: int, errors: str) -> bytes:
    """The page as UTF-8 by our charset choice (what both tree builders are told to expect)."""
    if codec == "utf-8" and errors == "strict":
        return body[start:] if start else body
    # rarer: decode in Python, then hand the parser UTF-8
    return body[start:].decode(codec, errors).encode("utf-8", "replace")


def _tree(data: bytes) -> Any:
    """The page's root element (None for an empty page), parsed from UTF-8 in one call."""
    if _ends_early(data):
        raise _NoTree
    parser = _tree_parser()
    try:
        root = etree.fromstring(data, parser)
    except (etree.LxmlError, ValueError) as e:
        raise _NoTree from e
    if any(entry.type_name == "ERR_RESOURCE_LIMIT" for entry in parser.error_log):
        raise _NoTree  # libxml2 stopped at its depth limit: what follows is missing
    return root


_ONLY_END_TAGS = re.compile(rb"(?:</(?:html|body)\s*>|\s)*")
_END_TAG = re.compile(rb"</(?:body|html)", re.IGNORECASE)


def _ends_early(data: bytes) -> bool:
    """Whether markup follows the first ``</body>`` or ``</html>``: the tree builder drops
    what comes after the end of the document, while browsers (and the streaming target)
    still read it; and such a tag may sit in raw text (a script, ``<noframes>``), where
    removing it would change the page. Such pages stream; most end at their end tags."""
    first = _END_TAG.search(data)  # without lowering a copy of the whole page first
    return first is not None and _ONLY_END_TAGS.fullmatch(data[first.start() :].lower()) is None


# The text nodes under an element in document order, as plain strings in one C call: what
# itertext() yields (text and tails, not the element's own tail), at 40 % of its cost.
_TEXT_NODES = etree.XPath(".//text()", smart_strings=False)


def _visible_text(root: Any) -> Iterator[str]:
    """The page's text outside script, style, template and noscript, in batches of text
    nodes joined with spaces (an element boundary ends a word). Empties the invisible
    elements of the tree it reads."""
    for element in list(root.iter(*_INVISIBLE)):
        element.text = None
        del element[:]
    nodes = _TEXT_NODES(root)
    for start in range(0, len(nodes), _TEXT_BATCH):
        yield " " + " ".join(nodes[start : start + _TEXT_BATCH])


def _from_tree(root: Any, found: _Links, text: _Simhash) -> None:
    if root is None:
        return
    _feed_links(found, ((element.tag, element) for element in root.iter(*_LINK_TAGS)))
    for batch in _visible_text(root):
        text.feed(batch)


# Link and invisible elements in one selection: each selection is a walk over the whole tree
# while holding the GIL (0.2-0.3 ms per docs page), so the two are taken in one walk; images
# only when media links are wanted (their handler does nothing otherwise).
_LEXBOR_SELECTORS = {
    media: ", ".join(sorted((set(_LINK_TAGS) - ({"img"} if not media else set())) | _INVISIBLE))
    for media in (False, True)
}


def _from_lexbor(data: bytes, found: _Links, text: _Simhash) -> None:
    """Links and text from Lexbor's tree of ``data`` (UTF-8). Template contents are not
    part of the tree (as in browsers: a template's links and text are inert)."""
    tree = lexbor_tree(data)
    media = found._owner.include_media
    invisible = _lexbor_links(found, _lexbor_selection(tree, media), media)
    # Innermost first, so no element is taken out of one already taken out.
    for node in reversed(invisible):
        node.decompose()
    limit = found._owner.max_text
    # Text chars never outnumber the page's bytes: a page under the bound is read whole.
    page_text = _lexbor_text(tree, limit if len(data) > limit else 0)
    if page_text is not None:
        text.feed(page_text)


def _lexbor_selection(tree: Any, media: bool) -> Any:
    """The tree's link and invisible elements, in document order (one walk, in C)."""
    return tree.css(_LEXBOR_SELECTORS[media])


def _lexbor_links(found: _Links, nodes: Iterable[Any], media: bool) -> list[Any]:
    """Hands the link elements among ``nodes`` to ``found``; returns the invisible ones."""
    invisible = []
    add = found._add
    for node in nodes:
        tag = node.tag
        if tag == "a":  # most link elements: _Links._anchor without the calls
            attrib = node.attributes
            rel = attrib.get("rel")
            add(attrib.get("href"), tag, rel is not None and "nofollow" in _rels(attrib))
        elif tag in _INVISIBLE:
            invisible.append(node)
            if media and tag == "script":
                found.element(tag, node.attributes)
        elif tag is not None:  # always, for an element
            found.element(tag, node.attributes)
    return invisible


def _lexbor_text(tree: Any, limit: int = 0) -> str | None:
    """The tree's text nodes joined with spaces (an element boundary ends a word), led by
    a space; None without a root. With a ``limit`` (characters), its first ``limit``
    characters at least: the same prefix, from a walk that stops there (the simhash reads
    no further)."""
    root = tree.root
    if root is None:
        return None
    if not limit:
        whole: str = root.text(separator=" ", skip_empty=True)
        return " " + whole
    walk = _TextWalk(limit - 1)
    walk.element(root)
    return " " + " ".join(walk.parts)


#: children of an element above which the walk takes each child's text whole; at or below,
#: it goes into the element children (the page's wrappers: html, body, a content div)
_WRAPPER_CHILDREN = 8
#: nodes the walk may wrap in Python (~1 µs each) before it takes every text whole: a tree
#: of few children per element, however deep, costs at most this many
_WALK_NODES = 512


class _TextWalk:
    """The first text of a tree, down to its wrappers: ``" ".join(parts)`` begins as the
    tree's text (:meth:`LexborNode.text` with ``separator=" "``, ``skip_empty=True``) and
    goes on for ``room`` characters at least, or to the end. Each child's text is that
    same join over its text nodes (or "" without one), so the non-empty ones joined with
    spaces are the parent's."""

    __slots__ = ("nodes", "parts", "room")

    def __init__(self, room: int) -> None:
        self.parts: list[str] = []
        self.room = room  # characters still wanted, separators included
        self.nodes = _WALK_NODES

    def element(self, node: Any) -> None:
        children = list(node.iter(include_text=True))
        self.nodes -= len(children)
        into = len(children) <= _WRAPPER_CHILDREN and self.nodes > 0
        for child in children:
            if self.room <= 0:
                return
            if into and not child.is_text_node:
                self.element(child)
                continue
            part = child.text(separator=" ", skip_empty=True)
            if part:
                self.room -= len(part) + (1 if self.parts else 0)
                self.parts.append(part)


# --------------------------------------------------------------------------- the streaming path


class _HtmlTarget:
    """lxml parser target for pages without a tree: sees each element once, keeps links and
    text statistics only."""

    def __init__(self, found: _Links, skipped: Counter[str], max_text: int = 0) -> None:
        self.found = found
        self.skipped = skipped
        self.text = _Simhash(max_text)
        self.started = False
        self._gap = False
        self._depth = 0
        self._deep = False
        self._hidden = 0

    # lxml's target protocol
    # These run once per element or text node of a page that may have millions: keep them lean.
    def start(self, tag: str, attrib: _Attributes) -> None:
        self.started = True
        self._gap = True  # an element boundary ends a word
        self._depth += 1
        if self._depth > _MAX_DEPTH and not self._deep:
            self._deep = True
            self.skipped["too_deep"] += 1
        if tag in _INVISIBLE:
            self._hidden += 1
        self.found.element(tag, attrib)

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


def _stream(body: bytes, charset: tuple[str, int, str], target: _HtmlTarget) -> None:
    codec, start, errors = charset
    parser = etree.HTMLParser(target=target, no_network=True, huge_tree=False)
    try:
        for text in decoded_chunks(body, codec, start, errors):
            parser.feed(text)
        parser.close()
    except etree.LxmlError:
        # lxml refuses an empty document; anything else it refuses is counted
        if target.started:
            target.skipped["parse_error"] += 1
    except UnicodeError:  # a codec that fails even with errors="replace"
        target.skipped["charset"] += 1


# --------------------------------------------------------------------------- the processor


class HtmlLinks:
    """Link extraction and the text fingerprint for HTML (Lexbor or lxml).

    ``include_media`` adds ``img``/``script`` sources and stylesheet/icon ``link``s;
    ``max_links`` caps the links kept per page (link elements past the cap count
    "too_many_links"); ``max_url_length`` (characters) refuses longer URLs ("too_long");
    ``parser`` names the tree builder (one of :data:`PARSERS`); ``max_text`` (characters)
    bounds the visible text the simhash reads, the first ones (0: all of it).
    """

    name = "html-links"
    mime_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")

    def __init__(
        self,
        *,
        include_media: bool = False,
        max_links: int = 10_000,
        max_url_length: int = MAX_URL_LENGTH,
        parser: str = PARSERS[0],
        max_text: int = MAX_TEXT,
    ) -> None:
        if max_links < 0 or max_url_length < 1 or max_text < 0:
            raise ValueError(
                f"max_links={max_links}, max_url_length={max_url_length}, "
                f"max_text={max_text}: give max_links ≥ 0, max_url_length ≥ 1, max_text ≥ 0"
            )
        if parser not in PARSERS:
            raise ValueError(f"parser={parser!r}: give one of {', '.join(map(repr, PARSERS))}")
        self.include_media = include_media
        self.max_links = max_links
        self.max_url_length = max_url_length
        self.parser = parser
        self.max_text = max_text

    def __repr__(self) -> str:
        return (
            f"HtmlLinks(include_media={self.include_media}, max_links={self.max_links}, "
            f"max_url_length={self.max_url_length}, parser={self.parser!r}, "
            f"max_text={self.max_text})"
        )

    def process(self, doc: Document) -> Extracted:
        skipped: Counter[str] = Counter()
        charset = choose_charset(doc.body, doc.content_type, skipped)
        found, text = self._links(doc, charset, skipped)
        noindex, nofollow = found.noindex, found.nofollow
        if doc.robots_tag:
            header_noindex, header_nofollow = _robots_directives(doc.robots_tag)
            noindex |= header_noindex
            nofollow |= header_nofollow
        return Extracted(
            links=tuple(
                Link(url=url, kind=kind, nofollow=nf) for url, (kind, nf) in found.links.items()
            ),
            canonical=found.canonical,
            noindex=noindex,
            nofollow=nofollow,
            fingerprint=text.value(),
            skipped=skipped,
        )

    def _links(
        self, doc: Document, charset: tuple[str, int, str], skipped: Counter[str]
    ) -> tuple[_Links, _Simhash]:
        """The page's links and text, from the first of Lexbor (when chosen), libxml2's
        tree and the streaming parser that takes the page."""
        found, text = _Links(self, doc.url, skipped), _Simhash(self.max_text)
        size = len(doc.body)
        if size < _TREE_MAX:
            if self._from_a_tree(_utf8(doc.body, *charset), found, text):
                return found, text
        elif size <= _HUGE_TREE_MAX:
            with _HUGE_TREE:  # the tree is freed before the lock is released
                data = _utf8(doc.body, *charset)
                if tag_count(data) <= _HUGE_TREE_TAGS and self._from_a_tree(data, found, text):
                    return found, text
        found = _Links(self, doc.url, skipped)  # nothing of a refused tree is kept
        target = _HtmlTarget(found, skipped, self.max_text)
        with _STREAMING:
            _stream(doc.body, charset, target)
        return found, target.text

    def _from_a_tree(self, data: bytes, found: _Links, text: _Simhash) -> bool:
        """Whether the first of Lexbor (when chosen) and libxml2 that builds a tree of
        ``data`` (UTF-8) gave ``found`` and ``text`` its links and text."""
        if self.parser == "lexbor":
            try:
                _from_lexbor(data, found, text)
                return True
            except NoTree:
                pass
        try:
            _from_tree(_tree(data), found, text)
        except _NoTree:
            return False
        return True
