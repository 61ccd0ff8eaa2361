"""Structured logging: JSON lines when stdout is not a terminal (systemd, pipes), readable on one.

One event per line. Under journald the JSON line is the MESSAGE; ``level`` and ``event`` are
keys, so ``journalctl -o cat | jq 'select(.level=="warning")'`` works.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from refresher.ops._notify import journal_priority_prefix, stdout_is_journal

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(
    *, format: str = "auto", level: str = "info", stream: TextIO | None = None
) -> None:
    """Set up structlog once per process. ``format`` is "auto", "json" or "console"."""
    out = stream if stream is not None else sys.stdout
    json_lines = format == "json" or (format == "auto" and not out.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if json_lines:
        render = structlog.processors.JSONRenderer()
        if stream is None and stdout_is_journal():
            # journald reads "<N>" in front of a line as its priority: `journalctl -p warning`.
            def journal(logger: Any, name: str, event: Any) -> str:
                line = str(render(logger, name, event))
                return journal_priority_prefix(str(event.get("level", name))) + line

            processors.append(journal)
        else:
            processors.append(render)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    """A structlog logger bound with ``component=name``."""
    # Lazy: loggers made at import time follow the configuration made later.
    return structlog.get_logger(component=name)
