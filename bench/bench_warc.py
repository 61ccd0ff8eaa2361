"""The WARC writer on real pages: CPU per page and archive bytes per page at each gzip level.

    python bench/bench_warc.py [DIR] [--levels 4,5,6] [--pages N]

Every page of a docs tree (default: the Python 3.11 HTML docs of Debian's ``python3.11-doc``)
becomes a capture as a first fetch makes it (nginx's response header fields, the request's),
and :meth:`refresher.archive.WarcWriter.write_batch` writes them in batches of 100 (a
response and a request record each, each its own gzip member, one write and one fsync a
batch), as the store writer does. Printed per level: CPU milliseconds per page (process CPU
time, best of three passes; the machine may be shared), the compressed bytes per page and
their share of the uncompressed records; and the same pass without compression, which is
what the rest of the writer costs (warcio building the records, their SHA-1 digests, the
writes). Asserts nothing: figures for bench/README.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

from refresher.archive import _warc
from refresher.archive._warc import WarcWriter
from refresher.store._captures import Capture

DEFAULT_DIR = Path("/usr/share/doc/python3.11/html")
BATCH = 100


def page_capture(i: int, host: str, url: str, body: bytes) -> Capture:
    """Page ``i``'s first fetch as a capture: nginx's response header fields, the request's."""
    return Capture(
        page_id=i + 1,
        url=url,
        target_uri=url,
        fetched_at=1.8e9 + i * 0.01,
        kind="response",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(
            ("Server", "nginx/1.22.1"),
            ("Date", "Thu, 26 Nov 2026 04:00:00 GMT"),
            ("Content-Type", "text/html"),
            ("Last-Modified", "Sat, 24 Aug 2024 10:00:00 GMT"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive"),
            ("ETag", 'W/"66c9b0a0-17a2c"'),
        ),
        request_headers=(
            ("Host", host),
            ("User-Agent", "refresher/0 (+https://example.invalid/bot)"),
            ("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"),
            ("Accept-Encoding", "gzip, deflate"),
        ),
        payload=body,
        truncated=False,
        digest=None,
    )


def captures(root: Path, limit: int) -> list[Capture]:
    out = []
    for i, path in enumerate(sorted(root.rglob("*.html"))[:limit]):
        host = f"docs{i % 20}.test"
        out.append(
            page_capture(i, host, f"http://{host}/{path.relative_to(root)}", path.read_bytes())
        )
    return out


def per_page(caps: Sequence[Capture], level: int, repeat: int = 3) -> tuple[float, float]:
    """Best CPU milliseconds per page over ``repeat`` passes, and bytes per page."""
    best = float("inf")
    size = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            writer = WarcWriter(Path(d), compress_level=level)
            t0 = time.process_time()
            for i in range(0, len(caps), BATCH):
                writer.write_batch(caps[i : i + BATCH])
            best = min(best, time.process_time() - t0)
            size = writer.statistics().bytes
            writer.close()
    return best / len(caps) * 1e3, size / len(caps)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    p.add_argument("--levels", default="1,2,3,4,5,6,7,8,9")
    p.add_argument("--pages", type=int, default=10_000)
    args = p.parse_args(argv)
    caps = captures(args.dir, args.pages)
    if not caps:
        raise SystemExit(f"no *.html under {str(args.dir)!r}: apt-get install python3.11-doc")
    payload = sum(len(c.payload or b"") for c in caps) / len(caps)
    print(f"{len(caps)} pages of {args.dir}, {payload / 1024:.1f} KiB each on average")
    with mock.patch.object(_warc, "_gzip_member", lambda data, level: data):
        plain_ms, plain_bytes = per_page(caps, 6)
    print(f"  not compressed   {plain_ms:6.3f} CPU ms/page  {plain_bytes:9.0f} B/page")
    for level in map(int, args.levels.split(",")):
        ms, size = per_page(caps, level)
        share = size / plain_bytes * 100
        print(f"  gzip level {level}     {ms:6.3f} CPU ms/page  {size:9.0f} B/page  {share:5.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
