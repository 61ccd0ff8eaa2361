"""The content-seen test of Mercator, keyed by what a document yields.

Mercator fingerprints each downloaded body and processes a body it has seen before only once, so
mirrors and aliases of a page do not have their links processed again. A body alone does not
say what its links are, though: relative links resolve against the URL the body came from, so
one template served by twenty hosts (``<a href="/p3">`` and no ``<base>``) names twenty sets of
pages. Deduplicating on the body's bytes hid nineteen of them.

The key here is therefore the document's *yield*: the body digest together with everything the
processors found in it, links already resolved against the base URL (see :func:`document_key`).
Two fetches share a key only when they would hand discovery exactly the same findings, so the
saving is kept for true duplicates (the same host's ``/`` and ``/index.html``; the same body
with an absolute ``<base href>`` on two hosts) and nothing is lost for the rest. Keying by
(digest, host) instead would still lose pages: two pages of one host serving the same body with
*path*-relative links (``href="next.html"`` under ``/a/`` and ``/b/``) yield different links.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from refresher.discover._parse import Extracted

__all__ = ["ContentSeen", "ContentSeenStatistics", "document_key"]


def document_key(digest: bytes, extracted: Extracted) -> bytes:
    """A 16-byte key of a body (its ``digest``) and what processing it yielded: every link
    (resolved URL, kind, rel=nofollow), rel=canonical, the robots flags and sitemap lastmods
    (to the second and coarser)."""
    h = hashlib.blake2b(digest, digest_size=16)
    # The links in one encode and one update (a hash of the bytes in one piece is the hash
    # of their pieces in turn): 11 -> 8 µs per docs page in the event loop.
    links = [f"\x00{link.kind}\x01{int(link.nofollow)}\x01{link.url}" for link in extracted.links]
    h.update("".join(links).encode(errors="replace"))
    h.update(
        f"\x02{extracted.canonical}\x01{int(extracted.noindex)}{int(extracted.nofollow)}".encode(
            errors="replace"
        )
    )
    for url, seconds in extracted.lastmod:
        h.update(f"\x03{url}\x01{seconds!r}".encode(errors="replace"))
    for url, seconds in extracted.coarse_lastmod:
        h.update(f"\x04{url}\x01{seconds!r}".encode(errors="replace"))
    return h.digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentSeenStatistics:
    remembered: int  # document keys held
    duplicates: int  # tests that named another page (since start)


class ContentSeen:
    """A bounded memory of document keys → the first page that yielded each.

    :meth:`test` is asked once per processed document; :meth:`again` for a page whose body is
    the one it served last time (not processed again), which keeps the answer of its last test.
    Both memories hold at most ``capacity`` entries, least recently used dropped first.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._first: OrderedDict[bytes, int] = OrderedDict()
        self._duplicate_of: OrderedDict[int, int] = OrderedDict()
        self._duplicates = 0

    def test(self, page_id: int, key: bytes) -> int | None:
        """Another page that yielded the document ``key`` recently, or None (then this page is
        remembered as its first)."""
        other = self._first.get(key)
        if other is None or other == page_id:
            self._remember(self._first, key, page_id)
            self._duplicate_of.pop(page_id, None)
            return None
        self._remember(self._duplicate_of, page_id, other)
        self._duplicates += 1
        return other

    def again(self, page_id: int) -> int | None:
        """The answer of ``page_id``'s last :meth:`test`, for a body it served before."""
        other = self._duplicate_of.get(page_id)
        if other is not None:
            self._duplicate_of.move_to_end(page_id)
            self._duplicates += 1
        return other

    def _remember(self, memory: OrderedDict[Any, int], key: Any, value: int) -> None:
        memory[key] = value
        memory.move_to_end(key)
        if len(memory) > self._capacity:
            memory.popitem(last=False)

    def statistics(self) -> ContentSeenStatistics:
        return ContentSeenStatistics(remembered=len(self._first), duplicates=self._duplicates)
