"""bench/bench_vs_scrapy.py's --complete counting: nginx's access log read as it grows, and
Scrapy's starts with the hosts taking turns (the figures rest on both); --stages' CPU by
thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parent.parent / "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from bench_daemon import cpu_seconds, thread_cpu_seconds  # noqa: E402
from bench_vs_scrapy import (  # noqa: E402
    AccessLog,
    autogroup,
    by_turns,
    competitors,
    context_switches,
    cpu_affinity,
    cpu_by_thread_kind,
    machine_account,
    machine_reading,
    parse_cpus,
    refetch_line,
    steal_ticks,
    thread_switches,
    thread_waits,
)

PAGES = {("h0.docs.test", "/index.html"), ("h0.docs.test", "/a.html"), ("h1.docs.test", "/a.html")}


def test_a_page_counts_once_and_only_when_served_with_a_200(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(path, PAGES)
    path.write_text(
        "h0.docs.test /robots.txt 404\n"
        "h0.docs.test /index.html 200\n"
        "h0.docs.test /index.html 200\n"  # a re-fetch
        "h1.docs.test /a.html 304\n"
        "h0.docs.test /elsewhere.html 200\n"  # not one of the web's pages
    )
    log.poll()
    assert log.served == {("h0.docs.test", "/index.html")}
    assert log.requests == 5
    assert not log.complete


def test_the_log_is_read_from_where_it_stood_and_a_half_written_line_waits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "access.log"
    path.write_text("h0.docs.test /index.html 200\n")  # the previous crawler's
    log = AccessLog(path, PAGES)
    with path.open("a") as f:
        f.write("h0.docs.test /a.html 200\nh1.docs.test /a.h")
    log.poll()
    assert log.served == {("h0.docs.test", "/a.html")}
    with path.open("a") as f:
        f.write("tml 200\nh0.docs.test /index.html 200\n")
    log.poll()
    assert log.requests == 3
    assert log.complete


def test_a_log_not_yet_written_reads_as_empty(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "access.log", PAGES)
    log.poll()
    assert log.requests == 0


def test_scrapys_starts_take_the_hosts_in_turns_keeping_each_hosts_order() -> None:
    urls = ["http://a/1", "http://a/2", "http://a/3", "http://b/1", "http://c/1", "http://c/2"]
    assert by_turns(urls) == [
        "http://a/1",
        "http://b/1",
        "http://c/1",
        "http://a/2",
        "http://c/2",
        "http://a/3",
    ]
    assert by_turns([]) == []


def test_threads_of_one_kind_add_up_and_threads_without_python_count_as_native() -> None:
    before = {1: (1.0, 0.125), 2: (2.0, 0.25), 3: (0.5, 0.0)}
    after = {1: (1.5, 0.25), 2: (2.25, 0.25), 3: (0.5, 0.0), 4: (0.125, 0.0), 5: (3.0, 0.5)}
    names = {1: "parse_0", 2: "parse_1", 3: "MainThread", 5: "Trio thread 7"}
    kinds = cpu_by_thread_kind(before, after, names)
    assert kinds == {
        "Trio thread": (3.0, 0.5),  # started within the window: all of its CPU counts
        "parse": (0.75, 0.125),
        "native": (0.125, 0.0),
        "MainThread": (0.0, 0.0),
    }
    assert list(kinds) == ["Trio thread", "parse", "native", "MainThread"]  # most first


def test_without_thread_names_every_thread_is_unnamed() -> None:
    kinds = cpu_by_thread_kind({}, {1: (1.0, 0.0), 2: (0.5, 0.25)}, {})
    assert kinds == {"unnamed": (1.5, 0.25)}


def test_a_threads_cpu_is_read_from_proc_while_it_runs() -> None:
    stop = threading.Event()
    started = threading.Event()
    ids: list[int] = []

    def burn() -> None:
        ids.append(threading.get_native_id())
        started.set()
        x = 0
        while not stop.is_set():
            x += 1

    thread = threading.Thread(target=burn)
    thread.start()
    try:
        assert started.wait(10)
        deadline = time.monotonic() + 10
        while sum(thread_cpu_seconds(os.getpid()).get(ids[0], (0.0, 0.0))) == 0.0:
            assert time.monotonic() < deadline, "the busy thread's CPU never showed"
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()


def test_a_competitor_runs_at_the_nice_value_given_and_is_gone_afterwards() -> None:
    with competitors(1, "spin", nice=19) as pids:
        assert len(pids) == 1
        assert os.getpriority(os.PRIO_PROCESS, pids[0]) == 19
        deadline = time.monotonic() + 10
        while cpu_seconds(pids[0]) == 0.0:  # it spins: its CPU shows
            assert time.monotonic() < deadline, "the competitor never used a CPU"
            time.sleep(0.01)
    assert not Path(f"/proc/{pids[0]}").exists()


def test_no_competitors_start_nothing() -> None:
    with competitors(0, "memory") as pids:
        assert pids == []


def test_a_thread_that_blocks_adds_voluntary_switches() -> None:
    woken = threading.Event()
    ids: list[int] = []

    def wait() -> None:
        ids.append(threading.get_native_id())
        woken.wait(10)

    before = context_switches(os.getpid())
    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while not ids or thread_switches(os.getpid()).get(ids[0], (0.0, 0.0))[0] == 0.0:
        assert time.monotonic() < deadline, "the blocked thread's switch never showed"
        time.sleep(0.01)
    woken.set()
    thread.join()
    assert context_switches(os.getpid())[0] > before[0]


def test_the_stolen_ticks_are_a_part_of_all_ticks() -> None:
    stolen, total = steal_ticks()
    assert 0 <= stolen <= total
    assert total > 0


def test_the_machines_busy_time_is_split_among_the_crawler_nginx_the_bench_and_the_rest() -> None:
    before = dict.fromkeys(
        (
            "user",
            "nice",
            "system",
            "idle",
            "iowait",
            "irq",
            "softirq",
            "steal",
            "crawler",
            "nginx",
            "bench",
        ),
        0.0,
    )
    after = before | {"user": 3.0, "nice": 1.0, "system": 1.0, "idle": 2.0, "softirq": 0.5}
    after |= {"crawler": 3.0, "nginx": 0.5, "bench": 0.25}
    text = machine_account(before, after, pages=1000, seconds=4.0)
    # busy 5.5 s: 3 crawler + 0.5 nginx + 0.25 bench + 1.75 everything else; softirq inside
    assert "crawler 3.00  nginx 0.50  bench 0.25  other 1.75  idle 2.00" in text
    assert "(softirq+irq inside) 0.50" in text
    assert "cores: crawler 0.75" in text


def test_a_reading_has_the_machines_columns_and_the_processes_cpu() -> None:
    reading = machine_reading(os.getpid(), os.getpid())
    assert reading["idle"] > 0
    assert reading["crawler"] == pytest.approx(reading["nginx"], abs=0.05)
    assert reading["bench"] > 0


def test_a_busy_threads_wait_for_a_cpu_is_read_per_thread() -> None:
    waits = thread_waits(os.getpid())
    assert threading.get_native_id() in waits
    assert all(wait >= 0.0 and zero == 0.0 for wait, zero in waits.values())


def allowed_cpus(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(
        line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list")
    )


def test_a_process_started_while_pinned_runs_on_those_cpus_and_the_bench_gets_its_own_back() -> (
    None
):
    own = os.sched_getaffinity(0)
    cpu = min(own)
    with cpu_affinity(frozenset({cpu})):
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
    try:
        assert allowed_cpus(child.pid) == str(cpu)
        assert os.sched_getaffinity(0) == own
    finally:
        child.communicate(b"")


def test_no_cpus_given_leave_the_affinity_alone() -> None:
    own = os.sched_getaffinity(0)
    with cpu_affinity(None):
        assert os.sched_getaffinity(0) == own


def test_cpus_are_read_as_numbers_and_ranges() -> None:
    cpu = min(os.sched_getaffinity(0))
    assert parse_cpus(str(cpu)) == {cpu}
    assert parse_cpus(f"{cpu}-{cpu}") == {cpu}


@pytest.mark.parametrize("text", ["x", "", "0-", "9999"])
def test_cpus_that_are_not_numbers_or_not_the_machines_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(SystemExit, match="--refresher-cpus") as caught:
        parse_cpus(text)
    assert "\n" not in str(caught.value)


def test_the_header_reads_the_kernels_autogroup_setting() -> None:
    path = Path("/proc/sys/kernel/sched_autogroup_enabled")
    expected = ("on" if path.read_text().strip() == "1" else "off") if path.exists() else "absent"
    assert autogroup() == expected


def test_the_store_tells_re_fetches_made_while_other_pages_had_no_copy(tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "refresher.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE fetches (page_id BIGINT, host_id INTEGER, started_at DOUBLE)")
    # host 1 ends its pass at 2.0 and re-fetches page 1 at 2.5 and 3.2; host 2 ends at 4.0
    # after re-fetching its page 3 at 3.5 (before its own last first fetch); page 1 again at 9
    rows = [(1, 1, 1.0), (2, 1, 2.0), (1, 1, 2.5), (1, 1, 3.2), (3, 2, 1.5), (3, 2, 3.5)]
    rows += [(4, 2, 4.0), (1, 1, 9.0)]
    con.executemany("INSERT INTO fetches VALUES (?, ?, ?)", rows)
    con.close()
    line = refetch_line(db)
    assert "4 first fetches, 3 re-fetches before the last of them (75.0%; 1 before" in line
    assert "2 in the pass's last second" in line and "within 2.00 s" in line
