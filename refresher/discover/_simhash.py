"""The 64-bit simhash of a text's 3-word shingles (Charikar; Manku et al., WWW 2007), the
near-duplicate print stored with every fetch, and the test of a meaningful change.

Tokenising runs in C (``bytes.translate``/``split``), token hashes come from a cache, and the
shingles and bit counts are numpy array passes: no Python loop per shingle or per bit."""

from __future__ import annotations

import re
import string
import threading
from hashlib import blake2b

import numpy as np
from numpy.typing import NDArray

__all__ = ["hamming", "meaningful_change", "simhash"]


# Tokenising works on UTF-8 bytes: bytes.translate and bytes.split run several times faster
# than str.translate (slow on any non-ASCII text) or a \w+ regex. ASCII punctuation
# separates words, every digit reads as "0", and the white space bytes.split does not know
# becomes a space first.
_BYTE_TABLE = bytes.maketrans(
    (string.punctuation + string.digits).encode(),
    b" " * len(string.punctuation) + b"0" * len(string.digits),
)
_UNICODE_SPACE = re.compile("[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
# The same with the ASCII capitals lowered, for text whose other characters have no case;
# and with the separators bytes.split does not know (\x1c-\x1f) made spaces, as
# _UNICODE_SPACE makes them in text that is not ASCII.
_LOWER_TABLE = bytes(b + 32 if 65 <= b <= 90 else _BYTE_TABLE[b] for b in range(256))
_LOWER_SPACE_TABLE = bytes(32 if 0x1C <= b <= 0x1F else _LOWER_TABLE[b] for b in range(256))
_ASCII = bytes(range(128))
_FEW_OTHER = 8  # text with at most one UTF-8 byte beyond its characters in this many: Latin
_PUNCTUATION = frozenset(string.punctuation)
_LONGEST_WORD = 256  # characters looked back for the start of a word cut by a batch end
_SHINGLE = 3  # words per shingle
_BLOCK = 8192  # token hashes combined per numpy step (the bit matrix is _BLOCK x 64 bytes)
_FLUSH = 64 * 1024  # characters of one text run held before tokenising part of it
_U64 = np.uint64


def _separates(char: str) -> bool:
    return char in _PUNCTUATION or char.isspace()  # as the tokeniser splits


def _hash_token(token: bytes) -> int:
    return int.from_bytes(blake2b(token, digest_size=8).digest(), "little")


# Words repeat, so their hashes are cached: per thread (the parse threads never share one),
# only short words, and at most _TOKENS_CACHED of them (the cache starts over when full), so it
# stays small. A page's words are looked up in one C pass (numpy reading a map over the list);
# a word not cached yet is hashed on the way (__missing__) and cached after the pass.
_CACHED_TOKEN = 48  # bytes
_TOKENS_CACHED = 1 << 15
_token_cache = threading.local()


class _TokenCache(dict[bytes, int]):
    """Token hashes by token; ``fresh`` lists the words added in the current pass."""

    __slots__ = ("fresh",)

    def __init__(self) -> None:
        super().__init__()
        self.fresh: list[bytes] = []

    def __missing__(self, word: bytes) -> int:
        value = self[word] = _hash_token(word)
        self.fresh.append(word)
        return value


def _token_hashes(words: list[bytes]) -> NDArray[np.uint64]:
    """The hash of each of ``words`` (:func:`_hash_token`), in order."""
    cache: _TokenCache | None = getattr(_token_cache, "hashes", None)
    if cache is None:
        cache = _token_cache.hashes = _TokenCache()
    hashes = np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))
    fresh = cache.fresh
    if fresh:
        cache.fresh = []
        if len(cache) > _TOKENS_CACHED:
            cache.clear()  # starts over with this batch's words
            cache.update(zip(words, hashes.tolist(), strict=True))
            fresh = words
        for word in fresh:
            if len(word) > _CACHED_TOKEN:
                cache.pop(word, None)
    return hashes


def _tokens(text: str) -> list[bytes]:
    """``text``'s tokens: lowercased, ASCII punctuation and white space (Unicode's too)
    separating them, digits read as "0", in UTF-8."""
    data = text.encode("utf-8", "surrogatepass")
    if text.isascii():
        return data.translate(_LOWER_TABLE).split()
    # str.lower() and the white space substitution each run over every character (0.1 ms
    # on a docs page). When the characters outside ASCII are few and none of them has a case
    # (¶, ’, — and no-break spaces on most Latin-script pages), the byte table lowers the
    # ASCII capitals and the Unicode spaces present are replaced in the bytes: the same tokens.
    if (len(data) - len(text)) * _FEW_OTHER <= len(text):
        other = data.translate(None, _ASCII).decode("utf-8", "surrogatepass")
        if other.lower() == other:
            for space in set(_UNICODE_SPACE.findall(other)):
                data = data.replace(space.encode("utf-8"), b" ")
            return data.translate(_LOWER_SPACE_TABLE).split()
    text = text.lower()
    if not text.isascii():
        text = _UNICODE_SPACE.sub(" ", text)
    return text.encode("utf-8", "surrogatepass").translate(_BYTE_TABLE).split()


#: 256 × j added to byte j of a hash: each (position, value) pair gets its own histogram slot
_BYTE_SLOTS = np.arange(0, 8 * 256, 256, dtype=np.uint16)
#: the bits of each byte value, least significant first (256 × 8)
_BITS_OF_BYTE = (np.arange(256)[:, None] >> np.arange(8)) & 1


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser on arrays (uint64 arithmetic wraps, as the hash wants)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


