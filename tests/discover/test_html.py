"""Tests for HTML link extraction, charset handling and hostile pages (HtmlLinks).

The fixtures are in tests/data/html (see its README for what each covers).
"""

from __future__ import annotations

import json
import random
import threading
import tracemalloc
from collections import Counter
from typing import Any

import pytest
from _pages import DATA, STORY, fixture, html, triples, urls
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher.discover import _charset, _html, _simhash
from refresher.discover._parse import (
    Document,
    Extracted,
    HtmlLinks,
    Sitemaps,
    process,
    simhash,
)

# --------------------------------------------------------------------------- HTML links

MESSY_LINKS = [
    ("https://www.example.org/news/feed.xml", "link", False),
    ("https://www.example.org/", "a", False),
    ("https://www.example.org/news/sports/", "a", False),
    ("https://www.example.org/news/politics/index.html", "a", False),
    ("https://www.example.org/news/weather/today.html", "a", False),
    ("https://www.example.org/news/archive/?year=2024&month=05", "a", False),
    ("https://www.example.org/news/archive/?year=2024&month=04&page=2", "a", False),
    ("https://www.example.org/news/search?q=café&lang=fr", "a", False),
    ("https://cdn.example.net/report.pdf", "a", False),
    ("https://www.example.org/news/2024/story.html", "a", False),
    ("https://ads.example.com/click?id=1", "a", True),
    ("https://partner.example.com/", "a", False),
    ("https://www.example.org/news/tables/cell.html", "a", False),
    ("https://www.example.org/news/unclosed.html", "a", False),
    ("https://www.example.org/news/map/north.html", "area", False),
    ("https://video.example.com/embed/42", "iframe", False),
    ("HTTP://WWW.EXAMPLE.ORG/Upper/Case.html", "a", False),
]


# Lexbor builds the tree a browser builds: what follows the table that is never closed is
# foster-parented before it, so the table cell's link comes last; libxml2 keeps source order.
MESSY_LINKS_BY_PARSER = {
    "lexbor": [*MESSY_LINKS[:12], *MESSY_LINKS[13:], MESSY_LINKS[12]],
    "lxml": MESSY_LINKS,
}


@pytest.mark.parametrize("parser", _html.PARSERS)
def test_links_in_messy_html_are_resolved_deduplicated_and_in_document_order(parser: str) -> None:
    result = html(fixture("messy.html"), url=STORY, processor=HtmlLinks(parser=parser))
    assert triples(result) == MESSY_LINKS_BY_PARSER[parser]
    # mailto, javascript (twice), tel, data, ftp; "#comments" and "" point at the page itself
    assert dict(result.skipped) == {"scheme": 6, "self": 2}


def test_links_inside_comments_scripts_and_styles_are_not_links() -> None:
    found = " ".join(urls(html(fixture("messy.html"), url=STORY)))
    for hidden in ("commented-out", "from-script", "also-from-script", "from-style"):
        assert hidden not in found


def test_media_links_come_only_with_include_media() -> None:
    plain = html(fixture("messy.html"), url=STORY)
    media = html(fixture("messy.html"), url=STORY, processor=HtmlLinks(include_media=True))
    extra = [t for t in triples(media) if t not in MESSY_LINKS]
    assert extra == [
        ("https://www.example.org/css/site.css", "link", False),
        ("https://www.example.org/favicon.ico", "link", False),
        ("https://www.example.org/js/app.js", "script", False),
        ("https://www.example.org/img/photo.jpg", "img", False),
    ]
    assert not {"img", "script"} & {link.kind for link in plain.links}


def test_a_relative_base_href_is_resolved_against_the_document_url() -> None:
    result = html(fixture("messy.html"), url=STORY)
    assert "https://www.example.org/news/sports/" in urls(result)
    assert not any("ignored-second-base" in u for u in urls(result))  # only the first base


