"""Prometheus ``/metrics`` on loopback: the components' statistics snapshots, read at scrape time.

:class:`MetricsServer` serves ``GET /metrics`` in the Prometheus text format (version 0.0.4)
from a small trio + h11 handler: no threads, so every ``statistics()`` call happens on the
event loop that owns the component. Each scrape calls the ``sources`` (component name → a
callable returning that component's frozen statistics dataclass, or ``None`` while it does not
exist) and turns every numeric field into a metric named ``refresher_<component>_<field>``:

* a counter (``…_total``) for a total that only grows while the process runs, a gauge for a
  current value — per field, from :data:`METRICS`, else from the dataclass field's
  ``metadata["metric"]`` (``"counter"``, ``"gauge"`` or a :class:`MetricSpec`), else a gauge;
* a mapping field becomes one labelled sample per key (the fetcher's outcomes are
  ``refresher_fetches_total{outcome="timeout"}``), a tuple one sample per index;
* a nested dataclass is flattened: ``seen.cache.hits`` becomes ``refresher_seen_cache_hits``
  (its key in :data:`METRICS` is ``"cache.hits"``);
* booleans become 0 or 1; strings, ``None``, NaN and infinities are left out (no value yet).

A component that is missing, returns ``None`` or raises produces no metrics and the scrape goes
on (a failing source is logged once until it recovers). Process metrics (CPU seconds, resident
memory, open file descriptors) come from prometheus_client's process collector.

The endpoint has no authentication, so it binds 127.0.0.1 unless told otherwise and refuses an
address that is not loopback unless ``allow_remote=True``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import h11
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from refresher._config import metrics_address_problem
from refresher._errors import ConfigError
from refresher.ops._logging import get_logger

__all__ = [
    "METRICS",
    "MetricSpec",
    "MetricsServer",
    "MetricsServerStatistics",
    "SnapshotCollector",
]

log = get_logger("metrics")

Kind = Literal["counter", "gauge"]
Source = Callable[[], object]

#: bytes of a request line and headers at most; a scraper sends a few hundred
_MAX_HEAD = 16 * 1024
#: bytes of request body read at most before the connection is dropped (GET has none)
_MAX_BODY = 64 * 1024
#: seconds a connection may wait for (the rest of) a request before it is closed
_IDLE_SECONDS = 30.0
#: simultaneous connections; more are closed at once (a scraper uses one)
_MAX_CONNECTIONS = 32
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MetricSpec:
    """How one statistics field is exported."""

    kind: Kind = "gauge"
    #: the ``# HELP`` text, with the unit
    help: str = ""
    #: the name after ``refresher_``; default ``<component>_<field>`` (counters gain ``_total``)
    name: str | None = None
    #: the label of a mapping's keys (default ``key``) or a tuple's indices (default ``index``)
    label: str | None = None


def _c(doc: str, **kw: Any) -> MetricSpec:
    return MetricSpec(kind="counter", help=doc, **kw)


def _g(doc: str, **kw: Any) -> MetricSpec:
    return MetricSpec(kind="gauge", help=doc, **kw)


#: Known fields by component. Fields not listed fall back to their dataclass metadata, then to
#: a gauge; list a field here to make it a counter or to name it differently.
METRICS: Mapping[str, Mapping[str, MetricSpec]] = {
    "crawler": {
        "workers": _g("Worker tasks."),
        "busy": _g("Workers holding a host lease."),
        "fetches": _c("Page fetches finished."),
        "changed": _c("Fetches that found the page changed."),
        "not_modified": _c("Fetches answered 304 Not Modified."),
        "errors": _c("Fetches that ended in an error."),
        "denied": _c("Pages robots.txt kept the crawler from (robots denials)."),
        "robots_fetches": _c("robots.txt fetches."),
        "abandoned": _c("Requests cut on the wire: a fleet node lost its lease on their host."),
        "bytes": _c("Decoded body bytes of page fetches."),
        "meaningful": _c("Changes beyond the near-duplicate (simhash) threshold."),
        "duplicates": _c("Fetches whose body another page served recently (content-seen)."),
        "wire_rate": _g("Requests per second on the wire (pages and robots.txt), last 30 s."),
        "stage_seconds": _c(
            "Seconds spent per stage of a refresh, summed over workers: a host held from lease "
            "to release, on the wire, waiting for and in the parse, waiting for the store queue.",
            label="stage",
        ),
    },
    "discovery": {
        "documents": _c("Documents whose links were processed."),
        "dropped": _c("robots.txt sitemap lists dropped because the discovery queue was full."),
        "waited": _c("Documents the crawler waited to queue (the discovery queue was full)."),
        "deferred": _c("Documents left owed in the store while the discovery queue was full."),
        "replayed": _c(
            "Documents' findings handed to discovery from the store: deferred, or left by an "
            "earlier run or a dead node."
        ),
        "links": _c("Links looked at."),
        "new_pages": _c("Pages discovered by links."),
        "edges": _c("Link edges recorded."),
        "queued": _g("Documents waiting for link processing."),
    },
    "fleet": {
        "owned": _g("Partitions this node holds and fetches."),
        "share": _g("Partitions this node should hold (its share of P among the live nodes)."),
        "live_nodes": _g("Live nodes in the fleet, as of the last heartbeat."),
        "heartbeats": _c("Heartbeats written to the fleet's database."),
        "renewals": _c("Partition leases renewed."),
        "claimed": _c("Partition leases granted to this node."),
        "shed": _c("Partitions handed back so that a joining node gets its share."),
        "lost": _c("Leases found taken by another node at renewal."),
        "self_fenced": _c("Partitions dropped because their renewal was late (self-fencing)."),
        "heartbeat_failures": _c("Heartbeats that failed (the database unreachable)."),
        "reachable": _g("1 when the last heartbeat reached the fleet's database."),
        "refused": _g("1 while this node's clock is too far off the database's."),
        "clock_skew": _g("Seconds the database's clock is ahead of this node's."),
        "fenced_records": _c("Fetch records the database refused: their partition moved on."),
        "fenced_hosts": _c("Host updates the database refused: their partition moved on."),
        "inbox_sent": _c("Discovered pages sent to the inbox of another node's partition."),
        "inbox_drained": _c("Inbox rows taken for this node's partitions."),
    },
    "parse": {
        "thread_calls": _c("Parse calls started on a parse thread."),
        "process_calls": _c("Parse calls started in a parse process (discovery.parse_processes)."),
        "loop_calls": _c("Small pages parsed on the event loop itself (discovery.split_cpus)."),
        "waiting": _g("Parse calls waiting for a thread or process now."),
        "processes": _g("Parse processes running now, idle or busy."),
    },
    "frontier": {
        "in_memory": _g("Pages held in memory."),
        "waiting": _g("Pages in memory not yet due."),
        "front": _g("Due pages per front queue (0 = highest priority).", label="queue"),
        "back": _g("Pages in back queues."),
        "active_hosts": _g("Hosts with a back queue."),
        "ready_hosts": _g("Hosts in the ready heap (waiting for their next allowed time)."),
        "leased": _g("Hosts in workers' hands."),
        "hosts_known": _g("Hosts the frontier knows."),
        "dispatched": _c("Pages handed to workers."),
        "cursor": _g("Unix time (seconds) up to which due pages have been loaded."),
        "backing_off": _g("Known hosts waiting out an error backoff."),
        "paused": _g("Known hosts paused."),
        "early": _c("Pages handed out before they were due (frontier.work_conserving)."),
        "lapsed": _c("Budget tokens left unused beyond the pacer's one second of credit."),
    },
    "store": {
        "pages": _g("Pages in the store."),
        "hosts": _g("Hosts in the store."),
        "fetches": _g("Rows in the fetch history."),
        "acknowledged": _c("Fetches committed to the store by this process."),
        "batches": _c("Batches committed."),
        "queued": _g("Fetches waiting for their batch to commit."),
        "last_batch_seconds": _g("Seconds the last batch took to commit."),
    },
    "fetcher": {
        "fetches": _c("Page fetch calls finished."),
        "robots_fetches": _c("robots.txt fetch calls finished."),
        "requests": _c("HTTP requests sent, every redirect hop counted."),
        "outcomes": _c("Page fetches by outcome.", name="fetches", label="outcome"),
        "bytes": _c("Decoded body bytes read over all requests."),
        "open_hosts": _g("Per-host transports kept open."),
        "evictions": _c("Host transports closed to stay within the limit."),
    },
    "sinks": {
        "offered": _c("Changes offered to the change-feed sinks."),
        "delivered": _c("Changes a sink took.", label="sink"),
        "dropped": _c("Changes dropped because a sink's queue was full.", label="sink"),
        "failed": _c("Changes a sink raised on.", label="sink"),
        "queued": _g("Changes waiting in a sink's queue.", label="sink"),
    },
    "archive": {
        "responses": _c("New versions written to the WARC archive."),
        "revisits": _c("Revisit records written to the WARC archive."),
        "bytes": _c("Compressed bytes appended to WARC files."),
        "files": _c("WARC files opened."),
        "skipped": _c("Captures not archived (disk full, write failure)."),
        "failures": _c("Times archiving stopped (disk full, write failure)."),
        "failing": _g("1 while archiving is stopped (it resumes by itself)."),
        "corrupt_files": _g("WARC files found corrupt at start (named in the log)."),
        "truncated_tails": _g("Half-written records cut off WARC files at start."),
    },
    "allocator": {
        "budget": _g("Refresh budget, fetches per second."),
        "pages": _g("Pages the allocation covers."),
        "uniform_interval": _g("Seconds between fetches of one page under the uniform rate."),
        "solves": _c("Allocation solves."),
        "last_solve_seconds": _g("Seconds the last allocation solve took (wall)."),
        "last_solve_cpu_seconds": _g(
            "CPU seconds of the last allocation solve's estimate and plan (the re-plan "
            "rule's cost)."
        ),
        "solve_reasons": _c(
            "Allocation solves by why: start, settings, clock (policy.resolve_interval), "
            "learned (policy.replan_share of the pages fetched since the last).",
            name="allocator_solves_by_reason",
            label="reason",
        ),
        "fetched_since_solve": _g("Fetches recorded since the last allocation solve began."),
        "replan_fetches": _g("Fetches since the last solve that call for the next one."),
        "unplaced": _g("Budget (fetches per second) the host politeness caps left unplaced."),
        "explored": _g("Pages given only the exploration share of the budget."),
        "expected_freshness": _g("Estimated mean freshness of the plan in force (0 to 1)."),
        "expected_age": _g("Estimated mean age of the plan in force, seconds."),
    },
    "fleet_budget": {
        "coordinator": _g("1 while this node holds the fleet budget's coordinator lease."),
        "epoch": _g("The coordinator epoch of the fleet solution in use (0: none yet)."),
        "mu": _g("The fleet's level (the policy's multiplier) in use."),
        "unplaced": _g("Budget (fetches per second) the fleet's host caps left unplaced."),
        "rounds": _g("Rounds the last fleet solution took."),
        "nodes": _g("Nodes answering the fleet budget, as last seen."),
        "node_budget": _g("Fetches per second this node's last plan placed (its part of B)."),
        "solves": _c("Fleet budget solutions this node published as coordinator."),
        "solve_reasons": _c(
            "Fleet budget solutions by why their solve began: start, settings, clock "
            "(policy.resolve_interval), learned (policy.replan_share of the fleet's pages "
            "fetched since the last), nodes (a node joined or left, or its pages moved).",
            name="fleet_budget_solves_by_reason",
            label="reason",
        ),
        "fetched_since_solve": _g(
            "Fetches the live nodes acknowledged since the last fleet solve began (coordinator)."
        ),
        "replan_fetches": _g("Fleet-wide fetches that call for the next solve (coordinator)."),
        "errors": _c("Fleet budget ticks that failed on the database."),
    },
    "seen": {
        "cache.capacity": _g("Entries the URL-seen CLOCK cache holds at most."),
        "cache.size": _g("Entries in the URL-seen CLOCK cache."),
        "cache.hits": _c("URL-seen cache lookups that found their fingerprint."),
        "cache.misses": _c("URL-seen cache lookups that did not."),
        "cache.evictions": _c("URL-seen cache entries pushed out by inserts."),
        "cache.hit_rate": _g("URL-seen cache hits / lookups since start (0 to 1)."),
        "cache.nbytes": _g("Bytes of the URL-seen cache's arrays."),
        "urls": _c("URLs given to the URL-seen test."),
        "batch_duplicates": _c("URLs repeated within one URL-seen call."),
        "store_lookups": _c("Batched URL-seen lookups in the store."),
        "store_checked": _c("Fingerprints looked up in the store (cache misses)."),
        "store_hits": _c("Fingerprints the store knew."),
        "new": _c("URLs found never seen before."),
    },
    "notifier": {
        "enabled": _g("1 when NOTIFY_SOCKET names a usable address."),
        "datagrams_sent": _c("sd_notify datagrams the manager accepted."),
        "send_failures": _c("sd_notify datagrams lost."),
        "watchdog_pings": _c("WATCHDOG=1 pings sent."),
        "watchdog_withheld": _c("Watchdog turns without a ping (stale scheduler heartbeat)."),
    },
}


class SnapshotCollector:
    """A prometheus_client collector turning statistics snapshots into metric families."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        *,
        specs: Mapping[str, Mapping[str, MetricSpec]] = METRICS,
    ) -> None:
        for component in sources:
            if not _NAME.fullmatch(component):
                raise ValueError(
                    f"metrics source name {component!r} is not a valid metric name part; "
                    "use letters, digits and underscores, as in 'crawler'"
                )
        self._sources = dict(sources)
        self._specs = specs
        self._failing: set[str] = set()
        self.source_errors = 0

    def collect(self) -> Iterator[Metric]:
        for component, source in self._sources.items():
            snapshot = self._snapshot(component, source)
            if snapshot is None:
                continue
            yield from _families(component, snapshot, self._specs.get(component, {}), "")

    def _snapshot(self, component: str, source: Source) -> Any:
        try:
            snapshot = source()
        except Exception as e:
            # One broken component must not take every other metric down with it.
            self.source_errors += 1
            self._fail(component, f"statistics raised {type(e).__name__}: {e}")
            return None
        if snapshot is None:
            return None
        if not dataclasses.is_dataclass(snapshot) or isinstance(snapshot, type):
            self._fail(component, f"statistics returned a {type(snapshot).__name__}")
            return None
        self._failing.discard(component)
        return snapshot

    def _fail(self, component: str, error: str) -> None:
        if component not in self._failing:
            self._failing.add(component)
            log.warning(
                "metrics source failed; its metrics are left out",
                component=component,
                error=error,
                hint="a bug in that component's statistics(); the other metrics are served",
            )


