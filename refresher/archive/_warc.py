"""The WARC archive: every new version of a page as a WARC/1.1 record, read back by offset.

A *capture* is what the crawler hands over after a fetch: the response as received (status
line, header fields, the decoded payload, capped at ``fetch.max_body_bytes``). A page's first
successful fetch and every change are ``response`` records followed by their ``request`` record
(Heritrix's order); a 304 or an unchanged body is a ``revisit`` record (profiles
server-not-modified and identical-payload-digest) unless ``archive.revisits`` is off. Each record
is its own gzip member, so a reader seeks straight to it.

The payload is stored decoded (what the change test hashed), so the header fields that
describe the transfer are kept under ``X-Archive-Orig-`` names (pywb's convention):
``Content-Encoding``, ``Transfer-Encoding``, ``Content-Length``; ``Content-Length`` is the
stored payload's. A body cut at the cap carries ``WARC-Truncated: length``.

Durability: :meth:`WarcWriter.write` appends (no fsync) and returns the index row;
:meth:`WarcWriter.sync` fsyncs and returns the rows whose records are on disk. The store
writer calls :meth:`WarcWriter.write_batch` (both, for a whole batch's captures in one
``write``) just before the transaction that indexes them commits. A crash can leave a
half-written record after the last indexed one: :meth:`WarcWriter.recover` cuts it off at
start, in this writer's own files only, never in one another process is appending to. Files
are named ``PREFIX-TIMESTAMP17-SERIAL-PID~HOST.warc.gz`` (the Heritrix pattern) and rotate past
``archive.max_file_bytes``; each process starts a new file.

A disk too full (free space under ``archive.min_free_bytes``, or a write failing with ENOSPC)
stops archiving with one error log and ``failing`` in the statistics; fetching and the history
go on, and archiving resumes by itself once the space is back.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import io
import os
import random
import re
import shutil
import socket
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter
from zlib_ng import zlib_ng

from refresher._errors import ArchiveError
from refresher.ops._logging import get_logger
from refresher.store._captures import Capture, CaptureRow

__all__ = [
    "Capture",
    "StoredRecord",
    "WarcWriter",
    "WarcWriterStatistics",
    "first_record_end",
    "held_files",
    "lock_for_writing",
    "read_record",
    "scan_file",
]

log = get_logger("archive")

_TRANSFER_HEADERS = ("content-encoding", "transfer-encoding", "content-length")
_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
_IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
WARC_SUFFIX = ".warc.gz"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRecord:
    """A record read back: the response as archived."""

    url: str  # WARC-Target-URI
    captured_at: float  # unix seconds
    kind: str
    status: int | None
    headers: tuple[tuple[str, str], ...]
    body: bytes
    truncated: bool
    payload_digest: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WarcWriterStatistics:
    responses: int = field(metadata={"metric": "counter"})
    revisits: int = field(metadata={"metric": "counter"})
    #: compressed bytes appended to WARC files
    bytes: int = field(metadata={"metric": "counter"})
    files: int = field(metadata={"metric": "counter"})  # WARC files opened by this process
    #: captures not archived (disk full, write failure)
    skipped: int = field(metadata={"metric": "counter"})
    failures: int = field(metadata={"metric": "counter"})  # times archiving stopped
    failing: bool  # archiving is stopped now (disk full); it resumes by itself
    #: files found corrupt at start (reported by name in the log; skipped for reads)
    corrupt_files: int
    truncated_tails: int  # half-written records cut off at start


def _gzip_member(data: bytes, level: int) -> bytes:
    # zlib-ng: zlib's format and levels at about 60 % of its CPU (compressing took three
    # quarters of the store writer's time on real pages: bench/README.md)
    return zlib_ng.compress(data, level, wbits=zlib.MAX_WBITS | 16)


def _sha1_label(h: Any) -> str:
    """A WARC digest field's value, as warcio writes it: ``sha1:`` and the digest in base 32."""
    return "sha1:" + base64.b32encode(h.digest()).decode("ascii")


