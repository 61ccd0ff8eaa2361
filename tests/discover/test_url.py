from __future__ import annotations

import pytest

from refresher._errors import InvalidURL
from refresher.discover._url import MAX_URL_LENGTH, TRACKING_PARAMS, CanonicalURL, canonicalize


def test_scheme_and_host_are_lowercased_and_path_and_query_kept() -> None:
    c = canonicalize("HTTP://Example.ORG/A/Path?Q=Yes")
    assert c == CanonicalURL(
        url="http://example.org/A/Path?Q=Yes",
        scheme="http",
        host="example.org",
        port=80,
        host_key="example.org",
    )


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://example.org:80/x", "http://example.org/x"),
        ("https://example.org:443/x", "https://example.org/x"),
    ],
)
def test_the_default_port_is_dropped(url: str, canonical: str) -> None:
    c = canonicalize(url)
    assert c.url == canonical
    assert c.host_key == "example.org"


def test_a_non_default_port_is_kept_in_the_url_and_the_host_key() -> None:
    c = canonicalize("https://example.org:80/")
    assert c.url == "https://example.org:80/"
    assert c.port == 80
    assert c.host_key == "example.org:80"
    assert canonicalize("http://127.0.0.1:8080").host_key == "127.0.0.1:8080"


def test_the_fragment_is_dropped() -> None:
    assert canonicalize("http://example.org/a?b=1#frag").url == "http://example.org/a?b=1"
    assert canonicalize("http://example.org/#").url == "http://example.org/"


def test_an_empty_path_becomes_a_slash() -> None:
    assert canonicalize("http://example.org").url == "http://example.org/"
    assert canonicalize("http://example.org?q").url == "http://example.org/?q"


def test_surrounding_whitespace_is_ignored() -> None:
    assert canonicalize("  http://example.org/\n").url == "http://example.org/"


def test_a_trailing_dot_in_the_host_is_dropped() -> None:
    assert canonicalize("http://example.org./").host == "example.org"


def test_an_international_host_is_encoded_with_idna_and_the_path_percent_encoded() -> None:
    # WHATWG percent-encodes non-ASCII path characters as UTF-8 (urllib left them raw).
    c = canonicalize("http://Bücher.example/ä")
    assert c.host == "xn--bcher-kva.example"
    assert c.url == "http://xn--bcher-kva.example/%C3%A4"


def test_an_ipv6_literal_keeps_its_brackets_in_the_url_only() -> None:
    c = canonicalize("http://[::1]:8080/x")
    assert c.host == "::1"
    assert c.port == 8080
    assert c.host_key == "[::1]:8080"
    assert c.url == "http://[::1]:8080/x"
    assert canonicalize("https://[2001:DB8::1]/").url == "https://[2001:db8::1]/"


def test_an_ipv4_literal_is_a_host() -> None:
    assert canonicalize("http://127.0.0.1/").host == "127.0.0.1"


def reason(url: str) -> str:
    with pytest.raises(InvalidURL) as info:
        canonicalize(url)
    assert info.value.reason in str(info.value)
    return info.value.reason


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "empty URL"),
        ("ftp://example.org/", "use http:// or https://"),
        ("mailto:someone@example.org", "use http:// or https://"),
        ("//example.org/x", "'(none)' is not crawled"),
        ("example.org/x", "'(none)' is not crawled"),
        ("http://", "has no host"),
        ("http:///", "has no host"),
        ("http://?q", "has no host"),
        ("http://exa mple.org/", "spaces or control characters"),
        ("http://example.org/\x00", "control character U+0000"),
        ("http://example.org/\x7f", "control character U+007F"),
        ("http://user:secret@example.org/", "credentials"),
        ("http://user@example.org/", "credentials"),
        ("http://example.org:99999/", "check the host and port"),
        ("http://example.org:8o/", "check the host and port"),
        ("http://example.org:0/", "port"),
        ("http://[::1/", "check the host and port"),
        ("http://-bad.example/", "not a valid domain name"),
        ("http://bad-.example/", "not a valid domain name"),
        ("http://a..b/", "not a valid domain name"),
        ("http://" + "a" * 64 + ".example/", "not a valid domain name"),
        ("http://ex!ample.org/", "not a valid domain name"),
    ],
)
def test_an_uncrawlable_url_is_refused_with_a_reason(url: str, why: str) -> None:
    assert why in reason(url)


