"""Coverage-guided fuzzing of refresher's parsers with atheris (libFuzzer for Python).

    python fuzz/fuzz.py TARGET [libFuzzer options] [CORPUS_DIR ...]

Targets: robots, html, sitemap, charset, config, http (see TARGETS). Each one feeds arbitrary
bytes to public functions and treats any exception other than the documented ones as a crash
(libFuzzer then writes the input to ``crash-*``). ``make fuzz`` runs every target in turn, each
for ``FUZZ_SECONDS``, with the corpus seeded from the tests by ``fuzz/seed.py``.
"""

from __future__ import annotations

import contextlib
import functools
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
    """The fetcher against a loopback server that answers each request with the input.

    One trio loop in a thread keeps the server and the Fetcher (building an httpx client per
    input would cost more than the fetch); each input goes to a new virtual host, so no
    connection is reused across inputs."""
    # Imported here: only this target needs trio, httpx and a loopback socket.
    with atheris.instrument_imports(include=["refresher"]):
        import threading

        import trio

        from refresher.crawl._dns import Resolver
        from refresher.crawl._fetch import Fetcher

    answer = [b""]
    ready = threading.Event()
    loop: dict[str, object] = {}

    async def serve(stream: trio.SocketStream) -> None:
        head = b""
        # the client may hang up first: that is the fetcher's business, not the server's
        with trio.move_on_after(2), contextlib.suppress(trio.BrokenResourceError):
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                head += chunk
            await stream.send_all(answer[0])
        await stream.aclose()

    async def run_loop() -> None:
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(
                functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
            )
            port = listener.socket.getsockname()[1]
            resolver = Resolver(static={"*.a.test": f"127.0.0.1:{port}"})
            async with Fetcher(
                user_agent=_UA, resolver=resolver, timeout=2.0, max_open_hosts=8
            ) as fetcher:
                loop["fetcher"] = fetcher
                loop["token"] = trio.lowlevel.current_trio_token()
                ready.set()
                await trio.sleep_forever()

    threading.Thread(target=trio.run, args=(run_loop,), daemon=True).start()
    ready.wait()
    fetcher = loop["fetcher"]
    assert isinstance(fetcher, Fetcher)
    count = [0]

    def http(data: bytes) -> None:
        answer[0] = data
        count[0] += 1
        url = f"http://h{count[0]}.a.test/"
        result = trio.from_thread.run(
            lambda: fetcher.fetch(url, etag='"e"'),
            trio_token=loop["token"],  # type: ignore[arg-type]
        )
        # the property: fetch() returns a result for any bytes; it never raises
        assert result.bytes >= 0

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