def _payload_digest(c: Capture, payload: bytes) -> str:
    """The WARC-Payload-Digest of ``payload``, the capture's: its digest is the payload's SHA-1
    (the fetch's change digest, :func:`refresher.crawl._fetch.body_digest`), not hashed again;
    a capture without one (a truncated payload) or with another kind of digest is hashed."""
    if c.digest is not None and len(c.digest) == _SHA1_BYTES and not c.truncated:
        return "sha1:" + base64.b32encode(c.digest).decode("ascii")
    return _sha1_label(hashlib.sha1(payload))


_SHA1_BYTES = hashlib.sha1().digest_size
_EMPTY_SHA1 = _sha1_label(hashlib.sha1())  # a request record's payload digest: no payload
_PRINTABLE = "".join(map(chr, range(32, 127)))


def _http_head(protocol: str, statusline: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """The status or request line and header fields as archived: ASCII, or, for a field with
    other characters, percent-encoded as warcio does (RFC 8187); a status line with other
    characters (a reason phrase in Latin-1) percent-encoded too (warcio's writer raised there,
    failing the whole batch)."""
    lines = [f"{protocol} {statusline}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    lines.append("\r\n")
    try:
        return "".join(lines).encode("ascii")
    except UnicodeEncodeError:
        line = quote(statusline, safe=_PRINTABLE)
        return bytes(StatusAndHeaders(line, list(headers), protocol).to_ascii_bytes())


def _record(fields: Sequence[tuple[str, str]], http: bytes, payload: bytes) -> bytes:
    """One WARC/1.1 record: its header fields (UTF-8, as warcio writes them), the block (the
    HTTP head and payload) and the two line ends that close it."""
    head = "".join(["WARC/1.1\r\n", *(f"{n}: {v}\r\n" for n, v in fields), "\r\n"])
    return b"".join((head.encode("utf-8"), http, payload, b"\r\n\r\n"))


def _record_id(rng: random.Random) -> str:
    """A WARC-Record-ID: a random (version 4) UUID URN, as warcio makes them, but drawn from a
    generator seeded once from the OS (warcio reads os.urandom for every record)."""
    n = rng.getrandbits(128)
    n = (n & ~(0xF000 << 64) | 0x4000 << 64) & ~(0xC000 << 48) | 0x8000 << 48
    h = f"{n:032x}"
    return f"<urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}>"


def _row(
    c: Capture, file: str, offset: int, length: int, span: int, payload_digest: str | None
) -> CaptureRow:
    return CaptureRow(
        page_id=c.page_id,
        url=c.url,
        target_uri=c.target_uri,
        captured_at=c.fetched_at,
        kind=c.kind,
        status=c.status,
        mime=_media_type(c.headers),
        digest=c.digest,
        payload_digest=payload_digest,
        file=file,
        offset=offset,
        length=length,
        span=span,
        payload_bytes=0 if c.payload is None else len(c.payload),
        truncated=c.truncated,
    )


def _warc_date(t: float) -> str:
    return str(datetime_to_iso_date(datetime.fromtimestamp(t, UTC).replace(tzinfo=None), True))


def _stored_headers(c: Capture) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, value in c.headers:
        if name.lower() in _TRANSFER_HEADERS and c.payload is not None:
            out.append((f"X-Archive-Orig-{name}", value))
        else:
            out.append((name, value))
    if c.payload is not None:
        out.append(("Content-Length", str(len(c.payload))))
    return out


class WarcWriter:
    """Appends captures to rotating WARC files in ``directory``. Thread-safe.

    ``max_file_bytes`` rotates the file; ``min_free_bytes`` is the free disk space kept (below
    it archiving pauses); ``compress_level`` is zlib's (1 fast … 9 small).
    """

    def __init__(
        self,
        directory: Path,
        *,
        prefix: str = "refresher",
        max_file_bytes: int = 1 << 30,
        min_free_bytes: int = 64 << 20,
        compress_level: int = 5,
        software: str = "refresher",
    ) -> None:
        self.directory = directory
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.min_free_bytes = min_free_bytes
        self.compress_level = compress_level
        self._software = software
        self._lock = threading.Lock()
        self._ids = random.Random()  # seeded from os.urandom
        self._fd: int | None = None
        self._name = ""
        self._size = 0
        self._serial = 0
        self._synced: dict[str, int] = {}  # file → bytes known to be on disk
        #: file → rows handed out by write() and not yet passed to sync() (not yet indexed)
        self._pending: dict[str, int] = {}
        self._host = socket.gethostname().replace("-", "_") or "localhost"
        #: this writer's file names (see _current), with a retention pass's rewritten copies
        self._own_name = re.compile(
            rf"{re.escape(prefix)}-\d{{17}}-\d+-\d+~{re.escape(self._host)}(-p\d+)?"
            + re.escape(WARC_SUFFIX)
        )
        self._failing: str | None = None
        self._responses = self._revisits = self._bytes = self._files = 0
        self._skipped = self._failures = self._corrupt = self._tails = 0
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArchiveError(
                f"cannot create the archive directory {str(directory)!r}: {e}; "
                "fix archive.dir or its permissions"
            ) from e

    # -- writing -----------------------------------------------------------------------------

    def write(self, capture: Capture) -> CaptureRow | None:
        """Append ``capture``; its index row, or None when it could not be archived."""
        rows = self._append([capture])
        return rows[0] if rows else None

    def write_batch(self, captures: Sequence[Capture]) -> list[CaptureRow]:
        """Append ``captures`` in one write and fsync (:meth:`sync`): the index rows of those
        on disk. The store writer calls this with each batch, just before the transaction
        that indexes them: one thread hop, one ``write`` and one fsync per batch."""
        if not captures:
            return self.sync([])
        return self.sync(self._append(captures))

    def _append(self, captures: Sequence[Capture]) -> list[CaptureRow]:
        """Serialise ``captures`` (outside the lock: the CPU work) and append them together;
        their rows, or none when they could not be archived."""
        serialised = [self._serialize(c) for c in captures]
        data = b"".join(b"".join(members) for members, _ in serialised)
        with self._lock:
            if not self._room_for(len(data)):
                self._skipped += len(captures)
                return []
            try:
                fd = self._current()
                start = self._size
                _write_all(fd, data)
            except OSError as e:
                self._fail(f"writing {self._name!r}: {e}")
                self._cut(self._synced.get(self._name, 0))
                self._skipped += len(captures)
                return []
            self._size += len(data)
            self._bytes += len(data)
            name = self._name
            self._pending[name] = self._pending.get(name, 0) + len(captures)
            responses = sum(c.kind == "response" for c in captures)
            self._responses += responses
            self._revisits += len(captures) - responses
            if self._failing is not None:
                log.info("archiving resumed", directory=str(self.directory))
                self._failing = None
        rows = []
        offset = start
        for c, (members, payload_digest) in zip(captures, serialised, strict=True):
            span = sum(map(len, members))
            rows.append(_row(c, name, offset, len(members[0]), span, payload_digest))
            offset += span
        return rows

    def sync(self, rows: Sequence[CaptureRow]) -> list[CaptureRow]:
        """Make every record written so far durable; the ``rows`` whose records are."""
        with self._lock:
            fd, name, size = self._fd, self._name, self._size
            fresh = self._synced.get(name) == size  # nothing written since the last sync
            dup = os.dup(fd) if fd is not None and not fresh else None
        if dup is not None:
            try:
                os.fsync(dup)
            except OSError as e:
                with self._lock:
                    self._fail(f"syncing {name!r}: {e}")
                    if self._name == name:
                        self._cut(self._synced.get(name, 0))
            else:
                with self._lock:
                    self._synced[name] = max(self._synced.get(name, 0), size)
            finally:
                os.close(dup)
        with self._lock:
            for r in rows:  # committed with this batch, or refused: settled either way
                left = self._pending.get(r.file, 0) - 1
                if left > 0:
                    self._pending[r.file] = left
                else:
                    self._pending.pop(r.file, None)
        synced = self._synced
        return [r for r in rows if r.offset + r.span <= synced.get(r.file, -1)]

    def close(self) -> None:
        with self._lock:
            self._close_file()

    def statistics(self) -> WarcWriterStatistics:
        return WarcWriterStatistics(
            responses=self._responses,
            revisits=self._revisits,
            bytes=self._bytes,
            files=self._files,
            skipped=self._skipped,
            failures=self._failures,
            failing=self._failing is not None,
            corrupt_files=self._corrupt,
            truncated_tails=self._tails,
        )

    @property
    def current_file(self) -> str | None:
        """The file being appended to (never pruned)."""
        return self._name if self._fd is not None else None

    def rotate(self) -> None:
        """Close the current file (synced); the next record starts a new one."""
        with self._lock:
            self._close_file()

    def unsettled(self) -> set[str]:
        """Files retention must not touch: the one being written and those with records whose
        index rows are not committed yet."""
        with self._lock:
            busy = {f for f, n in self._pending.items() if n > 0}
            if self._fd is not None:
                busy.add(self._name)
            return busy

    # -- inside the lock ---------------------------------------------------------------------

    def _room_for(self, n: int) -> bool:
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError as e:
            self._fail(f"cannot read the free space of {str(self.directory)!r}: {e}")
            return False
        if free - n < self.min_free_bytes:
            self._fail(
                f"{str(self.directory)!r} has {free} bytes free, under archive.min_free_bytes "
                f"({self.min_free_bytes})"
            )
            return False
        return True

    def _fail(self, why: str) -> None:
        if self._failing is None:
            self._failures += 1
            log.error(
                "archiving stopped; fetching and the history go on",
                error=why,
                hint="free disk space (or lower archive.min_free_bytes); archiving resumes "
                "by itself",
            )
        self._failing = why

    def _cut(self, size: int) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, size)
                self._size = size
            except OSError:
                self._close_file()  # start a new file once the disk has room

    def _current(self) -> int:
        if self._fd is not None and self._size < self.max_file_bytes:
            return self._fd
        self._close_file()
        self._serial += 1
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")[:17]
        name = f"{self.prefix}-{stamp}-{self._serial:05d}-{os.getpid()}~{self._host}{WARC_SUFFIX}"
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        lock_for_writing(fd)
        info = self._warcinfo(name)
        try:
            _write_all(fd, info)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._name, self._size = fd, name, len(info)
        self._files += 1
        log.info("archive file opened", file=name)
        return fd

    def _close_file(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
            self._synced[self._name] = self._size
        except OSError as e:
            self._fail(f"syncing {self._name!r}: {e}")
        finally:
            os.close(fd)

    # -- records -----------------------------------------------------------------------------

    def _warcinfo(self, name: str) -> bytes:
        buf = io.BytesIO()
        w = WARCWriter(buf, gzip=False, warc_version="1.1")
        info = {
            "software": self._software,
            "format": "WARC File Format 1.1",
            "conformsTo": "https://iipc.github.io/warc-specifications/specifications/"
            "warc-format/warc-1.1/",
            "hostname": socket.gethostname(),
        }
        w.write_record(w.create_warcinfo_record(name, info))
        return _gzip_member(buf.getvalue(), self.compress_level)

    def _serialize(self, c: Capture) -> tuple[list[bytes], str | None]:
        """The capture's gzip members (the response or revisit, then the request) and its
        WARC-Payload-Digest: the records warcio's writer would make, byte for byte (tests
        compare them), built here without its per-record streams, copies and buffers."""
        date = _warc_date(c.fetched_at)
        record_id = _record_id(self._ids)
        http = _http_head(
            c.http_version or "HTTP/1.1", f"{c.status} {c.reason or ''}".strip(), _stored_headers(c)
        )
        fields = [("WARC-Date", date), ("WARC-Record-ID", record_id)]
        if c.truncated:
            fields.append(("WARC-Truncated", "length"))
        payload_digest: str | None
        if c.kind == "response":
            payload = c.payload or b""
            payload_digest = _payload_digest(c, payload)
            block = hashlib.sha1(http)
            block.update(payload)
            fields += [
                ("WARC-Type", "response"),
                ("WARC-Target-URI", c.target_uri),
                ("WARC-Payload-Digest", payload_digest),
            ]
        else:
            payload = b""  # a revisit's block is the header fields alone
            fields += [("WARC-Type", "revisit"), ("WARC-Target-URI", c.target_uri)]
            if c.payload is not None:  # an unchanged 200: the same payload as last time
                payload_digest = _payload_digest(c, c.payload)
                fields += [("WARC-Profile", _IDENTICAL), ("WARC-Payload-Digest", payload_digest)]
            else:
                payload_digest = None
                fields.append(("WARC-Profile", _NOT_MODIFIED))
            fields.append(("WARC-Refers-To-Target-URI", c.target_uri))
            block = hashlib.sha1(http)
        fields += [
            ("WARC-Block-Digest", _sha1_label(block)),
            ("Content-Type", "application/http; msgtype=response"),
            ("Content-Length", str(len(http) + len(payload))),
        ]
        request = _http_head("GET", f"{_request_target(c.target_uri)} HTTP/1.1", c.request_headers)
        request_fields = [
            ("WARC-Date", date),
            ("WARC-Record-ID", _record_id(self._ids)),
            ("WARC-Concurrent-To", record_id),
            ("WARC-Type", "request"),
            ("WARC-Target-URI", c.target_uri),
            ("WARC-Payload-Digest", _EMPTY_SHA1),
            ("WARC-Block-Digest", _sha1_label(hashlib.sha1(request))),
            ("Content-Type", "application/http; msgtype=request"),
            ("Content-Length", str(len(request))),
        ]
        level = self.compress_level
        members = [
            _gzip_member(_record(fields, http, payload), level),
            _gzip_member(_record(request_fields, request, b""), level),
        ]
        return members, payload_digest

    # -- start-up ----------------------------------------------------------------------------

    def owns(self, name: str, ends: Mapping[str, int]) -> bool:
        """Whether recovery may cut file ``name``: its store indexed records in it (``ends``),
        or its name is this writer's (this prefix, this host; rewritten copies included).
        Another writer's files in the same directory (another prefix or host) are not."""
        return name in ends or self._own_name.fullmatch(name) is not None

    def recover(self, ends: Mapping[str, int]) -> list[str]:
        """Check this writer's files before writing: cut a half-written record off the end of
        each (nothing indexed is ever cut), report those that do not read as WARC.

        ``ends`` is, per file, the end of its last indexed record (see
        :func:`refresher.store._captures.file_ends`). Only files this writer owns
        (:meth:`owns`) are looked at, and of those only the ones no live process holds open
        for appending (each writer locks its file): another daemon's files in a shared
        directory, or one it is appending to right now, are left as they are. Returns the
        corrupt files' names.
        """
        corrupt: list[str] = []
        foreign = busy = 0
        for path in sorted(self.directory.glob(f"*{WARC_SUFFIX}")):
            if not self.owns(path.name, ends):
                foreign += 1
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue  # pruned meanwhile
            try:
                if not _try_lock(fd):
                    busy += 1
                    continue
                if not self._recover_file(fd, path, ends.get(path.name, 0)):
                    corrupt.append(path.name)
            finally:
                os.close(fd)  # releases the lock
        if foreign or busy:
            log.info(
                "archive files of other writers left alone",
                directory=str(self.directory),
                other_writers=foreign,
                being_written=busy,
            )
        self._corrupt = len(corrupt)
        return corrupt

    def _recover_file(self, fd: int, path: Path, indexed: int) -> bool:
        """Cut a half-written tail off ``path`` (open as ``fd``, locked); False if corrupt."""
        size = os.fstat(fd).st_size
        if size < indexed:
            log.error(
                "archive file is shorter than its index says; its last records are lost",
                file=str(path),
                size=size,
                indexed=indexed,
            )
            return False
        good, error = scan_file(path, start=indexed)
        if error is not None and good == 0:
            log.error(
                "archive file is not WARC; skipped for reads, left in place",
                file=str(path),
                error=error,
                hint="move it out of archive.dir or delete it",
            )
            return False
        if good < size:
            os.ftruncate(fd, good)
            os.fsync(fd)
            self._tails += 1
            log.warning(
                "cut a half-written record off an archive file (a crash while writing)",
                file=str(path),
                cut_bytes=size - good,
            )
        return True


def held_files(directory: Path) -> set[str]:
    """The WARC files in ``directory`` a live process holds open for appending (its lock)."""
    held = set()
    for path in directory.glob(f"*{WARC_SUFFIX}"):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # gone meanwhile, or not ours to open: not being appended to by us
        try:
            if not _try_lock(fd):
                held.add(path.name)
        finally:
            os.close(fd)
    return held


def lock_for_writing(fd: int) -> None:
    """Mark ``fd``'s file as being written by this process until it is closed, so another
    writer's start-up recovery leaves it alone (an advisory ``flock``; a file system without
    locks is written to all the same). Called before the first byte is written; it waits
    while another process that just opened the new file checks it (:func:`held_files`, a
    recovery: an empty file, nothing to cut), so the lock is never skipped."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX)


def _try_lock(fd: int) -> bool:
    """Take ``fd``'s exclusive advisory lock without waiting; False if another open file holds
    it (True too where the file system has no locks: nothing could hold one)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return False
    return True


def scan_file(path: Path, *, start: int = 0) -> tuple[int, str | None]:
    """Check the gzip members of ``path`` from byte ``start`` (one per record, each with its
    CRC): the end of the last whole member, and what stopped the scan (None: the file is whole
    to its end). A member cut short by a crash is the usual stop."""
    good = pos = start
    member = zlib.decompressobj(zlib.MAX_WBITS | 16)
    started = False
    with path.open("rb") as f:
        f.seek(start)
        while chunk := f.read(1 << 20):
            buf = chunk
            while buf:
                try:
                    member.decompress(buf, 1 << 20)
                    while member.unconsumed_tail and not member.eof:
                        member.decompress(member.unconsumed_tail, 1 << 20)
                except zlib.error as e:
                    return good, f"not a gzip member at byte {good}: {e}"
                started = True
                if member.eof:
                    rest = member.unused_data
                    pos += len(buf) - len(rest)
                    good = pos
                    buf = rest
                    member = zlib.decompressobj(zlib.MAX_WBITS | 16)
                    started = False
                else:
                    pos += len(buf)
                    buf = b""
    if started:
        return good, f"the last record (from byte {good}) is cut short"
    return good, None


def first_record_end(path: Path) -> int:
    """Where the first record of ``path`` (its warcinfo) ends, in bytes."""
    with path.open("rb") as f:
        it = ArchiveIterator(f)
        for record in it:
            it.read_to_end(record)
            return int(it.get_record_offset() + it.get_record_length())
    return 0


def read_record(path: Path, offset: int) -> StoredRecord:
    """The record at ``offset`` of WARC file ``path``. Raises :class:`ArchiveError`."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            record = next(iter(ArchiveIterator(f)))
            body = record.raw_stream.read()
            http = record.http_headers
            rec = record.rec_headers
            date = rec.get_header("WARC-Date") or ""
            status = http.get_statuscode() if http is not None else None
            return StoredRecord(
                url=str(rec.get_header("WARC-Target-URI") or ""),
                captured_at=datetime.fromisoformat(date.replace("Z", "+00:00")).timestamp(),
                kind=str(record.rec_type),
                status=int(status) if status and status.isdigit() else None,
                headers=tuple(http.headers) if http is not None else (),
                body=body,
                truncated=rec.get_header("WARC-Truncated") is not None,
                payload_digest=rec.get_header("WARC-Payload-Digest"),
            )
    except FileNotFoundError as e:
        raise ArchiveError(
            f"the WARC file {str(path)!r} is missing; was it moved or pruned by hand?"
        ) from e
    except Exception as e:  # warcio, zlib, OS: a record that does not read
        raise ArchiveError(f"cannot read the record at {offset} of {str(path)!r}: {e}") from e


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no progress writing")
        view = view[n:]


def _media_type(headers: Sequence[tuple[str, str]]) -> str | None:
    for name, value in headers:
        if name.lower() == "content-type":
            return value.split(";")[0].strip().lower() or None
    return None


def _request_target(url: str) -> str:
    rest = url.split("://", 1)[-1]
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"
