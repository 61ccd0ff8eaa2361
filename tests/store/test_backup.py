"""``refresher backup``: a consistent copy made while the daemon runs, restored and used."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import DaemonProcess, acli, cli, daemon_config, query_db, wait_for

from refresher._errors import StoreError
from refresher.store import DuckDBStore, NewPage
from refresher.store._backup import backup_file


def test_a_stopped_store_is_copied_whole_and_an_existing_destination_is_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.duckdb"
    store = DuckDBStore(db)
    store.add_pages(
        [NewPage(url=f"http://a.test/{i}", host="a.test", scheme="http") for i in range(3)],
        now=time.time(),
    )
    store.close()
    result = backup_file(db, tmp_path / "b.duckdb")
    assert (result.pages, result.fetches) == (3, 0)
    assert query_db(tmp_path / "b.duckdb", "SELECT count(*) FROM pages") == [(3,)]
    with pytest.raises(StoreError, match="exists"):
        backup_file(db, tmp_path / "b.duckdb")
    assert not (tmp_path / "b.duckdb.tmp").exists()


@pytest.mark.slow
async def test_a_backup_taken_while_the_daemon_runs_restores_to_a_working_store(
    site, short_dir, daemons
) -> None:
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d: DaemonProcess = daemons(config)
    await d.ready()
    await wait_for(lambda: d.acknowledged() >= 10, what="ten fetches acknowledged")
    acknowledged = d.acknowledged()
    dest = short_dir / "backup.duckdb"
    # in a thread: the site is served by this event loop, and must keep answering
    done = await acli("backup", str(dest), "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "running daemon" in done.stdout
    # a consistent copy: every fetch acknowledged before is in it, and the daemon goes on
    backed_up = query_db(dest, "SELECT count(*) FROM fetches")[0][0]
    assert backed_up >= acknowledged
    assert query_db(dest, "SELECT count(*) FROM fetch_log")[0][0] == backed_up
    await wait_for(lambda: d.acknowledged() > backed_up, what="fetching after the backup")
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    # restore: the backup becomes the store, and a daemon runs on it
    store = short_dir / "refresher.duckdb"
    store.unlink()
    shutil.copyfile(dest, store)
    status = cli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["fetches"] == backed_up
    again = daemons(config)
    await again.ready()
    await wait_for(lambda: again.acknowledged() >= 1, what="a fetch on the restored store")
    again.signal(signal.SIGTERM)
    assert await again.wait_exit() == 0
    assert query_db(store, "SELECT count(*) FROM fetches")[0][0] > backed_up
