"""The systemd units and the example config in systemd/.

The directives are checked in pure Python everywhere; ``systemd-analyze verify`` runs on top
where it is installed (Debian: ``apt-get install -y systemd``; it needs no running systemd).
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from refresher._config import load_config

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNIT_NAMES = ("refresher.service", "refresher@.service")
# What %E and %S expand to in a system unit.
SPECIFIERS = {"%E": "/etc", "%S": "/var/lib"}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections → key → every value given, in order (systemd.syntax(7), enough for our units)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"directive outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a KEY=value line: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def load_unit(name: str) -> Unit:
    return parse_unit((SYSTEMD_DIR / name).read_text(encoding="utf-8"))


def one(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"[{section}] {key}= given {len(values)} times"
    return values[0]


def exec_start_args(unit: Unit) -> list[str]:
    return one(unit, "ExecStart").split()


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def expand(text: str) -> str:
    for specifier, value in SPECIFIERS.items():
        text = text.replace(specifier, value)
    return text


@pytest.fixture(params=UNIT_NAMES)
def unit(request: pytest.FixtureRequest) -> Unit:
    name: str = request.param
    return load_unit(name)


def test_the_unit_is_type_notify_with_a_watchdog_and_restarts_on_failure(unit: Unit) -> None:
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    assert one(unit, "WatchdogSec") == "30s"
    assert one(unit, "Restart") == "on-failure"
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_the_unit_runs_refresher_run_and_reloads_with_sighup(unit: Unit) -> None:
    args = exec_start_args(unit)
    assert args[:2] == ["/usr/bin/refresher", "run"]
    assert one(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"


def test_the_unit_keeps_its_store_in_the_state_directory(unit: Unit) -> None:
    store = Path(expand(option(exec_start_args(unit), "--store")))
    state_dir = Path("/var/lib") / one(unit, "StateDirectory")
    assert store.parent == state_dir
    assert one(unit, "ConfigurationDirectory") == "refresher"


def test_the_unit_runs_unprivileged_and_hardened(unit: Unit) -> None:
    service = unit["Service"]
    assert service["CapabilityBoundingSet"] == [""]
    assert service["AmbientCapabilities"] == [""]
    assert one(unit, "DynamicUser") == "yes"
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictNamespaces": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
    }
    assert {key: one(unit, key) for key in expected} == expected
    assert set(one(unit, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert service["SystemCallFilter"][0] == "@system-service"
    assert re.fullmatch(r"\d+[KMGT]", one(unit, "MemoryMax"))


def test_the_template_differs_from_the_single_unit_only_by_the_instance_name() -> None:
    single, template = (load_unit(name)["Service"] for name in UNIT_NAMES)
    differing = {
        key for key in single.keys() | template.keys() if single.get(key) != template.get(key)
    }
    assert differing == {"ExecStart", "StateDirectory", "WorkingDirectory", "SyslogIdentifier"}
    for key in differing:
        assert "%i" in template[key][0], key
    args = exec_start_args(load_unit("refresher@.service"))
    assert option(args, "--config") == "%E/refresher/%i.toml"
    assert option(args, "--store") == "%S/refresher/%i/refresher.duckdb"
    assert one(load_unit("refresher@.service"), "StateDirectory") == "refresher/%i"


def test_the_example_config_loads_and_names_the_store_the_unit_uses() -> None:
    config = load_config(SYSTEMD_DIR / "refresher.toml")
    args = exec_start_args(load_unit("refresher.service"))
    assert config.store.path == Path(expand(option(args, "--store")))
    assert Path(expand(option(args, "--config"))) == Path("/etc/refresher/refresher.toml")
    assert config.control_socket == Path("/var/lib/refresher/control.sock")
    assert config.log.format == "auto"
    assert config.control.tcp_port is None


def bytes_of(size: str) -> int:
    """``256MB`` (DuckDB) or ``1G`` (systemd) in bytes, binary multiples for both."""
    match = re.fullmatch(r"(\d+)\s*([KMGT]?)B?", size.upper())
    assert match, size
    return int(match[1]) << (10 * " KMGT".index(match[2] or " "))


def test_duckdb_memory_limit_leaves_room_under_memory_max() -> None:
    config = load_config(SYSTEMD_DIR / "refresher.toml")
    memory_max = one(load_unit("refresher.service"), "MemoryMax")
    assert bytes_of(config.store.memory_limit) * 2 <= bytes_of(memory_max)


def test_the_drain_on_sigterm_fits_in_the_stop_timeout(unit: Unit) -> None:
    config = load_config(SYSTEMD_DIR / "refresher.toml")
    stop_timeout = re.fullmatch(r"(\d+)s", one(unit, "TimeoutStopSec"))
    assert stop_timeout, "TimeoutStopSec= in plain seconds, e.g. 60s"
    assert config.daemon.drain_timeout * 2 <= int(stop_timeout[1])


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)"
)


def verify(
    tmp_path: Path, units: dict[str, str], *names: str, binary: Path | None = None
) -> list[str]:
    """``systemd-analyze verify`` on ``units`` written to ``tmp_path``: its complaints.

    verify insists that ExecStart's binary exists, so /usr/bin/refresher is replaced by a stub
    script in tmp_path. Unknown directives are only warned about (exit code 0), so the lines it
    writes about our files count as failures too.
    """
    assert SYSTEMD_ANALYZE is not None
    stub = binary or tmp_path / "refresher"
    if binary is None:
        stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    for name, text in units.items():
        (tmp_path / name).write_text(text.replace("/usr/bin/refresher", str(stub)), "utf-8")
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", *(str(tmp_path / name) for name in names)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = [line for line in result.stderr.splitlines() if "refresher" in line]
    if result.returncode != 0:
        complaints.append(f"exit code {result.returncode}: {result.stderr.strip()}")
    return complaints


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    units = {name: (SYSTEMD_DIR / name).read_text(encoding="utf-8") for name in UNIT_NAMES}
    # A template is verified through an instance of it.
    assert verify(tmp_path, units, "refresher.service", "refresher@demo.service") == []


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit_running_the_installed_refresher(
    tmp_path: Path,
) -> None:
    # The ExecStart a drop-in sets for a venv install: this checkout's real console script.
    installed = Path(sys.executable).parent / "refresher"
    assert installed.is_file(), f"no console script at {installed}; pip install -e ."
    units = {"refresher.service": (SYSTEMD_DIR / "refresher.service").read_text("utf-8")}
    assert verify(tmp_path, units, "refresher.service", binary=installed) == []


@needs_systemd_analyze
def test_systemd_analyze_verify_would_catch_a_misspelt_directive(tmp_path: Path) -> None:
    text = (SYSTEMD_DIR / "refresher.service").read_text(encoding="utf-8")
    broken = text.replace("ProtectHome=yes", "ProtectHomes=yes")
    assert broken != text
    complaints = verify(tmp_path, {"refresher.service": broken}, "refresher.service")
    assert any("ProtectHomes" in line for line in complaints)
