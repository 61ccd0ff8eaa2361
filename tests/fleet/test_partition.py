"""A host's partition: stable everywhere, spread evenly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from refresher.fleet import partition_of

HOSTS = [f"h{i}.example.org" for i in range(200)] + ["example.org:8080", "bücher.example"]


def test_a_hosts_partition_is_the_same_in_another_python_process() -> None:
    code = (
        "import json, sys; from refresher.fleet import partition_of; "
        "print(json.dumps([partition_of(h, 1024) for h in json.load(sys.stdin)]))"
    )
    # a different hash seed: Python's own hash() would differ, partition_of must not
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(HOSTS),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout
    assert json.loads(out) == [partition_of(h, 1024) for h in HOSTS]


def test_known_hosts_have_fixed_partitions_across_releases() -> None:
    # pinned values: changing the hash would move every host of every existing fleet
    assert [partition_of(h, 1024) for h in ("example.org", "a.sim.test", "x:8080")] == PINNED


PINNED = [437, 639, 44]


def test_partitions_are_in_range_and_one_partition_takes_everything() -> None:
    assert all(0 <= partition_of(h, 7) < 7 for h in HOSTS)
    assert {partition_of(h, 1) for h in HOSTS} == {0}


def test_hosts_spread_evenly_over_the_partitions() -> None:
    partitions = 16
    counts = Counter(partition_of(f"host{i}.example", partitions) for i in range(16_000))
    assert len(counts) == partitions
    # binomial(16000, 1/16): sd ≈ 31; 6 sd either side of the mean of 1000
    assert max(counts.values()) < 1000 + 190
    assert min(counts.values()) > 1000 - 190


def test_a_partition_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_of("example.org", 0)
