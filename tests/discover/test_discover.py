"""Discovery end to end: a real daemon finds pages by links, stays in scope, survives traps."""

from __future__ import annotations

import re
import signal

import pytest
from _rawserver import Reply, Request, http_handler, raw_server
from conftest import daemon_config, query_db, wait_for

from refresher.crawl._outcome import GONE_RECHECK
from refresher.ops._control import request
from refresher.sim._site import HostSpec, PageSpec, Site, serve_site

pytestmark = pytest.mark.slow


async def test_pages_found_by_links_are_fetched_then_refreshed_and_scope_is_kept(
    nursery, short_dir, daemons
):
    pages = (
        PageSpec(path="/", links=("/a", "/b", "http://other.sim.test/x")),
        PageSpec(path="/a", links=("/c", "/a#frag", "/b?utm_source=news")),
        PageSpec(path="/b", links=("mailto:x@y.z", "javascript:void(0)", "/")),
        PageSpec(path="/c", links=("/d",)),
        PageSpec(path="/d"),
    )
    site = Site(
        [
            HostSpec(name="w.sim.test", pages=pages),
            HostSpec(name="other.sim.test", pages=(PageSpec(path="/x"),)),
        ]
    )
    port = await nursery.start(serve_site, site)
    config = daemon_config(
        short_dir, port=port, seeds=["http://w.sim.test/"], budget={"fetches_per_second": 20.0}
    )
    d = daemons(config)
    await d.ready()
    # every page reachable from the seed is found and then fetched at least twice: once
    # because it is new, then again by the refresh policy
    for path in ("/a", "/b", "/c", "/d"):
        await wait_for(
            lambda p=path: len(site.requests.entries(host="w.sim.test", path=p)) >= 2,
            what=f"{path} fetched twice",
        )
    status = request(short_dir / "control.sock", {"op": "status"})
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0

    assert not site.requests.entries(host="other.sim.test"), "left the seeds' host"
    db = short_dir / "refresher.duckdb"
    rows = dict(query_db(db, "SELECT url, depth FROM pages"))
    assert rows == {
        "http://w.sim.test/": 0,
        "http://w.sim.test/a": 1,
        "http://w.sim.test/b": 1,
        "http://w.sim.test/c": 2,
        "http://w.sim.test/d": 3,
    }
    sources = dict(query_db(db, "SELECT url, source FROM pages"))
    assert sources["http://w.sim.test/"] == "seed" and sources["http://w.sim.test/d"] == "link"
    edges = set(
        query_db(
            db,
            "SELECT s.url, d.url FROM links JOIN pages s ON s.id = links.src "
            "JOIN pages d ON d.id = links.dst",
        )
    )
    assert ("http://w.sim.test/c", "http://w.sim.test/d") in edges
    assert ("http://w.sim.test/b", "http://w.sim.test/") in edges
    assert status["filter"]["cuts"]["out_of_scope"] >= 1
    assert status["discovery"]["new_pages"] == 4
    assert status["seen"]["cache"]["hits"] > 0  # links to known pages answered by the cache


def _trap_app(request: Request) -> Reply:
    """Every page links deeper, to next month, and to a new session: an endless web."""
    path = request.target.split("?")[0]
    if path == "/robots.txt":
        return Reply(status=404)
    month = re.search(r"/cal/(\d+)/(\d+)", path)
    links = [f"{path.rstrip('/')}/more/", "/list?page=1&sessionid=abc", "/list?sort=x&page=2"]
    if month:
        y, m = int(month.group(1)), int(month.group(2))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
        links.append(f"/cal/{y}/{m:02d}")
    else:
        links.append("/cal/2026/11")
    page = re.search(r"page=(\d+)", request.target)
    n = int(page.group(1)) + 1 if page else 1
    links.append(f"/list?page={n}&x={n}")
    body = "".join(f'<a href="{href}">x</a>' for href in links)
    return Reply(
        headers=[("content-type", "text/html")], body=f"<html><body>{body}</body></html>".encode()
    )


