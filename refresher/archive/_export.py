"""``refresher export``: the latest version of every page as a dataset (Parquet or JSON lines).

One row per page: ``url``, ``fetched_at`` (unix seconds), ``status``, ``content_type``,
``text`` (the visible text of an HTML page, whitespace collapsed; NULL for other types),
``truncated``, and with ``bodies`` the raw ``body``. Rows go out in chunks of :data:`CHUNK`
pages (Parquet through a scratch DuckDB file), so memory is bounded by a chunk.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html
import numpy as np

from refresher._errors import ArchiveError, ArchiveUnreachable
from refresher.archive._archive import Archive
from refresher.ops._logging import get_logger
from refresher.store._captures import ParquetWriter

__all__ = ["CHUNK", "export", "html_text"]

log = get_logger("archive")

#: pages per Parquet file part / per write
CHUNK = 5000
_HTML = ("text/html", "application/xhtml+xml")
_SPACE = re.compile(r"\s+")


def html_text(body: bytes) -> str | None:
    """The visible text of an HTML document, whitespace collapsed; None if it does not parse."""
    try:
        root = lxml.html.document_fromstring(body)
    except (lxml.etree.ParserError, ValueError):
        return None
    for bad in root.xpath("//script|//style|//noscript|//template"):
        bad.drop_tree()
    return _SPACE.sub(" ", str(root.text_content())).strip()


def _rows(archive: Archive, *, bodies: bool) -> Iterator[dict[str, Any]]:
    for latest in archive.latest():
        try:
            c, record = archive.read(latest)
        except ArchiveUnreachable:
            raise  # one line, no partial export
        except ArchiveError as e:
            log.error("version unreadable; left out of the export", url=latest.url, error=str(e))
            continue
        row: dict[str, Any] = {
            "url": c.url,
            "fetched_at": c.captured_at,
            "status": c.status,
            "content_type": c.mime,
            "text": html_text(record.body) if c.mime in _HTML or c.mime is None else None,
            "truncated": c.truncated,
        }
        if bodies:
            row["body"] = record.body
        yield row


def export(archive: Archive, output: Path, *, format: str, bodies: bool = False) -> int:
    """Write the latest version of every page to ``output``; returns the rows written.

    One file either way; JSON lines carry a body base64 in ``body_base64``.
    """
    if format == "jsonl":
        n = 0
        with output.open("w", encoding="utf-8") as f:
            for row in _rows(archive, bodies=bodies):
                if bodies:
                    row["body_base64"] = base64.b64encode(row.pop("body")).decode("ascii")
                f.write(json.dumps(row) + "\n")
                n += 1
        return n
    if format != "parquet":
        raise ArchiveError(f"unknown export format {format!r}; use parquet or jsonl")
    writer = ParquetWriter(output)
    total = 0
    chunk: list[dict[str, Any]] = []
    try:
        for row in _rows(archive, bodies=bodies):
            chunk.append(row)
            if len(chunk) == CHUNK:
                writer.add(_columns(chunk, bodies=bodies))
                total += len(chunk)
                chunk = []
        if chunk:
            writer.add(_columns(chunk, bodies=bodies))
            total += len(chunk)
    finally:
        writer.close()
    return total


def _columns(rows: list[dict[str, Any]], *, bodies: bool) -> dict[str, Any]:
    names = ["url", "fetched_at", "status", "content_type", "text", "truncated"]
    if bodies:
        names.append("body")
    types: dict[str, Any] = {"fetched_at": np.float64, "truncated": bool}
    return {n: np.array([r[n] for r in rows], dtype=types.get(n, object)) for n in names}
