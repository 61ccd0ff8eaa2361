"""End to end: a real `refresher run` process against a real site server on 127.0.0.1."""

from __future__ import annotations

import functools
import itertools
import json
import random
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import trio
from conftest import DaemonProcess, acli, cli, daemon_config, query_db, wait_for

from refresher.ops._control import request
from refresher.sim._site import HostSpec, PageSpec, Site, serve_site

pytestmark = pytest.mark.slow


async def test_the_daemon_is_polite_obeys_robots_and_uses_conditional_gets(
    site, short_dir, daemons
):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d: DaemonProcess = daemons(config)
    await d.ready()

    def every_allowed_page_fetched_three_times() -> bool:
        for url in s.urls():
            if "/private/" in url:
                continue
            host, _, path = url.removeprefix("http://").partition("/")
            pages = [r for r in s.requests.entries(host=host, path="/" + path)]
            if len(pages) < 3:
                return False
        return True

    await wait_for(every_allowed_page_fetched_three_times, what="three rounds of fetches")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0

    db = short_dir / "refresher.duckdb"
    for host in ("a.sim.test", "b.sim.test", "c.sim.test"):
        assert s.requests.overlapping(host) == [], f"two requests in flight to {host}"
        # The server stamps a response's end when its last send returns, which a busy
        # machine can delay past the moment the client had every byte: allow that jitter
        # at the server, and check the delay exactly on the daemon's own clock.
        gaps = s.requests.gaps(host)
        assert gaps and min(gaps) >= 0.1, f"{host}: gap {min(gaps)} at the server"
        times = query_db(
            db,
            "SELECT epoch(started_at), epoch(finished_at) FROM fetch_log "
            f"WHERE host = '{host}' AND status IS NOT NULL ORDER BY started_at",
        )
        daemon_gaps = [b[0] - a[1] for a, b in itertools.pairwise(times)]
        assert min(daemon_gaps) >= 0.2 - 1e-6, f"{host}: gap {min(daemon_gaps)} < min_delay"
    # robots.txt first, and the disallowed page never requested
    a = s.requests.by_start("a.sim.test")
    assert a[0].path == "/robots.txt"
    assert not [r for r in a if r.path.startswith("/private/")]
    assert {r.user_agent for r in a} == {"refresher-test/1.0 (+http://127.0.0.1/)"}
    # the honest hosts answered conditional GETs with 304 for pages that did not change
    conditional = [r for r in s.requests.entries(host="a.sim.test") if r.if_none_match]
    assert conditional and any(r.status == 304 for r in conditional)
    assert not [r for r in s.requests.entries(host="b.sim.test") if r.if_none_match]

    db = short_dir / "refresher.duckdb"
    rows = query_db(
        db,
        "SELECT count(*) FILTER (WHERE not_modified), "
        "count(*) FILTER (WHERE not_modified AND changed), "
        "count(*) FILTER (WHERE status = 304) FROM fetch_log",
    )
    not_modified, not_modified_and_changed, status_304 = rows[0]
    assert not_modified > 0 and not_modified == status_304
    assert not_modified_and_changed == 0
    denied = query_db(
        db,
        "SELECT count(*) FROM fetch_log WHERE url LIKE '%/private/%' "
        "AND error_kind = 'denied' AND status IS NULL",
    )
    assert denied[0][0] >= 1
    # the server's count of page responses equals the recorded fetches (nothing lost on SIGTERM)
    served = [r for r in s.requests if r.path != "/robots.txt" and r.complete]
    recorded = query_db(db, "SELECT count(*) FROM fetch_log WHERE status IS NOT NULL")[0][0]
    assert recorded == len(served)
    assert d.event("stopped") is not None


async def test_a_changed_page_is_a_change_and_an_unchanged_one_is_not(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: len(s.requests) > 60, what="60 requests")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    db = short_dir / "refresher.duckdb"
    # pages with change_rate 0 (p0, p2, p9) never count as changed
    never = query_db(
        db,
        "SELECT count(*) FROM fetch_log WHERE changed AND "
        "(url LIKE '%/p0' OR url LIKE '%/p2' OR url LIKE '%/p9')",
    )
    assert never[0][0] == 0
    # a "changed" fetch saw a body whose version differs from the previous fetch's
    versions: dict[str, list[int]] = {}
    for r in sorted(s.requests, key=lambda r: r.started):
        if r.status == 200 and r.version is not None:
            versions.setdefault(f"http://{r.host}{r.path}", []).append(r.version)
    expected = sum(1 for v in versions.values() for a, b in itertools.pairwise(v) if a != b)
    changed = query_db(db, "SELECT count(*) FROM fetch_log WHERE changed")[0][0]
    assert changed == expected


