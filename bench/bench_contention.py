"""What a busy machine does to each part of a page's work: CPU per page of the parts refresher
and Scrapy spend it on, timed alone in one thread (and the processor in two), on a quiet
machine and beside competitor processes, in turns. Prints; asserts nothing.

    .venv/bin/python bench/bench_contention.py [--load spin,memory] [--turns 3] [DIR]

DIR defaults to /usr/share/doc/python3.11/html (Debian ``python3.11-doc``); its first
``--pages`` pages are used. Each turn times every part once under each condition: none
(nothing started), ``spin`` (one busy-loop process) and ``memory`` (one process copying a
200 MB numpy array into another: memory bandwidth and the shared cache), the competitor at
the bench's own nice value. The parts run in this process's threads while the competitor
takes the other core, so a part's CPU per page rises only where the competitor costs it
something besides the core itself: the caches and memory it shares, or (the two-thread
processor) the GIL's hand-offs when its threads are descheduled. CPU per page is
``time.thread_time`` (one thread) or ``time.process_time`` (two), the median over the turns.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_parsers import DEFAULT_DIR, PROCESSORS, bare_lxml, load
from bench_vs_scrapy import competitors
from selectolax.lexbor import LexborHTMLParser
from zlib_ng import zlib_ng

from refresher.discover._parse import Document


def lexbor_parse(doc: Document) -> object:
    return LexborHTMLParser(doc.body)


def gzip_level(doc: Document) -> object:
    return zlib_ng.compress(doc.body, 3, wbits=zlib.MAX_WBITS | 16)


def sha1(doc: Document) -> object:
    return hashlib.sha1(doc.body).digest()


def python_loop(doc: Document) -> object:
    """Interpreter work with a small working set (dicts, strings, calls), about a page's
    worth of a crawler's Python bookkeeping."""
    seen: dict[str, int] = {}
    for i in range(3000):
        key = f"/p/{i % 97}"
        seen[key] = seen.get(key, 0) + 1
    return seen


PARTS: dict[str, Callable[[Document], object]] = {
    "refresher's processor (HtmlLinks, Lexbor tree)": PROCESSORS["lexbor"].process,
    "Lexbor parse alone (selectolax)": lexbor_parse,
    "lxml fromstring + //a/@href + text (Scrapy's parser)": bare_lxml,
    "gzip level 3 (zlib-ng, the archive)": gzip_level,
    "SHA-1 of the body": sha1,
    "a Python loop (dicts, strings)": python_loop,
}


def one_thread(fn: Callable[[Document], object], docs: list[Document]) -> float:
    """CPU ms per page of ``fn`` over ``docs`` in this thread."""
    start = time.thread_time()
    for doc in docs:
        fn(doc)
    return 1e3 * (time.thread_time() - start) / len(docs)


def two_threads(fn: Callable[[Document], object], docs: list[Document]) -> float:
    """CPU ms per page of ``fn`` over ``docs`` split between two threads (the process's CPU:
    the threads' and their GIL hand-offs)."""
    with ThreadPoolExecutor(2) as pool:
        start = time.process_time()
        list(pool.map(lambda half: [fn(d) for d in half], (docs[0::2], docs[1::2])))
        return 1e3 * (time.process_time() - start) / len(docs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--pages", type=int, default=150)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--load", default="spin,memory", help="competitor kinds, in turns")
    args = parser.parse_args()
    docs = load(args.dir, args.pages)
    conditions = ["none", *args.load.split(",")]
    timed: dict[tuple[str, str], list[float]] = {}
    for fn in PARTS.values():  # warm: caches of link verdicts and token hashes
        one_thread(fn, docs)
    for turn in range(args.turns):
        for condition in conditions if turn % 2 == 0 else conditions[::-1]:
            count = 0 if condition == "none" else 1
            with competitors(count, "spin" if condition == "none" else condition):
                for part, fn in PARTS.items():
                    timed.setdefault((part, condition), []).append(one_thread(fn, docs))
                key = ("refresher's processor in two threads", condition)
                timed.setdefault(key, []).append(two_threads(PROCESSORS["lexbor"].process, docs))
        print(f"turn {turn + 1} done", file=sys.stderr)
    print(f"{len(docs)} pages of {args.dir}; CPU ms per page, median of {args.turns} turns")
    print(f"{'part':<54}" + "".join(f"{c:>10}" for c in conditions) + "   rise")
    parts = [*PARTS, "refresher's processor in two threads"]
    for part in parts:
        cells = [statistics.median(timed[part, c]) for c in conditions]
        rises = " ".join(f"{100 * (c / cells[0] - 1):+.0f}%" for c in cells[1:])
        print(f"{part:<54}" + "".join(f"{c:10.3f}" for c in cells) + f"   {rises}")


if __name__ == "__main__":
    main()
