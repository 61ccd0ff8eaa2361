"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from refresher.ops._notify import (
    Notifier,
    format_status,
    journal_priority_prefix,
    stdout_is_journal,
)


class Manager:
    """The service manager's end: a bound datagram socket we read notifications from."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def receive(self) -> bytes:
        """The next datagram; the notifier sends synchronously, so it is already queued."""
        self.sock.settimeout(5.0)
        return self.sock.recv(65536)

    def drain(self) -> list[bytes]:
        """Every datagram queued so far."""
        self.sock.setblocking(False)
        got: list[bytes] = []
        while True:
            try:
                got.append(self.sock.recv(65536))
            except BlockingIOError:
                return got


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Manager]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    yield Manager(sock, str(path))
    sock.close()


MakeNotifier = Callable[..., Notifier]


@pytest.fixture
def make_notifier() -> Iterator[MakeNotifier]:
    """Notifier(...), closed after the test (its socket would otherwise leak)."""
    made: list[Notifier] = []

    def make(address: str | None = None, **kwargs: Any) -> Notifier:
        notifier = Notifier(address, **kwargs)
        made.append(notifier)
        return notifier

    yield make
    for notifier in made:
        notifier.close()


def watchdog_env(manager: Manager, usec: int, pid: int | None = None) -> dict[str, str]:
    env = {"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": str(usec)}
    if pid is not None:
        env["WATCHDOG_PID"] = str(pid)
    return env


def test_ready_sends_one_datagram_with_the_status(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(manager.address)
    notifier.ready("loaded 12 pages")
    assert manager.receive() == b"READY=1\nSTATUS=loaded 12 pages"
    notifier.ready()
    assert manager.receive() == b"READY=1"
    assert notifier.statistics().datagrams_sent == 2


def test_each_message_has_its_own_exact_datagram(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(manager.address)
    notifier.status("3 pages")
    notifier.watchdog()
    notifier.stopping()
    notifier.send(ERRNO=5, BUSERROR="x")
    notifier.extend_timeout(1.5)
    assert manager.drain() == [
        b"STATUS=3 pages",
        b"WATCHDOG=1",
        b"STOPPING=1",
        b"ERRNO=5\nBUSERROR=x",
        b"EXTEND_TIMEOUT_USEC=1500000",
    ]


def test_reloading_carries_the_monotonic_clock_in_microseconds(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(manager.address)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = manager.receive().split(b"\n")
    assert first == b"RELOADING=1"
    key, _, value = second.partition(b"=")
    assert key == b"MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_the_address_defaults_to_notify_socket(
    manager: Manager, monkeypatch: pytest.MonkeyPatch, make_notifier: MakeNotifier
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", manager.address)
    notifier = make_notifier()
    assert notifier.enabled
    notifier.ready()
    assert manager.receive() == b"READY=1"


def test_an_at_sign_names_an_abstract_socket(make_notifier: MakeNotifier) -> None:
    name = f"refresher-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5.0)
        make_notifier(environ={"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1"


def test_without_notify_socket_everything_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch, make_notifier: MakeNotifier
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    notifier = make_notifier()
    assert not notifier.enabled
    notifier.ready("x")
    notifier.reloading()
    notifier.watchdog()
    assert notifier.watchdog_interval() is None
    stats = notifier.statistics()
    assert (stats.datagrams_sent, stats.send_failures) == (0, 0)


def test_an_address_that_is_neither_a_path_nor_abstract_disables_notifications(
    make_notifier: MakeNotifier,
) -> None:
    with structlog.testing.capture_logs() as logs:
        notifier = make_notifier("vsock:2:1234")
    assert not notifier.enabled
    assert [entry["event"] for entry in logs] == ["notify.unsupported_address"]


def test_a_newline_in_a_value_cannot_inject_a_field(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    make_notifier(manager.address).status("ok\nREADY=1")
    assert manager.receive() == b"STATUS=ok READY=1"


def test_a_malformed_field_name_is_a_bug_in_the_caller(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    with pytest.raises(ValueError, match="field name 'ready'"):
        make_notifier(manager.address).send(ready=1)


def test_a_gone_socket_never_raises_and_is_logged_once(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(manager.address)
    notifier.ready()
    assert manager.receive() == b"READY=1"
    manager.sock.close()
    os.unlink(manager.address)
    with structlog.testing.capture_logs() as logs:
        notifier.status("one")
        notifier.status("two")
        notifier.watchdog()
    assert [entry["event"] for entry in logs] == ["notify.send_failed"]
    assert logs[0]["socket"] == manager.address
    stats = notifier.statistics()
    assert (stats.datagrams_sent, stats.send_failures) == (1, 3)


def test_a_socket_that_never_existed_never_raises(
    tmp_path: Path, make_notifier: MakeNotifier
) -> None:
    with structlog.testing.capture_logs() as logs:
        notifier = make_notifier(str(tmp_path / "absent.sock"))
        notifier.ready()
    assert notifier.enabled
    assert notifier.statistics().send_failures == 1
    assert len(logs) == 1


def test_notifications_reach_a_socket_created_again_and_a_new_outage_is_logged_again(
    tmp_path: Path, make_notifier: MakeNotifier
) -> None:
    path = str(tmp_path / "notify.sock")
    notifier = make_notifier(path)
    with structlog.testing.capture_logs() as logs:
        notifier.ready()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(5.0)
            notifier.ready()
            assert sock.recv(4096) == b"READY=1"
        os.unlink(path)
        notifier.status("lost")
    assert [entry["event"] for entry in logs] == ["notify.send_failed"] * 2


def test_watchdog_interval_comes_from_watchdog_usec(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    assert make_notifier(environ=watchdog_env(manager, 30_000_000)).watchdog_interval() == 30.0
    assert make_notifier(environ={"NOTIFY_SOCKET": manager.address}).watchdog_interval() is None
    bad = make_notifier(environ={"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": "soon"})
    assert bad.watchdog_interval() is None


def test_watchdog_pid_of_this_process_keeps_the_watchdog(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(environ=watchdog_env(manager, 2_000_000, pid=os.getpid()))
    assert notifier.watchdog_interval() == 2.0


async def test_watchdog_pid_of_another_process_disables_the_watchdog(
    manager: Manager, make_notifier: MakeNotifier
) -> None:
    notifier = make_notifier(environ=watchdog_env(manager, 2_000_000, pid=os.getpid() + 1))
    assert notifier.watchdog_interval() is None
    async with trio.open_nursery() as nursery:
        # Returns at once: nothing to cancel, and the nursery closes.
        await nursery.start(notifier.run_watchdog, trio.current_time)
    assert manager.drain() == []


async def test_run_watchdog_returns_at_once_without_notify_socket(
    monkeypatch: pytest.MonkeyPatch, make_notifier: MakeNotifier
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    with trio.fail_after(5):
        await make_notifier().run_watchdog(trio.current_time)


async def test_the_watchdog_pings_while_the_loop_turns_and_stops_when_it_stalls(
    manager: Manager, autojump_clock: trio.testing.MockClock, make_notifier: MakeNotifier
) -> None:
    # A 10 s watchdog: pings every 5 s while the heartbeat is at most 10 s old.
    notifier = make_notifier(environ=watchdog_env(manager, 10_000_000))
    start = trio.current_time()
    last_turn = start
    beating = True

    def heartbeat() -> float:
        return last_turn

    async def scheduler_loop() -> None:
        nonlocal last_turn
        while True:
            if beating:
                last_turn = trio.current_time()
            await trio.sleep(1)

    async def sleep_until(offset: float) -> None:
        await trio.sleep_until(start + offset)

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scheduler_loop)
            await nursery.start(notifier.run_watchdog, heartbeat)
            await sleep_until(22.5)
            # Pings at 0, 5, 10, 15, 20.
            assert manager.drain() == [b"WATCHDOG=1"] * 5

            beating = False  # the loop stalls; its last turn was at 22 s
            await sleep_until(61)
            # 25 and 30 are within 10 s of the last turn; 35 … 60 are not.
            assert manager.drain() == [b"WATCHDOG=1"] * 2

            beating = True  # the loop recovers and turns at 61 s
            await sleep_until(72.5)
            # 65 and 70.
            assert manager.drain() == [b"WATCHDOG=1"] * 2
            nursery.cancel_scope.cancel()

    stats = notifier.statistics()
    assert (stats.watchdog_pings, stats.watchdog_withheld) == (9, 6)
    assert [entry["event"] for entry in logs] == ["watchdog.withheld", "watchdog.resumed"]


def test_the_status_line_shows_pages_rate_and_freshness() -> None:
    assert (
        format_status(pages=1200, fetches_per_second=4.926, freshness=0.8123)
        == "1200 pages, 4.93 fetches/s, est. freshness 0.812"
    )
    assert format_status(pages=0, fetches_per_second=0.0, freshness=None).endswith("n/a")


def test_log_levels_map_to_syslog_priorities() -> None:
    assert journal_priority_prefix("error") == "<3>"
    assert journal_priority_prefix("WARNING") == "<4>"
    assert journal_priority_prefix("info") == "<6>"
    assert journal_priority_prefix("debug") == "<7>"
    assert journal_priority_prefix("chatty") == "<6>"


def test_stdout_is_the_journal_only_when_journal_stream_names_fd_1() -> None:
    st = os.fstat(1)
    assert stdout_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert not stdout_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
    assert not stdout_is_journal({"JOURNAL_STREAM": "garbage"})
    assert not stdout_is_journal({})
