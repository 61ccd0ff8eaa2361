"""Tests for the sitemap processor: urlset and index entries, lastmod, gzip, XML attacks."""

from __future__ import annotations

import gzip
import tracemalloc
from collections import Counter
from datetime import UTC, datetime

from _pages import fixture, triples, urls
from lxml import etree

from refresher.discover import _sitemaps
from refresher.discover._parse import (
    Document,
    Extracted,
    Sitemaps,
)

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
    # to the second: change observations
    assert dict(result.lastmod) == {
        f"{site}/seconds": utc(2024, 5, 6, 10, 32, 15),
        f"{site}/fraction": utc(2024, 5, 6, 15, 32, 15) + 0.25,  # -05:00
        f"{site}/no-zone": utc(2024, 5, 6, 10, 32, 15),  # read as UTC
        f"{site}/no-colon-zone": utc(2024, 5, 6, 5, 2, 15),  # +0530
    }
    # coarser: the start of the day, year, month or minute they name, kept apart
    assert dict(result.coarse_lastmod) == {
        f"{site}/": utc(2024, 5, 6),
        f"{site}/year": utc(2024, 1, 1),
        f"{site}/month": utc(2024, 5, 1),
        f"{site}/minutes": utc(2024, 5, 6, 8, 32),  # +02:00
        f"{site}/whitespace?a=1&b=2": utc(2024, 5, 6),
    }
    # "yesterday", month 13, 30 February; javascript:; an empty and a missing <loc>
    assert dict(result.skipped) == {"lastmod": 3, "scheme": 1, "bad_url": 2}


def test_a_lastmod_is_a_change_observation_only_when_given_to_the_second() -> None:
    forms = {
        "2024": False,
        "2024-05": False,
        "2024-05-06": False,
        "2024-05-06T10:32Z": False,  # a minute is 60 times the store's 1 s tolerance
        "2024-05-06T10:32:15Z": True,
        "2024-05-06T10:32:15.5+02:00": True,
        "2024-05-06 10:32:15": True,
    }
    for text, exact in forms.items():
        read = _sitemaps._lastmod_seconds(text)
        assert read is not None and read[1] is exact, text
    assert _sitemaps._lastmod_seconds("2024-05-06T10") is None


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
    assert result.coarse_lastmod == (("https://www.example.org/gallery", utc(2024, 5, 6)),)
    assert result.lastmod == ()
    assert result.skipped == {"bad_url": 1}


def test_the_sitemap_tree_never_holds_more_than_the_current_entry() -> None:
    entry = (
        b"<url><loc>http://a.example/%d</loc><lastmod>2024-01-01</lastmod>"
        b"<x:extra xmlns:x='urn:x'>"
        + b"<x:deep><x:deeper>text</x:deeper></x:deep>" * 50
        + b"</x:extra></url>"
    )
    body = b"<urlset>" + b"".join(entry % i for i in range(500)) + b"</urlset>"
    reader = _sitemaps._SitemapReader(Sitemaps(), "http://a.example/s.xml", Counter())
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
