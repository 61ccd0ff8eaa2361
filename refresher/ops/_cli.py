"""The refresher command line: a continuous-refresh web crawler daemon and its tools.

``run`` is the daemon. ``seed`` and ``status`` talk to a running daemon through its control
socket, and work on the DuckDB file directly when no daemon runs. ``site`` serves the small local
demo web, ``demo`` runs the daemon against it (what ``make run`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from refresher import __version__, policies
from refresher._config import Config, load_config, merge_tables, parse_override, read_seeds_file
from refresher._errors import ControlError, RefresherError, StoreError
from refresher.ops._control import request

if TYPE_CHECKING:
    from refresher.store import HostSummary, Store, StoreStatus

__all__ = ["main"]

T = TypeVar("T")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for text in args.set or ():
        out = merge_tables(out, parse_override(text))
    shortcuts = {
        "store": ("store", "path", str),
        "budget": ("budget", "fetches_per_second", float),
        "workers": ("crawl", "workers", int),
        "policy": ("policy", "name", str),
        "log_format": ("log", "format", str),
        "log_level": ("log", "level", str),
    }
    for attr, (section, key, _) in shortcuts.items():
        value = getattr(args, attr, None)
        if value is not None:
            out = merge_tables(out, {section: {key: value}})
    seeds = getattr(args, "seed", None)
    if seeds:
        out = merge_tables(out, {"crawl": {"seeds": list(seeds)}})
    return out


def _loader(args: argparse.Namespace) -> Any:
    def load() -> Config:
        return load_config(args.config, overrides=_overrides(args))

    return load


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        help="TOML config file (default /etc/refresher/refresher.toml if present)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config key, e.g. --set politeness.min_delay=2 (repeatable)",
    )
    p.add_argument("--store", help="the DuckDB file (store.path)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refresher", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"refresher {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run the daemon in the foreground",
        description="Run the crawler daemon in the foreground until SIGTERM or SIGINT: it "
        "refreshes the stored pages within the budget, finds new ones through links, and "
        "answers `refresher status/seed/policy/pause/resume/backup/reload` on its control "
        "socket. SIGHUP re-reads the config.",
    )
    _common(run)
    run.add_argument("--budget", type=float, help="fetches per second (budget.fetches_per_second)")
    run.add_argument("--workers", type=int, help="concurrent fetches (crawl.workers)")
    run.add_argument("--policy", help=f"a policy name: {' | '.join(policies.available())}")
    run.add_argument("--seed", action="append", help="a seed URL (repeatable)")
    run.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        help="log lines as JSON or for people; auto: JSON unless stdout is a terminal (log.format)",
    )
    run.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="the least severe log lines written (log.level)",
    )

    seed = sub.add_parser("seed", help="add seed URLs (to the running daemon, or the file)")
    _common(seed)
    seed.add_argument("urls", nargs="*", metavar="URL")
    seed.add_argument("--file", type=Path, help="a file of URLs, one a line")

    status = sub.add_parser("status", help="what the daemon is doing (or what the file holds)")
    _common(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--hosts",
        action="store_true",
        help="list every host (default: the 10 busiest, and every paused host or in backoff)",
    )

    policy = sub.add_parser(
        "policy",
        help="expected freshness and age under each policy, or switch the policy",
        description="Without a switch: a table of the expected mean freshness and age of the "
        "current page set under each built-in policy at the current budget. With one: switch "
        "the running daemon's policy (or the file's, when no daemon runs); the switch is "
        "recorded with its time and holds until the config names another policy.",
    )
    _common(policy)
    policy.add_argument("--budget", type=float, help="what-if budget, fetches per second")
    policy.add_argument("--json", action="store_true", help="machine-readable output")
    switch = policy.add_mutually_exclusive_group()
    for name in policies.available():  # the registry: plug-in policies get a flag too
        switch.add_argument(
            f"--{name}",
            dest="switch",
            action="store_const",
            const=name,
            help=f"switch to the {name} policy",
        )

    query = sub.add_parser(
        "query",
        help="run SQL on the history: the snapshot while a daemon runs, else the store",
    )
    _common(query)
    query.add_argument("sql", help='e.g. "SELECT * FROM freshness_by_policy"')
    query.add_argument("--truth", type=Path, help="a simweb truth file (DuckDB) or directory")
    query.add_argument(
        "--fleet",
        action="store_true",
        help="the whole fleet's history: fleet.history_dir's Parquet plus PostgreSQL's tail",
    )

    for name, text in (
        ("pause", "stop fetching from a host"),
        ("resume", "fetch from a host again"),
    ):
        host_cmd = sub.add_parser(name, help=f"{text} (running daemon, or the file)")
        _common(host_cmd)
        host_cmd.add_argument("host", help='the host key, e.g. "example.org" or "example.org:8080"')

    backup = sub.add_parser(
        "backup",
        help="copy the store consistently to a new file, while the daemon runs or not",
        description="Write a consistent copy of the store to DEST (a new file): through the "
        "running daemon's store queue, so every fetch acknowledged before is in it, without "
        "stopping it; or from the file when no daemon runs. Restore: stop the daemon and copy "
        "DEST to store.path.",
    )
    _common(backup)
    backup.add_argument("dest", type=Path, metavar="DEST", help="the backup file to create")

    reload = sub.add_parser("reload", help="make the running daemon re-read its config (SIGHUP)")
    _common(reload)

    site = sub.add_parser(
        "site",
        help="serve the small local demo web on loopback",
        description="Serve a small fixed web (HOSTS hosts × PAGES pages, some changing) on "
        "127.0.0.1:PORT for trying the daemon by hand; its hosts are h0.sim.test ... (point "
        'them at it with --set dns.static."*.sim.test"=127.0.0.1:PORT).',
    )
    site.add_argument("--hosts", type=int, default=5)
    site.add_argument("--pages", type=int, default=20, help="pages per host")
    site.add_argument("--port", type=int, default=8080)
    site.add_argument("--seed", type=int, default=0, help="random seed")

    from refresher.sim._simweb import add_arguments as simweb_arguments

    simweb = sub.add_parser(
        "simweb", help="serve a simulated web with known change rates and write its ground truth"
    )
    simweb_arguments(simweb)

    from refresher.archive._cli import add_commands as archive_commands

    archive_commands(sub, _common)

    fleet = sub.add_parser(
        "fleet",
        help="a fleet of nodes on one PostgreSQL database: create it, see it",
        description="Commands for a fleet: nodes sharing one PostgreSQL database (fleet.dsn).",
    )
    fleet_sub = fleet.add_subparsers(dest="fleet_command", required=True)
    fleet_init = fleet_sub.add_parser(
        "init",
        help="create or migrate the fleet's schema and its partitions (idempotent)",
        description="Create the fleet's tables in the database fleet.dsn names, or migrate them "
        "to this version, and the fleet.partitions partition rows. Safe to run again; refuses "
        "a database from a newer refresher and a partition count other than the fleet's.",
    )
    _common(fleet_init)
    fleet_status = fleet_sub.add_parser(
        "status",
        help="nodes, partitions per node, lease ages, inbox, fetch rate, μ",
        description="The fleet as its database sees it: each node (live or not, heartbeat age, "
        "clock skew, partitions held, age of its oldest lease), free partitions, the inbox "
        "depth, the fleet's fetch rate and the budget coordinator's row (μ, unplaced budget).",
    )
    _common(fleet_status)
    fleet_status.add_argument("--json", action="store_true", help="print JSON")
    fleet_backup = fleet_sub.add_parser(
        "backup",
        help="back the whole fleet up (pg_dump, the Parquet history, the WARC files)",
        description="Write a backup of the fleet to the new directory DEST while its nodes "
        "run: the database with pg_dump (one snapshot), then the published Parquet history "
        "and every node's WARC files reachable from this machine (files a node keeps where "
        "this machine cannot reach are named). Restore with `refresher fleet restore DEST`.",
    )
    _common(fleet_backup)
    fleet_backup.add_argument("dest", type=Path, metavar="DEST", help="the directory to create")
    fleet_restore = fleet_sub.add_parser(
        "restore",
        help="restore a fleet backup into an empty database (nodes stopped)",
        description="Load SRC (made by `refresher fleet backup`) into the empty database "
        "fleet.dsn names (pg_restore), and its files under fleet.history_dir and each node's "
        "archive directory there.",
    )
    _common(fleet_restore)
    fleet_restore.add_argument("src", type=Path, metavar="SRC", help="the backup directory")

    demo = sub.add_parser("demo", help="run the daemon against the local demo web (make run)")
    _common(demo)
    demo.add_argument("--hosts", type=int, default=10, help="hosts of the simulated web (10)")
    demo.add_argument("--pages", type=int, default=30, help="pages per host at the start (30)")
    demo.add_argument("--duration", type=float, help="stop after this many seconds")
    # `refresher CMD --help` opens with what CMD does, its one-line help, when no longer text
    for action in sub._choices_actions:
        command = sub.choices[action.dest]
        if command.description is None and action.help:
            command.description = action.help[0].upper() + action.help[1:] + "."
    return parser


def _offline(config: Config, op: Callable[[Store], Awaitable[T]], *, existing: bool = False) -> T:
    """``op`` on the configured store itself, when no daemon holds it. ``existing``: a command
    that only reads or adjusts a store never creates one."""
    import trio

    from refresher.store import open_store

    if existing and not config.fleet.enabled and not config.store.path.exists():
        raise StoreError(
            f"no daemon runs and there is no store at {str(config.store.path)!r}; "
            "give the daemon's --store FILE or --config FILE"
        )

    async def run() -> T:
        async with open_store(config) as store:
            return await op(store)

    return trio.run(run)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _cmd_seed(args: argparse.Namespace) -> int:
    from refresher.ops._daemon import check_seeds

    urls = list(args.urls)
    if args.file is not None:
        urls.extend(read_seeds_file(args.file))
    if not urls:
        print("refresher seed: give URLs or --file FILE", file=sys.stderr)
        return 2
    config = _loader(args)()
    try:
        answer = request(config.control_socket, {"op": "seed", "urls": urls})
        where = "running daemon"
    except ControlError:
        pages, rejected = check_seeds(urls, strip_params=config.discovery.strip_tracking_params)
        if config.fleet.enabled:
            return _seed_fleet(config, pages, rejected)
        added, _ = _offline(config, lambda store: store.add_pages(pages, now=time.time()))
        answer = {"added": len(added), "known": len(pages) - len(added), "rejected": rejected}
        where = str(config.store.path)
    for r in answer["rejected"]:
        print(f"rejected {r['url']!r}: {r['reason']}", file=sys.stderr)
    print(f"{answer['added']} added, {answer['known']} already known ({where})")
    return 1 if answer["rejected"] and not answer["added"] and not answer["known"] else 0


def _seed_fleet(config: Config, pages: Any, rejected: list[dict[str, str]]) -> int:
    """Seeds into a fleet with no daemon here: to the inbox of the node that holds a seed's
    partition, else straight into the shared pages (the next owner loads them)."""
    from refresher.store._pg_dsn import redact
    from refresher.store._postgres import seed_fleet

    routed = seed_fleet(config, pages, now=time.time())
    for r in rejected:
        print(f"rejected {r['url']!r}: {r['reason']}", file=sys.stderr)
    print(
        f"{routed.elsewhere} added, {routed.inboxed} sent to their owners' inboxes, "
        f"{routed.known} already known (fleet {redact(config.fleet.dsn)})"
    )
    return 1 if rejected and not pages else 0


def _offline_status(config: Config, *, hosts_limit: int | None) -> dict[str, Any]:
    now = time.time()

    async def read(store: Store) -> tuple[StoreStatus, list[HostSummary]]:
        return await store.status(now=now), await store.host_summary(now=now, limit=hosts_limit)

    status, host_rows = _offline(config, read, existing=True)
    return {
        "running": False,
        "store_path": str(config.store.path),
        "pages": status.pages,
        "hosts": status.hosts,
        "fetches": status.fetches,
        "next_due": status.next_due,
        "last_fetch": status.last_fetch,
        "due_now": status.due_now,
        "owed_documents": status.owed,
        "host_list": [dataclasses.asdict(h) for h in host_rows],
    }


def _print_hosts(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("  hosts      none yet")
        return
    print(f"  {'host':<32}{'pages':>8}{'fetches':>10}{'errors':>8}  {'sitemaps':<12}state")
    for h in rows:
        state = "paused" if h["paused"] else ""
        if h["backoff_left"] > 0:
            state = f"{state} backoff {h['backoff_left']:.0f} s".strip()
        print(
            f"  {h['host']:<32}{h['pages']:>8}{h['fetches']:>10}{h['errors']:>8}"
            f"  {_sitemap_trust(h):<12}{state or 'ok'}"
        )


def _sitemap_trust(host: dict[str, Any]) -> str:
    """Whether a host's sitemap lastmods count as change observations (the trust test)."""
    passed, failed = host.get("sitemap_passed", 0), host.get("sitemap_failed", 0)
    if failed:
        return "distrusted"
    return "trusted" if passed else "-"


