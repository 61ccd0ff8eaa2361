"""Which configuration keys a SIGHUP applies, declared once.

Every key of every section is in :data:`RELOAD`, as ``"live"`` (the running daemon takes the
new value: the component that owns it has a ``configure`` method, or reads the running config
each time) or ``"restart"`` (it shapes something built once at start: files, sockets, queues,
the frontier, the number of workers, the identity of pages). A test walks the config
dataclasses and fails when a key is missing here.

:func:`effective` gives the configuration a reload puts in force: the new file's live keys and
the running values of the restart-only ones, so what the daemon reports is what it does.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from refresher._config import Config

__all__ = ["RELOAD", "Apply", "changed_keys", "config_keys", "effective"]

Apply = Literal["live", "restart"]

_LIVE: Apply = "live"
_RESTART: Apply = "restart"

#: dotted key → when a change takes effect. Grouped by section; the why is in the comments.
RELOAD: Mapping[str, Apply] = {
    # the file, its writer and its memory are opened once
    "store.path": _RESTART,
    "store.flush_interval": _RESTART,
    "store.batch_size": _RESTART,
    "store.memory_limit": _RESTART,
    # history retention is applied by the daemon's retention pass, reconfigured on reload
    "store.history_retention": _LIVE,
    "store.history_export_dir": _LIVE,
    # seeds are added on reload; the user agent reaches requests (Fetcher.configure) and robots
    # matching (rules re-matched for the new agent); workers are tasks started once
    "crawl.seeds": _LIVE,
    "crawl.seeds_file": _LIVE,
    "crawl.user_agent": _LIVE,
    "crawl.workers": _RESTART,
    "budget.fetches_per_second": _LIVE,  # Allocator.configure → the frontier's pacer
    "policy.name": _LIVE,
    "policy.resolve_interval": _LIVE,  # Allocator.configure(replan=…) and FleetBudget.replan
    "policy.replan_share": _LIVE,
    "policy.replan_floor": _LIVE,
    "policy.explore": _LIVE,
    "policy.weights": _LIVE,
    "policy.decide": _LIVE,
    # the crawler reads politeness and robots settings at every request
    "politeness.min_delay": _LIVE,
    "politeness.response_time_factor": _LIVE,
    "politeness.max_delay": _LIVE,
    "politeness.backoff_base": _LIVE,
    "politeness.max_backoff": _LIVE,
    "fetch.timeout": _LIVE,  # Fetcher.configure
    "fetch.max_body_bytes": _LIVE,
    "fetch.max_redirects": _LIVE,
    # the resolver and its cache are built once
    "dns.static": _RESTART,
    "dns.ttl": _RESTART,
    "dns.negative_ttl": _RESTART,
    "robots.expiry": _LIVE,
    "robots.retry_after_failure": _LIVE,
    # the frontier's queues are sized at start
    "frontier.front_queues": _RESTART,
    "frontier.window": _RESTART,
    "frontier.max_pages_in_memory": _RESTART,
    "frontier.back_queues_per_worker": _RESTART,
    "frontier.work_conserving": _RESTART,
    # discovery: the URL filter's scope and limits (UrlFilter.configure), the link kinds
    # (Discovery.configure) and the parser's settings (Crawler.configure) are live
    "discovery.allowed_hosts": _LIVE,
    "discovery.allowed_domains": _LIVE,
    "discovery.include": _LIVE,
    "discovery.exclude": _LIVE,
    "discovery.schemes": _LIVE,
    "discovery.max_url_length": _LIVE,
    "discovery.max_depth": _LIVE,
    "discovery.max_pages_per_host": _LIVE,
    "discovery.max_repeated_segments": _LIVE,
    "discovery.max_query_params": _LIVE,
    "discovery.max_query_variants_per_path": _LIVE,
    "discovery.calendar_window_days": _LIVE,
    # a page's identity: seeds and links must canonicalise alike, and the stored URLs were
    # made with the old setting
    "discovery.strip_tracking_params": _RESTART,
    "discovery.enabled": _RESTART,  # discovery is started or not
    "discovery.seen_cache_entries": _RESTART,  # the cache's arrays are sized once
    "discovery.include_media": _LIVE,
    "discovery.max_links_per_page": _LIVE,
    "discovery.max_text_chars": _LIVE,
    "discovery.sitemaps": _LIVE,
    "discovery.queue": _RESTART,  # a channel's size is fixed
    "discovery.parse_processes": _RESTART,  # the parse threads and processes start with the crawler
    "discovery.split_cpus": _RESTART,  # so do the threads' and processes' CPU masks
    # fingerprints of one run come from one parser: a reload would compare across the two
    "discovery.html_parser": _RESTART,
    # how the allocator reads the history (Allocator.configure(inputs=...))
    "estimate.change": _LIVE,
    "estimate.history": _LIVE,
    "estimate.model": _LIVE,
    "estimate.spread": _LIVE,
    "estimate.known_rates": _LIVE,  # read again on reload (Allocator.configure(inputs=...))
    # services started once, with their files and sockets
    "snapshot.interval": _RESTART,
    "snapshot.path": _RESTART,
    "archive.enabled": _RESTART,
    "archive.dir": _RESTART,
    "archive.prefix": _RESTART,
    "archive.max_file_bytes": _RESTART,
    "archive.revisits": _RESTART,
    "archive.min_free_bytes": _LIVE,  # the pruner and the writer's free-space floor
    "archive.compress_level": _RESTART,
    "archive.max_bytes": _LIVE,  # the pruner and the writer's free-space floor
    "archive.keep_versions": _LIVE,  # the pruner and the writer's free-space floor
    "archive.prune_interval": _LIVE,  # the pruner and the writer's free-space floor
    "sinks.names": _RESTART,
    "sinks.queue": _RESTART,
    "sinks.jsonl_path": _RESTART,
    "sinks.jsonl_max_bytes": _RESTART,
    "sinks.bodies": _RESTART,
    "sinks.webhook_url": _RESTART,
    "sinks.webhook_timeout": _RESTART,
    "sinks.webhook_attempts": _RESTART,
    "sinks.webhook_backoff": _RESTART,
    "control.socket": _RESTART,
    "control.tcp_port": _RESTART,
    "metrics.port": _RESTART,
    "metrics.host": _RESTART,
    "metrics.allow_remote": _RESTART,
    # logging is reconfigured on reload; the progress loop and the drain read the config
    "log.format": _LIVE,
    "log.level": _LIVE,
    "log.progress_interval": _LIVE,
    "daemon.drain_timeout": _LIVE,
    # the fleet: the database, the node's identity, the partitioning and the leases are fixed
    # for the life of the process (P for the life of the fleet)
    "fleet.dsn": _RESTART,
    "fleet.node_id": _RESTART,
    "fleet.partitions": _RESTART,
    "fleet.lease_ttl": _RESTART,
    "fleet.history_dir": _RESTART,
    "fleet.absent_after": _RESTART,
}


def config_keys() -> Iterator[str]:
    """Every dotted key of the configuration: each field of each section's dataclass."""
    sections = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(sections[section.name]):
            yield f"{section.name}.{f.name}"


def _value(config: Config, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def changed_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys whose values differ, in :data:`RELOAD` order."""
    return [key for key in RELOAD if _value(old, key) != _value(new, key)]


def effective(old: Config, new: Config) -> Config:
    """``new`` with every restart-only key at its running value in ``old``."""
    sections: dict[str, dict[str, Any]] = {}
    for key in changed_keys(old, new):
        if RELOAD[key] == _RESTART:
            section, _, name = key.partition(".")
            sections.setdefault(section, {})[name] = _value(old, key)
    return dataclasses.replace(
        new,
        **{
            section: dataclasses.replace(getattr(new, section), **values)
            for section, values in sections.items()
        },
    )
