"""The archive end to end: a real daemon on the small simulated site, WARC files read back."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest
import trio

from refresher._config import load_config
from refresher.archive._archive import Archive
from refresher.archive._warc import read_record, scan_file
from refresher.ops._control import request
from refresher.sim._site import HostSpec, PageSpec, Site, serve_site
from tests.conftest import DEADLINE, acli, cli, daemon_config, query_db, wait_for

pytestmark = pytest.mark.slow


def sha1(data: bytes) -> bytes:
    """The change digest of a body: its SHA-1, as the record's WARC-Payload-Digest."""
    return hashlib.sha1(data).digest()


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
            assert sha1(record.body) == bytes(digest)
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


def indexed_records(db: Path) -> list[tuple[Any, ...]]:
    return query_db(db, "SELECT file, record_offset, kind, digest FROM warc_records")


async def test_after_kill_9_every_indexed_record_reads_and_a_half_written_tail_is_cut(
    site, short_dir, daemons
):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: d.acknowledged() >= 40, what="40 acknowledged fetches")
    d.signal(signal.SIGKILL)
    assert await d.wait_exit() == -signal.SIGKILL
    db = short_dir / "refresher.duckdb"
    directory = short_dir / "archive"
    rows = indexed_records(db)
    assert rows
    for file, offset, _kind, _digest in rows:
        read_record(directory / file, offset)
    # A crash in the middle of a record: half of a real record after the last one.
    newest = max(directory.glob("*.warc.gz"))
    data = newest.read_bytes()
    offset, length = query_db(
        db,
        "SELECT record_offset, record_length FROM warc_records WHERE file = ?"
        " ORDER BY record_offset DESC LIMIT 1".replace("?", f"'{newest.name}'"),
    )[0]
    size = len(data)
    with newest.open("ab") as f:
        f.write(data[offset : offset + length // 2])
    again = daemons(config)
    await again.ready()
    cut = again.event("cut a half-written record off an archive file (a crash while writing)")
    assert cut is not None and cut["file"] == str(newest), again.output()[-3000:]
    assert newest.stat().st_size == size and scan_file(newest)[1] is None
    await wait_for(lambda: again.acknowledged() >= 10, what="fetching after the restart")
    again.signal(signal.SIGTERM)
    assert await again.wait_exit() == 0
    for file, offset, kind, digest in indexed_records(db):
        record = read_record(directory / file, offset)
        if kind == "response":
            assert sha1(record.body) == bytes(digest)


async def test_get_cdx_and_export_work_while_the_daemon_runs(site, short_dir, daemons):
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls(), snapshot={"interval": 0.5})
    d = daemons(config)
    await d.ready()
    url = s.urls()[1]

    async def got() -> subprocess.CompletedProcess[str] | None:
        r = await acli("get", "--config", str(config), url, "--headers")
        return r if r.returncode == 0 else None

    # each try starts a process: generous on a loaded machine
    result = await wait_for(got, timeout=3 * DEADLINE, what="refresher get of a fetched page")
    assert result.stdout.startswith("HTTP 200"), result.stdout[:500]
    assert "<html" in result.stdout.lower()
    cdx = await acli("cdx", "--config", str(config))
    assert cdx.returncode == 0, cdx.stderr
    lines = cdx.stdout.splitlines()
    assert lines and all(line.startswith("test,sim,") for line in lines), cdx.stdout[:2000]
    fields = json.loads(lines[0].split(" ", 2)[2])
    assert {"url", "mime", "status", "digest", "offset", "length", "filename"} <= fields.keys()
    out = short_dir / "latest.parquet"
    exported = await acli(
        "export", "--config", str(config), "--format", "parquet", "--output", str(out)
    )
    assert exported.returncode == 0, exported.stderr
    rows = duckdb.sql(f"SELECT count(*), count(text) FROM read_parquet('{out}')").fetchall()
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    assert rows[0][0] > 0 and rows[0][1] > 0
    missing = cli("get", "--config", str(config), "http://a.sim.test/nowhere")
    assert missing.returncode == 1 and "no archived version" in missing.stderr


async def stalled_server(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accepts connections and never answers: a webhook receiver that hangs."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def hang(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    await trio.serve_listeners(hang, listeners)


async def test_the_change_feed_gets_every_change_and_a_hung_webhook_only_drops(
    site, short_dir, daemons, nursery
):
    s, port = site
    hook = await nursery.start(stalled_server)
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        sinks={
            "names": ["jsonl", "webhook"],
            "queue": 2,
            "webhook_url": f"http://127.0.0.1:{hook}/hook",
            "webhook_timeout": 600.0,
        },
    )
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: d.acknowledged() >= 60, what="60 acknowledged fetches")
    status = await trio.to_thread.run_sync(
        request, load_config(config).control_socket, {"op": "status"}
    )
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    sinks = status["sinks"]
    assert sinks["dropped"]["webhook"] > 0 and sinks["dropped"]["jsonl"] == 0
    db = short_dir / "refresher.duckdb"
    responses = query_db(db, "SELECT url, digest FROM warc_records WHERE kind = 'response'")
    lines = [json.loads(x) for x in (short_dir / "changes.jsonl").read_text().splitlines()]
    assert sorted((x["url"], x["digest"]) for x in lines) == sorted(
        (u, bytes(dg).hex()) for u, dg in responses
    )


