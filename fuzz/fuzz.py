"""Coverage-guided fuzzing of refresher's parsers with atheris (libFuzzer for Python).

    python fuzz/fuzz.py TARGET [libFuzzer options] [CORPUS_DIR ...]

Targets: robots, html, sitemap, charset, config, http (see TARGETS). Each one feeds arbitrary
bytes to public functions and treats any exception other than the documented ones as a crash
(libFuzzer then writes the input to ``crash-*``). ``make fuzz`` runs every target in turn, each
for ``FUZZ_SECONDS``, with the corpus seeded from the tests by ``fuzz/seed.py``.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["refresher"]):
    from refresher._config import load_config, parse_override
    from refresher._errors import ConfigError
    from refresher.crawl._robots import rules_for_response
    from refresher.discover._parse import Document, processors_for

_NO_FILE = Path("/nonexistent/refresher.toml")
_UA = "refresher/0.1 (+https://example.org/)"


def _processed(url: str, content_type: str | None, body: bytes) -> None:
    """Every processor for the type on the body; a processor must not raise."""
    doc = Document(url=url, content_type=content_type, body=body)
    for processor in processors_for(content_type, url=url):
        extracted = processor.process(doc)
        for link in extracted.links:
            assert link.url.lower().startswith(("http://", "https://")), link.url


def robots(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    path = fdp.ConsumeUnicodeNoSurrogates(64)
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    rules = rules_for_response(200, body, _UA)
    rules.allowed("http://a.test/" + path)
    assert rules.crawl_delay is None or math.isfinite(rules.crawl_delay)
    for url in rules.sitemaps:
        assert url.startswith(("http://", "https://")), url


def html(data: bytes) -> None:
    _processed("http://a.test/dir/page.html", "text/html", data)


def sitemap(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    gzipped = fdp.ConsumeBool()
    url = "http://a.test/sitemap.xml" + (".gz" if gzipped else "")
    _processed(url, None if gzipped else "application/xml", fdp.ConsumeBytes(fdp.remaining_bytes()))


def charset(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    label = fdp.ConsumeUnicodeNoSurrogates(24)
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    _processed("http://a.test/", f"text/html; charset={label}", body)


def config(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    with contextlib.suppress(ConfigError):
        parse_override(text)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    with contextlib.suppress(ConfigError):
        load_config(overrides=doc, default_file=_NO_FILE)


def _http() -> Callable[[bytes], None]:
    """The fetcher's response handling on the input as the server's bytes, in memory.

    The Fetcher runs as in the daemon (resolver, request, ``refresher.crawl._http1``'s parser
    and connection, body reading, decoding, caps, redirects, the result), except that its
    connections are in-memory streams: each connection it opens receives the input, cut into
    pieces whose sizes are drawn from the input's checksum, and the request it sends is
    dropped. No socket: one trio loop in a thread runs every input (a ``trio.run`` per input
    would cost ten times the fetch). Odd checksums fetch a page (conditional, so a 304
    counts), even ones robots.txt."""
    with atheris.instrument_imports(include=["refresher"]):
        import random
        import threading
        import zlib

        import trio

        from refresher.crawl import _http1
        from refresher.crawl._dns import Resolver
        from refresher.crawl._fetch import ROBOTS_MAX_BYTES, Fetcher

    max_body = 64 * 1024

    class Replay(trio.abc.Stream):
        """A connection whose server sends ``data`` in pieces and then closes."""

        def __init__(self, data: bytes, sizes: random.Random) -> None:
            self._data = memoryview(data)
            self._sizes = sizes

        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            await trio.lowlevel.checkpoint()

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            await trio.lowlevel.checkpoint()
            size = min(self._sizes.choice((1, 7, 512, 65536)), max_bytes or 65536)
            piece, self._data = self._data[:size], self._data[size:]
            return bytes(piece)

        async def aclose(self) -> None:
            await trio.lowlevel.checkpoint()

    resolver = Resolver(static={"*.a.test": "127.0.0.1:9"})
    ready = threading.Event()
    loop: dict[str, trio.lowlevel.TrioToken] = {}

    async def keep_loop() -> None:
        loop["token"] = trio.lowlevel.current_trio_token()
        ready.set()
        await trio.sleep_forever()

    threading.Thread(target=trio.run, args=(keep_loop,), daemon=True).start()
    ready.wait()

    def http(data: bytes) -> None:
        checksum = zlib.crc32(data)
        sizes = random.Random(checksum)

        async def connect(
            ip: str, port: int, *, server_hostname: str | None, context: object
        ) -> _http1.Connection:
            await trio.lowlevel.checkpoint()
            return _http1.Connection(Replay(data, sizes), (ip, port))

        async def run() -> None:
            fetcher = Fetcher(
                user_agent=_UA, resolver=resolver, timeout=5.0, max_body_bytes=max_body
            )
            fetcher._connect = connect  # type: ignore[method-assign]
            async with fetcher:
                if checksum & 1:
                    result = await fetcher.fetch("http://h.a.test/p", etag='"e"')
                    # the property: a result for any bytes, never an exception, within the cap
                    assert result.bytes <= max_body, result
                    assert result.payload is None or len(result.payload) <= max_body
                    assert (result.error_kind is None) == (result.error is None)
                    assert result.status is None or 200 <= result.status <= 999, result
                else:
                    _status, body, _error = await fetcher.fetch_robots_or_error(
                        "http", "h.a.test", None
                    )
                    assert len(body) <= ROBOTS_MAX_BYTES

        trio.from_thread.run(run, trio_token=loop["token"])

    return http


TARGETS: dict[str, Callable[[], Callable[[bytes], None]]] = {
    "robots": lambda: robots,
    "html": lambda: html,
    "sitemap": lambda: sitemap,
    "charset": lambda: charset,
    "config": lambda: config,
    "http": _http,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz.py {{{'|'.join(TARGETS)}}} [libFuzzer options] [CORPUS ...]")
    target = TARGETS[sys.argv[1]]()
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
