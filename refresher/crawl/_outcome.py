"""One refresh outcome, computed once: what a fetch means for the page, without any I/O.

:func:`classify` reads a page's stored state and a :class:`FetchResult` and says everything the
crawler then acts on: whether the fetch was a refresh and a change, whether it counts against
the host, the page's status in the store's vocabulary, the validators to send next time and
whether the body must be processed. The worker only carries the outcome out (parse, record,
release, discover), so the definitions live here and are tested without a network.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from typing import Literal

from refresher.crawl._fetch import FetchResult, comparable_digest
from refresher.discover._parse import meaningful_change
from refresher.store._interface import PageRow, is_change

__all__ = ["GONE_RECHECK", "Outcome", "PageStatus", "classify", "http_date", "meaningful"]

#: seconds after a 404/410 before a gone page is requested again (a day)
GONE_RECHECK = 86_400.0

#: a page's status after a fetch, the store's ``pages.status`` vocabulary (besides "new"):
#: "ok" a 2xx body; "not_modified" a 304; "error" no response or any other status; "denied"
#: robots.txt forbids it; "gone" it answered 404 or 410 (a page removed, a guessed
#: /sitemap.xml that is not there): out of the plan, looked at again only on a slow schedule
#: of its own (:data:`GONE_RECHECK`), in case it comes back
PageStatus = Literal["ok", "not_modified", "error", "denied", "gone"]


def http_date(value: str | None) -> float | None:
    """An HTTP date as unix seconds; None when absent or unreadable."""
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one fetch of one page means."""

    status: PageStatus
    #: a refresh: a 2xx body or a 304, the local copy now equals the page
    success: bool
    #: a 2xx body whose digest differs from the last one (a first fetch is no change)
    changed: bool
    #: counts against the host: a transport error, a 5xx or a 429 (backoff grows)
    failed: bool
    #: the validators and digest the page keeps for its next conditional GET
    etag: str | None
    last_modified: str | None
    digest: bytes | None
    #: the page's digest before the fetch, in the kind the fetch's is (comparable_digest)
    previous_digest: bytes | None
    #: the Last-Modified the page now has, unix seconds (only after a refresh)
    last_modified_at: float | None
    #: a 2xx body not seen on this page before: run the processors over it
    process: bool
    #: the page stays in the plan, due at its planned interval (False for "gone": due again
    #: only after GONE_RECHECK)
    due: bool


def classify(page: PageRow, r: FetchResult) -> Outcome:
    """The outcome of fetching ``page`` with result ``r``; pure."""
    success = r.ok  # the one definition: refresher.store.is_success
    previous = comparable_digest(page.digest, r)
    not_modified = success and r.not_modified
    ok = success and not not_modified  # a complete 2xx body
    status: PageStatus
    if ok:
        etag, last_modified, digest = r.etag, r.last_modified, r.digest
        status = "ok"
    elif not_modified:
        # A 304 may repeat the validators or leave them out: keep what we had.
        etag = r.etag or page.etag
        last_modified = r.last_modified or page.last_modified
        digest = page.digest
        status = "not_modified"
    else:
        etag, last_modified, digest = page.etag, page.last_modified, page.digest
        status = "error"
    if r.error_kind is None and r.status in (404, 410):
        status = "gone"  # out of the plan; re-checked after GONE_RECHECK
    return Outcome(
        status=status,
        success=success,
        changed=is_change(
            r.status,
            not_modified=r.not_modified,
            error_kind=r.error_kind,
            digest=r.digest,
            previous=previous,
        ),
        failed=r.error_kind is not None
        or (r.status is not None and (r.status >= 500 or r.status == 429)),
        etag=etag,
        last_modified=last_modified,
        digest=digest,
        previous_digest=previous,
        last_modified_at=http_date(last_modified) if ok or not_modified else None,
        process=ok and r.body is not None and r.digest != previous,
        due=status != "gone",
    )


def meaningful(outcome: Outcome, old: int | None, new: int | None) -> bool | None:
    """Whether a change moved the visible text beyond the near-duplicate threshold, given the
    old and new simhash fingerprints; None when the fetch was no refresh (nothing to say)."""
    if not outcome.success:
        return None
    if not outcome.changed:
        return False
    if old is None and new is None:
        return True  # no text to compare: every change counts
    return meaningful_change(old, new)
