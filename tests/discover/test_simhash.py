"""Tests for the simhash: stable values, what it ignores, streaming, near-duplicates."""

from __future__ import annotations

import random
import string

import pytest
from _pages import fixture, html
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher.discover import _simhash
from refresher.discover._parse import (
    hamming,
    meaningful_change,
    simhash,
)

# --------------------------------------------------------------------------- simhash


def test_simhash_values_are_stable_because_they_are_stored() -> None:
    # Fingerprints live in the history; if this changes, every stored one becomes useless.
    assert simhash("The quick brown fox jumps over the lazy dog") == 0xA9B4C992E6F45591
    assert simhash("hello") == 0xF8E479CA66F653CE


def _reference_tokens(text: str) -> list[bytes]:
    """The tokens by the plain rule: every character lowered, Unicode white space made a
    space, ASCII punctuation a separator, digits "0"."""
    text = text.lower()
    if not text.isascii():
        text = _simhash._UNICODE_SPACE.sub(" ", text)
    return text.encode("utf-8", "surrogatepass").translate(_simhash._BYTE_TABLE).split()


# Characters without a case (the byte-table path when few), with one (str.lower() then),
# Unicode spaces, the separators bytes.split does not know, a lone surrogate.
_ODD = "¶’—中é\xa0\u2009\u3000\x85\x1c\x1fÉΣİ\u212aßǅ\ud800"
_WORDS = st.text(
    alphabet=string.ascii_letters + string.digits + string.punctuation + " \t\n", min_size=12
)


@given(st.lists(st.one_of(_WORDS, st.sampled_from(_ODD)), max_size=30))
def test_tokens_are_the_text_lowered_and_split_whichever_way_they_are_found(
    parts: list[str],
) -> None:
    text = "".join(parts)
    assert _simhash._tokens(text) == _reference_tokens(text)


@pytest.mark.parametrize(
    "text",
    [
        "Plain ASCII\x1cText, 12 Words",  # \x1c joins words in ASCII text, as before
        # few characters outside ASCII, none with a case: the byte table
        "Some Plain Words Before. Caf\xe9 \xb6 Na\xefve\xa0Words \u2014 TOTAL\x1fEnd" * 3,
        "\u212a Kelvin\x1cSign",  # lowers to ASCII "k": str.lower()
        "\u039f\u0394\u039f\u03a3 \u03a3",  # final sigma: str.lower()
        "\u4e2d\u6587\u3000\u6587\u5b57 ABC",  # mostly outside ASCII: str.lower()
    ],
)
def test_tokens_agree_with_the_plain_rule_on_each_path(text: str) -> None:
    assert _simhash._tokens(text) == _reference_tokens(text)


def test_simhash_ignores_case_punctuation_and_digit_values() -> None:
    assert simhash("Hello, World! Foo.") == simhash("hello world foo")
    assert simhash("read 1204 times on 2024-05-06") == simhash("read 1377 times on 2024-05-07")
    assert simhash("read 1204 times") != simhash("read many times")


def test_simhash_of_no_words_is_none_and_of_one_word_is_not() -> None:
    assert simhash("") is None
    assert simhash(" ... !!! \n") is None
    assert simhash("hello") is not None and simhash("hello") != simhash("world")


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_simhash_does_not_depend_on_how_text_is_split(text: str, cuts: list[int]) -> None:
    pieces = [
        text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)
    ]
    streamed = _simhash._Simhash()
    for piece in pieces:
        streamed.feed(piece)
    assert streamed.value() == simhash(text)


def test_simhash_of_long_text_does_not_depend_on_how_it_is_split() -> None:
    rng = random.Random(3)
    vocabulary = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta!", "eta,", "θήτα", "42"]
    text = " ".join(rng.choice(vocabulary) for _ in range(60_000))  # ~350 kB, several batches
    streamed = _simhash._Simhash()
    position = 0
    while position < len(text):
        step = rng.randrange(1, 90_000)
        streamed.feed(text[position : position + step])
        position += step
    assert streamed.value() == simhash(text)


