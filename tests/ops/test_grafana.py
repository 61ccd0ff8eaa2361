"""The shipped Grafana dashboard queries only metrics a running daemon exposes."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DaemonProcess, cli, daemon_config, wait_for
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).parents[2] / "ops" / "grafana" / "refresher.json"


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _queried() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return {m for e in _exprs(dashboard) for m in re.findall(r"\brefresher_[a-z_]+\b", e)}


#: the metrics only a node of a fleet exposes
FLEET = "refresher_fleet_"


async def _scrape_until_exposed(d: DaemonProcess, wanted: set[str]) -> None:
    serving = await wait_for(lambda: d.event("metrics serving"), what="the metrics line")
    exposed: set[str] = set()

    def scrape_has_all() -> bool:
        text = httpx.get(serving["url"], timeout=10).text
        exposed.clear()
        for family in text_string_to_metric_families(text):
            exposed.update(sample.name for sample in family.samples)
        return wanted <= exposed

    try:
        await wait_for(scrape_has_all, what="every dashboard metric in /metrics")
    except AssertionError:
        pytest.fail(f"not exposed: {sorted(wanted - exposed)}")


def test_the_dashboard_is_provisioning_ready_json_with_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "refresher" and "id" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert len(_queried()) >= 15
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
async def test_every_metric_the_dashboard_queries_is_exposed_by_a_running_daemon(
    site, short_dir, daemons
) -> None:
    s, port = site
    config = daemon_config(
        short_dir,
        port=port,
        seeds=s.urls(),
        metrics={"port": 0},
        snapshot={"interval": 1.0},
        sinks={"names": ["jsonl"]},  # the change-feed panels need a sink
    )
    d: DaemonProcess = daemons(config)
    await d.ready()
    await _scrape_until_exposed(d, {m for m in _queried() if not m.startswith(FLEET)})
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0


@pytest.mark.slow
async def test_every_fleet_metric_the_dashboard_queries_is_exposed_by_a_fleet_node(
    site, short_dir, daemons, postgres
) -> None:
    s, port = site
    fleet = {"dsn": postgres(), "node_id": "a", "partitions": 8}
    config = daemon_config(short_dir, port=port, seeds=s.urls(), metrics={"port": 0}, fleet=fleet)
    done = cli("fleet", "init", "--config", str(config))
    assert done.returncode == 0, done.stderr
    d: DaemonProcess = daemons(config)
    await d.ready()
    wanted = {m for m in _queried() if m.startswith(FLEET)}
    assert len(wanted) >= 8
    await _scrape_until_exposed(d, wanted)
    d.signal(signal.SIGTERM)
    assert await d.wait_exit() == 0