def _cmd_status(args: argparse.Namespace) -> int:
    config = _loader(args)()
    limit = None if args.hosts else 10
    try:
        answer = request(config.control_socket, {"op": "status", "hosts_limit": limit})
        answer.pop("ok", None)
        answer["running"] = True
    except ControlError:
        answer = _offline_status(config, hosts_limit=limit)
    if args.json:
        _print_json(answer)
        return 0
    if answer["running"]:
        s, c, f = answer.get("store", {}), answer.get("crawler", {}), answer.get("frontier", {})
        a = answer.get("allocator", {})
        print(f"refresher: running (pid {answer['pid']}, up {answer['uptime']:.0f} s)")
        print(
            f"  store      {answer['store_path']}: {s.get('pages')} pages, {s.get('hosts')} hosts, "
            f"{s.get('fetches')} fetches recorded, {s.get('acknowledged')} this run"
        )
        print(f"  policy     {a.get('policy')} at {a.get('budget'):g} fetches/s")
        print(
            f"  fetching   {answer['fetches_per_second']} fetches/s "
            f"({c.get('wire_rate', 0.0):.2f} requests/s on the wire, last 30 s), "
            f"{c.get('busy')}/{c.get('workers')} workers busy; {c.get('changed')} changed, "
            f"{c.get('not_modified')} not modified, "
            f"{c.get('errors')} errors, {c.get('denied')} denied by robots.txt"
        )
        print(
            f"  frontier   {f.get('in_memory')} pages in memory, "
            f"{f.get('active_hosts')} active hosts, {f.get('ready_hosts')} waiting their turn, "
            f"{f.get('early', 0)} fetched before due, "
            f"{f.get('lapsed', 0.0):.0f} budget tokens lapsed"
        )
        if answer.get("owed_documents"):
            print(
                f"  discovery  off; the findings of {answer['owed_documents']} fetched documents "
                "are kept for it (stored once discovery.enabled is true again)"
            )
        _print_hosts(answer.get("host_list", []))
    else:
        print(
            f"refresher: not running; {answer['store_path']}: {answer['pages']} pages, "
            f"{answer['hosts']} hosts, {answer['fetches']} fetches, {answer['due_now']} due now"
        )
        if answer["owed_documents"]:
            print(
                f"  the findings of {answer['owed_documents']} fetched documents wait for "
                "discovery (the next run with discovery on stores them)"
            )
        _print_hosts(answer["host_list"])
    return 0


