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

__all__ = ["NoTree", "lexbor_tree", "nesting_work", "tag_count"]

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


def _name_places() -> NDArray[np.uint16]:
    """Each byte's place among the bytes of a tag name as ``byte | 0x20`` reads them: 1-10
    the digits, 11-36 the letters (either case), 0 a byte that ends the name."""
    places = np.zeros(256, dtype=np.uint16)
    for byte in range(256):
        low = byte | 0x20
        if 48 <= low <= 57:
            places[byte] = 1 + low - 48
        elif 97 <= low <= 122:
            places[byte] = 11 + low - 97
    return places


_PLACE = _name_places()
_LETTER = 11  # the first letter's place: a name that starts with a letter is a tag
_PLACES = np.uint16(37)  # a name's first three places as one number below 37³ (uint16)


def _code(name: bytes) -> int:
    one, two, three = (int(_PLACE[byte]) for byte in name)
    return (one * 37 + two) * 37 + three


#: by a name's code: whether its start tags stay out of the count (:data:`_CLOSED`)
_CLOSED_CODE = np.zeros(37**3, dtype=bool)
_CLOSED_CODE[[_code(name) for name in _CLOSED]] = True


class NoTree(Exception):
    """The page is refused by Lexbor's tree path: another parser takes it."""


def _places(buf: NDArray[np.uint8], at: NDArray[np.intp]) -> NDArray[np.uint16]:
    """The name place (:func:`_name_places`) of the byte at each of ``at`` (ascending; 0
    past the end)."""
    place = _PLACE[buf[np.minimum(at, len(buf) - 1)]]
    if len(at) and at[-1] >= len(buf):
        place[at >= len(buf)] = 0
    return place


def nesting_work(data: bytes) -> int:
    """An estimate of the tree builder's element-steps: the number of open elements summed
    over the page's tags. Each tag name (by its first three bytes) keeps its own count of
    open elements, raised by its start tags and lowered by its end tags and never below 0,
    so stray end tags of another name cannot hide depth; void and self-closing tags (the
    first ">" after the "<" follows a "/") stay out."""
    buf = np.frombuffer(data, dtype=np.uint8)
    return _work(buf, np.flatnonzero(buf == 60))


def _work(buf: NDArray[np.uint8], lt: NDArray[np.intp], *, self_closing: bool = True) -> int:
    """:func:`nesting_work` of ``buf``, whose "<" are at ``lt``; with ``self_closing=False``
    an upper bound of it, without the search for each start tag's ">" (a third of the
    estimate's time): a self-closing start tag counts as opening its element, which can only
    add to every later count of its name."""
    if len(lt) == 0:
        return 0
    code, end, start = _tags(buf, lt)
    if self_closing:
        _drop_self_closing(buf, lt, start)
    return _tags_work(code, end, start)


def _tags(
    buf: NDArray[np.uint8], lt: NDArray[np.intp]
) -> tuple[NDArray[np.uint16], NDArray[np.bool_], NDArray[np.bool_]]:
    """Per "<" at ``lt``: the code of its tag's name (its first three bytes), whether it is an
    end tag, and whether a start tag that may open its element (void tags not; self-closing
    ones still, until :func:`_drop_self_closing`)."""
    slash = buf[np.minimum(lt + 1, len(buf) - 1)] == 47
    first = lt + 1 + slash
    one = _places(buf, first)
    two = _places(buf, first + 1) * (one > 0)  # a name ends at its first other byte
    three = _places(buf, first + 2) * (two > 0)
    code = (one * _PLACES + two) * _PLACES + three
    tagged = one >= _LETTER
    return code, tagged & slash, tagged & ~slash & ~_CLOSED_CODE[code]


def _tags_work(code: NDArray[np.uint16], end: NDArray[np.bool_], start: NDArray[np.bool_]) -> int:
    """The open elements summed over the tags :func:`_tags` gave (:func:`_open_sum`)."""
    keep = start | end
    return _open_sum(code[keep], np.where(start[keep], 1, -1))


def _drop_self_closing(
    buf: NDArray[np.uint8], lt: NDArray[np.intp], start: NDArray[np.bool_]
) -> None:
    """Clears ``start`` at the start tags whose first ">" after the "<" follows a "/"."""
    gt = np.flatnonzero(buf == 62)
    at = np.flatnonzero(start)
    close = np.searchsorted(gt, lt[at])
    closed = close < len(gt)
    at = at[closed]
    start[at[buf[gt[close[closed]] - 1] == 47]] = False


def _open_sum(code: NDArray[np.uint16], step: NDArray[np.int64]) -> int:
    """The open elements summed over a page's counted tags, in page order: ``code`` each
    tag's name, ``step`` +1 for a start tag and -1 for an end tag."""
    count = len(code)
    if count == 0:
        return 0
    # Per-name counts floored at 0: group the tags by name (page order within a name; a
    # stable sort of uint16, numpy's radix sort), and shift each group below the ones
    # before it so that one running minimum serves them all.
    order = np.argsort(code, kind="stable")
    named = code[order]
    first_of = np.empty(count, dtype=bool)
    first_of[0] = True
    np.not_equal(named[1:], named[:-1], out=first_of[1:])
    group = np.cumsum(first_of) - 1
    firsts = np.flatnonzero(first_of)
    total = np.cumsum(step[order])
    counted = total - np.r_[0, total][firsts][group]
    shift = group * (2 * count + 2)
    open_now = counted - np.minimum(np.minimum.accumulate(counted - shift) + shift, 0)
    change = np.diff(open_now, prepend=0)  # each tag's change of its name's count
    change[firsts] = open_now[firsts]
    # The counts summed after every tag in page order: each change counts once for every
    # tag from its own on.
    return int(np.dot(change, count - order))


def tag_count(data: bytes) -> int:
    """The number of "<" bytes in ``data``: numpy's compare and count take 0.6 ms on an
    8.4 MB page where ``bytes.count`` took 3.7."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == 60))


def _work_bound(tags: int, ends: int) -> int:
    """An upper bound of :func:`nesting_work` for a page of ``tags`` "<" of which ``ends``
    are followed by "/". Only the other ones can open an element, so at most
    ``starts = tags - ends`` are ever open, and after the k-th "<" at most k: the sum over
    the tags is at most 1 + 2 + ... + starts + (tags - starts) × starts."""
    starts = tags - ends
    return starts * (starts + 1) // 2 + (tags - starts) * starts


def _too_much_work(buf: NDArray[np.uint8], lt: NDArray[np.intp]) -> bool:
    """Whether :func:`nesting_work` of ``buf`` (its "<" at ``lt``) passes the limit: the bound
    without the self-closing tags first, the exact estimate only above the limit (the
    Node.js API docs' all.html: 4.5 M against 2.9 M, 22 against 36 ms; the Python docs'
    pages have no self-closing tags, the two are equal)."""
    code, end, start = _tags(buf, lt)  # once for both: only the self-closing tags differ
    if _tags_work(code, end, start) <= _MAX_WORK:
        return False
    _drop_self_closing(buf, lt, start)
    return _tags_work(code, end, start) > _MAX_WORK


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
        if _work_bound(tags, ends) > _MAX_WORK and _too_much_work(buf, np.flatnonzero(opens)):
            raise NoTree
    try:
        return LexborHTMLParser(data)
    except (SelectolaxError, RuntimeError) as e:
        raise NoTree from e
