"""Reading the copy back: the latest version, the one current at a time, CDXJ, export."""

from __future__ import annotations

import json

from refresher.archive._archive import Archive, cdxj_line, surt
from refresher.archive._export import export, html_text
from tests.archive.test_retention import archive_of


def test_get_returns_the_latest_version_or_the_one_current_at_a_time(tmp_path):
    db, _ = archive_of(tmp_path, {1: 3})
    archive = Archive(db)
    versions = archive.versions("http://a.example/1")
    assert len(versions) == 3 and versions[0].captured_at > versions[-1].captured_at
    latest = archive.get("http://a.example/1")
    assert latest is not None and b"version 2" in latest.body
    middle = archive.get("http://a.example/1", at=versions[1].captured_at + 0.5)
    assert middle is not None and b"version 1" in middle.body
    assert archive.get("http://a.example/1", at=versions[-1].captured_at - 1) is None
    assert archive.get("http://a.example/unknown") is None


def test_a_damaged_record_falls_back_to_the_previous_version(tmp_path):
    db, directory = archive_of(tmp_path, {1: 2})
    archive = Archive(db)
    newest = archive.versions("http://a.example/1")[0]
    path = directory / newest.file
    data = bytearray(path.read_bytes())
    data[newest.offset : newest.offset + 20] = b"\0" * 20
    path.write_bytes(bytes(data))
    v = archive.get("http://a.example/1")
    assert v is not None and b"version 0" in v.body


def test_surt_keys_sort_hosts_reversed_without_www_and_with_sorted_query():
    assert surt("http://www.Example.com/A?b=2&a=1") == "com,example)/a?a=1&b=2"
    assert surt("https://example.com:8443/") == "com,example:8443)/"
    assert surt("http://example.com") == "com,example)/"


def test_cdxj_lines_carry_what_pywb_reads(tmp_path):
    db, _ = archive_of(tmp_path, {1: 1})
    [response, revisit] = Archive(db).captures()
    key, stamp, body = cdxj_line(response).split(" ", 2)
    fields = json.loads(body)
    assert key == "example,a)/p" and len(stamp) == 14  # the URL fetched: WARC-Target-URI
    assert fields["mime"] == "text/html" and fields["status"] == "200"
    assert fields["filename"] == response.file and fields["offset"] == str(response.offset)
    assert json.loads(cdxj_line(revisit).split(" ", 2)[2])["mime"] == "warc/revisit"


def test_export_writes_the_latest_version_of_every_page_with_its_text(tmp_path):
    db, _ = archive_of(tmp_path, {1: 2, 2: 1})
    out = tmp_path / "pages.jsonl"
    assert export(Archive(db), out, format="jsonl", bodies=True) == 2
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["url"] for r in rows] == ["http://a.example/1", "http://a.example/2"]
    assert rows[0]["text"].startswith("page 1 version 1") and "body_base64" in rows[0]


def test_html_text_drops_scripts_and_collapses_whitespace():
    html = b"<html><head><script>x=1</script><style>p{}</style></head><body><p>a\n\n b</p></body>"
    assert html_text(html) == "a b"
