from __future__ import annotations

import datetime
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from refresher._errors import ConfigError
from refresher.discover._filter import CUT_REASONS, FilterConfig, UrlFilter, _CappedCounts
from refresher.discover._url import canonicalize

TODAY = datetime.date(2026, 7, 1)


def make(**kwargs: Any) -> UrlFilter:
    kwargs.setdefault("seeds_hosts", ["example.org"])
    return UrlFilter(today=lambda: TODAY, **kwargs)


def why(f: UrlFilter, url: str, depth: int = 1) -> str | None:
    return f.check(canonicalize(url), depth=depth)


def test_links_on_the_seeds_hosts_are_accepted() -> None:
    f = make()
    assert why(f, "http://example.org/a") is None
    assert why(f, "https://example.org/b?x=1") is None
    assert f.statistics().cut == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://www.example.org/",
        "http://example.org:8080/",
        "http://other.example/",
        "http://example.org.evil.example/",
        "http://badexample.org/",
    ],
)
def test_by_default_only_the_seeds_exact_host_keys_are_in_scope(url: str) -> None:
    assert why(make(), url) == "out_of_scope"


def test_allowed_hosts_add_exact_host_keys_in_canonical_form() -> None:
    f = make(allowed_hosts=["Bücher.example", "other.example:8080", "third.example:443"])
    assert why(f, "http://xn--bcher-kva.example/") is None
    assert why(f, "http://other.example:8080/") is None
    assert why(f, "https://third.example/") is None
    assert why(f, "http://other.example/") == "out_of_scope"
    assert why(f, "http://www.xn--bcher-kva.example/") == "out_of_scope"


def test_allowed_domains_cover_the_domain_and_its_subdomains_only() -> None:
    f = make(seeds_hosts=[], allowed_domains=["example.org", "*.other.example"])
    for url in ["http://example.org/", "http://a.b.example.org:8080/", "https://x.other.example/"]:
        assert why(f, url) is None, url
    for url in ["http://badexample.org/", "http://example.org.evil/", "http://org/"]:
        assert why(f, url) == "out_of_scope", url


def test_seed_hosts_added_later_come_into_scope() -> None:
    f = make()
    assert why(f, "http://new.example/") == "out_of_scope"
    f.add_seed_hosts(["new.example"])
    assert why(f, "http://new.example/") is None


def test_a_scheme_left_out_of_the_list_is_cut() -> None:
    f = make(schemes=["https"])
    assert why(f, "http://example.org/") == "scheme"
    assert why(f, "https://example.org/") is None


def test_a_url_longer_than_the_limit_is_cut() -> None:
    f = make(max_url_length=40)
    assert why(f, "http://example.org/" + "a" * 21) is None
    assert why(f, "http://example.org/" + "a" * 22) == "too_long"


def test_exclude_patterns_cut_and_include_patterns_select() -> None:
    f = make(exclude=[r"\.pdf$", r"/private/"], include=[r"^https?://example\.org/(docs|blog)/"])
    assert why(f, "http://example.org/docs/a") is None
    assert why(f, "http://example.org/docs/a.pdf") == "excluded"
    assert why(f, "http://example.org/blog/private/x") == "excluded"
    assert why(f, "http://example.org/shop/") == "not_included"


def test_a_link_deeper_than_the_limit_is_cut() -> None:
    f = make(max_depth=3)
    assert why(f, "http://example.org/a", depth=3) is None
    assert why(f, "http://example.org/a", depth=4) == "too_deep"


def test_a_host_with_its_quota_of_pages_is_full() -> None:
    f = make(max_pages_per_host=3)
    for i in range(3):
        url = canonicalize(f"http://example.org/{i}")
        assert f.check(url, depth=1) is None
        f.accept(url)
    assert why(f, "http://example.org/next") == "host_full"
    assert f.statistics().full_hosts == 1
    assert f.statistics().hosts == 1


def test_links_screened_together_are_admitted_only_while_their_host_and_path_have_room() -> None:
    # discovery screens a batch of documents' links before it accepts any of them
    f = make(max_pages_per_host=3, max_query_variants_per_path=2)
    pages = [canonicalize(f"http://example.org/{i}") for i in range(3)]
    variants = [canonicalize(f"http://example.org/list?page={i}") for i in range(3)]
    assert all(f.check(u, depth=1) is None for u in pages + variants)
    assert [f.admit(u) for u in variants] == [True, True, False]
    assert [f.admit(u) for u in pages] == [True, False, False]
    cuts = f.statistics().cuts
    assert cuts["trap_query_space"] == 1 and cuts["host_full"] == 2


