"""`refresher demo` (what `make run` runs) end to end, shortened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.slow


def test_the_demo_shows_live_freshness_and_leaves_the_history_and_the_truth(tmp_path: Path):
    store = tmp_path / "var" / "demo.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "refresher", "demo", "--duration", "12", "--store", str(store)],
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
