"""The operator's commands on a stopped store and a running daemon: status, policy, pause."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import DaemonProcess, cli, daemon_config

from refresher.ops._cli import main
from refresher.store import DuckDBStore, NewPage


def _store_with_hosts(path: Path, names: list[str]) -> None:
    store = DuckDBStore(path)
    try:
        store.add_pages(
            [NewPage(url=f"http://{n}/", host=n, scheme="http", source="seed") for n in names],
            now=time.time(),
        )
    finally:
        store.close()


@pytest.mark.parametrize("command", [["status"], ["policy"], ["pause", "a.test"]])
def test_a_read_command_without_a_store_says_so_with_a_hint_and_creates_nothing(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "none.duckdb"
    assert main([*command, "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"refresher {command[0]}: no daemon runs and there is no store at ")
    assert "--store" in err and "--config" in err
    assert list(tmp_path.iterdir()) == []


def test_status_on_a_stopped_store_lists_the_paused_hosts_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.duckdb"
    _store_with_hosts(db, ["a.test", "b.test", "c.test"])
    assert main(["pause", "b.test", "--store", str(db)]) == 0
    capsys.readouterr()
    assert main(["status", "--store", str(db), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [h["host"] for h in answer["host_list"]] == ["b.test", "a.test", "c.test"]
    assert answer["host_list"][0]["paused"] is True
    assert main(["status", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "b.test" in out and "paused" in out


def test_the_host_list_keeps_paused_hosts_beyond_the_busiest(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    _store_with_hosts(db, [f"h{i}.test" for i in range(5)])
    store = DuckDBStore(db)
    try:
        store.set_paused("h4.test", True)
        short = store.host_summary(now=time.time(), limit=2)
        everything = store.host_summary(now=time.time(), limit=None)
    finally:
        store.close()
    assert [h.host for h in short] == ["h4.test", "h0.test", "h1.test"]
    assert len(everything) == 5


def test_an_unknown_host_to_pause_points_at_the_host_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.duckdb"
    _store_with_hosts(db, ["a.test"])
    assert main(["pause", "nowhere.test", "--store", str(db)]) == 1
    assert "refresher status --hosts" in capsys.readouterr().err


@pytest.mark.slow
async def test_a_policy_switched_while_stopped_is_the_one_the_ready_line_and_status_name(
    site, short_dir, daemons
) -> None:
    s, port = site
    config = daemon_config(short_dir, port=port, seeds=s.urls(), policy={"name": "optimal"})
    switched = cli("policy", "--uniform", "--config", str(config))
    assert switched.returncode == 0, switched.stderr
    d: DaemonProcess = daemons(config)
    await d.ready()
    ready = d.event("ready")
    assert ready is not None and ready["policy"] == "uniform"
    status = cli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout)
    assert answer["allocator"]["policy"] == "uniform"
    assert {h["host"] for h in answer["host_list"]} >= {"a.sim.test", "b.sim.test"}
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
