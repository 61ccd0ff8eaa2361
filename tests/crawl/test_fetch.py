from __future__ import annotations

import email.utils
import functools
import gzip
import hashlib
import socket
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import brotli
import pytest
import trio
import trustme
from _rawserver import Connection, Handler, RawServer, Reply, Request, http_handler, raw_server

from refresher._errors import ConfigError, InvalidURL
from refresher.crawl._dns import Resolver
from refresher.crawl._fetch import (
    ACCEPT_ENCODING,
    ROBOTS_MAX_BYTES,
    Fetcher,
    FetchResult,
    _Decoder,
    body_digest,
    parse_retry_after,
)

UA = "refresher-test/1.0 (+https://example.invalid/bot)"
PAGE = b"<!doctype html><title>t</title><p>hello</p>"


@asynccontextmanager
async def site(
    handler: Handler, *, ssl_context: ssl.SSLContext | None = None, **options: Any
) -> AsyncIterator[tuple[RawServer, Fetcher]]:
    """A scripted server, and a fetcher whose every name under fetch.test reaches it."""
    async with raw_server(handler, ssl_context=ssl_context) as server:
        resolver = Resolver(static={"*.fetch.test": f"127.0.0.1:{server.port}"})
        settings: dict[str, Any] = {"timeout": 10.0, **options}
        async with Fetcher(user_agent=UA, resolver=resolver, **settings) as fetcher:
            yield server, fetcher


def html(body: bytes = PAGE, *headers: tuple[str, str], status: int = 200) -> Reply:
    return Reply(
        status=status, headers=[("Content-Type", "text/html; charset=utf-8"), *headers], body=body
    )


def app_of(routes: dict[str, Reply]) -> Callable[[Request], Reply]:
    def app(request: Request) -> Reply:
        return routes.get(request.target, Reply(status=404, body=b"not found"))

    return app


# -- ordinary answers ----------------------------------------------------------------------------


