"""robots.txt parsing and matching: Google's RFC 9309 cases, status codes, limits, garbage."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from refresher.crawl._robots import (
    MAX_ROBOTS_BYTES,
    RobotsRule,
    RobotsRules,
    _directives,
    _escape_pattern,
    _path_params_query,
    is_valid_product_token,
    product_token,
    rules_for_response,
)

CASES: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "robots_google_cases.json").read_text(encoding="utf-8")
)
AGENT = "refresher/0.1 (+https://example.org/bot)"


def _body(case: dict[str, Any]) -> bytes:
    prefix = bytes.fromhex(case.get("robots_prefix_hex", ""))
    return prefix + str(case["robots"]).encode("utf-8")


def _match_params() -> list[Any]:
    params = []
    for group in CASES["match"]:
        for n, check in enumerate(group["checks"]):
            label = f"{group['id']}-{check['user_agent'] or 'empty'}-{n}"
            params.append(pytest.param(_body(group), check, id=label))
    return params


@pytest.mark.parametrize(("body", "check"), _match_params())
def test_google_match_case_gives_the_expected_answer(body: bytes, check: dict[str, Any]) -> None:
    rules = RobotsRules.parse(body, check["user_agent"])
    if "ours" in check:
        # A deliberate deviation: the data says why; make sure it still is one.
        assert check["why"]
        assert check["ours"] != check["allowed"]
        assert rules.allowed(check["url"]) is check["ours"]
    else:
        assert rules.allowed(check["url"]) is check["allowed"]


def test_exactly_the_documented_google_deviations_are_marked() -> None:
    marked = [
        (group["id"], check["url"])
        for group in CASES["match"]
        for check in group["checks"]
        if "ours" in check
    ]
    assert sorted(marked) == [
        ("GoogleOnly_AcceptUserAgentUpToFirstSpace", "http://foo.bar/x/y"),
        ("GoogleOnly_IndexHTMLisDirectory", "http://foo.com/allowed-slash/"),
        ("ID_Encoding", "http://foo.bar/foo/bar/ツ"),
        ("ID_Encoding", "http://foo.bar/foo/bar/ツ"),
    ]


@pytest.mark.parametrize(
    "case", CASES["directives"], ids=[f"{c['id']}-{i}" for i, c in enumerate(CASES["directives"])]
)
def test_google_directive_case_finds_the_expected_lines(case: dict[str, Any]) -> None:
    found = list(_directives(_body(case)))
    kinds = [kind for _, kind, _ in found]
    assert len(kinds) - kinds.count("unknown") == case["valid_directives"]
    if "unknown_directives" in case:
        assert kinds.count("unknown") == case["unknown_directives"]
    if "last_line" in case:
        assert found[-1][0] == case["last_line"]


@pytest.mark.parametrize("case", CASES["sitemaps"])
def test_google_sitemap_case_finds_the_sitemap(case: dict[str, Any]) -> None:
    assert RobotsRules.parse(_body(case), "foo").sitemaps == tuple(case["sitemaps"])


@pytest.mark.parametrize("case", CASES["tokens"], ids=[repr(c["token"]) for c in CASES["tokens"]])
def test_google_token_case_is_judged_valid_or_not(case: dict[str, Any]) -> None:
    assert is_valid_product_token(case["token"]) is case["valid"]


@pytest.mark.parametrize("case", CASES["paths"], ids=[repr(c["url"]) for c in CASES["paths"]])
def test_google_path_case_extracts_path_params_and_query(case: dict[str, Any]) -> None:
    assert _path_params_query(case["url"]) == case["path"]


@pytest.mark.parametrize("case", CASES["escapes"], ids=[c["pattern"] for c in CASES["escapes"]])
def test_google_escape_case_normalises_the_pattern(case: dict[str, Any]) -> None:
    assert _escape_pattern(case["pattern"].encode("utf-8")) == case["escaped"]


def test_google_line_too_long_cuts_long_lines() -> None:
    # Rebuilt from GoogleOnly_LineTooLong: lines are cut at 2083 * 8 - 1 bytes.
    max_line = 2083 * 8
    longline = "/x/" + "a" * (max_line - len("/x/") - len("disallow: ") + 1 - len("/x/"))
    body = f"user-agent: FooBot\ndisallow: {longline}/qux\n".encode()
    rules = RobotsRules.parse(body, "FooBot")
    assert rules.allowed("http://foo.bar/fux")
    assert not rules.allowed(f"http://foo.bar{longline}/fux")

    size = max_line - len("/x/") - len("allow: ") + 1
    line_a = "/x/" + "a" * (size - len("/x/"))
    line_b = "/x/" + "b" * (size - len("/x/"))
    body = f"user-agent: FooBot\ndisallow: /\nallow: {line_a}/qux\nallow: {line_b}/qux\n".encode()
    rules = RobotsRules.parse(body, "FooBot")
    assert not rules.allowed("http://foo.bar/")
    assert rules.allowed(f"http://foo.bar{line_a}/qux")
    assert rules.allowed(f"http://foo.bar{line_b}/fux")


# --- status codes (RFC 9309 §2.3.1) ---------------------------------------------------------

BLOCK_ALL = b"User-agent: *\nDisallow: /\n"


@pytest.mark.parametrize("status", [200, 203, 299])
def test_a_2xx_body_is_parsed(status: int) -> None:
    rules = rules_for_response(status, BLOCK_ALL, AGENT)
    assert not rules.allowed("https://example.org/page")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451, 499])
def test_a_4xx_means_everything_is_allowed(status: int) -> None:
    rules = rules_for_response(status, BLOCK_ALL, AGENT)
    assert rules == RobotsRules.allow_all()
    assert rules.allowed("https://example.org/page")


@pytest.mark.parametrize("status", [None, 429, 500, 503, 599, 301, 304, 100, 600])
def test_an_error_or_no_answer_means_everything_is_disallowed(status: int | None) -> None:
    rules = rules_for_response(status, b"", AGENT)
    assert rules == RobotsRules.disallow_all()
    assert not rules.allowed("https://example.org/")
    assert not rules.allowed("/any/path?q=1")


def test_robots_txt_itself_is_always_allowed() -> None:
    rules = RobotsRules.disallow_all()
    assert rules.allowed("https://example.org/robots.txt")
    assert rules.allowed("/robots.txt")
    assert not rules.allowed("/robots.txt.bak")


def test_allowed_accepts_a_path_with_a_query() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /*?session=\n", AGENT)
    assert not rules.allowed("/list?session=42")
    assert rules.allowed("/list?page=2")


# --- 500 KiB limit ---------------------------------------------------------------------------


def _padded(before_limit: bytes, after: bytes) -> bytes:
    head = b"User-agent: *\n" + before_limit
    padding = b"# " + b"x" * (MAX_ROBOTS_BYTES - len(head) - 3) + b"\n"
    body = head + padding + after
    assert len(head + padding) == MAX_ROBOTS_BYTES
    return body


def test_a_rule_before_the_limit_applies() -> None:
    rules = RobotsRules.parse(_padded(b"Disallow: /early\n", b""), AGENT)
    assert not rules.allowed("/early")


def test_a_rule_after_the_limit_is_ignored() -> None:
    rules = RobotsRules.parse(_padded(b"Disallow: /early\n", b"Disallow: /late\n"), AGENT)
    assert not rules.allowed("/early")
    assert rules.allowed("/late")


def test_a_rule_cut_by_the_limit_is_ignored_rather_than_shortened() -> None:
    # The limit falls inside "Allow: /public"; read as "Allow: /" it would open everything.
    head = b"User-agent: *\nDisallow: /\n"
    padding = b"#" * (MAX_ROBOTS_BYTES - len(head) - len(b"Allow: /") - 1) + b"\n"
    body = head + padding + b"Allow: /public\n"
    assert body[:MAX_ROBOTS_BYTES].endswith(b"Allow: /")
    rules = RobotsRules.parse(body, AGENT)
    assert not rules.allowed("/other")
    assert not rules.allowed("/public")


# --- Crawl-delay -----------------------------------------------------------------------------


def test_crawl_delay_comes_from_our_group() -> None:
    body = b"User-agent: *\nCrawl-delay: 9\n\nUser-agent: refresher\nCrawl-delay: 2.5\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay == 2.5


def test_crawl_delay_falls_back_to_the_star_group_when_no_group_names_us() -> None:
    body = b"User-agent: otherbot\nCrawl-delay: 1\n\nUser-agent: *\nCrawl-delay: 7\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay == 7.0


def test_our_group_without_crawl_delay_does_not_inherit_the_star_one() -> None:
    body = b"User-agent: *\nCrawl-delay: 9\nDisallow: /x\n\nUser-agent: refresher\nAllow: /\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay is None


def test_merged_groups_keep_the_largest_crawl_delay() -> None:
    body = b"User-agent: refresher\nCrawl-delay: 3\n\nUser-agent: refresher\nCrawl-delay: 1\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay == 3.0


def test_a_crawl_delay_line_ends_the_user_agent_list_of_its_group() -> None:
    body = b"User-agent: otherbot\nCrawl-delay: 4\nUser-agent: refresher\nDisallow: /x\n"
    rules = RobotsRules.parse(body, AGENT)
    assert rules.crawl_delay is None
    assert not rules.allowed("/x")


def test_an_unknown_line_does_not_end_the_user_agent_list() -> None:
    body = b"User-agent: otherbot\nRequest-rate: 1/5\nUser-agent: refresher\nCrawl-delay: 4\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay == 4.0


@pytest.mark.parametrize(
    "value", [b"abc", b"-1", b"nan", b"inf", b"1e3", b"5s", b"", b"1,5", b"9" * 400]
)
def test_an_invalid_crawl_delay_is_ignored(value: bytes) -> None:
    body = b"User-agent: *\nCrawl-delay: 2\nCrawl-delay: " + value + b"\n"
    assert RobotsRules.parse(body, AGENT).crawl_delay == 2.0


def test_crawl_delay_outside_any_group_is_ignored() -> None:
    assert RobotsRules.parse(b"Crawl-delay: 5\nUser-agent: *\n", AGENT).crawl_delay is None


# --- Sitemap ---------------------------------------------------------------------------------


def test_sitemaps_are_kept_in_order_without_repeats_or_relative_urls() -> None:
    body = (
        b"Sitemap: https://example.org/b.xml\n"
        b"User-agent: otherbot\nDisallow: /\n"
        b"site-map: http://example.org/a.xml  # typo accepted\n"
        b"Sitemap: /relative.xml\n"
        b"Sitemap: ftp://example.org/c.xml\n"
        b"Sitemap: https://example.org/b.xml\n"
        b"Sitemap: http://[::1\n"
    )
    assert RobotsRules.parse(body, AGENT).sitemaps == (
        "https://example.org/b.xml",
        "http://example.org/a.xml",
    )


# --- matching details ------------------------------------------------------------------------


def test_a_group_for_a_prefix_of_our_token_does_not_apply_to_us() -> None:
    # "User-agent: refresh" names another crawler, not "refresher".
    body = b"User-agent: refresh\nDisallow: /\n"
    assert RobotsRules.parse(body, AGENT).allowed("/page")


def test_our_group_matches_case_insensitively_and_ignores_a_version() -> None:
    body = b"User-agent: *\nDisallow: /\n\nUser-agent: ReFresher/2.0\nDisallow: /private\n"
    rules = RobotsRules.parse(body, AGENT)
    assert rules.allowed("/page")
    assert not rules.allowed("/private/x")


def test_a_user_agent_line_with_no_token_names_nobody() -> None:
    body = b"User-agent: 123\nDisallow: /\n"
    assert RobotsRules.parse(body, "").allowed("/page")
    assert RobotsRules.parse(body, AGENT).allowed("/page")


def test_percent_escapes_compare_case_insensitively_but_are_not_decoded() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /a%2fb\n", AGENT)
    assert not rules.allowed("/a%2Fb")
    assert not rules.allowed("/a%2fb")
    assert rules.allowed("/a/b")


def test_a_non_ascii_disallow_stops_the_raw_and_the_encoded_url() -> None:
    rules = RobotsRules.parse("User-agent: *\nDisallow: /ツ\n".encode(), AGENT)
    assert not rules.allowed("https://example.org/ツ")
    assert not rules.allowed("https://example.org/%E3%83%84")
    assert rules.allowed("https://example.org/x")


def test_a_space_in_a_pattern_matches_its_encoded_form() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /a b\n", AGENT)
    assert not rules.allowed("/a%20b")


def test_a_dollar_inside_a_pattern_is_literal() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /a$b\n", AGENT)
    assert not rules.allowed("/a$bc")
    assert rules.allowed("/a")


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/a*b*c$", "/a-b-c", True),
        ("/a*b*c$", "/abcbc", True),
        ("/a*b*c$", "/a-b-c-", False),
        ("/a*c$", "/ac", True),
        ("/a**c", "/a/x/c/y", True),
        ("/*$", "/", True),
        ("*", "/anything", True),
        ("/a*bc$", "/abc", True),
        ("/ab*bc$", "/abc", False),
    ],
)
def test_wildcard_matching(pattern: str, path: str, matches: bool) -> None:
    assert RobotsRule(allow=False, pattern=pattern).matches(path) is matches


def test_rules_are_ordered_most_specific_first_with_allow_before_disallow() -> None:
    body = b"User-agent: *\nDisallow: /a\nDisallow: /abc\nAllow: /abc\nAllow: /a\n"
    rules = RobotsRules.parse(body, AGENT).rules
    assert [(r.pattern, r.allow) for r in rules] == [
        ("/abc", True),
        ("/abc", False),
        ("/a", True),
        ("/a", False),
    ]


def test_rules_are_frozen_values() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /x\n", AGENT)
    assert rules == RobotsRules.parse(b"user-agent: *\n\ndisallow: /x # same\n", AGENT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rules.crawl_delay = 1.0  # type: ignore[misc]


# --- garbage never raises --------------------------------------------------------------------


def test_random_bytes_never_raise() -> None:
    rng = random.Random(9309)
    alphabet = b"User-agent:Disallow Allow*$#%\r\n\t /\xef\xbb\xbf\x00\xff"
    for _ in range(300):
        size = rng.randrange(0, 400)
        mixed = bytes(
            rng.choice(alphabet) if rng.random() < 0.7 else rng.randrange(256) for _ in range(size)
        )
        rules = RobotsRules.parse(mixed, AGENT)
        rules.allowed("https://example.org/some/path?q=1")
        rules.allowed(mixed.decode("latin-1"))


def test_non_utf8_bytes_in_a_pattern_are_percent_encoded() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /caf\xe9\n", AGENT)
    assert [r.pattern for r in rules.rules] == ["/caf%E9"]
    assert not rules.allowed("/caf%e9/menu")


def test_a_huge_single_line_and_nul_bytes_do_not_raise() -> None:
    body = b"User-agent: *\nDisallow: /" + b"\x00*" * (2 * MAX_ROBOTS_BYTES)
    rules = RobotsRules.parse(body, AGENT)
    assert rules.allowed("/page")  # the over-long line is past the limit and dropped
    # Cut at 16,663 bytes, the pattern keeps 8,326 "a*" pieces: it needs that many a's.
    body = b"User-agent: *\nDisallow: /" + b"a*" * 20_000 + b"\n"
    rules = RobotsRules.parse(body, AGENT)
    assert rules.allowed("/" + "a" * 8_000 + "b")
    assert not rules.allowed("/" + "a" * 9_000 + "b")


def test_lone_surrogates_in_a_url_do_not_raise() -> None:
    rules = RobotsRules.parse(b"User-agent: *\nDisallow: /x\n", AGENT)
    assert rules.allowed("/\udcff")


# --- product token ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user_agent", "token"),
    [
        ("refresher/0.1 (+https://x)", "refresher"),
        ("refresher", "refresher"),
        ("  Foo_Bot-2 extra", "Foo_Bot-"),
        ("Mozilla/5.0 (compatible; refresher/0.1)", "Mozilla"),
        ("123bot", ""),
        ("", ""),
        ("ツbot", ""),
    ],
)
def test_product_token_is_the_leading_name(user_agent: str, token: str) -> None:
    assert product_token(user_agent) == token


def test_a_robots_txt_with_no_group_for_us_allows_every_url_whatever_its_path() -> None:
    rules = RobotsRules.parse(b"User-agent: otherbot\nDisallow: /\n", AGENT)
    assert rules.rules == ()
    for url in ("https://example.org/", "/caf\u00e9 menu?q=%zz", "//host", "", "/robots.txt"):
        assert rules.allowed(url)
