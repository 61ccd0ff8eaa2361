"""Tests for the processing modules: HTML links, sitemaps, simhash, the registry.

The HTML and sitemap fixtures are in tests/data/html (see its README for what each covers).
"""

from __future__ import annotations

import gzip
import random
import tracemalloc
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from refresher._errors import ConfigError
from refresher.discover import _parse
from refresher.discover._parse import (
    ENTRY_POINT_GROUP,
    Document,
    Extracted,
    HtmlLinks,
    Link,
    ParseCounters,
    Sitemaps,
    available,
    hamming,
    meaningful_change,
    process,
    processors_for,
    register,
    simhash,
    unregister,
)

DATA = Path(__file__).parents[1] / "data" / "html"
STORY = "https://www.example.org/news/2024/story.html"


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def html(
    body: bytes | str,
    *,
    url: str = "http://example.com/dir/page.html",
    content_type: str | None = "text/html",
    robots_tag: str | None = None,
    processor: HtmlLinks | None = None,
) -> Extracted:
    data = body.encode() if isinstance(body, str) else body
    doc = Document(url=url, content_type=content_type, body=data, robots_tag=robots_tag)
    return (processor or HtmlLinks()).process(doc)


def triples(result: Extracted) -> list[tuple[str, str, bool]]:
    return [(link.url, link.kind, link.nofollow) for link in result.links]


