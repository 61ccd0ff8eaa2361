"""The content-seen test keyed by what a document yields: the same bytes under another base URL
are another document; the same bytes with the same resolved links are one."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from refresher.discover._content import ContentSeen, document_key
from refresher.discover._parse import Document, Extracted, HtmlLinks, Link

TEMPLATE = (
    b"<!DOCTYPE html><html><head><title>Home</title></head><body>"
    + b"".join(b'<a href="/p%d">page %d</a>' % (i, i) for i in (0, 3, 5, 7))
    + b"</body></html>"
)
DIGEST = hashlib.blake2b(TEMPLATE, digest_size=16).digest()


def yielded(url: str, body: bytes = TEMPLATE) -> Extracted:
    return HtmlLinks().process(Document(url=url, content_type="text/html", body=body))


def test_one_template_on_many_hosts_with_relative_links_is_never_a_duplicate() -> None:
    seen = ContentSeen()
    hosts = [f"h{i}.test" for i in range(20)]
    answers = [
        seen.test(i, document_key(DIGEST, yielded(f"http://{h}/"))) for i, h in enumerate(hosts)
    ]
    assert answers == [None] * 20
    assert seen.statistics().remembered == 20


def test_the_same_document_at_two_urls_of_one_host_is_a_duplicate() -> None:
    seen = ContentSeen()
    assert seen.test(1, document_key(DIGEST, yielded("http://a.test/"))) is None
    # /index.html with root-relative links: the same links, the saving is kept
    assert seen.test(2, document_key(DIGEST, yielded("http://a.test/index.html"))) == 1
    assert seen.statistics().duplicates == 1


def test_an_absolute_base_makes_copies_on_other_hosts_true_duplicates() -> None:
    body = TEMPLATE.replace(b"<head>", b'<head><base href="http://origin.test/">')
    digest = hashlib.blake2b(body, digest_size=16).digest()
    seen = ContentSeen()
    assert seen.test(1, document_key(digest, yielded("http://a.test/", body))) is None
    assert seen.test(2, document_key(digest, yielded("http://b.test/", body))) == 1


def test_path_relative_links_under_two_directories_of_one_host_are_two_documents() -> None:
    body = b'<html><body><a href="next.html">next</a></body></html>'
    digest = hashlib.blake2b(body, digest_size=16).digest()
    seen = ContentSeen()
    assert seen.test(1, document_key(digest, yielded("http://a.test/a/", body))) is None
    assert seen.test(2, document_key(digest, yielded("http://a.test/b/", body))) is None


def test_a_page_serving_its_last_body_again_keeps_its_last_answer() -> None:
    seen = ContentSeen()
    key = document_key(DIGEST, yielded("http://a.test/"))
    assert seen.test(1, key) is None
    assert seen.test(2, key) == 1
    assert seen.again(2) == 1
    assert seen.again(1) is None
    # page 2 changes to a body of its own: no longer a duplicate
    assert seen.test(2, document_key(b"x" * 16, Extracted())) is None
    assert seen.again(2) is None


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=300))
def test_memory_stays_bounded_and_a_page_is_never_its_own_duplicate(
    tests: list[tuple[int, int]],
) -> None:
    seen = ContentSeen(capacity=8)
    for page_id, doc in tests:
        other = seen.test(page_id, bytes([doc]) * 16)
        assert other != page_id
        assert seen.statistics().remembered <= 8


def test_a_document_key_is_the_same_from_one_version_to_the_next() -> None:
    # Keys are compared with those of earlier fetches: each link, its kind and rel=nofollow,
    # the canonical, the robots flags and lastmods all go into it, in this form.
    extracted = Extracted(
        links=(
            Link(url="http://a.example/x", kind="a"),
            Link(url="http://a.example/\ud800y", kind="link", nofollow=True),  # unencodable
        ),
        canonical="http://a.example/c",
        noindex=True,
        lastmod=(("http://a.example/s", 1.5),),
    )
    assert document_key(b"\x01" * 32, extracted).hex() == "cf0fd6f4ac9175130d3924391feea285"
    assert document_key(b"\x02" * 32, Extracted()).hex() == "34fe51e7c9d0b29d23da09114978ce87"


def test_a_lastmod_given_to_the_day_keys_apart_from_the_same_seconds_given_to_the_second() -> None:
    lastmod = (("http://a.example/s", 86400.0),)
    exact = document_key(b"\x01" * 32, Extracted(lastmod=lastmod))
    assert document_key(b"\x01" * 32, Extracted(coarse_lastmod=lastmod)) != exact
