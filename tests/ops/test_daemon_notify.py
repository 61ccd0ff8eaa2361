"""The sd_notify conversation of a real `refresher run` process, read from a socket the test binds.

The test plays systemd's part: it binds the AF_UNIX datagram socket that ``NOTIFY_SOCKET`` names,
sets a one-second watchdog, and checks what the daemon says and when, against its log file.
"""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from conftest import DaemonProcess, daemon_config, wait_for

pytestmark = pytest.mark.slow

# The progress line format_status writes: "15 pages, 3.00 fetches/s, est. freshness n/a".
PROGRESS = re.compile(r"(\d+) pages, \d+\.\d\d fetches/s, est\. freshness (n/a|\d\.\d{3})")
# Datagrams after which the log is read: what had the daemon logged when it sent them?
MILESTONES = ("READY", "RELOADING", "STOPPING")


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Datagram:
    fields: dict[str, str]
    received_usec: int  # CLOCK_MONOTONIC, the clock MONOTONIC_USEC is on
    logged: tuple[str, ...]  # the daemon's log events so far (milestones only)
    control_socket: bool  # whether the control socket existed (milestones only)


class Manager:
    """The service manager's end of NOTIFY_SOCKET."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.setblocking(False)
        self.control = directory / "control.sock"
        self.daemon: DaemonProcess | None = None
        self.received: list[Datagram] = []

    async def run(self) -> None:
        """Receive until cancelled, then close the socket (here, so no task waits on it)."""
        try:
            while True:
                await trio.lowlevel.wait_readable(self.sock)
                self.drain()
        finally:
            self.sock.close()

    def drain(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n"))
            milestone = any(k in fields for k in MILESTONES)
            logged: tuple[str, ...] = ()
            if milestone and self.daemon is not None:
                logged = tuple(str(e.get("event")) for e in self.daemon.events())
            self.received.append(
                Datagram(
                    fields=fields,
                    received_usec=monotonic_usec(),
                    logged=logged,
                    control_socket=milestone and self.control.exists(),
                )
            )

    async def next(self, after: int, match: Callable[[dict[str, str]], bool], what: str) -> int:
        """The index of the first datagram past ``after`` that matches; fails after a deadline."""

        def find() -> tuple[int] | None:
            for i in range(after + 1, len(self.received)):
                if match(self.received[i].fields):
                    return (i,)  # truthy even for index 0
            if self.daemon is not None and self.daemon.proc.poll() is not None:
                raise AssertionError(f"daemon exited before {what}:\n{self.daemon.output()}")
            return None

        found: tuple[int] = await wait_for(find, what=what)
        return found[0]


async def test_a_real_daemon_says_ready_pings_the_watchdog_reloads_and_stops(
    site, short_dir, daemons, nursery
):
    s, port = site
    manager = Manager(short_dir)
    nursery.start_soon(manager.run)
    config = daemon_config(short_dir, port=port, seeds=s.urls())
    d: DaemonProcess = daemons(
        config, env={"NOTIFY_SOCKET": str(manager.path), "WATCHDOG_USEC": "1000000"}
    )
    manager.daemon = d
    got = manager.received

    # READY=1 once the store is open, the seeds are in and the control socket listens.
    ready = await manager.next(-1, lambda f: f.get("READY") == "1", "READY=1")
    before = [g.fields for g in got[:ready]]
    assert all(set(f) <= {"WATCHDOG", "STATUS"} for f in before), before
    logged = got[ready].logged
    assert "store opened" in logged and "seeds" in logged, logged
    assert logged.index("store opened") < logged.index("seeds")
    assert "stopping" not in logged
    assert got[ready].control_socket
    assert got[ready].fields.get("STATUS") == "crawling"
    line = await wait_for(lambda: d.event("ready"), what='the "ready" log line')
    events = [e.get("event") for e in d.events()]
    assert events.index("seeds") < events.index("ready")
    # when the crawling began (unix s), which a harness measures from: before the line itself
    since = datetime.fromtimestamp(line["crawling_since"], UTC)
    assert since <= datetime.fromisoformat(line["timestamp"])

    # A one-second watchdog: pings every half second, and progress on the status line.
    first = await manager.next(ready, lambda f: f.get("WATCHDOG") == "1", "a WATCHDOG=1")
    await manager.next(first, lambda f: f.get("WATCHDOG") == "1", "a second WATCHDOG=1")
    progress = await manager.next(
        ready, lambda f: PROGRESS.fullmatch(f.get("STATUS", "")) is not None, "a progress STATUS"
    )
    m = PROGRESS.fullmatch(got[progress].fields["STATUS"])
    assert m is not None and int(m.group(1)) >= len(set(s.urls()))

    # SIGHUP: RELOADING=1 stamped with the monotonic time of the reload, then READY=1 again.
    mark = len(got) - 1
    asked = monotonic_usec()
    d.signal(signal.SIGHUP)
    reloading = await manager.next(mark, lambda f: f.get("RELOADING") == "1", "RELOADING=1")
    stamp = int(got[reloading].fields["MONOTONIC_USEC"])
    assert asked <= stamp <= got[reloading].received_usec
    again = await manager.next(reloading, lambda f: f.get("READY") == "1", "READY=1 after reload")
    assert "configuration reloaded" in got[again].logged
    assert all("READY" not in g.fields for g in got[mark + 1 : reloading])

    # Pings go on after the reload.
    await manager.next(again, lambda f: f.get("WATCHDOG") == "1", "a WATCHDOG=1 after reload")

    # SIGTERM: STOPPING=1 once the daemon has begun to drain, then exit 0.
    mark = len(got) - 1
    d.signal(signal.SIGTERM)
    stopping = await manager.next(mark, lambda f: f.get("STOPPING") == "1", "STOPPING=1")
    assert "stopping" in got[stopping].logged
    assert await d.wait_exit() == 0
    manager.drain()  # the daemon is gone: every datagram it sent is queued here
    after = [g.fields for g in got[stopping + 1 :]]
    assert not [f for f in after if "READY" in f or "RELOADING" in f], after
    assert d.event("stopped") is not None
