"""The systemd notification protocol (``sd_notify``), without libsystemd.

A service started with ``Type=notify`` finds the address of the service manager's datagram
socket in ``NOTIFY_SOCKET`` and tells it, one ``KEY=value`` per line, when it is ready
(``READY=1``), what it is doing (``STATUS=…``), that it is alive (``WATCHDOG=1``), that it is
reloading (``RELOADING=1``) or stopping (``STOPPING=1``). See ``sd_notify(3)``.

Everything here is a no-op when ``NOTIFY_SOCKET`` is unset (the daemon run from a terminal, a
test, another supervisor), and nothing here ever raises because the manager went away: a lost
notification must not take the crawler down with it. Failures are logged once.

The watchdog (:meth:`Notifier.run_watchdog`) pings only while the scheduler loop keeps
turning, so a daemon whose loop stalls stops pinging and systemd restarts it
(``WatchdogSec=`` with ``Restart=on-failure``).

:func:`stdout_is_journal` and :func:`journal_priority_prefix` let the log renderer hand
journald a level for each line written to stdout (``SyslogLevelPrefix=``, on by default).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
import trio

__all__ = [
    "Notifier",
    "NotifierStatistics",
    "format_status",
    "journal_priority_prefix",
    "stdout_is_journal",
]


def _log() -> structlog.typing.FilteringBoundLogger:
    # Looked up per call (only on rare paths) so a logger cached by the daemon's logging
    # set-up never outlives a reconfiguration, e.g. structlog.testing.capture_logs().
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(__name__)
    return logger


# sd_notify(3) names are upper-case ASCII, digits and underscores; checking them turns a typo
# into an error in tests instead of a field systemd silently ignores.
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifierStatistics:
    """A snapshot of what a :class:`Notifier` has done since it was made."""

    enabled: bool
    """Whether ``NOTIFY_SOCKET`` named a usable address."""
    datagrams_sent: int
    """Notifications the manager's socket accepted."""
    send_failures: int
    """Notifications lost (socket gone, refused or full)."""
    watchdog_pings: int
    """``WATCHDOG=1`` notifications sent by :meth:`Notifier.run_watchdog`."""
    watchdog_withheld: int
    """Watchdog turns that sent no ping because the scheduler heartbeat was stale."""


