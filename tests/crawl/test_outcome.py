"""classify: what one fetch means for a page, without a network (property-based)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from refresher.crawl._fetch import (
    LEGACY_DIGEST_BYTES,
    FetchResult,
    body_digest,
    comparable_digest,
)
from refresher.crawl._outcome import Outcome, classify, http_date, meaningful
from refresher.store import PageRow

#: the store's pages.status vocabulary (the schema's comment), "new" aside
SCHEMA_STATUSES = {"ok", "not_modified", "error", "denied", "gone"}

digests = st.one_of(st.none(), st.binary(min_size=20, max_size=20))
validators = st.one_of(st.none(), st.sampled_from(['"a"', '"b"', 'W/"c"']))
dates = st.one_of(st.none(), st.just("Sun, 22 Nov 2026 10:00:00 GMT"), st.just("garbage"))


@st.composite
def pages(draw: st.DrawFn) -> PageRow:
    return PageRow(
        id=1,
        url="http://a.test/p",
        host_id=1,
        host="a.test",
        due_at=0.0,
        etag=draw(validators),
        last_modified=draw(dates),
        digest=draw(digests),
        target_rate=None,
        source=draw(st.sampled_from(["seed", "link", "sitemap"])),
    )


@st.composite
def results(draw: st.DrawFn) -> FetchResult:
    error = draw(st.one_of(st.none(), st.sampled_from(["timeout", "dns", "connect", "too_large"])))
    status = draw(st.one_of(st.none(), st.sampled_from([200, 204, 301, 304, 404, 410, 429, 500])))
    not_modified = status == 304 and error is None
    ok = error is None and status is not None and 200 <= status < 300
    digest = draw(digests) if ok else None
    body = draw(st.one_of(st.none(), st.just(b"<html></html>"))) if ok else None
    return FetchResult(
        url="http://a.test/p",
        final_url="http://a.test/p",
        status=status,
        started_at=100.0,
        finished_at=101.0,
        duration=1.0,
        bytes=0 if body is None else len(body),
        digest=digest,
        body=body,
        content_type="text/html",
        etag=draw(validators),
        last_modified=draw(dates),
        not_modified=not_modified,
        error_kind=error,
    )


@given(pages(), results())
def test_every_outcome_uses_the_schema_vocabulary_and_agrees_with_itself(
    page: PageRow, r: FetchResult
) -> None:
    o = classify(page, r)
    assert o.status in SCHEMA_STATUSES and not o.status.startswith("http_")
    # one definition of success: a 2xx answer or a 304, the same as FetchResult.ok
    assert o.success == r.ok
    assert o.success == (o.status in ("ok", "not_modified"))
    # a change needs a new body and an old digest to compare with; a 304 never is one
    assert not o.changed or (o.status == "ok" and page.digest is not None)
    assert not (o.changed and r.not_modified)
    assert o.due == (o.status != "gone")
    assert not o.process or (o.status == "ok" and r.body is not None)
    if not o.success:
        # nothing learnt: the page keeps its validators and digest
        assert (o.etag, o.last_modified, o.digest) == (page.etag, page.last_modified, page.digest)
        assert o.last_modified_at is None


@given(pages(), results())
def test_failures_are_transport_errors_server_errors_and_429(page: PageRow, r: FetchResult) -> None:
    expected = r.error_kind is not None or r.status in (429, 500)
    assert classify(page, r).failed == expected


def result(**kw: object) -> FetchResult:
    base: dict[str, object] = {
        "url": "http://a.test/p",
        "final_url": "http://a.test/p",
        "status": 200,
        "started_at": 100.0,
        "finished_at": 101.0,
        "duration": 1.0,
        "bytes": 4,
        "digest": b"d" * 16,
        "body": b"body",
        "content_type": "text/html",
        "etag": '"new"',
        "last_modified": "Sun, 22 Nov 2026 10:00:00 GMT",
        "not_modified": False,
    }
    base.update(kw)
    return FetchResult(**base)  # type: ignore[arg-type]


def stored(**kw: object) -> PageRow:
    base: dict[str, object] = {
        "id": 1,
        "url": "http://a.test/p",
        "host_id": 1,
        "host": "a.test",
        "due_at": 0.0,
        "etag": '"old"',
        "last_modified": "Sat, 21 Nov 2026 10:00:00 GMT",
        "digest": b"o" * 16,
        "target_rate": None,
    }
    base.update(kw)
    return PageRow(**base)  # type: ignore[arg-type]


def test_a_new_body_is_a_change_takes_the_new_validators_and_is_processed() -> None:
    o = classify(stored(), result())
    assert (o.status, o.success, o.changed, o.process) == ("ok", True, True, True)
    assert (o.etag, o.digest) == ('"new"', b"d" * 16)
    assert o.last_modified_at == http_date("Sun, 22 Nov 2026 10:00:00 GMT")


def test_the_first_fetch_of_a_page_is_no_change_but_is_processed() -> None:
    o = classify(stored(digest=None), result())
    assert not o.changed and o.process


def test_the_same_body_again_is_neither_a_change_nor_processed() -> None:
    o = classify(stored(digest=b"d" * 16), result())
    assert (o.changed, o.process, o.success) == (False, False, True)


def _fetched(body: bytes) -> FetchResult:
    """A 200 of ``body`` as the fetch hands it over: its digest, the payload's SHA-1."""
    return result(body=body, payload=body, bytes=len(body), digest=body_digest(body))


