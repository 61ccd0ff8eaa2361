"""A parse process: runs the calls the daemon sends on its stdin, answers on its stdout.

Started by :class:`refresher.discover._threads.ParseProcesses` as ``python -m
refresher.discover._parse_worker FORMAT LEVEL`` (a fresh interpreter, never a fork of the
daemon). Each message either way is an 8-byte little-endian length and a pickle: a call (a
picklable callable without arguments) in, ``(True, result)`` or ``(False, exception)`` out.
The process ends when its stdin does (the daemon closed it, or died). Its logs go to stderr,
which it shares with the daemon: stdout carries the answers alone.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import BinaryIO

from refresher.discover._threads import HEADER

__all__ = ["main"]


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


def _answer(call: bytes) -> bytes:
    """The pickled answer to one pickled call."""
    try:
        reply: tuple[bool, object] = (True, pickle.loads(call)())
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
    calls = sys.stdin.buffer
    while len(head := _read(calls, HEADER)) == HEADER:
        call = _read(calls, int.from_bytes(head, "little"))
        data = _answer(call)
        answers.write(len(data).to_bytes(HEADER, "little") + data)
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
