"""`refresher demo` (what `make run` runs) end to end, shortened."""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from refresher._config import Config, load_config
from refresher._errors import StoreError
from refresher.ops._cli import main
from refresher.sim._demo import start_fresh

pytestmark = pytest.mark.slow


def test_the_demo_shows_live_freshness_and_leaves_the_history_and_the_truth(tmp_path: Path):
    store = tmp_path / "var" / "demo.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "refresher", "demo", "--duration", "20", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(lines) >= 2 and "freshness est." in lines[-1] and "true" in lines[-1]
    assert "refresher query" in result.stdout
    truth = store.parent / "demo-truth.duckdb"
    con = duckdb.connect(str(store), read_only=True)
    try:
        fetches = con.execute("SELECT count(*) FROM fetch_log WHERE status = 200").fetchone()[0]
        found = con.execute("SELECT count(*) FROM pages WHERE source = 'link'").fetchone()[0]
    finally:
        con.close()
    assert fetches > 20 and found > 0  # seeds are the hosts' roots: the rest is discovered
    con = duckdb.connect(str(truth), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM truth_pages").fetchone()[0] >= 300
    finally:
        con.close()


def test_the_demo_serves_as_many_hosts_and_pages_as_asked(tmp_path: Path) -> None:
    # --hosts and --pages were parsed and then ignored: the demo served 10 × 30 whatever given
    store = tmp_path / "demo.duckdb"
    argv = ["demo", "--hosts", "2", "--pages", "4", "--duration", "3", "--store", str(store)]
    result = subprocess.run(
        [sys.executable, "-m", "refresher", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "a simulated web of 2 hosts × 4 pages" in result.stdout
    con = duckdb.connect(str(store.parent / "demo-truth.duckdb"), read_only=True)
    try:
        hosts = con.execute("SELECT DISTINCT host FROM truth_pages ORDER BY host").fetchall()
    finally:
        con.close()
    assert hosts == [("h0.sim.test",), ("h1.sim.test",)]


def _readme_queries() -> list[str]:
    """Every ``refresher query`` command line in the README's code blocks."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith("refresher query ")]
    # the synopsis line `refresher query "SQL"  # ...` is a placeholder, not an example
    return [line for line in lines if shlex.split(line, comments=True)[-1] != "SQL"]


def test_the_readme_has_query_examples_to_run() -> None:
    assert len(_readme_queries()) >= 5


def test_every_readme_query_example_runs_on_a_demo_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "var" / "demo.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "refresher", "demo", "--duration", "10", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    truth = store.parent / "demo-truth.duckdb"
    examples = [*_readme_queries(), 'refresher query "SELECT now() AS t, to_timestamp(0) AS epoch"']
    for line in examples:
        argv = shlex.split(line, comments=True)[1:]
        argv = [str(truth) if a.endswith(".duckdb") and "truth" in a else a for a in argv]
        if "--store" in argv:
            argv[argv.index("--store") + 1] = str(store)
        else:
            argv[1:1] = ["--store", str(store)]
        assert main(argv) == 0, f"{line}\n{capsys.readouterr().err}"
        out = capsys.readouterr().out
        count = out.strip().splitlines()[-1]
        assert count.endswith(("rows)", "(1 row)")), out


def _demo_config(store: Path) -> Config:
    return load_config(overrides={"store": {"path": str(store)}}, default_file=Path("/nonexistent"))


def test_a_new_demo_run_removes_the_previous_history_with_its_truth(tmp_path: Path) -> None:
    store = tmp_path / "demo.duckdb"
    paired = [store, tmp_path / "demo-truth.duckdb", tmp_path / "snapshot.duckdb"]
    for path in paired:
        path.write_bytes(b"previous run")
    assert sorted(start_fresh(_demo_config(store))) == sorted(paired)
    assert list(tmp_path.iterdir()) == []


def test_the_demo_refuses_to_remove_a_store_that_is_not_a_demo_history(tmp_path: Path) -> None:
    store = tmp_path / "refresher.duckdb"
    store.write_bytes(b"somebody's crawl")
    with pytest.raises(StoreError, match="not a demo's history"):
        start_fresh(_demo_config(store))
    assert store.read_bytes() == b"somebody's crawl"


class _TwoVersions:
    """A stand-in web for the demo's freshness line: every page changes once, at t = 100."""

    def version(self, host: str, path: str, at: float) -> int:
        return int(at >= 100.0)


def test_the_demo_line_counts_only_pages_with_an_estimate_and_says_when_there_is_none() -> None:
    from refresher.sim._demo import _freshness, _shown

    rows = [
        ("http://h0.sim.test/a", 50.0, 0.01),  # estimated, changed since its copy
        ("http://h0.sim.test/b", 150.0, 0.01),  # estimated, fresh
        ("http://h0.sim.test/c", 150.0, None),  # found since the last plan: no λ̂ yet
        ("http://h0.sim.test/d", None, None),  # no copy
    ]
    est, true = _freshness(_TwoVersions(), rows, now=160.0)  # type: ignore[arg-type]
    assert true == 0.5
    assert est == pytest.approx((math.exp(-0.01 * 110) + math.exp(-0.01 * 10)) / 2)
    none = _freshness(_TwoVersions(), rows[2:], now=160.0)  # type: ignore[arg-type]
    assert all(math.isnan(x) for x in none)
    assert _shown(*none) == "est. --   true --   (no estimate yet)"
    assert _shown(est, true) == f"est. {est:.2f} true 0.50"