def test_page_counts_from_the_store_count_towards_the_quota() -> None:
    f = make(max_pages_per_host=10)
    f.set_pages({"example.org": 10})
    assert why(f, "http://example.org/x") == "host_full"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://example.org/a/b/a/b/", None),
        ("http://example.org/a/b/a/b/a/b/", "trap_repeated_segments"),
        ("http://example.org/x/x/x", "trap_repeated_segments"),
        ("http://example.org/a//b//c//d", None),
        ("http://example.org/?" + "&".join(f"p{i}=1" for i in range(10)), None),
        ("http://example.org/?" + "&".join(f"p{i}=1" for i in range(11)), "trap_query_space"),
    ],
)
def test_repeated_segments_and_long_queries_are_traps(url: str, reason: str | None) -> None:
    assert why(make(), url) == reason


def test_a_path_with_its_quota_of_query_strings_is_a_trap() -> None:
    f = make(max_query_variants_per_path=5)
    for i in range(5):
        url = canonicalize(f"http://example.org/search?q={i}")
        assert f.check(url, depth=1) is None
        f.accept(url)
    assert why(f, "http://example.org/search?q=new") == "trap_query_space"
    assert why(f, "http://example.org/search") is None
    assert why(f, "http://example.org/other?q=1") is None
    assert f.statistics().tracked_paths == 1


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://example.org/cal/2026/08/", None),
        ("http://example.org/cal/2028/06/", None),
        ("http://example.org/cal/2031/05/", "trap_calendar"),
        ("http://example.org/cal/2024/08/", None),
        ("http://example.org/cal/2019/05/", "trap_calendar"),
        ("http://example.org/cal/1999", "trap_calendar"),
        ("http://example.org/cal/2345/01/", "trap_calendar"),
        ("http://example.org/items/2345/", None),
        ("http://example.org/items/2345/12/", "trap_calendar"),
        ("http://example.org/thread/1234/5", None),
        ("http://example.org/cal/2031/5", "trap_calendar"),
        ("http://example.org/map?x=10&y=2500", None),
        ("http://example.org/events?year=2345", "trap_calendar"),
        ("http://example.org/2015/05/a-post-from-back-then", None),
        ("http://example.org/2015/05/17/a-post", None),
        ("http://example.org/2035/05/17/a-post", "trap_calendar"),
        ("http://example.org/news/2015-05-17-a-post", None),
        ("http://example.org/day/2015-05-17", "trap_calendar"),
        ("http://example.org/day/2026-07-05", None),
        ("http://example.org/events?date=1999-01-01", "trap_calendar"),
        ("http://example.org/events?date=2026-09-01", None),
        ("http://example.org/events?from=2032_01_01&x=1", "trap_calendar"),
        ("http://example.org/events?year=2031&month=5", "trap_calendar"),
        ("http://example.org/events?year=2026&month=5", None),
        ("http://example.org/2025/01/2026/02/2027/03/", "trap_calendar"),
        ("http://example.org/release/2019.05/notes", None),
        ("http://example.org/items/12345/", None),
        ("http://example.org/?ver=2019.05", None),
    ],
)
def test_dates_far_from_today_mark_a_calendar_trap(url: str, reason: str | None) -> None:
    assert why(make(), url) == reason


def test_the_calendar_check_can_be_turned_off() -> None:
    assert why(make(calendar_window_days=0), "http://example.org/cal/2031/05/") is None


def test_the_calendar_window_is_measured_from_today() -> None:
    day = [TODAY]
    f = UrlFilter(seeds_hosts=["example.org"], today=lambda: day[0])
    assert why(f, "http://example.org/cal/2029/01/") == "trap_calendar"
    day[0] = datetime.date(2028, 1, 1)
    assert why(f, "http://example.org/cal/2029/01/") is None


@pytest.mark.parametrize(
    ("href", "reason"),
    [
        ("mailto:a@example.org", "invalid_scheme"),
        ("javascript:void(0)", "invalid_scheme"),
        ("http://example.org/" + "a" * 10_000, "invalid_length"),
        ("http://example.org/a\x01b", "invalid_characters"),
        ("http://example.org/\ud800", "invalid_characters"),
        ("http://\ufdd0zyx.com/", "invalid_host"),
        ("http://-x.example/", "invalid_host"),
        ("http://", "invalid_host"),
        ("http://[::1/", "invalid_host"),
        ("http://example.org:99999/", "invalid_port"),
        ("http://u:p@example.org/", "invalid_credentials"),
    ],
)
def test_a_link_that_is_no_crawlable_url_is_counted_by_kind(href: str, reason: str) -> None:
    f = make()
    assert f.screen(href, base="http://example.org/page", depth=1) is None
    stats = f.statistics()
    assert stats.cuts == {reason: 1}
    assert stats.checked == 1
    assert reason in CUT_REASONS