def _cmd_pause(args: argparse.Namespace) -> int:
    config = _loader(args)()
    paused = args.command == "pause"
    try:
        request(config.control_socket, {"op": args.command, "host": args.host})
        where = "running daemon"
    except ControlError as e:
        if e.kind != "unreachable":  # a daemon answered: its refusal stands
            raise
        found = _offline(config, lambda store: store.set_paused(args.host, paused), existing=True)
        if not found:
            print(
                f"refresher {args.command}: unknown host {args.host!r}; "
                "`refresher status --hosts` lists them",
                file=sys.stderr,
            )
            return 1
        where = str(config.store.path)
    print(f"{args.host}: {'paused' if paused else 'resumed'} ({where})")
    return 0


def _cmd_policy(args: argparse.Namespace) -> int:
    from refresher.refresh._allocate import InputSettings, policy_table

    config = _loader(args)()
    if args.budget is not None and not args.budget > 0:
        print("refresher policy: --budget must be > 0 (fetches per second)", file=sys.stderr)
        return 2
    if args.switch is not None:
        try:
            request(config.control_socket, {"op": "policy", "name": args.switch})
            where = "running daemon"
        except ControlError as e:
            if e.kind != "unreachable":  # a daemon answered: its refusal stands
                raise
            _offline(
                config,
                lambda store: store.switch_policy(
                    args.switch,
                    configured=config.policy.name,
                    budget=config.budget.fetches_per_second,
                    now=time.time(),
                ),
            )
            where = str(config.store.path)
        print(f"policy switched to {args.switch} ({where})")
        return 0
    payload: dict[str, Any] = {"op": "policy_table"}
    if args.budget is not None:
        payload["budget"] = args.budget
    try:
        table = request(config.control_socket, payload)
        table.pop("ok", None)
    except ControlError:
        inputs = _offline(config, InputSettings.from_config(config).load, existing=True)
        table = policy_table(
            inputs, args.budget or config.budget.fetches_per_second, decide=config.policy.decide
        )
    if args.json:
        _print_json(table)
        return 0
    print(f"{table['pages']} pages at a budget of {table['budget']:g} fetches/s")
    print(f"{'policy':<14}{'freshness':>12}{'weighted':>10}{'age (s)':>14}{'unplaced/s':>12}")
    for name, row in table["policies"].items():
        age = "never" if row["age"] is None else f"{row['age']:.1f}"
        print(
            f"{name:<14}{row['freshness']:>12.4f}{row['weighted']:>10.4f}{age:>14}"
            f"{row['unplaced']:>12.3g}"
        )
    print(f"(decide={table['decide']}: {table['definition']})")
    return 0