async def test_sigkill_loses_no_acknowledged_fetch_and_restart_resumes(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: d.acknowledged() >= 30, what="30 acknowledged fetches")
    acknowledged = d.acknowledged()
    d.signal(signal.SIGKILL)
    assert await d.wait_exit() == -signal.SIGKILL
    db = short_dir / "refresher.duckdb"
    recorded = query_db(db, "SELECT count(*) FROM fetch_log")[0][0]
    assert recorded >= acknowledged
    etags = query_db(db, "SELECT count(*) FROM pages WHERE etag IS NOT NULL")[0][0]
    assert etags > 0

    before = len(s.requests)
    again = daemons(config)
    await again.ready()
    # the restarted daemon uses the stored validators: its first request for a page with a
    # stored ETag is conditional
    await wait_for(
        lambda: any(r.if_none_match for r in list(s.requests)[before:]),
        what="a conditional GET after restart",
    )
    # and it does not fetch robots.txt again: the cached copy has not expired
    assert not [r for r in list(s.requests)[before:] if r.path == "/robots.txt"]
    again.signal(signal.SIGTERM)
    assert await again.wait_exit() == 0
    total = query_db(db, "SELECT count(*), count(DISTINCT started_at) FROM fetch_log")[0]
    assert total[0] > recorded


async def test_seed_and_status_reach_the_running_daemon_and_the_file_when_stopped(
    site, short_dir, daemons
):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls()[:2])
    d = daemons(config)
    await d.ready()
    # the CLI in a thread while the daemon runs: the site is served by this event loop
    result = await acli(
        "seed", "--config", str(config), "http://c.sim.test/p9", "ftp://nope/", "not a url"
    )
    assert result.returncode == 0, result.stderr
    assert "1 added" in result.stdout and "running daemon" in result.stdout
    assert "ftp://nope/" in result.stderr and "not a url" in result.stderr
    await wait_for(
        lambda: s.requests.entries(host="c.sim.test", path="/p9"), what="the seeded page fetched"
    )
    status = await acli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout)
    assert answer["running"] is True and answer["store"]["pages"] == 3
    assert answer["crawler"]["wire_rate"] > 0  # robots.txt and the pages went on the wire
    stages = answer["crawler"]["stage_seconds"]
    assert set(stages) == {"held", "wire", "parse", "record"}
    # a host is held through its fetch and its page's parse
    assert stages["held"] >= stages["wire"] + stages["parse"] > 0
    parse = answer["parse"]  # the parse stage's calls, as Parsers.statistics() counts them
    assert set(parse) == {"thread_calls", "process_calls", "loop_calls", "waiting", "processes"}
    # on a parse thread or in a process, or (split, on two CPUs or more) on the event loop
    assert parse["thread_calls"] + parse["process_calls"] + parse["loop_calls"] >= 3
    human = await acli("status", "--config", str(config))
    assert "running" in human.stdout and "pages" in human.stdout
    assert "requests/s on the wire" in human.stdout

    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    offline = cli("seed", "--config", str(config), "http://b.sim.test/p1")
    assert offline.returncode == 0 and "1 added" in offline.stdout
    status = json.loads(cli("status", "--config", str(config), "--json").stdout)
    assert status["running"] is False and status["pages"] == 4


async def test_hostile_pages_become_fetch_errors_with_a_kind(nursery, short_dir, daemons):
    from refresher.sim._site import HostSpec, PageSpec, Site, serve_site

    hostile = (
        "/hostile/stall",
        "/hostile/garbage",
        "/hostile/reset",
        "/hostile/endless",
        "/hostile/redirect-loop",
        "/hostile/huge?bytes=5000000",
    )
    s = Site(
        [HostSpec(name=f"x{i}.sim.test", pages=(PageSpec(path=p),)) for i, p in enumerate(hostile)]
    )
    port = await nursery.start(serve_site, s)
    urls = [f"http://x{i}.sim.test{p}" for i, p in enumerate(hostile)]
    config = daemon_config(
        short_dir, port=port, seeds=urls, fetch={"timeout": 1.0, "max_body_bytes": 1_000_000}
    )
    d = daemons(config)
    await d.ready()
    db = short_dir / "refresher.duckdb"

    # Every page is due every N/B = 0.15 s and each host backs off at most 2 s: three
    # acknowledged fetches per page mean every page has been tried.
    await wait_for(lambda: d.acknowledged() >= 3 * len(urls), what="fetches of each page")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    rows = dict(query_db(db, "SELECT DISTINCT url, error_kind FROM fetch_log"))
    assert len(rows) == len(urls), rows
    assert rows[urls[0]] == "timeout"
    assert rows[urls[1]] == "protocol"
    assert rows[urls[2]] in ("read", "connect", "protocol")
    assert rows[urls[3]] == "too_large"
    assert rows[urls[4]] == "redirects"
    assert rows[urls[5]] == "too_large"


