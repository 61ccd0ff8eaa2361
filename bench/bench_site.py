"""Throughput of the site server (refresher.sim._site): requests per second and CPU per request.

Starts ``python -m refresher.sim._site`` in a child process (so its CPU time is its own), then
drives it from this process with two clients, each for ``--seconds``:

- raw: minimal keep-alive HTTP/1.1 over trio sockets, the cheapest client there is, to push
  the server to its limit;
- httpx: httpx.AsyncClient on trio, like the crawler.

For each it prints requests per second and the server's CPU microseconds per request (user +
system, from /proc), whose inverse is what one core of server can sustain. Prints, never
asserts. Usage: ``.venv/bin/python bench/bench_site.py [--seconds 5] [--connections 16]``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def start_server(hosts: int, pages: int) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(tempfile.mkdtemp()) / "port"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "refresher.sim._site", "--hosts", str(hosts)]
    command += ["--pages", str(pages), "--port", "0", "--port-file", str(port_file)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the site server did not start; run it by hand to see why")
        time.sleep(0.05)
    return process, int(port_file.read_text())


async def raw_client(
    port: int, host: str, pages: int, stop: float, counts: list[int], limit: int | None = None
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    buffer = b""
    i = 0
    async with stream:
        while trio.current_time() < stop and (limit is None or i < limit):
            path = f"/p{1 + i % max(1, pages - 1)}"
            i += 1
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bench\r\n\r\n"
            await stream.send_all(request.encode())
            while b"\r\n\r\n" not in buffer:
                buffer += await stream.receive_some(65536)
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            counts[0] += 1


async def httpx_client(
    client: httpx.AsyncClient, port: int, host: str, pages: int, stop: float, counts: list[int]
) -> None:
    i = 0
    while trio.current_time() < stop:
        path = f"/p{1 + i % max(1, pages - 1)}"
        i += 1
        response = await client.get(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
        if response.status_code not in (200, 404):
            raise SystemExit(f"unexpected status {response.status_code} for {host}{path}")
        counts[0] += 1


async def warm_up(port: int, args: argparse.Namespace) -> None:
    """Ask for every page once, so page bodies are rendered before the timing starts."""
    async with trio.open_nursery() as nursery:
        for i in range(args.hosts):
            host = f"h{i}.sim.test"
            nursery.start_soon(raw_client, port, host, args.pages, math.inf, [0], args.pages)


async def run_phase(name: str, pid: int, port: int, args: argparse.Namespace) -> None:
    hosts = [f"h{i % args.hosts}.sim.test" for i in range(args.connections)]
    counts = [0]
    cpu0, wall0, client0 = cpu_seconds(pid), time.perf_counter(), time.process_time()
    stop = trio.current_time() + args.seconds
    limits = httpx.Limits(max_connections=args.connections, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits) as client, trio.open_nursery() as nursery:
        for host in hosts:
            if name == "raw":
                nursery.start_soon(raw_client, port, host, args.pages, stop, counts)
            else:
                nursery.start_soon(httpx_client, client, port, host, args.pages, stop, counts)
    wall = time.perf_counter() - wall0
    cpu1 = cpu_seconds(pid)
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    server_cpu = user + system
    client_cpu = time.process_time() - client0
    n = counts[0]
    print(
        f"{name:6s} {n:8d} requests in {wall:5.2f} s = {n / wall:8.0f} req/s | server CPU "
        f"{1e6 * server_cpu / n:6.1f} µs/req ({1e6 * system / n:5.1f} system; one core: "
        f"{n / server_cpu:5.0f} req/s) | "
        f"client CPU {1e6 * client_cpu / n:6.1f} µs/req"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase (default 5)")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--hosts", type=int, default=16, help="virtual hosts (default 16)")
    parser.add_argument("--pages", type=int, default=50, help="pages per host (default 50)")
    args = parser.parse_args()
    process, port = start_server(args.hosts, args.pages)
    try:
        print(
            f"site server pid {process.pid} on 127.0.0.1:{port}: {args.hosts} hosts × "
            f"{args.pages} pages, {args.connections} keep-alive connections, "
            f"{os.cpu_count()} CPUs"
        )
        trio.run(warm_up, port, args)
        for name in ("raw", "httpx"):
            trio.run(run_phase, name, process.pid, port, args)
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