def test_an_absolute_base_href_moves_relative_links_to_its_host() -> None:
    result = html(fixture("base_absolute.html"), url="http://example.com/dir/page.html")
    assert urls(result) == [
        "https://mirror.example.net/docs/v2/intro.html",
        "https://mirror.example.net/docs/v1/old.html",
        "https://mirror.example.net/root.html",
        "https://mirror.example.net/docs/v2/?page=2",
        "https://elsewhere.example.com/x",
    ]


def test_an_unusable_base_href_is_counted_and_the_document_url_stays_the_base() -> None:
    result = html(fixture("base_bad.html"), url="http://example.com/dir/page.html")
    assert urls(result) == ["http://example.com/dir/kept-relative-to-the-document.html"]
    assert dict(result.skipped) == {"scheme": 1}


def test_the_canonical_link_is_recorded_absolute_without_fragment_and_not_returned() -> None:
    result = html(fixture("messy.html"), url=STORY)
    assert result.canonical == "https://www.example.org/news/2024/story.html?utm=x"
    assert "https://www.example.org/news/2024/story.html?utm=x" not in urls(result)


def test_rel_nofollow_marks_the_link_and_follow_leaves_it_out() -> None:
    result = html(fixture("messy.html"), url=STORY)
    assert ("https://ads.example.com/click?id=1", "a", True) in triples(result)
    followed = [link.url for link in result.follow()]
    assert "https://ads.example.com/click?id=1" not in followed
    assert len(followed) == len(MESSY_LINKS) - 1


def test_a_url_linked_with_and_without_nofollow_is_followable_once() -> None:
    result = html(
        '<a href="/x" rel="nofollow">1</a><a href="/x">2</a><a href="/y">3</a>'
        '<a href="/y" rel="nofollow">4</a>'
    )
    assert triples(result) == [
        ("http://example.com/x", "a", False),
        ("http://example.com/y", "a", False),
    ]


@pytest.mark.parametrize(
    ("name", "noindex", "nofollow"),
    [
        ("robots_noindex_upper.html", True, False),
        ("robots_multiple.html", True, True),
        ("robots_none.html", True, True),
        ("robots_other_agent.html", False, False),
        ("messy.html", False, False),
    ],
)
def test_meta_robots_in_any_case_and_over_several_tags(
    name: str, noindex: bool, nofollow: bool
) -> None:
    result = html(fixture(name))
    assert (result.noindex, result.nofollow) == (noindex, nofollow)


def test_a_nofollow_page_gives_its_links_but_none_to_follow() -> None:
    result = html(fixture("robots_multiple.html"))
    assert urls(result) == ["http://example.com/next", "http://example.com/other"]
    assert result.follow() == ()


@pytest.mark.parametrize(
    ("header", "noindex", "nofollow"),
    [
        ("noindex", True, False),
        ("NoFollow, noarchive", False, True),
        ("none", True, True),
        ("otherbot: noindex, nofollow", False, False),
        ("robots: nofollow", False, True),
        ("unavailable_after: 25 Jun 2010 15:00:00 PST", False, False),
    ],
)
def test_the_x_robots_tag_header_is_honoured_unless_it_names_another_agent(
    header: str, noindex: bool, nofollow: bool
) -> None:
    result = html("<a href=/x>x</a>", robots_tag=header)
    assert (result.noindex, result.nofollow) == (noindex, nofollow)


def test_frames_and_iframes_give_links() -> None:
    result = html(fixture("frameset.html"))
    assert triples(result) == [
        ("http://example.com/dir/menu.html", "frame", False),
        ("https://content.example.com/main.html", "frame", False),
    ]


def test_meta_refresh_gives_a_redirect_link() -> None:
    assert triples(html(fixture("meta_refresh.html"))) == [
        ("http://example.com/moved/here.html", "redirect", False)
    ]
    assert triples(html(fixture("meta_refresh_bare.html"))) == [
        ("https://other.example.com/landing", "redirect", False)
    ]