async def test_sigterm_lets_in_flight_fetches_finish_and_records_them(nursery, short_dir, daemons):
    from refresher.sim._site import HostSpec, PageSpec, Site, serve_site

    s = Site(
        [
            HostSpec(name=f"slow{i}.sim.test", pages=(PageSpec(path="/"),), response_delay=1.0)
            for i in range(4)
        ]
    )
    port = await nursery.start(serve_site, s)
    config = daemon_config(short_dir, port=port, seeds=[u for u in s.urls()])
    d = daemons(config)
    await d.ready()
    # wait until page fetches (not robots.txt) are in flight, then stop
    await wait_for(
        lambda: (
            s.statistics().requests_in_flight >= 2
            and len(s.requests.entries(path="/robots.txt")) == 4
        ),
        what="page fetches in flight",
    )
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    served = [r for r in s.requests if r.path == "/" and r.complete]
    assert served, "nothing was in flight"
    recorded = query_db(
        short_dir / "refresher.duckdb", "SELECT count(*) FROM fetch_log WHERE status = 200"
    )[0][0]
    assert recorded == len(served)


async def test_a_fetch_cut_by_the_drain_deadline_keeps_its_host_waiting_its_delay_after_restart(
    nursery, short_dir, daemons
):
    """SIGTERM cancels what is still in flight at ``daemon.drain_timeout``: no fetch is
    recorded, but the host was contacted until then, and the next run (or a partition's next
    owner) knows its politeness only from the store."""
    delay = 10.0
    s = Site([HostSpec(name="slow.sim.test", pages=(PageSpec(path="/"),), response_delay=30.0)])
    port = await nursery.start(serve_site, s)
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        politeness={"min_delay": delay, "max_delay": 2 * delay},
        fetch={"timeout": 60.0},
        daemon={"drain_timeout": 0.1},
    )
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: s.statistics().requests_in_flight == 1, what="a request on the wire")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    cut = d.event(
        "drain deadline passed; unfinished fetches will be redone and queued findings "
        "handed to discovery at the next start"
    )
    assert cut is not None  # the request was cut, not finished
    cut_at = datetime.fromisoformat(cut["timestamp"]).timestamp()
    again = daemons(config)
    await again.ready()
    await wait_for(
        lambda: s.statistics().requests_in_flight + len(s.requests) >= 2,
        timeout=3 * delay,
        what="the host asked again",
    )
    asked = time.time()  # no later than the second request started (polled)
    assert asked - cut_at >= delay, "the host was asked again within its delay"
    again.signal(signal.SIGTERM)
    assert await again.wait_exit() == 0


