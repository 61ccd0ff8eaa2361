"""The control endpoint: JSON lines over a unix socket (owner-only), optionally loopback TCP.

One request per line, ``{"op": "status"}``; one answer per line, ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``. A malformed request gets an error and changes nothing. The
client side is synchronous so the CLI needs no event loop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from refresher._errors import ControlError
from refresher.ops._logging import get_logger

__all__ = ["MAX_REQUEST_BYTES", "ControlServer", "request"]

log = get_logger("control")
MAX_REQUEST_BYTES = 16 * 1024 * 1024
Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlServer:
    def __init__(self, path: Path, handler: Handler, *, tcp_port: int | None = None) -> None:
        self.path = path
        self.tcp_port = tcp_port
        self._handler = handler

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners: list[trio.abc.Listener[Any]] = [await self._unix_listener()]
        if self.tcp_port is not None:
            listeners.extend(await trio.open_tcp_listeners(self.tcp_port, host="127.0.0.1"))
        try:
            task_status.started()
            await trio.serve_listeners(self._serve, listeners)
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _unix_listener(self) -> trio.SocketListener:
        # The store's file lock already guarantees one daemon per data directory, so a socket
        # file left here is a crashed daemon's.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(self.path))
        except OSError as e:
            sock.close()
            hint = " (paths of unix sockets must be short)" if e.errno == errno.EINVAL else ""
            raise ControlError(
                f"cannot create the control socket {str(self.path)!r}: {e}{hint}; "
                "set [control] socket to another path"
            ) from e
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        return trio.SocketListener(sock)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        buffer = b""
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                buffer += data
                if len(buffer) > MAX_REQUEST_BYTES:
                    await self._send(stream, {"ok": False, "error": "request too large"})
                    return
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        await self._send(stream, await self._answer(line))

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            return {**await self._handle(line), "ok": True}
        except ControlError as e:  # every refusal: its message and its kind
            return {"ok": False, "error": str(e), "kind": e.kind}

    async def _handle(self, line: bytes) -> dict[str, Any]:
        """The handler's answer to one request line; a refusal is a :class:`ControlError`."""
        try:
            req = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            raise ControlError(f"not a JSON object ({e}); send one JSON line") from e
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            raise ControlError('expected {"op": "..."}')
        try:
            return await self._handler(req)
        except ControlError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise ControlError(str(e)) from e
        except Exception as e:
            log.exception("control request failed", op=req.get("op"))
            raise ControlError(f"internal error: {e}", kind="internal") from e

    @staticmethod
    async def _send(stream: trio.abc.Stream, answer: dict[str, Any]) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(json.dumps(answer, default=str).encode() + b"\n")


def request(path: Path, payload: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to a running daemon and return its answer.

    Raises :class:`ControlError` when no daemon answers at ``path`` or it refuses the request.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except OSError as e:
            raise ControlError(
                f"no daemon answers at {str(path)!r} ({e.strerror})", kind="unreachable"
            ) from e
        broken: OSError | None = None
        try:
            sock.sendall(json.dumps(payload).encode() + b"\n")
        except BrokenPipeError as e:
            # A peer that answers without reading closes early: its answer may still be there.
            broken = e
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                if data:
                    break  # an answer without its newline: judge it below
                if broken is not None:
                    raise broken
                raise ControlError(
                    "the daemon closed the connection without an answer", kind="unreachable"
                )
            data += chunk
    except TimeoutError as e:
        raise ControlError(
            f"the daemon at {str(path)!r} did not answer in {timeout} s", kind="unreachable"
        ) from e
    except OSError as e:
        raise ControlError(
            f"the connection to {str(path)!r} broke ({e.strerror}); is the daemon still running?",
            kind="unreachable",
        ) from e
    finally:
        sock.close()
    try:
        answer = json.loads(data)
    except ValueError as e:
        raise ControlError(
            f"{str(path)!r} answered something that is not JSON ({e}); "
            "is it a refresher control socket?",
            kind="protocol",
        ) from e
    if not isinstance(answer, dict):
        raise ControlError(f"{str(path)!r} answered {answer!r}, not a JSON object", kind="protocol")
    if not answer.get("ok"):
        kind = answer.get("kind")
        raise ControlError(
            str(answer.get("error", "request refused")),
            kind=kind if isinstance(kind, str) else "bad_request",
        )
    return answer