def test_whitespace_tabs_and_newlines_in_hrefs_are_removed_and_spaces_encoded() -> None:
    result = html(fixture("absurd_urls.html"), url="http://example.com/")
    assert "http://example.com/tabandnewline" in urls(result)
    assert "http://example.com/path%20with%20spaces/x.html" in urls(result)


def test_absurd_urls_are_skipped_and_counted_by_reason() -> None:
    result = html(fixture("absurd_urls.html"), url="http://example.com/")
    assert urls(result) == [
        "http://example.com/" + "b" * 1_900,
        "http://example.com/nul\ufffdchar",  # the parser turns &#0; into U+FFFD, as browsers do
        "http://example.com/tabandnewline",
        "http://bücher.example/katalog",
        "http://example.com/path%20with%20spaces/x.html",
        "http://example.com/ok.html",
    ]
    assert dict(result.skipped) == {
        "too_long": 1,  # 10 kB
        "control_chars": 2,  # a raw \x01 byte, &#127;
        "idna": 3,  # xn--a (not punycode), "exa mple.com", an empty label
        "bad_url": 3,  # port 99999, "[::1", user:secret@
        "scheme": 3,  # gopher:, foo:, c:\\
    }


def test_a_shorter_max_url_length_refuses_more() -> None:
    result = html(
        '<a href="/short">s</a><a href="/' + "x" * 50 + '">l</a>',
        processor=HtmlLinks(max_url_length=40),
    )
    assert urls(result) == ["http://example.com/short"]
    assert result.skipped == {"too_long": 1}


def test_links_past_max_links_are_counted_not_kept() -> None:
    body = "".join(f'<a href="/p{i}">p</a><a href="/p{i}">again</a>' for i in range(10))
    result = html(body, processor=HtmlLinks(max_links=4))
    assert urls(result) == [f"http://example.com/p{i}" for i in range(4)]
    assert result.skipped == {"too_many_links": 12}  # every link element after the cap


def test_broken_tags_do_not_stop_extraction() -> None:
    found = urls(html(fixture("broken_tags.html"), url="http://example.com/"))
    for path in ("one", "two", "three", "six", "seven"):
        assert f"http://example.com/{path}.html" in found


def test_an_html_processor_refuses_impossible_limits() -> None:
    with pytest.raises(ValueError, match="max_links"):
        HtmlLinks(max_links=-1)
    with pytest.raises(ValueError, match="max_text"):
        HtmlLinks(max_text=-1)
    with pytest.raises(ValueError, match="max_entries"):
        Sitemaps(max_bytes=0)


# --------------------------------------------------------------------------- charsets


@pytest.mark.parametrize(
    ("name", "content_type", "path", "charset_count"),
    [
        ("windows1252_declared.html", "text/html", "/café.html", 0),
        ("windows1252_undeclared.html", "text/html; charset=windows-1252", "/café.html", 0),
        ("windows1252_undeclared.html", "text/html; charset=ISO-8859-1", "/café.html", 0),
        ("windows1252_undeclared.html", "text/html", "/café.html", 0),  # web default
        ("windows1252_declared.html", "text/html; charset=utf-8", "/caf\ufffd.html", 1),
        ("windows1252_declared.html", "text/html; charset=x-klingon", "/café.html", 1),
        ("windows1252_declared.html", "text/html; charset=unicode_escape", "/café.html", 1),
        ("shift_jis_declared.html", "text/html", "/記事/一.html", 0),
        ("shift_jis_undeclared.html", "text/html; charset=Shift_JIS", "/記事/一.html", 0),
        ("shift_jis_undeclared.html", 'text/html; charset="x-sjis"', "/記事/一.html", 0),
        ("lying_charset.html", "text/html", "/記事/一.html", 1),  # says Shift_JIS, is UTF-8
    ],
)
def test_charset_from_header_then_meta_then_default_with_lies_counted(
    name: str, content_type: str, path: str, charset_count: int
) -> None:
    base = "http://example.com"
    result = html(fixture(name), url=base + "/", content_type=content_type)
    assert urls(result)[0] == base + path
    assert result.skipped.get("charset", 0) == charset_count