def test_simhash_is_the_same_whether_token_hashes_come_from_the_cache_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(5)
    # 676 distinct words (digits would all read as "0"), a long one and a non-ASCII one
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [rng.choice(letters) + rng.choice(letters) for _ in range(3000)]
    words += ["long" * 20, "é" * 30]
    text = " ".join(rng.sample(words, len(words)))
    cold = simhash(text)
    assert simhash(text) == cold  # every word cached now
    # a cache far smaller than a page's words starts over on every batch
    monkeypatch.setattr(_simhash, "_TOKENS_CACHED", 16)
    assert simhash(text) == cold == simhash(text.upper())
    assert simhash("a b c") == simhash("A B C")
    assert len(_simhash._token_cache.hashes) == 3  # it started over for the 3 new words


def test_new_words_are_hashed_once_and_cached_after_the_pass_unless_long() -> None:
    long_word = "x" * (_simhash._CACHED_TOKEN + 1)
    text = f"zqv zqv wjk {long_word} zqv {long_word}"
    assert simhash(text) == simhash(text.upper())
    cache = _simhash._token_cache.hashes
    assert {b"zqv", b"wjk"} <= cache.keys()
    assert long_word.encode() not in cache
    assert cache.fresh == []  # nothing left over for the next pass
    hashes = _simhash._token_hashes([b"zqv", long_word.encode(), b"zqv"])
    assert hashes.tolist() == [
        _simhash._hash_token(b"zqv"),
        _simhash._hash_token(long_word.encode()),
        _simhash._hash_token(b"zqv"),
    ]


def test_simhash_of_a_long_text_is_computed_in_bounded_batches() -> None:
    assert simhash("word " * 300_000) == simhash("word word word")


def test_the_html_fingerprint_is_the_simhash_of_the_visible_text() -> None:
    page = (
        "<html><head><title>Alpha</title><style>p { color: red }</style></head><body>"
        "<p>beta <b>gamma</b></p><script>var delta = 'epsilon';</script><!-- zeta -->"
        "<noscript>eta</noscript><template>theta</template><div>iota</div></body></html>"
    )
    assert html(page).fingerprint == simhash("alpha beta gamma iota")


def _fingerprint(name: str) -> int:
    value = html(fixture(name)).fingerprint
    assert value is not None
    return value


def test_a_changed_timestamp_and_counter_are_not_a_meaningful_change() -> None:
    v1, v2 = _fingerprint("article_library_v1.html"), _fingerprint("article_library_v2.html")
    assert fixture("article_library_v1.html") != fixture("article_library_v2.html")
    assert hamming(v1, v2) <= 3
    assert not meaningful_change(v1, v2)


def test_a_rewritten_paragraph_is_a_meaningful_change() -> None:
    v1 = _fingerprint("article_library_v1.html")
    edited = _fingerprint("article_library_edited.html")
    assert meaningful_change(v1, edited)


def test_different_articles_are_far_apart() -> None:
    library, river = _fingerprint("article_library_v1.html"), _fingerprint("article_river.html")
    assert hamming(library, river) >= 16  # unrelated texts differ in about 32 of 64 bits


def test_hamming_and_meaningful_change_edge_cases() -> None:
    assert hamming(0b1011, 0b0001) == 2
    assert hamming(2**64 - 1, 0) == 64
    assert not meaningful_change(None, None)
    assert meaningful_change(None, 5)
    assert meaningful_change(5, None)
    assert not meaningful_change(0b111, 0b000)  # 3 bits: within the default threshold
    assert meaningful_change(0b1111, 0b0000)
    assert meaningful_change(0b111, 0b000, threshold=2)


def test_a_simhash_with_a_limit_reads_only_the_first_characters_fed() -> None:
    rng = random.Random(7)
    text = " ".join(
        rng.choice(["alpha", "beta", "gamma", "delta", "épsilon"]) for _ in range(40_000)
    )
    bounded = _simhash._Simhash(100_000)
    for start in range(0, len(text), 70_000):  # pieces across the limit and the batch size
        bounded.feed(text[start : start + 70_000])
    value = bounded.value()
    assert value == simhash(text[:100_000])
    assert value != simhash(text)


def test_a_simhash_without_a_limit_reads_everything() -> None:
    text = " ".join(f"w{i}x" for i in range(50_000))
    unbounded = _simhash._Simhash(0)
    unbounded.feed(text)
    assert unbounded.value() == simhash(text)
