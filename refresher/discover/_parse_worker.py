"""A parse process: runs the calls the daemon sends on its stdin, answers on its stdout.

Started by :class:`refresher.discover._threads.ParseProcesses` as ``python -m
refresher.discover._parse_worker FORMAT LEVEL`` (a fresh interpreter, never a fork of the
daemon). A call comes in as two 8-byte little-endian lengths, a pickle of a callable without
arguments and its body's raw bytes (the pickle refers to them: persistent id 0); the answer
goes out as one length and a pickle, ``(True, result)`` or ``(False, exception)``. Before
the first answer, once its imports are done, it writes a zero length: it is ready (a call
sent before then waits out the interpreter's start, about 0.6 CPU s).
The process ends when its stdin does (the daemon closed it, or died). Its logs go to stderr,
which it shares with the daemon: stdout carries the answers alone.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
from typing import BinaryIO

__all__ = ["HEADER", "main"]

#: bytes of the length that precedes each pickle on a parse process's pipes (a call has two:
#: its pickle's and its body's, the body's raw bytes following the pickle). Here, not in
#: :mod:`refresher.discover._threads`, so that this process never imports trio (0.1 CPU s of
#: its start)
HEADER = 8


def _read(stream: BinaryIO, n: int) -> bytes:
    """Exactly ``n`` bytes, or fewer when the stream ends first."""
    parts, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class _CallUnpickler(pickle.Unpickler):
    """Unpickles a call, giving it back the body that came beside its pickle."""

    def __init__(self, call: bytes, body: bytes) -> None:
        super().__init__(io.BytesIO(call))
        self.body = body

    def persistent_load(self, pid: object) -> bytes:
        if pid != 0:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.body


def _answer(call: bytes, body: bytes) -> bytes:
    """The pickled answer to one pickled call and its body."""
    try:
        reply: tuple[bool, object] = (True, _CallUnpickler(call, body).load()())
    except Exception as e:
        reply = (False, e)
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # an unpicklable result or exception: said as an error
        failed = RuntimeError(f"the parse process could not send its answer back: {e!r}")
        return pickle.dumps((False, failed), protocol=pickle.HIGHEST_PROTOCOL)


def main(argv: list[str]) -> int:
    log_format, log_level = [*argv, "json", "info"][:2]
    # The daemon ends this process by closing its stdin, after its last call: a SIGTERM or
    # SIGINT sent to the daemon's whole group (systemd, a terminal) must not cut a call.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The answers go to the original stdout; anything else that prints goes to stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from refresher.discover import _parse  # noqa: F401  (the parser, imported once)
    from refresher.ops._logging import configure_logging

    configure_logging(format=log_format, level=log_level)
    try:
        answers.write(bytes(HEADER))  # ready: no answer is ever empty
        answers.flush()
    except BrokenPipeError:  # closed before it was ready: nothing to answer
        return 0
    calls = sys.stdin.buffer
    while len(head := _read(calls, 2 * HEADER)) == 2 * HEADER:
        call = _read(calls, int.from_bytes(head[:HEADER], "little"))
        body = _read(calls, int.from_bytes(head[HEADER:], "little"))
        data = _answer(call, body)
        answers.write(len(data).to_bytes(HEADER, "little") + data)
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