def test_a_url_longer_than_the_limit_is_refused_and_shortened_in_the_message() -> None:
    url = "http://example.org/" + "a" * MAX_URL_LENGTH
    with pytest.raises(InvalidURL) as info:
        canonicalize(url)
    assert f"longer than {MAX_URL_LENGTH} characters" in info.value.reason
    assert len(info.value.url) < 100


def test_a_url_at_the_limit_is_accepted() -> None:
    prefix = "http://example.org/"
    url = prefix + "a" * (MAX_URL_LENGTH - len(prefix))
    assert canonicalize(url).url == url


def test_canonical_form_is_a_fixed_point() -> None:
    for url in ["HTTP://Bücher.Example:8080", "https://[::1]:443/a#b", "http://a.example./?q=1"]:
        once = canonicalize(url).url
        assert canonicalize(once).url == once


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("HTTPS://WWW.Example.COM/Path", "https://www.example.com/Path"),
        ("http://example.org/a/./b/../c", "http://example.org/a/c"),
        ("http://example.org/a/%2e%2E/c", "http://example.org/c"),
        ("http://example.org/%7euser/%7Eb", "http://example.org/~user/~b"),
        ("http://example.org/%41%5a%61%7a%30%39%2d%2e%5f", "http://example.org/AZaz09-._"),
        ("http://example.org/%c3%a4?q=%c3%a4", "http://example.org/%C3%A4?q=%C3%A4"),
        ("http://example.org/a%2fb%3Fc%25", "http://example.org/a%2Fb%3Fc%25"),
        ("http://example.org/?a=%7e&b=%3d&c=%2f", "http://example.org/?a=~&b=%3D&c=%2F"),
        ("http://example.org/%zz%4", "http://example.org/%zz%4"),
        ("http://example.org/a b?c d", "http://example.org/a%20b?c%20d"),
        ("http://example.org/x?", "http://example.org/x"),
        ("http://example.org/x?#frag", "http://example.org/x"),
        ("http://example.org/x?a=1&b=2", "http://example.org/x?a=1&b=2"),
        ("http://example.org\\a\\b", "http://example.org/a/b"),
        ("http://exa\tmple.org/a\nb", "http://example.org/ab"),
        ("http:///example.org/x", "http://example.org/x"),
        ("http:example.org", "http://example.org/"),
        ("http://ex%41mple.org/", "http://example.org/"),
        ("http://0x7f.1/", "http://127.0.0.1/"),
        ("http://example.org:0080/", "http://example.org/"),
        ("http://:@example.org/", "http://example.org/"),
        ("http://[0:0:0:0:0:0:0:1]:8080/", "http://[::1]:8080/"),
        ("http://ÉXAMPLE.org/", "http://xn--xample-9ua.org/"),
        ("http://example.org/;jsessionid=1", "http://example.org/;jsessionid=1"),
        ("http://example.org/?utm_source=x", "http://example.org/?utm_source=x"),
    ],
)
def test_canonical_forms_follow_whatwg_plus_crawler_rules(url: str, canonical: str) -> None:
    c = canonicalize(url)
    assert c.url == canonical
    assert canonicalize(c.url) == c


@pytest.mark.parametrize(
    ("link", "canonical"),
    [
        ("../c?x#y", "http://h.example/a/c?x"),
        ("/root", "http://h.example/root"),
        ("//other.example/p", "http://other.example/p"),
        ("?q=1", "http://h.example/a/b/d?q=1"),
        ("#top", "http://h.example/a/b/d"),
        ("", "http://h.example/a/b/d"),
        ("https://x.example", "https://x.example/"),
        (" e\n", "http://h.example/a/b/e"),
    ],
)
def test_a_relative_link_is_resolved_against_its_base(link: str, canonical: str) -> None:
    assert canonicalize(link, base="http://h.example/a/b/d").url == canonical


