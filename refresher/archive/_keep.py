"""What the crawler hands over after each fetch: the one point where the copy is kept.

:func:`capture_of` decides (pure): a 2xx whose body is new for the page (the first fetch, a
change, or a body cut at the cap) is a ``response``; a 304 or an unchanged 2xx is a ``revisit``
(when revisits are on); anything else is not archived. :class:`Keeper` offers each change to
the sinks and hands the capture back to the crawler, which queues it with the fetch's record:
the store writer has the archive write a whole batch's captures in one go, off the event loop,
just before the transaction that indexes them (a thread hop per fetch cost more than the
record).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from refresher.crawl._fetch import ACCEPT, ACCEPT_ENCODING, FetchResult
from refresher.store._captures import Capture

__all__ = ["ChangeListener", "Keeper", "capture_of"]


class ChangeListener(Protocol):
    def submit(self, capture: Capture, *, previous: bytes | None, meaningful: bool | None) -> None:
        """Take one change without blocking (drop it, counted, when full)."""
        ...


def capture_of(
    *,
    page_id: int,
    url: str,
    result: FetchResult,
    previous_digest: bytes | None,
    etag: str | None,
    last_modified: str | None,
    user_agent: str,
    revisits: bool,
) -> Capture | None:
    """The capture to archive for ``result`` (a fetch of page ``url``), or None.

    ``previous_digest``, ``etag`` and ``last_modified`` are the page's before the fetch (the
    validators sent with it).
    """
    r = result
    if r.status is None:
        return None
    success = 200 <= r.status < 300
    kind: Literal["response", "revisit"]
    if success and r.payload is not None and (r.truncated or r.digest != previous_digest):
        kind = "response"
    elif revisits and ((success and r.digest is not None) or r.not_modified):
        kind = "revisit"
    else:
        return None
    request = [
        ("Host", r.final_url.split("://", 1)[-1].split("/", 1)[0]),
        ("User-Agent", user_agent),
        ("Accept", ACCEPT),
        ("Accept-Encoding", ACCEPT_ENCODING),
    ]
    if etag is not None:
        request.append(("If-None-Match", etag))
    if last_modified is not None:
        request.append(("If-Modified-Since", last_modified))
    return Capture(
        page_id=page_id,
        url=url,
        target_uri=r.final_url,
        fetched_at=r.finished_at,
        kind=kind,
        status=r.status,
        reason=r.reason,
        http_version=r.http_version,
        headers=r.headers,
        request_headers=tuple(request),
        payload=r.payload if kind == "response" or not r.not_modified else None,
        truncated=r.truncated and kind == "response",
        digest=r.digest if kind == "response" or not r.not_modified else previous_digest,
    )


class Keeper:
    """Keeps the copy of each fetch: the WARC record and the change feed."""

    def __init__(
        self,
        *,
        archiving: bool,
        listener: ChangeListener | None = None,
        user_agent: Callable[[], str],
        revisits: bool = True,
    ) -> None:
        self.archiving = archiving  # the archive is on: captures go to the store with records
        self.listener = listener
        self._user_agent = user_agent
        self.revisits = revisits

    def keep(
        self,
        *,
        page_id: int,
        url: str,
        result: FetchResult,
        previous_digest: bytes | None,
        etag: str | None,
        last_modified: str | None,
        meaningful: bool | None,
    ) -> Capture | None:
        """Offer a change in ``result`` to the sinks; the capture to archive, if any (queue
        it with the fetch's record: :meth:`refresher.store.Store.record`)."""
        capture = capture_of(
            page_id=page_id,
            url=url,
            result=result,
            previous_digest=previous_digest,
            etag=etag,
            last_modified=last_modified,
            user_agent=self._user_agent(),
            revisits=self.revisits and self.archiving,
        )
        if capture is None:
            return None
        if capture.kind == "response" and self.listener is not None:
            self.listener.submit(capture, previous=previous_digest, meaningful=meaningful)
        return capture if self.archiving else None