def test_undeclared_shift_jis_still_gives_its_ascii_links() -> None:
    result = html(fixture("shift_jis_undeclared.html"), url="http://example.com/")
    assert "http://example.com/ascii.html" in urls(result)
    assert len(result.links) == 2


def test_the_same_text_in_two_encodings_has_the_same_fingerprint() -> None:
    sjis = html(fixture("shift_jis_declared.html")).fingerprint
    utf8 = html(fixture("lying_charset.html")).fingerprint
    assert sjis is not None and sjis == utf8
    text = "Café menu – €3.50 “special” café plain"
    declared = html(fixture("windows1252_declared.html")).fingerprint
    assert declared == simhash("Café " + text)  # the title, then the body


def test_a_byte_order_mark_overrides_the_header() -> None:
    body = "<html><body><a href='/ü.html'>ü</a></body></html>".encode("utf-16")  # with BOM
    result = html(body, url="http://example.com/", content_type="text/html; charset=iso-8859-1")
    assert urls(result) == ["http://example.com/ü.html"]
    assert "charset" not in result.skipped


def test_iso_8859_1_is_read_as_windows_1252_like_browsers_do() -> None:
    result = html(b"<p>price \x803</p>", content_type="text/html; charset=iso-8859-1")
    assert result.fingerprint == simhash("price €3")


# --------------------------------------------------------------------------- bad input


def _deep(levels: int) -> bytes:
    return b"<div>" * levels + b'<a href="/deep.html">deep</a>' + b"</div>" * levels


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   \n\t ",
        b"\x00" * 4096,
        random.Random(7).randbytes(200_000),
        b"<",
        b"<a href",
        b'<a href="' + b"x" * 3_000_000 + b'">huge attribute</a><a href="/after">a</a>',
        b"<p>" + b"word " * 1_000_000,
        b"<a href=/x>" * 10_000,
        b"\xff\xfe\xfd not utf-8 <a href=/x>x</a>",
        b"<?xml version='1.0' encoding='utf-16'?><a href=/x>x</a>",
        b"<html><body>" + b"<table><tr><td>" * 5_000,
        b"<svg><a xlink:href='/svg'>s</a></svg><math><mi>x</mi></math>",
        b"<a href='&#x110000;&#xD800;&#0;'>bad references</a>",
    ],
    ids=lambda b: f"{len(b)}B:{bytes(b[:16])!r}",
)
def test_hostile_html_never_raises(body: bytes) -> None:
    result = process(Document(url="http://example.com/", content_type="text/html", body=body))
    assert isinstance(result, Extracted)
    assert len(result.links) <= 10_000
    assert all(link.url.startswith("http") for link in result.links)
    assert "processor_error" not in result.skipped


def test_100000_nested_divs_are_noted_and_their_links_still_found() -> None:
    result = html(_deep(100_000))
    assert urls(result) == ["http://example.com/deep.html"]
    assert result.skipped == {"too_deep": 1}


def _many_links(count: int = 100_000) -> bytes:
    item = b'<a href="/catalogue/section-%02d/item-%06d-%s.html">Item %d</a>\n'
    slug = b"with-a-long-descriptive-slug-for-readers"
    return b"<html><body>" + b"".join(item % (i % 100, i, slug, i) for i in range(count))


def _traced(body: bytes) -> tuple[Extracted, int]:
    """The page's result and the peak of Python's (and Lexbor's) allocations, bytes."""
    doc = Document(url="http://example.com/", content_type="text/html", body=body)
    tracemalloc.start()
    try:
        result = process(doc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.links) == 10_000
    assert result.skipped == {"too_many_links": body.count(b"<a ") - 10_000}
    assert result.fingerprint is not None
    return result, peak