def _cmd_backup(args: argparse.Namespace) -> int:
    from refresher.store._backup import backup_file

    config = _loader(args)()
    if config.fleet.enabled:
        raise StoreError(
            "a fleet node's state is the fleet's PostgreSQL: back the whole fleet up with "
            "`refresher fleet backup DEST` (pg_dump, the Parquet history, the WARC files)"
        )
    dest = args.dest.absolute()  # the daemon's working directory may differ
    try:
        # a large store takes a while to copy: wait for it
        payload = {"op": "backup", "dest": str(dest)}
        answer = request(config.control_socket, payload, timeout=24 * 3600.0)
        where = "running daemon"
    except ControlError as e:
        if not str(e).startswith("no daemon answers"):
            raise  # the daemon refused (DEST exists, disk full): not a reason to try the file
        answer = dataclasses.asdict(backup_file(config.store.path, dest))
        where = str(config.store.path)
    print(
        f"backup {answer['path']}: {answer['pages']} pages, {answer['fetches']} fetches, "
        f"{answer['bytes'] / 1e6:.1f} MB in {answer['seconds']:.1f} s (from the {where})"
    )
    return 0


def _cmd_fleet(args: argparse.Namespace) -> int:
    from refresher._errors import ConfigError

    config = _loader(args)()
    if not config.fleet.enabled:
        raise ConfigError(
            "is empty; set it to the fleet's PostgreSQL, e.g. postgresql://refresher@db/refresher",
            key="fleet.dsn",
        )
    if args.fleet_command == "init":
        from refresher.store._pg_dsn import redact
        from refresher.store._pg_schema import init_fleet

        info = init_fleet(config.fleet.dsn, partitions=config.fleet.partitions)
        if info.migrated_from == info.schema_version:
            what = "already at schema version"
        elif info.migrated_from == 0:
            what = "created at schema version"
        else:
            what = f"migrated from {info.migrated_from} to schema version"
        print(
            f"fleet {redact(config.fleet.dsn)}: {what} {info.schema_version}, "
            f"{info.partitions} partitions"
        )
        return 0
    if args.fleet_command in ("backup", "restore"):
        return _fleet_backup(args, config)
    if args.fleet_command == "status":
        from refresher.store._pg_status import read_fleet_status

        status = read_fleet_status(config.fleet.dsn, ttl=config.fleet.lease_ttl)
        if args.json:
            print(json.dumps(dataclasses.asdict(status), indent=2, default=str))
        else:
            print(_format_fleet_status(status))
        return 0
    return 2