def test_screen_resolves_links_strips_trackers_and_checks() -> None:
    f = make()
    url = f.screen("../b?utm_source=x&id=1#top", base="http://example.org/a/page", depth=1)
    assert url is not None
    assert url.url == "http://example.org/b?id=1"
    assert f.screen("http://elsewhere.example/", base=None, depth=1) is None
    assert f.statistics().cuts == {"out_of_scope": 1}


def test_tracking_parameters_can_be_kept() -> None:
    f = make(strip_tracking_params=False)
    assert f.strip_params is None
    url = f.screen("/b?utm_source=x", base="http://example.org/", depth=1)
    assert url is not None
    assert url.url == "http://example.org/b?utm_source=x"


def test_cuts_are_counted_per_reason_and_per_host() -> None:
    f = make(allowed_hosts=["trap.example"], max_depth=2)
    for _ in range(3):
        why(f, "http://trap.example/a/a/a")
    why(f, "http://trap.example/x", depth=5)
    why(f, "http://far.example/")
    stats = f.statistics()
    assert stats.cuts == {"trap_repeated_segments": 3, "too_deep": 1, "out_of_scope": 1}
    assert stats.cut == 5
    assert stats.checked == 5
    assert stats.cuts_by_host == {"trap.example": 4, "far.example": 1}
    assert stats.cut_reasons_by_host["trap.example"] == {
        "trap_repeated_segments": 3,
        "too_deep": 1,
    }
    assert next(iter(stats.cuts_by_host)) == "trap.example"


def test_the_per_host_cut_table_stays_bounded_and_keeps_the_big_hosts() -> None:
    f = make()
    heavy = canonicalize("http://heavy.example/")
    for i in range(6_000):  # more hosts than the table holds
        why(f, f"http://h{i}.example/")
        f.check(heavy, depth=1)
    stats = f.statistics()
    assert len(stats.cuts_by_host) == 20
    assert stats.cuts_by_host["heavy.example"] == 6_000
    assert stats.cuts == {"out_of_scope": 12_000}


def test_capped_counts_drop_the_rare_keys_when_full() -> None:
    counts: _CappedCounts[int] = _CappedCounts(10)
    for _ in range(5):
        counts.add(-1)
    for key in range(1000):
        counts.add(key)
        assert len(counts) <= 10
    assert counts.get(-1) == 5


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"include": ["(unclosed"]}, "discovery.include"),
        ({"exclude": ["*x"]}, "discovery.exclude"),
        ({"exclude": "x"}, "discovery.exclude"),
        ({"schemes": ("ftp",)}, "discovery.schemes"),
        ({"schemes": ()}, "discovery.schemes"),
        ({"allowed_hosts": ("example.org/path",)}, "discovery.allowed_hosts"),
        ({"allowed_hosts": ("ex ample.org",)}, "discovery.allowed_hosts"),
        ({"allowed_domains": ("example.org:8080",)}, "discovery.allowed_domains"),
        ({"max_url_length": 5000}, "discovery.max_url_length"),
        ({"max_depth": -1}, "discovery.max_depth"),
        ({"max_pages_per_host": 0}, "discovery.max_pages_per_host"),
        ({"max_repeated_segments": 0}, "discovery.max_repeated_segments"),
        ({"max_query_params": 2.5}, "discovery.max_query_params"),
        ({"calendar_window_days": True}, "discovery.calendar_window_days"),
    ],
)
def test_an_impossible_setting_names_its_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        FilterConfig(**kwargs)
    assert info.value.key == key
    assert str(info.value).startswith(key)


def test_the_filter_is_built_from_its_config() -> None:
    config = FilterConfig(max_depth=1, exclude=(r"/x",), strip_tracking_params=False)
    f = UrlFilter.from_config(config, seeds_hosts=["example.org"], today=lambda: TODAY)
    assert f.config == config
    assert why(f, "http://example.org/a", depth=2) == "too_deep"
    assert why(f, "http://example.org/x", depth=1) == "excluded"
    assert FilterConfig() == make().config


# A site made of traps: every page links on forever. A crawl of it must end by itself.


def trap_links(path_and_query: str) -> Iterator[str]:
    path, _, query = path_and_query.partition("?")
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["cal"] and len(parts) == 3:  # a calendar: previous and next month
        year, month = int(parts[1]), int(parts[2])
        for step in (-1, 1):
            y, m = divmod(year * 12 + month - 1 + step, 12)
            yield f"/cal/{y}/{m + 1:02d}/"
    elif parts[:1] == ["loop"]:  # relative links that nest for ever
        yield "a/"
        yield "b/"
        yield "../a/"
    elif parts[:1] == ["list"]:  # pager with sort orders and a fresh session id each time
        page = int(query.partition("page=")[2].partition("&")[0] or 0)
        for sort in ("new", "old", "name"):
            yield f"/list?page={page + 1}&sort={sort}&sessionid={page * 7919 % 10007}"
    elif parts[:1] == ["deep"]:  # ever longer paths, none repeating
        yield f"{len(parts)}-{'x' * 60}/"
    yield "javascript:void(0)"
    yield "mailto:someone@example.org"
    yield "http://elsewhere.example/"
    yield "/junk\x01"