def _older(body: bytes) -> bytes:
    """The digest an older refresher stored for ``body`` (BLAKE2b-128)."""
    return hashlib.blake2b(body, digest_size=16).digest()


def test_a_digest_an_older_refresher_stored_is_compared_by_the_body_so_no_page_changes_once() -> (
    None
):
    body = b"<p>the same page</p>"
    o = classify(stored(digest=_older(body)), _fetched(body))
    assert (o.changed, o.process, o.success) == (False, False, True)
    # the page keeps the new kind from now on; the archive sees the same digest as before
    assert o.digest == o.previous_digest == hashlib.sha1(body).digest()
    moved = classify(stored(digest=_older(b"<p>before</p>")), _fetched(body))
    assert (moved.changed, moved.process) == (True, True)
    assert moved.digest == body_digest(body) and moved.previous_digest == _older(b"<p>before</p>")
    assert len(body_digest(body)) == 20 and len(_older(body)) == LEGACY_DIGEST_BYTES


def test_a_304_on_a_page_with_an_older_digest_keeps_it_for_its_next_full_answer() -> None:
    older = _older(b"<p>x</p>")
    r = result(status=304, not_modified=True, digest=None, body=None, bytes=0, etag=None)
    o = classify(stored(digest=older), r)
    assert (o.changed, o.digest) == (False, older)
    assert not classify(stored(digest=o.digest), _fetched(b"<p>x</p>")).changed


def test_a_body_cut_at_the_cap_is_never_compared_with_an_older_digest() -> None:
    body = b"<p>cut"
    r = replace(_fetched(body), truncated=True)
    assert comparable_digest(_older(body), r) == _older(body)


def test_a_304_keeps_the_stored_validators_it_does_not_repeat() -> None:
    r = result(status=304, not_modified=True, digest=None, body=None, bytes=0, etag=None)
    o = classify(stored(), r)
    assert (o.status, o.changed, o.process) == ("not_modified", False, False)
    assert (o.etag, o.last_modified, o.digest) == ('"old"', r.last_modified, b"o" * 16)


def test_http_errors_are_errors_in_the_schema_and_a_404_or_410_page_is_gone() -> None:
    for status in (403, 500, 503):
        r = result(status=status, digest=None, body=None)
        assert classify(stored(), r).status == "error"
    for status in (404, 410):
        r = result(status=status, digest=None, body=None)
        for source in ("seed", "link", "sitemap"):  # a guessed /sitemap.xml as any page
            gone = classify(stored(source=source), r)
            assert gone.status == "gone" and not gone.due
    assert classify(stored(source="sitemap"), result(status=500, body=None)).status == "error"


def test_a_body_cut_short_by_an_error_is_no_refresh_and_no_change() -> None:
    r = result(error_kind="too_large", digest=None, body=None)
    o = classify(stored(), r)
    assert (o.status, o.success, o.changed, o.failed) == ("error", False, False, True)


def test_meaningful_compares_fingerprints_only_for_changes() -> None:
    changed = classify(stored(), result())
    assert meaningful(changed, 0, 0) is False  # the same text
    assert meaningful(changed, 0, (1 << 64) - 1) is True
    assert meaningful(changed, None, None) is True  # no text to compare: every change counts
    same = classify(stored(digest=b"d" * 16), result())
    assert meaningful(same, 0, (1 << 64) - 1) is False
    failed: Outcome = classify(stored(), result(status=None, error_kind="timeout", body=None))
    assert meaningful(failed, 0, 1) is None


def test_the_crawlers_html_processor_follows_the_discovery_settings() -> None:
    from refresher._config import DiscoveryConfig
    from refresher.crawl._workers import processors
    from refresher.discover._parse import Document, process, simhash

    body = b'<html><body><img src="/i.png"><a href="/a">a</a><a href="/b">b</a></body></html>'
    doc = Document(url="http://a.test/", content_type="text/html", body=body)
    default = process(doc, builtins=processors(DiscoveryConfig()))
    assert [link.url for link in default.links] == ["http://a.test/a", "http://a.test/b"]
    wide = process(
        doc, builtins=processors(DiscoveryConfig(include_media=True, max_links_per_page=2))
    )
    assert [link.url for link in wide.links] == ["http://a.test/i.png", "http://a.test/a"]
    assert wide.skipped["too_many_links"] == 1
    # discovery.max_text_chars: the fingerprint reads the first characters of the text only
    words = " ".join(f"w{i % 97}x" for i in range(400)).encode()
    page = Document(
        url="http://a.test/", content_type="text/html", body=b"<p>" + words + b"</p><p>end"
    )
    bounded = process(page, builtins=processors(DiscoveryConfig(max_text_chars=200)))
    assert bounded.fingerprint == simhash(" " + words.decode()[:199])
    whole = process(page, builtins=processors(DiscoveryConfig(max_text_chars=0)))
    assert whole.fingerprint == simhash(" " + words.decode() + " end")
