"""Tests for the processor registry: choice by MIME type, plug-ins, merging, counters."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from _pages import fixture, html, triples, urls

from refresher._errors import ConfigError
from refresher.discover import _parse
from refresher.discover._parse import (
    ENTRY_POINT_GROUP,
    Document,
    Extracted,
    HtmlLinks,
    Link,
    ParseCounters,
    available,
    process,
    processors_for,
    register,
    simhash,
    unregister,
)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish with it; entry points are not read."""
    monkeypatch.setattr(_parse, "_registered", {})
    monkeypatch.setattr(_parse, "_plugins", {})


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


def test_a_lastmod_to_the_second_from_one_processor_is_not_also_a_coarse_one(
    clean_registry: None,
) -> None:
    class Dated:
        name, mime_types = "dated", ("application/xml",)

        def process(self, doc: Document) -> Extracted:
            both = (("http://example.com/a", 0.0), ("http://example.com/b", 0.0))
            return Extracted(coarse_lastmod=both)

    register(Dated())
    body = b"<urlset><url><loc>/a</loc><lastmod>2024-05-06T10:32:15Z</lastmod></url></urlset>"
    doc = Document(url="http://example.com/s.xml", content_type="application/xml", body=body)
    result = process(doc)
    assert [u for u, _ in result.lastmod] == ["http://example.com/a"]  # the built-in's
    assert result.coarse_lastmod == (("http://example.com/b", 0.0),)


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