async def test_the_daemon_prunes_old_versions_periodically_and_every_page_keeps_its_latest(
    site, short_dir, daemons
):
    s, port = site
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        archive={"keep_versions": 1, "prune_interval": 1.0, "revisits": False},
        snapshot={"interval": 0.5},
    )
    d = daemons(config)
    await d.ready()
    await wait_for(lambda: d.event("archive pruned"), what="a retention pass")
    pruned = d.event("archive pruned")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    assert pruned is not None and pruned["records"] > 0
    db = short_dir / "refresher.duckdb"
    directory = short_dir / "archive"
    for file, offset, kind, digest in indexed_records(db):
        record = read_record(directory / file, offset)
        assert kind == "response" and sha1(record.body) == bytes(digest)
    archived = {r[0] for r in query_db(db, "SELECT url FROM warc_records")}
    ok_pages = {r[0] for r in query_db(db, "SELECT url FROM pages WHERE digest IS NOT NULL")}
    assert ok_pages <= archived  # every page with a copy still has its latest version


async def test_a_store_whose_digests_an_older_refresher_wrote_sees_no_page_change_once(
    nursery, short_dir, daemons
):
    # static pages answered in full every time (no validators: no 304 to hide a change)
    pages = tuple(PageSpec(path=f"/p{i}") for i in range(4))
    s = Site([HostSpec(name="b.sim.test", pages=pages, validators="none")])
    port = await nursery.start(serve_site, s)
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    db = short_dir / "refresher.duckdb"
    first = daemons(config)
    await first.ready()
    await wait_for(lambda: first.acknowledged() >= 8, what="every page fetched twice")
    first.signal(signal.SIGTERM)
    assert await first.wait_exit() == 0
    # The file as an older refresher left it: each page's digest the BLAKE2b-128 of its body.
    bodies = {
        url: read_record(short_dir / "archive" / file, offset).body
        for url, file, offset in query_db(
            db, "SELECT url, file, record_offset FROM warc_records WHERE kind = 'response'"
        )
    }
    assert len(bodies) == len(pages)
    con = duckdb.connect(str(db))
    try:
        for url, body in bodies.items():
            older = hashlib.blake2b(body, digest_size=16).digest()
            con.execute("UPDATE pages SET digest = ? WHERE url = ?", [older, url])
        done = con.execute("SELECT max(id), (SELECT max(id) FROM warc_records) FROM fetches")
        last_fetch, last_record = done.fetchall()[0]
    finally:
        con.close()
    again = daemons(config)
    await again.ready()
    await wait_for(lambda: again.acknowledged() >= 8, what="every page fetched twice more")
    again.signal(signal.SIGTERM)
    assert await again.wait_exit() == 0
    after = query_db(
        db, f"SELECT count(*), count(*) FILTER (changed) FROM fetches WHERE id > {last_fetch}"
    )
    assert after[0][0] >= 8 and after[0][1] == 0
    kinds = query_db(db, f"SELECT DISTINCT kind FROM warc_records WHERE id > {last_record}")
    assert kinds == [("revisit",)]
    digests = query_db(db, "SELECT url, digest FROM pages")
    assert {u: bytes(d) for u, d in digests} == {u: sha1(b) for u, b in bodies.items()}