class Notifier:
    """Sends ``sd_notify`` datagrams to the service manager.

    ``address`` defaults to ``NOTIFY_SOCKET``: a file system path (``/run/systemd/notify``) or
    an abstract socket name written with a leading ``@``. Without one the notifier is
    disabled and every method returns at once. ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` are read
    from ``environ`` (default: the process environment) when the notifier is made.
    """

    __slots__ = (
        "_address",
        "_failing",
        "_send_failures",
        "_sent",
        "_sock",
        "_watchdog_pings",
        "_watchdog_usec",
        "_watchdog_withheld",
        "enabled",
    )

    def __init__(
        self, address: str | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if environ is None else environ
        if address is None:
            address = env.get("NOTIFY_SOCKET") or None
        self._address = _socket_address(address)
        self.enabled: bool = self._address is not None
        self._watchdog_usec = _watchdog_usec(env)
        self._sock: socket.socket | None = None
        self._failing = False
        self._sent = 0
        self._send_failures = 0
        self._watchdog_pings = 0
        self._watchdog_withheld = 0

    def send(self, **fields: str | int) -> None:
        """Send ``fields`` as one datagram, ``KEY=value`` lines in the order given.

        Newlines in a value would start a new field, so they are replaced by spaces. Raises
        ``ValueError`` for a key that is not upper-case ``A-Z``, ``0-9``, ``_`` (a bug in the
        caller); never raises because the socket is gone.
        """
        for key in fields:
            if not key or not set(key) <= _KEY_CHARS:
                raise ValueError(
                    f"sd_notify field name {key!r} is invalid: use upper-case letters, digits "
                    "and underscores, as in READY or STATUS"
                )
        if self._address is None:
            return
        payload = "\n".join(
            f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items()
        )
        try:
            if self._sock is None:
                self._sock = self._connect(self._address)
            self._sock.sendall(payload.encode("utf-8"))
        except OSError as e:
            self._send_failed(e)
        else:
            self._sent += 1
            self._failing = False

    def ready(self, status: str | None = None) -> None:
        """Tell the manager start-up (or a reload) is complete, with an optional status line."""
        if status is None:
            self.send(READY=1)
        else:
            self.send(READY=1, STATUS=status)

    def reloading(self) -> None:
        """Tell the manager a reload began; send :meth:`ready` when it is done.

        ``MONOTONIC_USEC`` (``CLOCK_MONOTONIC`` in microseconds) is what ``Type=notify-reload``
        (systemd 253 and later) uses to match the reload with the signal that asked for it.
        """
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send(RELOADING=1, MONOTONIC_USEC=now_usec)

    def stopping(self) -> None:
        """Tell the manager the daemon is draining and will exit."""
        self.send(STOPPING=1)

    def status(self, text: str) -> None:
        """Set the line ``systemctl status`` shows (see :func:`format_status`)."""
        self.send(STATUS=text)

    def watchdog(self) -> None:
        """Reset the manager's watchdog timer (``WatchdogSec=``)."""
        self.send(WATCHDOG=1)

    def extend_timeout(self, seconds: float) -> None:
        """Ask for ``seconds`` more to start, reload or stop (a long schema migration)."""
        self.send(EXTEND_TIMEOUT_USEC=max(0, round(seconds * 1_000_000)))

    def watchdog_interval(self) -> float | None:
        """The manager's watchdog timeout in seconds, or ``None`` when there is none.

        ``None`` also when ``WATCHDOG_PID`` names another process (the variables were
        inherited, the watchdog is not ours) or when notifications are disabled.
        """
        if not self.enabled or self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 1_000_000

    async def run_watchdog(
        self,
        heartbeat: Callable[[], float],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Ping ``WATCHDOG=1`` every half interval while the scheduler loop is alive.

        ``heartbeat()`` returns the ``trio.current_time()`` (seconds) of the scheduler loop's
        last turn. While that is at most one watchdog interval old the task pings; when it is
        older the task withholds pings, so systemd kills and restarts a daemon whose loop
        stalled, and resumes pinging if the loop turns again. The scheduler loop must
        therefore turn at least once per interval even when nothing is due (cap its sleeps).
        A blocked trio loop stops this task too, which is also what should happen.

        Returns right after ``task_status.started()`` when no watchdog is configured.
        """
        interval = self.watchdog_interval()
        task_status.started()
        if interval is None:
            return
        stale = False
        while True:
            lag = trio.current_time() - heartbeat()
            if lag <= interval:
                if stale:
                    _log().info("watchdog.resumed", lag_seconds=round(lag, 3))
                    stale = False
                self.watchdog()
                self._watchdog_pings += 1
            else:
                if not stale:
                    _log().error(
                        "watchdog.withheld",
                        lag_seconds=round(lag, 3),
                        watchdog_seconds=interval,
                        hint="the scheduler loop has not turned within the watchdog interval; "
                        "systemd will restart the service if it does not recover",
                    )
                    stale = True
                self._watchdog_withheld += 1
            await trio.sleep(interval / 2)

    def statistics(self) -> NotifierStatistics:
        """A snapshot of the counters."""
        return NotifierStatistics(
            enabled=self.enabled,
            datagrams_sent=self._sent,
            send_failures=self._send_failures,
            watchdog_pings=self._watchdog_pings,
            watchdog_withheld=self._watchdog_withheld,
        )

    def close(self) -> None:
        """Close the socket; a later :meth:`send` connects again."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def _connect(address: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            # Non-blocking: a manager too busy to drain its queue costs us a notification,
            # never a stalled event loop.
            sock.setblocking(False)
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock

    def _send_failed(self, error: OSError) -> None:
        self._send_failures += 1
        # Drop the connection: if the manager re-created its socket (daemon-reexec), the next
        # send reaches the new one.
        self.close()
        # One line per outage, not one per lost status update or watchdog ping.
        if self._failing:
            return
        self._failing = True
        _log().warning(
            "notify.send_failed",
            socket=_printable(self._address),
            error=str(error),
            hint="systemd notifications are lost (status, watchdog); the crawler goes on. "
            "If this is a systemd service, check NOTIFY_SOCKET and NotifyAccess=",
        )


def format_status(*, pages: int, fetches_per_second: float, freshness: float | None) -> str:
    """The ``STATUS=`` line: page count, fetch rate (fetches per second), estimated freshness.

    ``freshness`` is the estimated fraction of pages whose copy is current (0 to 1), ``None``
    before there is an estimate.
    """
    fresh = "n/a" if freshness is None else f"{freshness:.3f}"
    return f"{pages} pages, {fetches_per_second:.2f} fetches/s, est. freshness {fresh}"


def stdout_is_journal(environ: Mapping[str, str] | None = None) -> bool:
    """Whether standard output is connected to journald (``JOURNAL_STREAM`` matches fd 1).

    systemd sets ``JOURNAL_STREAM`` to ``device:inode`` of the stream it connected; comparing
    with fd 1 tells a service's own stdout from one a child inherited and redirected.
    """
    env = os.environ if environ is None else environ
    device, sep, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep:
        return False
    try:
        st = os.fstat(1)
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (OSError, ValueError):
        return False


# syslog(3) priorities by the level names structlog and logging use.
_PRIORITIES: dict[str, int] = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "info": 6,
    "debug": 7,
    "notset": 7,
}


def journal_priority_prefix(level: str) -> str:
    """``"<N>"`` for a log level name, to put in front of a line journald reads from stdout.

    journald strips the prefix and stores ``N`` as the line's ``PRIORITY`` (``journalctl -p``
    filters on it). Unknown levels map to ``info`` (6).
    """
    return f"<{_PRIORITIES.get(level.lower(), 6)}>"


def _socket_address(address: str | None) -> str | None:
    if not address:
        return None
    if address.startswith("@"):
        # The abstract namespace: systemd writes the leading NUL as "@".
        return "\0" + address[1:]
    if address.startswith("/"):
        return address
    # vsock:… (systemd 254, for VMs) and anything else are not for a host daemon.
    _log().warning(
        "notify.unsupported_address",
        socket=address,
        hint="NOTIFY_SOCKET must be an absolute path or @abstract name; notifications are off",
    )
    return None


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid is not None:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec


def _printable(address: str | None) -> str | None:
    if address is not None and address.startswith("\0"):
        return "@" + address[1:]
    return address