async def test_a_server_of_endless_links_stays_bounded(short_dir, daemons):
    async with raw_server(http_handler(_trap_app)) as server:
        config = daemon_config(
            short_dir,
            port=server.port,
            seeds=["http://trap.sim.test/"],
            budget={"fetches_per_second": 200.0},
            politeness={"min_delay": 0.0, "response_time_factor": 0.0},
            discovery={"sitemaps": False, "max_depth": 6, "max_query_variants_per_path": 20},
        )
        d = daemons(config)
        await d.ready()

        def cut_enough() -> dict | None:
            s = request(short_dir / "control.sock", {"op": "status"})
            cuts = s["filter"]["cuts"]
            return s if sum(cuts.values()) >= 25 else None

        status = await wait_for(cut_enough, what="the trap defences cut links")
        d.signal(signal.SIGTERM)
        assert await d.wait_exit() == 0
    pages = query_db(short_dir / "refresher.duckdb", "SELECT count(*), max(depth) FROM pages")[0]
    # depth ≤ 6; /list query variants ≤ 20; so the page set is bounded however long it runs
    assert pages[1] <= 6
    assert pages[0] <= 1 + 6 + 6 + 20 + 6
    assert sum(status["filter"]["cuts"].values()) >= 25


async def test_sitemaps_from_robots_txt_bring_pages_no_link_reaches_and_their_lastmod(
    nursery, short_dir, daemons
):
    site = Site(
        [
            HostSpec(
                name="s.sim.test",
                pages=(PageSpec(path="/"), PageSpec(path="/hidden", change_rate=0.01)),
                robots="User-agent: *\nDisallow: /private/\n",
                sitemap=True,
            ),
            # no Sitemap line: /sitemap.xml is tried once, and a 404 is not fetched again
            # (nor is /missing, a seed that answers 404): both leave the plan
            HostSpec(name="n.sim.test", pages=(PageSpec(path="/"),)),
        ]
    )
    port = await nursery.start(serve_site, site)
    config = daemon_config(
        short_dir,
        port=port,
        seeds=["http://s.sim.test/", "http://n.sim.test/", "http://n.sim.test/missing"],
        discovery={"sitemaps": True},
    )
    d = daemons(config)
    await d.ready()
    await wait_for(
        lambda: site.requests.entries(host="s.sim.test", path="/hidden"),
        what="the page only the sitemap lists",
    )
    await wait_for(
        lambda: len(site.requests.entries(host="n.sim.test", path="/")) >= 4,
        what="n refreshed a few times",
    )
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    assert len(site.requests.entries(host="n.sim.test", path="/sitemap.xml")) == 1
    assert len(site.requests.entries(host="n.sim.test", path="/missing")) == 1
    db = short_dir / "refresher.duckdb"
    pages = {
        u: (src, lm, status)
        for u, src, lm, status in query_db(
            db, "SELECT url, source, sitemap_lastmod, status FROM pages"
        )
    }
    # gone pages are re-checked only on their own slow schedule
    for url in ("http://n.sim.test/sitemap.xml", "http://n.sim.test/missing"):
        ((due, last),) = query_db(db, f"SELECT due_at, last_fetch FROM pages WHERE url = '{url}'")
        assert due >= last + GONE_RECHECK and pages[url][2] == "gone"
    assert pages["http://s.sim.test/sitemap.xml"][0] == "sitemap"
    assert pages["http://s.sim.test/hidden"][1] is not None  # <lastmod> kept as a change signal
    assert pages["http://n.sim.test/sitemap.xml"][2] == "gone"


#: pages per host: the home page links /p0, /p3, /p6 and each /pN links /p(N+1), up to /p8
_TEMPLATE_PAGES = 9


def _template_app(request: Request) -> Reply:
    """Every host serves byte-identical pages with relative links only (no <base>)."""
    path = request.target.split("?")[0]
    if path == "/robots.txt":
        return Reply(status=404)
    if path == "/":
        links = ["/p0", "/p3", "/p6"]
    elif (m := re.fullmatch(r"/p(\d+)", path)) and int(m.group(1)) < _TEMPLATE_PAGES:
        n = int(m.group(1))
        links = [f"/p{n + 1}"] if n + 1 < _TEMPLATE_PAGES else []
    else:
        return Reply(status=404)
    body = "".join(f'<a href="{href}">{href}</a>' for href in links)
    html = f"<!DOCTYPE html><html><head><title>Template</title></head><body>{body}</body></html>"
    return Reply(headers=[("content-type", "text/html")], body=html.encode())


