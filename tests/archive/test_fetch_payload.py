"""What the fetcher hands the archive: the response as received and every 2xx body."""

from __future__ import annotations

import gzip

from _rawserver import Connection, Reply, http_handler

from refresher.crawl._fetch import body_digest
from tests.crawl.test_fetch import app_of, html, site


async def test_a_non_html_2xx_body_is_kept_for_the_archive_not_for_the_parser() -> None:
    reply = Reply(headers=[("Content-Type", "image/png")], body=b"\x89PNG....")
    async with site(http_handler(app_of({"/i": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/i")
    assert result.body is None and result.payload == b"\x89PNG...."
    assert not result.truncated


async def test_the_response_headers_status_line_and_decoded_payload_are_as_received() -> None:
    page = b"<html>" + b"z" * 3000 + b"</html>"
    reply = html(gzip.compress(page), ("Content-Encoding", "gzip"), ("X-Custom", "kept"))
    async with site(http_handler(app_of({"/": reply}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.http_version == "HTTP/1.1" and result.reason is not None
    assert ("X-Custom", "kept") in result.headers
    assert ("Content-Encoding", "gzip") in result.headers
    assert result.payload == page and result.digest == body_digest(page)


async def test_a_body_over_the_cap_is_kept_cut_at_the_cap_and_marked_truncated() -> None:
    async def handler(conn: Connection) -> None:
        await conn.read_request()
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
        await conn.send(b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(20):
            await conn.send(b"3e8\r\n" + b"y" * 1000 + b"\r\n")
        await conn.send(b"0\r\n\r\n")

    async with site(handler, max_body_bytes=4500) as (_server, f):
        result = await f.fetch("http://a.fetch.test/")
    assert result.error_kind == "too_large" and result.status == 200
    assert result.truncated and result.payload == b"y" * 4500


async def test_an_error_status_keeps_no_payload() -> None:
    async with site(http_handler(app_of({}))) as (_server, f):
        result = await f.fetch("http://a.fetch.test/missing")
    assert result.status == 404 and result.payload is None and not result.truncated