def _families(
    component: str, snapshot: Any, specs: Mapping[str, MetricSpec], prefix: str
) -> Iterator[Metric]:
    for f in dataclasses.fields(snapshot):
        value = getattr(snapshot, f.name)
        key = prefix + f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _families(component, value, specs, key + ".")
            continue
        spec = specs.get(key) or _spec_from(f.metadata.get("metric"))
        family = _family(component, key.replace(".", "_"), value, spec)
        if family is not None:
            yield family


def _spec_from(meta: object) -> MetricSpec:
    if isinstance(meta, MetricSpec):
        return meta
    if meta == "counter":
        return MetricSpec(kind="counter")
    return MetricSpec()


def _number(value: object) -> float | None:
    if isinstance(value, bool | int | float):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def _family(component: str, field: str, value: object, spec: MetricSpec) -> Metric | None:
    name = "refresher_" + (spec.name or f"{component}_{field}")
    doc = spec.help or f"The {field} field of the {component} statistics."
    make = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    if isinstance(value, Mapping):
        items = [(str(k), _number(v)) for k, v in value.items()]
        label = spec.label or "key"
    elif isinstance(value, tuple | list):
        items = [(str(i), _number(v)) for i, v in enumerate(value)]
        label = spec.label or "index"
    else:
        number = _number(value)
        return None if number is None else make(name, doc, value=number)
    family = make(name, doc, labels=[label])
    for key, number in items:
        if number is not None:
            family.add_metric([key], number)
    return family


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MetricsServerStatistics:
    port: int | None  # the bound port, None before run() has bound it
    scrapes: int  # /metrics answered
    not_found: int  # requests for other paths or methods
    bad_requests: int  # requests that were not HTTP/1.1, or too large
    source_errors: int  # statistics() calls that raised during scrapes


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0: any free port; :meth:`run` reports it)."""

    def __init__(
        self,
        *,
        port: int,
        host: str = "127.0.0.1",
        sources: Mapping[str, Source],
        allow_remote: bool = False,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"{port!r} is not a TCP port; use 1 to 65535", key="metrics.port")
        problem = metrics_address_problem(host, allow_remote)
        if problem is not None:
            raise ConfigError(problem, key="metrics.host")
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector(sources)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        self._bound: int | None = None
        self._connections = 0
        self._scrapes = 0
        self._not_found = 0
        self._bad = 0

    def render(self) -> bytes:
        """The current metrics in the Prometheus text format (what a scrape returns)."""
        return generate_latest(self.registry)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, hand the bound port to ``task_status.started``, serve until cancelled."""
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as e:
            raise ConfigError(
                f"cannot listen on {_hostport(self.host, self.port)} for /metrics: "
                f"{e.strerror or e}; choose another port",
                key="metrics.port",
            ) from e
        self._bound = listeners[0].socket.getsockname()[1]
        log.info("metrics listening", url=f"http://{_hostport(self.host, self._bound)}/metrics")
        task_status.started(self._bound)
        await trio.serve_listeners(self._serve, listeners)

    def statistics(self) -> MetricsServerStatistics:
        return MetricsServerStatistics(
            port=self._bound,
            scrapes=self._scrapes,
            not_found=self._not_found,
            bad_requests=self._bad,
            source_errors=self.collector.source_errors,
        )

    async def _serve(self, stream: trio.SocketStream) -> None:
        if self._connections >= _MAX_CONNECTIONS:
            await stream.aclose()
            return
        self._connections += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        try:
            async with stream:
                try:
                    while await self._exchange(stream, conn):
                        conn.start_next_cycle()
                except h11.RemoteProtocolError:
                    self._bad += 1
                    await _send_error(stream, conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scraper went away
        finally:
            self._connections -= 1

    async def _exchange(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        """Answer one request; ``False`` when the connection is to be closed."""
        with trio.move_on_after(_IDLE_SECONDS):
            request = await _next_event(stream, conn)
            if not isinstance(request, h11.Request):
                return False  # closed between requests
            body = 0
            while not isinstance(event := await _next_event(stream, conn), h11.EndOfMessage):
                if not isinstance(event, h11.Data):
                    return False
                body += len(event.data)
                if body > _MAX_BODY:
                    self._bad += 1
                    return False
            status, content_type, payload = self._answer(request)
            headers = [("content-type", content_type), ("content-length", str(len(payload)))]
            if status == 405:
                headers.append(("allow", "GET, HEAD"))
            await _send(stream, conn, h11.Response(status_code=status, headers=headers))
            if request.method != b"HEAD":
                await _send(stream, conn, h11.Data(data=payload))
            await _send(stream, conn, h11.EndOfMessage())
            return conn.our_state is not h11.MUST_CLOSE
        return False  # idle too long

    def _answer(self, request: h11.Request) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if request.target.split(b"?", 1)[0] != b"/metrics":
            self._not_found += 1
            return 404, text, b"not found; the metrics are at /metrics\n"
        if request.method not in (b"GET", b"HEAD"):
            self._not_found += 1
            return 405, text, b"method not allowed; use GET\n"
        try:
            body = self.render()
        except Exception as e:
            log.error("metrics scrape failed", error=f"{type(e).__name__}: {e}")
            return 500, text, b"the metrics could not be rendered; see the daemon's log\n"
        self._scrapes += 1
        return 200, CONTENT_TYPE_PLAIN_0_0_4, body


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(_MAX_HEAD))


async def _send(stream: trio.SocketStream, conn: h11.Connection, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _send_error(stream: trio.SocketStream, conn: h11.Connection) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = b"bad request\n"
    headers = [("content-length", str(len(body))), ("connection", "close")]
    try:
        await _send(stream, conn, h11.Response(status_code=400, headers=headers))
        await _send(stream, conn, h11.Data(data=body))
        await _send(stream, conn, h11.EndOfMessage())
    except h11.LocalProtocolError:
        pass


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
