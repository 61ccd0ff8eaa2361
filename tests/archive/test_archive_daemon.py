"""The archive end to end: a real daemon on the small simulated site, WARC files read back."""

from __future__ import annotations

import hashlib
import signal

from refresher.archive._archive import Archive
from refresher.archive._warc import read_record, scan_file
from tests.conftest import daemon_config, query_db, wait_for


def blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


async def test_every_archived_record_reads_back_with_the_historys_digest(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: d.acknowledged() >= 60, what="60 acknowledged fetches")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    db = short_dir / "refresher.duckdb"
    rows = query_db(
        db, "SELECT url, kind, digest, file, record_offset, status FROM warc_records ORDER BY id"
    )
    responses = [r for r in rows if r[1] == "response"]
    assert responses and any(r[1] == "revisit" for r in rows)
    history = query_db(db, "SELECT digest FROM fetches WHERE digest NOT NULL")
    digests = {bytes(r[0]) for r in history}
    directory = short_dir / "archive"
    for _url, kind, digest, file, offset, status in rows:
        record = read_record(directory / file, offset)
        assert record.status == status
        if kind == "response":
            assert blake(record.body) == bytes(digest)
            assert bytes(digest) in digests
    # one response per new body of a page: the first fetch and each change
    new_bodies = query_db(
        db,
        "SELECT count(*) FROM (SELECT page_id, digest, lag(digest) OVER "
        "(PARTITION BY page_id ORDER BY id) AS before FROM fetches WHERE digest NOT NULL) "
        "WHERE before IS NULL OR before <> digest",
    )[0][0]
    assert len(responses) == new_bodies
    # every file reads to its end
    for path in directory.glob("*.warc.gz"):
        assert scan_file(path)[1] is None
    latest = Archive(db).get(s.urls()[0])
    assert latest is not None and latest.status == 200 and latest.body