async def test_sighup_reloads_the_config_and_a_bad_one_is_refused(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()

    def status() -> dict:
        return request(short_dir / "control.sock", {"op": "status"})

    assert status()["allocator"]["budget"] == 40.0

    text = config.read_text()
    config.write_text(text.replace("fetches_per_second = 40.0", "fetches_per_second = 7.5"))
    d.signal(signal.SIGHUP)
    await wait_for(lambda: d.event("configuration reloaded"), what="reload")
    assert status()["allocator"]["budget"] == 7.5

    config.write_text(text.replace("fetches_per_second = 40.0", "fetches_per_second = -1"))
    d.signal(signal.SIGHUP)
    failed = await wait_for(
        lambda: d.event("reload failed; keeping the running configuration"), what="refused reload"
    )
    assert "budget.fetches_per_second" in failed["error"]
    assert status()["allocator"]["budget"] == 7.5
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


def test_a_malformed_config_stops_the_daemon_with_the_key_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[politeness]\nmin_dely = 2\n")
    result = cli("run", "--config", str(bad))
    assert result.returncode == 2
    assert "politeness.min_dely" in result.stderr and "min_delay" in result.stderr
    bad.write_text('[crawl]\nworkers = "many"\n')
    result = cli("run", "--config", str(bad))
    assert result.returncode == 2 and "crawl.workers" in result.stderr
    result = cli("run", "--config", str(bad), "--set", "crawl.workers=4", "--set", "nonsense")
    assert result.returncode == 2 and "section.key=value" in result.stderr


async def test_metrics_are_scraped_from_a_running_daemon(site, short_dir, daemons):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls(), metrics={"port": 0})
    d = daemons(config)
    await d.ready()
    url = (await wait_for(lambda: d.event("metrics serving"), what="metrics"))["url"]
    assert url.startswith("http://127.0.0.1:")
    await wait_for(lambda: d.acknowledged() >= 10, what="some fetches")
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
    assert response.status_code == 200
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert samples["refresher_crawler_fetches_total"] >= 10
    assert samples["refresher_store_pages"] == len(s.urls())
    assert "refresher_frontier_in_memory" in samples
    # the parse stage: every fetched page went to a parse thread or process, or was parsed on
    # the event loop (split, on two CPUs or more)
    parsed = samples["refresher_parse_thread_calls_total"]
    parsed += samples["refresher_parse_loop_calls_total"]
    assert parsed + samples["refresher_parse_process_calls_total"] >= 1
    assert samples["refresher_parse_waiting"] >= 0 and "refresher_parse_processes" in samples
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


async def test_a_paused_host_is_left_alone_until_resumed(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: len(s.requests.entries(host="b.sim.test")) >= 3, what="b fetched")
    # In a thread: the site runs on this event loop and must answer while the CLI starts, or
    # requests sent before the pause would be logged after it.
    result = await acli("pause", "--config", str(config), "b.sim.test")
    assert result.returncode == 0 and "paused (running daemon)" in result.stdout
    # at most the one request in flight at the pause may still arrive
    paused_at = len(s.requests.entries(host="b.sim.test")) + 1
    await wait_for(
        lambda: (
            len(s.requests.entries(host="a.sim.test")) >= 15
            and len(s.requests.entries(host="c.sim.test")) >= 15
        ),
        what="others go on",
    )
    assert len(s.requests.entries(host="b.sim.test")) <= paused_at
    assert (await acli("pause", "--config", str(config), "nowhere.test")).returncode == 1
    result = await acli("resume", "--config", str(config), "b.sim.test")
    assert result.returncode == 0
    await wait_for(
        lambda: len(s.requests.entries(host="b.sim.test")) > paused_at + 2, what="b fetched again"
    )
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


# -- no discovered link lost: the findings owed in the store ------------------------------------

#: hosts × pages of the dense web; every page links to every page, and to OUTSIDE pages out of
#: scope, so that discovery (screening each link) falls behind the fetches
DENSE_HOSTS, DENSE_PAGES, OUTSIDE = 6, 10, 1500


def dense_urls() -> list[str]:
    return [f"http://d{h}.sim.test/p{k}" for h in range(DENSE_HOSTS) for k in range(DENSE_PAGES)]


def dense_site() -> Site:
    urls = dense_urls()
    far = tuple(f"http://o{i}.outside.test/x" for i in range(OUTSIDE))
    return Site(
        [
            HostSpec(
                name=f"d{h}.sim.test",
                pages=tuple(
                    PageSpec(path=f"/p{k}", links=(*urls, *far)) for k in range(DENSE_PAGES)
                ),
            )
            for h in range(DENSE_HOSTS)
        ]
    )


def dense_config(short_dir: Path, port: int) -> Path:
    return daemon_config(
        short_dir,
        port=port,
        seeds=["http://d0.sim.test/p0"],
        discovery={"sitemaps": False, "allowed_domains": ["sim.test"], "queue": 2},
    )


