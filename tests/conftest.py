"""Fixtures: real loopback servers, real daemon processes, short socket paths."""

from __future__ import annotations

import dataclasses
import functools
import glob
import inspect
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import settings

from refresher._cpus import usable_cpus
from refresher.sim import _harness as harness
from refresher.sim._harness import harness_config, write_config
from refresher.sim._site import HostSpec, PageSpec, Site, serve_site
from refresher.store import FetchRecord

# The suite is a gate, run once on a clean checkout: its property tests draw the same examples
# every run (Hypothesis's own CI profile). REFRESHER_HYPOTHESIS=explore draws new ones each
# run, to look for failures rather than to pass.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.load_profile(
    os.environ.get("REFRESHER_HYPOTHESIS", "repeatable").replace("explore", "default")
)

#: Generous deadlines: a loaded 2-core CI machine must not fail a correct daemon.
DEADLINE = 60.0

#: `make test` runs this many pytest-xdist workers per CPU (`-n auto`). The end-to-end tests
#: mostly wait on real time (a budget's window, a lease's expiry, a host's delay): with one
#: worker per CPU the suite kept ~1 of 2 cores busy, with two it keeps ~1.5.
WORKERS_PER_CPU = 2


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: no error where it is not loaded
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: :data:`WORKERS_PER_CPU` workers per CPU this process may run on."""
    return WORKERS_PER_CPU * usable_cpus()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests (marked slow) first, each part's in its own order: `make test`
    hands each worker a few tests at a time (``--dist loadgroup``), so that the long ones start
    early and the short ones fill the workers up at the end, rather than a worker starting a
    30 s test while the others run out of work."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def query_db(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a DuckDB file, opened read-only (no daemon may hold it)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``refresher ARGS`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "refresher", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def acli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """:func:`cli` in a thread: a test whose servers run on its own event loop must keep them
    answering while the command runs."""
    return await trio.to_thread.run_sync(functools.partial(cli, *args, timeout=timeout))


async def wait_for(
    predicate: Callable[[], Any], *, timeout: float = DEADLINE, what: str = ""
) -> Any:
    """Poll ``predicate`` (a function, or an async one) until it returns something truthy;
    fail after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s: {what or predicate}")


def fetch_record(
    page_id: int, host_id: int, at: float, *, duration: float = 0.25, **fields: Any
) -> FetchRecord:
    """A successful, unchanged fetch of ``page_id`` taking ``duration`` seconds and finishing
    at ``at`` (unix seconds), due again a minute later; ``fields`` override."""
    record = FetchRecord(
        page_id=page_id,
        host_id=host_id,
        started_at=at - duration,
        finished_at=at,
        duration=duration,
        status=200,
        body_bytes=100,
        digest=b"d",
        changed=False,
        not_modified=False,
        error_kind=None,
        policy="uniform",
        final_url=None,
        redirects=0,
        etag=None,
        last_modified=None,
        page_digest=b"d",
        page_status="ok",
        due_at=at + 60,
    )
    return dataclasses.replace(record, **fields)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory path: unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rf", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def daemon_config(
    directory: Path, *, port: int, seeds: list[str], **sections: dict[str, Any]
) -> Path:
    """A test config: fast politeness, JSON debug logs, everything under ``directory``."""
    base: dict[str, dict[str, Any]] = {
        "store": {"flush_interval": 0.2},
        "crawl": {"seeds": seeds, "workers": 8},
        "budget": {"fetches_per_second": 40.0},
        "policy": {"name": "uniform", "resolve_interval": 5.0},
        "politeness": {
            "min_delay": 0.2,
            "response_time_factor": 0.0,
            "max_delay": 5.0,
            "backoff_base": 0.5,
            "max_backoff": 2.0,
        },
        "fetch": {"timeout": 2.0},
        "dns": {"static": {"*.sim.test": f"127.0.0.1:{port}"}},
        "frontier": {"window": 5.0},
        # no guessed /sitemap.xml pages: tests count pages exactly
        "discovery": {"sitemaps": False},
        "log": {"level": "debug"},
    }
    for name, table in sections.items():
        base.setdefault(name, {}).update(table)
    tables = harness_config(directory, user_agent="refresher-test/1.0 (+http://127.0.0.1/)", **base)
    return write_config(directory / "refresher.toml", tables)


class DaemonProcess(harness.DaemonProcess):
    """``refresher run`` as a real child process (:class:`refresher.sim._harness.DaemonProcess`),
    its JSON log lines in a file of its own, with waits for the tests."""

    def __init__(self, config: Path, *args: str, env: dict[str, str] | None = None) -> None:
        """``env`` is added to the environment (after NOTIFY_SOCKET and WATCHDOG_* are removed)."""
        log_path = config.with_suffix(f".{os.getpid()}.{id(self)}.log")
        super().__init__(config, *args, log_path=log_path, env=env)

    def acknowledged(self) -> int:
        acks = [
            e.get("acknowledged", 0) for e in self.events() if e.get("event") == "batch committed"
        ]
        return max(acks, default=0)

    async def wait_exit(self, timeout: float = DEADLINE) -> int:
        code = await wait_for(lambda: self.proc.poll() is not None, timeout=timeout, what="exit")
        assert code
        return self.proc.returncode

    async def ready(self) -> None:
        def check() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"daemon exited early ({self.proc.returncode}):\n{self.output()}"
                )
            return self.event("ready") is not None

        await wait_for(check, what="daemon ready")

    def close(self) -> None:
        self.kill()