def test_a_10_mb_page_with_100000_links_past_the_tree_bound_streams_in_bounded_memory() -> None:
    body = _many_links()
    assert len(body) > _html._HUGE_TREE_MAX
    _, peak = _traced(body)
    # Decoding the body or building a tree would each take more than the body's size.
    assert peak < 8_000_000, f"peak {peak / 1e6:.1f} MB of Python memory"


def test_a_10_mb_page_with_99000_links_takes_a_tree_within_its_memory_bound() -> None:
    body = _many_links(99_000)
    assert 10_000_000 < len(body) <= _html._HUGE_TREE_MAX
    _, peak = _traced(body)  # Lexbor allocates its tree through Python's allocator
    bound = 500 * body.count(b"<") + 2 * len(body)  # what _html's huge-tree bounds assume
    assert peak < bound, f"peak {peak / 1e6:.1f} MB against {bound / 1e6:.1f} MB"


# --------------------------------------------------------------------------- tree vs stream


def _both_paths(body: bytes, url: str = "http://example.com/dir/page.html") -> tuple[Any, Any]:
    """(links, canonical, flags, fingerprint, counts) from the tree path and the streaming path;
    None for the tree path when it refuses the page (which then streams)."""
    results: list[Any] = []
    for streaming in (False, True):
        skipped: Counter[str] = Counter()
        charset = _charset.choose_charset(body, "text/html", skipped)
        found = _html._Links(HtmlLinks(include_media=True), url, skipped)
        if streaming:
            target = _html._HtmlTarget(found, skipped)
            _html._stream(body, charset, target)
            text = target.text
        else:
            text = _simhash._Simhash()
            try:
                _html._from_tree(_html._tree(_html._utf8(body, *charset)), found, text)
            except _html._NoTree:
                results.append(None)
                continue
        flags = (found.noindex, found.nofollow)
        results.append((found.links, found.canonical, flags, text.value(), dict(skipped)))
    return results[0], results[1]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.html")))
def test_the_tree_path_finds_what_the_streaming_parser_finds(name: str) -> None:
    tree, stream = _both_paths(fixture(name))
    if tree is None:  # markup after </body> or </html>: the page streams
        assert _html._ends_early(fixture(name)), name
    else:
        assert tree == stream


_TAGS = ["a", "p", "div", "script", "style", "noscript", "b", "base", "link", "meta", "br"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([f"<{t}>" for t in _TAGS] + [f"</{t}>" for t in _TAGS]),
            st.sampled_from(['<a href="/x">', '<a href="y.html#f">', "<!-- c -->", "&amp;"]),
            st.sampled_from(['<base href="/b/">', '<link rel=canonical href="/c">']),
            st.text(alphabet="ab c.\n\u00e9", max_size=12),
        ),
        max_size=40,
    )
)
def test_the_tree_path_agrees_with_the_streaming_parser_on_tag_soup(parts: list[str]) -> None:
    body = "".join(parts).encode()
    tree, stream = _both_paths(body)
    assert tree is None or tree == stream


def _huge_page(size: int, seed: int = 12) -> bytes:
    """A documentation-like page of about ``size`` bytes: sections of words and links
    (relative, absolute, fragments, nofollow, images), scripts and styles."""
    rng = random.Random(seed)
    words = [rng.choice(["api", "Node", "stream", "buffer", "café", "2024", "x"]) + str(i % 97)
             for i in range(400)]  # fmt: skip
    head = (
        b'<!DOCTYPE html><html><head><title>Huge</title><base href="/docs/">'
        b'<link rel=canonical href="/docs/all.html"><link rel=stylesheet href="s.css">'
        b"<style>p { color: red }</style></head><body>"
    )
    parts, total = [head], len(head)
    while total < size:
        n = rng.randrange(10_000)
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(5, 60)))
        part = (
            f'<section id="s{n}"><h2><a href="#s{n}">§</a> Section {n}</h2><p>{text} '
            f'<a href="page-{n % 700}.html">page {n}</a>, <code>{rng.choice(words)}</code> '
            f'<a rel=nofollow href="https://other.example/{n % 50}">out</a></p>'
            f'<img src="i{n % 30}.png"><script>if (x{n} < 2) y = "/no";</script></section>\n'
        ).encode()
        parts.append(part)
        total += len(part)
    return b"".join(parts) + b"</body></html>"


