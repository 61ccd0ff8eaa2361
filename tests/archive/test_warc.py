"""The WARC writer and reader: records as warcio reads them, truncation, disk full, recovery."""

from __future__ import annotations

import base64
import hashlib
import uuid
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

from refresher.archive import _warc as warc
from refresher.archive._keep import capture_of
from refresher.archive._warc import Capture, WarcWriter, read_record, scan_file
from refresher.crawl._fetch import FetchResult, body_digest

#: the fetch's change digest (the payload's SHA-1, which the writer reuses)
sha1 = body_digest


def blake2b(data: bytes) -> bytes:
    """The change digest an older refresher stored (BLAKE2b-128)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def result(status: int = 200, body: bytes | None = b"<html>hi</html>", **fields: object):
    base = dict(
        url="http://a.example/p",
        final_url="http://a.example/p",
        status=status,
        started_at=1_700_000_000.0,
        finished_at=1_700_000_000.5,
        duration=0.5,
        bytes=len(body or b""),
        digest=sha1(body) if body is not None and 200 <= status < 300 else None,
        body=body,
        content_type="text/html",
        etag=None,
        last_modified=None,
        not_modified=status == 304,
        headers=(("Content-Type", "text/html"), ("Content-Encoding", "gzip")),
        http_version="HTTP/1.1",
        reason="OK",
        payload=body,
    )
    base.update(fields)
    return FetchResult(**base)  # type: ignore[arg-type]


def capture(r: FetchResult, previous: bytes | None = None, revisits: bool = True):
    return capture_of(
        page_id=1,
        url="http://a.example/p",
        result=r,
        previous_digest=previous,
        etag='"v1"' if previous else None,
        last_modified=None,
        user_agent="test/1",
        revisits=revisits,
    )


def test_a_new_body_is_a_response_and_the_same_body_or_a_304_a_revisit_or_nothing():
    first = result()
    assert capture(first).kind == "response"
    assert capture(first, previous=b"other").kind == "response"
    assert capture(first, previous=first.digest).kind == "revisit"
    assert capture(result(304, None), previous=b"x").kind == "revisit"
    assert capture(first, previous=first.digest, revisits=False) is None
    assert capture(result(304, None), previous=b"x", revisits=False) is None
    assert capture(result(404, None)) is None


def test_a_body_that_is_not_html_is_archived_too():
    pdf = result(body=b"%PDF-1.4 ...", headers=(("Content-Type", "application/pdf"),))
    c = capture(pdf)
    assert c is not None and c.kind == "response" and c.payload == b"%PDF-1.4 ..."


def write(tmp: Path, captures: list[Capture], **kw: object) -> tuple[WarcWriter, list]:
    w = WarcWriter(tmp, min_free_bytes=0, **kw)  # type: ignore[arg-type]
    rows = [w.write(c) for c in captures]
    synced = w.sync([r for r in rows if r is not None])
    return w, synced


def test_records_read_back_through_warcio_with_payload_and_request(tmp_path):
    c = capture(result(body=b"<html>" + b"x" * 5000 + b"</html>"))
    w, rows = write(tmp_path, [c])
    w.close()
    [row] = rows
    record = read_record(tmp_path / row.file, row.offset)
    assert record.body == c.payload and sha1(record.body) == c.digest
    assert record.status == 200 and not record.truncated
    # the decoded payload is stored: the transfer encoding is kept under another name
    names = [k for k, _ in record.headers]
    assert "X-Archive-Orig-Content-Encoding" in names and "Content-Encoding" not in names
    with (tmp_path / row.file).open("rb") as f:
        kinds = [(r.rec_type, r.rec_headers.protocol) for r in ArchiveIterator(f)]
    assert kinds == [
        ("warcinfo", "WARC/1.1"),
        ("response", "WARC/1.1"),
        ("request", "WARC/1.1"),
    ]
    assert row.payload_digest.startswith("sha1:")


def test_a_body_cut_at_the_cap_is_marked_warc_truncated(tmp_path):
    cut = result(body=b"<html>" + b"y" * 100, truncated=True, digest=None, error_kind="too_large")
    c = capture(cut)
    assert c is not None and c.truncated
    _, [row] = write(tmp_path, [c])
    assert row.truncated
    with (tmp_path / row.file).open("rb") as f:
        f.seek(row.offset)
        record = next(iter(ArchiveIterator(f)))
        assert record.rec_headers.get_header("WARC-Truncated") == "length"


def test_a_revisit_after_a_304_has_no_payload_and_names_its_profile(tmp_path):
    c = capture(result(304, None, reason="Not Modified"), previous=b"x")
    _, [row] = write(tmp_path, [c])
    with (tmp_path / row.file).open("rb") as f:
        f.seek(row.offset)
        record = next(iter(ArchiveIterator(f)))
        assert record.rec_type == "revisit"
        assert record.rec_headers.get_header("WARC-Profile").endswith("server-not-modified")


def test_files_rotate_past_the_size_limit(tmp_path):
    cs = [capture(result(body=bytes([i]) * 3000)) for i in range(5)]
    _, rows = write(tmp_path, cs, max_file_bytes=500, compress_level=1)
    assert len({r.file for r in rows}) == 5 and len(rows) == 5
    for r in rows:
        assert read_record(tmp_path / r.file, r.offset).body == bytes([rows.index(r)]) * 3000


def test_a_full_disk_stops_archiving_with_a_metric_and_it_resumes_when_space_returns(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=1 << 62)  # more than any disk has
    c = capture(result())
    assert w.write(c) is None
    stats = w.statistics()
    assert stats.failing and stats.failures == 1 and stats.skipped == 1
    assert w.write(c) is None and w.statistics().failures == 1  # one failure, not one per fetch
    w.min_free_bytes = 0  # the space is back
    row = w.write(c)
    assert row is not None and not w.statistics().failing
    assert w.sync([row]) == [row]


def test_only_synced_records_are_indexed(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=0)
    row = w.write(capture(result()))
    assert row is not None
    assert w.sync([row]) == [row]
    ghost = row.__class__(**{**{f: getattr(row, f) for f in row.__slots__}, "offset": 10**9})
    assert w.sync([ghost]) == []


def test_recovery_cuts_a_half_written_record_and_keeps_every_whole_one(tmp_path):
    cs = [capture(result(body=bytes([65 + i]) * 2000)) for i in range(3)]
    w, rows = write(tmp_path, cs)
    w.close()
    path = tmp_path / rows[0].file
    whole = path.read_bytes()
    last = rows[-1]
    with path.open("ab") as f:
        f.write(whole[last.offset : last.offset + last.length // 2])
    assert scan_file(path)[1] is not None
    again = WarcWriter(tmp_path, min_free_bytes=0)
    assert again.recover({path.name: rows[1].offset + rows[1].span}) == []
    assert path.read_bytes() == whole
    assert again.statistics().truncated_tails == 1
    for r in rows:
        read_record(path, r.offset)


def test_a_file_that_is_not_warc_is_reported_by_name_and_left_in_place(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=0)
    bad = tmp_path / f"refresher-{'0' * 17}-00001-1~{w._host}.warc.gz"  # one of its own names
    bad.write_bytes(b"this is not gzip")
    assert w.recover({}) == [bad.name]
    assert bad.exists() and w.statistics().corrupt_files == 1


def test_a_file_is_settled_for_retention_once_closed_and_every_row_synced(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=0)
    row = w.write(capture(result()))
    assert row is not None and w.unsettled() == {row.file}
    w.rotate()
    assert w.unsettled() == {row.file}  # closed, but its index row is not committed yet
    w.sync([row])
    assert w.unsettled() == set() and w.current_file is None
    later = w.write(capture(result(body=b"<p>2</p>")))
    assert later is not None and later.file != row.file and w.unsettled() == {later.file}


def test_a_batch_is_appended_in_one_go_and_each_record_reads_back_at_its_own_offset(tmp_path):
    new = capture(result(body=b"<p>new</p>"))
    same = capture(result(body=b"<p>same</p>"), previous=sha1(b"<p>same</p>"))
    not_modified = capture(result(304, None, reason="Not Modified"), previous=b"x")
    w = WarcWriter(tmp_path, min_free_bytes=0)
    rows = w.write_batch([new, same, not_modified])
    assert [r.kind for r in rows] == ["response", "revisit", "revisit"]
    # one after another, each with its request record, nothing between them
    assert [rows[i].offset + rows[i].span for i in range(2)] == [r.offset for r in rows[1:]]
    assert read_record(tmp_path / rows[0].file, rows[0].offset).body == b"<p>new</p>"
    assert read_record(tmp_path / rows[1].file, rows[1].offset).payload_digest is not None
    assert read_record(tmp_path / rows[2].file, rows[2].offset).status == 304
    assert w.unsettled() == {rows[0].file}  # still being written, but every row is settled
    w.rotate()
    assert w.unsettled() == set()
    with (tmp_path / rows[0].file).open("rb") as f:
        kinds = [r.rec_type for r in ArchiveIterator(f)]
    assert kinds == ["warcinfo", "response", "request", "revisit", "request", "revisit", "request"]
    stats = w.statistics()
    assert (stats.responses, stats.revisits, stats.skipped) == (1, 2, 0)


def test_a_batch_the_disk_has_no_room_for_is_skipped_whole_and_counted(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=1 << 62)
    assert w.write_batch([capture(result()), capture(result(body=b"<p>2</p>"))]) == []
    stats = w.statistics()
    assert stats.failing and stats.skipped == 2 and w.unsettled() == set()


def test_record_ids_are_distinct_version_4_uuid_urns_as_warcio_makes_them(tmp_path):
    w = WarcWriter(tmp_path, min_free_bytes=0)
    rows = w.write_batch([capture(result(body=bytes([i]) * 10)) for i in range(50)])
    with (tmp_path / rows[0].file).open("rb") as f:
        ids = [r.rec_headers.get_header("WARC-Record-ID") for r in ArchiveIterator(f)]
    assert len(ids) == 101 and len(set(ids)) == 101  # warcinfo + 50 × (response, request)
    for urn in ids:
        assert urn.startswith("<urn:uuid:") and urn.endswith(">")
        u = uuid.UUID(urn[len("<urn:uuid:") : -1])
        assert u.version == 4 and u.variant == uuid.RFC_4122


def test_recovery_leaves_alone_the_file_another_live_writer_is_appending_to(tmp_path, monkeypatch):
    # Two daemons with the same prefix on one host share the directory: the second starts
    # while the first is in the middle of appending a batch.
    first = WarcWriter(tmp_path, min_free_bytes=0)
    [kept] = first.write_batch([capture(result(body=b"<p>one</p>" * 300))])
    second = WarcWriter(tmp_path, min_free_bytes=0)
    write_all = warc._write_all

    def halfway(fd: int, data: bytes) -> None:
        write_all(fd, data[: len(data) // 2])
        assert second.recover({}) == []
        write_all(fd, data[len(data) // 2 :])

    monkeypatch.setattr(warc, "_write_all", halfway)
    rows = first.write_batch([capture(result(body=b"<p>two</p>" * 300))])
    monkeypatch.setattr(warc, "_write_all", write_all)
    assert len(rows) == 1 and second.statistics().truncated_tails == 0
    path = tmp_path / kept.file
    assert scan_file(path) == (path.stat().st_size, None)
    assert read_record(path, rows[0].offset).body == b"<p>two</p>" * 300
    assert read_record(path, kept.offset).body == b"<p>one</p>" * 300


def test_recovery_never_touches_a_file_of_another_prefix_and_the_owner_cuts_its_own(tmp_path):
    other, [row] = write(tmp_path, [capture(result(body=b"A" * 4000))], prefix="node_a")
    other.close()
    path = tmp_path / row.file
    whole = path.read_bytes()
    with path.open("ab") as f:  # node_a died in the middle of its next record
        f.write(whole[row.offset : row.offset + row.length // 2])
    torn = path.read_bytes()
    b = WarcWriter(tmp_path, prefix="node_b", min_free_bytes=0)
    assert b.recover({}) == [] and path.read_bytes() == torn
    assert b.statistics().truncated_tails == 0
    a = WarcWriter(tmp_path, prefix="node_a", min_free_bytes=0)
    assert a.recover({}) == [] and path.read_bytes() == whole
    assert a.statistics().truncated_tails == 1


def test_recovery_cuts_a_file_its_store_indexed_under_an_earlier_prefix(tmp_path):
    old, [row] = write(tmp_path, [capture(result(body=b"B" * 4000))], prefix="before")
    old.close()
    path = tmp_path / row.file
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(whole[row.offset : row.offset + row.length // 2])
    renamed = WarcWriter(tmp_path, prefix="after", min_free_bytes=0)
    assert renamed.recover({row.file: row.offset + row.span}) == []
    assert path.read_bytes() == whole


def warcio_records(c: Capture, ids: list[str]) -> list[bytes]:
    """The records of ``c`` as warcio's own writer builds them (the writer's way before it
    built them itself), uncompressed; the record IDs taken from ``ids`` in order."""
    import io

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    w = WARCWriter(io.BytesIO(), gzip=False, warc_version="1.1")
    http = StatusAndHeaders(
        f"{c.status} {c.reason or ''}".strip(), warc._stored_headers(c), c.http_version
    )
    fields = {"WARC-Date": warc._warc_date(c.fetched_at), "WARC-Record-ID": ids[0]}
    if c.truncated:
        fields["WARC-Truncated"] = "length"
    if c.kind == "response":
        payload = c.payload or b""
        record = w.create_warc_record(
            c.target_uri,
            "response",
            payload=io.BytesIO(payload),
            length=len(payload),
            http_headers=http,
            warc_headers_dict=fields,
        )
    else:
        record = w.create_warc_record(
            c.target_uri, "revisit", http_headers=http, warc_headers_dict=fields
        )
        if c.payload is not None:
            sha1 = w._create_digester()
            sha1.update(c.payload)
            record.rec_headers.add_header("WARC-Profile", warc._IDENTICAL)
            record.rec_headers.add_header("WARC-Payload-Digest", str(sha1))
        else:
            record.rec_headers.add_header("WARC-Profile", warc._NOT_MODIFIED)
        record.rec_headers.add_header("WARC-Refers-To-Target-URI", c.target_uri)
    request = w.create_warc_record(
        c.target_uri,
        "request",
        http_headers=StatusAndHeaders(
            f"GET {warc._request_target(c.target_uri)} HTTP/1.1",
            list(c.request_headers),
            is_http_request=True,
        ),
        warc_headers_dict={
            "WARC-Date": fields["WARC-Date"],
            "WARC-Record-ID": ids[1],
            "WARC-Concurrent-To": ids[0],
        },
    )
    out = []
    for r in (record, request):
        w.out = io.BytesIO()
        w.write_record(r)
        out.append(w.out.getvalue())
    return out


def test_each_record_is_the_one_warcio_writes_byte_for_byte(tmp_path):
    import dataclasses
    import random
    import zlib

    same = b"<p>same</p>"
    non_ascii = (("Content-Type", "text/html"), ("Content-Disposition", 'inline; name="café"'))
    cases = [
        capture(result(body=b"<html>" + bytes(range(256)) * 40 + b"</html>")),
        capture(result(body=same), previous=sha1(same)),
        capture(result(304, None, reason="Not Modified"), previous=b"x"),
        capture(result(body=b"<p>cut", truncated=True, digest=None, error_kind="too_large")),
        capture(result(body=b"", reason=None, http_version="HTTP/1.0")),
        capture(result(body=b"<p>x</p>", headers=non_ascii)),
        dataclasses.replace(
            capture(result(body=b"<p>q</p>")), target_uri="http://a.example/p?q=1&r=%C3%A9"
        ),
        dataclasses.replace(capture(result(body=b"<p>h</p>")), target_uri="http://a.example"),
    ]
    w = WarcWriter(tmp_path, min_free_bytes=0)
    for c in cases:
        w._ids = random.Random(7)
        members, digest = w._serialize(c)
        w._ids = random.Random(7)
        ids = [warc._record_id(w._ids) for _ in range(2)]
        ours = [zlib.decompress(m, zlib.MAX_WBITS | 16) for m in members]
        assert ours == warcio_records(c, ids), c
        theirs = warcio_records(c, ids)[0]
        want = next(
            (
                ln.split(b": ", 1)[1].decode()
                for ln in theirs.split(b"\r\n")
                if ln.startswith(b"WARC-Payload-Digest: ")
            ),
            None,
        )
        assert digest == want


def test_records_read_back_with_their_digests_checked_by_warcio(tmp_path):
    body = b"<html>" + b"z" * 70_000 + b"</html>"
    same = b"<p>same</p>"
    w = WarcWriter(tmp_path, min_free_bytes=0)
    rows = w.write_batch(
        [
            capture(result(body=body)),
            capture(result(body=same), previous=sha1(same)),
            capture(result(304, None, reason="Not Modified"), previous=b"x"),
        ]
    )
    w.close()
    with (tmp_path / rows[0].file).open("rb") as f:
        it = ArchiveIterator(f, check_digests="raise")
        kinds = []
        for r in it:
            r.content_stream().read()
            kinds.append(r.rec_type)
    assert kinds == ["warcinfo", "response", "request", "revisit", "request", "revisit", "request"]
    assert (
        rows[0].payload_digest == "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()
    )


def test_a_capture_whose_digest_is_of_another_kind_gets_its_payloads_sha1_all_the_same(tmp_path):
    body = b"<p>older</p>"
    w = WarcWriter(tmp_path, min_free_bytes=0)
    [row] = w.write_batch([capture(result(body=body, digest=blake2b(body)))])
    w.close()
    want = "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode()
    assert row.payload_digest == want
    with (tmp_path / row.file).open("rb") as f:
        for r in ArchiveIterator(f, check_digests="raise"):
            r.content_stream().read()


def test_a_reason_phrase_in_latin_1_is_archived_percent_encoded_and_the_batch_goes_on(tmp_path):
    odd = capture(result(body=b"<p>odd</p>", reason="\xe9t\xe9"))
    plain = capture(result(body=b"<p>plain</p>"))
    w = WarcWriter(tmp_path, min_free_bytes=0)
    rows = w.write_batch([odd, plain])
    assert len(rows) == 2
    with (tmp_path / rows[0].file).open("rb") as f:
        f.seek(rows[0].offset)
        record = next(iter(ArchiveIterator(f)))
        assert record.http_headers.statusline == "200 %C3%A9t%C3%A9"
    assert read_record(tmp_path / rows[1].file, rows[1].offset).body == b"<p>plain</p>"
