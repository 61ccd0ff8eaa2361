"""``refresher run``: the daemon, one nursery tree.

Start-up: open the store (migrating it), add the configured seeds, start the store writer, the
frontier's loader, the allocator, the workers, the control endpoint, progress logging and the
watchdog — each with ``nursery.start`` — and only then tell systemd READY=1.

Signals: SIGTERM/SIGINT stop taking work, give in-flight fetches ``daemon.drain_timeout``
seconds to finish, commit the writer's last batch and exit 0. SIGHUP re-reads the config and
applies its live keys; each restart-only key that changed is logged by name and keeps its running
value (the table is :data:`refresher.ops._reload.RELOAD`).
"""

from __future__ import annotations

import ctypes
import gc
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from refresher import policies
from refresher._config import Config
from refresher._errors import ConfigError, ControlError, InvalidURL, RefresherError
from refresher.archive._archive import open_writer
from refresher.archive._keep import Keeper
from refresher.archive._retention import HistoryPruning, HistoryRetention, Pruner, prune_absent
from refresher.archive._sinks import ChangeFeed, load_sinks
from refresher.archive._warc import WarcWriter
from refresher.crawl._dns import Resolver
from refresher.crawl._fetch import Fetcher
from refresher.crawl._frontier import DelayLimits, Frontier
from refresher.crawl._workers import Crawler, parse_stage
from refresher.discover._discovery import Discovery
from refresher.discover._filter import UrlFilter
from refresher.discover._parse import available as parse_available
from refresher.discover._seen import UrlSeen
from refresher.discover._threads import Parsers
from refresher.discover._url import TRACKING_PARAMS, canonicalize
from refresher.ops._control import ControlServer
from refresher.ops._logging import configure_logging, get_logger
from refresher.ops._metrics import MetricsServer
from refresher.ops._notify import Notifier, format_status
from refresher.ops._reload import RELOAD, changed_keys, effective
from refresher.refresh._allocate import Allocator, InputSettings, plan, priority_level
from refresher.refresh._replan import ReplanRule
from refresher.store._backup import backup_service
from refresher.store._duckdb import DuckDBStore, StoreService
from refresher.store._interface import HostRow, NewPage, PageRow
from refresher.store._snapshot import Snapshotter, snapshot_path

if TYPE_CHECKING:
    from refresher.fleet._budget import FleetBudget
    from refresher.fleet._history import HistoryService
    from refresher.fleet._node import FleetNode
    from refresher.store._postgres import PostgresStore

__all__ = ["Daemon", "check_seeds", "run_daemon"]

log = get_logger("daemon")


def check_seeds(
    urls: Sequence[str], *, source: str = "seed", strip_params: bool = True
) -> tuple[list[NewPage], list[dict[str, str]]]:
    """Valid seeds as new pages, and the rejected ones with their reasons.

    ``strip_params`` must match ``discovery.strip_tracking_params``: a page's identity may
    not depend on whether it was seeded or found.
    """
    pages: list[NewPage] = []
    rejected: list[dict[str, str]] = []
    strip = TRACKING_PARAMS if strip_params else None
    for url in urls:
        try:
            c = canonicalize(url, strip_params=strip)
        except InvalidURL as e:
            rejected.append({"url": url, "reason": e.reason})
            continue
        pages.append(NewPage(url=c.url, host=c.host_key, scheme=c.scheme, source=source))
    return pages, rejected


