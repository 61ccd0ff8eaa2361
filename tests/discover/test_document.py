"""Tests for the link check shared by the processors (refresher.discover._document.verdict):
relative references resolved without their page's host give what resolving them against the
page's own directory gives."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from refresher.discover import _document
from refresher.discover._document import verdict

PAGES = [
    "http://example.com/docs/library/page.html",
    "https://h7.docs.test/docs/library/page.html?x=1#top",
    "http://example.com:8080/docs/library/",
    "http://[::1]:8000/docs/library/index.html",
    "http://127.0.0.1/docs/library/a;b/c.html",
    "http://example.com",
    "http://example.com//docs//library/page.html",
    "http://" + "long-label." * 20 + "example/docs/library/page.html",  # URLs near the cap
    "http://xn--zz.example/docs/library/page.html",  # a host the URL checks refuse
    "http://user@example.com/docs/library/page.html",  # credentials: refused
    "ftp://example.com/docs/library/page.html",
]

REFERENCES = [
    "page2.html",
    "./page2.html",
    "../reference/index.html#a-section",
    "../../../../../../up.html",
    "/",
    "/abs/path.html",
    "/abs/./dot/../path.html",
    "/.hidden",
    "sub/dir/",
    ";params",
    "a;b/c?q=1#f",
    "  spaced name.html  ",
    "wrapped\n/over\tlines.html",
    "\\\\backslashes\\x.html",
    "%7euser/%41.html",
    "café/ü.html",
    "#fragment",
    "",
    "   ",
    "page.html#frag\x01",
    "bad\x00char.html",
    "//other.example/x.html",
    "///triple.html",
    "//",
    "//?q",
    "http:///no-host.html",
    "HTTPS://Example.ORG/upper/../x.html",
    "ftp://example.org/file",
    "http:relative.html",
    "https:relative.html",
    "HTTP://EXAMPLE.ORG/Upper.html",
    "https://example.org/a/./b/../c.html",
    "mailto:someone@example.com",
    "javascript:void(0)",
    "data:text/html,hi",
    "[::1]/x.html",
    "a:b.html",
    "x" * 1900 + ".html",
]


def _against_directory(raw: str, page: str, max_length: int) -> tuple[str, str | None]:
    """The verdict on ``raw`` resolved against the page's whole directory, host included
    (after verdict()'s first check, the length of the value itself)."""
    if len(raw) > max_length:
        return "", "too_long"
    return _document._verdict(raw, _document._directory(page), max_length)


def test_a_relative_link_gets_the_verdict_it_gets_against_its_page_directory() -> None:
    for page, raw in itertools.product(PAGES, REFERENCES):
        for max_length in (2048, 120):
            assert verdict(raw, page, max_length) == _against_directory(raw, page, max_length), (
                page,
                raw,
                max_length,
            )


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from(["", "/", "//", "http:", "https://", "HTTP:", "mailto:", " "]),
    rest=st.text(alphabet=st.sampled_from("ab./:;%?#@[]\\ \t\n\x01é-_~=&"), max_size=24),
    page=st.sampled_from(PAGES),
)
def test_any_reference_gets_the_verdict_it_gets_against_its_page_directory(
    start: str, rest: str, page: str
) -> None:
    raw = start + rest
    if raw.strip(_document._EDGE).translate(_document._TAB_NEWLINE).startswith("?"):
        return  # a query-only reference is resolved against the whole page URL, as before
    assert verdict(raw, page, 2048) == _against_directory(raw, page, 2048)


def test_a_new_host_with_the_same_layout_resolves_its_links_without_new_joins() -> None:
    references = [f"../section-{i}/page.html" for i in range(50)]
    for raw in references:
        verdict(raw, "http://first.example/docs/library/page.html", 2048)
    before = _document._relative.cache_info().misses
    found = [
        verdict(raw, "http://second.example/docs/library/other.html", 2048) for raw in references
    ]
    assert _document._relative.cache_info().misses == before
    assert found[7] == ("http://second.example/docs/section-7/page.html", None)
