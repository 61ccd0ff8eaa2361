"""bench/bench_vs_scrapy.py's --complete counting: nginx's access log read as it grows, and
Scrapy's starts with the hosts taking turns (the figures rest on both)."""

from __future__ import annotations

import sys
from pathlib import Path

_BENCH = str(Path(__file__).resolve().parent.parent / "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from bench_vs_scrapy import AccessLog, by_turns  # noqa: E402

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