@pytest.fixture
def daemons() -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemon processes; any left running are killed at the end."""
    started: list[DaemonProcess] = []

    def start(config: Path, *args: str, env: dict[str, str] | None = None) -> DaemonProcess:
        d = DaemonProcess(config, *args, env=env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.close()


def small_site(**host_overrides: Any) -> Site:
    """Three hosts of five pages: a.sim.test honest with a robots.txt rule, b none, c gzip."""
    pages = tuple(PageSpec(path=f"/p{i}", change_rate=0.5 if i % 2 else 0.0) for i in range(4))
    private = (PageSpec(path="/private/secret"),)
    hosts = [
        HostSpec(
            name="a.sim.test",
            pages=(*pages, *private),
            robots="User-agent: *\nDisallow: /private/\n",
            validators="honest",
        ),
        HostSpec(name="b.sim.test", pages=(*pages, PageSpec(path="/p9")), validators="none"),
        HostSpec(
            name="c.sim.test", pages=(*pages, PageSpec(path="/p9")), validators="honest", gzip=True
        ),
    ]
    return Site(hosts, **host_overrides)


@pytest.fixture
async def site(nursery: trio.Nursery) -> tuple[Site, int]:
    """The small site served on 127.0.0.1; returns (site, port)."""
    s = small_site()
    port = await nursery.start(serve_site, s)
    return s, port


# -- PostgreSQL ------------------------------------------------------------------------------

PG_MISSING = "PostgreSQL server binaries not found: apt-get install postgresql"


def _pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """A throw-away PostgreSQL cluster: ``initdb`` and ``pg_ctl`` in a temporary directory,
    listening on a free loopback port and on a unix socket in that directory. Calling it
    creates a fresh database and returns its DSN."""

    def __init__(self) -> None:
        initdb, pg_ctl = _pg_binary("initdb"), _pg_binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            pytest.fail(PG_MISSING, pytrace=False)
        self.pg_ctl = pg_ctl
        self.dir = Path(tempfile.mkdtemp(prefix="rfpg", dir="/tmp"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._names = itertools.count()
        # The server refuses to run as root: run it as an unprivileged user then.
        self.user: int | None = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres").pw_uid
            except KeyError:
                self.user = pwd.getpwnam("nobody").pw_uid
            os.chown(self.dir, self.user, -1)
        self._run(
            initdb,
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        # fsync=off: data survives the server's crash (halt), not the machine's; commits stay
        # synchronous, so that an acknowledged batch survives a halt as in production
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        self.options = options
        self.start()
        self._watchdog = self._watch()

    def _watch(self) -> subprocess.Popen[bytes]:
        """A process that stops the server and removes its directory once this one is gone,
        however it ends (a run killed with SIGKILL or by CI's time limit runs no teardown): it
        waits for the end of a pipe only this process holds, in a session of its own so that
        a signal to pytest's process group leaves it be."""
        stop = [self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        script = (
            "import shutil, subprocess, sys\n"
            "sys.stdin.buffer.read()\n"
            f"subprocess.run({stop!r}, capture_output=True, user={self.user!r}, timeout=60)\n"
            f"shutil.rmtree({str(self.dir)!r}, ignore_errors=True)\n"
        )
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def start(self) -> None:
        """Start the server (again, after :meth:`halt`)."""
        self._run(
            self.pg_ctl,
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-o",
            self.options,
            "-w",
            "-t",
            "60",
            "start",
        )

    def halt(self) -> None:
        """Stop the server as a crash would (``-m immediate``), keeping its data."""
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def _run(self, *argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, user=self.user, timeout=120)
        if done.returncode:
            log = self.dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            pytest.fail(f"{' '.join(argv[:2])} failed: {done.stderr}{done.stdout}{tail}")

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __call__(self, *, unix: bool = False) -> str:
        """A new, empty database; its DSN (over TCP, or the unix socket with ``unix``)."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as con:
            con.execute(f"CREATE DATABASE {name}")
        if unix:
            return f"host={self.dir} port={self.port} user=postgres dbname={name}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop the server and remove its directory: the watchdog does it once told to."""
        assert self._watchdog.stdin is not None
        self._watchdog.stdin.close()
        self._watchdog.wait(timeout=90)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL (initdb + pg_ctl in a temporary directory; fails, never
    skips, without the binaries), stopped at the end. Call it for a fresh database's DSN:
    ``dsn = postgres()`` (TCP on 127.0.0.1) or ``postgres(unix=True)`` (the unix socket)."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()