def unstored_links(db: Path) -> tuple[dict[str, set[str]], int]:
    """Per page of the dense web fetched with a body (status 200), its links missing from the
    pages and links tables, unless the store still owes its findings to discovery; and the
    number of owed rows."""
    pages = dict(query_db(db, "SELECT url, id FROM pages"))
    edges = set(query_db(db, "SELECT DISTINCT src, dst FROM links"))
    owed = {p for (p,) in query_db(db, "SELECT DISTINCT page_id FROM owed_documents")}
    fetched = {u for (u,) in query_db(db, "SELECT DISTINCT url FROM fetch_log WHERE status = 200")}
    missing: dict[str, set[str]] = {}
    for url in fetched:
        if pages[url] in owed:
            continue
        src = pages[url]
        lost = {
            link
            for link in dense_urls()
            if link != url and (link not in pages or (src, pages[link]) not in edges)
        }
        if lost:
            missing[url] = lost
    (count,) = query_db(db, "SELECT count(*) FROM owed_documents")[0]
    return missing, int(count)


async def next_run_stores_what_was_owed(
    db: Path, config: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    """A run after one that left findings owed hands them to its discovery at once, and its
    stop stores what is queued: what is still owed after it was found by its own fetches."""
    (owed,) = query_db(db, "SELECT count(*) FROM owed_documents")[0]
    started = time.time()
    d = daemons(config)
    await d.ready()
    if owed:
        await wait_for(lambda: d.event("findings handed to discovery again"), what="the replay")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    missing, _ = unstored_links(db)
    assert not missing
    assert query_db(db, f"SELECT count(*) FROM owed_documents WHERE fetched_at < {started}") == [
        (0,)
    ]


async def test_kill_9_at_random_points_loses_no_link_of_an_acknowledged_fetch(
    nursery, short_dir, daemons
):
    """Every link of every acknowledged fetch reaches the pages and links tables: kill -9 lands
    between a fetch's commit and its links' storing (discovery behind, its queue full), the
    findings wait in owed_documents and the next run stores them."""
    s = dense_site()
    port = await nursery.start(serve_site, s)
    config = dense_config(short_dir, port)
    db = short_dir / "refresher.duckdb"
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    landed = 0
    for _ in range(3):
        d = daemons(config)
        await d.ready()
        point = rng.randint(3, 30)
        await wait_for(
            functools.partial(lambda d, n: d.acknowledged() >= n, d, point),
            what=f"{point} acknowledged (seed {seed})",
        )
        d.signal(signal.SIGKILL)
        assert await d.wait_exit() == -signal.SIGKILL
        missing, owed = unstored_links(db)
        assert not missing, f"seed {seed}"
        landed += owed > 0
    assert landed, f"no kill landed before discovery stored a fetch's links (seed {seed})"
    await next_run_stores_what_was_owed(db, config, daemons)


async def test_sigterm_with_discoverys_queue_full_loses_no_link(nursery, short_dir, daemons):
    """Documents that found the queue full wait in the store (deferred); a stop stores what is
    queued, and the next run what is still owed."""
    s = dense_site()
    port = await nursery.start(serve_site, s)
    config = dense_config(short_dir, port)
    d = daemons(config)
    await d.ready()

    async def waiting() -> bool:
        # the control socket, as `refresher status` asks it, without a process per poll
        sock = short_dir / "control.sock"
        answer = await trio.to_thread.run_sync(request, sock, {"op": "status"})
        found = answer["discovery"]
        return found["deferred"] + found["waited"] > 0

    await wait_for(waiting, what="discovery's queue full")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    db = short_dir / "refresher.duckdb"
    missing, _ = unstored_links(db)
    assert not missing
    assert query_db(db, "SELECT count(*) FROM fetch_log")[0][0] >= d.acknowledged() > 0
    await next_run_stores_what_was_owed(db, config, daemons)


async def test_a_slow_host_gets_its_planned_rate_on_the_wire(nursery, short_dir, daemons):
    # Every response of this host takes 40 ms, so each fetch ends 40 ms after its page was
    # due. Uniform plans each of the two pages at B/2 = 5 fetches/s (every 0.2 s); its host
    # could take 16/s. A page due one interval after its last fetch would run at 1/0.24 s:
    # 83 % of its plan; due one interval after it *was* due (the lateness made up), the pages
    # keep their plan. Counted at the server over a window of the run, with room for a busy
    # machine's jitter.
    from refresher.sim._site import HostSpec, PageSpec, Site, serve_site

    budget, host = 10.0, "slow.sim.test"
    spec = HostSpec(
        name=host, pages=(PageSpec(path="/a"), PageSpec(path="/b")), response_delay=0.04
    )
    s = Site([spec])
    port = await nursery.start(serve_site, s)
    config = daemon_config(
        short_dir,
        port=port,
        seeds=[f"http://{host}/a", f"http://{host}/b"],
        budget={"fetches_per_second": budget},
        politeness={"min_delay": 0.02},
    )
    d = daemons(config)
    await d.ready()

    def fetched() -> list[float]:
        return [r.started for r in s.requests.by_start(host) if r.path != "/robots.txt"]

    await wait_for(lambda: len(fetched()) >= 200, what="200 fetches")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    window = fetched()[20:200]  # from the 10th round on: the plan in force
    rate = (len(window) - 1) / (window[-1] - window[0])
    assert 0.93 * budget <= rate <= 1.07 * budget, f"{rate:.2f} fetches/s, planned {budget:g}"


async def test_findings_owed_to_discovery_wait_while_it_is_off_and_are_stored_once_it_is_on(
    site, short_dir, daemons
):
    from conftest import fetch_record

    from refresher.store import DuckDBStore, Findings, NewPage

    s, port = site
    db = short_dir / "refresher.duckdb"
    # An earlier run acknowledged a fetch and stopped before its discovery stored the links.
    store = DuckDBStore(db)
    [page] = store.add_pages(
        [NewPage(url="http://a.sim.test/p0", host="a.sim.test", scheme="http")], now=time.time()
    )
    found = "http://a.sim.test/found-before"
    findings = Findings(depth=0, url=page.url, links=((found, "a"),))
    fetched_at = time.time()
    store.write([fetch_record(page.id, page.host_id, fetched_at, findings=findings)], [])
    store.close()

    off = daemon_config(short_dir, port=port, seeds=s.urls(), discovery={"enabled": False})
    d = daemons(off)
    await d.ready()
    assert (await wait_for(lambda: d.event("findings owed to discovery kept while it is off")))[
        "documents"
    ] == 1
    running = json.loads((await acli("status", "--config", str(off), "--json")).stdout)
    assert running["owed_documents"] == 1
    await wait_for(lambda: d.acknowledged() >= 10, what="fetches with discovery off")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    # kept as it was, and not grown by the fetches of a run without discovery
    assert query_db(db, "SELECT count(*) FROM owed_documents") == [(1,)]
    assert query_db(db, f"SELECT count(*) FROM pages WHERE url = '{found}'") == [(0,)]
    stopped = json.loads(cli("status", "--config", str(off), "--json").stdout)
    assert stopped["owed_documents"] == 1

    on = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(on)
    await d.ready()
    await wait_for(lambda: d.event("findings handed to discovery again"), what="the hand-over")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    assert query_db(db, f"SELECT count(*) FROM pages WHERE url = '{found}'") == [(1,)]
    assert query_db(db, f"SELECT count(*) FROM owed_documents WHERE fetched_at = {fetched_at}") == [
        (0,)
    ]


async def test_a_non_uniform_plan_keeps_the_budget_on_the_wire(nursery, short_dir, daemons):
    # 6 hosts × 6 pages: one page per host changes every few seconds, the rest never, so
    # optimal's plan is far from uniform and, right after the first round, few pages are due
    budget = 6.0
    s = Site(
        [
            HostSpec(
                name=f"w{h}.sim.test",
                pages=tuple(
                    PageSpec(path=f"/p{k}", change_rate=0.3 if k == 0 else 0.0) for k in range(6)
                ),
            )
            for h in range(6)
        ]
    )
    port = await nursery.start(serve_site, s)
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        budget={"fetches_per_second": budget},
        policy={"name": "optimal", "resolve_interval": 1.0},
        discovery={"enabled": False},
    )
    d = daemons(config)
    await d.ready()

    # In a thread: the site is served by this event loop, which a blocking call would stop
    # (a `cli` for a second or more under load), so that each request then waited on the
    # site and politeness, not the budget, capped the wire rate. The waits ask the control
    # socket (what `refresher status --json` prints): a `refresher status` process per poll
    # took ~30 s of CPU over the wait, from the tests running beside this one.
    async def status() -> dict:
        return await trio.to_thread.run_sync(request, short_dir / "control.sock", {"op": "status"})

    def past(a: dict, uptime: float, dispatched: int = 0) -> bool:
        f = a["frontier"]
        return a["uptime"] > uptime and f["dispatched"] >= dispatched and f["early"] > 0

    async def after(uptime: float, dispatched: int = 0) -> dict | None:
        a = await status()
        return a if past(a, uptime, dispatched) else None

    # past the first round (36 pages and the 6 hosts' robots.txt), pages fetched early
    first = await wait_for(lambda: after(0, 36 + 6), timeout=120, what="the first round")
    # then a full wire window (30 s), read as the operator does
    await wait_for(lambda: after(first["uptime"] + 30), timeout=120, what="30 s more")
    result = await acli("status", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert past(answer, first["uptime"] + 30), answer
    # the pacer's credit carries a late wake-up's tokens: under load as idle, none lapsed
    # for want of a page a host may take
    assert answer["frontier"]["lapsed"] == first["frontier"]["lapsed"], (first, answer)
    assert answer["crawler"]["wire_rate"] >= 0.95 * budget, answer["crawler"]
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


def test_the_daemon_collects_garbage_cycles_less_often_than_cpython_by_default():
    import gc

    from refresher._errors import ConfigError
    from refresher.ops._daemon import GC_THRESHOLDS, run_daemon

    def broken() -> object:
        raise ConfigError("no config here", key="store.path")

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert run_daemon(broken) == 1  # the one-line error; the process was set up first
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > 700 and GC_THRESHOLDS[2] > 10
    finally:
        gc.set_threshold(*before)


_PARSE_FAULTS = """
import resource, sys, threading
from selectolax.lexbor import LexborHTMLParser
if sys.argv[1] == "tuned":
    from refresher.ops._daemon import tune_malloc
    assert tune_malloc()
row = '<tr><td><a href="/p{0}.html" class="reference">page {0}</a></td><td>text {0}</td></tr>'
page = ("<html><body><table>" + "".join(row.format(i) for i in range(1500))).encode()
faults = []
def parse():
    LexborHTMLParser(page)  # the thread's heap grows to a tree's size once
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(40):
        LexborHTMLParser(page).css("a")
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=parse)
thread.start()
thread.join()
print(faults[0])
"""


@pytest.mark.skipif(
    __import__("platform").libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's"
)
def test_tuned_malloc_keeps_a_parse_threads_memory_instead_of_faulting_it_in_per_page():
    import subprocess
    import sys

    def faults(mode: str) -> int:
        run = [sys.executable, "-c", _PARSE_FAULTS, mode]
        return int(subprocess.run(run, check=True, capture_output=True, text=True).stdout)

    untuned, tuned = faults("default"), faults("tuned")
    # glibc gave each tree's memory back and faulted it in again for the next (hundreds of
    # faults per 40 parses); kept, only what the trees do not reuse is faulted in
    assert tuned * 2 < untuned, (tuned, untuned)


def test_the_daemon_tunes_malloc_before_it_starts(monkeypatch: pytest.MonkeyPatch):
    from refresher._errors import ConfigError
    from refresher.ops import _daemon

    calls: list[bool] = []
    monkeypatch.setattr(_daemon, "tune_malloc", lambda: calls.append(True) or True)
    monkeypatch.setattr(_daemon, "tune_gc", lambda: None)

    def broken() -> object:
        raise ConfigError("no config here", key="store.path")

    assert _daemon.run_daemon(broken) == 1  # type: ignore[arg-type]
    assert calls == [True]


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


async def test_the_status_is_strict_json_when_re_plans_go_by_the_clock_alone(
    site, short_dir, daemons
):
    # replan_share = 0: no count of fetches calls for a re-plan (replan_fetches is ∞ inside)
    s, port = site
    policy = {"replan_share": 0.0}
    config = daemon_config(short_dir, port=port, seeds=s.urls()[:2], policy=policy)
    d = daemons(config)
    await d.ready()
    status = await acli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout, parse_constant=_refuse_constant)
    assert answer["allocator"]["replan_fetches"] is None
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


def test_a_status_section_has_null_for_every_number_that_is_not_finite_at_any_depth() -> None:
    import dataclasses
    import math

    from refresher.ops._daemon import _plain

    @dataclasses.dataclass(frozen=True)
    class Nested:
        by_key: dict[str, float]
        per_queue: tuple[float, ...]
        level: float
        count: int

    got = _plain(Nested({"a": math.inf, "b": 1.5}, (math.nan, 2.0), -math.inf, 3))
    assert got == {
        "by_key": {"a": None, "b": 1.5},
        "per_queue": [None, 2.0],
        "level": None,
        "count": 3,
    }
    json.dumps(got, allow_nan=False)  # strict JSON
