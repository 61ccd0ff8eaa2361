"""Configuration: frozen, keyword-only objects parsed once from layered TOML.

Layers, later wins: built-in defaults → ``/etc/refresher/refresher.toml`` (or ``--config FILE``)
→ command-line overrides (``--set section.key=value`` and the shortcut flags). The whole tree is
validated once: an unknown key, a wrong type or an impossible value raises :class:`ConfigError`
naming the dotted key and saying how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import ipaddress
import json
import math
import re
import socket
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refresher import policies
from refresher._errors import ConfigError
from refresher.discover._filter import FilterConfig
from refresher.discover._html import MAX_TEXT, PARSERS
from refresher.refresh._estimate import DEFAULT_SPREAD, MODELS

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ArchiveConfig",
    "BudgetConfig",
    "Config",
    "ControlConfig",
    "CrawlConfig",
    "DNSConfig",
    "DaemonConfig",
    "DiscoveryConfig",
    "EstimateConfig",
    "FetchConfig",
    "FleetConfig",
    "FrontierConfig",
    "LogConfig",
    "MetricsConfig",
    "PolicyConfig",
    "PolitenessConfig",
    "RobotsConfig",
    "SinksConfig",
    "SnapshotConfig",
    "StoreConfig",
    "load_config",
    "merge_tables",
    "parse_override",
]

DEFAULT_CONFIG_FILE = Path("/etc/refresher/refresher.toml")
#: page weights for the optimal policies: PageRank over the stored links, or none (all 1)
WEIGHTS = ("pagerank", "none")
#: how the optimal policies treat uncertain rates: maximise the expected value under each
#: rate's posterior, or plan for the point estimate as if it were exact
DECISIONS = ("expected", "plug-in")


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Where and how fetches are recorded."""

    path: Path = Path("var/refresher.duckdb")
    #: seconds a finished fetch may wait before its batch commits (the crash-loss window)
    flush_interval: float = 0.5
    #: fetches per batch at most; a full batch commits at once
    batch_size: int = 5000
    #: DuckDB's memory_limit, e.g. "256MB"
    memory_limit: str = "256MB"
    #: history retention: seconds of fetches kept (each page's latest estimate.history always
    #: are); absent: everything. Applied with the archive's retention (archive.prune_interval)
    history_retention: float | None = None
    #: deleted fetches are first exported here as Parquet files; absent: not exported
    history_export_dir: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CrawlConfig:
    seeds: tuple[str, ...] = ()
    seeds_file: Path | None = None
    user_agent: str = "refresher/0.1 (+https://github.com/refresher/refresher)"
    #: concurrent fetches; never more than one per host
    workers: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetConfig:
    #: the refresh budget B, fetches per second over all hosts
    fetches_per_second: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    #: a policy of the registry: a built-in or a plug-in (``policies.available()``)
    name: str = policies.DEFAULT
    #: seconds between re-solves of the allocation, at most (refresher.refresh._replan)
    resolve_interval: float = 60.0
    #: re-solve sooner once the fetches recorded since the last solve reach this share of the
    #: pages (0: every resolve_interval alone)
    replan_share: float = 0.5
    #: seconds between two solves that replan_share calls for, at least (and 20 × the last
    #: solve's duration)
    replan_floor: float = 5.0
    #: share of the budget that keeps re-checking pages the policy gives no fetches
    explore: float = 0.05
    #: page weights wᵢ the optimal policies use: "pagerank" (over the stored link edges,
    #: mean 1) or "none" (every page 1: what unweighted mean freshness measures)
    weights: str = "pagerank"
    #: "expected" (maximise expected freshness or age under each λ's posterior; log-normal
    #: estimator only) or "plug-in" (treat λ̂ as exact)
    decide: str = "expected"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolitenessConfig:
    #: seconds between two requests to one host, at least
    min_delay: float = 1.0
    #: Mercator's k: the delay is at least k times the last response time
    response_time_factor: float = 10.0
    #: seconds; no politeness delay exceeds this (Retry-After and backoff may, up to max_backoff)
    max_delay: float = 60.0
    #: seconds of the first backoff after an error; doubles per consecutive error
    backoff_base: float = 30.0
    #: seconds; the longest a host is left alone after errors or Retry-After
    max_backoff: float = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig:
    #: seconds, the total deadline of one fetch (DNS, connect, headers, body)
    timeout: float = 30.0
    max_body_bytes: int = 10_485_760
    max_redirects: int = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class DNSConfig:
    #: host or "*.domain" → "IP" or "IP:PORT", like curl --resolve
    static: Mapping[str, str] = field(default_factory=dict)
    #: seconds a resolution is reused
    ttl: float = 300.0
    #: seconds a failed resolution is remembered at first (doubles per failure)
    negative_ttl: float = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsConfig:
    #: seconds a fetched robots.txt is trusted (RFC 9309 suggests at most 24 h)
    expiry: float = 86_400.0
    #: seconds before robots.txt is tried again after a 5xx or unreachable answer
    retry_after_failure: float = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontierConfig:
    #: K, the number of priority front queues
    front_queues: int = 8
    #: seconds of due times loaded into memory ahead of now
    window: float = 60.0
    #: pages held in memory at most; the rest wait in DuckDB
    max_pages_in_memory: int = 200_000
    #: back queues (active hosts) per worker; Mercator used about 3
    back_queues_per_worker: int = 3
    #: a token nothing is due for goes to the page due soonest on a host allowed now, so B
    #: requests per second go on the wire whenever pages and politeness allow; false: a page
    #: is fetched only once due (the budget idles while too few are)
    work_conserving: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryConfig(FilterConfig):
    """Links found in fetched pages: the URL filter's scope, limits and trap defences (the
    fields of :class:`refresher.discover._filter.FilterConfig`, validated by it), and these."""

    #: follow links at all; off = refresh only the seeds
    enabled: bool = True
    #: entries of the URL-seen CLOCK cache (about 20 bytes each)
    seen_cache_entries: int = 50_000
    #: also follow img and script sources, stylesheets and icons
    include_media: bool = False
    #: links taken from one page at most
    max_links_per_page: int = 10_000
    #: characters of a page's visible text its simhash reads, the first ones (0: all); what
    #: a multi-megabyte page's text has beyond them does not move its fingerprint
    max_text_chars: int = MAX_TEXT
    #: the HTML tree builder: "lexbor" (selectolax; a quarter of lxml's CPU on real pages) or
    #: "lxml" (libxml2, the parser before it); the two differ on odd markup (README)
    html_parser: str = "lexbor"
    #: fetch robots.txt Sitemap lines (and /sitemap.xml when there are none)
    sitemaps: bool = True
    #: parsed documents waiting for link processing; more wait in the store (owed findings)
    queue: int = 1000
    #: worker processes that parse pages of 16 KiB and more beside the parse threads (0:
    #: every page on the daemon's parse threads, one per usable CPU, two at least; N: a large
    #: page goes to a free process, else to a free thread; "auto": one process per usable
    #: CPU (none on one CPU), taking a large page when every thread is busy and starting
    #: then, ending after 60 s without one: a backlog gets every core)
    parse_processes: int | str = "auto"
    #: with parse processes on two usable CPUs or more: the daemon's own threads (event loop,
    #: parse threads, store writer) keep to one CPU and the processes to the others, which
    #: then take a large page first ("auto" too; an idle thread takes one when every process
    #: is busy): a hand-off between threads on two CPUs cost ~10 times one on one CPU (README)
    split_cpus: bool = True

    def filter_config(self) -> FilterConfig:
        """Just the URL filter's part of these settings."""
        names = {f.name for f in dataclasses.fields(FilterConfig)}
        return FilterConfig(**{k: getattr(self, k) for k in names})


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimateConfig:
    #: which change the estimator counts: "raw" (any byte) or "meaningful" (simhash moved)
    change: str = "raw"
    #: most recent observations per page the estimator reads
    history: int = 32
    #: the prior on each page's rate: "log-normal" (on ln λ, centred per host by empirical
    #: Bayes) or "gamma" (pseudo-changes at the host's pooled rate)
    model: str = MODELS[0]
    #: the log-normal prior's sd of ln λ around the host's centre (natural-log units)
    spread: float = DEFAULT_SPREAD
    #: a file of pages whose change rates are known (a CSV with a ``url,rate`` header, rates
    #: in changes per second, or a simulated web's truth file): each plan takes them as exact
    #: (:mod:`refresher.refresh._known`); absent: every page is estimated
    known_rates: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotConfig:
    """A consistent read-only copy of the store that other processes may open while it runs."""

    #: seconds between snapshots (a reader lags by at most this + one snapshot + the flush
    #: interval); 0 turns snapshots off
    interval: float = 30.0
    #: the snapshot file; default "snapshot.duckdb" beside the store file
    path: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveConfig:
    """The copy: every new version of a page in WARC files (restart-only but for retention)."""

    enabled: bool = True
    #: the WARC directory; default "archive" beside the store file
    dir: Path | None = None
    #: WARC file names start with it
    prefix: str = "refresher"
    #: bytes after which a WARC file is closed and the next one begun
    max_file_bytes: int = 1 << 30
    #: a 304 or an unchanged body is a small revisit record; false: nothing is written
    revisits: bool = True
    #: free disk bytes kept; below it archiving pauses (fetching goes on) until there is room
    min_free_bytes: int = 64 << 20
    #: zlib level of each record's gzip member, 1 (fast) to 9 (small); 5 is 0.8-1.1 % larger
    #: than 6 on real HTML for 20-25 % less compressing, the archive's largest CPU cost
    #: (bench/bench_warc.py)
    compress_level: int = 5
    #: retention: bytes of records kept at most, oldest versions dropped first (the latest
    #: version of every page is always kept); absent: no limit
    max_bytes: int | None = None
    #: retention: versions (responses) kept per page, the latest always; absent: all
    keep_versions: int | None = None
    #: seconds between retention passes in the daemon (when max_bytes or keep_versions is set)
    prune_interval: float = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SinksConfig:
    """The change feed: sinks by entry-point name (group ``refresher.sinks``), besides the
    archive. Each gets every change through its own bounded queue; restart-only."""

    names: tuple[str, ...] = ()
    #: changes a sink may have waiting; more are dropped and counted
    queue: int = 1000
    #: the jsonl sink: the file (rotated past jsonl_max_bytes); default "changes.jsonl" beside
    #: the store file
    jsonl_path: Path | None = None
    jsonl_max_bytes: int = 256 << 20
    #: the jsonl and webhook sinks send the body (base64) too
    bodies: bool = False
    #: the webhook sink POSTs each change as JSON to this URL
    webhook_url: str | None = None
    #: seconds per webhook request; attempts per change; first backoff (doubles each retry)
    webhook_timeout: float = 10.0
    webhook_attempts: int = 5
    webhook_backoff: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlConfig:
    #: unix socket path; default "control.sock" beside the store file
    socket: Path | None = None
    #: a loopback TCP port to listen on as well; off when absent
    tcp_port: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    #: TCP port of GET /metrics (Prometheus text format); 0 picks a free one; off when absent
    port: int | None = None
    #: address to listen on: an IP literal, loopback unless allow_remote
    host: str = "127.0.0.1"
    #: allow a non-loopback host (the endpoint has no authentication: firewall it)
    allow_remote: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    #: "auto" = JSON when stdout is not a terminal, readable when it is
    format: str = "auto"
    level: str = "info"
    #: seconds between progress lines
    progress_interval: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonConfig:
    #: seconds in-flight fetches get to finish after SIGTERM
    drain_timeout: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """Many nodes sharing one PostgreSQL store (all restart-only). An empty ``dsn``: a single
    node on the embedded DuckDB store, the default."""

    #: libpq connection string or postgresql:// URL of the fleet's database; "" = single node.
    #: Left out of the repr: it may hold a password
    dsn: str = field(default="", repr=False)
    #: this node's name in the fleet, unique in it; default: the host name
    node_id: str = field(default_factory=socket.gethostname)
    #: P, the virtual partitions hosts are hashed to; fixed when the fleet is created
    partitions: int = 1024
    #: seconds a partition lease lasts unless renewed
    lease_ttl: float = 10.0
    #: shared directory of the fleet's Parquet history (and archives); "" = none
    history_dir: str = ""
    #: seconds after its last heartbeat when a node counts as gone for good: the live nodes
    #: publish its unpublished history (under its id) to history_dir
    absent_after: float = 3600.0

    @property
    def enabled(self) -> bool:
        """Fleet mode: a PostgreSQL store is configured."""
        return bool(self.dsn)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    crawl: CrawlConfig = field(default_factory=CrawlConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    politeness: PolitenessConfig = field(default_factory=PolitenessConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    dns: DNSConfig = field(default_factory=DNSConfig)
    robots: RobotsConfig = field(default_factory=RobotsConfig)
    frontier: FrontierConfig = field(default_factory=FrontierConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    sinks: SinksConfig = field(default_factory=SinksConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)

    @property
    def archive_dir(self) -> Path:
        """The WARC directory: ``archive.dir``, else "archive" beside the store file."""
        return self.archive.dir or self.store.path.parent / "archive"

    @property
    def control_socket(self) -> Path:
        """The control endpoint's unix socket path."""
        return self.control.socket or self.store.path.parent / "control.sock"

    def all_seeds(self) -> list[str]:
        """Seeds from ``crawl.seeds`` and ``crawl.seeds_file`` (one URL a line, # comments)."""
        seeds = list(self.crawl.seeds)
        if self.crawl.seeds_file is not None:
            seeds.extend(read_seeds_file(self.crawl.seeds_file, key="crawl.seeds_file"))
        return seeds


def read_seeds_file(path: Path, *, key: str | None = None) -> list[str]:
    """URLs from a file, one a line; blank lines and ``#`` comments skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read seeds file {str(path)!r} ({e}); fix the path or the file's encoding",
            key=key,
        ) from e
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


# Values that are merely the right type can still be impossible; each check returns an error
# message (what is wrong and what to do) or None.
def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _processes(v: Any) -> str | None:
    # a bool is an int in Python: true is no count (the type check refuses it first, too)
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return None
    return 'must be 0 or more, or "auto"'


def _one_of(*names: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in names else f"must be one of {', '.join(map(repr, names))}"

    return check


def _known_policy(v: Any) -> str | None:
    # The registry is the one list: built-ins, register()-ed and entry-point policies.
    known = policies.available()
    return None if v in known else f"must be one of {', '.join(map(repr, known))}"


#: a node id names files (Parquet history, logs): no separators, no leading dot
_NODE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def _port(v: Any) -> str | None:
    return None if 0 < v < 65536 else "must be a TCP port between 1 and 65535"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "store.flush_interval": _positive,
    "store.batch_size": _positive,
    "store.history_retention": _positive,
    "crawl.workers": _positive,
    "crawl.user_agent": lambda v: None if v.strip() else "must not be empty",
    "budget.fetches_per_second": _positive,
    "policy.name": _known_policy,
    "policy.resolve_interval": _positive,
    "policy.replan_share": _non_negative,
    "policy.replan_floor": _positive,
    "policy.explore": lambda v: None if 0 <= v < 1 else "must be a share from 0 to below 1",
    "policy.weights": _one_of(*WEIGHTS),
    "policy.decide": _one_of(*DECISIONS),
    "estimate.history": _positive,
    "estimate.model": _one_of(*MODELS),
    "estimate.spread": _positive,
    "politeness.min_delay": _non_negative,
    "politeness.response_time_factor": _non_negative,
    "politeness.max_delay": _non_negative,
    "politeness.backoff_base": _non_negative,
    "politeness.max_backoff": _non_negative,
    "fetch.timeout": _positive,
    "fetch.max_body_bytes": _positive,
    "fetch.max_redirects": _non_negative,
    "dns.ttl": _non_negative,
    "dns.negative_ttl": _non_negative,
    "robots.expiry": _positive,
    "robots.retry_after_failure": _positive,
    "frontier.front_queues": _positive,
    "frontier.window": _positive,
    "frontier.max_pages_in_memory": _positive,
    "frontier.back_queues_per_worker": _positive,
    "control.tcp_port": _port,
    "snapshot.interval": _non_negative,
    "archive.prefix": lambda v: (
        None
        if v and all(c.isalnum() or c in "_." for c in v)
        else "must be letters, digits, '_' or '.' (it starts every WARC file name)"
    ),
    "archive.max_file_bytes": _positive,
    "archive.min_free_bytes": _non_negative,
    "archive.compress_level": lambda v: None if 1 <= v <= 9 else "must be 1 to 9",
    "archive.max_bytes": _positive,
    "archive.keep_versions": _positive,
    "archive.prune_interval": _positive,
    "sinks.queue": _positive,
    "sinks.jsonl_max_bytes": _positive,
    "sinks.webhook_timeout": _positive,
    "sinks.webhook_attempts": _positive,
    "sinks.webhook_backoff": _non_negative,
    "discovery.max_url_length": _positive,
    "discovery.max_depth": _non_negative,
    "discovery.max_pages_per_host": _positive,
    "discovery.seen_cache_entries": _positive,
    "discovery.max_links_per_page": _positive,
    "discovery.max_text_chars": _non_negative,
    "discovery.queue": _positive,
    "discovery.parse_processes": _processes,
    "discovery.html_parser": _one_of(*PARSERS),
    "estimate.change": _one_of("raw", "meaningful"),
    "metrics.port": lambda v: None if 0 <= v < 65536 else "must be 0 (any free port) to 65535",
    "log.format": _one_of("auto", "json", "console"),
    "log.level": _one_of("debug", "info", "warning", "error"),
    "log.progress_interval": _positive,
    "daemon.drain_timeout": _non_negative,
    # fleet.dsn is checked in _check_whole: its problem must not repeat a password
    "fleet.node_id": lambda v: (
        None
        if _NODE_ID.match(v)
        else "must be 1 to 64 letters, digits, '_', '-' or '.', not starting with '.' or '-' "
        "(it names the node's files)"
    ),
    "fleet.partitions": _positive,
    "fleet.lease_ttl": _positive,
    "fleet.absent_after": _positive,
}

_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    str: "a string",
    Path: "a path string",
    bool: "true or false",
}


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return "a list of strings"
    if origin is Mapping:
        return "a table of strings"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    return _TYPE_WORDS.get(tp, str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` from TOML as type ``tp``, or ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:  # X | None: X's own error
            return _coerce(value, args[0], key)
        for arg in args:  # the first type the value is (int | str: 3 or "auto")
            with contextlib.suppress(ConfigError):
                return _coerce(value, arg, key)
        raise ConfigError(
            f"expected {_describe(tp)}, got {type(value).__name__} {value!r}; "
            f"fix the value in the config file or the --set flag",
            key=key,
        )
    ok: Any = None
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        ok = float(value)
        if not math.isfinite(ok):
            ok = None
    elif (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    ):
        ok = value
    elif tp is Path and isinstance(value, str) and value:
        ok = Path(value)
    elif origin is tuple and isinstance(value, list) and all(isinstance(v, str) for v in value):
        ok = tuple(value)
    elif (
        origin is Mapping
        and isinstance(value, dict)
        and all(isinstance(v, str) for v in value.values())
    ):
        ok = dict(value)
    if ok is None:
        raise ConfigError(
            f"expected {_describe(tp)}, got {type(value).__name__} {value!r}; "
            f"fix the value in the config file or the --set flag",
            key=key,
        )
    return ok


def _build(cls: Any, raw: Mapping[str, Any], prefix: str) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            where = f"[{prefix[:-1]}]" if prefix else "the top level"
            raise ConfigError(
                f"unknown key; {hint}known keys in {where}: {', '.join(names)}", key=key
            )
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            if not isinstance(v, dict):
                raise ConfigError(
                    f"expected a table [{k}], got {v!r}; write it as a table", key=key
                )
            kwargs[k] = _build(tp, v, f"{key}.")
            continue
        value = _coerce(v, tp, key)
        check = _CHECKS.get(key)
        if check is not None and (problem := check(value)) is not None:
            raise ConfigError(
                f"{problem}, got {value!r}; fix it in the config file or the --set flag", key=key
            )
        kwargs[k] = value
    return cls(**kwargs)


def merge_tables(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` laid over it, nested tables merged key by key (a new dict)."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_tables(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict[str, Any]:
    """``"section.key=value"`` as a nested dict; the value is TOML, or else a bare string.

    The key is a TOML dotted key, so a part with dots is quoted:
    ``dns.static."a.example"=127.0.0.1:8080``."""
    dotted, sep, value_text = text.partition("=")
    example = "expected section.key=value, e.g. --set budget.fetches_per_second=5"
    if not sep or "\n" in dotted:
        raise ConfigError(f"--set {text!r}: {example}")
    doc: dict[str, Any] | None = None
    if "\n" not in value_text:
        try:
            doc = tomllib.loads(f"{dotted} = {value_text}")
        except tomllib.TOMLDecodeError:
            doc = None
    if doc is None:
        # a bare word such as a path or a policy name; json.dumps writes a TOML basic string
        try:
            doc = tomllib.loads(f"{dotted} = {json.dumps(value_text)}")
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--set {text!r}: {example}") from e
    if len(doc) != 1 or not isinstance(next(iter(doc.values())), dict):
        raise ConfigError(f"--set {text!r}: {example}")
    return doc


def load_config(
    path: Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    default_file: Path = DEFAULT_CONFIG_FILE,
) -> Config:
    """The layered configuration.

    ``path`` is ``--config FILE`` (must exist); without it ``default_file`` is read if present.
    ``overrides`` is a nested dict of command-line values. Relative paths in a config file are
    taken relative to that file.
    """
    raw: dict[str, Any] = {}
    source = path if path is not None else (default_file if default_file.is_file() else None)
    if source is not None:
        try:
            raw = tomllib.loads(source.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"config file {str(source)!r} does not exist; fix --config") from e
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {str(source)!r}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {str(source)!r} is not valid TOML: {e}") from e
        raw = _relative_to(raw, source.parent)
    raw = merge_tables(raw, overrides or {})
    config: Config = _build(Config, raw, "")
    _check_whole(config)
    return config


#: DuckDB's memory_limit syntax: a number and a unit, e.g. "256MB", "1.5GiB"
_MEMORY = re.compile(r"^\s*\d+(\.\d+)?\s*(B|[KMGT]i?B)\s*$", re.IGNORECASE)
#: sun_path holds 108 bytes on Linux, one of them the terminating NUL
_UNIX_PATH_MAX = 107


def metrics_address_problem(host: str, allow_remote: bool) -> str | None:
    """Why ``metrics.host`` cannot be listened on, or None."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"{host!r} is not an IP address; use 127.0.0.1 or ::1"
    if not address.is_loopback and not allow_remote:
        return (
            f"{host} is not a loopback address, and /metrics has no authentication; "
            "use 127.0.0.1 or ::1 and let a local agent scrape it, or set "
            "metrics.allow_remote = true behind a firewall"
        )
    return None


def _check_whole(config: Config) -> None:
    """Checks that need more than one key, or more than the type: all of them run at load
    time, so that a bad value stops ``refresher run`` before any file is created."""
    from refresher.crawl._dns import parse_static

    if config.politeness.max_delay < config.politeness.min_delay:
        raise ConfigError(
            f"must be at least politeness.min_delay ({config.politeness.min_delay}); "
            "raise max_delay or lower min_delay",
            key="politeness.max_delay",
        )
    if not _MEMORY.match(config.store.memory_limit):
        raise ConfigError(
            f"{config.store.memory_limit!r} is not a size; write a number and a unit "
            "such as '256MB' or '2GB'",
            key="store.memory_limit",
        )
    try:
        is_dir = config.store.path.is_dir()
    except OSError as e:  # a name too long for the file system (found by fuzzing)
        raise ConfigError(
            f"{str(config.store.path)!r} cannot be a file name ({e.strerror}); fix the path",
            key="store.path",
        ) from e
    if is_dir:
        raise ConfigError(
            f"{str(config.store.path)!r} is a directory; name the DuckDB file, "
            "e.g. /var/lib/refresher/refresher.duckdb",
            key="store.path",
        )
    if config.snapshot.path is not None and config.snapshot.path == config.store.path:
        raise ConfigError(
            "is the store file itself; name another file or leave it unset",
            key="snapshot.path",
        )
    socket_path = str(config.control_socket).encode()
    if len(socket_path) > _UNIX_PATH_MAX:
        raise ConfigError(
            f"the control socket path is {len(socket_path)} bytes, unix sockets take at most "
            f"{_UNIX_PATH_MAX}; set a shorter control.socket",
            key="control.socket",
        )
    if config.metrics.port is not None:
        problem = metrics_address_problem(config.metrics.host, config.metrics.allow_remote)
        if problem is not None:
            raise ConfigError(problem, key="metrics.host")
    parse_static(config.dns.static)
    _check_sinks(config.sinks)
    if config.estimate.known_rates is not None:  # read once here, kept for the allocator
        from refresher.refresh._known import load_known_rates

        load_known_rates(
            config.estimate.known_rates, strip_params=config.discovery.strip_tracking_params
        )
    if config.fleet.dsn:
        # psycopg only when a fleet is configured; the problem never repeats a password
        from refresher.store._pg_dsn import dsn_problem

        problem = dsn_problem(config.fleet.dsn)
        if problem is not None:
            raise ConfigError(problem, key="fleet.dsn")
        if config.fleet.absent_after <= config.fleet.lease_ttl:
            raise ConfigError(
                f"must exceed fleet.lease_ttl ({config.fleet.lease_ttl:g} s): a node counts as "
                "gone only after its leases expired; raise it (default 3600)",
                key="fleet.absent_after",
            )


def _check_sinks(s: SinksConfig) -> None:
    """Sink names installed (entry points looked up, not loaded) and a webhook URL to POST to."""
    import importlib.metadata
    from urllib.parse import urlsplit

    from refresher.archive._sinks import ENTRY_POINT_GROUP

    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for name in s.names:
        if name not in installed:
            raise ConfigError(
                f"no sink {name!r}; installed: {', '.join(sorted(installed)) or 'none'} "
                f"(entry-point group {ENTRY_POINT_GROUP!r})",
                key="sinks.names",
            )
    if s.webhook_url is not None:
        parts = urlsplit(s.webhook_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{s.webhook_url!r} is not an http(s) URL; write e.g. 'http://127.0.0.1:9000/changes'",
                key="sinks.webhook_url",
            )
    elif "webhook" in s.names:
        raise ConfigError(
            "the webhook sink needs a URL to POST to; set sinks.webhook_url",
            key="sinks.webhook_url",
        )


_PATH_KEYS = (
    ("store", "path"),
    ("store", "history_export_dir"),
    ("crawl", "seeds_file"),
    ("estimate", "known_rates"),
    ("control", "socket"),
    ("snapshot", "path"),
    ("archive", "dir"),
    ("sinks", "jsonl_path"),
    ("fleet", "history_dir"),
)


def _relative_to(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(raw)
    for section, key in _PATH_KEYS:
        table = out.get(section)
        # An empty path stays empty so that validation refuses it instead of the directory.
        if isinstance(table, dict) and isinstance(table.get(key), str) and table[key]:
            p = Path(table[key]).expanduser()
            out[section] = {**table, key: str(p if p.is_absolute() else base / p)}
    return out