def _path_taken(monkeypatch: Any, body: bytes, processor: HtmlLinks) -> tuple[Extracted, set[str]]:
    """The page's result, and which of the tree and streaming steps ran for it."""
    ran: set[str] = set()

    def spied(name: str) -> Any:
        step = getattr(_html, name)

        def spy(*args: Any) -> None:
            ran.add(name)
            step(*args)

        return spy

    for name in ("_from_lexbor", "_from_tree", "_stream"):
        monkeypatch.setattr(_html, name, spied(name))
    result = html(body, url="http://example.com/docs/all.html", processor=processor)
    monkeypatch.undo()
    return result, ran


@pytest.mark.parametrize(("parser", "step"), [("lexbor", "_from_lexbor"), ("lxml", "_from_tree")])
def test_a_page_over_4_mib_takes_a_tree_and_finds_what_the_streaming_parser_finds(
    monkeypatch: Any, parser: str, step: str
) -> None:
    body = _huge_page(5 * 1024 * 1024)
    assert _html._TREE_MAX < len(body) <= _html._HUGE_TREE_MAX
    processor = HtmlLinks(include_media=True, parser=parser)
    tree, ran = _path_taken(monkeypatch, body, processor)
    assert ran == {step}
    monkeypatch.setattr(_html, "_HUGE_TREE_MAX", 0)  # huge pages stream, as they did before
    stream, ran = _path_taken(monkeypatch, body, processor)
    assert ran == {"_stream"}
    assert tree == stream
    assert len(tree.links) > 700 and tree.canonical == "http://example.com/docs/all.html"


def test_a_huge_page_nested_too_deep_for_either_tree_streams(monkeypatch: Any) -> None:
    body = _deep(100_000) + _huge_page(4 * 1024 * 1024)
    result, ran = _path_taken(monkeypatch, body, HtmlLinks())
    # Lexbor's nesting guard refuses it before parsing (in _from_lexbor), and libxml2 stops
    # at its depth limit (before _from_tree)
    assert ran == {"_from_lexbor", "_stream"}
    assert result.skipped["too_deep"] == 1
    assert "http://example.com/deep.html" in urls(result)


def test_a_huge_page_with_more_tags_than_a_tree_may_hold_streams(monkeypatch: Any) -> None:
    body = b"<html><body>" + b"<p>words" * (_html._HUGE_TREE_TAGS + 1) + b'<a href="/last">'
    assert _html._TREE_MAX < len(body) < _html._HUGE_TREE_MAX
    result, ran = _path_taken(monkeypatch, body, HtmlLinks())
    assert ran == {"_stream"}
    assert urls(result) == ["http://example.com/last"]


def _most_at_once(
    monkeypatch: Any, name: str, body: bytes, processor: HtmlLinks | None = None
) -> int:
    """How many of two parse threads given ``body`` were inside ``_html.<name>`` at once.
    Each call waits (up to a deadline) for the other to enter: they meet only if the two
    can be inside at once."""
    entered = [threading.Event(), threading.Event()]
    inside = 0
    most = 0
    guard = threading.Lock()
    step = getattr(_html, name)

    def watched(*args: Any) -> None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
            mine = entered[0] if not entered[0].is_set() else entered[1]
            mine.set()
        (entered[1] if mine is entered[0] else entered[0]).wait(timeout=2.0)
        step(*args)
        with guard:
            inside -= 1

    monkeypatch.setattr(_html, name, watched)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(html(body, url=STORY, processor=processor)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0].links == results[1].links
    return most


