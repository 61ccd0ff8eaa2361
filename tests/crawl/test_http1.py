"""The lean HTTP/1.1 path against httpx on a corpus of odd responses served raw.

Each answer is served byte for byte from a loopback socket (then the server closes); the
fetcher and an httpx client fetch it, and their status, body and header fields must agree,
or both must fail. The differences that remain are listed in ``DIFFERENT`` and in README
("How a refresh goes"), each with what the fetcher does instead.
"""

from __future__ import annotations

import gzip

import httpx
import pytest
import trio
from _rawserver import Connection, raw_server

from refresher.crawl._dns import Resolver
from refresher.crawl._fetch import Fetcher, FetchResult
from refresher.crawl._http1 import MAX_HEAD_BYTES

UA = "refresher-test/1.0 (+https://example.invalid/bot)"
PAGE = b"<!doctype html><p>odd</p>"


def chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return body + b"0\r\n" + trailer + b"\r\n"


OK = b"HTTP/1.1 200 OK\r\n"
CORPUS: dict[str, bytes] = {
    "plain": OK + b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE),
    "chunked": OK + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(PAGE[:5], PAGE[5:]),
    "chunk-extensions": OK
    + b"Transfer-Encoding: chunked\r\n\r\n"
    + b"%x;name=value\r\n%s\r\n0\r\n\r\n" % (len(PAGE), PAGE),
    "trailers": OK
    + b"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
    + chunked(PAGE, trailer=b"X-Sum: 42\r\n"),
    "close-delimited": OK + b"Content-Type: text/html\r\n\r\n" + PAGE,
    "http-1.0-close-delimited": b"HTTP/1.0 200 OK\r\n\r\n" + PAGE,
    "continue-then-200": b"HTTP/1.1 100 Continue\r\n\r\n"
    + OK
    + b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE),
    "early-hints-then-200": b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    + OK
    + b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE),
    "folded-header": OK + b"X-Folded: one\r\n two\r\nContent-Length: 3\r\n\r\nabc",
    "duplicate-content-length-differing": OK
    + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "duplicate-content-length-equal": OK + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "content-length-and-chunked": OK
    + b"Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
    + chunked(PAGE),
    "transfer-encoding-gzip": OK
    + b"Transfer-Encoding: gzip, chunked\r\n\r\n"
    + chunked(gzip.compress(PAGE)),
    "huge-header-accepted": OK + b"X-Big: " + b"b" * 60_000 + b"\r\nContent-Length: 2\r\n\r\nok",
    "huge-header-refused": OK
    + b"X-Big: "
    + b"b" * (10 * MAX_HEAD_BYTES)
    + b"\r\nContent-Length: 2\r\n\r\nok",
    "many-headers": OK + b"".join(b"X-N%d: %d\r\n" % (i, i) for i in range(500)) + b"\r\n",
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "no-reason": b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
    "odd-status": b"HTTP/1.1 299 Whatever\r\nContent-Length: 2\r\n\r\nok",
    "no-content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "latin-1-value": OK + b"X-Name: caf\xe9\r\nContent-Length: 2\r\n\r\nok",
    "nul-in-value": OK + b"X-Bad: a\x00b\r\nContent-Length: 2\r\n\r\nok",
    "space-before-colon": OK + b"X-Bad : v\r\nContent-Length: 2\r\n\r\nok",
    "short-body": OK + b"Content-Length: 10\r\n\r\nabc",
    "bad-chunk-size": OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "http-0.9": PAGE,
    "http-2-status-line": b"HTTP/2 200\r\nContent-Length: 2\r\n\r\nok",
    "empty": b"",
}

#: name: the fetcher's error kind where httpx answers (documented in README).
DIFFERENT = {
    # RFC 9112 §6.3 lets a recipient accept identical values; llhttp refuses any repetition
    "duplicate-content-length-equal": "protocol",
}


async def fetch_both(data: bytes) -> tuple[FetchResult, httpx.Response | Exception]:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(data)

    async with raw_server(handler) as server:
        resolver = Resolver(static={"odd.test": f"127.0.0.1:{server.port}"})
        async with Fetcher(user_agent=UA, resolver=resolver, timeout=10.0) as fetcher:
            ours = await fetcher.fetch("http://odd.test/")
        theirs: httpx.Response | Exception
        async with httpx.AsyncClient(timeout=10.0) as client:
            try:
                theirs = await client.get(f"http://127.0.0.1:{server.port}/")
            except httpx.HTTPError as e:
                theirs = e
    return ours, theirs


def fields(raw: list[tuple[bytes, bytes]] | tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    return [
        (
            (k.decode("latin-1") if isinstance(k, bytes) else k).lower(),
            v.decode("latin-1") if isinstance(v, bytes) else v,
        )
        for k, v in raw
    ]


@pytest.mark.parametrize("name", sorted(CORPUS))
async def test_the_fetcher_answers_an_odd_response_as_httpx_does(name: str) -> None:
    ours, theirs = await fetch_both(CORPUS[name])
    if name in DIFFERENT:
        assert isinstance(theirs, httpx.Response) and ours.error_kind == DIFFERENT[name]
        return
    if isinstance(theirs, Exception):
        assert ours.error_kind in ("protocol", "read"), (ours, theirs)
        return
    assert ours.error_kind is None, ours.error
    assert ours.status == theirs.status_code
    assert ours.reason == theirs.reason_phrase
    assert ours.payload == (theirs.content if 200 <= theirs.status_code < 300 else None)
    assert fields(ours.headers) == fields(theirs.headers.raw)


def test_every_difference_from_httpx_is_in_the_corpus() -> None:
    assert set(DIFFERENT) <= set(CORPUS)


async def test_a_huge_answer_in_tiny_pieces_reads_as_in_one_piece() -> None:
    body = PAGE * 200
    data = (
        OK
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + chunked(*(body[i : i + 7] for i in range(0, len(body), 7)))
    )

    async def handler(conn: Connection) -> None:
        await conn.read_request()
        for i in range(0, len(data), 13):
            await conn.send(data[i : i + 13])
            await trio.lowlevel.checkpoint()

    async with raw_server(handler) as server:
        resolver = Resolver(static={"odd.test": f"127.0.0.1:{server.port}"})
        async with Fetcher(user_agent=UA, resolver=resolver, timeout=10.0) as fetcher:
            result = await fetcher.fetch("http://odd.test/")
    assert result.status == 200 and result.payload == body
