"""The Lexbor tree of a page for :class:`~refresher.discover._html.HtmlLinks`, and the guard
that keeps pathological nesting away from it.

Lexbor (through selectolax) builds the HTML5 tree a browser builds, in C and without the GIL,
in about a quarter of libxml2's time on documentation pages (bench/bench_parsers.py). Its tree
builder checks scopes by walking the stack of open elements, so a page's cost grows with the
number of its tags times their depth: 20,000 nested ``<div>`` took 0.35 CPU s, 100,000 took
9 s. :func:`lexbor_tree` therefore estimates that product first and refuses the page
(:class:`NoTree`) when it is large, and the caller takes libxml2, whose tree stops at a depth
limit, or its streaming parser.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from selectolax.lexbor import LexborHTMLParser, SelectolaxError

__all__ = ["NoTree", "lexbor_tree", "nesting_work"]

#: pages with at most this many "<" bytes parse in bounded time however they nest
_FEW_TAGS = 4096
#: estimated element-steps of the tree builder above which a page is refused: 10,000 nested
#: divs (100 M steps) took 83 CPU ms, so 20 M are about 17 ms, what libxml2 takes for 0.7 MB
_MAX_WORK = 20_000_000

# Start tags that never stay open on the stack (void elements), or close their own kind
# before they nest in it (p, li, cells, rows, dd/dt, option): by their first three
# lowercased name bytes, a name shorter than three padded with zeros.
_CLOSED = [
    b"p\0\0", b"br\0", b"hr\0", b"li\0", b"td\0", b"th\0", b"tr\0", b"dd\0", b"dt\0",
    b"are", b"bas", b"col", b"emb", b"img", b"inp", b"lin", b"met", b"sou", b"tra", b"wbr",
    b"par", b"opt",
]  # fmt: skip
_CLOSED_CODES = np.array([int.from_bytes(c, "big") for c in _CLOSED], dtype=np.int64)


class NoTree(Exception):
    """The page is refused by Lexbor's tree path: another parser takes it."""


def _name_byte(data: NDArray[np.uint8], at: NDArray[np.intp]) -> NDArray[np.int64]:
    """The lowercased tag-name byte at each of ``at`` (0 where there is no name byte)."""
    byte = data[np.minimum(at, len(data) - 1)] | 0x20
    name = ((byte >= 97) & (byte <= 122)) | ((byte >= 48) & (byte <= 57))
    return np.where(name & (at < len(data)), byte, 0).astype(np.int64)


def nesting_work(data: bytes) -> int:
    """An estimate of the tree builder's element-steps: the number of open elements summed
    over the page's tags. Each tag name (by its first three bytes) keeps its own count of
    open elements, raised by its start tags and lowered by its end tags and never below 0,
    so stray end tags of another name cannot hide depth; void and self-closing tags stay
    out."""
    buf = np.frombuffer(data, dtype=np.uint8)
    lt = np.flatnonzero(buf == 60)
    slash = buf[np.minimum(lt + 1, len(buf) - 1)] == 47
    first = lt + 1 + slash
    one = _name_byte(buf, first)
    two = _name_byte(buf, first + 1) * (one > 0)  # a name ends at its first other byte
    three = _name_byte(buf, first + 2) * (two > 0)
    code = (one << 16) | (two << 8) | three
    tagged = code >= (97 << 16)  # a name that starts with a letter: a tag
    gt = np.flatnonzero(buf == 62)
    close = gt[np.minimum(np.searchsorted(gt, lt), max(len(gt) - 1, 0))] if len(gt) else lt
    self_closing = buf[np.maximum(close - 1, 0)] == 47
    start = tagged & ~slash & ~self_closing & ~np.isin(code, _CLOSED_CODES)
    end = tagged & slash
    keep = start | end
    code, step = code[keep], np.where(start[keep], 1, -1)
    if len(code) == 0:
        return 0
    # Per-name counts floored at 0: group the tags by name (page order within a name), and
    # shift each group below the ones before it so that one running minimum serves them all.
    order = np.argsort(code, kind="stable")
    named = code[order]
    first_of = np.r_[True, named[1:] != named[:-1]]
    group = np.cumsum(first_of) - 1
    total = np.cumsum(step[order])
    counted = total - np.r_[0, total][np.flatnonzero(first_of)][group]
    shift = group * (2 * len(code) + 2)
    floor = np.minimum(np.minimum.accumulate(counted - shift) + shift, 0)
    open_now = counted - floor
    before = np.r_[0, open_now[:-1]]
    before[first_of] = 0
    # Back in page order: each tag's change of its name's count, summed up to each tag.
    change = np.empty_like(open_now)
    change[order] = open_now - before
    return int(np.cumsum(change).sum())


def _work_bound(tags: int, ends: int) -> int:
    """An upper bound of :func:`nesting_work` for a page of ``tags`` "<" of which ``ends``
    are followed by "/". Only the other ones can open an element, so at most
    ``starts = tags - ends`` are ever open, and after the k-th "<" at most k: the sum over
    the tags is at most 1 + 2 + ... + starts + (tags - starts) × starts."""
    starts = tags - ends
    return starts * (starts + 1) // 2 + (tags - starts) * starts


def lexbor_tree(data: bytes) -> LexborHTMLParser:
    """The parsed page (``data`` is UTF-8); :class:`NoTree` when its nesting would make the
    tree builder slow, or Lexbor fails (out of memory)."""
    # The tag counts by numpy: 0.05 ms on a docs page of 6,000 tags, where bytes.count took
    # 0.29 for "<" and "</"; the bound spares most such pages the estimate (0.8 ms).
    buf = np.frombuffer(data, dtype=np.uint8)
    opens = buf == 60
    tags = int(np.count_nonzero(opens))
    if tags > _FEW_TAGS:
        ends = int(np.count_nonzero(opens[:-1] & (buf[1:] == 47)))
        if _work_bound(tags, ends) > _MAX_WORK and nesting_work(data) > _MAX_WORK:
            raise NoTree
    try:
        return LexborHTMLParser(data)
    except (SelectolaxError, RuntimeError) as e:
        raise NoTree from e