def test_two_parse_threads_never_stream_pages_at_the_same_time(monkeypatch: Any) -> None:
    # two streaming pages at once make every callback of the two a GIL hand-off
    monkeypatch.setattr(_html, "_TREE_MAX", 1)  # every page is huge,
    monkeypatch.setattr(_html, "_HUGE_TREE_MAX", 0)  # and streams
    assert _most_at_once(monkeypatch, "_stream", fixture("messy.html")) == 1


@pytest.mark.parametrize(("parser", "step"), [("lexbor", "_from_lexbor"), ("lxml", "_from_tree")])
def test_two_parse_threads_never_build_huge_trees_at_the_same_time(
    monkeypatch: Any, parser: str, step: str
) -> None:
    monkeypatch.setattr(_html, "_TREE_MAX", 1)  # every page is huge, and takes a tree
    body = fixture("article_river.html")
    assert _most_at_once(monkeypatch, step, body, HtmlLinks(parser=parser)) == 1


def test_two_parse_threads_build_trees_of_pages_below_the_huge_bound_at_once(
    monkeypatch: Any,
) -> None:
    # what the test above would see without the lock: it can fail
    assert _most_at_once(monkeypatch, "_from_lexbor", fixture("article_river.html")) == 2


def test_a_page_of_a_mebibyte_is_huge_so_two_threads_never_build_its_tree_at_once(
    monkeypatch: Any,
) -> None:
    # below the bound every parse thread (one per core) may hold a tree at once, each up to
    # ~85 bytes per byte of tag-dense markup: the bound is what keeps that sum small
    assert _html._TREE_MAX <= 1024 * 1024
    body = _huge_page(_html._TREE_MAX)
    assert _most_at_once(monkeypatch, "_from_lexbor", body) == 1


# --------------------------------------------------------------------------- real pages

# Pages of three documentation trees (tests/data/html/docs/README.md) and what the processor
# found on each before the parse's stages were reworked for CPU (commit e01fbe6): the
# rework must leave every link (in order), flag, skip count and fingerprint as it was.
_DOCS = DATA / "docs"
_DOC_URLS = {
    "python-library-shlex.html": "http://docs.example/library/shlex.html",
    "nodejs-api-tty.html": "http://docs.example/api/tty.html",
    "rust-book-ch03-02-data-types.html": "http://docs.example/book/ch03-02-data-types.html",
}
_DOC_PROCESSORS = {
    "lexbor": HtmlLinks(),
    "lxml": HtmlLinks(parser="lxml"),
    "lexbor+media": HtmlLinks(include_media=True),
}


@pytest.mark.parametrize("page", sorted(_DOC_URLS))
@pytest.mark.parametrize("processor", sorted(_DOC_PROCESSORS))
def test_a_real_documentation_page_gives_what_it_gave_before_the_rework(
    page: str, processor: str
) -> None:
    expected = json.loads((_DOCS / "expected.json").read_text())[f"{page} {processor}"]
    doc = Document(url=_DOC_URLS[page], content_type="text/html", body=(_DOCS / page).read_bytes())
    found = _DOC_PROCESSORS[processor].process(doc)
    assert [[link.url, link.kind, link.nofollow] for link in found.links] == expected["links"]
    assert (found.canonical, found.noindex, found.nofollow) == (
        expected["canonical"],
        expected["noindex"],
        expected["nofollow"],
    )
    assert found.fingerprint == expected["fingerprint"]
    assert dict(found.skipped) == expected["skipped"]


# --------------------------------------------------------------------------- the text bound


def _article(paragraphs: list[str]) -> bytes:
    body = "".join(f"<p>{text}</p>" for text in paragraphs)
    return f"<html><body>{body}</body></html>".encode()


@pytest.mark.parametrize("parser", ["lexbor", "lxml"])
def test_text_past_max_text_does_not_move_the_fingerprint(parser: str) -> None:
    words = " ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(2000))
    bounded = HtmlLinks(max_text=5000, parser=parser)
    before = html(_article([words, "the end of the page as it was"]), processor=bounded)
    after = html(_article([words, "a wholly rewritten ending of it"]), processor=bounded)
    assert before.fingerprint == after.fingerprint
    unbounded = HtmlLinks(max_text=0, parser=parser)
    assert (
        html(_article([words, "the end of the page as it was"]), processor=unbounded).fingerprint
        != html(
            _article([words, "a wholly rewritten ending of it"]), processor=unbounded
        ).fingerprint
    )