class Daemon:
    """The running daemon. ``config_loader`` re-reads the configuration (on SIGHUP too)."""

    def __init__(
        self,
        config_loader: Callable[[], Config],
        *,
        notifier: Notifier | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._load_config = config_loader
        self.config = config_loader()
        self.notifier = notifier or Notifier()
        self._wall = wall_clock
        self._beat = 0.0
        self._started = 0.0
        self._stopping = False
        self._rate = 0.0  # fetches per second over the last progress interval
        self._store: StoreService | PostgresStore | None = None
        self._fleet: FleetNode | None = None
        self._fleet_budget: FleetBudget | None = None
        self._history: HistoryService | None = None
        self._frontier: Frontier | None = None
        self._allocator: Allocator | None = None
        self._crawler: Crawler | None = None
        self._parsers: Parsers | None = None
        self._fetcher: Fetcher | None = None
        self._discovery: Discovery | None = None
        self._owed_kept = 0  # documents owed to discovery, kept while it is off
        self._snapshotter: Snapshotter | None = None
        self._warc: WarcWriter | None = None
        self._feed: ChangeFeed | None = None
        self._prune: Pruner | None = None

    @property
    def store(self) -> StoreService | PostgresStore | None:
        """The store service while running (for in-process tools such as the demo)."""
        return self._store

    # -- wiring ----------------------------------------------------------------------------

    async def _page_source(
        self, after: tuple[float, int], until: float, limit: int, known: frozenset[int]
    ) -> tuple[list[PageRow], dict[int, HostRow]]:
        assert self._store is not None
        return await self._store.load_due(after=after, until=until, limit=limit, known_hosts=known)

    async def add_seeds(self, urls: Sequence[str]) -> dict[str, Any]:
        """Add ``urls``; returns counts of added and known pages and the rejected ones."""
        assert self._store is not None and self._frontier is not None
        pages, rejected = check_seeds(
            urls, strip_params=self.config.discovery.strip_tracking_params
        )
        if self._discovery is not None:
            self._discovery.add_seed_hosts(p.host for p in pages)
        for r in rejected:
            log.warning("seed rejected", url=r["url"], reason=r["reason"])
        rows, hosts = await self._store.add_pages(pages, now=self._wall())
        self._frontier.add(rows, hosts)
        if rows and self._allocator is not None:
            self._allocator.pages_added(len(rows))
        return {"added": len(rows), "known": len(pages) - len(rows), "rejected": rejected}

    async def _keep_owed(self) -> None:
        """Discovery is off: the findings an earlier run left owed (a stop or a crash before
        its discovery stored them) stay in the store as they are, and no fetch adds any; the
        next run with discovery on stores their links. Dropping them would lose those links
        for good: a page's next fetch does not process an unchanged body again."""
        assert self._store is not None
        self._owed_kept = (await self._store.status(now=self._wall())).owed
        if self._owed_kept:
            log.warning(
                "findings owed to discovery kept while it is off",
                documents=self._owed_kept,
                hint="their links are stored once discovery.enabled is true again (a restart)",
            )

    async def _make_discovery(
        self, c: Config, frontier: Frontier, allocator: Allocator
    ) -> Discovery:
        assert self._store is not None
        store = self._store
        parse_available()  # a broken third-party processor stops the daemon here

        seed_hosts, counts = await store.discovery_scope()
        url_filter = UrlFilter.from_config(c.discovery.filter_config(), seeds_hosts=seed_hosts)
        url_filter.set_pages(counts)

        return Discovery(
            store=store,
            frontier=frontier,
            allocator=allocator,
            url_filter=url_filter,
            seen=UrlSeen(capacity=c.discovery.seen_cache_entries, lookup=store.known_fingerprints),
            include_media=c.discovery.include_media,
            queue=c.discovery.queue,
            wall_clock=self._wall,
        )

    # -- control ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pid": _pid(),
            "uptime": round(trio.current_time() - self._started, 3),
            "stopping": self._stopping,
            "fetches_per_second": round(self._rate, 3),
            "store_path": str(self.config.store.path),
        }
        for name, part in (
            ("store", self._store),
            ("frontier", self._frontier),
            ("allocator", self._allocator),
            ("crawler", self._crawler),
            ("fetcher", self._fetcher),
            ("discovery", self._discovery),
            ("snapshot", self._snapshotter),
            ("archive", self._warc),
            ("sinks", self._feed),
            ("fleet", self._fleet),
            ("fleet_budget", self._fleet_budget),
            ("history", self._history),
        ):
            if part is not None:
                out[name] = _plain(part.statistics())
        if self._crawler is not None:  # the parse stage's calls on threads and in processes
            out["parse"] = _plain(self._crawler.parsers.statistics())
        if self._allocator is not None:
            # how the estimator reads the history now ([estimate], a reload changes it)
            out["estimator"] = _plain(self._allocator.inputs)
        if self._discovery is not None:
            out["filter"] = _plain(self._discovery.filter.statistics())
            out["seen"] = _plain(self._discovery.seen.statistics())
        elif self._owed_kept:
            out["owed_documents"] = self._owed_kept  # kept for discovery, which is off
        return out

    async def _status_with_hosts(self, limit: Any) -> dict[str, Any]:
        """:meth:`status` with the host list of ``refresher status`` (``limit`` busiest, or all
        when None, and every paused host or host in backoff)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ValueError('"hosts_limit" must be a whole number or null')
        out = self.status()
        if self._store is not None:
            now = self._wall()
            rows = await self._store.host_summary(now=now, limit=limit)
            out["host_list"] = [asdict(h) for h in rows]
        return out

    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "status":
            return await self._status_with_hosts(req.get("hosts_limit", 10))
        if op == "seed":
            urls = req.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ValueError('seed needs "urls": a list of strings')
            return await self.add_seeds(urls)
        if op == "backup":
            dest = req.get("dest")
            if not isinstance(dest, str) or not dest:
                raise ValueError('backup needs "dest": the path of the new backup file')
            if not isinstance(self._store, StoreService):
                raise ControlError(
                    "backup copies the embedded store; a fleet's state is in PostgreSQL: "
                    "back the whole fleet up with `refresher fleet backup DEST`",
                    kind="fleet",
                )
            result = await backup_service(self._store, Path(dest))
            log.info("backup written", **asdict(result))
            return asdict(result)
        if op == "reload":
            await self.reload()
            return {}
        if op == "policy_table":
            assert self._allocator is not None
            budget = req.get("budget")
            if budget is not None and not (isinstance(budget, int | float) and budget > 0):
                raise ValueError('"budget" must be a number of fetches per second > 0')
            return await self._allocator.table(None if budget is None else float(budget))
        if op == "policy":
            name = req.get("name")
            if name not in policies.available():
                raise ControlError(
                    f"unknown policy {name!r}; known: {', '.join(policies.available())}",
                    kind="unknown_policy",
                )
            assert self._allocator is not None and self._store is not None
            configured, budget, now = self.config.policy.name, self._allocator.budget, self._wall()
            await self._store.switch_policy(name, configured=configured, budget=budget, now=now)
            self._allocator.configure(budget=budget, policy=name)
            log.info("policy switched", policy=name)
            return {"policy": name}
        if op in ("pause", "resume"):
            host = req.get("host")
            if not isinstance(host, str):
                raise ValueError(f'{op} needs "host": a host name such as "example.org"')
            assert self._store is not None and self._frontier is not None
            paused = op == "pause"
            # In memory first: no new request to the host starts while the store catches up.
            self._frontier.set_paused(host, paused)
            found = await self._store.set_paused(host, paused)
            if not found:
                raise ControlError(
                    f"unknown host {host!r}; `refresher status --hosts` lists them",
                    kind="unknown_host",
                )
            # The loader skips paused hosts: reload so their held pages go, or come back.
            self._frontier.reset()
            return {"host": host, "paused": paused}
        raise ValueError(
            f"unknown op {op!r}; known: status, seed, reload, pause, resume, policy, "
            "policy_table, backup"
        )

    async def reload(self) -> None:
        """Re-read the configuration and apply what may change while running."""
        self.notifier.reloading()
        try:
            new = self._load_config()
            seeds = new.all_seeds()
        except ConfigError as e:
            log.error("reload failed; keeping the running configuration", error=str(e))
            self.notifier.ready()
            return
        old = self.config
        changed = changed_keys(old, new)
        for key in changed:
            if RELOAD[key] == "restart":
                log.warning("config key changed; takes effect after a restart", key=key)
        # Restart-only keys keep their running values, so the config in force is what runs.
        new = effective(old, new)
        try:
            self._configure(old, new)
        except ConfigError as e:
            log.error("reload failed; keeping the running configuration", error=str(e))
            self.notifier.ready()
            return
        self.config = new
        if seeds:
            await self.add_seeds(seeds)
        log.info("configuration reloaded")
        self.notifier.ready()

    def _configure(self, old: Config, new: Config) -> None:
        """Hand each component its live settings (see refresher.ops._reload.RELOAD)."""
        assert self._allocator is not None and self._crawler is not None
        if self._fetcher is not None:  # first: it refuses impossible values
            self._fetcher.configure(new.fetch, user_agent=new.crawl.user_agent)
        configure_logging(format=new.log.format, level=new.log.level)
        self._crawler.configure(new)
        if self._frontier is not None:  # hosts already known wait no longer than now allowed
            self._frontier.set_limits(DelayLimits.from_config(new.politeness))
        if self._fleet is not None:
            self._fleet.configure(new)
        if self._discovery is not None:
            self._discovery.configure(new.discovery)
        self._configure_archive(old, new)
        # A policy named anew in the config wins over an earlier switch; otherwise it stays.
        policy = self._allocator.policy if old.policy.name == new.policy.name else new.policy.name
        self._allocator.configure(
            budget=new.budget.fetches_per_second,
            policy=policy,
            explore=new.policy.explore,
            weights=new.policy.weights,
            decide=new.policy.decide,
            replan=ReplanRule.from_config(new.policy),
            inputs=InputSettings.from_config(new),
        )
        if self._fleet_budget is not None:  # the fleet's coordinator asks the same rule
            self._fleet_budget.replan = ReplanRule.from_config(new.policy)

    def _configure_archive(self, old: Config, new: Config) -> None:
        """Retention and the free-space floor are live (the rest of [archive] is restart-only,
        see refresher.ops._reload.RELOAD)."""
        if self._prune is not None:
            self._prune.keep_versions = new.archive.keep_versions
            self._prune.max_bytes = new.archive.max_bytes
            self._prune.interval = new.archive.prune_interval
            self._prune.history = _history_retention(new)
        if self._warc is not None:
            self._warc.min_free_bytes = new.archive.min_free_bytes

    # -- services ----------------------------------------------------------------------------

    def _metrics_server(self, c: Config) -> MetricsServer:
        assert c.metrics.port is not None
        parts: dict[str, Any] = {
            "crawler": lambda: self._crawler,
            "frontier": lambda: self._frontier,
            "store": lambda: self._store,
            "fetcher": lambda: self._fetcher,
            "allocator": lambda: self._allocator,
            "snapshot": lambda: self._snapshotter,
            "archive": lambda: self._warc,
            "sinks": lambda: self._feed,
            "fleet": lambda: self._fleet,
            "fleet_budget": lambda: self._fleet_budget,
            "history": lambda: self._history,
        }

        def snapshot(get: Callable[[], Any]) -> Callable[[], object]:
            return lambda: part.statistics() if (part := get()) is not None else None

        sources = {name: snapshot(get) for name, get in parts.items()}
        sources["notifier"] = self.notifier.statistics
        sources["discovery"] = snapshot(lambda: self._discovery)
        sources["seen"] = snapshot(lambda: self._discovery.seen if self._discovery else None)
        sources["parse"] = snapshot(lambda: self._crawler.parsers if self._crawler else None)
        return MetricsServer(
            port=c.metrics.port,
            host=c.metrics.host,
            allow_remote=c.metrics.allow_remote,
            sources=sources,
        )

    def _pruner(self, c: Config, writer: WarcWriter | None) -> Pruner:
        """Retention: one node's store and archive, or a fleet node's own WARC files (and the
        fleet's history, one node at a time), never while a fleet backup copies files."""
        assert self._store is not None
        directory, lock, others = c.archive_dir, None, None
        if c.fleet.enabled:
            from refresher.store._pg_archive import archive_base, node_archive_dir, pass_lock

            directory = node_archive_dir(c)
            lock = partial(pass_lock, c.fleet.dsn, c.fleet.node_id)
            others = partial(
                prune_absent,
                dsn=c.fleet.dsn,
                node_id=c.fleet.node_id,
                absent_after=c.fleet.absent_after,
                base=archive_base(c),
                keep_versions=c.archive.keep_versions,
                max_bytes=c.archive.max_bytes,
            )
        self._prune = Pruner(
            store=self._store,
            directory=directory,
            keep_versions=c.archive.keep_versions,
            max_bytes=c.archive.max_bytes,
            interval=c.archive.prune_interval,
            protect=writer.unsettled if writer is not None else set,
            rotate=writer.rotate if writer is not None else None,
            history=_history_retention(c),
            archive=writer is not None,
            on_change=self._snapshot_rebuild,
            lock=lock,
            others=others,
        )
        return self._prune

    async def _snapshot_rebuild(self) -> None:
        if self._snapshotter is not None:
            await self._snapshotter.rebuild_next()

    def _fleet_node(self, frontier: Frontier, allocator: Allocator) -> FleetNode:
        from refresher.fleet._node import FleetNode
        from refresher.store._postgres import PostgresStore

        assert isinstance(self._store, PostgresStore)
        self._fleet = FleetNode(
            self.config,
            store=self._store,
            frontier=frontier,
            rate=lambda: self._rate,
            pages_added=allocator.pages_added,
            # the crawler starts after the node (the node's first claims come first)
            abandon=lambda hosts: 0 if self._crawler is None else self._crawler.abandon(hosts),
        )
        return self._fleet

    def _fleet_planner(self, c: Config) -> FleetBudget:
        """The fleet's one budget as the allocator's planner (issue 13: one μ for all nodes)."""
        from refresher.fleet._budget import FleetBudget
        from refresher.store._pg_budget import PgBudget

        def replan() -> None:
            if self._allocator is not None:
                self._allocator.poke()

        def acknowledged() -> int:
            return 0 if self._store is None else self._store.statistics().acknowledged

        def plan_seconds() -> float:
            a = self._allocator
            return 0.0 if a is None else a.statistics().last_solve_cpu_seconds

        self._fleet_budget = FleetBudget(
            store=PgBudget(c.fleet.dsn),
            node_id=c.fleet.node_id,
            lease_ttl=c.fleet.lease_ttl,
            replan=ReplanRule.from_config(c.policy),
            acknowledged=acknowledged,
            plan_seconds=plan_seconds,
            on_solution=replan,
        )
        return self._fleet_budget

    def _history_service(self, c: Config) -> HistoryService:
        """This node's history published to ``fleet.history_dir`` as Parquet."""
        from refresher.fleet._history import HistoryService
        from refresher.store._parquet import HistoryPublisher

        publisher = HistoryPublisher(c.fleet.dsn, c.fleet.node_id, Path(c.fleet.history_dir))
        # at least two looks per absent_after: a gone node's tail is published in time
        self._history = HistoryService(
            publisher,
            interval=min(30.0, c.fleet.absent_after / 2),
            absent_after=c.fleet.absent_after,
        )
        return self._history

    async def _heartbeat(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            self._beat = trio.current_time()
            await trio.sleep(0.5)

    async def _progress(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        assert self._crawler is not None and self._store is not None
        last_t, last_n = trio.current_time(), 0
        while True:
            await trio.sleep(self.config.log.progress_interval)
            c, s = self._crawler.statistics(), self._store.statistics()
            now = trio.current_time()
            self._rate = (c.fetches - last_n) / max(now - last_t, 1e-9)
            last_t, last_n = now, c.fetches
            f = self._frontier.statistics() if self._frontier else None
            log.info(
                "progress",
                pages=s.pages,
                fetches=c.fetches,
                fetches_per_second=round(self._rate, 2),
                changed=c.changed,
                not_modified=c.not_modified,
                errors=c.errors,
                denied=c.denied,
                acknowledged=s.acknowledged,
                in_memory=f.in_memory if f else None,
                active_hosts=f.active_hosts if f else None,
            )
            self.notifier.status(
                format_status(pages=s.pages, fetches_per_second=self._rate, freshness=None)
            )

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit status."""
        c = self.config
        configure_logging(format=c.log.format, level=c.log.level)
        self._started = trio.current_time()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            # The parse stage first: its processes import (~1 s of wall time) while the store
            # opens and the seeds are added, not while the first pages wait for them; it
            # ends after the crawler.
            async with parse_stage(c) as self._parsers:
                if c.fleet.enabled:
                    return await self._run_fleet(signals)
                return await self._run_embedded(signals)

    async def _run_embedded(self, signals: Any) -> int:
        """:meth:`run` on the embedded DuckDB store."""
        c = self.config
        store = await trio.to_thread.run_sync(
            lambda: DuckDBStore(c.store.path, memory_limit=c.store.memory_limit)
        )
        log.info("store opened", path=str(c.store.path), schema=store.schema_version())
        self._warc = await trio.to_thread.run_sync(open_writer, c, store)
        service = StoreService(
            store,
            flush_interval=c.store.flush_interval,
            batch_size=c.store.batch_size,
            archive=self._warc,
        )
        await self._serve_store(service, signals, close=store.close)
        log.info("stopped", acknowledged=service.statistics().acknowledged)
        return 0

    async def _serve_store(
        self, service: StoreService | PostgresStore, signals: Any, *, close: Callable[[], None]
    ) -> None:
        """Run the services on ``service`` until they stop; then ``close`` the store under it
        (in a thread) and the WARC writer."""
        self._store = service
        try:
            async with trio.open_nursery() as outer:
                await outer.start(service.run)
                try:
                    await self._run_services(signals)
                finally:
                    service.close()
        finally:
            await trio.to_thread.run_sync(close)
            if self._warc is not None:
                self._warc.close()

    async def _run_fleet(self, signals: Any) -> int:
        """:meth:`run` for a node of a fleet: the store is the fleet's PostgreSQL (the node's
        WARC files indexed there; no snapshot or pruning of an embedded file), membership
        decides which hosts it fetches."""
        from refresher.fleet._assignment import LeaseTiming
        from refresher.store._pg_archive import node_archive_dir
        from refresher.store._pg_dsn import redact
        from refresher.store._pg_retry import unavailable
        from refresher.store._postgres import PostgresStore

        c = self.config
        # Before anything is opened: the ttl must leave room to stop fetching in time.
        LeaseTiming(ttl=c.fleet.lease_ttl, fetch_deadline=c.fetch.timeout).check()
        service = await trio.to_thread.run_sync(PostgresStore.connect, c)
        # PostgreSQL away while running: the queue waits and retries, membership stops the
        # fetching; both resume when it is back.
        service.transient = unavailable
        # Each node keeps its own WARC files in a directory of its own (its node id in their
        # names too), under the fleet's shared directory when there is one, indexed in the
        # fleet's warc_records; their records are synced before the batch that acknowledges
        # their fetches commits, as on one node.
        prefix = f"{c.archive.prefix}-{c.fleet.node_id}"
        own = replace(c, archive=replace(c.archive, dir=node_archive_dir(c)))
        self._warc = await trio.to_thread.run_sync(
            lambda: open_writer(own, service.store, prefix=prefix)
        )
        service.archive = self._warc
        log.info("store opened", fleet=redact(c.fleet.dsn), node=c.fleet.node_id)
        if c.snapshot.interval > 0:
            log.info(
                "no snapshot file in a fleet: `refresher query --fleet` reads one consistent "
                "PostgreSQL snapshot and the Parquet history"
            )
        try:
            await self._serve_store(service, signals, close=service.store.close)
        finally:
            if self._fleet_budget is not None:
                await trio.to_thread.run_sync(self._fleet_budget.close)
            if self._history is not None:
                await trio.to_thread.run_sync(self._history.publisher.close)
        log.info("stopped", acknowledged=service.statistics().acknowledged)
        return 0

    async def _run_services(self, signals: Any) -> None:
        c = self.config
        frontier = self._make_frontier(c)
        allocator = await self._make_allocator(c, frontier)
        if c.discovery.enabled:
            self._discovery = await self._make_discovery(c, frontier, allocator)
        else:
            await self._keep_owed()
        await self._add_configured_seeds(c)
        resolver = Resolver(static=c.dns.static, ttl=c.dns.ttl, negative_ttl=c.dns.negative_ttl)
        async with (
            trio.open_nursery() as services,
            Fetcher(
                user_agent=c.crawl.user_agent,
                resolver=resolver,
                timeout=c.fetch.timeout,
                max_body_bytes=c.fetch.max_body_bytes,
                max_redirects=c.fetch.max_redirects,
                max_open_hosts=frontier.max_back + c.crawl.workers,
            ) as fetcher,
        ):
            self._fetcher = fetcher
            await self._start_pipeline(services, c, frontier, allocator)
            crawler = self._make_crawler(c, frontier, fetcher, allocator)
            async with trio.open_nursery() as work:
                # The first fetch can finish before "ready" is logged: the line says when the
                # crawling began, so a harness measures from there (unix s).
                crawling_since = self._wall()
                await work.start(crawler.run)
                await self._start_endpoints(services, c, frontier)
                self.notifier.ready(status="crawling")
                log.info(
                    "ready",
                    workers=c.crawl.workers,
                    budget=c.budget.fetches_per_second,
                    policy=allocator.policy,
                    control=str(c.control_socket),
                    crawling_since=crawling_since,
                )
                await self._until_stopped(signals, crawler, frontier)
                work.cancel_scope.cancel()
            if self._fleet is not None:
                # After the last fetches are queued: their batch commits, then the leases go.
                await self._fleet.stop()
            services.cancel_scope.cancel()

    def _make_frontier(self, c: Config) -> Frontier:
        self._frontier = Frontier(
            source=self._page_source,
            budget=c.budget.fetches_per_second,
            front_queues=c.frontier.front_queues,
            back_queues=c.crawl.workers * c.frontier.back_queues_per_worker,
            window=c.frontier.window,
            prioritize=lambda page, now: priority_level(page, now, c.frontier.front_queues),
            max_pages_in_memory=c.frontier.max_pages_in_memory,
            wall_clock=self._wall,
            work_conserving=c.frontier.work_conserving,
            limits=DelayLimits.from_config(c.politeness),
        )
        return self._frontier

    async def _make_allocator(self, c: Config, frontier: Frontier) -> Allocator:
        assert self._store is not None
        policy = await self._store.policy_in_force(c.policy.name)
        if policy != c.policy.name:
            log.info(
                "policy switched earlier stays in force", policy=policy, configured=c.policy.name
            )
        self._allocator = Allocator(
            store=self._store,
            frontier=frontier,
            budget=c.budget.fetches_per_second,
            policy=policy,
            replan=ReplanRule.from_config(c.policy),
            explore=c.policy.explore,
            decide=c.policy.decide,
            inputs=InputSettings.from_config(c),
            wall_clock=self._wall,
            planner=self._fleet_planner(c) if c.fleet.enabled else plan,
        )
        return self._allocator

    async def _add_configured_seeds(self, c: Config) -> None:
        seeds = c.all_seeds()
        if seeds:
            result = await self.add_seeds(seeds)
            log.info(
                "seeds",
                added=result["added"],
                known=result["known"],
                rejected=len(result["rejected"]),
            )

    async def _start_pipeline(
        self, services: trio.Nursery, c: Config, frontier: Frontier, allocator: Allocator
    ) -> None:
        """The change feed, the allocator, the fleet's parts, the frontier and discovery."""
        self._feed = ChangeFeed(load_sinks(c), queue=c.sinks.queue)
        await services.start(self._feed.run)
        await services.start(allocator.run)
        if c.fleet.enabled:
            await services.start(self._fleet_node(frontier, allocator).run)
            assert self._fleet_budget is not None
            await services.start(self._fleet_budget.run)
            if c.fleet.history_dir:
                await services.start(self._history_service(c).run)
        await services.start(frontier.run)
        if self._discovery is not None:
            await services.start(self._discovery.run)
            # the findings a stop or a crash left owed in the store, then any left behind
            await services.start(self._discovery.replay)

    def _make_crawler(
        self, c: Config, frontier: Frontier, fetcher: Fetcher, allocator: Allocator
    ) -> Crawler:
        assert self._store is not None and self._feed is not None
        self._crawler = Crawler(
            config=c,
            frontier=frontier,
            fetcher=fetcher,
            store=self._store,
            allocator=allocator,
            discovery=self._discovery,
            wall_clock=self._wall,
            parsers=self._parsers,
            keeper=Keeper(
                archiving=self._warc is not None,
                listener=self._feed,
                user_agent=lambda: self.config.crawl.user_agent,
                revisits=c.archive.revisits,
            ),
        )
        return self._crawler

    async def _start_endpoints(self, services: trio.Nursery, c: Config, frontier: Frontier) -> None:
        """Control, metrics, the snapshot, retention, heartbeat, progress and the watchdog."""
        control = ControlServer(c.control_socket, self._handle, tcp_port=c.control.tcp_port)
        await services.start(control.run)
        if c.metrics.port is not None:
            port = await services.start(self._metrics_server(c).run)
            log.info("metrics serving", url=f"http://{c.metrics.host}:{port}/metrics")
        # The snapshot copies the embedded file: not in a fleet (query --fleet reads
        # one PostgreSQL snapshot instead).
        if isinstance(self._store, StoreService) and c.snapshot.interval > 0:
            self._snapshotter = Snapshotter(
                store=self._store, path=snapshot_path(c), interval=c.snapshot.interval
            )
            await services.start(self._snapshotter.run)
        await services.start(self._pruner(c, self._warc).run)
        await services.start(self._heartbeat)
        await services.start(self._progress)
        # The watchdog pings while both the event loop and the frontier's loader turn.
        await services.start(
            self.notifier.run_watchdog, lambda: min(self._beat, frontier.last_pass)
        )

    async def _until_stopped(self, signals: Any, crawler: Crawler, frontier: Frontier) -> None:
        """Reload on SIGHUP; on a stop signal drain the work within ``daemon.drain_timeout``."""
        async for signum in signals:
            if signum == signal.SIGHUP:
                await self.reload()
                continue
            log.info(
                "stopping",
                signal=signal.Signals(signum).name,
                in_flight=crawler.statistics().busy,
            )
            self._stopping = True
            self.notifier.stopping()
            frontier.close()
            with trio.move_on_after(self.config.daemon.drain_timeout) as drain:
                await crawler.idle.wait()
                # what discovery has queued, stored now rather than at the next start
                # (the workers have stopped; deferred findings wait for the next start
                # unless the replay has handed them over already)
                if self._discovery is not None:
                    await self._discovery.drain()
            if drain.cancelled_caught:
                log.warning(
                    "drain deadline passed; unfinished fetches will be redone and "
                    "queued findings handed to discovery at the next start",
                    in_flight=crawler.statistics().busy,
                    queued=self._discovery.statistics().queued if self._discovery else 0,
                )
            return


def _history_retention(c: Config) -> HistoryPruning:
    """``store.history_retention`` for one node's store or for a fleet's history."""
    if c.fleet.enabled:
        from refresher.store._pg_retention import FleetHistoryRetention

        return FleetHistoryRetention.from_config(c)
    return HistoryRetention.from_config(c)


def _pid() -> int:
    import os

    return os.getpid()


def _plain(stats: Any) -> dict[str, Any]:
    """A statistics snapshot as the status's JSON: every number that is not finite, at any
    depth (∞ ``replan_fetches`` when ``policy.replan_share = 0``, NaN before a first solve),
    becomes null, which strict JSON parsers read (``Infinity`` and ``NaN`` are not JSON)."""
    out: dict[str, Any] = _finite(asdict(stats))
    return out


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


#: the cyclic garbage collector's thresholds in the daemon (CPython's are (700, 10, 10)).
#: With CPython's, a first pass of the docs web spent a tenth of the daemon's CPU (6.3 of
#: 61.7 s, 0.6 ms per page) collecting, 4.6 s of it in 41 full collections over a heap of
#: pages, caches and queued documents that held almost no garbage cycles (3,700 objects in
#: all). Young collections every 20,000 tracked objects and a full one after 100 older ones
#: (still only once the old objects grew by a quarter, as CPython decides): 0.9 s
#: (bench/README.md). Reference counting frees all else at once as before; cycles are still
#: collected.
GC_THRESHOLDS = (20_000, 20, 100)


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (the daemon's)."""
    gc.set_threshold(*GC_THRESHOLDS)


#: glibc malloc's settings in the daemon (mallopt parameter, value). By default glibc gives
#: the free top of a heap back to the system once it exceeds a threshold it raises as it goes,
#: so the memory of each page's parse (Lexbor's tree, about 1-2 MB for a docs page) was
#: returned and faulted in again for the next one: 16-32 minor page faults per docs page in
#: a parse thread, 0.03-0.09 ms of system time. Kept up to 64 MiB free per heap, and blocks
#: below 4 MiB from the heap rather than a mapping of their own: 3 faults per page
#: (bench/README.md). The memory held is bounded by the settings: what a page's parse freed
#: is reused by the next one.
MALLOC_SETTINGS = ((-1, 64 * 1024 * 1024), (-3, 4 * 1024 * 1024))  # M_TRIM_/M_MMAP_THRESHOLD


def tune_malloc() -> bool:
    """Apply :data:`MALLOC_SETTINGS` to this process; False where the C library has no
    ``mallopt`` or refuses them (not glibc: nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS])


def run_daemon(config_loader: Callable[[], Config]) -> int:
    """Run the daemon in the foreground until a stop signal; returns the exit status."""
    tune_gc()
    tune_malloc()
    try:
        return trio.run(Daemon(config_loader).run)
    except RefresherError as e:
        log.error("cannot run", error=str(e))
        return 1
    except BaseExceptionGroup as group:
        # A service that cannot start (a port in use, a socket path refused) fails inside the
        # nursery; the person at the terminal gets its one line, not the nursery's traceback.
        cause = _refresher_error(group)
        if cause is None:
            raise
        log.error("cannot run", error=str(cause))
        return 1


def _refresher_error(group: BaseExceptionGroup[Any]) -> RefresherError | None:
    """The first RefresherError among ``group``'s leaves when every leaf is one, else None."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(group)
    errors = [e for e in leaves if isinstance(e, RefresherError)]
    return errors[0] if errors and len(errors) == len(leaves) else None
