"""Reload is declarative: every config key is live or restart-only, and the table is obeyed."""

from __future__ import annotations

import dataclasses
import signal
import time
import typing

import pytest
from _rawserver import Reply, Request, http_handler, raw_server
from conftest import daemon_config, wait_for

from refresher._config import Config, DiscoveryConfig, load_config
from refresher.discover._filter import UrlFilter
from refresher.discover._url import canonicalize
from refresher.ops._control import request
from refresher.ops._reload import RELOAD, changed_keys, effective


def every_key() -> set[str]:
    """Walks the config dataclasses on its own: each field of each section."""
    sections = typing.get_type_hints(Config)
    return {
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(sections[section.name])
    }


def test_every_config_key_is_declared_live_or_restart_only() -> None:
    keys = every_key()
    assert keys - set(RELOAD) == set(), "keys missing from refresher.ops._reload.RELOAD"
    assert set(RELOAD) - keys == set(), "RELOAD names keys the config does not have"
    assert set(RELOAD.values()) == {"live", "restart"}


def test_the_config_in_force_keeps_restart_only_values_and_takes_live_ones(tmp_path) -> None:
    old = load_config(default_file=tmp_path / "none.toml")
    new = load_config(
        default_file=tmp_path / "none.toml",
        overrides={
            "crawl": {"workers": 3, "user_agent": "newbot/1.0"},
            "budget": {"fetches_per_second": 2.5},
            "discovery": {"strip_tracking_params": False, "max_depth": 2},
            "estimate": {"model": "gamma"},
        },
    )
    assert changed_keys(old, new) == [
        "crawl.user_agent",
        "crawl.workers",
        "budget.fetches_per_second",
        "discovery.max_depth",
        "discovery.strip_tracking_params",
        "estimate.model",
    ]
    now = effective(old, new)
    assert now.crawl.workers == old.crawl.workers
    assert now.discovery.strip_tracking_params is True  # seeds and links canonicalise alike
    assert now.crawl.user_agent == "newbot/1.0" and now.budget.fetches_per_second == 2.5
    assert now.discovery.max_depth == 2 and now.estimate.model == "gamma"
    assert isinstance(now.discovery, DiscoveryConfig)


def test_a_filter_takes_new_scope_and_limits_and_keeps_its_seed_hosts() -> None:
    f = UrlFilter.from_config(DiscoveryConfig().filter_config(), seeds_hosts=["seed.test"])
    deep = canonicalize("http://seed.test/a")
    assert f.check(deep, depth=5) is None
    assert f.check(canonicalize("http://other.test/"), depth=1) is not None
    f.configure(
        dataclasses.replace(
            DiscoveryConfig(),
            max_depth=2,
            allowed_hosts=("other.test",),
            strip_tracking_params=False,
        ).filter_config()
    )
    assert f.check(deep, depth=5) is not None  # the new depth limit
    assert f.check(canonicalize("http://other.test/"), depth=1) is None  # the new scope
    assert f.check(canonicalize("http://seed.test/b"), depth=1) is None  # seeds stay in scope
    assert f.config.strip_tracking_params is True and f.strip_params is not None


def _robots_app(request: Request) -> Reply:
    if request.target == "/robots.txt":
        body = b"User-agent: newbot\nDisallow: /private\n\nUser-agent: *\nAllow: /\n"
        return Reply(headers=[("content-type", "text/plain")], body=body)
    return Reply(headers=[("content-type", "text/html")], body=b"<html><body>x</body></html>")


