from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from refresher._errors import ControlError
from refresher.ops._control import ControlServer, request


async def handler(req: dict[str, Any]) -> dict[str, Any]:
    op = req["op"]
    if op == "echo":
        return {"echo": req.get("x")}
    if op == "boom":
        raise RuntimeError("kaput")
    raise ValueError(f"unknown op {op!r}; try echo")


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "control.sock"


@pytest.fixture
async def server(nursery: trio.Nursery, sock_path: Path) -> Path:
    await nursery.start(ControlServer(sock_path, handler).run)
    return sock_path


async def ask(path: Path, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """``request`` from a thread, as the CLI would call it."""
    return await trio.to_thread.run_sync(lambda: request(path, payload, **kwargs))


class LineClient:
    """A raw client that sends arbitrary bytes and reads answer lines."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def answer(self) -> dict[str, Any]:
        with trio.fail_after(10):
            while b"\n" not in self.buffer:
                chunk = await self.stream.receive_some(65536)
                assert chunk, "the server closed the connection"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer


async def test_a_request_gets_the_handlers_answer(server: Path) -> None:
    assert await ask(server, {"op": "echo", "x": [1, "two"]}) == {"ok": True, "echo": [1, "two"]}


async def test_the_socket_is_for_the_owner_only(server: Path) -> None:
    mode = os.stat(server).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"{not json", "not a JSON object"),
        (b"\xff\xfe", "not a JSON object"),
        (b"[1, 2]", 'expected {"op": "..."}'),
        (b'"status"', 'expected {"op": "..."}'),
        (b"{}", 'expected {"op": "..."}'),
        (b'{"op": 3}', 'expected {"op": "..."}'),
        (b'{"op": "nope"}', "unknown op 'nope'; try echo"),
        (b'{"op": "boom"}', "internal error: kaput"),
    ],
)
async def test_a_bad_request_is_answered_with_an_error_and_the_connection_stays_usable(
    server: Path, line: bytes, error: str
) -> None:
    async with await trio.open_unix_socket(str(server)) as stream:
        client = LineClient(stream)
        await client.send(line + b"\n")
        answer = await client.answer()
        assert answer["ok"] is False
        assert error in answer["error"]
        assert answer["kind"] == ("internal" if error.startswith("internal") else "bad_request")
        await client.send(b'{"op": "echo", "x": 1}\n')
        assert await client.answer() == {"ok": True, "echo": 1}


async def test_requests_sent_together_are_answered_in_order(server: Path) -> None:
    async with await trio.open_unix_socket(str(server)) as stream:
        client = LineClient(stream)
        await client.send(b'{"op": "echo", "x": 1}\n\n  \n{"op": "echo", "x": 2}\n{"op": "ec')
        assert await client.answer() == {"ok": True, "echo": 1}
        assert await client.answer() == {"ok": True, "echo": 2}
        await client.send(b'ho", "x": 3}\n')
        assert await client.answer() == {"ok": True, "echo": 3}


async def test_request_raises_the_refusal_as_a_control_error(server: Path) -> None:
    with pytest.raises(ControlError, match="unknown op 'nope'; try echo"):
        await ask(server, {"op": "nope"})


async def test_request_to_a_missing_socket_is_a_control_error(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="no daemon answers at"):
        request(tmp_path / "absent.sock", {"op": "status"})


def leave_stale_socket(path: Path) -> None:
    """A socket file with nobody listening, as a crashed daemon leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


async def test_request_to_a_stale_socket_is_a_control_error(sock_path: Path) -> None:
    leave_stale_socket(sock_path)
    with pytest.raises(ControlError, match="no daemon answers at"):
        request(sock_path, {"op": "status"})


async def test_a_stale_socket_file_is_replaced_at_start(
    nursery: trio.Nursery, sock_path: Path
) -> None:
    leave_stale_socket(sock_path)
    await nursery.start(ControlServer(sock_path, handler).run)
    assert await ask(sock_path, {"op": "echo", "x": "fresh"}) == {"ok": True, "echo": "fresh"}


async def test_the_socket_is_removed_when_the_server_stops(sock_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(ControlServer(sock_path, handler).run)
        assert sock_path.exists()
        nursery.cancel_scope.cancel()
    assert not sock_path.exists()


async def test_a_socket_path_that_is_too_long_is_a_control_error(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 120) / "control.sock"
    with pytest.raises(ControlError, match=r"cannot create the control socket.*set \[control\]"):
        await ControlServer(path, handler).run()


async def serve_raw(nursery: trio.Nursery, path: Path, on_connect: Any) -> None:
    """A listener at ``path`` that hands each connection to ``on_connect`` (not a daemon)."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(4)
    nursery.start_soon(trio.serve_listeners, on_connect, [trio.SocketListener(sock)])


async def test_a_daemon_that_does_not_answer_in_time_is_a_control_error(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = tmp_path / "mute.sock"
    await serve_raw(nursery, path, lambda stream: trio.sleep_forever())
    with pytest.raises(ControlError, match=r"did not answer in 0\.2 s"):
        await ask(path, {"op": "status"}, timeout=0.2)


async def test_a_peer_that_hangs_up_without_an_answer_is_a_control_error(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = tmp_path / "rude.sock"

    async def hang_up(stream: trio.SocketStream) -> None:
        with trio.fail_after(10):
            await stream.receive_some(65536)  # the request has arrived; close without answering
        await stream.aclose()

    await serve_raw(nursery, path, hang_up)
    with pytest.raises(ControlError, match="closed the connection without an answer"):
        await ask(path, {"op": "status"})


async def test_a_peer_that_resets_the_connection_is_a_control_error(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = tmp_path / "reset.sock"
    # Closing with the request unread makes the kernel reset the client's connection.
    await serve_raw(nursery, path, lambda stream: stream.aclose())
    with pytest.raises(ControlError, match="broke"):
        await ask(path, {"op": "status", "padding": "x" * 200_000})


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", r"not JSON.*control socket"),
        (b"[1, 2]\n", r"answered \[1, 2\], not a JSON object"),
    ],
)
async def test_a_peer_that_answers_something_else_is_a_control_error(
    nursery: trio.Nursery, tmp_path: Path, reply: bytes, error: str
) -> None:
    path = tmp_path / "garbage.sock"

    async def garbage(stream: trio.SocketStream) -> None:
        await stream.send_all(reply)
        await stream.aclose()

    await serve_raw(nursery, path, garbage)
    with pytest.raises(ControlError, match=error):
        await ask(path, {"op": "status"})


async def _kinds(req: dict[str, Any]) -> dict[str, Any]:
    if req["op"] == "pause":
        raise ControlError(f"unknown host {req.get('host')!r}", kind="unknown_host")
    if req["op"] == "backup":
        raise ControlError("a fleet's state is in PostgreSQL", kind="fleet")
    raise ValueError("bad")


async def test_a_refusal_carries_its_kind_so_callers_never_read_the_message(
    nursery: trio.Nursery, sock_path: Path
) -> None:
    await nursery.start(ControlServer(sock_path, _kinds).run)
    with pytest.raises(ControlError) as unknown:
        await ask(sock_path, {"op": "pause", "host": "nowhere.test"})
    assert unknown.value.kind == "unknown_host"
    with pytest.raises(ControlError) as fleet:
        await ask(sock_path, {"op": "backup", "dest": "x.duckdb"})
    assert fleet.value.kind == "fleet"
    with pytest.raises(ControlError) as bad:
        await ask(sock_path, {"op": "other"})
    assert bad.value.kind == "bad_request"


async def test_no_daemon_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(ControlError) as e:
        await ask(tmp_path / "none.sock", {"op": "status"})
    assert e.value.kind == "unreachable"
