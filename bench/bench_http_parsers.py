"""h11 against httptools (llhttp) as the wire parser of the page fetch: CPU per exchange.

    python bench/bench_http_parsers.py [--seconds S]

Each exchange is what the fetcher does per request on a kept-alive connection, minus the
socket: write the request head, then parse one response fed in network-sized pieces (the
tiny page in one piece, the 96 KB chunked page in 16 KiB reads) and collect the status, the
header list and the body. h11 builds the request from an ``h11.Request`` (it must see the
request to parse the answer) and reuses its connection object (``start_next_cycle``);
httptools gets pre-computed request bytes and a new parser per response, as
``refresher.crawl._http1`` does. Prints microseconds per exchange (process CPU time), best
of three rounds. Assert nothing: a figure for README.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import h11
import httptools

TINY_BODY = b"<!doctype html><title>p</title>" + b"<a href='/x'>x</a>" * 7 + b"x" * 120
TINY = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.26.3\r\nDate: Tue, 24 Nov 2026 01:00:00 GMT\r\n"
    b"Content-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n"
    b"Last-Modified: Mon, 23 Nov 2026 10:00:00 GMT\r\nConnection: keep-alive\r\n"
    b'ETag: "6564a1b0-12c"\r\nAccept-Ranges: bytes\r\n\r\n' % len(TINY_BODY)
) + TINY_BODY
_BIG_BODY = (b"<p>" + b"docs " * 40 + b"<a href='/library/os.html'>os</a></p>\n") * 420


def _chunked(body: bytes, size: int) -> bytes:
    out = [
        b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/html\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    ]
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out.append(b"%x\r\n%s\r\n" % (len(part), part))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


BIG = _chunked(_BIG_BODY, 8192)
HEAD = b"GET /library/os.html HTTP/1.1\r\nHost: docs.test\r\nUser-Agent: bench/1.0\r\n\r\n"


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def h11_exchange(feed: list[bytes]) -> Callable[[], int]:
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", "docs.test"), ("User-Agent", "bench/1.0")]

    def one() -> int:
        conn.send(h11.Request(method="GET", target="/library/os.html", headers=headers))
        conn.send(h11.EndOfMessage())
        got = 0
        chunks = iter(feed)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(next(chunks))
            elif isinstance(event, h11.Response):
                got += event.status_code + len(event.headers)
            elif isinstance(event, h11.Data):
                got += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
        conn.start_next_cycle()
        return got

    return one


class _Collect:
    __slots__ = ("body", "done", "headers", "reason")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.reason = b""
        self.done = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.done = True


def httptools_exchange(feed: list[bytes]) -> Callable[[], int]:
    def one() -> int:
        request = b"".join((b"GET ", b"/library/os.html", HEAD[20:]))
        collect = _Collect()
        parser = httptools.HttpResponseParser(collect)
        for data in feed:
            parser.feed_data(data)
            if collect.done:
                break
        return (
            len(request)
            + parser.get_status_code()
            + len(collect.headers)
            + sum(map(len, collect.body))
        )

    return one


def per_call(fn: Callable[[], int], seconds: float) -> float:
    best = float("inf")
    for _ in range(3):
        n = 0
        t0 = time.process_time()
        deadline = t0 + seconds / 3
        while (now := time.process_time()) < deadline:
            for _ in range(50):
                fn()
            n += 50
        best = min(best, (now - t0) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    args = parser.parse_args()
    print(f"h11 {h11.__version__}, httptools {httptools.__version__}; µs CPU per exchange")
    print("| response | h11 | httptools | ratio |")
    print("|---|---|---|---|")
    for name, data, size in (
        (f"tiny page ({len(TINY)} B, 9 headers, one read)", TINY, len(TINY)),
        (f"chunked page ({len(BIG) // 1024} KB, 16 KiB reads)", BIG, 16384),
    ):
        feed = pieces(data, size)
        a = per_call(h11_exchange(feed), args.seconds)
        b = per_call(httptools_exchange(feed), args.seconds)
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.1f}× |")


if __name__ == "__main__":
    main()
