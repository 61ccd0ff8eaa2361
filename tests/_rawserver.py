"""A tiny scripted TCP server on 127.0.0.1 for tests of hostile and ordinary HTTP servers.

``raw_server(handler)`` listens on 127.0.0.1 on a free port and runs ``handler(conn)`` for
every accepted connection; the handler writes whatever bytes it likes (garbage headers,
endless bodies, resets, stalls). ``http_handler(app)`` is a well-behaved keep-alive HTTP/1.1
handler built on h11 that answers each request with ``app(request)``.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import h11
import trio

__all__ = [
    "App",
    "Connection",
    "Handler",
    "RawServer",
    "Reply",
    "Request",
    "http_handler",
    "raw_server",
]

_MAX_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lowercase names; repeated headers joined with ", "
    connection: int  # index of the connection it arrived on (0, 1, …)


@dataclass(slots=True, kw_only=True)
class Reply:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


@dataclass(slots=True, kw_only=True)
class RawServer:
    port: int
    connections: int = 0  # accepted so far
    closed: int = 0  # connections whose handler has finished (peer closed, or scripted end)
    requests: list[Request] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)  # TLS server names seen
    _changed: trio.Event = field(default_factory=trio.Event)

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; fail the test after ``timeout`` seconds."""
        with trio.fail_after(timeout):
            while not predicate():
                await self._changed.wait()


class Connection:
    """One accepted connection, with helpers for scripting a server by hand."""

    def __init__(self, server: RawServer, stream: trio.abc.Stream, index: int) -> None:
        self.server = server
        self.stream = stream
        self.index = index
        self._buffer = b""

    async def read_request(self) -> Request | None:
        """Read one request head (the body is ignored); None if the peer closed first."""
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > _MAX_HEAD:
                raise AssertionError("request head too long")
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return None
            if not data:
                return None
            self._buffer += data
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        line, *lines = head.decode("latin-1").split("\r\n")
        method, target, _version = line.split(" ", 2)
        headers: dict[str, str] = {}
        for item in lines:
            name, _, value = item.partition(":")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        request = Request(method=method, target=target, headers=headers, connection=self.index)
        self.server.requests.append(request)
        self.server.notify()
        return request

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
        assert isinstance(self.stream, trio.SocketStream)
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.stream.aclose()


Handler = Callable[[Connection], Awaitable[None]]
App = Callable[[Request], Reply]


@asynccontextmanager
async def raw_server(
    handler: Handler, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    """Serve ``handler`` on 127.0.0.1 (a free port) for the duration of the block."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server = RawServer(port=listeners[0].socket.getsockname()[1])

    async def serve_one(stream: trio.SocketStream) -> None:
        index = server.connections
        server.connections += 1
        server.notify()
        conn_stream: trio.abc.Stream = stream
        try:
            if ssl_context is not None:
                tls = trio.SSLStream(stream, ssl_context, server_side=True)
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError:
                    return
                conn_stream = tls
            await handler(Connection(server, conn_stream, index))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away; that is what many tests do on purpose
        finally:
            with trio.CancelScope(shield=True):
                await conn_stream.aclose()
            server.closed += 1
            server.notify()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve_one, listeners)
        yield server
        nursery.cancel_scope.cancel()


def http_handler(app: App) -> Handler:
    """A keep-alive HTTP/1.1 handler answering every request with ``app(request)``."""

    async def handle(conn: Connection) -> None:
        h = h11.Connection(h11.SERVER)
        while True:
            event = await _next_event(conn, h)
            if not isinstance(event, h11.Request):
                return
            headers: dict[str, str] = {}
            for name, value in event.headers:
                key = name.decode("latin-1").lower()
                text = value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            request = Request(
                method=event.method.decode(),
                target=event.target.decode("latin-1"),
                headers=headers,
                connection=conn.index,
            )
            while not isinstance(await _next_event(conn, h), h11.EndOfMessage):
                pass
            conn.server.requests.append(request)
            conn.server.notify()
            reply = app(request)
            names = {name.lower() for name, _ in reply.headers}
            out = list(reply.headers)
            if "content-length" not in names and "transfer-encoding" not in names:
                out.append(("Content-Length", str(len(reply.body))))
            await conn.send(h.send(h11.Response(status_code=reply.status, headers=out)) or b"")
            if reply.body and reply.status != 304:
                await conn.send(h.send(h11.Data(data=reply.body)) or b"")
            await conn.send(h.send(h11.EndOfMessage()) or b"")
            if h.our_state is h11.MUST_CLOSE:
                return
            h.start_next_cycle()

    return handle


async def _next_event(conn: Connection, h: h11.Connection) -> object:
    while True:
        event = h.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await conn.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            h.receive_data(bytes(data))
            continue
        return event