def _fleet_backup(args: argparse.Namespace, config: Config) -> int:
    from refresher.store._pg_backup import backup_fleet, restore_fleet

    if args.fleet_command == "backup":
        done = backup_fleet(config, args.dest.absolute())
        what = "backup"
    else:
        done = restore_fleet(config, args.src.absolute())
        what = "restored"
    warcs = sum(done.warc_files.values())
    print(
        f"{what} {done.path}: the database, {done.history_files} history files, {warcs} WARC "
        f"files of {len(done.warc_files)} nodes, {done.bytes / 1e6:.1f} MB in "
        f"{done.seconds:.1f} s"
    )
    for node, where in done.unreachable.items():
        print(
            f"not in the backup: node {node!r}'s WARC files at {where!r} (not reachable from "
            "the backing-up machine); copy them on that node",
            file=sys.stderr,
        )
    return 0


def _format_fleet_status(status: Any) -> str:
    def age(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}s"

    lines = [
        f"{len([n for n in status.nodes if n.live])} live nodes, {status.partitions} partitions "
        f"({status.free} free), inbox {status.inbox}, "
        f"{status.fetches_per_second:.2f} fetches/s",
    ]
    c = status.coordinator
    lines.append(
        f"coordinator {c.get('owner') or '-'} (epoch {c.get('epoch', 0)}): "
        f"mu {c.get('mu')}, policy {c.get('policy')}, budget {c.get('budget')}, "
        f"unplaced {c.get('unplaced')}"
    )
    lines.append(
        f"{'node':<24} {'state':<9} {'parts':>6} {'beat':>7} {'oldest lease':>13} "
        f"{'skew':>7} {'fetch/s':>8}"
    )
    for n in status.nodes:
        state = "stopping" if n.stopping else "live" if n.live else "gone"
        skew = "-" if n.clock_skew is None else f"{n.clock_skew:+.2f}s"
        rate = "-" if n.fetches_per_second is None else f"{n.fetches_per_second:.2f}"
        lines.append(
            f"{n.node_id:<24} {state:<9} {n.partitions:>6} {age(n.heartbeat_age):>7} "
            f"{age(n.oldest_lease_age):>13} {skew:>7} {rate:>8}"
        )
    return "\n".join(lines)


