"""Tests for Lexbor's tree path (refresher.discover._lexbor) against libxml2's: the same links,
canonical, robots flags and fingerprints, or the documented difference."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pages import DATA, fixture
from hypothesis import given
from hypothesis import strategies as st

from refresher.discover import _lexbor
from refresher.discover._lexbor import NoTree, lexbor_tree, nesting_work
from refresher.discover._parse import Document, Extracted, HtmlLinks
from refresher.discover._simhash import hamming

ODD = Path(__file__).parents[1] / "data" / "html_odd"
URL = "http://example.com/dir/page.html"


def _both(body: bytes) -> tuple[Extracted, Extracted]:
    doc = Document(url=URL, content_type="text/html", body=body)
    lexbor = HtmlLinks(include_media=True).process(doc)
    lxml = HtmlLinks(include_media=True, parser="lxml").process(doc)
    return lexbor, lxml


def _links(result: Extracted) -> list[tuple[str, str, bool]]:
    return [(link.url, link.kind, link.nofollow) for link in result.links]


# --------------------------------------------------------------------------- the nesting guard


def _counted(data: bytes) -> int:
    """nesting_work's rule, tag by tag in Python: open elements per 3-byte name, never below 0,
    summed over every start and end tag that counts."""
    open_by_name: dict[bytes, int] = {}
    work = 0
    for m in re.finditer(rb"<(/?)([A-Za-z][A-Za-z0-9]{0,2})?", data):
        if not m.group(2):
            continue
        name = m.group(2).lower().ljust(3, b"\0")
        end = data.find(b">", m.start())
        if m.group(1):
            open_by_name[name] = max(open_by_name.get(name, 0) - 1, 0)
        elif (end > 0 and data[end - 1 : end] == b"/") or name in _lexbor._CLOSED:
            continue
        else:
            open_by_name[name] = open_by_name.get(name, 0) + 1
        work += sum(open_by_name.values())
    return work


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"no tags at all",
        b"<<<>>> < / >",
        b"<a",
        b"</",
        b"<div>x" * 100 + b"</div>" * 100,
        b"</x>" * 50 + b"<span>" * 50,  # stray end tags of another name hide nothing
        b"<span>" * 30 + b"<span></x>" * 30,
        b"<p>a<p>b<br><img src=x/><svg><path d='M0'/></svg><LI>c<Li>d</P>",
        b"<table><tr><td>a<td>b<tr><td>c</table><h1>t</h1><h2>u</h2>",
        b"/<div",  # no ">" after the tag: not self-closing, whatever came before it
        b"<div/><div x='/'>y</div><svg><g/><g><path/></g></svg",
    ],
)
def test_the_nesting_estimate_counts_open_elements_tag_by_tag(body: bytes) -> None:
    assert nesting_work(body) == _counted(body)


def test_every_docs_like_fixture_is_far_below_the_refusal_threshold() -> None:
    for path in sorted(DATA.glob("*.html")):
        assert nesting_work(path.read_bytes()) < _lexbor._MAX_WORK / 100, path.name


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>" + b"<div>x" * 100_000 + b"</div>" * 100_000,
        b"<span>" * 50_000 + b"</x>" * 50_000,
        b"<b><i>" * 20_000,
    ],
    ids=["100000 divs", "spans and stray end tags", "nested formatting"],
)
def test_pathological_nesting_is_refused_before_lexbor_parses_it(body: bytes) -> None:
    started = time.process_time()
    with pytest.raises(NoTree):
        lexbor_tree(body)
    # refused from the byte scan alone (Lexbor took 9 CPU s over 100,000 nested divs); CPU
    # time is reported, not asserted
    print(f"refused in {time.process_time() - started:.3f} CPU s")


def test_100000_nested_divs_still_give_their_link_and_note_the_depth() -> None:
    body = b"<div>" * 100_000 + b'<a href="/deep.html">deep</a>' + b"</div>" * 100_000
    lexbor, lxml = _both(body)
    assert _links(lexbor) == _links(lxml) == [("http://example.com/deep.html", "a", False)]
    assert lexbor.skipped == {"too_deep": 1}


_SOUP_PARTS = (
    "<div> </div> <p> </p> <br/> <img/> <span </x> <b> </b> < > </ /> <LI> <a1> x"
    " <div/ <Svg <path/> / = <TD> <tr </dIV"
)
_SOUP = st.lists(
    st.sampled_from([*_SOUP_PARTS.split(), "\x15", "<!-- c -->", "<svg/>"]),
    max_size=200,
)


@given(_SOUP)
def test_the_nesting_estimate_counts_open_elements_tag_by_tag_on_tag_soup(
    parts: list[str],
) -> None:
    body = "".join(parts).encode()
    assert nesting_work(body) == _counted(body)


@given(_SOUP)
def test_the_byte_count_bound_is_never_below_the_nesting_estimate(parts: list[str]) -> None:
    body = "".join(parts).encode()
    bound = _lexbor._work_bound(body.count(b"<"), body.count(b"</"))
    assert bound >= nesting_work(body)


@given(_SOUP)
def test_the_estimate_without_self_closing_tags_is_never_below_the_estimate(
    parts: list[str],
) -> None:
    body = "".join(parts).encode()
    buf = np.frombuffer(body, dtype=np.uint8)
    lt = np.flatnonzero(buf == 60)
    assert _lexbor._work(buf, lt, self_closing=False) >= nesting_work(body)


@given(_SOUP, st.integers(0, 300))
def test_a_page_is_refused_when_both_the_bound_and_the_estimate_pass_the_limit(
    parts: list[str], limit: int
) -> None:
    body = "".join(parts).encode()
    buf = np.frombuffer(body, dtype=np.uint8)
    lt = np.flatnonzero(buf == 60)
    bound = _lexbor._work(buf, lt, self_closing=False)
    saved, _lexbor._MAX_WORK = _lexbor._MAX_WORK, limit
    try:
        refused = _lexbor._too_much_work(buf, lt)
    finally:
        _lexbor._MAX_WORK = saved
    assert refused == (bound > limit and nesting_work(body) > limit)


def test_the_search_for_self_closing_tags_runs_only_above_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    searched: list[int] = []
    drop = _lexbor._drop_self_closing

    def spy(buf: Any, lt: Any, start: Any) -> None:
        searched.append(len(lt))
        drop(buf, lt, start)

    monkeypatch.setattr(_lexbor, "_drop_self_closing", spy)
    lexbor_tree(b"<div>x</div>" * 5000)  # bound 37.5 M, 5,000 without the "/"
    assert searched == []
    lexbor_tree(b"<g/>" * 7000)  # 24.5 M counted as open, 0 as they are: parsed
    assert searched == [7000]
    with pytest.raises(NoTree):
        lexbor_tree(b"<g>" * 7000)
    assert searched == [7000, 7000]


def test_the_bound_spares_a_docs_page_the_estimate_and_not_a_deep_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    estimated: list[int] = []

    def estimate(buf: object, lt: object) -> bool:
        estimated.append(len(buf))  # type: ignore[arg-type]
        return False

    monkeypatch.setattr(_lexbor, "_too_much_work", estimate)
    item = b'<li><a href="/p.html">p</a> <code class="x">f()</code></li>\n'
    lexbor_tree(b"<ul>" + item * 1200 + b"</ul>")  # 7,202 tags, 3,601 starts: bound 19.5 M
    assert estimated == []
    lexbor_tree(b"<div>" * 7000)  # bound 24.5 M
    lexbor_tree(b"<div>" * 5000 + b"</div>" * 5000)  # bound 37.5 M
    assert estimated == [7000 * 5, 10000 * 5.5]


def test_a_page_of_few_tags_is_parsed_without_the_estimate() -> None:
    body = b"<div>" * _lexbor._FEW_TAGS  # as deep as it can be, and still cheap
    assert lexbor_tree(body).css_first("div") is not None


# --------------------------------------------------------------------------- both parsers


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.html")))
def test_both_parsers_agree_on_the_fixture_pages(name: str) -> None:
    lexbor, lxml = _both(fixture(name))
    if name == "messy.html":  # a table never closed: what follows it moves before it
        assert sorted(_links(lexbor)) == sorted(_links(lxml))
        assert _links(lexbor) != _links(lxml)
        assert lexbor.fingerprint is not None and lxml.fingerprint is not None
        assert hamming(lexbor.fingerprint, lxml.fingerprint) > 3
    else:
        assert _links(lexbor) == _links(lxml)
        assert lexbor.fingerprint == lxml.fingerprint
    assert (lexbor.canonical, lexbor.noindex, lexbor.nofollow, lexbor.skipped) == (
        lxml.canonical,
        lxml.noindex,
        lxml.nofollow,
        lxml.skipped,
    )


# Where Lexbor (the tree browsers build) and libxml2 differ on the odd pages, and how.
_ONLY_LXML_LINKS = {
    # HTML5 ignores a <frameset> once the body has content; libxml2 keeps its frames
    "base_canonical_limits.html": {("https://other.example/base/f.html", "frame", False)},
    # a template's content is inert in browsers: not in Lexbor's tree
    "template.html": {("http://example.com/in-template", "a", False)},
}
_OTHER_TEXT = {
    # a comment inside a word splits it in Lexbor's text (libxml2 drops it and joins the
    # word); "<?php ... ?>" is a bogus comment up to the first ">" in HTML5, a PI in libxml2
    "comments_pis.html",
    # HTML5 drops NUL characters from text; libxml2 keeps them
    "nul_bytes.html",
    # text in a <noscript> before the body ends the head in HTML5 (a browser without scripts
    # shows it): it is visible text there; libxml2 keeps it in the noscript
    "noscript_head.html",
}


@pytest.mark.parametrize("name", sorted(p.name for p in ODD.glob("*.html")))
def test_both_parsers_agree_on_odd_pages_or_differ_as_documented(name: str) -> None:
    lexbor, lxml = _both((ODD / name).read_bytes())
    only_lxml = _ONLY_LXML_LINKS.get(name, set())
    assert [link for link in _links(lxml) if link not in only_lxml] == _links(lexbor)
    assert only_lxml <= set(_links(lxml))
    assert (lexbor.canonical, lexbor.noindex, lexbor.nofollow) == (
        lxml.canonical,
        lxml.noindex,
        lxml.nofollow,
    )
    if name in _OTHER_TEXT:
        assert lexbor.fingerprint != lxml.fingerprint
    else:
        assert lexbor.fingerprint == lxml.fingerprint


def test_links_after_the_end_of_the_document_are_found_without_streaming() -> None:
    lexbor, _ = _both((ODD / "after_end.html").read_bytes())
    assert "http://example.com/after-end" in {link.url for link in lexbor.links}
    assert lexbor.canonical == "http://example.com/canon-late"


def test_entities_in_attributes_are_decoded_alike() -> None:
    lexbor, _ = _both((ODD / "entities.html").read_bytes())
    assert lexbor.links[0].url == "http://example.com/q?a=1&b=2&copy=3&lt=4AB∉&"
    assert (lexbor.noindex, lexbor.nofollow) == (True, False)
    assert "http://example.com/refreshed" in {link.url for link in lexbor.links}


def test_an_unknown_parser_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="parser='html5lib': give one of 'lexbor', 'lxml'"):
        HtmlLinks(parser="html5lib")