async def test_a_200_carries_the_body_its_digest_and_validators() -> None:
    reply = html(PAGE, ("ETag", '"v1"'), ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"))
    async with site(http_handler(app_of({"/p": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/p")
    assert result.error_kind is None and result.error is None
    assert result.status == 200
    assert result.body == PAGE
    assert result.digest == body_digest(PAGE) == hashlib.sha1(PAGE).digest()
    assert result.bytes == len(PAGE)
    assert result.content_type == "text/html; charset=utf-8"
    assert (result.etag, result.last_modified) == ('"v1"', "Mon, 01 Jan 2024 00:00:00 GMT")
    assert result.final_url == "http://a.fetch.test/p" and result.redirects == ()
    assert not result.not_modified and result.ok
    assert result.finished_at >= result.started_at and result.duration >= 0


async def test_the_request_carries_host_user_agent_and_accept_encoding() -> None:
    async with site(http_handler(app_of({"/": html()}))) as (server, f):
        await f.fetch("http://a.fetch.test/")
        await f.fetch(f"http://b.fetch.test:{server.port}/")
    first, second = server.requests
    assert first.headers["host"] == "a.fetch.test"
    assert second.headers["host"] == f"b.fetch.test:{server.port}"
    assert first.headers["user-agent"] == UA
    assert first.headers["accept-encoding"] == ACCEPT_ENCODING
    assert "if-none-match" not in first.headers


async def test_a_non_html_body_is_digested_but_not_kept() -> None:
    reply = Reply(headers=[("Content-Type", "image/png")], body=b"\x89PNG....")
    async with site(http_handler(app_of({"/i": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/i")
    assert result.status == 200 and result.body is None
    assert result.digest == body_digest(b"\x89PNG....")


async def test_a_body_received_in_many_pieces_is_digested_whole() -> None:
    pieces = [bytes([65 + i % 26]) * 40_000 + b"\n" for i in range(12)]  # ~480 KB

    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for piece in pieces:
            await conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await conn.send(b"0\r\n\r\n")

    async with site(handler) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    whole = b"".join(pieces)
    assert result.error_kind is None and result.body == whole
    assert result.digest == body_digest(whole) == hashlib.sha1(whole).digest()


async def test_a_body_of_an_encoding_not_decoded_is_digested_as_it_came() -> None:
    raw = b"\x00\x01packed" * 10_000
    reply = html(raw, ("Content-Encoding", "x-unknown"))
    async with site(http_handler(app_of({"/": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 200 and result.body is None
    assert result.digest == hashlib.sha1(raw).digest()


async def test_an_error_status_is_a_response_not_a_fetch_error() -> None:
    async with site(http_handler(app_of({}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/missing")
        stats = f.statistics()
    assert result.status == 404 and result.error_kind is None
    assert result.digest is None and result.body is None and not result.ok
    assert stats.outcomes == {"client_error": 1}


async def test_a_304_is_not_modified_and_the_validators_were_sent() -> None:
    def app(request: Request) -> Reply:
        if request.headers.get("if-none-match") == '"v1"':
            return Reply(status=304)
        return html(PAGE, ("ETag", '"v1"'))

    async with site(http_handler(app)) as (server, f):
        result = await f.fetch(
            "http://a.fetch.test/", etag='"v1"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT"
        )
        stats = f.statistics()
    assert server.requests[0].headers["if-none-match"] == '"v1"'
    assert server.requests[0].headers["if-modified-since"] == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert result.status == 304 and result.not_modified and result.ok
    assert result.digest is None and result.body is None
    # The 304 did not repeat the validators: the ones that earned it are kept.
    assert result.etag == '"v1"'
    assert result.last_modified == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert stats.outcomes == {"not_modified": 1}


async def test_a_304_to_an_unconditional_get_is_not_marked_not_modified() -> None:
    async with site(http_handler(lambda r: Reply(status=304))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 304 and not result.not_modified


async def test_a_validator_with_a_line_break_is_not_sent() -> None:
    async with site(http_handler(app_of({"/": html()}))) as (server, f):
        result = await f.fetch("http://a.fetch.test/", etag='"x"\r\nX-Injected: 1')
    assert result.status == 200
    assert "x-injected" not in server.requests[0].headers
    assert "if-none-match" not in server.requests[0].headers


async def test_an_invalid_url_is_refused_before_any_request() -> None:
    async with site(http_handler(app_of({}))) as (server, f):
        with pytest.raises(InvalidURL):
            await f.fetch("ftp://a.fetch.test/file")
    assert server.connections == 0


# -- redirects -----------------------------------------------------------------------------------


async def test_same_host_redirects_are_followed_and_recorded() -> None:
    routes = {
        "/a": Reply(status=301, headers=[("Location", "/b")]),
        "/b": Reply(status=302, headers=[("Location", "http://a.fetch.test/c#frag")]),
        "/c": Reply(status=307, headers=[("Location", "d?x=1")]),
        "/d?x=1": html(),
    }
    async with site(http_handler(app_of(routes))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/a")
    assert result.error_kind is None and result.status == 200
    assert result.redirects == (
        "http://a.fetch.test/b",
        "http://a.fetch.test/c",
        "http://a.fetch.test/d?x=1",
    )
    assert result.final_url == "http://a.fetch.test/d?x=1"
    assert result.location is None
    assert result.digest == body_digest(PAGE)


async def test_too_many_redirects_is_a_redirects_error() -> None:
    def app(request: Request) -> Reply:
        n = int(request.target.rsplit("/", 1)[1])
        return Reply(status=302, headers=[("Location", f"/r/{n + 1}")])

    async with site(http_handler(app), max_redirects=3) as (server, f):
        result = await f.fetch("http://a.fetch.test/r/0")
    assert result.error_kind == "redirects" and "max_redirects" in (result.error or "")
    assert result.status == 302
    assert result.redirects == tuple(f"http://a.fetch.test/r/{n}" for n in (1, 2, 3))
    assert result.location == "http://a.fetch.test/r/4"
    assert len(server.requests) == 4


async def test_a_redirect_to_another_host_is_recorded_not_followed() -> None:
    routes = {"/": Reply(status=301, headers=[("Location", "http://b.fetch.test/new")])}
    async with site(http_handler(app_of(routes))) as (server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 301 and result.error_kind is None
    assert result.location == "http://b.fetch.test/new"
    assert result.redirects == () and result.final_url == "http://a.fetch.test/"
    assert [r.target for r in server.requests] == ["/"]


async def test_a_redirect_to_a_non_http_scheme_is_recorded_not_followed() -> None:
    routes = {"/": Reply(status=302, headers=[("Location", "mailto:x@example.org")])}
    async with site(http_handler(app_of(routes))) as (server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 302 and result.location == "mailto:x@example.org"
    assert len(server.requests) == 1


# -- bodies ----------------------------------------------------------------------------------------


async def test_a_body_over_the_cap_is_too_large() -> None:
    big = html(b"x" * 5000)
    async with site(http_handler(app_of({"/": big})), max_body_bytes=1000) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "too_large" and "max_body_bytes" in (result.error or "")
    assert result.status == 200 and result.digest is None and result.body is None
    assert result.bytes <= 1000


async def test_a_chunked_body_over_the_cap_stops_at_the_cap() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(20):
            await conn.send(b"3e8\r\n" + b"y" * 1000 + b"\r\n")
        await conn.send(b"0\r\n\r\n")

    async with site(handler, max_body_bytes=4500) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "too_large"
    assert 0 < result.bytes <= 4500


async def test_an_endless_body_is_too_large_and_the_connection_is_dropped() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n")
        while True:
            await conn.send(b"z" * 65536)

    async with site(handler, max_body_bytes=1 << 20) as (server, f):
        result = await f.fetch("http://a.fetch.test/")
        await server.wait_for(lambda: server.closed == 1)
    assert result.error_kind == "too_large"
    assert result.bytes <= 1 << 20


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "br"])
async def test_a_compressed_body_is_decoded_and_digested_decoded(encoding: str) -> None:
    text = PAGE * 50
    if encoding == "gzip":
        data = gzip.compress(text)
    elif encoding == "br":
        data = brotli.compress(text)
    elif encoding == "deflate":
        data = zlib.compress(text)
    else:
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        data = packer.compress(text) + packer.flush()
    name = "deflate" if encoding == "raw-deflate" else encoding
    reply = html(data, ("Content-Encoding", name))
    async with site(http_handler(app_of({"/": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind is None
    assert result.body == text and result.bytes == len(text)
    assert result.digest == body_digest(text)


async def test_corrupt_gzip_is_a_protocol_error() -> None:
    reply = html(b"\x1f\x8b\x08\x00garbage-not-gzip" * 10, ("Content-Encoding", "gzip"))
    async with site(http_handler(app_of({"/": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "protocol"


async def test_an_endless_gzip_bomb_stops_at_the_decoded_cap() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
            b"Connection: close\r\n\r\n"
        )
        packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        zeros = bytes(1 << 20)
        while True:  # about 1 KiB on the wire per MiB decoded
            await conn.send(packer.compress(zeros) + packer.flush(zlib.Z_SYNC_FLUSH))

    async with site(handler, max_body_bytes=1 << 20) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "too_large"
    assert result.bytes <= 1 << 20


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("br", functools.partial(brotli.compress, quality=1))],
)
def test_the_decoder_never_inflates_more_than_the_limit_plus_one(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    bomb = compress(bytes(20 << 20))  # 20 MiB of zeros in at most about 20 KiB
    decoder = _Decoder([encoding])
    out = decoder.feed(bomb, 1000)
    assert len(out) == 1001


async def test_a_brotli_bomb_stops_at_the_decoded_cap() -> None:
    bomb = brotli.compress(bytes(16 << 20), quality=1)  # 16 MiB of zeros in a few KiB
    reply = html(bomb, ("Content-Encoding", "br"))
    async with site(http_handler(app_of({"/": reply})), max_body_bytes=1 << 20) as (_s, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "too_large"
    assert result.bytes <= 1 << 20


async def test_corrupt_brotli_is_a_protocol_error() -> None:
    reply = html(b"\xff\xfenot brotli at all" * 10, ("Content-Encoding", "br"))
    async with site(http_handler(app_of({"/": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "protocol"


def test_concatenated_gzip_members_are_all_decoded_whatever_the_chunking() -> None:
    data = gzip.compress(b"first member, ") + gzip.compress(b"second member")
    for size in (1, 3, 7, len(data)):
        decoder = _Decoder(["gzip"])
        out = b"".join(decoder.feed(data[i : i + size], 1000) for i in range(0, len(data), size))
        assert out + decoder.flush(1000) == b"first member, second member", size


def test_a_two_stage_encoding_is_undone_in_reverse_order() -> None:
    data = zlib.compress(gzip.compress(PAGE))  # gzip applied first, then deflate
    decoder = _Decoder(["gzip", "deflate"])
    assert decoder.feed(data, 10_000) + decoder.flush(10_000) == PAGE


# -- hostile servers -------------------------------------------------------------------------------


async def scripted(script: Handler, **options: Any) -> FetchResult:
    """Fetch from a server that reads the request head, then runs ``script``."""

    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await script(conn)

    async with site(handler, **options) as (_server, f):
        return await f.fetch("http://a.fetch.test/")


def sends(*chunks: bytes, then_stall: bool = False) -> Handler:
    async def script(conn: Connection) -> None:
        for chunk in chunks:
            await conn.send(chunk)
        if then_stall:
            await trio.sleep_forever()

    return script


async def stalls(conn: Connection) -> None:
    await trio.sleep_forever()


async def endless_headers(conn: Connection) -> None:
    await conn.send(b"HTTP/1.1 200 OK\r\n")
    while True:
        await conn.send(b"X-Filler: " + b"f" * 1000 + b"\r\n")


async def test_a_stalled_server_is_a_timeout() -> None:
    result = await scripted(stalls, timeout=0.3)
    assert result.error_kind == "timeout" and result.status is None
    assert "fetch.timeout" in (result.error or "")


async def test_a_body_that_stalls_half_way_is_a_timeout_with_the_status_kept() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    result = await scripted(sends(head + b"a" * 10, then_stall=True), timeout=0.3)
    assert result.error_kind == "timeout" and result.status == 200
    assert result.bytes == 10 and result.digest is None


async def test_cancellation_propagates_out_of_a_fetch() -> None:
    with trio.move_on_after(0.2) as scope:
        await scripted(stalls, timeout=30.0)
        pytest.fail("fetch returned although it was cancelled")
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    ("script", "status"),
    [
        (Connection.reset, None),  # a TCP RST after the request
        (sends(), None),  # an orderly close before any answer
        (sends(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little"), 200),
    ],
    ids=["reset", "closed", "cut-short"],
)
async def test_a_broken_connection_is_a_read_error(script: Handler, status: int | None) -> None:
    result = await scripted(script)
    assert result.error_kind == "read" and result.status == status


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    resolver = Resolver(static={"closed.test": f"127.0.0.1:{port}"})
    async with Fetcher(user_agent=UA, resolver=resolver, timeout=10.0) as f:
        result = await f.fetch("http://closed.test/")
    assert result.error_kind == "connect" and result.status is None


async def test_an_unresolvable_host_is_a_dns_error() -> None:
    async with Fetcher(user_agent=UA, resolver=Resolver(), timeout=10.0) as f:
        result = await f.fetch("http://nothing.invalid/")
        stats = f.statistics()
    assert result.error_kind == "dns" and result.status is None
    assert stats.outcomes == {"dns": 1}


@pytest.mark.parametrize(
    "script",
    [
        sends(b"HTTP/1.1 200 OK\r\nthis is not a header\r\n\r\n", then_stall=True),
        sends(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", then_stall=True),
        sends(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"),
        sends(b"\x00\x01\x02\x03\xff\xfe\r\n\r\n", then_stall=True),
        endless_headers,
    ],
    ids=["bad-header-line", "not-http", "two-lengths", "binary", "endless-headers"],
)
async def test_garbage_headers_are_a_protocol_error(script: Handler) -> None:
    result = await scripted(script)
    assert result.error_kind == "protocol"


# -- Retry-After -----------------------------------------------------------------------------------


async def test_retry_after_seconds_on_a_429_is_parsed() -> None:
    routes = {"/": Reply(status=429, headers=[("Retry-After", "120")])}
    async with site(http_handler(app_of(routes))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 429 and result.retry_after == 120.0


async def test_retry_after_as_a_date_on_a_503_is_parsed() -> None:
    when = email.utils.formatdate(time.time() + 3600, usegmt=True)
    routes = {"/": Reply(status=503, headers=[("Retry-After", when)])}
    async with site(http_handler(app_of(routes))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.status == 503 and result.retry_after is not None
    assert 3000 < result.retry_after <= 3600


async def test_retry_after_is_ignored_on_other_statuses() -> None:
    routes = {"/": html(PAGE, ("Retry-After", "120"))}
    async with site(http_handler(app_of(routes))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.retry_after is None


def test_parse_retry_after_reads_delta_seconds_and_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(" 30 ", now=now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now + 90, usegmt=True), now=now) == 90.0
    assert parse_retry_after(email.utils.formatdate(now - 90, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after("-5", now=now) is None


# -- connections ---------------------------------------------------------------------------------


async def test_successive_fetches_of_one_host_reuse_one_connection() -> None:
    async with site(http_handler(app_of({"/": html(), "/2": html()}))) as (server, f):
        for path in ("/", "/2", "/", "/missing"):
            result = await f.fetch(f"http://a.fetch.test{path}")
            assert result.error_kind is None
        stats = f.statistics()
    assert server.connections == 1
    assert [r.connection for r in server.requests] == [0, 0, 0, 0]
    assert stats.requests == 4 and stats.open_hosts == 1


async def test_the_least_recently_used_host_is_evicted_and_its_connection_closed() -> None:
    async with site(http_handler(app_of({"/": html()})), max_open_hosts=2) as (server, f):
        await f.fetch("http://a.fetch.test/")
        await f.fetch("http://b.fetch.test/")
        await f.fetch("http://a.fetch.test/")  # a is now more recent than b
        assert server.connections == 2 and server.closed == 0
        await f.fetch("http://c.fetch.test/")  # evicts b
        await server.wait_for(lambda: server.closed == 1)
        stats = f.statistics()
        assert (stats.open_hosts, stats.evictions) == (2, 1)
        await f.fetch("http://a.fetch.test/")  # still open: no new connection
        assert server.connections == 3
        await f.fetch("http://b.fetch.test/")  # reconnects
        assert server.connections == 4
        await f.aclose()
        await server.wait_for(lambda: server.closed == 4)


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def handler(conn: Connection) -> None:  # one answer per connection, then a FIN
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with site(handler) as (server, f):
        first = await f.fetch("http://a.fetch.test/")
        await server.wait_for(lambda: server.closed == 1)
        second = await f.fetch("http://a.fetch.test/")
    assert (first.status, second.status) == (200, 200) and second.error_kind is None
    assert server.connections == 2


async def test_a_request_the_server_drops_on_a_kept_connection_is_sent_again_on_a_new_one() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if conn.index == 0:
            await conn.read_request()  # the second request: closed without an answer
            return
        while await conn.read_request() is not None:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with site(handler) as (server, f):
        first = await f.fetch("http://a.fetch.test/1")
        second = await f.fetch("http://a.fetch.test/2")
        stats = f.statistics()
    assert (first.status, second.status) == (200, 200) and second.error_kind is None
    assert [(r.target, r.connection) for r in server.requests] == [
        ("/1", 0),
        ("/2", 0),
        ("/2", 1),
    ]
    assert stats.requests == 2


async def test_a_new_connection_closed_without_an_answer_is_not_tried_again() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()

    async with site(handler) as (server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "read" and server.connections == 1


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n\r\nok",  # no length: the body ends at the close
    ],
    ids=["connection-close", "http-1.0", "close-delimited"],
)
async def test_a_connection_that_cannot_carry_another_request_is_not_kept(head: bytes) -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(head)

    async with site(handler) as (server, f):
        results = [await f.fetch("http://a.fetch.test/") for _ in range(2)]
        stats = f.statistics()
    assert [(r.status, r.body, r.error_kind) for r in results] == [(200, b"ok", None)] * 2
    assert server.connections == 2 and stats.requests == 2


async def test_an_idle_connection_past_keepalive_expiry_is_replaced() -> None:
    async with site(http_handler(app_of({"/": html()})), keepalive_expiry=0.0) as (server, f):
        await f.fetch("http://a.fetch.test/")
        await f.fetch("http://a.fetch.test/")
        await server.wait_for(lambda: server.closed == 1)
    assert server.connections == 2


async def test_two_fetches_of_one_host_at_once_do_not_share_a_connection() -> None:
    release = trio.Event()

    async def handler(conn: Connection) -> None:
        while (request := await conn.read_request()) is not None:
            if request.target == "/slow":
                await release.wait()
            body = request.target.encode()
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    results: dict[str, FetchResult] = {}
    async with site(handler) as (server, f):

        async def get(path: str) -> None:
            results[path] = await f.fetch(f"http://a.fetch.test{path}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(get, "/slow")
            await server.wait_for(lambda: len(server.requests) == 1)
            await get("/fast")
            release.set()
    assert results["/slow"].payload == b"/slow" and results["/fast"].payload == b"/fast"
    assert server.connections == 2


# -- robots.txt ------------------------------------------------------------------------------------


async def test_robots_follows_five_redirects_across_hosts() -> None:
    def app(request: Request) -> Reply:
        host = request.headers["host"]
        if request.target == "/robots.txt" and host == "a.fetch.test":
            return Reply(status=301, headers=[("Location", "http://b.fetch.test/r/1")])
        n = int(request.target.rsplit("/", 1)[1])
        if n < 5:
            return Reply(status=302, headers=[("Location", f"/r/{n + 1}")])
        return Reply(
            headers=[("Content-Type", "text/plain")], body=b"User-agent: *\nDisallow: /x\n"
        )

    async with site(http_handler(app)) as (server, f):
        status, body = await f.fetch_robots("http", "a.fetch.test", None)
    assert (status, body) == (200, b"User-agent: *\nDisallow: /x\n")
    assert len(server.requests) == 6
    assert server.requests[0].headers["user-agent"] == UA


async def test_robots_gives_up_after_more_than_five_redirects() -> None:
    def app(request: Request) -> Reply:
        return Reply(status=302, headers=[("Location", request.target + "x")])

    async with site(http_handler(app)) as (server, f):
        assert await f.fetch_robots("http", "a.fetch.test", None) == (None, b"")
    assert len(server.requests) == 6


async def test_robots_reads_at_most_500_kib_without_an_error() -> None:
    big = b"# " + b"c" * (600 * 1024) + b"\n"
    routes = {"/robots.txt": Reply(headers=[("Content-Type", "text/plain")], body=big)}
    async with site(http_handler(app_of(routes)), max_body_bytes=100) as (server, f):
        status, body = await f.fetch_robots("http", "a.fetch.test", server.port)
    assert status == 200 and body == big[:ROBOTS_MAX_BYTES]
    assert server.requests[0].headers["host"] == f"a.fetch.test:{server.port}"


async def test_robots_reports_the_status_of_a_missing_file() -> None:
    async with site(http_handler(app_of({}))) as (_server, f):
        status, _body = await f.fetch_robots("http", "a.fetch.test", 80)
    assert status == 404


async def test_robots_of_an_unreachable_host_has_no_status() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.reset()

    async with site(handler) as (_server, f):
        assert await f.fetch_robots("http", "a.fetch.test", None) == (None, b"")
        assert f.statistics().robots_fetches == 1


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A certificate authority made for the test run, trusted by nothing else."""
    return trustme.CA()


@dataclass
class TLS:
    server: ssl.SSLContext
    client: ssl.SSLContext  # trusts only the test CA
    sni: list[str | None]  # the server names the server saw in handshakes


@pytest.fixture
def tls(ca: trustme.CA) -> TLS:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("secure.fetch.test").configure_cert(server)
    sni: list[str | None] = []

    def remember(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        sni.append(name)

    server.sni_callback = remember
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return TLS(server=server, client=client, sni=sni)


async def test_https_uses_the_real_name_for_sni_and_the_certificate(tls: TLS) -> None:
    handler = http_handler(app_of({"/": html()}))
    async with site(handler, ssl_context=tls.server, verify=tls.client) as (server, f):
        result = await f.fetch("https://secure.fetch.test/")
        again = await f.fetch("https://secure.fetch.test/")
    assert result.error_kind is None and result.status == 200 and again.status == 200
    assert tls.sni == ["secure.fetch.test"]  # one handshake: the connection was reused
    assert server.requests[0].headers["host"] == "secure.fetch.test"


async def test_https_with_a_certificate_for_another_name_is_a_connect_error(tls: TLS) -> None:
    handler = http_handler(app_of({"/": html()}))
    async with site(handler, ssl_context=tls.server, verify=tls.client) as (_server, f):
        result = await f.fetch("https://other.fetch.test/")
    assert result.error_kind == "connect"
    assert "certificate" in (result.error or "")
    assert tls.sni == ["other.fetch.test"]


async def test_https_with_a_certificate_from_an_unknown_authority_is_a_connect_error(
    tls: TLS,
) -> None:
    handler = http_handler(app_of({"/": html()}))
    async with site(handler, ssl_context=tls.server) as (server, f):  # the system's CAs
        result = await f.fetch("https://secure.fetch.test/")
    assert result.error_kind == "connect" and result.status is None
    assert server.requests == []


async def test_https_without_verification_accepts_any_certificate(tls: TLS) -> None:
    handler = http_handler(app_of({"/": html()}))
    async with site(handler, ssl_context=tls.server, verify=False) as (_server, f):
        result = await f.fetch("https://other.fetch.test/")
    assert result.status == 200 and result.body == PAGE


async def test_https_redirects_and_robots_use_the_same_tls_connection(tls: TLS) -> None:
    routes = {
        "/robots.txt": Reply(headers=[("Content-Type", "text/plain")], body=b"User-agent: *\n"),
        "/old": Reply(status=301, headers=[("Location", "/new")]),
        "/new": html(),
    }
    handler = http_handler(app_of(routes))
    async with site(handler, ssl_context=tls.server, verify=tls.client) as (server, f):
        status, _body = await f.fetch_robots("https", "secure.fetch.test", None)
        result = await f.fetch("https://secure.fetch.test/old")
    assert status == 200
    assert result.final_url == "https://secure.fetch.test/new" and result.body == PAGE
    assert server.connections == 1 and tls.sni == ["secure.fetch.test"]


async def test_the_x_robots_tag_header_reaches_the_result() -> None:
    page = html(PAGE, ("X-Robots-Tag", "noindex"), ("X-Robots-Tag", "nofollow"))
    async with site(http_handler(app_of({"/": page}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.robots_tag is not None
    assert {v.strip() for v in result.robots_tag.split(",")} == {"noindex", "nofollow"}


def test_bad_fetcher_settings_name_keys_that_exist() -> None:
    resolver = Resolver()
    with pytest.raises(ConfigError) as agent:
        Fetcher(user_agent=" ", resolver=resolver)
    assert agent.value.key == "crawl.user_agent"
    with pytest.raises(ConfigError) as hosts:
        Fetcher(user_agent=UA, resolver=resolver, max_open_hosts=0)
    assert hosts.value.key is None and "max_open_hosts=0" in str(hosts.value)


async def test_configure_changes_the_user_agent_and_limits_of_the_next_fetch() -> None:
    from refresher._config import FetchConfig

    async with site(http_handler(app_of({"/": html()}))) as (server, f):
        await f.fetch("http://a.fetch.test/")
        f.configure(FetchConfig(max_body_bytes=10), user_agent="newbot/2.0")
        cut = await f.fetch("http://a.fetch.test/")
        with pytest.raises(ConfigError) as bad:
            f.configure(FetchConfig(timeout=0.0), user_agent="newbot/2.0")
    assert [r.headers["user-agent"] for r in server.requests] == [UA, "newbot/2.0"]
    assert cut.error_kind == "too_large"
    assert bad.value.key == "fetch.timeout"


async def test_a_fetch_on_a_kept_connection_leaves_no_reference_cycle_behind() -> None:
    import gc

    async with site(http_handler(app_of({"/p": html(PAGE)}))) as (_server, f):
        await f.fetch("http://a.fetch.test/p")  # the connection and its caches set up
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                assert (await f.fetch("http://a.fetch.test/p")).ok
            gc.collect()
            kinds = {type(o).__name__ for o in gc.garbage}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    # the response and its parser were a cycle for the collector to find, 13 objects a fetch
    assert not {"Response", "HttpResponseParser"} & kinds
