"""A seeded web's first pass, counted at the server: each host's pages are all fetched once
before any of them again, and no page is fetched twice within half its planned interval,
however often the allocation is solved meanwhile."""

from __future__ import annotations

import collections
import itertools
import signal
from pathlib import Path

import pytest
from conftest import daemon_config, query_db, wait_for

from refresher.sim._site import HostSpec, PageSpec, RequestRecord, Site, serve_site

pytestmark = pytest.mark.slow


def unequal_web(sizes: list[int]) -> Site:
    """Hosts of ``sizes`` pages (and a front page every page links to, the heaviest by
    PageRank); each page links the next two, one of them by a relative link."""
    hosts = []
    for h, n in enumerate(sizes):
        pages = tuple(
            PageSpec(
                path=f"/d/p{i}.html",
                links=(f"/d/p{(i + 1) % n}.html", f"p{(i + 2) % n}.html", "/"),
                size=3000,
            )
            for i in range(n)
        )
        hosts.append(HostSpec(name=f"h{h}.sim.test", pages=(PageSpec(path="/"), *pages)))
    return Site(hosts, seed=3)


def page_requests(site: Site) -> dict[tuple[str, str], list[float]]:
    """Per (host, target), the start times of its requests (robots.txt left out)."""
    out: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    records: list[RequestRecord] = sorted(site.requests, key=lambda r: r.started)
    for r in records:
        if r.path != "/robots.txt":
            out[(r.host, r.target)].append(r.started)
    return out


def every_page_requested(site: Site) -> bool:
    wanted = {(u.split("/")[2], "/" + u.split("/", 3)[3]) for u in site.urls()}
    return wanted <= {(r.host, r.path) for r in site.requests if r.status == 200}


async def crawl(
    site: Site, directory: Path, daemons, nursery, *, passes: int = 1, **sections
) -> None:
    """A daemon seeded with every page of ``site`` until each page was requested once and the
    requests add up to ``passes`` times the pages."""
    port = await nursery.start(serve_site, site)
    sections.setdefault("politeness", {"min_delay": 0.001, "response_time_factor": 0.0})
    config = daemon_config(
        directory,
        port=port,
        seeds=site.urls(),
        store={"flush_interval": 0.5, "batch_size": 5000},
        crawl={"workers": 32},
        **sections,
    )
    d = daemons(config)
    await d.ready()
    pages = len(site.urls())

    def done() -> bool:
        return every_page_requested(site) and len(site.requests) >= passes * pages

    await wait_for(done, what=f"{passes} passes", timeout=120)
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


async def test_a_host_is_fetched_through_once_before_any_of_its_pages_again(
    short_dir, daemons, nursery
):
    # As bench_vs_scrapy --complete: every page a seed, a budget far above what the hosts
    # serve (so a page is due again 636 / 5000 s after its fetch). A host done with its pass
    # refreshes its pages while the larger ones finish theirs, but none of its own pages
    # comes twice before each came once.
    site = unequal_web([10, 40, 160, 320])
    await crawl(
        site,
        short_dir,
        daemons,
        nursery,
        budget={"fetches_per_second": 5000.0},
        # no re-plan: a re-solve may let a due re-fetch in among a host's new pages (README)
        policy={"name": "uniform", "resolve_interval": 3600.0, "replan_share": 0.0},
    )
    requests = page_requests(site)
    refreshed = 0
    for host in {h for h, _ in requests}:
        mine = [times for (h, _), times in requests.items() if h == host]
        pass_end = max(times[0] for times in mine)
        again = [times[1] for times in mine if len(times) > 1]
        assert min(again, default=pass_end) >= pass_end, host
        refreshed += len(again)
    assert refreshed > 0  # the smaller hosts did refresh meanwhile


async def test_no_page_is_fetched_again_within_half_its_interval_while_the_plan_is_resolved(
    short_dir, daemons, nursery
):
    # A re-solve reloads the frontier from the store: the rows of pages fetched in the last
    # moments must already say so (a read commits the fetches queued before it), or they
    # would be due again at once.
    site = unequal_web([40, 40, 40])
    await crawl(
        site,
        short_dir,
        daemons,
        nursery,
        passes=2,
        budget={"fetches_per_second": 40.0},
        policy={"name": "uniform", "resolve_interval": 0.2},
    )
    [(interval,)] = query_db(
        short_dir / "refresher.duckdb", "SELECT min(1.0 / target_rate) FROM pages"
    )
    assert interval > 2.0
    for key, times in page_requests(site).items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps, default=interval) >= 0.5 * interval, key
