from __future__ import annotations

import pytest

from refresher._errors import InvalidURL
from refresher._url import MAX_URL_LENGTH, CanonicalURL, canonicalize


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


def test_an_international_host_is_encoded_with_idna() -> None:
    c = canonicalize("http://Bücher.example/ä")
    assert c.host == "xn--bcher-kva.example"
    assert c.url == "http://xn--bcher-kva.example/ä"


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
        ("http:///x", "has no host"),
        ("http:example.org", "has no host"),
        ("http://exa mple.org/", "spaces or control characters"),
        ("http://example.org/a b", "spaces or control characters"),
        ("http://example.org/\x00", "spaces or control characters"),
        ("http://example.org/\x7f", "spaces or control characters"),
        ("http://user:secret@example.org/", "credentials"),
        ("http://user@example.org/", "credentials"),
        ("http://example.org:99999/", "check the host and port"),
        ("http://example.org:8o/", "check the host and port"),
        ("http://example.org:0/", "port"),
        ("http://[::1/", "check the host and port"),
        ("http://-bad.example/", "not a valid domain name"),
        ("http://bad-.example/", "not a valid domain name"),
        ("http://a..b/", "not a valid domain name"),
        ("http://ex%41mple.org/", "not a valid domain name"),
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
