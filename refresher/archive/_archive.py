"""Reading the copy back: :class:`Archive` (``refresher.Archive(path).get(url)``), CDXJ lines.

Readers never take the daemon's DuckDB lock: the index is read from the store when no daemon
holds it, else from the snapshot beside it (:func:`refresher.store._captures.open_index`), and
the records from the WARC files, which the daemon only ever appends to. A version the snapshot
does not list yet (younger than one snapshot interval) is not seen; a record that does not read
(a damaged file) is reported in the log and the next older version is returned instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from refresher._config import Config
from refresher._errors import ArchiveError, ArchiveUnreachable, InvalidURL, StoreError
from refresher.archive._warc import StoredRecord, WarcWriter, read_record
from refresher.discover._url import canonicalize
from refresher.ops._logging import get_logger
from refresher.store._captures import CaptureSource, IndexedCapture, LocalIndex
from refresher.store._snapshot import DEFAULT_SNAPSHOT_NAME, snapshot_path

__all__ = ["Archive", "Version", "cdxj_line", "open_writer", "surt"]

log = get_logger("archive")

_DEFAULT_PORTS = {"http": "80", "https": "443"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Version:
    """One archived version of a page."""

    url: str  # the page's canonical URL
    target_uri: str  # the URL fetched (after redirects)
    captured_at: float  # unix seconds
    status: int | None
    headers: tuple[tuple[str, str], ...]  # as received; transfer fields as X-Archive-Orig-*
    body: bytes  # decoded payload
    truncated: bool  # cut at fetch.max_body_bytes
    mime: str | None
    file: str  # the WARC file holding it

    @property
    def captured(self) -> datetime:
        """``captured_at`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.captured_at, UTC)


class ArchiveIndex(Protocol):
    """What opening the writer needs of a store: its index's file ends, a place for a note."""

    def archive_file_ends(self) -> dict[str, int]: ...

    def set_meta(self, key: str, value: str) -> None: ...


def open_writer(config: Config, store: ArchiveIndex, *, prefix: str = "") -> WarcWriter | None:
    """The daemon's WARC writer after checking the archive directory; None when disabled.

    Records where the archive is (store meta ``archive_dir``) so readers find it. ``prefix``
    replaces ``archive.prefix`` in the file names (a fleet node adds its node id).
    """
    a = config.archive
    if not a.enabled:
        return None
    directory = config.archive_dir
    writer = WarcWriter(
        directory,
        prefix=prefix or a.prefix,
        max_file_bytes=a.max_file_bytes,
        min_free_bytes=a.min_free_bytes,
        compress_level=a.compress_level,
    )
    corrupt = writer.recover(store.archive_file_ends())
    if corrupt:
        log.error("corrupt archive files skipped for reads", files=corrupt)
    store.set_meta("archive_dir", str(directory.resolve()))
    return writer


class Archive:
    """The archived copy of a store. ``path`` is the store file (``store.path``).

    ``snapshot`` (default: "snapshot.duckdb" beside the store) is read while a daemon holds the
    store; ``directory`` (default: where the daemon recorded it, else "archive" beside the
    store) holds the WARC files. :meth:`from_config` with ``fleet.dsn`` reads the whole
    fleet's copy instead (:class:`refresher.store._pg_archive.FleetIndex`).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        snapshot: Path | None = None,
        directory: Path | None = None,
        source: CaptureSource | None = None,
    ) -> None:
        self.path = Path(path)
        self.snapshot = snapshot or self.path.parent / DEFAULT_SNAPSHOT_NAME
        self.source: CaptureSource = source or LocalIndex(
            self.path, self.snapshot, directory=directory
        )

    @classmethod
    def from_config(cls, config: Config) -> Archive:
        if config.fleet.enabled:
            from refresher.store._pg_archive import FleetIndex, archive_base

            index = FleetIndex(config.fleet.dsn, base=archive_base(config))
            return cls(config.store.path, source=index)
        return cls(config.store.path, snapshot=snapshot_path(config), directory=config.archive_dir)

    # -- queries -------------------------------------------------------------------------

    def versions(self, url: str, *, at: float | None = None) -> list[IndexedCapture]:
        """The archived versions (responses) of ``url`` at or before ``at``, newest first."""
        return self.source.lookup(_keys(url), at=at)

    def get(self, url: str, *, at: float | datetime | None = None) -> Version | None:
        """The latest version of ``url`` (or the one current at ``at``: unix seconds or a
        datetime); None if none is archived. A record that does not read gives the next older
        version; one whose file this machine cannot reach (a fleet node's) raises
        :class:`ArchiveUnreachable` rather than fall back."""
        when = at.timestamp() if isinstance(at, datetime) else at
        seen: set[tuple[str | None, str, int]] = set()
        for c in self.source.lookup(_keys(url), at=when):
            if (c.node_id, c.file, c.offset) in seen:
                continue
            seen.add((c.node_id, c.file, c.offset))
            try:
                where, record = self.read(c)
            except ArchiveUnreachable:
                raise
            except ArchiveError as e:
                log.error("archived version unreadable; trying an older one", error=str(e))
                continue
            return Version(
                url=where.url,
                target_uri=where.target_uri,
                captured_at=where.captured_at,
                status=record.status,
                headers=record.headers,
                body=record.body,
                truncated=record.truncated,
                mime=where.mime,
                file=where.file,
            )
        return None

    def read(self, capture: IndexedCapture) -> tuple[IndexedCapture, StoredRecord]:
        """The record of ``capture``, and where it is: when its file is gone, a retention
        pass rewrote it since the index was read, so the version is looked up again."""
        try:
            return capture, read_record(self.source.locate(capture), capture.offset)
        except ArchiveError:
            again = self.source.lookup([capture.url], at=capture.captured_at)
            here = (capture.node_id, capture.file, capture.offset)
            moved = [
                c
                for c in again
                if c.captured_at == capture.captured_at and (c.node_id, c.file, c.offset) != here
            ]
            if not moved:
                raise
            return moved[0], read_record(self.source.locate(moved[0]), moved[0].offset)

    def captures(self) -> list[IndexedCapture]:
        """Every indexed record (responses and revisits), by URL and time."""
        return list(self.source.every())

    def latest(self) -> Iterator[IndexedCapture]:
        """The latest response of every page, by URL (streamed from a fleet's index)."""
        return self.source.latest()

    def cdxj(self) -> Iterator[str]:
        """The index as CDXJ lines (pywb, OutbackCDX), sorted by SURT key and time. A fleet's
        file names are ``node=<id>/<file>``, relative to the nodes' shared base directory."""
        lines = [cdxj_line(c) for c in self.source.every()]
        lines.sort()
        yield from lines


def _keys(url: str) -> list[str]:
    try:
        canonical = canonicalize(url).url
    except (InvalidURL, StoreError, ValueError):
        return [url]
    return [canonical] if canonical == url else [canonical, url]


def surt(url: str) -> str:
    """The SURT sort key of ``url`` as CDX indexes use it: ``com,example)/path?a=1&b=2``."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rsplit("@", 1)[-1].lower()
    host, _, port = netloc.partition(":") if not netloc.startswith("[") else (netloc, "", "")
    labels = host.split(".")
    if labels and labels[0] == "www":
        labels = labels[1:]
    key = ",".join(reversed(labels))
    if port and port != _DEFAULT_PORTS.get(scheme.lower()):
        key += f":{port}"
    path, _, query = (slash + path).partition("?")
    path = path.split("#", 1)[0] or "/"
    if query:
        path += "?" + "&".join(sorted(query.split("#", 1)[0].split("&")))
    return f"{key}){path.lower()}"


def cdxj_line(c: IndexedCapture) -> str:
    """One CDXJ line: ``SURT TIMESTAMP14 {json}``."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(c.captured_at))
    digest = (c.payload_digest or "").split(":", 1)[-1]
    fields = {
        "url": c.target_uri,
        "mime": c.mime or "unk" if c.kind == "response" else "warc/revisit",
        "status": str(c.status) if c.status is not None else "-",
        "digest": digest or "-",
        "length": str(c.length),
        "offset": str(c.offset),
        "filename": c.file if c.node_id is None else f"node={c.node_id}/{c.file}",
    }
    return f"{surt(c.target_uri)} {stamp} {json.dumps(fields)}"
