"""What keeping a fetched document's findings costs the embedded store, in isolation.

Run from the repository root: ``.venv/bin/python bench/bench_owed.py [--links 10,100]``. On a
fresh DuckDB file of ``--pages`` pages, ``DuckDBStore.write`` commits fetch records in batches
of ``--batch`` (as the store writer does) and ``save_documents`` saves their documents in
batches of 128 (as discovery does), first without findings, then with findings of ``--links``
links each (written to ``owed_documents`` with the fetch, deleted with the document); CPU
seconds of the process (all threads) per record and per document, for ``--rounds`` rounds.
Then the churn: ``--churn`` rounds of ``--pages`` owed rows written and deleted, the file's
size after each (the store closed and reopened: a checkpoint). Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import fetch_record  # noqa: E402

import refresher.store as rs  # noqa: E402
from refresher.ops._logging import configure_logging  # noqa: E402

#: documents saved per ``save_documents`` call (discovery's batch)
DOCUMENTS = 128


def record(page: rs.PageRow, at: float, findings: rs.Findings | None) -> rs.FetchRecord:
    """A successful first fetch of ``page`` finishing at ``at`` (the tests' record)."""
    return dataclasses.replace(fetch_record(page.id, page.host_id, at), findings=findings)


def findings(pages: list[rs.PageRow], i: int, links: int) -> rs.Findings:
    """``links`` links of page ``i`` to the pages after it."""
    n = len(pages)
    return rs.Findings(
        depth=0,
        url=pages[i].url,
        links=tuple((pages[(i + k + 1) % n].url, "a") for k in range(links)),
    )


def cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def one_round(
    store: rs.DuckDBStore,
    pages: list[rs.PageRow],
    t0: float,
    links: int,
    args: argparse.Namespace,
    *,
    owed: bool,
    edges: bool = True,
) -> tuple[float, float]:
    """CPU ms per record written and per document saved, documents of ``links`` links;
    ``owed``: the records carry them as findings (kept in owed_documents until their document
    is saved); ``edges``: the documents' link edges are stored."""
    at = [t0 + i * 1e-3 for i in range(len(pages))]
    found = [findings(pages, i, links) for i in range(len(pages))]
    write = save = 0.0
    for s in range(0, len(pages), args.batch):
        batch = [
            record(pages[i], at[i], found[i] if owed else None)
            for i in range(s, min(s + args.batch, len(pages)))
        ]
        write += cpu(lambda b=batch: store.write(b, []))
    for s in range(0, len(pages), DOCUMENTS):
        docs = [
            rs.DocumentUpdate(
                page_id=pages[i].id,
                new=[],
                linked=[u for u, _ in found[i].links] if edges else [],
                canonical=None,
                noindex=False,
                lastmod=[],
                fetched_at=at[i] if owed else None,
            )
            for i in range(s, min(s + DOCUMENTS, len(pages)))
        ]
        save += cpu(lambda d=docs: store.save_documents(d, now=t0))
    n = len(pages)
    return write / n * 1e3, save / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000, help="records per write")
    parser.add_argument("--links", default="10,100", help="links per document, e.g. 10,100")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--churn", type=int, default=8, help="rounds of owed rows written/deleted")
    args = parser.parse_args()
    configure_logging(format="console", level="warning")
    with tempfile.TemporaryDirectory(prefix="owed-") as tmp:
        path = Path(tmp) / "s.duckdb"
        store = rs.DuckDBStore(path)
        pages = store.add_pages(
            [
                rs.NewPage(
                    url=f"http://h{i % 500}.example/p{i}", host=f"h{i % 500}.example", scheme="http"
                )
                for i in range(args.pages)
            ],
            now=1e9,
        )
        t0 = 1e9
        print("CPU ms per record written and per document saved, without → with findings owed")
        for links in (int(x) for x in args.links.split(",")):
            for r in range(args.rounds):
                w0, s0 = one_round(store, pages, t0, links, args, owed=False)
                w1, s1 = one_round(store, pages, t0 + 5e4, links, args, owed=True)
                t0 += 1e5
                print(
                    f"{links} links, round {r + 1}: write {w0:.4f} → {w1:.4f} (+{w1 - w0:.4f}),"
                    f" save {s0:.4f} → {s1:.4f} (+{s1 - s0:.4f})"
                )
        left = len(store.owed_documents(args.pages, grace=0.0, now=t0 + 1e9))
        print(f"owed rows left: {left}")
        for r in range(args.churn):
            one_round(store, pages, t0, 10, args, owed=True, edges=False)
            t0 += 1e5
            store.close()
            store = rs.DuckDBStore(path)
            size = path.stat().st_size / 1e6
            left = len(store.owed_documents(args.pages, grace=0.0, now=t0 + 1e9))
            print(
                f"churn {r + 1}: {(r + 1) * args.pages} owed rows written and deleted "
                f"(with their fetches), file {size:.1f} MB, owed rows left {left}"
            )
        store.close()


if __name__ == "__main__":
    main()
