"""One way to write a daemon config and start a daemon: for the tests, ``bench/`` and
``analysis/``.

:func:`write_config` writes a TOML config from plain tables (what :func:`refresher.load_config`
reads back); :func:`harness_config` starts from the settings every harness shares (a store and
a control socket under one directory, JSON logs, a short drain) and merges the caller's
sections over them; :class:`DaemonProcess` runs ``refresher run`` as a real child process with
its JSON log lines in a file, outside any systemd supervision of the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DaemonProcess", "harness_config", "toml_value", "write_config"]

#: what a harness's daemon inherits from systemd must not reach the child
_SUPERVISION = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def toml_value(value: Any) -> str:
    """``value`` (bool, number, string, list, table) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a TOML basic string
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def write_config(path: Path, sections: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write ``sections`` ({section: {key: value}}) to ``path`` as TOML; returns ``path``."""
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def harness_config(
    directory: Path, *, user_agent: str, **sections: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The tables of a harness's daemon config: store, control socket and everything else under
    ``directory``, JSON logs, a short drain; ``sections`` are merged over them key by key."""
    base: dict[str, dict[str, Any]] = {
        "store": {"path": str(directory / "refresher.duckdb")},
        "crawl": {"user_agent": user_agent},
        "control": {"socket": str(directory / "control.sock")},
        "log": {"format": "json", "level": "info", "progress_interval": 1.0},
        "daemon": {"drain_timeout": 5.0},
    }
    for name, table in sections.items():
        base.setdefault(name, {}).update(table)
    return base


class DaemonProcess:
    """``refresher run --config CONFIG ARGS`` as a child process, its output in ``log_path``.

    ``env`` is added to the environment (after the systemd supervision variables are removed).
    ``cwd``: the child's working directory. ``python -m`` puts it first on ``sys.path``, ahead
    of ``PYTHONPATH``: a harness that runs one source tree's daemon from another tree's
    directory must pass the tree's root here, or it runs the other tree's code.
    """

    def __init__(
        self,
        config: Path,
        *args: str,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.config = config
        self.log_path = log_path or config.with_suffix(".log")
        base = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for name in _SUPERVISION:
            base.pop(name, None)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "refresher", "run", "--config", str(config), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**base, **(env or {})},
                cwd=cwd,
            )
        self.pid = self.proc.pid

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines so far (those with ``event`` = ``name`` when given)."""
        out = []
        for line in self.log_path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and (name is None or obj.get("event") == name):
                    out.append(obj)
        return out

    def event(self, name: str) -> dict[str, Any] | None:
        """The last log line with ``event`` = ``name``, if any."""
        found = self.events(name)
        return found[-1] if found else None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit status (None if killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