async def test_twenty_hosts_with_byte_identical_pages_are_each_crawled_whole(short_dir, daemons):
    hosts = [f"t{i}.sim.test" for i in range(20)]
    wanted = {(h, p) for h in hosts for p in ["/", *(f"/p{n}" for n in range(_TEMPLATE_PAGES))]}
    assert len(wanted) == 200
    async with raw_server(http_handler(_template_app)) as server:
        config = daemon_config(
            short_dir,
            port=server.port,
            seeds=[f"http://{h}/" for h in hosts],  # host roots only
            budget={"fetches_per_second": 60.0},
        )
        d = daemons(config)
        await d.ready()

        def missing() -> set[tuple[str, str]]:
            got = {(r.headers.get("host", "").split(":")[0], r.target) for r in server.requests}
            return wanted - got

        # 28-33 s alone on 2 cores; a loaded machine needs more than the default deadline
        await wait_for(
            lambda: not missing(), timeout=180.0, what="every page of every host fetched"
        )
        d.signal(signal.SIGTERM)
        assert await d.wait_exit() == 0
    db = short_dir / "refresher.duckdb"
    assert query_db(db, "SELECT count(*) FROM pages")[0][0] == 200
    # Only the last page of each host yields nothing (no links): those are true duplicates;
    # every other page names links on its own host.
    dups = query_db(db, "SELECT url FROM pages WHERE duplicate_of IS NOT NULL")
    assert len(dups) == 19 and {url.rsplit("/", 1)[1] for (url,) in dups} == {"p8"}


def _settings_app(request: Request) -> Reply:
    """x: its home page says X-Robots-Tag: nofollow; y: an image and more links than allowed."""
    host = request.headers.get("host", "").split(":")[0]
    path = request.target
    if path == "/robots.txt":
        return Reply(status=404)
    headers = [("content-type", "text/html")]
    if (host, path) == ("x.sim.test", "/"):
        headers.append(("X-Robots-Tag", "nofollow"))
        body = '<a href="/secret">s</a>'
    elif (host, path) == ("y.sim.test", "/"):
        body = '<img src="/pic.png"><a href="/a">a</a><a href="/b">b</a><a href="/c">c</a>'
    elif path == "/pic.png":
        return Reply(headers=[("content-type", "image/png")], body=b"\x89PNG")
    else:
        body = "leaf"
    return Reply(headers=headers, body=f"<html><body>{body}</body></html>".encode())


async def test_link_settings_and_the_x_robots_tag_reach_the_parser(short_dir, daemons):
    async with raw_server(http_handler(_settings_app)) as server:
        config = daemon_config(
            short_dir,
            port=server.port,
            seeds=["http://x.sim.test/", "http://y.sim.test/"],
            discovery={"include_media": True, "max_links_per_page": 3},
        )
        d = daemons(config)
        await d.ready()

        def fetched(host: str, path: str) -> int:
            return sum(
                1
                for r in server.requests
                if r.target == path and r.headers.get("host", "").startswith(host)
            )

        await wait_for(
            lambda: fetched("y.sim.test", "/pic.png") and fetched("x.sim.test", "/") >= 2,
            what="the image fetched and x's home page refreshed",
        )
        d.signal(signal.SIGTERM)
        assert await d.wait_exit() == 0
    urls = {u for (u,) in query_db(short_dir / "refresher.duckdb", "SELECT url FROM pages")}
    assert "http://x.sim.test/secret" not in urls  # the header's nofollow is honoured
    # include_media: the image is a page; max_links_per_page = 3: the img and two links of three
    assert {u for u in urls if u.startswith("http://y.sim.test/")} == {
        "http://y.sim.test/",
        "http://y.sim.test/pic.png",
        "http://y.sim.test/a",
        "http://y.sim.test/b",
    }
