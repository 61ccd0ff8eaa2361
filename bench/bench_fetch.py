"""The page fetch alone on real pages: CPU per page of :class:`refresher.crawl.Fetcher`.

    .venv/bin/python bench/bench_fetch.py [--docs DIR] [--hosts 20] [--rounds 3]

Debian's nginx serves a documentation tree (default /usr/share/doc/python3.11/html) under
``--hosts`` virtual hosts on 127.0.0.1, as bench_vs_scrapy.py's docs web does (the host name
injected into each page). One trio task per host fetches every page of its host in turn over
the fetcher's kept-alive connection, as the daemon's politeness allows (one request in flight
per host): the event loop's share of a page (send the request, receive and parse the
response, decode, digest and keep the body), with nothing else in the process. Prints, per
round, pages/s, this process's CPU ms per page (user and system) and nginx's, and the bytes
received per page. Asserts nothing: figures for README.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))
from bench_daemon import cpu_seconds
from bench_vs_scrapy import DOCS, nginx

from refresher import Fetcher, Resolver


async def fetch_all(port: int, hosts: int, pages: list[str]) -> tuple[int, int]:
    """Every page of every host once; the 2xx pages and their decoded bytes."""
    resolver = Resolver(static={"*.docs.test": "127.0.0.1"})
    done = [0, 0]
    async with Fetcher(user_agent="bench-fetch/1.0", resolver=resolver) as fetcher:

        async def host(i: int) -> None:
            for page in pages:
                r = await fetcher.fetch(f"http://h{i}.docs.test:{port}/{page}")
                if r.status is not None and 200 <= r.status < 300:
                    done[0] += 1
                    done[1] += r.bytes

        async with trio.open_nursery() as nursery:
            for i in range(hosts):
                nursery.start_soon(host, i)
    return done[0], done[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="pages of the tree at most (0: all)")
    args = parser.parse_args()
    pages = sorted(p.relative_to(args.docs).as_posix() for p in args.docs.rglob("*.html"))
    if args.limit:
        pages = pages[: args.limit]
    print(f"{args.docs}: {len(pages)} pages x {args.hosts} hosts; load {os.getloadavg()[:3]}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp,
        nginx(Path(tmp), args.docs) as port,
    ):
        nginx_pid = int((Path(tmp) / "nginx.pid").read_text())
        for round_ in range(args.rounds):
            t0, c0, n0 = time.perf_counter(), os.times(), cpu_seconds(nginx_pid)
            n, size = trio.run(fetch_all, port, args.hosts, pages)
            t1, c1, n1 = time.perf_counter(), os.times(), cpu_seconds(nginx_pid)
            user, system = c1.user - c0.user, c1.system - c0.system
            print(
                f"  round {round_ + 1}: {n / (t1 - t0):7.1f} pages/s  "
                f"CPU ms/page {1e3 * (user + system) / n:5.3f} "
                f"(user {1e3 * user / n:5.3f}, system {1e3 * system / n:5.3f})  "
                f"nginx {1e3 * (n1 - n0) / n:5.3f}  {size / n / 1024:6.1f} KiB/page"
            )


if __name__ == "__main__":
    main()
