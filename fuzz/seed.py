"""Seed each fuzz target's corpus (fuzz/corpus/TARGET/) from the tests' data and examples."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from pathlib import Path

import brotli

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fuzz" / "corpus"


def _robots() -> list[bytes]:
    cases = json.loads((ROOT / "tests" / "data" / "robots_google_cases.json").read_text())
    out = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("robotstxt", "robots", "body") and isinstance(v, str):
                    out.append(b"\x00" * 8 + v.encode())
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(cases)
    out.append(b"/private/x\x00User-agent: *\nDisallow: /private/\nCrawl-delay: 2\n")
    return out


def _html() -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "tests" / "data" / "html").glob("*.html"))]


def _sitemap() -> list[bytes]:
    urlset = (
        b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        b"<url><loc>http://a.test/x</loc><lastmod>2024-01-02T03:04:05Z</lastmod></url></urlset>"
    )
    index = (
        b'<?xml version="1.0"?><sitemapindex><sitemap><loc>http://a.test/s2.xml</loc>'
        b"</sitemap></sitemapindex>"
    )
    return [b"\x00" + urlset, b"\x00" + index, b"\x01" + gzip.compress(urlset)]


def _charset() -> list[bytes]:
    out = []
    for label in ("utf-8", "windows-1252", "shift_jis", "utf-16le", "x-unknown"):
        body = f'<meta charset="{label}"><a href="/é">é</a>'.encode()
        out.append(label.encode().ljust(24, b" ") + body)
    return out


def _config() -> list[bytes]:
    return [
        (ROOT / "systemd" / "refresher.toml").read_bytes(),
        b"budget.fetches_per_second=5",
        b'[dns.static]\n"*.sim.test" = "127.0.0.1:8080"\n',
    ]


def _http() -> list[bytes]:
    return [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\nhello",
        b'HTTP/1.1 304 Not Modified\r\nETag: "e"\r\n\r\n',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
        + f"{len(gzip.compress(b'x')):x}\r\n".encode()
        + gzip.compress(b"x")
        + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 301 Moved\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nRetry-After: 120\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nok\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Type: text/html\r\n\r\nclose-delimited",
        b"HTTP/1.1 200 OK\nContent-Encoding: deflate\nContent-Length: 10\n\n"
        + zlib.compress(b"x")[:10],
        b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(brotli.compress(b'<a href=x>x</a>')):x}\r\n".encode()
        + brotli.compress(b"<a href=x>x</a>")
        + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 302 Found\r\nLocation: /p\r\nContent-Length: 0\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]


SEEDS = {
    "robots": _robots,
    "html": _html,
    "sitemap": _sitemap,
    "charset": _charset,
    "config": _config,
    "http": _http,
}


def main() -> None:
    for name, make in SEEDS.items():
        directory = CORPUS / name
        directory.mkdir(parents=True, exist_ok=True)
        for data in make():
            (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)
        print(f"{name}: {len(list(directory.iterdir()))} inputs in {directory}")


if __name__ == "__main__":
    main()
