"""The wire of a page fetch: one HTTP/1.1 exchange on one kept-alive connection.

The fetcher holds at most one connection per host (politeness never puts two requests in
flight to a host), so there is no pool: a :class:`Connection` is a trio stream (TCP, or TLS
over TCP) that carries one request at a time. The request is written from bytes the fetcher
has pre-computed; the response is parsed by httptools (llhttp, the C parser of Node.js and
uvicorn), which calls back once per header field and once per body piece.

What this module adds to llhttp, so that a response means what it meant under h11 (httpx):
1xx answers are skipped, trailers are ignored, a ``Transfer-Encoding`` other than
``chunked`` is refused, a head over :data:`MAX_HEAD_BYTES` is refused (a server sending
headers forever), a header value with a control character is refused, and a body without
a length ends at the server's close. Framing errors raise :class:`~refresher._errors.
ProtocolFailure`; a connection that breaks raises :class:`~refresher._errors.ReadFailure`.
"""

from __future__ import annotations

import re
import socket
import ssl

import httptools
import trio

from refresher._errors import ConnectFailure, ProtocolFailure, ReadFailure

__all__ = ["MAX_HEAD_BYTES", "Connection", "Response", "Stale", "connect", "field_values"]

#: The most bytes of status line and header fields read before the body (httpcore's limit).
MAX_HEAD_BYTES = 100 * 1024
# bytes asked of the socket per receive; 256 KiB made no fewer receives of a docs page from
# nginx, which writes a filtered page in pieces of about 32 KiB (strace: 8-9 per 271 KiB page)
_RECEIVE = 65536
# h11 refuses these in a field value (RFC 9110 §5.5: field-vchar, SP and HTAB only); llhttp's
# lenient header mode (needed to unfold obsolete folded lines) would let them through.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class Response:
    """One response being read: the head is complete; :meth:`read` gives the body."""

    __slots__ = (
        "_body",
        "_conn",
        "_parser",
        "close_delimited",
        "done",
        "extra",
        "headers",
        "http_version",
        "reason",
        "status",
    )

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        #: None once closed: the parser holds this response's methods, a reference cycle
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        # as llhttp would refuse them, h11 accepts these: folded lines, bare LF line ends, and
        # Content-Length with Transfer-Encoding: chunked (chunked wins, RFC 9112 §6.3)
        self._parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_optional_cr_before_lf=True, lenient_chunked_length=True
        )
        self.status = 0
        self.reason = b""
        self.http_version = "HTTP/1.1"
        #: the header fields as received (names keep their case), trailers excluded
        self.headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self.done = False  # the message is complete
        self.extra = False  # bytes followed the message: the connection cannot be reused
        self.close_delimited = False

    # -- llhttp callbacks (through httptools) ----------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True

    def on_status(self, reason: bytes) -> None:
        if not self.status:
            self.reason += reason  # may arrive in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status:
            return  # a trailer field (after a chunked body): ignored, as httpx does
        if _BAD_VALUE.search(value) is not None:
            raise ProtocolFailure(f"a control character in the value of header {name!r}")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # called back by the parser itself
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: an interim answer, the real one follows
            self.headers = []
            self.reason = b""
            return
        self.status = status
        self.http_version = "HTTP/" + self._parser.get_http_version()
        chunked = False
        length = False
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"transfer-encoding":
                if value.strip().lower() != b"chunked":
                    raise ProtocolFailure(
                        f"Transfer-Encoding {value.decode('latin-1')!r}: only chunked is supported"
                    )
                chunked = True
            elif lower == b"content-length":
                length = True
        self.close_delimited = not (chunked or length or status in (204, 304))

    def on_body(self, data: bytes) -> None:
        self._body.append(data)

    def on_message_complete(self) -> None:
        if self.status:
            self.done = True

    # -- reading ---------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._parser is None:
            raise ProtocolFailure("the response was closed before its end was read")
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            raise ProtocolFailure("the server switched protocols unasked") from e
        except httptools.HttpParserError as e:
            if isinstance(e.__context__, ProtocolFailure):  # raised by a callback above
                raise ProtocolFailure(str(e.__context__)) from e
            if self.done:
                self.extra = True  # garbage after a complete answer: only the connection is lost
                return
            raise ProtocolFailure(f"the response is not valid HTTP/1.1 ({e})") from e

    async def _receive_head(self, first: bytes) -> None:
        size = 0
        data = first
        while True:
            size += len(data)
            self._feed(data)
            if self.status:
                return
            if size > MAX_HEAD_BYTES:
                raise ProtocolFailure(
                    f"the status line and headers are over {MAX_HEAD_BYTES} bytes"
                )
            data = await self._conn.receive()
            if not data:
                raise ReadFailure("the server closed the connection before a complete answer")

    async def read(self) -> list[bytes]:
        """The next pieces of the body as received (still content-encoded, not joined: the
        caller keeps them or joins them once); an empty list at its end."""
        while True:
            if self._body:
                body = self._body
                self._body = []
                return body
            if self.done:
                return []
            data = await self._conn.receive()
            if not data:
                if self.close_delimited:
                    self.done = True
                    self.extra = True  # the server closed: the connection is gone
                    return []
                raise ReadFailure("the server closed the connection in the middle of the body")
            self._feed(data)

    def close(self) -> None:
        """Let go of the parser once the exchange is over. It holds this response's methods:
        left to the cyclic garbage collector, that cycle was 13 objects per fetch (a young
        collection every 1,500 fetches on its own at the daemon's thresholds)."""
        self._parser = None

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry the next request once the body has been read."""
        if not self.done or self.extra or self.http_version != "HTTP/1.1":
            return False
        for name, value in self.headers:
            if name.lower() == b"connection" and b"close" in value.lower():
                return False
        return True


def field_values(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """Every value of the header field ``name`` (lower case), in order."""
    return [value for key, value in headers if key.lower() == name]


class Connection:
    """One HTTP/1.1 connection to ``address`` (TCP, or TLS over it); one request at a time."""

    __slots__ = ("_pending", "address", "idle_since", "requests", "stream")

    def __init__(self, stream: trio.abc.Stream, address: tuple[str, int]) -> None:
        self.stream = stream
        self.address = address
        self.requests = 0
        self.idle_since = trio.current_time()
        self._pending = b""

    async def receive(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(_RECEIVE))
        except (trio.BrokenResourceError, OSError) as e:
            raise ReadFailure(f"the connection broke ({_why(e)})") from e

    async def exchange(self, head: bytes) -> Response:
        """Send a request head and read the response's head.

        A connection that carried requests before and is found closed before any byte of the
        answer raises :class:`Stale` (the caller retries once on a new connection: a GET is
        idempotent, and a server may close an idle connection at any time)."""
        reused = self.requests > 0
        self.requests += 1
        try:
            await self.stream.send_all(head)
        except (trio.BrokenResourceError, OSError) as e:
            if reused:
                raise Stale from e
            raise ReadFailure(f"the request could not be sent ({_why(e)})") from e
        try:
            first = await self.receive()
        except ReadFailure:
            if reused:
                raise Stale from None
            raise
        if not first:
            if reused:
                raise Stale
            raise ReadFailure("the server closed the connection without answering")
        response = Response(self)
        await response._receive_head(first)
        return response

    def looks_closed(self) -> bool:
        """An idle connection with something to read has been closed (or spoken to) by the
        server: it cannot carry a request."""
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            return stream.socket.is_readable()
        return False

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class Stale(Exception):
    """A reused connection was closed by the server before it answered."""


def _why(e: BaseException) -> str:
    cause = e.__cause__ or e.__context__
    return str(cause or e) or type(cause or e).__name__


async def connect(
    ip: str, port: int, *, server_hostname: str | None, context: ssl.SSLContext | None
) -> Connection:
    """A connection to ``ip:port``; TLS when ``context`` is given, with ``server_hostname``
    as the SNI name and the name the certificate must carry."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((ip, port))
    except OSError as e:
        sock.close()
        raise ConnectFailure(
            f"could not connect to {ip}:{port} ({e.strerror or e}); check that the host is up "
            "and the port is right"
        ) from e
    except BaseException:
        sock.close()
        raise
    stream: trio.abc.Stream = trio.SocketStream(sock)
    if context is not None:
        tls = trio.SSLStream(stream, context, server_hostname=server_hostname)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, OSError) as e:
            await trio.aclose_forcefully(tls)
            raise ConnectFailure(
                f"TLS with {server_hostname or ip} failed ({_why(e)}); check that its "
                "certificate is valid for that name"
            ) from e
        except BaseException:
            await trio.aclose_forcefully(tls)
            raise
        stream = tls
    return Connection(stream, (ip, port))