@pytest.mark.slow
async def test_sighup_applies_live_keys_and_names_restart_only_ones(short_dir, daemons) -> None:
    async with raw_server(http_handler(_robots_app)) as server:
        config = daemon_config(
            short_dir,
            port=server.port,
            seeds=["http://r.sim.test/", "http://r.sim.test/private"],
            crawl={"user_agent": "oldbot/1.0 (+http://127.0.0.1/)"},
            budget={"fetches_per_second": 20.0},
            policy={"name": "uniform", "resolve_interval": 1.0},
        )
        d = daemons(config)
        await d.ready()

        def private(agent: str) -> int:
            return sum(
                1
                for r in server.requests
                if r.target == "/private" and r.headers.get("user-agent", "").startswith(agent)
            )

        await wait_for(lambda: private("oldbot") >= 2, what="/private fetched by oldbot")
        text = config.read_text()
        text = text.replace("oldbot/1.0", "newbot/1.0").replace("workers = 8", "workers = 3")
        config.write_text(text + '\n[estimate]\nmodel = "gamma"\n')
        d.signal(signal.SIGHUP)
        await wait_for(lambda: d.event("configuration reloaded"), what="reload")
        warned = d.event("config key changed; takes effect after a restart")
        assert warned is not None and warned["key"] == "crawl.workers"
        # the new agent is sent and matched: robots.txt disallows /private for newbot only
        await wait_for(
            lambda: (
                sum(
                    1
                    for r in server.requests
                    if r.headers.get("user-agent", "").startswith("newbot")
                )
                >= 3
            ),
            what="requests with the new user agent",
        )
        status = request(short_dir / "control.sock", {"op": "status"})
        d.signal(signal.SIGTERM)
        assert await d.wait_exit() == 0
    assert private("newbot") == 0
    assert status["estimator"]["model"] == "gamma"
    assert status["crawler"]["workers"] == 8  # restart-only: the running value stays


def test_politeness_keys_are_read_at_each_request_after_configure() -> None:
    from typing import Any

    from refresher.crawl._frontier import HostState
    from refresher.crawl._workers import Crawler

    none: Any = None
    crawler = Crawler(config=Config(), frontier=none, fetcher=none, store=none, allocator=none)
    host = HostState(id=1, name="a.test", scheme="http")
    before = crawler._timing(
        host, None, finished_at=100.0, response_time=0.0, failed=False, retry_after=None
    )
    slower = load_config(
        overrides={"politeness": {"min_delay": 7.0, "max_delay": 9.0}},
        default_file=Config().store.path.parent / "none.toml",
    )
    crawler.configure(slower)
    after = crawler._timing(
        host, None, finished_at=100.0, response_time=0.0, failed=False, retry_after=None
    )
    assert (before.delay, after.delay) == (1.0, 7.0) and after.next_allowed == 107.0


@pytest.mark.slow
async def test_sighup_lowering_max_delay_frees_a_host_its_stored_crawl_delay_holds(
    short_dir, daemons
) -> None:
    # robots.txt asks for 600 s between requests: after it the seed waits that long, until a
    # reload lowers politeness.max_delay; the host's timing then is bounded at once
    arrived: list[tuple[str, float]] = []

    def app(request: Request) -> Reply:
        arrived.append((request.target, time.time()))
        if request.target == "/robots.txt":
            body = b"User-agent: *\nCrawl-delay: 600\n"
            return Reply(headers=[("content-type", "text/plain")], body=body)
        return Reply(headers=[("content-type", "text/html")], body=b"<html><body>x</body></html>")

    async with raw_server(http_handler(app)) as server:
        config = daemon_config(
            short_dir,
            port=server.port,
            seeds=["http://r.sim.test/"],
            politeness={"max_delay": 600.0},
        )
        d = daemons(config)
        await d.ready()
        await wait_for(lambda: d.event("robots.txt fetched"), what="robots.txt fetched")
        assert [target for target, _ in arrived] == ["/robots.txt"]  # the seed waits 600 s
        config.write_text(config.read_text().replace("max_delay = 600.0", "max_delay = 0.5"))
        d.signal(signal.SIGHUP)
        await wait_for(lambda: d.event("configuration reloaded"), what="reload")
        await wait_for(lambda: len(server.requests) >= 2, what="the seed fetched after the reload")
        d.signal(signal.SIGTERM)
        assert await d.wait_exit() == 0
    (_, robots_at), (target, seed_at) = arrived[:2]
    assert target == "/" and seed_at - robots_at >= 0.5  # the new max_delay, still kept