def test_the_fingerprint_under_max_text_is_the_simhash_of_the_texts_first_characters() -> None:
    words = " ".join(f"w{i % 977}x" for i in range(3000))
    found = html(_article([words]), processor=HtmlLinks(max_text=1000))
    assert found.fingerprint == simhash((" " + words)[:1000])


def test_a_page_that_streams_is_bounded_by_max_text_too() -> None:
    words = " ".join(f"w{i % 977}x" for i in range(3000))
    body = _article([words]) + b"<p>after the end</p>"  # markup after </html>: streams
    assert _html._ends_early(body)
    found = html(body, processor=HtmlLinks(max_text=1000))
    assert found.fingerprint == simhash((" " + words)[:1000])


def _tree_text(body: bytes) -> Any:
    from selectolax.lexbor import LexborHTMLParser

    return LexborHTMLParser(body)


_NESTED_TEXT = (
    "<html><head><title>T</title></head><body>\n <div id=c>  <div>"
    + "".join(
        f"<section><h2>s{i}</h2> <p>a <b>b{i}</b>c&amp;d</p>\n<!-- n --> x{i} </section>"
        for i in range(80)
    )
    + "</div> tail <p>  </p></div>  end </body></html>"
).encode()


@pytest.mark.parametrize("limit", [1, 2, 3, 10, 57, 400, 1000, 10**6])
def test_the_text_walk_with_a_limit_begins_as_the_whole_text_and_stops_after_it(
    limit: int,
) -> None:
    tree = _tree_text(_NESTED_TEXT)
    whole = _html._lexbor_text(tree)
    part = _html._lexbor_text(tree, limit)
    assert whole is not None and part is not None
    assert whole.startswith(part)
    assert len(part) >= limit or part == whole
    assert len(whole) > 1000 and (limit > 1000 or len(part) < len(whole))  # it stopped


@given(st.integers(min_value=1, max_value=2000))
def test_the_text_walk_with_a_limit_begins_as_the_whole_text_for_any_limit(limit: int) -> None:
    tree = _tree_text(_NESTED_TEXT)
    whole = _html._lexbor_text(tree)
    part = _html._lexbor_text(tree, limit)
    assert whole is not None and part is not None
    assert whole.startswith(part) and (len(part) >= limit or part == whole)


def test_the_text_walk_takes_whole_texts_once_it_has_wrapped_its_share_of_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_html, "_WALK_NODES", 6)
    walked: list[str] = []
    element = _html._TextWalk.element

    def spy(self: Any, node: Any) -> None:
        walked.append(node.tag)
        element(self, node)

    monkeypatch.setattr(_html._TextWalk, "element", spy)
    body = b"<div>" * 50 + b"<p>x</p> y" * 5 + b"</div>" * 50  # every element a wrapper
    tree = _tree_text(body)
    whole, part = _html._lexbor_text(tree), _html._lexbor_text(tree, 3)
    assert whole is not None and part is not None
    assert whole.startswith(part) and len(part) >= 3
    assert walked == ["html", "head", "body", "div", "div", "div"]  # then texts whole


def test_a_page_over_max_text_bytes_gets_the_fingerprint_it_got_with_the_whole_text() -> None:
    words = " ".join(f"w{i % 977}x" for i in range(3000))
    body = _article([words[i : i + 700] for i in range(0, len(words), 700)])
    bounded = html(body, processor=HtmlLinks(max_text=1000))
    assert len(body) > 1000
    assert bounded.fingerprint == simhash(
        " " + " ".join(words[i : i + 700] for i in range(0, len(words), 700))[:999]
    )
