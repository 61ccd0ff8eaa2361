"""Which encoding an HTML body is in: byte order mark, then the Content-Type charset, then
``<meta charset>`` or the XML declaration, checked against the bytes; the web's defaults
(UTF-8 when it fits, else windows-1252) and the browsers' label aliases (WHATWG)."""

from __future__ import annotations

import codecs
import re
from collections import Counter
from collections.abc import Iterator

from refresher.discover._document import CHUNK

__all__ = ["choose_charset", "decoded_chunks"]


# WHATWG labels Python does not know, and Python codecs the web means something else by
# (a page labelled ISO-8859-1 or US-ASCII is decoded as windows-1252 by every browser).
_LABELS = {
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "ms932": "cp932",
    "windows-874": "cp874",
    "x-mac-roman": "mac-roman",
    "x-mac-cyrillic": "mac-cyrillic",
    "x-gbk": "gb18030",
    "x-euc-jp": "euc_jp",
}
_SUPERSETS = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso8859-11": "cp874",
    "utf-16": "utf-16-le",  # WHATWG's "utf-16"; Python's would demand a byte order mark
}
# The web's encodings (WHATWG Encoding Standard) as Python names; anything else is refused,
# so a page cannot pick unicode_escape, utf-7 or a bytes-to-bytes codec.
_WEB_CODECS = frozenset(
    {
        "utf-8",
        "utf-16-le",
        "utf-16-be",
        "cp866",
        "koi8-r",
        "koi8-u",
        "mac-roman",
        "mac-cyrillic",
        "cp874",
        "gb18030",
        "big5hkscs",
        "euc_jp",
        "iso2022_jp",
        "cp932",
        "cp949",
        *(f"iso8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
        *(f"cp{n}" for n in range(1250, 1259)),
    }
)
_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CHARSET_PARAM = re.compile(r"""charset\s*=\s*["']?\s*([^\s"';,]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_:.\-]+)""", re.IGNORECASE
)
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9_.\-]+)""")
_PRESCAN = 4096  # bytes searched for <meta charset>; WHATWG says 1024, real pages go further


def _codec(label: str) -> str | None:
    """The Python codec for a charset label, or None when it is not a web encoding."""
    name = label.strip().strip("\"'").lower()
    name = _LABELS.get(name, name)
    try:
        name = codecs.lookup(name).name
    except (LookupError, ValueError):  # ValueError: a NUL in the label (found by fuzzing)
        return None
    name = _SUPERSETS.get(name, name)
    return name if name in _WEB_CODECS else None


def _decodes(body: bytes, codec: str, start: int) -> bool:
    """Whether ``body[start:]`` is valid ``codec``, checked in chunks (no full copy)."""
    decoder = codecs.getincrementaldecoder(codec)("strict")
    view = memoryview(body)
    try:
        for i in range(start, len(body), 16 * CHUNK):
            decoder.decode(view[i : i + 16 * CHUNK])
        decoder.decode(b"", True)
    except UnicodeError:
        return False
    return True


def choose_charset(
    body: bytes, content_type: str | None, skipped: Counter[str]
) -> tuple[str, int, str]:
    """(codec, bytes to skip, errors) for an HTML body.

    A byte order mark wins (as in browsers), then the Content-Type charset, then
    ``<meta charset>``/http-equiv or the XML declaration in the first bytes. A declared
    charset that does not decode the body is a lie ("charset"): UTF-8 is used when it fits,
    else the declared one with replacement characters. Without a declaration: UTF-8 when it
    fits, else windows-1252 (the web's default). Unknown labels count "charset" and are passed
    over.
    """
    for bom, codec in _BOMS:
        if body.startswith(bom):
            errors = "strict" if _decodes(body, codec, len(bom)) else "replace"
            if errors == "replace":
                skipped["charset"] += 1
            return codec, len(bom), errors
    declared = None
    labels: list[tuple[str, bool]] = []  # (label, found in the document)
    if content_type and (m := _CHARSET_PARAM.search(content_type)):
        labels.append((m.group(1), False))
    head = body[:_PRESCAN]
    for pattern in (_META_CHARSET, _XML_ENCODING):
        if m2 := pattern.search(head):
            labels.append((m2.group(1).decode("ascii"), True))
    for label, in_document in labels:
        declared = _codec(label)
        if declared is not None:
            if in_document and declared.startswith("utf-16"):
                declared = "utf-8"  # a UTF-16 page cannot declare itself in ASCII (WHATWG)
            break
        skipped["charset"] += 1
    if declared is not None:
        if _decodes(body, declared, 0):
            return declared, 0, "strict"
        skipped["charset"] += 1
        if declared != "utf-8" and _decodes(body, "utf-8", 0):
            return "utf-8", 0, "strict"
        return declared, 0, "replace"
    if _decodes(body, "utf-8", 0):
        return "utf-8", 0, "strict"
    return "cp1252", 0, "replace"


def decoded_chunks(body: bytes, codec: str, start: int, errors: str) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder(codec)(errors)
    view = memoryview(body)
    for i in range(start, len(body), CHUNK):
        text = decoder.decode(view[i : i + CHUNK])
        if text:
            yield text
    tail = decoder.decode(b"", True)
    if tail:
        yield tail