def _cmd_reload(args: argparse.Namespace) -> int:
    config = _loader(args)()
    request(config.control_socket, {"op": "reload"})
    print("configuration reloaded")
    return 0


def _cmd_site(args: argparse.Namespace) -> int:
    from refresher.sim._site import main as site_main

    site_main(
        [
            "--hosts",
            str(args.hosts),
            "--pages",
            str(args.pages),
            "--port",
            str(args.port),
            "--seed",
            str(args.seed),
        ]
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            from refresher.ops._daemon import run_daemon

            loader = _loader(args)
            # Fail fast, before any output or file, on a bad config or seeds file.
            loader().all_seeds()
            return run_daemon(loader)
        if args.command == "seed":
            return _cmd_seed(args)
        if args.command == "status":
            return _cmd_status(args)
        if args.command in ("pause", "resume"):
            return _cmd_pause(args)
        if args.command == "query":
            from refresher.store._snapshot import run_query

            config = _loader(args)()
            if args.fleet:
                from refresher.store._parquet import run_fleet_query

                print(run_fleet_query(config, args.sql, truth=args.truth))
                return 0
            if config.fleet.enabled:
                raise StoreError(
                    "a fleet node keeps no snapshot file; use `refresher query --fleet`, which "
                    "reads one consistent PostgreSQL snapshot and the Parquet history"
                )
            print(run_query(config, args.sql, truth=args.truth))
            return 0
        if args.command == "policy":
            return _cmd_policy(args)
        if args.command == "reload":
            return _cmd_reload(args)
        if args.command == "backup":
            return _cmd_backup(args)
        if args.command == "fleet":
            return _cmd_fleet(args)
        if args.command == "simweb":
            from refresher.sim._simweb import run as run_simweb

            return run_simweb(args)
        if args.command == "site":
            return _cmd_site(args)
        from refresher.archive._cli import COMMANDS as ARCHIVE_COMMANDS

        if args.command in ARCHIVE_COMMANDS:
            from refresher.archive._cli import run_command

            return run_command(args, _loader(args)())
        if args.command == "demo":
            from refresher.sim._demo import run_demo

            return run_demo(args, _overrides(args))
    except RefresherError as e:
        print(f"refresher {args.command}: {e}", file=sys.stderr)
        return 2 if e.__class__.__name__ == "ConfigError" else 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