def crawl(f: UrlFilter, seeds: list[str], links: Callable[[str], Iterator[str]]) -> list[str]:
    """Fetches pages breadth first as the daemon would; the URLs fetched, in order."""
    seen: set[str] = set()
    queue: deque[tuple[str, int]] = deque()
    for seed in seeds:
        start = canonicalize(seed)
        seen.add(start.url)
        f.accept(start)
        queue.append((start.url, 0))
    fetched: list[str] = []
    while queue:
        assert len(fetched) < 10_000, "the crawl did not end: a trap got through"
        page, depth = queue.popleft()
        fetched.append(page)
        for href in links(page.partition("example.org")[2]):
            url = f.screen(href, base=page, depth=depth + 1)
            if url is not None and url.url not in seen:
                seen.add(url.url)
                f.accept(url)
                queue.append((url.url, depth + 1))
    return fetched


SEEDS = [
    "http://example.org/cal/2026/07/",
    "http://example.org/loop/",
    "http://example.org/list?page=0",
    "http://example.org/deep/",
]


def test_an_endless_trap_site_is_crawled_to_a_bounded_end() -> None:
    f = make(max_depth=100_000)
    fetched = crawl(f, SEEDS, trap_links)
    stats = f.statistics()
    assert stats.accepted == len(fetched)
    # The months within 730 days of 1 July 2026, then a cut at each end.
    months = [u for u in fetched if "/cal/" in u]
    assert min(months) == "http://example.org/cal/2024/07/"
    assert max(months) == "http://example.org/cal/2028/06/"
    assert len(months) == 48
    assert stats.cuts["trap_calendar"] == 2
    # Paths with "a" and "b" at most twice each below /loop/.
    loops = [u for u in fetched if "/loop/" in u]
    assert len(loops) == 1 + 18
    assert stats.cuts["trap_repeated_segments"] > 0
    # The pager: its query strings (session ids stripped) stop at the per-path quota.
    assert len([u for u in fetched if "/list" in u]) == 100
    assert all("sessionid" not in u for u in fetched)
    assert stats.cuts["trap_query_space"] > 0
    # The ever longer path stops at the length limit.
    deep = [u for u in fetched if "/deep/" in u]
    assert len(deep[-1]) <= 2048 < len(deep[-1]) + 64
    assert stats.cuts["invalid_length"] + stats.cuts.get("too_long", 0) == 1
    # The junk every page carries is counted, never crawled.
    assert stats.cuts["invalid_scheme"] == 2 * len(fetched)
    assert stats.cuts["invalid_characters"] == len(fetched)
    assert stats.cuts["out_of_scope"] == len(fetched)
    assert stats.cuts_by_host["example.org"] > 0


def endless_trap_links() -> Iterator[str]:
    """Links as an endless trap site emits them, one kind after the other, none twice."""
    for n in itertools.count():
        y, m = divmod(2026 * 12 + 6 + n, 12)
        yield f"http://example.org/cal/{y}/{m + 1:02d}/"
        yield "http://example.org" + "/a/b" * (n + 1)
        yield f"http://example.org/list?page={n}&sort={('new', 'old')[n % 2]}&sessionid={n}"
        yield f"http://example.org/day?date={2026 + n // 12}-{n % 12 + 1:02d}-01"


def feed(f: UrlFilter, links: Iterator[str], n: int) -> int:
    seen: set[str] = set()
    for href in itertools.islice(links, n):
        url = f.screen(href, base=None, depth=1)
        if url is not None and url.url not in seen:
            seen.add(url.url)
            f.accept(url)
    return len(seen)


def test_an_endless_stream_of_trap_links_grows_the_cuts_not_the_pages() -> None:
    short, long = make(), make()
    accepted = feed(short, endless_trap_links(), 2_000)
    assert feed(long, endless_trap_links(), 20_000) == accepted
    assert accepted < 300
    assert long.statistics().accepted == short.statistics().accepted == accepted
    assert long.statistics().cut - short.statistics().cut == 18_000
    assert set(long.statistics().cuts) == {
        "trap_calendar",
        "trap_repeated_segments",
        "trap_query_space",
        "invalid_length",
    }


def test_the_depth_limit_alone_also_bounds_it() -> None:
    f = make(max_depth=5, calendar_window_days=0, max_query_variants_per_path=10**6)
    fetched = crawl(f, SEEDS, trap_links)
    assert len(fetched) < 100
    assert f.statistics().cuts["too_deep"] > 0