class _Simhash:
    """Streams text into the simhash of its 3-word shingles.

    Tokens are the text lowercased, split at white space and ASCII punctuation, with every
    digit read as "0": a changed date, time or counter leaves the fingerprint as it was (the
    raw digest still records that change). Each token is hashed (blake2b, 8 bytes), a
    shingle's hash mixes the hashes of its three tokens, and each bit of the fingerprint is
    the majority over the shingles.
    """

    __slots__ = (
        "_carry",
        "_counts",
        "_hashes",
        "_parts",
        "_pending",
        "_room",
        "_shingles",
        "_size",
        "_tokens",
    )

    def __init__(self, limit: int = 0) -> None:
        #: characters still read (``limit``, the first ones fed); None: all (``limit=0``)
        self._room: int | None = limit or None
        self._parts: list[str] = []
        self._size = 0
        self._hashes: list[NDArray[np.uint64]] = []  # token hashes not combined yet
        self._pending = 0  # tokens in _hashes
        self._carry: NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        self._counts: NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        self._shingles = 0
        self._tokens = 0

    def feed(self, text: str) -> None:
        """Add text; a word may go on from the previous call (lxml splits text nodes
        anywhere). Text is tokenised in batches of about ``_FLUSH`` characters; past the
        ``limit`` given, none is read (a word the limit cuts ends there)."""
        if self._room is not None:
            if len(text) > self._room:
                text = text[: self._room]
            self._room -= len(text)
        if len(text) > _FLUSH:
            for i in range(0, len(text), _FLUSH):
                self._add(text[i : i + _FLUSH])
        elif text:
            self._add(text)

    def _add(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= _FLUSH:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        joined = "".join(self._parts)
        cut = len(joined)
        if not final:  # keep back a word that may go on in the next call
            stop = max(cut - _LONGEST_WORD, 0)
            while cut > stop and not _separates(joined[cut - 1]):
                cut -= 1
            if cut == stop:  # no separator near the end: cut the overlong word anywhere
                cut = len(joined)
        self._parts = [joined[cut:]] if cut < len(joined) else []
        self._size = len(joined) - cut
        self._words(joined[:cut])

    def value(self) -> int | None:
        self._flush(final=True)
        self._combine()
        if self._tokens == 0:
            return None
        if self._shingles == 0:  # fewer tokens than a shingle: they make the one shingle
            self._add_bits(self._shingle_hashes(self._carry, whole=True))
        bits = (2 * self._counts - self._shingles) > 0
        packed = np.packbits(bits.astype(np.uint8), bitorder="little")
        return int.from_bytes(packed.tobytes(), "little")

    def _words(self, text: str) -> None:
        words = _tokens(text)
        if not words:
            return
        self._tokens += len(words)
        self._hashes.append(_token_hashes(words))
        self._pending += len(words)
        if self._pending >= _BLOCK:
            self._combine()

    def _combine(self) -> None:
        if not self._hashes:
            return
        seq = np.concatenate((self._carry, *self._hashes))
        self._hashes.clear()
        self._pending = 0
        if seq.size >= _SHINGLE:
            self._add_bits(self._shingle_hashes(seq, whole=False))
            seq = seq[-(_SHINGLE - 1) :]
        self._carry = seq.copy()

    @staticmethod
    def _shingle_hashes(seq: NDArray[np.uint64], *, whole: bool) -> NDArray[np.uint64]:
        if whole:  # one shingle of all of seq (shorter than _SHINGLE)
            seq = seq.reshape(1, -1)
            h = _mix(seq[:, 0] ^ _U64(0x9E3779B97F4A7C15))
            for j in range(1, seq.shape[1]):
                h = _mix(h ^ seq[:, j])
            return h
        n = seq.size - _SHINGLE + 1
        h = _mix(seq[:n] ^ _U64(0x9E3779B97F4A7C15))
        for j in range(1, _SHINGLE):
            h = _mix(h ^ seq[j : j + n])
        return h

    def _add_bits(self, hashes: NDArray[np.uint64]) -> None:
        # How many hashes have each bit set, without a bit matrix: a histogram of the values
        # of each of the 8 bytes (one bincount over byte + 256 × position), times the table
        # of the bits of each byte value: bit k of byte j is bit 8j + k (little-endian).
        as_bytes = hashes.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)
        histogram = np.bincount((as_bytes + _BYTE_SLOTS).ravel(), minlength=8 * 256)
        self._counts += (histogram.reshape(8, 256) @ _BITS_OF_BYTE).ravel()
        self._shingles += hashes.size


def simhash(text: str) -> int | None:
    """The 64-bit simhash (0 ≤ value < 2**64) of ``text``'s 3-word shingles; None when the
    text has no words. Every digit reads as "0" (see :func:`meaningful_change`)."""
    h = _Simhash()
    h.feed(text)
    return h.value()


def hamming(a: int, b: int) -> int:
    """The number of bits in which two fingerprints differ."""
    return (a ^ b).bit_count()


def meaningful_change(old: int | None, new: int | None, *, threshold: int = 3) -> bool:
    """Whether a page's text changed in substance: its simhash moved more than ``threshold``
    bits, or text appeared or vanished. Numbers are masked in the fingerprint, so a new
    timestamp or counter is never meaningful on its own (the raw digest still sees it); a
    few edited words move a few bits, a different article about half of them."""
    if old is None or new is None:
        return (old is None) != (new is None)
    return hamming(old, new) > threshold
