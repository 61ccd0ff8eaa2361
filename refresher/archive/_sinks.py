"""The change feed: every change handed to sinks loaded by entry point (group
``refresher.sinks``), the httpx way: one small interface, :class:`Sink`, and defaults.

Built in: the WARC archive itself (always first, durable with the store's batch: see
:mod:`refresher.archive._warc`), ``jsonl`` (a rotating JSON-lines file of changes) and
``webhook`` (POST each change as JSON, with retry and backoff). A third-party sink is a
distribution declaring::

    [project.entry-points."refresher.sinks"]
    mysink = "mypackage:make_sink"      # make_sink(config: refresher.Config) -> Sink

and ``[sinks] names = ["mysink"]``.

Each sink has its own bounded queue (``sinks.queue`` changes) and its own task. The crawler only
ever *offers* a change (:meth:`ChangeFeed.submit` never waits): a slow sink fills its queue and
what no longer fits is dropped, counted and logged; a sink that raises is counted and logged and
gets the next change. Neither slows the crawl. A change is offered when its fetch is queued for
the store, before its batch commits: after a crash a change may be offered again when the page
is fetched again (at-least-once, by digest).
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
import trio

from refresher._config import Config
from refresher._errors import ArchiveError, ConfigError
from refresher.archive._warc import Capture
from refresher.ops._logging import get_logger

__all__ = [
    "Change",
    "ChangeFeed",
    "ChangeFeedStatistics",
    "JsonlSink",
    "Sink",
    "WebhookSink",
    "jsonl_sink",
    "load_sinks",
    "webhook_sink",
]

log = get_logger("sinks")

ENTRY_POINT_GROUP = "refresher.sinks"


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One new version of a page, as the sinks receive it."""

    url: str  # the page's canonical URL
    fetched_at: float  # unix seconds
    status: int
    headers: tuple[tuple[str, str], ...]  # response header fields as received
    body: bytes | None  # the decoded body (at most fetch.max_body_bytes)
    digest: bytes | None  # the body's SHA-1 (None when cut at the cap)
    previous_digest: bytes | None  # the page's digest before: None for its first version
    meaningful: bool | None  # past the near-duplicate threshold (None: first version)
    truncated: bool

    def to_json(self, *, body: bool) -> dict[str, Any]:
        """A JSON-ready dict; digests in hex, the body base64 when ``body``."""
        out: dict[str, Any] = {
            "url": self.url,
            "fetched_at": self.fetched_at,
            "status": self.status,
            "headers": [list(h) for h in self.headers],
            "digest": self.digest.hex() if self.digest else None,
            "previous_digest": self.previous_digest.hex() if self.previous_digest else None,
            "meaningful": self.meaningful,
            "truncated": self.truncated,
        }
        if body and self.body is not None:
            out["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return out


@runtime_checkable
class Sink(Protocol):
    """A consumer of the change feed. ``send`` runs in the sink's own task, one change at a
    time, and may take its time; ``aclose`` is called once at shutdown."""

    async def send(self, change: Change) -> None: ...

    async def aclose(self) -> None: ...


SinkFactory = Callable[[Config], Sink]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeFeedStatistics:
    offered: int = field(metadata={"metric": "counter"})  # changes offered by the crawler
    #: per sink: changes delivered, dropped (queue full), failed (the sink raised)
    delivered: Mapping[str, int] = field(metadata={"metric": "counter"})
    dropped: Mapping[str, int] = field(metadata={"metric": "counter"})
    failed: Mapping[str, int] = field(metadata={"metric": "counter"})
    queued: Mapping[str, int]


class ChangeFeed:
    """Offers each change to every sink through that sink's bounded queue."""

    def __init__(
        self, sinks: Mapping[str, Sink], *, queue: int = 1000, drain_grace: float = 5.0
    ) -> None:
        self.sinks = dict(sinks)
        self.drain_grace = drain_grace  # seconds each sink gets at shutdown for its queue
        self._channels = {name: trio.open_memory_channel[Change](queue) for name in self.sinks}
        self._offered = 0
        self._delivered = dict.fromkeys(self.sinks, 0)
        self._dropped = dict.fromkeys(self.sinks, 0)
        self._failed = dict.fromkeys(self.sinks, 0)

    def submit(self, capture: Capture, *, previous: bytes | None, meaningful: bool | None) -> None:
        """Offer the change ``capture`` is; never waits."""
        if not self.sinks:
            return
        change = Change(
            url=capture.url,
            fetched_at=capture.fetched_at,
            status=capture.status,
            headers=capture.headers,
            body=capture.payload,
            digest=capture.digest,
            previous_digest=previous,
            meaningful=meaningful,
            truncated=capture.truncated,
        )
        self._offered += 1
        for name, (send, _) in self._channels.items():
            try:
                send.send_nowait(change)
            except trio.WouldBlock:
                self._dropped[name] += 1
                n = self._dropped[name]
                if n & (n - 1) == 0:  # 1, 2, 4, 8, …: a log line per doubling, not per drop
                    log.warning(
                        "sink too slow; changes dropped",
                        sink=name,
                        dropped=n,
                        hint="raise sinks.queue or speed the sink up",
                    )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled; each sink is closed at the end."""
        async with trio.open_nursery() as nursery:
            for name in self.sinks:
                nursery.start_soon(self._deliver, name)
            task_status.started()

    async def _deliver(self, name: str) -> None:
        sink = self.sinks[name]
        _, receive = self._channels[name]
        try:
            async for change in receive:
                await self._send_one(name, sink, change)
        finally:
            # Shutting down: what is queued still goes out, for at most drain_grace seconds.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.drain_grace):
                while True:
                    try:
                        change = receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
                    await self._send_one(name, sink, change)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.drain_grace):
                try:
                    await sink.aclose()
                except Exception as e:
                    log.error("sink failed to close", sink=name, error=repr(e))

    async def _send_one(self, name: str, sink: Sink, change: Change) -> None:
        try:
            await sink.send(change)
        except Exception as e:  # a sink's bug must not stop the feed
            self._failed[name] += 1
            n = self._failed[name]
            if n & (n - 1) == 0:  # a log line per doubling, not per failure
                log.error(
                    "sink failed a change", sink=name, url=change.url, error=repr(e), failed=n
                )
        else:
            self._delivered[name] += 1

    def statistics(self) -> ChangeFeedStatistics:
        return ChangeFeedStatistics(
            offered=self._offered,
            delivered=dict(self._delivered),
            dropped=dict(self._dropped),
            failed=dict(self._failed),
            queued={n: r.statistics().current_buffer_used for n, (_, r) in self._channels.items()},
        )


def load_sinks(config: Config, names: Sequence[str] | None = None) -> dict[str, Sink]:
    """The sinks named in ``sinks.names``, made by their entry points' factories."""
    wanted = list(config.sinks.names if names is None else names)
    if not wanted:
        return {}
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    sinks: dict[str, Sink] = {}
    for name in wanted:
        ep = found.get(name)
        if ep is None:
            raise ConfigError(
                f"no sink {name!r}; installed: {', '.join(sorted(found)) or 'none'} "
                f"(entry-point group {ENTRY_POINT_GROUP!r})",
                key="sinks.names",
            )
        factory: SinkFactory = ep.load()
        sinks[name] = factory(config)
    return sinks


# -- built-in sinks -------------------------------------------------------------------------


class JsonlSink:
    """Appends each change as one JSON line to ``path``; past ``max_bytes`` the file is renamed
    with a timestamp suffix and a new one begun."""

    def __init__(self, path: Path, *, max_bytes: int = 256 << 20, bodies: bool = False) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.bodies = bodies
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")

    async def send(self, change: Change) -> None:
        line = json.dumps(change.to_json(body=self.bodies)).encode() + b"\n"
        await trio.to_thread.run_sync(self._append, line)

    def _append(self, line: bytes) -> None:
        if self._file.tell() + len(line) > self.max_bytes and self._file.tell() > 0:
            self._file.close()
            stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
            n = 0
            while (old := self.path.with_name(f"{self.path.name}.{stamp}-{n}")).exists():
                n += 1
            os.replace(self.path, old)
            self._file = self.path.open("ab")
        self._file.write(line)
        self._file.flush()

    async def aclose(self) -> None:
        self._file.close()


def jsonl_sink(config: Config) -> JsonlSink:
    s = config.sinks
    return JsonlSink(
        s.jsonl_path or config.store.path.parent / "changes.jsonl",
        max_bytes=s.jsonl_max_bytes,
        bodies=s.bodies,
    )


class WebhookSink:
    """POSTs each change as JSON to ``url``; a failed POST (an error or a non-2xx answer) is
    retried ``attempts`` times in all, waiting ``backoff`` seconds, doubled each time."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        attempts: int = 5,
        backoff: float = 1.0,
        bodies: bool = False,
    ) -> None:
        self.url = url
        self.attempts = attempts
        self.backoff = backoff
        self.bodies = bodies
        self._client = httpx.AsyncClient(timeout=timeout)

    async def send(self, change: Change) -> None:
        payload = change.to_json(body=self.bodies)
        wait = self.backoff
        problem = ""
        for attempt in range(self.attempts):
            if attempt:
                await trio.sleep(wait)
                wait *= 2
            try:
                response = await self._client.post(self.url, json=payload)
            except httpx.HTTPError as e:
                problem = f"{type(e).__name__}: {e}"
                continue
            if 200 <= response.status_code < 300:
                return
            problem = f"HTTP {response.status_code}"
        raise ArchiveError(
            f"webhook {self.url} refused the change of {change.url} {self.attempts} times "
            f"({problem}); check the receiver"
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def webhook_sink(config: Config) -> WebhookSink:
    s = config.sinks
    if not s.webhook_url:
        raise ConfigError("the webhook sink needs a URL to POST to", key="sinks.webhook_url")
    return WebhookSink(
        s.webhook_url,
        timeout=s.webhook_timeout,
        attempts=s.webhook_attempts,
        backoff=s.webhook_backoff,
        bodies=s.bodies,
    )
