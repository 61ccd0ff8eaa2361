"""Retention: old versions go, the latest version of every page always stays readable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb

from refresher.archive._archive import Archive
from refresher.archive._retention import HistoryRetention, prune_now
from refresher.archive._warc import WarcWriter, scan_file
from refresher.store import DuckDBStore, NewPage
from tests.archive.test_warc import capture, result
from tests.conftest import cli, fetch_record, query_db, write_config


def archive_of(tmp: Path, versions: dict[int, int]) -> tuple[Path, Path]:
    """A store and archive: ``versions[page]`` responses per page, a revisit after each."""
    db, directory = tmp / "refresher.duckdb", tmp / "archive"
    store = DuckDBStore(db)
    writer = WarcWriter(directory, min_free_bytes=0, max_file_bytes=6000)
    t = 1_700_000_000.0
    rows = []
    for v in range(max(versions.values())):
        for page, n in versions.items():
            if v >= n:
                continue
            t += 1
            body = f"<html>page {page} version {v}</html>".encode() * 20
            r = result(body=body, finished_at=t)
            c = dataclasses.replace(capture(r), page_id=page, url=f"http://a.example/{page}")
            rows.append(writer.write(c))
            same = dataclasses.replace(capture(r, previous=r.digest), page_id=page)
            rows.append(writer.write(dataclasses.replace(same, url=f"http://a.example/{page}")))
    store.write([], [], (), writer.sync(rows))
    store.set_meta("archive_dir", str(directory))
    writer.close()
    store.close()
    return db, directory


def latest_bodies(db: Path) -> dict[str, bytes]:
    archive = Archive(db)
    urls = {c.url for c in archive.captures()}
    return {u: v.body for u in sorted(urls) if (v := archive.get(u)) is not None}


def test_keep_versions_drops_older_versions_and_keeps_the_latest_of_every_page(tmp_path):
    db, directory = archive_of(tmp_path, {1: 4, 2: 1, 3: 3})
    before = latest_bodies(db)
    assert len(before) == 3
    store = DuckDBStore(db)
    report = prune_now(store, directory, keep_versions=1, max_bytes=None)
    store.close()
    # 3 + 2 old versions of pages 1 and 3, and the revisit after each of them
    assert report.records == 2 * (3 + 2)
    assert report.bytes_freed > 0 and (report.deleted or report.rewritten)
    assert latest_bodies(db) == before
    per_page = query_db(
        db, "SELECT url, count(*) FROM warc_records WHERE kind = 'response' GROUP BY url"
    )
    assert {n for _, n in per_page} == {1}
    for path in directory.glob("*.warc.gz"):
        assert scan_file(path)[1] is None
    for name in report.deleted:
        assert not (directory / name).exists()


def test_max_bytes_removes_the_oldest_first_but_never_a_pages_latest_version(tmp_path):
    db, directory = archive_of(tmp_path, {1: 5, 2: 5})
    before = latest_bodies(db)
    store = DuckDBStore(db)
    report = prune_now(store, directory, keep_versions=None, max_bytes=1)
    store.close()
    assert report.records > 0
    assert latest_bodies(db) == before
    left = query_db(db, "SELECT kind, count(*) FROM warc_records GROUP BY kind")
    assert dict(left) == {"response": 2}


def test_refresher_prune_reports_what_it_removed(tmp_path):
    db, directory = archive_of(tmp_path, {1: 3})
    config = write_config(
        tmp_path / "refresher.toml",
        {"store": {"path": str(db)}, "archive": {"dir": str(directory), "keep_versions": 2}},
    )
    dry = cli("prune", "--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert '"records": 2' in dry.stdout
    assert query_db(db, "SELECT count(*) FROM warc_records")[0][0] == 6
    done = cli("prune", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert query_db(db, "SELECT count(*) FROM warc_records")[0][0] == 4


def test_history_retention_exports_then_deletes_old_fetches_but_keeps_each_pages_latest(tmp_path):
    db = tmp_path / "refresher.duckdb"
    store = DuckDBStore(db)
    pages = store.add_pages(
        [NewPage(url=f"http://a.example/{i}", host="a.example", scheme="http") for i in range(3)],
        now=1000.0,
    )
    records = [fetch_record(p.id, p.host_id, 1000.0 + 10 * k) for p in pages for k in range(10)]
    store.write(records, [])
    retention = HistoryRetention(seconds=50.0, keep_per_page=4, export_dir=tmp_path / "old")
    # now = 1100: fetches before 1050 go, but each page keeps its latest 4 (t = 1060 … 1090)
    n, path = retention.apply(store, 1100.0)
    store.close()
    assert n == 3 * 5  # t = 1000 … 1040 of each page
    assert path is not None and Path(path).exists()
    exported = duckdb.sql(f"SELECT count(*), max(finished_at) FROM read_parquet('{path}')")
    assert exported.fetchall() == [(15, 1040.0)]
    left = query_db(db, "SELECT page_id, count(*), min(finished_at) FROM fetches GROUP BY ALL")
    assert sorted((c, t) for _, c, t in left) == [(5, 1050.0)] * 3


def test_history_retention_never_drops_below_what_the_estimator_reads(tmp_path):
    db = tmp_path / "refresher.duckdb"
    store = DuckDBStore(db)
    [page] = store.add_pages(
        [NewPage(url="http://a.example/", host="a.example", scheme="http")], now=0.0
    )
    store.write([fetch_record(page.id, page.host_id, float(t)) for t in range(1, 7)], [])
    n, path = HistoryRetention(seconds=1.0, keep_per_page=32).apply(store, 1e9)
    store.close()
    assert (n, path) == (0, None)
    assert query_db(db, "SELECT count(*) FROM fetches")[0][0] == 6
