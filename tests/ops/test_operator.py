"""The operator's commands on a stopped store and a running daemon: status, policy, pause."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, acli, cli, daemon_config

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
    # in a thread: the site is served by this event loop, and must keep answering
    status = await acli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout)
    assert answer["allocator"]["policy"] == "uniform"
    assert {h["host"] for h in answer["host_list"]} >= {"a.sim.test", "b.sim.test"}
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


@pytest.mark.parametrize("command", [[], ["run"], ["site"], ["status"], ["query"]])
def test_every_help_text_is_plain_and_summarised(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    _usage, _, rest = out.partition("\n\n")
    assert rest.strip() and not rest.lstrip().startswith(("positional", "options")), out


def test_run_help_explains_the_log_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(log.format)" in out and "(log.level)" in out


def test_query_output_prints_floats_short_and_unix_seconds_to_the_millisecond(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.duckdb"
    _store_with_hosts(db, ["a.test"])
    sql = "SELECT 2.0 / 3 AS share, 1763932800.1234567::DOUBLE AS t"
    assert main(["query", "--store", str(db), sql]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = lines[lines.index(next(x for x in lines if x.startswith("share"))) + 2].split()
    assert row == ["0.666667", "1763932800.123"]


@pytest.mark.slow
async def test_a_seed_host_without_dns_is_a_dns_error_in_backoff_not_a_robots_denial(
    site, short_dir, daemons
) -> None:
    from conftest import query_db, wait_for

    s, port = site
    seeds = [*s.urls()[:2], "http://nothing.invalid/", "http://nothing.invalid/a"]
    config = daemon_config(short_dir, port=port, seeds=seeds)
    d: DaemonProcess = daemons(config)
    await d.ready()

    async def in_backoff() -> dict[str, Any] | None:
        status = await acli("status", "--config", str(config), "--json")
        rows = json.loads(status.stdout).get("host_list", []) if status.returncode == 0 else []
        return next(
            (h for h in rows if h["host"] == "nothing.invalid" and h["backoff_left"] > 0), None
        )

    host = await wait_for(in_backoff, what="nothing.invalid listed in backoff")
    assert host["errors"] >= 1
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
    db = short_dir / "refresher.duckdb"
    kinds = query_db(db, "SELECT DISTINCT error_kind FROM fetch_log WHERE host = 'nothing.invalid'")
    assert kinds == [("dns",)]
    statuses = query_db(
        db,
        "SELECT DISTINCT p.status FROM pages p JOIN hosts h ON h.id = p.host_id"
        " WHERE h.name = 'nothing.invalid' AND p.fetches > 0",
    )
    assert statuses == [("error",)]
