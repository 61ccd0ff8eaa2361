"""The change feed: bounded queues, isolated failures, the jsonl and webhook sinks."""

from __future__ import annotations

import json
import math

import h11
import pytest
import trio

from refresher._config import load_config
from refresher._errors import ConfigError
from refresher.archive._sinks import Change, ChangeFeed, JsonlSink, WebhookSink, load_sinks
from refresher.archive._warc import Capture
from tests.conftest import wait_for


def change_capture(i: int) -> Capture:
    return Capture(
        page_id=i,
        url=f"http://a.example/{i}",
        target_uri=f"http://a.example/{i}",
        fetched_at=1_700_000_000.0 + i,
        kind="response",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(("Content-Type", "text/html"),),
        request_headers=(),
        payload=b"<p>%d</p>" % i,
        truncated=False,
        digest=bytes([i % 256]) * 16,
    )


class Sleeps:
    def __init__(self) -> None:
        self.got: list[Change] = []

    async def send(self, change: Change) -> None:
        self.got.append(change)
        await trio.sleep(math.inf)

    async def aclose(self) -> None:
        pass


class Raises:
    def __init__(self) -> None:
        self.calls = 0

    async def send(self, change: Change) -> None:
        self.calls += 1
        raise RuntimeError("boom")

    async def aclose(self) -> None:
        pass


class Keeps:
    def __init__(self) -> None:
        self.got: list[Change] = []

    async def send(self, change: Change) -> None:
        self.got.append(change)

    async def aclose(self) -> None:
        pass


async def test_a_sleeping_sink_and_a_raising_one_never_hold_up_the_offers_or_the_others(
    nursery,
):
    keeps, sleeps, raises = Keeps(), Sleeps(), Raises()
    feed = ChangeFeed({"keeps": keeps, "sleeps": sleeps, "raises": raises}, queue=10)
    await nursery.start(feed.run)
    for i in range(100):
        # submit is synchronous: it cannot wait for a sink, whatever the sink does
        feed.submit(change_capture(i), previous=None, meaningful=True)
        await trio.sleep(0)  # let the sinks' tasks run as the crawl would
    # each sink runs in its own task: wait for the two that take every change
    await wait_for(
        lambda: len(keeps.got) == 100 and feed.statistics().failed.get("raises") == 100,
        what="every change offered",
    )
    stats = feed.statistics()
    assert stats.offered == 100
    assert stats.delivered["keeps"] == 100 and stats.dropped["keeps"] == 0
    # the sleeping sink holds one, queues ten, drops the rest, counted
    assert stats.dropped["sleeps"] == 100 - 1 - 10
    assert stats.failed["raises"] == raises.calls == 100
    assert [c.url for c in keeps.got] == [f"http://a.example/{i}" for i in range(100)]


async def test_the_jsonl_sink_writes_one_line_per_change_and_rotates(tmp_path):
    path = tmp_path / "changes.jsonl"
    sink = JsonlSink(path, max_bytes=600, bodies=True)
    feed = ChangeFeed({"jsonl": sink})
    async with trio.open_nursery() as n:
        await n.start(feed.run)
        for i in range(5):
            feed.submit(change_capture(i), previous=b"\x01" * 16, meaningful=False)
        await wait_for(lambda: feed.statistics().delivered["jsonl"] == 5, what="5 delivered")
        n.cancel_scope.cancel()
    files = sorted(tmp_path.glob("changes.jsonl*"))
    assert len(files) > 1  # rotated
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert sorted(x["url"] for x in lines) == [f"http://a.example/{i}" for i in range(5)]
    assert all(x["previous_digest"] == "01" * 16 and "body_base64" in x for x in lines)


async def serve_webhook(
    received: list[dict], fail_first: int, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """A loopback HTTP receiver answering 503 to the first ``fail_first`` POSTs."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    count = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal count
        conn = h11.Connection(h11.SERVER)
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Data):
                body += event.data
            if isinstance(event, h11.EndOfMessage):
                break
        count += 1
        status = 503 if count <= fail_first else 200
        if status == 200:
            received.append(json.loads(body))
        await stream.send_all(
            conn.send(h11.Response(status_code=status, headers=[("Content-Length", "0")]))
        )
        await stream.send_all(conn.send(h11.EndOfMessage()))
        await stream.aclose()

    await trio.serve_listeners(handle, listeners)


async def test_the_webhook_retries_with_backoff_until_the_receiver_takes_the_change(nursery):
    received: list[dict] = []
    port = await nursery.start(serve_webhook, received, 2)
    sink = WebhookSink(f"http://127.0.0.1:{port}/hook", attempts=3, backoff=0.01)
    await sink.send(
        Change(
            url="http://a.example/",
            fetched_at=1.0,
            status=200,
            headers=(),
            body=b"x",
            digest=b"\x02" * 16,
            previous_digest=None,
            meaningful=None,
            truncated=False,
        )
    )
    assert [r["url"] for r in received] == ["http://a.example/"]
    await sink.aclose()


def test_an_unknown_sink_name_is_refused_with_the_installed_ones(tmp_path):
    # refused when the config loads, before the daemon creates anything
    with pytest.raises(ConfigError, match=r"installed: .*jsonl.*webhook"):
        load_config(None, overrides={"sinks": {"names": ["nope"]}}, default_file=tmp_path / "x")
    config = load_config(None, default_file=tmp_path / "x")
    with pytest.raises(ConfigError, match=r"installed: .*jsonl.*webhook"):
        load_sinks(config, ["nope"])


async def test_sinks_load_by_entry_point(tmp_path):
    config = load_config(
        None,
        overrides={"sinks": {"names": ["jsonl"], "jsonl_path": str(tmp_path / "c.jsonl")}},
        default_file=tmp_path / "x",
    )
    sinks = load_sinks(config)
    assert isinstance(sinks["jsonl"], JsonlSink)
    await sinks["jsonl"].aclose()
