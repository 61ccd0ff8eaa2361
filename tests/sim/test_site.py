"""The local site server: virtual hosts, validators, change processes, robots, hostile paths.

Every HTTP test talks to a real server on 127.0.0.1 (httpx on trio, or raw sockets where the
point is what goes over the wire). Page versions are driven by an injected wall clock.
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from email.utils import parsedate_to_datetime
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import h11
import httpx
import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from refresher._errors import ConfigError
from refresher.discover._document import Document
from refresher.discover._sitemaps import Sitemaps
from refresher.sim._site import (
    SITEMAP_LASTMODS,
    HostSpec,
    PageSpec,
    RequestLog,
    RequestRecord,
    Site,
    _fast_parse,
    _make_request,
    make_demo_site,
    serve_site,
)

T0 = 1_700_000_000.0
DEADLINE = 20.0  # seconds; generous for a loaded machine, only reached when something hangs

Serve = Callable[[Site], Awaitable[int]]


class ManualClock:
    """A wall clock the test moves by hand (seconds since the epoch)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def serve(nursery: trio.Nursery) -> AsyncIterator[Serve]:
    """Start sites on free loopback ports; fail the test if the server itself raised."""
    sites: list[Site] = []

    async def start(site: Site) -> int:
        sites.append(site)
        port: int = await nursery.start(serve_site, site)
        return port

    yield start
    for site in sites:
        assert site.statistics().handler_errors == 0


def client(port: int, *, follow_redirects: bool = False) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE, follow_redirects=follow_redirects
    )


def one_host(*pages: PageSpec, **host: object) -> list[HostSpec]:
    return [HostSpec(name="a.sim.test", pages=pages, **host)]  # type: ignore[arg-type]


A = {"Host": "a.sim.test"}


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(DEADLINE):
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received


def responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """Split consecutive Content-Length-framed responses into (head, body) pairs."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        found.append((head, rest[:length]))
        data = rest[length:]
    return found


# ----------------------------------------------------------------------------- routing


async def test_virtual_hosts_are_routed_by_the_host_header(serve: Serve) -> None:
    site = Site(
        [HostSpec(name=n, pages=(PageSpec(path="/"),)) for n in ("a.sim.test", "b.sim.test")]
    )
    port = await serve(site)
    async with client(port) as c:
        a = await c.get("/", headers={"Host": "a.sim.test"})
        b = await c.get("/", headers={"Host": "B.Sim.Test:8080"})
    assert a.status_code == b.status_code == 200
    assert "<title>a.sim.test/</title>" in a.text
    assert "<title>b.sim.test/</title>" in b.text
    assert [r.host for r in site.requests] == ["a.sim.test", "b.sim.test"]


async def test_unknown_hosts_paths_and_methods_are_refused(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/"))))
    async with client(port) as c:
        assert (await c.get("/", headers={"Host": "nobody.sim.test"})).status_code == 404
        assert (await c.get("/missing", headers=A)).status_code == 404
        post = await c.post("/", headers=A, content=b"x" * 10_000)
        assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
        # the request body was consumed: the connection still serves the next request
        assert (await c.get("/", headers=A)).status_code == 200


async def test_a_page_path_may_carry_a_query(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/item?id=3"), PageSpec(path="/item"))))
    async with client(port) as c:
        with_query = await c.get("/item?id=3", headers=A)
        other_query = await c.get("/item?id=4", headers=A)
    assert "/item?id=3</title>" in with_query.text
    assert "<title>a.sim.test/item</title>" in other_query.text


async def test_head_sends_the_length_but_no_body(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/", size=5000))))
    async with client(port) as c:
        get = await c.get("/", headers=A)
        head = await c.head("/", headers=A)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(get.content) > 4000


async def test_links_are_rendered_as_anchors(serve: Serve) -> None:
    links = ("/b", "http://b.sim.test/x", "https://elsewhere.test/?q=1&r=2")
    port = await serve(Site(one_host(PageSpec(path="/", links=links))))
    async with client(port) as c:
        text = (await c.get("/", headers=A)).text
    assert '<a href="/b">' in text
    assert '<a href="http://b.sim.test/x">' in text
    assert '<a href="https://elsewhere.test/?q=1&amp;r=2">' in text


async def test_links_to_own_hosts_can_carry_the_bound_port(serve: Serve) -> None:
    hosts = [
        HostSpec(name="a.sim.test", pages=(PageSpec(path="/", links=("http://b.sim.test/x",)),)),
        HostSpec(name="b.sim.test", pages=(PageSpec(path="/x", links=("http://c.test/",)),)),
    ]
    site = Site(hosts, link_port="bound")
    port = await serve(site)
    async with client(port) as c:
        a = (await c.get("/", headers=A)).text
        b = (await c.get("/x", headers={"Host": "b.sim.test"})).text
    assert f'href="http://b.sim.test:{port}/x"' in a
    assert 'href="http://c.test/"' in b  # not one of the site's hosts: left alone


def test_bad_host_specs_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="bare host name"):
        Site([HostSpec(name="http://a.sim.test", pages=())])
    with pytest.raises(ConfigError, match="listed twice"):
        Site([HostSpec(name="a.sim.test", pages=()), HostSpec(name="A.sim.test", pages=())])
    with pytest.raises(ConfigError, match="twice"):
        Site(one_host(PageSpec(path="/"), PageSpec(path="/")))
    with pytest.raises(ConfigError, match="starting with '/'"):
        Site(one_host(PageSpec(path="p")))
    with pytest.raises(ConfigError, match="validators"):
        Site(one_host(PageSpec(path="/"), validators="maybe"))
    with pytest.raises(ConfigError, match="no page"):
        Site(one_host(PageSpec(path="/"))).version("a.sim.test", "/nope", T0)


# ----------------------------------------------------------------------------- validators


async def test_an_honest_host_answers_a_matching_etag_with_304(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/")), clock=ManualClock()))
    async with client(port) as c:
        first = await c.get("/", headers=A)
        etag = first.headers["etag"]
        again = await c.get("/", headers={**A, "If-None-Match": etag})
        weak = await c.get("/", headers={**A, "If-None-Match": f'"x", W/{etag}'})
        star = await c.get("/", headers={**A, "If-None-Match": "*"})
        other = await c.get("/", headers={**A, "If-None-Match": '"something-else"'})
    assert first.status_code == 200 and "last-modified" in first.headers
    assert again.status_code == weak.status_code == star.status_code == 304
    assert again.content == b"" and again.headers["etag"] == etag
    assert other.status_code == 200 and other.content == first.content


async def test_if_none_match_wins_over_if_modified_since(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/")), clock=ManualClock()))
    async with client(port) as c:
        first = await c.get("/", headers=A)
        conditional = {
            "If-None-Match": '"stale"',
            "If-Modified-Since": first.headers["last-modified"],
        }
        response = await c.get("/", headers={**A, **conditional})
    assert response.status_code == 200


async def test_if_modified_since_gives_304_until_the_page_changes(serve: Serve) -> None:
    clock = ManualClock()
    site = Site(one_host(PageSpec(path="/", change_rate=0.01)), clock=clock, seed=3)
    port = await serve(site)
    first_change = float(site.change_times("a.sim.test", "/", T0 + 10_000)[0])
    async with client(port) as c:
        first = await c.get("/", headers=A)
        since = {**A, "If-Modified-Since": first.headers["last-modified"]}
        clock.now = first_change - 0.001
        before = await c.get("/", headers=since)
        clock.now = first_change + 1.5
        after = await c.get("/", headers=since)
        garbage = await c.get("/", headers={**A, "If-Modified-Since": "yesterday"})
    assert before.status_code == 304
    assert after.status_code == 200 and after.content != first.content
    modified = parsedate_to_datetime(after.headers["last-modified"]).timestamp()
    assert modified == math.floor(first_change)
    assert garbage.status_code == 200


async def test_two_changes_in_one_second_are_never_hidden_by_last_modified(serve: Serve) -> None:
    # Last-Modified has whole seconds. With a page changing 3 times a second, a client that
    # holds a version from the same second as the newest must get 200, not 304.
    clock = ManualClock()
    site = Site(one_host(PageSpec(path="/", change_rate=3.0)), clock=clock, seed=1)
    port = await serve(site)
    times = site.change_times("a.sim.test", "/", T0 + 100)
    shared = [i for i in range(1, len(times)) if math.floor(times[i]) == math.floor(times[i - 1])]
    alone = [
        i
        for i in range(1, len(times) - 1)
        if math.floor(times[i - 1]) < math.floor(times[i]) < math.floor(times[i + 1])
    ]
    assert shared and alone
    async with client(port) as c:
        answers = {}
        for label, i in (("shared", shared[0]), ("alone", alone[0])):
            clock.now = float(times[i]) + 1e-6
            page = await c.get("/", headers=A)
            clock.now = float(min(times[i + 1], math.floor(times[i]) + 1)) - 1e-6
            since = {**A, "If-Modified-Since": page.headers["last-modified"]}
            answers[label] = (await c.get("/", headers=since)).status_code
    assert answers == {"shared": 200, "alone": 304}


async def test_a_host_without_validators_sends_none_and_ignores_conditionals(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/"), validators="none")))
    async with client(port) as c:
        first = await c.get("/", headers=A)
        conditional = {"If-None-Match": "*", "If-Modified-Since": first.headers["date"]}
        second = await c.get("/", headers={**A, **conditional})
    assert "etag" not in first.headers and "last-modified" not in first.headers
    assert second.status_code == 200


async def test_a_wrong_host_changes_its_etag_each_time_and_dates_itself_ahead(
    serve: Serve,
) -> None:
    port = await serve(Site(one_host(PageSpec(path="/"), validators="wrong")))
    async with client(port) as c:
        first = await c.get("/", headers=A)
        second = await c.get("/", headers={**A, "If-None-Match": first.headers["etag"]})
    assert second.status_code == 200
    assert first.headers["etag"] != second.headers["etag"]
    assert first.content == second.content  # the page itself did not change
    modified = parsedate_to_datetime(first.headers["last-modified"])
    assert modified > parsedate_to_datetime(first.headers["date"])


async def test_a_gzip_host_compresses_for_clients_that_accept_it(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/", size=8000), gzip=True)))
    async with client(port) as c:
        zipped = await c.get("/", headers={**A, "Accept-Encoding": "gzip"})
        plain = await c.get("/", headers={**A, "Accept-Encoding": "gzip;q=0, identity"})
        etag = plain.headers["etag"]
        # the gzip and identity representations of one version validate each other
        cross = await c.get("/", headers={**A, "If-None-Match": zipped.headers["etag"]})
    assert zipped.headers["content-encoding"] == "gzip" and zipped.headers["vary"]
    assert zipped.num_bytes_downloaded < len(plain.content) / 2
    assert zipped.content == plain.content  # httpx decoded it
    assert "content-encoding" not in plain.headers
    assert zipped.headers["etag"] != etag and cross.status_code == 304


# ----------------------------------------------------------------------------- change process


def test_changes_follow_a_poisson_process_at_the_configured_rate() -> None:
    rate = 0.05  # changes per second
    horizon = 200_000.0  # seconds: 10,000 expected changes
    site = Site(one_host(PageSpec(path="/", change_rate=rate)), clock=ManualClock(), seed=7)
    times = np.asarray(site.change_times("a.sim.test", "/", T0 + horizon))
    expected = rate * horizon
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)
    assert site.version("a.sim.test", "/", T0 + horizon) == len(times)
    gaps = np.diff(np.concatenate([[T0], times]))
    assert (gaps > 0).all()
    # exponential gaps of mean 1/rate (a fixed seed: this either always passes or never)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-3
    # and counts in disjoint windows are Poisson: variance ≈ mean
    counts = np.histogram(times, bins=200, range=(T0, T0 + horizon))[0]
    assert 0.7 < counts.var() / counts.mean() < 1.3


def test_change_times_depend_on_the_seed_and_not_on_the_order_of_questions() -> None:
    def fresh(seed: int) -> Site:
        return Site(one_host(PageSpec(path="/", change_rate=1.0)), seed=seed, start=T0)

    at_once = fresh(1).change_times("a.sim.test", "/", T0 + 5000)
    stepwise = fresh(1)
    for t in (T0 + 3, T0 + 10, T0 + 700, T0 + 2):
        stepwise.version("a.sim.test", "/", t)
    assert np.array_equal(stepwise.change_times("a.sim.test", "/", T0 + 5000), at_once)
    other = fresh(2).change_times("a.sim.test", "/", T0 + 5000)
    assert not np.array_equal(other[:10], at_once[:10])


def test_versions_count_changes_and_start_at_zero() -> None:
    site = Site(one_host(PageSpec(path="/", change_rate=0.5), PageSpec(path="/never")), start=T0)
    times = site.change_times("a.sim.test", "/", T0 + 100)
    assert site.version("a.sim.test", "/", T0 - 50) == 0
    assert site.version("a.sim.test", "/", T0) == 0
    assert site.version("a.sim.test", "/", float(times[0])) == 1  # a change at t counts at t
    assert site.version("a.sim.test", "/", float(times[0]) - 1e-6) == 0
    assert site.version("a.sim.test", "/", float(times[9]) + 1e-6) == 10
    assert site.version("a.sim.test", "/never", T0 + 1e9) == 0
    assert len(site.change_times("a.sim.test", "/never", T0 + 1e9)) == 0
    assert site.change_rate("a.sim.test", "/") == 0.5


async def test_the_body_changes_exactly_when_the_version_does(serve: Serve) -> None:
    clock = ManualClock()
    site = Site(one_host(PageSpec(path="/", change_rate=0.1)), clock=clock, seed=5)
    port = await serve(site)
    t1, t2 = (float(t) for t in site.change_times("a.sim.test", "/", T0 + 1000)[:2])
    bodies = []
    async with client(port) as c:
        for t in (T0, t1 - 1e-3, t1, t2 - 1e-3, t2):
            clock.now = t
            response = await c.get("/", headers=A)
            bodies.append((response.content, response.headers["etag"]))
    assert bodies[0] == bodies[1] != bodies[2]
    assert bodies[2] == bodies[3] != bodies[4]
    assert [r.version for r in site.requests] == [0, 0, 1, 1, 2]
    assert site.body("a.sim.test", "/", t2) == bodies[4][0]


# ----------------------------------------------------------------------------- robots.txt


async def test_robots_txt_follows_the_host_spec(serve: Serve) -> None:
    rules = "User-agent: *\nDisallow: /private/\n"
    hosts = [
        HostSpec(name="ok.sim.test", pages=(), robots=rules),
        HostSpec(name="none.sim.test", pages=()),
        HostSpec(name="error.sim.test", pages=(), robots=rules, robots_status=500),
        HostSpec(name="gone.sim.test", pages=(), robots=None, robots_status=503),
        HostSpec(
            name="moved.sim.test", pages=(), robots=rules, robots_status=301, robots_redirect_hops=3
        ),
    ]
    port = await serve(Site(hosts))
    async with client(port, follow_redirects=True) as c:

        async def robots(host: str) -> httpx.Response:
            return await c.get("/robots.txt", headers={"Host": host})

        ok = await robots("ok.sim.test")
        assert ok.status_code == 200 and ok.text == rules
        assert ok.headers["content-type"].startswith("text/plain")
        assert (await robots("none.sim.test")).status_code == 404
        assert (await robots("error.sim.test")).status_code == 500
        assert (await robots("gone.sim.test")).status_code == 503
    # redirects are absolute URLs on the Host as sent; follow them by hand to keep Host
    async with client(port) as c:
        target, hops = "/robots.txt", 0
        while True:
            response = await c.get(target, headers={"Host": "moved.sim.test"})
            if response.status_code != 301:
                break
            hops += 1
            location = urlsplit(response.headers["location"])
            assert location.netloc == "moved.sim.test"
            target = f"{location.path}?{location.query}"
    assert hops == 3 and response.status_code == 200 and response.text == rules


async def test_each_kind_of_sitemap_lastmod_is_served_as_its_host_writes_it(serve: Serve) -> None:
    clock = ManualClock(T0 + 50_000.0)  # the site starts at T0; "/" has changed since
    pages = (PageSpec(path="/", change_rate=0.001), PageSpec(path="/still"))
    kinds = SITEMAP_LASTMODS
    hosts = [
        HostSpec(name=f"{k}.sim.test", pages=pages, sitemap=True, sitemap_lastmod=k) for k in kinds
    ]
    site = Site(hosts, clock=clock, start=T0, seed=5)
    changed = float(site.change_times("honest.sim.test", "/", clock.now)[-1])
    assert changed > T0 + 1
    port = await serve(site)
    read: dict[str, dict[str, float]] = {}
    text: dict[str, str] = {}
    async with client(port) as c:
        for k in kinds:
            response = await c.get("/sitemap.xml", headers={"Host": f"{k}.sim.test"})
            assert response.status_code == 200
            text[k] = response.text
            url = f"http://{k}.sim.test/sitemap.xml"
            doc = Document(url=url, content_type="application/xml", body=response.content)
            ex = Sitemaps().process(doc)
            lastmods = dict(ex.lastmod) | dict(ex.coarse_lastmod)
            assert (k == "date") is bool(ex.coarse_lastmod) is not bool(ex.lastmod)
            read[k] = {u.removeprefix(f"http://{k}.sim.test"): t for u, t in lastmods.items()}
    assert read["honest"] == {"/": math.floor(changed * 1000) / 1000, "/still": T0}
    midnight = (changed // 86400) * 86400  # Unix days are UTC days
    assert read["date"] == {"/": midnight, "/still": (T0 // 86400) * 86400}
    assert "<lastmod>2023-11-14</lastmod>" in text["date"]  # T0's day alone, no time
    assert read["build"] == {"/": T0, "/still": T0}
    assert read["now"] == {"/": clock.now, "/still": clock.now}


def test_an_unknown_kind_of_sitemap_lastmod_is_refused() -> None:
    spec = HostSpec(name="a.sim.test", pages=(), sitemap=True, sitemap_lastmod="never")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sitemap_lastmod"):
        Site([spec])


# ----------------------------------------------------------------------------- connections


async def test_one_keep_alive_connection_serves_many_requests(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/"), PageSpec(path="/b")))
    port = await serve(site)
    async with client(port) as c:
        for path in ("/", "/b", "/robots.txt", "/nope", "/"):
            await c.get(path, headers=A)
    assert {r.connection for r in site.requests} == {1}
    assert site.statistics().connections_total == 1
    assert [r.status for r in site.requests] == [200, 200, 404, 404, 200]


async def test_pipelined_requests_are_answered_in_order(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/a"), PageSpec(path="/b")))
    port = await serve(site)
    requests = b"".join(
        b"GET %s HTTP/1.1\r\nHost: a.sim.test\r\n%s\r\n" % (path, extra)
        for path, extra in ((b"/a", b""), (b"/b", b""), (b"/a", b"Connection: close\r\n"))
    )
    received = await raw_exchange(port, requests)
    titles = [body.split(b"<title>")[1].split(b"</title>")[0] for _, body in responses(received)]
    assert titles == [b"a.sim.test/a", b"a.sim.test/b", b"a.sim.test/a"]
    records = list(site.requests)
    assert len({r.connection for r in records}) == 1
    # pipelined requests may arrive before the previous answer is out: only order holds
    assert all(a.started <= b.started for a, b in itertools.pairwise(records))
    assert all(a.finished <= b.finished for a, b in itertools.pairwise(records))


async def test_connection_close_and_http_1_0_end_the_connection(serve: Serve) -> None:
    port = await serve(Site(one_host(PageSpec(path="/"))))
    for request in (
        b"GET / HTTP/1.1\r\nHost: a.sim.test\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: a.sim.test\r\n\r\n",
    ):
        received = await raw_exchange(port, request)  # returns only once the server closed
        assert received.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nconnection: close\r\n" in received.lower()


async def test_a_malformed_request_gets_400_and_a_closed_connection(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/")))
    port = await serve(site)
    for junk in (b"\x16\x03\x01\x00\xa5 not http\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"):
        received = await raw_exchange(port, junk)
        assert received.startswith(b"HTTP/1.1 400 ")
    assert site.statistics().bad_requests == 2


async def test_a_response_delay_holds_each_answer(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/"), response_delay=0.2))
    port = await serve(site)
    async with client(port) as c:
        await c.get("/", headers=A)
    (record,) = site.requests
    assert record.finished - record.started >= 0.2


async def test_a_request_being_answered_is_known_by_its_start_before_its_record(
    serve: Serve,
) -> None:
    site = Site(one_host(PageSpec(path="/"), response_delay=0.5))
    port = await serve(site)
    async with client(port) as c, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: c.get("/", headers=A))
        with trio.fail_after(DEADLINE):
            while not site.started_in_flight("a.sim.test"):
                await trio.sleep(0.01)
        (started,) = site.started_in_flight("a.sim.test")
        assert len(site.requests) == 0 and site.started_in_flight("other.test") == []
    (record,) = site.requests
    assert record.started_wall == started
    assert site.started_in_flight("a.sim.test") == []


# ----------------------------------------------------------------------------- hostile paths


async def test_stall_reads_the_request_and_never_answers(serve: Serve) -> None:
    site = Site([])
    port = await serve(site)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /hostile/stall HTTP/1.1\r\nHost: x.test\r\n\r\n")
    with trio.fail_after(DEADLINE):
        while site.statistics().requests_in_flight != 1:
            await trio.sleep(0.01)
    with trio.move_on_after(0.3) as silence:
        await stream.receive_some(1)
    assert silence.cancelled_caught
    await stream.aclose()
    with trio.fail_after(DEADLINE):
        await site.requests.wait_until(lambda log: len(log) == 1)
    (record,) = site.requests
    assert record.status == 0 and not record.complete


async def read_until(stream: trio.SocketStream, enough: Callable[[bytes], bool]) -> bytes:
    received = b""
    with trio.fail_after(DEADLINE):
        while not enough(received):
            chunk = await stream.receive_some(65536)
            assert chunk, f"the server closed after {received[:200]!r}"
            received += chunk
    return received


async def test_slow_body_trickles_one_byte_at_a_time(serve: Serve) -> None:
    port = await serve(Site([]))
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /hostile/slow-body?interval=0.02 HTTP/1.1\r\nHost: x\r\n\r\n")
        received = await read_until(stream, lambda r: r.count(b"\r\nx\r\n") >= 3)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
    assert body.startswith(b"1\r\nx\r\n1\r\nx\r\n1\r\nx\r\n")  # one-byte chunks


async def test_reset_cuts_the_head_short_with_an_rst(serve: Serve) -> None:
    port = await serve(Site([]))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /hostile/reset HTTP/1.1\r\nHost: x.test\r\n\r\n")
    received = b""
    with trio.fail_after(DEADLINE), pytest.raises(trio.BrokenResourceError) as broken:
        while chunk := await stream.receive_some(65536):
            received += chunk
    assert isinstance(broken.value.__cause__, ConnectionResetError)
    assert b"\r\n\r\n" not in received
    await stream.aclose()
    async with client(port) as c:
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            await c.get("/hostile/reset", headers=A)


async def test_garbage_is_not_http(serve: Serve) -> None:
    port = await serve(Site([]))
    received = await raw_exchange(port, b"GET /hostile/garbage HTTP/1.1\r\nHost: x\r\n\r\n")
    assert received and not received.startswith(b"HTTP/")
    async with client(port) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get("/hostile/garbage", headers=A)


async def test_endless_never_ends_the_body(serve: Serve) -> None:
    site = Site([])
    port = await serve(site)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"GET /hostile/endless HTTP/1.1\r\nHost: x\r\n\r\n")
        received = await read_until(stream, lambda r: len(r) > 3_000_000)
    head = received.partition(b"\r\n\r\n")[0]
    assert b"transfer-encoding: chunked" in head and b"content-length" not in head
    assert b"\r\n0\r\n\r\n" not in received  # no last chunk
    with trio.fail_after(DEADLINE):
        await site.requests.wait_until(lambda log: len(log) == 1)
    (record,) = site.requests
    assert not record.complete and record.body_bytes > 2_000_000


async def test_huge_sends_the_asked_size_and_keeps_the_connection(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/")))
    port = await serve(site)
    async with client(port) as c:
        big = await c.get("/hostile/huge?bytes=3000001", headers=A)
        head = await c.head("/hostile/huge?bytes=5", headers=A)
        after = await c.get("/", headers=A)
        bad = await c.get("/hostile/huge?bytes=lots", headers=A)
    assert big.status_code == 200 and len(big.content) == 3_000_001
    assert big.headers["content-length"] == "3000001"
    assert head.headers["content-length"] == "5" and head.content == b""
    assert after.status_code == 200 and bad.status_code == 400
    assert {r.connection for r in site.requests} == {1}


async def test_redirect_loop_points_at_itself(serve: Serve) -> None:
    port = await serve(Site([]))
    async with client(port) as c:
        r = await c.get("/hostile/redirect-loop?x=1", headers=A)
    assert r.status_code == 301
    assert r.headers["location"] == "http://a.sim.test/hostile/redirect-loop?x=1"


async def test_redirect_makes_the_asked_number_of_hops(serve: Serve) -> None:
    port = await serve(Site([]))
    async with client(port) as c:
        hops = []
        target = "/hostile/redirect?to=http%3A%2F%2Fb.sim.test%2Fend&hops=3&status=307"
        while True:
            r = await c.get(target, headers=A)
            if not r.is_redirect:
                break
            hops.append((r.status_code, r.headers["location"]))
            location = urlsplit(r.headers["location"])
            if location.netloc != "a.sim.test":
                break
            target = f"{location.path}?{location.query}"
        bad = await c.get("/hostile/redirect?hops=0&to=/x", headers=A)
    assert [status for status, _ in hops] == [307, 307, 307]
    assert hops[-1][1] == "http://b.sim.test/end"
    assert bad.status_code == 400


async def test_status_answers_with_the_asked_code_and_retry_after(serve: Serve) -> None:
    port = await serve(Site([]))
    async with client(port) as c:
        limited = await c.get("/hostile/status?code=429&retry_after=5", headers=A)
        default = await c.get("/hostile/status", headers=A)
        unavailable = await c.get("/hostile/status?code=503", headers=A)
        bad = await c.get("/hostile/status?code=99", headers=A)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "5"
    assert default.status_code == 500 and "retry-after" not in default.headers
    assert unavailable.status_code == 503 and bad.status_code == 400


async def test_gzip_bomb_is_small_and_inflates_huge(serve: Serve) -> None:
    port = await serve(Site([]))
    size = 20_000_000 + 12_345
    async with client(port) as c:
        r = await c.get(f"/hostile/gzip-bomb?bytes={size}", headers=A)
    assert r.headers["content-encoding"] == "gzip"
    assert r.num_bytes_downloaded < size / 500
    assert len(r.content) == size and r.content.count(0) == size
    # a valid gzip member: its CRC and length check out
    async with (
        client(port) as c,
        c.stream("GET", f"/hostile/gzip-bomb?bytes={size}", headers=A) as s,
    ):
        raw = b"".join([piece async for piece in s.aiter_raw()])
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert len(inflater.decompress(raw)) == size and inflater.eof and not inflater.unused_data
    assert gzip.decompress(raw[:100] + raw[100:]) == bytes(size)


async def test_unknown_hostile_paths_are_404(serve: Serve) -> None:
    port = await serve(Site([]))
    async with client(port) as c:
        r = await c.get("/hostile/whatever", headers=A)
    assert r.status_code == 404 and "/hostile/stall" in r.text


# ----------------------------------------------------------------------------- request log


async def test_the_request_log_times_each_request_and_keeps_headers_of_interest(
    serve: Serve,
) -> None:
    clock = ManualClock()
    site = Site(one_host(PageSpec(path="/")), clock=clock)
    port = await serve(site)
    headers = {**A, "User-Agent": "probe/1", "If-None-Match": '"x"', "Accept-Encoding": "br"}
    before = trio.current_time()
    async with client(port) as c:
        await c.get("/", headers=headers)
        await c.get("/", headers={**A, "If-Modified-Since": "Tue, 14 Nov 2023 22:13:20 GMT"})
    after = trio.current_time()
    first, second = site.requests
    assert before <= first.started <= first.finished <= second.started <= second.finished <= after
    assert first.started_wall == first.finished_wall == T0  # the site's clock
    assert (first.user_agent, first.if_none_match, first.accept_encoding) == (
        "probe/1",
        '"x"',
        "br",
    )
    assert second.if_modified_since == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert (first.method, first.path, first.status, first.version) == ("GET", "/", 200, 0)
    assert first.body_bytes > 1000 and first.complete
    assert site.statistics().body_bytes_sent == first.body_bytes + second.body_bytes


async def test_the_log_shows_overlapping_requests_to_one_host(serve: Serve) -> None:
    site = Site(one_host(PageSpec(path="/"), response_delay=0.1))
    port = await serve(site)
    async with client(port) as c:
        await c.get("/", headers=A)
        await c.get("/", headers=A)
    assert site.requests.hosts() == ["a.sim.test"]
    assert site.requests.overlapping("a.sim.test") == []
    assert all(gap >= 0 for gap in site.requests.gaps("a.sim.test"))
    assert len(site.requests.gaps("a.sim.test")) == 1
    site.requests.clear()
    async with client(port) as c, trio.open_nursery() as nursery:
        for _ in range(2):  # two connections at once: impolite
            nursery.start_soon(partial(c.get, "/", headers=A))
    pairs = site.requests.overlapping("a.sim.test")
    assert len(pairs) == 1 and pairs[0][0].connection != pairs[0][1].connection


def test_the_log_is_bounded_and_clearable() -> None:
    log = RequestLog(max_entries=3)
    for i in range(5):
        log.append(record(i))
    assert len(log) == 3 and log.total == 5 and log.dropped == 2
    assert [r.connection for r in log] == [2, 3, 4]
    assert [r.connection for r in log.entries(host="h")] == [2, 3, 4]
    log.clear()
    assert len(log) == 0 and log.total == 5
    with pytest.raises(ConfigError, match="max_entries"):
        RequestLog(max_entries=0)


def record(i: int) -> RequestRecord:
    return RequestRecord(
        connection=i,
        host="h",
        target="/",
        path="/",
        method="GET",
        status=200,
        started=i,
        finished=i + 0.5,
        started_wall=i,
        finished_wall=i,
        version=0,
        body_bytes=0,
        complete=True,
        if_none_match=None,
        if_modified_since=None,
        user_agent=None,
        accept_encoding=None,
    )


# ----------------------------------------------------------------------------- the fast parser


_fields = st.lists(
    st.sampled_from(
        [
            b"User-Agent: x/1",
            b"accept-encoding: gzip, br",
            b'If-None-Match: "e", W/"f"',
            b"Connection: keep-alive, Close",
            b"X-b_c:",
            b"X-A:   x  y  ",
            b"connection: close",
        ]
    ),
    max_size=3,
)
_hosts = st.sampled_from([b"Host: a.sim.test", b"host:A.sim.test:81 ", b"Host: [::1]:80"])
_request_lines = st.sampled_from(
    [b"GET / HTTP/1.1", b"HEAD /p?q=1 HTTP/1.1", b"GET /%7E/a?b=c&d HTTP/1.1"]
)
# Damage for half of the heads: h11 rejects some of these, and the fast path must then too.
_damage = st.one_of(
    st.sampled_from(
        [
            *(b" ", b"\t", b"\r", b"\n", b"\x00", b"\xff", b":", b"HTTP/1.0", b"\r\n x"),
            *(b"\r\nHost: b\r\n", b"\r\nContent-Length: 0", b"\r\nTransfer-Encoding: chunked"),
        ]
    ),
    st.binary(min_size=1, max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(
    line=_request_lines,
    fields=_fields,
    host=_hosts,
    position=st.integers(0, 3),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 200), _damage)),
    tail=st.binary(max_size=8),
)
def test_the_fast_parser_agrees_with_h11_whenever_it_accepts(
    line: bytes,
    fields: list[bytes],
    host: bytes,
    position: int,
    damage: tuple[int, bytes] | None,
    tail: bytes,
) -> None:
    fields.insert(min(position, len(fields)), host)
    head = b"\r\n".join([line, *fields])
    if damage is not None:
        at = damage[0] % (len(head) + 1)
        head = head[:at] + damage[1] + head[at:]
    data = head + b"\r\n\r\n" + tail
    fast = _fast_parse(data)
    if fast is None:
        return
    parser = h11.Connection(h11.SERVER)
    parser.receive_data(data)
    event = parser.next_event()  # must not raise: the fast path only takes what h11 takes
    assert isinstance(event, h11.Request)
    assert isinstance(parser.next_event(), h11.EndOfMessage)
    request, used = fast
    assert request == _make_request(event.method, event.target, event.http_version, event.headers)
    # Damage can end the head early (an inserted blank line): compare with what h11 left.
    assert data[used:] == parser.trailing_data[0]


def test_the_fast_parser_takes_a_plain_get() -> None:
    data = b"GET /p1?x=2 HTTP/1.1\r\nHost: A.sim.test:81\r\nUser-Agent: u\r\n\r\nGET"
    parsed = _fast_parse(data)
    assert parsed is not None
    request, used = parsed
    assert (request.method, request.path, request.query, request.host) == (
        "GET",
        "/p1",
        "x=2",
        "a.sim.test",
    )
    assert data[used:] == b"GET" and request.keep_alive


# ----------------------------------------------------------------------------- the demo web


def test_the_demo_site_is_varied_reachable_and_deterministic() -> None:
    site = make_demo_site(hosts=6, pages_per_host=30, seed=4, start=T0)
    again = make_demo_site(hosts=6, pages_per_host=30, seed=4, start=T0)
    assert site.hosts == again.hosts
    assert site.hosts != make_demo_site(hosts=6, pages_per_host=30, seed=5, start=T0).hosts
    names = {h.name for h in site.hosts}
    assert names == {f"h{i}.sim.test" for i in range(6)}
    rates = np.array([p.change_rate for h in site.hosts for p in h.pages])
    changing = rates[rates > 0]
    assert 0 < (rates == 0).sum() < len(rates) / 3  # a few never change
    assert changing.max() / np.median(changing) > 10  # heavy tail: a few change often
    assert np.median(changing) < changing.mean()  # most change rarely
    assert {h.validators for h in site.hosts} == {"honest", "none", "wrong"}
    assert any(h.robots and "Crawl-delay" in h.robots for h in site.hosts)
    assert any(h.robots is None for h in site.hosts)
    assert any(h.gzip for h in site.hosts) and not all(h.gzip for h in site.hosts)
    # every link names an existing page, some cross hosts, and "/" reaches every page
    pages = {(h.name, p.path): p for h in site.hosts for p in h.pages}
    cross = 0
    for (host, _), page in pages.items():
        for link in page.links:
            if link.startswith("http://"):
                cross += 1
                target = urlsplit(link)
                assert (target.netloc, target.path) in pages
            else:
                assert (host, link) in pages
    assert cross > 0
    for h in site.hosts:
        seen, todo = {"/"}, ["/"]
        while todo:
            for link in pages[(h.name, todo.pop())].links:
                if link.startswith("/") and link not in seen:
                    seen.add(link)
                    todo.append(link)
        assert seen == {p.path for p in h.pages}
    disallowed = [h for h in site.hosts if h.robots and "Disallow: /private/" in h.robots]
    assert disallowed and all(any("/private/" in p.path for p in h.pages) for h in disallowed)


async def test_the_command_line_serves_the_demo_site() -> None:
    port_file = Path(tempfile.mkdtemp(prefix="rfsite")) / "port"
    command = [sys.executable, "-m", "refresher.sim._site", "--hosts", "2", "--pages", "3"]
    command += ["--port", "0", "--port-file", str(port_file), "--seed", "1"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ)
    )
    try:
        with trio.fail_after(60):
            while not (port_file.exists() and port_file.read_text().strip()):
                assert process.poll() is None, process.stdout and process.stdout.read()
                await trio.sleep(0.05)
        port = int(port_file.read_text())
        async with client(port) as c:
            r = await c.get("/p1", headers={"Host": "h1.sim.test"})
        assert r.status_code == 200 and "h1.sim.test/p1" in r.text
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    assert f'"port": {port}' in output or f"port={port}" in output
