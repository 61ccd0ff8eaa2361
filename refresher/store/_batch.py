"""What both stores compute alike in Python before their SQL: the page state a batch of fetch
records leaves, the rows of newly inserted pages, and a fetch's findings as the document both
keep in ``owed_documents`` until discovery has stored them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from refresher.store._interface import FetchRecord, Findings, NewPage, PageRow

__all__ = [
    "PageBatch",
    "findings_doc",
    "findings_of_doc",
    "fold_pages",
    "new_page_rows",
    "owed_rows",
    "page_sets",
]


@dataclass(slots=True)
class PageBatch:
    """Per page of a batch: its last record (whose state wins) and what the batch adds up."""

    last: list[FetchRecord] = field(default_factory=list)
    fetches: dict[int, int] = field(default_factory=dict)
    changes: dict[int, int] = field(default_factory=dict)
    meaningful: dict[int, int] = field(default_factory=dict)
    #: the finish time of the last fetch that saw a change, for pages that changed
    changed_at: dict[int, float] = field(default_factory=dict)


def fold_pages(records: Sequence[FetchRecord]) -> PageBatch:
    """A page fetched twice within one batch: the later state wins, the counts add up."""
    out = PageBatch()
    last: dict[int, FetchRecord] = {}
    for r in records:
        last[r.page_id] = r
        out.fetches[r.page_id] = out.fetches.get(r.page_id, 0) + 1
        out.meaningful[r.page_id] = out.meaningful.get(r.page_id, 0) + bool(r.meaningful)
        out.changes[r.page_id] = out.changes.get(r.page_id, 0) + bool(r.changed)
        if r.changed:
            out.changed_at[r.page_id] = r.finished_at
    out.last = list(last.values())
    return out


def page_sets(b: str) -> str:
    """The SET list of an UPDATE of ``pages`` from a batch aliased ``b`` with the columns of
    the page state a batch leaves (its last record's, the counts added; both stores)."""
    return f"""last_fetch = {b}.last_fetch,
        last_change = coalesce({b}.changed_at, pages.last_change),
        etag = {b}.etag, last_modified = {b}.last_modified, digest = {b}.digest,
        fetches = pages.fetches + {b}.n, changes = pages.changes + {b}.x,
        status = {b}.status, due_at = {b}.due_at,
        meaningful_changes = pages.meaningful_changes + {b}.m,
        fingerprint = coalesce({b}.fingerprint, pages.fingerprint),
        duplicate_of = {b}.duplicate_of"""


def new_page_rows(
    inserted: Iterable[tuple[int, str, int]], pages: Sequence[NewPage], *, now: float
) -> list[PageRow]:
    """The rows of pages just inserted ((id, url, host id) each), due ``now``, never fetched."""
    by_url = {p.url: p for p in pages}
    return [
        PageRow(
            id=int(i),
            url=u,
            host_id=int(h),
            host=by_url[u].host,
            due_at=now,
            etag=None,
            last_modified=None,
            digest=None,
            target_rate=None,
            depth=by_url[u].depth,
            source=by_url[u].source,
        )
        for i, u, h in inserted
    ]


def findings_doc(f: Findings) -> dict[str, Any]:
    """``f`` as the JSON document an ``owed_documents`` row keeps (:func:`findings_of_doc`)."""
    return {
        "depth": f.depth,
        "url": f.url,
        "links": [list(link) for link in f.links],
        "canonical": f.canonical,
        "noindex": f.noindex,
        "lastmod": [list(m) for m in f.lastmod],
        "coarse_lastmod": [list(m) for m in f.coarse_lastmod],
        "synthetic": f.synthetic,
    }


def owed_rows(records: Sequence[FetchRecord], run: str) -> list[tuple[FetchRecord, str, str]]:
    """The ``owed_documents`` rows of a batch: each record that carries findings, the run its
    row is written under (``run``, whose discovery has them in its queue; "" when it was
    deferred: any run takes it at once) and its document as JSON text."""
    return [
        (r, "" if r.deferred else run, json.dumps(findings_doc(r.findings)))
        for r in records
        if r.findings is not None
    ]


def findings_of_doc(doc: dict[str, Any]) -> Findings:
    """The :class:`Findings` an ``owed_documents`` row's document (:func:`findings_doc`) keeps."""
    return Findings(
        depth=int(doc["depth"]),
        url=str(doc["url"]),
        links=tuple((str(u), str(k)) for u, k in doc["links"]),
        canonical=doc["canonical"],
        noindex=bool(doc["noindex"]),
        lastmod=tuple((str(u), float(t)) for u, t in doc["lastmod"]),
        # absent from a row written before coarse lastmods were kept apart
        coarse_lastmod=tuple((str(u), float(t)) for u, t in doc.get("coarse_lastmod", ())),
        synthetic=bool(doc["synthetic"]),
    )