def test_a_link_against_an_unparsable_base_is_refused_saying_so() -> None:
    with pytest.raises(InvalidURL) as info:
        canonicalize("c", base="not a url")
    assert "base URL" in info.value.reason


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://e.org/?utm_source=a&utm_medium=b&id=3", "http://e.org/?id=3"),
        ("http://e.org/?UTM_Source=a&id=3&Fbclid=x", "http://e.org/?id=3"),
        ("http://e.org/?gclid=1&fbclid=2&mc_cid=3&mc_eid=4", "http://e.org/"),
        ("http://e.org/p?id=3&sessionid=abc&PHPSESSID=d&sid=5", "http://e.org/p?id=3"),
        ("http://e.org/p;jsessionid=0A1B?x=1", "http://e.org/p?x=1"),
        ("http://e.org/a;JSESSIONID=1/b;v=2;sid=3", "http://e.org/a/b;v=2"),
        ("http://e.org/?id=3&&utm_x=1&", "http://e.org/?id=3"),
        ("http://e.org/?utm_source", "http://e.org/"),
        ("http://e.org/?utm%5Fsource=x&a=%7E", "http://e.org/?a=~"),
        ("http://e.org/?user_sid=1&sidebar=2&putm_source=3", None),
        ("http://e.org/?id=3#utm_source=x", "http://e.org/?id=3"),
    ],
)
def test_tracking_and_session_parameters_are_stripped_when_asked(
    url: str, canonical: str | None
) -> None:
    assert canonicalize(url, strip_params=TRACKING_PARAMS).url == (canonical or url)


def test_only_the_given_parameters_are_stripped() -> None:
    c = canonicalize("http://e.org/?a=1&b=2&utm_source=3", strip_params=frozenset({"B"}))
    assert c.url == "http://e.org/?a=1&utm_source=3"
    assert canonicalize("http://e.org/?a=1&ab=2", strip_params=frozenset({"a*"})).url == (
        "http://e.org/"
    )


def test_the_default_strip_list_covers_the_common_trackers_and_session_ids() -> None:
    for name in ["utm_*", "gclid", "fbclid", "mc_cid", "mc_eid", "sessionid", "phpsessid"]:
        assert name in TRACKING_PARAMS
    assert {"jsessionid", "sid"} <= TRACKING_PARAMS


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.org/" + "a" * 10_000, "longer than"),
        ("http://example.org/a\x01b", "control character U+0001"),
        ("\x00http://example.org/", "control character U+0000"),
        ("http://example.org/\x1b[31m", "control character U+001B"),
        ("http://example.org/\x85", "control character U+0085"),
        ("http://example.org/\ud800", "lone surrogate"),
        ("http://ex\u2028ample.org/", "spaces or control characters"),
        ("gopher://example.org/", "scheme 'gopher' is not crawled"),
        ("javascript:alert(1)", "scheme 'javascript' is not crawled"),
        ("data:text/html,<p>", "scheme 'data' is not crawled"),
        ("ws://example.org/", "scheme 'ws' is not crawled"),
        ("file:///etc/passwd", "scheme 'file' is not crawled"),
        ("http://\ufdd0zyx.com/", "IDNA"),
        ("http://ex\u0378.com/", "IDNA"),
        ("http://xn--ls8h\ufffd.la/", "IDNA"),
        ("http://1.2.3.4.5/", "not a valid IPv4 address"),
        ("http://[zz]/", "not a valid IPv6 address"),
        ("http://example.org:65536/", "above 65535"),
        ("http://[::1]:0/", "port 0"),
        ("http://" + "a." * 127 + "org/", "not a valid domain name"),
    ],
)
def test_absurd_input_is_refused_with_a_reason_never_a_crash(url: str, why: str) -> None:
    assert why in reason(url)


def test_a_url_that_outgrows_the_limit_once_encoded_is_refused() -> None:
    prefix = "http://example.org/"
    url = prefix + "ä" * ((MAX_URL_LENGTH - len(prefix)) // 2)
    assert len(url) <= MAX_URL_LENGTH
    assert "once percent-encoded" in reason(url)


def test_every_reason_says_what_to_do() -> None:
    bad = ["", "ftp://x/", "http://", "http://[::1/", "http://e.org:x/", "http://\ufdd0.com/"]
    bad += ["http://a\x01/", "http://u@e.org/", "http://-x.org/", "http://e.org:0/", "nope"]
    for url in bad:
        text = reason(url)
        assert any(verb in text for verb in ("use", "give", "check", "remove", "shorten")), text


def test_a_link_that_cannot_be_resolved_against_its_base_is_refused_saying_so() -> None:
    with pytest.raises(InvalidURL) as info:
        canonicalize("//[::1/x", base="http://h.example/")
    assert "cannot be resolved against the base URL" in info.value.reason
    with pytest.raises(InvalidURL) as info:
        canonicalize("mailto:x@h.example", base="http://h.example/")
    assert "scheme 'mailto' is not crawled" in info.value.reason
