"""Every config key, given a bad value, stops ``refresher run`` with one line naming it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from conftest import cli

from refresher._config import Config
from refresher.ops import _daemon
from refresher.ops._cli import main

#: a bad ``--set`` value for every key; {tmp} is a directory that exists
BAD: dict[str, str] = {
    "store.path": '"{tmp}"',
    "store.flush_interval": "0",
    "store.batch_size": "-1",
    "store.memory_limit": "lots",
    "crawl.seeds": "42",
    "crawl.seeds_file": "{tmp}/missing-seeds.txt",
    "crawl.user_agent": '" "',
    "crawl.workers": "0",
    "budget.fetches_per_second": "-2",
    "policy.name": "fastest",
    "policy.resolve_interval": "0",
    "policy.replan_share": "-0.5",
    "policy.replan_floor": "0",
    "policy.explore": "1.5",
    "policy.weights": "pagerankk",
    "politeness.min_delay": "-1",
    "politeness.response_time_factor": "-1",
    "politeness.max_delay": "-1",
    "politeness.backoff_base": "-1",
    "politeness.max_backoff": "-1",
    "fetch.timeout": "0",
    "fetch.max_body_bytes": "0",
    "fetch.max_redirects": "-1",
    "dns.static": '{"*.sim.test" = "nonsense"}',
    "dns.ttl": "-1",
    "dns.negative_ttl": "-1",
    "robots.expiry": "0",
    "robots.retry_after_failure": "0",
    "frontier.front_queues": "0",
    "frontier.window": "0",
    "frontier.max_pages_in_memory": "0",
    "frontier.back_queues_per_worker": "0",
    "frontier.work_conserving": '"yes"',
    "discovery.allowed_hosts": '["not a host"]',
    "discovery.allowed_domains": '["a.example:8080"]',
    "discovery.include": '["("]',
    "discovery.exclude": '["[a-"]',
    "discovery.schemes": '["ftp"]',
    "discovery.max_url_length": "0",
    "discovery.max_depth": "-1",
    "discovery.max_pages_per_host": "0",
    "discovery.max_repeated_segments": "0",
    "discovery.max_query_params": "-1",
    "discovery.max_query_variants_per_path": "-1",
    "discovery.calendar_window_days": "-1",
    "discovery.strip_tracking_params": '"yes"',
    "discovery.enabled": '"yes"',
    "discovery.seen_cache_entries": "0",
    "discovery.include_media": "1",
    "discovery.max_links_per_page": "0",
    "discovery.max_text_chars": "-1",
    "discovery.sitemaps": '"no"',
    "discovery.queue": "0",
    "discovery.parse_processes": "-1",
    "discovery.split_cpus": '"yes"',
    "discovery.html_parser": '"html5lib"',
    "estimate.change": "some",
    "estimate.history": "0",
    "estimate.model": "poisson",
    "estimate.spread": "0",
    "estimate.known_rates": "{tmp}/missing-rates.csv",
    "snapshot.interval": "-1",
    "snapshot.path": '""',
    "control.socket": '"{tmp}/' + "s" * 120 + '.sock"',
    "control.tcp_port": "70000",
    "metrics.port": "-1",
    "metrics.host": "0.0.0.0",
    "metrics.allow_remote": '"sure"',
    "log.format": "xml",
    "log.level": "loud",
    "log.progress_interval": "0",
    "daemon.drain_timeout": "-1",
    "store.history_retention": "0",
    "store.history_export_dir": "''",
    "policy.decide": "maybe",
    "archive.enabled": '"yes"',
    "archive.dir": '""',
    "archive.prefix": '"a/b"',
    "archive.max_file_bytes": "0",
    "archive.revisits": '"no"',
    "archive.min_free_bytes": "-1",
    "archive.compress_level": "0",
    "archive.max_bytes": "0",
    "archive.keep_versions": "0",
    "archive.prune_interval": "0",
    "sinks.names": '["no-such-sink"]',
    "sinks.queue": "0",
    "sinks.jsonl_path": '""',
    "sinks.jsonl_max_bytes": "0",
    "sinks.bodies": '"yes"',
    "sinks.webhook_url": '"not a url"',
    "sinks.webhook_timeout": "0",
    "sinks.webhook_attempts": "0",
    "sinks.webhook_backoff": "-1",
    "fleet.dsn": '"not a dsn"',
    "fleet.node_id": '"a/b"',
    "fleet.partitions": "0",
    "fleet.lease_ttl": "0",
    "fleet.history_dir": "42",
    "fleet.absent_after": "0",
}

#: keys whose check only applies alongside another key
WITH: dict[str, list[str]] = {"metrics.host": ["--set", "metrics.port=9999"]}


def _keys(cls: typing.Any, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.extend(_keys(hints[f.name], f"{prefix}{f.name}."))
        else:
            out.append(f"{prefix}{f.name}")
    return out


def test_the_table_of_bad_values_covers_every_config_key() -> None:
    assert sorted(_keys(Config)) == sorted(BAD)


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_value_of_any_key_is_one_line_naming_it_and_creates_nothing(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_daemon(*_: object) -> int:
        raise AssertionError(f"the daemon started with a bad {key}")

    monkeypatch.setattr(_daemon, "run_daemon", no_daemon)
    store = tmp_path / "r.duckdb"
    value = BAD[key].replace("{tmp}", str(tmp_path))
    where = [] if key == "store.path" else ["--store", str(store)]
    argv = ["run", *where, "--set", f"{key}={value}", *WITH.get(key, [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"refresher run: {key}"), err
    assert "; " in err, f"no fix in: {err}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "flags",
    [
        ["--set", 'dns.static."*.sim.test"=nonsense'],
        ["--set", "metrics.host=0.0.0.0", "--set", "metrics.port=9999"],
    ],
)
def test_the_reported_config_errors_exit_2_with_one_line_before_the_store_exists(
    flags: list[str], tmp_path: Path
) -> None:
    store = tmp_path / "r.duckdb"
    done = cli("run", "--store", str(store), *flags)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("refresher run: "), done.stderr
    assert not store.exists()