def urls(result: Extracted) -> list[str]:
    return [link.url for link in result.links]


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish with it; entry points are not read."""
    monkeypatch.setattr(_parse, "_registered", {})
    monkeypatch.setattr(_parse, "_plugins", {})


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


def test_links_in_messy_html_are_resolved_deduplicated_and_in_document_order() -> None:
    result = html(fixture("messy.html"), url=STORY)
    assert triples(result) == MESSY_LINKS
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


def test_a_10_mb_page_with_100000_links_stays_within_bounded_memory() -> None:
    item = b'<a href="/catalogue/section-%02d/item-%06d-%s.html">Item %d</a>\n'
    slug = b"with-a-long-descriptive-slug-for-readers"
    body = b"<html><body>" + b"".join(item % (i % 100, i, slug, i) for i in range(100_000))
    assert len(body) > 10_000_000
    doc = Document(url="http://example.com/", content_type="text/html", body=body)
    tracemalloc.start()
    try:
        result = process(doc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.links) == 10_000
    assert result.skipped == {"too_many_links": 90_000}
    assert result.fingerprint is not None
    # Decoding the body or building a tree would each take more than the body's size.
    assert peak < 8_000_000, f"peak {peak / 1e6:.1f} MB of Python memory"


# --------------------------------------------------------------------------- sitemaps


def sitemap(
    body: bytes,
    *,
    url: str = "https://www.example.org/sitemap.xml",
    content_type: str | None = "application/xml",
    processor: Sitemaps | None = None,
) -> Extracted:
    return (processor or Sitemaps()).process(
        Document(url=url, content_type=content_type, body=body)
    )


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


def test_a_urlset_gives_its_pages_and_lastmod_in_w3c_formats_as_unix_seconds() -> None:
    result = sitemap(fixture("sitemap_urlset.xml"))
    site = "https://www.example.org"
    assert [link.kind for link in result.links] == ["url"] * 13
    assert urls(result)[:3] == [f"{site}/", f"{site}/year", f"{site}/month"]
    assert dict(result.lastmod) == {
        f"{site}/": utc(2024, 5, 6),
        f"{site}/year": utc(2024, 1, 1),
        f"{site}/month": utc(2024, 5, 1),
        f"{site}/minutes": utc(2024, 5, 6, 8, 32),  # +02:00
        f"{site}/seconds": utc(2024, 5, 6, 10, 32, 15),
        f"{site}/fraction": utc(2024, 5, 6, 15, 32, 15) + 0.25,  # -05:00
        f"{site}/no-zone": utc(2024, 5, 6, 10, 32, 15),  # read as UTC
        f"{site}/no-colon-zone": utc(2024, 5, 6, 5, 2, 15),  # +0530
        f"{site}/whitespace?a=1&b=2": utc(2024, 5, 6),
    }
    # "yesterday", month 13, 30 February; javascript:; an empty and a missing <loc>
    assert dict(result.skipped) == {"lastmod": 3, "scheme": 1, "bad_url": 2}


def test_a_sitemap_index_gives_sitemap_links() -> None:
    result = sitemap(fixture("sitemap_index.xml"))
    assert triples(result) == [
        ("https://www.example.org/sitemap-news.xml", "sitemap", False),
        ("https://www.example.org/sitemap-archive.xml.gz", "sitemap", False),
    ]
    assert result.lastmod == (
        ("https://www.example.org/sitemap-news.xml", utc(2024, 5, 6, 10, 32, 15)),
    )


def test_a_sitemap_without_namespace_is_read() -> None:
    result = sitemap(fixture("sitemap_no_namespace.xml"))
    assert urls(result) == ["http://old.example.com/a", "http://old.example.com/b"]


def test_sitemap_extensions_are_passed_over_and_markup_in_a_loc_is_refused() -> None:
    result = sitemap(fixture("sitemap_extensions.xml"))
    assert urls(result) == ["https://www.example.org/gallery", "https://www.example.org/after"]
    assert result.lastmod == (("https://www.example.org/gallery", utc(2024, 5, 6)),)
    assert result.skipped == {"bad_url": 1}


def test_the_sitemap_tree_never_holds_more_than_the_current_entry() -> None:
    entry = (
        b"<url><loc>http://a.example/%d</loc><lastmod>2024-01-01</lastmod>"
        b"<x:extra xmlns:x='urn:x'>"
        + b"<x:deep><x:deeper>text</x:deeper></x:deep>" * 50
        + b"</x:extra></url>"
    )
    body = b"<urlset>" + b"".join(entry % i for i in range(500)) + b"</urlset>"
    reader = _parse._SitemapReader(Sitemaps(), "http://a.example/s.xml", Counter())
    parser = etree.XMLPullParser(events=("start", "end"))
    largest = 0
    for i in range(0, len(body), 1000):
        parser.feed(body[i : i + 1000])
        assert reader.take(parser.read_events())
        largest = max(largest, sum(1 for _ in reader.root.iter()))
    assert len(reader.links) == 500
    # The root, the entry, its loc and lastmod and the extension element being read; not
    # the 100 finished extension elements of the entry, nor earlier entries.
    assert largest <= 8


def test_a_gzip_sitemap_reads_like_the_plain_one() -> None:
    plain = sitemap(fixture("sitemap_urlset.xml"))
    packed = sitemap(
        gzip.compress(fixture("sitemap_urlset.xml")),
        url="https://www.example.org/sitemap.xml.gz",
        content_type="application/x-gzip",
    )
    assert packed == plain


def test_concatenated_gzip_members_are_all_read() -> None:
    data = fixture("sitemap_no_namespace.xml")
    half = len(data) // 2
    result = sitemap(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    assert urls(result) == ["http://old.example.com/a", "http://old.example.com/b"]


def test_a_truncated_gzip_sitemap_keeps_the_entries_before_the_cut() -> None:
    body = b"<urlset><url><loc>http://a.example/1</loc></url>" + b" " * 100_000
    body += b"<url><loc>http://a.example/2</loc></url></urlset>"
    packed = gzip.compress(body)
    result = sitemap(packed[: len(packed) // 2])
    assert urls(result) == ["http://a.example/1"]
    assert result.skipped == {"gzip": 1}


def test_a_gzip_bomb_is_cut_at_max_bytes_without_landing_in_memory() -> None:
    body = b"<urlset><url><loc>http://a.example/first</loc></url>" + b" " * 50_000_000
    bomb = gzip.compress(body + b"<url><loc>http://a.example/late</loc></url></urlset>")
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        result = sitemap(bomb, processor=Sitemaps(max_bytes=1_000_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert urls(result) == ["http://a.example/first"]
    assert result.skipped == {"too_large": 1}
    assert peak < 2_000_000


def test_billion_laughs_is_refused_without_expanding() -> None:
    tracemalloc.start()
    try:
        result = sitemap(fixture("sitemap_billion_laughs.xml"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.links == ()
    assert result.skipped == {"entity": 1}
    assert peak < 1_000_000


def test_external_and_internal_entities_are_never_loaded_or_expanded() -> None:
    result = sitemap(fixture("sitemap_xxe.xml"))
    assert urls(result) == ["https://www.example.org/plain?a=1&b=2"]
    assert result.skipped == {"entity": 3}
    assert not any("root:" in u or "expanded" in u for u in urls(result))


def test_a_broken_sitemap_keeps_the_entries_before_the_error() -> None:
    result = sitemap(fixture("sitemap_broken.xml"))
    assert urls(result) == ["https://www.example.org/before"]
    assert result.skipped == {"parse_error": 1}


def test_xml_that_is_not_a_sitemap_gives_nothing() -> None:
    result = sitemap(fixture("not_a_sitemap.xml"))
    assert result.links == ()
    assert result.skipped == {"not_sitemap": 1}


def test_entries_past_max_entries_are_counted() -> None:
    result = sitemap(fixture("sitemap_urlset.xml"), processor=Sitemaps(max_entries=2))
    assert len(result.links) == 2
    assert result.skipped["too_many_links"] == 11


def test_an_html_page_served_as_xml_is_no_sitemap_and_no_crash() -> None:
    result = sitemap(fixture("messy.html"))
    assert result.links == ()
    assert set(result.skipped) <= {"parse_error", "not_sitemap"}
    assert sum(result.skipped.values()) == 1


def test_deeply_nested_xml_is_counted_too_deep() -> None:
    result = sitemap(b"<urlset>" + b"<url>" * 5_000 + b"</url>" * 5_000 + b"</urlset>")
    assert result.links == ()
    assert result.skipped == {"too_deep": 1}


# --------------------------------------------------------------------------- simhash


def test_simhash_values_are_stable_because_they_are_stored() -> None:
    # Fingerprints live in the history; if this changes, every stored one becomes useless.
    assert simhash("The quick brown fox jumps over the lazy dog") == 0xA9B4C992E6F45591
    assert simhash("hello") == 0xF8E479CA66F653CE


def test_simhash_ignores_case_punctuation_and_digit_values() -> None:
    assert simhash("Hello, World! Foo.") == simhash("hello world foo")
    assert simhash("read 1204 times on 2024-05-06") == simhash("read 1377 times on 2024-05-07")
    assert simhash("read 1204 times") != simhash("read many times")


def test_simhash_of_no_words_is_none_and_of_one_word_is_not() -> None:
    assert simhash("") is None
    assert simhash(" ... !!! \n") is None
    assert simhash("hello") is not None and simhash("hello") != simhash("world")


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_simhash_does_not_depend_on_how_text_is_split(text: str, cuts: list[int]) -> None:
    pieces = [
        text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)
    ]
    streamed = _parse._Simhash()
    for piece in pieces:
        streamed.feed(piece)
    assert streamed.value() == simhash(text)


def test_simhash_of_long_text_does_not_depend_on_how_it_is_split() -> None:
    rng = random.Random(3)
    vocabulary = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta!", "eta,", "θήτα", "42"]
    text = " ".join(rng.choice(vocabulary) for _ in range(60_000))  # ~350 kB, several batches
    streamed = _parse._Simhash()
    position = 0
    while position < len(text):
        step = rng.randrange(1, 90_000)
        streamed.feed(text[position : position + step])
        position += step
    assert streamed.value() == simhash(text)


def test_simhash_of_a_long_text_is_computed_in_bounded_batches() -> None:
    assert simhash("word " * 300_000) == simhash("word word word")


def test_the_html_fingerprint_is_the_simhash_of_the_visible_text() -> None:
    page = (
        "<html><head><title>Alpha</title><style>p { color: red }</style></head><body>"
        "<p>beta <b>gamma</b></p><script>var delta = 'epsilon';</script><!-- zeta -->"
        "<noscript>eta</noscript><template>theta</template><div>iota</div></body></html>"
    )
    assert html(page).fingerprint == simhash("alpha beta gamma iota")


def _fingerprint(name: str) -> int:
    value = html(fixture(name)).fingerprint
    assert value is not None
    return value


def test_a_changed_timestamp_and_counter_are_not_a_meaningful_change() -> None:
    v1, v2 = _fingerprint("article_library_v1.html"), _fingerprint("article_library_v2.html")
    assert fixture("article_library_v1.html") != fixture("article_library_v2.html")
    assert hamming(v1, v2) <= 3
    assert not meaningful_change(v1, v2)


def test_a_rewritten_paragraph_is_a_meaningful_change() -> None:
    v1 = _fingerprint("article_library_v1.html")
    edited = _fingerprint("article_library_edited.html")
    assert meaningful_change(v1, edited)


def test_different_articles_are_far_apart() -> None:
    library, river = _fingerprint("article_library_v1.html"), _fingerprint("article_river.html")
    assert hamming(library, river) >= 16  # unrelated texts differ in about 32 of 64 bits


def test_hamming_and_meaningful_change_edge_cases() -> None:
    assert hamming(0b1011, 0b0001) == 2
    assert hamming(2**64 - 1, 0) == 64
    assert not meaningful_change(None, None)
    assert meaningful_change(None, 5)
    assert meaningful_change(5, None)
    assert not meaningful_change(0b111, 0b000)  # 3 bits: within the default threshold
    assert meaningful_change(0b1111, 0b0000)
    assert meaningful_change(0b111, 0b000, threshold=2)


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("content_type", "url", "expected"),
    [
        ("text/html; charset=UTF-8", None, ("html-links",)),
        ("TEXT/HTML", None, ("html-links",)),
        ("application/xhtml+xml", None, ("html-links",)),
        ("text/xml", None, ("sitemaps",)),
        ("application/xml; charset=utf-8", None, ("sitemaps",)),
        ("image/png", None, ()),
        (None, None, ()),
        ("application/x-gzip", "https://a.example/sitemap.xml.gz", ("sitemaps",)),
        ("application/octet-stream", "https://a.example/SITEMAP.XML", ("sitemaps",)),
        (None, "https://a.example/sitemap.xml?page=2", ("sitemaps",)),
        ("text/html", "https://a.example/sitemap.xml", ("html-links",)),
        ("text/plain", "https://a.example/page.html", ()),
    ],
)
def test_processors_are_chosen_by_mime_type_and_sitemap_urls(
    clean_registry: None, content_type: str | None, url: str | None, expected: tuple[str, ...]
) -> None:
    assert tuple(p.name for p in processors_for(content_type, url=url)) == expected


class Recorder:
    """A third-party processor for the tests."""

    name = "recorder"

    def __init__(self, *mime_types: str, link: str = "http://third.example/") -> None:
        self.mime_types = mime_types
        self.link = link
        self.seen: list[str] = []

    def process(self, doc: Document) -> Extracted:
        self.seen.append(doc.url)
        return Extracted(
            links=(Link(url=self.link, kind="a"),),
            canonical="http://third.example/canonical",
            noindex=True,
            skipped={"parse_error": 2},
        )


def test_a_registered_processor_gets_its_mime_type(clean_registry: None) -> None:
    recorder = Recorder("application/pdf")
    register(recorder)
    doc = Document(url="http://example.com/a.pdf", content_type="application/pdf", body=b"%PDF")
    result = process(doc)
    assert recorder.seen == ["http://example.com/a.pdf"]
    assert urls(result) == ["http://third.example/"]
    assert available() == ("html-links", "sitemaps", "recorder")
    unregister("recorder")
    assert process(doc) == Extracted()


def test_a_wildcard_mime_type_matches_the_whole_major_type(clean_registry: None) -> None:
    register(Recorder("text/*"))
    assert [p.name for p in processors_for("text/plain")] == ["recorder"]
    assert [p.name for p in processors_for("text/html")] == ["html-links", "recorder"]


def test_results_of_several_processors_are_merged(clean_registry: None) -> None:
    register(Recorder("text/html", link="http://example.com/x"))
    page = '<link rel=canonical href="/c"><a href="/x">x</a><a href="/y">y</a>'
    doc = Document(url="http://example.com/", content_type="text/html", body=page.encode())
    result = process(doc)
    assert urls(result) == ["http://example.com/x", "http://example.com/y"]
    assert result.canonical == "http://example.com/c"  # the built-in ran first
    assert result.noindex  # from the recorder
    assert result.fingerprint == simhash("x y")
    assert result.skipped == {"parse_error": 2}


def test_registering_under_a_built_in_name_replaces_it(clean_registry: None) -> None:
    register(HtmlLinks(include_media=True))
    doc = Document(url="http://e.example/", content_type="text/html", body=b"<img src=/i.png>")
    assert triples(process(doc)) == [("http://e.example/i.png", "img", False)]
    unregister("html-links")
    assert process(doc).links == ()


def test_register_refuses_what_is_not_a_processor(clean_registry: None) -> None:
    with pytest.raises(TypeError, match="not a processor"):
        register(object())  # type: ignore[arg-type]
    nameless = Recorder("text/html")
    nameless.name = ""
    with pytest.raises(TypeError, match="non-empty str `name`"):
        register(nameless)


def test_a_processor_that_raises_is_logged_and_counted(clean_registry: None) -> None:
    class Broken:
        name = "broken"
        mime_types = ("text/html",)

        def process(self, doc: Document) -> Extracted:
            raise RuntimeError("bug in a plug-in")

    register(Broken())
    doc = Document(url="http://e.example/", content_type="text/html", body=b"<a href=/a>a</a>")
    with structlog.testing.capture_logs() as logs:
        result = process(doc)
    assert urls(result) == ["http://e.example/a"]
    assert result.skipped == {"processor_error": 1}
    assert [entry["event"] for entry in logs] == ["processor_failed"]
    assert logs[0]["processor"] == "broken"


def test_a_processor_returning_something_else_is_counted_too(clean_registry: None) -> None:
    class Sloppy:
        name = "sloppy"
        mime_types = ("Text/CSV",)  # compared without case

        def process(self, doc: Document) -> Extracted:
            return None  # type: ignore[return-value]

    register(Sloppy())
    doc = Document(url="http://e.example/a.csv", content_type="text/csv", body=b"a,b")
    with structlog.testing.capture_logs() as logs:
        assert process(doc).skipped == {"processor_error": 1}
    assert [(entry["event"], entry["processor"]) for entry in logs] == [
        ("processor_failed", "sloppy")
    ]


def test_a_third_party_result_is_made_immutable() -> None:
    links = [Link(url="http://a.example/", kind="a")]
    result = Extracted(links=links, skipped={"x": 1})  # type: ignore[arg-type]
    assert isinstance(result.links, tuple)
    with pytest.raises(TypeError):
        result.skipped["x"] = 2  # type: ignore[index]


def test_a_body_without_content_type_is_sniffed(clean_registry: None) -> None:
    page = Document(url="http://e.example/", content_type=None, body=b"<!DOCTYPE html><a href=/a>")
    assert urls(process(page)) == ["http://e.example/a"]
    index = fixture("sitemap_index.xml")
    assert len(process(Document(url="http://e.example/s", content_type=None, body=index)).links)
    assert process(Document(url="http://e.example/b", content_type=None, body=b"\x00\x01")) == (
        Extracted()
    )


def _install_plugin(root: Path, module: str, target: str) -> None:
    (root / f"{module}.py").write_text(
        "from refresher.discover._parse import Extracted, Link\n"
        "class PdfLinks:\n"
        "    name = 'pdf-links'\n"
        "    mime_types = ('application/pdf',)\n"
        "    def process(self, doc):\n"
        "        return Extracted(links=(Link(url='http://pdf.example/', kind='a'),))\n"
    )
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\npdf-links = {target}\n")


def test_a_plug_in_from_the_entry_point_group_is_loaded_once_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_plugin(tmp_path, "refresher_test_pdf_plugin", "refresher_test_pdf_plugin:PdfLinks")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_parse, "_registered", {})
    monkeypatch.setattr(_parse, "_plugins", None)
    assert "pdf-links" in available()
    loaded = _parse._plugins
    doc = Document(url="http://e.example/a.pdf", content_type="application/pdf", body=b"%PDF")
    assert urls(process(doc)) == ["http://pdf.example/"]
    assert _parse._plugins is loaded  # not read again


def test_a_broken_plug_in_stops_with_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_plugin(tmp_path, "refresher_test_broken_plugin", "no_such_module_here:Nope")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_parse, "_plugins", None)
    with pytest.raises(ConfigError, match=r"'pdf-links' failed to load.*no_such_module_here"):
        available()


# --------------------------------------------------------------------------- counters


def test_parse_counters_add_up_results() -> None:
    counters = ParseCounters()
    counters.add(html(fixture("robots_multiple.html")))
    counters.add(html(fixture("absurd_urls.html"), url="http://example.com/"))
    stats = counters.statistics()
    assert (stats.documents, stats.links, stats.noindex, stats.nofollow) == (2, 8, 1, 1)
    assert stats.skipped["idna"] == 3
    counters.add(Extracted())
    assert counters.statistics().documents == 3
    assert stats.documents == 2  # a snapshot does not move


def test_a_charset_label_with_a_nul_byte_is_an_unknown_charset_not_a_crash() -> None:
    # found by fuzz/fuzz.py charset: codecs.lookup raises ValueError on an embedded NUL
    doc = Document(
        url="http://a.test/",
        content_type='text/html; charset="utf\x008"',
        body=b'<a href="/x">x</a>',
    )
    assert [link.url for link in HtmlLinks().process(doc).links] == ["http://a.test/x"]
