"""Parsing real pages: refresher's HTML processor (its Lexbor tree, the default; its lxml tree;
and the streaming target) against bare lxml, bare selectolax (Lexbor) and resiliparse, one
thread; then the processor's pages/s with either tree in 1, 2, 8 and 20 threads and in a
2-process pool. Prints; asserts nothing.

    .venv/bin/python bench/bench_parsers.py [DIR ...]
    .venv/bin/python bench/bench_parsers.py --record FILE [DIR ...]
    .venv/bin/python bench/bench_parsers.py --compare FILE [--max-text 0] [DIR ...]
    .venv/bin/python bench/bench_parsers.py --hosts 20 [DIR ...]

DIR defaults to /usr/share/doc/python3.11/html (Debian ``python3.11-doc``); any tree of
.html files will do. The tables are for the first DIR's first 150 pages; with several, the
processor's CPU ms per page on each follows. resiliparse is measured when installed
(``.venv/bin/pip install resiliparse``; it is not a dependency).

``--record`` writes what the processor finds on every page of the DIRs (links, canonical,
robots flags, fingerprint, skip counts; with the Lexbor tree, the lxml tree and
``include_media``) to FILE; ``--compare`` finds it again and names the pages where anything
differs from FILE: a change meant to be faster must leave it as it was. ``--max-text 0``
records or compares with the simhash reading all of a page's text (the code before
``discovery.max_text_chars`` read it all).

``--hosts N`` gives only the processor's CPU ms per page (one thread) over the pages of each
DIR as a crawl of N copies of the site sees them: each page under N host names, in a
shuffled order, so the caches of link verdicts and token hashes meet what the daemon's meet
on the docs web (N sites' pages mixed) rather than one site's pages in a row.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from lxml import etree
from selectolax.lexbor import LexborHTMLParser

from refresher.discover import _charset, _html
from refresher.discover._parse import Document, HtmlLinks

PROCESSORS = {parser: HtmlLinks(parser=parser) for parser in _html.PARSERS}

DEFAULT_DIR = Path("/usr/share/doc/python3.11/html")


def load(root: Path, limit: int | None = 150) -> list[Document]:
    docs = []
    for path in sorted(root.rglob("*.html"))[:limit]:
        url = f"http://docs.example/{path.relative_to(root)}"
        docs.append(Document(url=url, content_type="text/html", body=path.read_bytes()))
    return docs


def per_page(fn: Callable[[Document], object], docs: list[Document], repeat: int = 2) -> float:
    """Best mean CPU milliseconds per page over ``repeat`` passes (CPU time: the machine
    may be shared, and wall time would count the others' work)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for doc in docs:
            fn(doc)
        best = min(best, (time.thread_time() - start) / len(docs))
    return best * 1e3


def streaming(doc: Document) -> object:
    skipped: Counter[str] = Counter()
    charset = _charset.choose_charset(doc.body, doc.content_type, skipped)
    target = _html._HtmlTarget(_html._Links(_html.HtmlLinks(), doc.url, skipped), skipped)
    _html._stream(doc.body, charset, target)
    return target.text.value()


_HREFS = etree.XPath("//a/@href")


def bare_lxml(doc: Document) -> object:
    root = etree.fromstring(doc.body, etree.HTMLParser(encoding="utf-8"))
    return _HREFS(root), " ".join(root.itertext())


def bare_selectolax(doc: Document) -> object:
    tree = LexborHTMLParser(doc.body)
    hrefs = [node.attributes.get("href") for node in tree.css("a[href]")]
    return hrefs, tree.text(separator=" ")


def candidates() -> dict[str, Callable[[Document], object]]:
    found: dict[str, Callable[[Document], object]] = {
        "refresher HtmlLinks (lexbor tree, default)": PROCESSORS["lexbor"].process,
        "refresher HtmlLinks (lxml tree)": PROCESSORS["lxml"].process,
        "refresher streaming target (old)": streaming,
        "bare lxml: fromstring + //a/@href + itertext": bare_lxml,
        "bare selectolax (lexbor): css a[href] + text": bare_selectolax,
    }
    try:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree

        def resiliparse(doc: Document) -> object:
            tree = HTMLTree.parse_from_bytes(doc.body, "utf-8")
            # Counted, not read: iterating an element collection is quadratic in resiliparse
            # 2.0 (library/os.html's 2,454 <a> take over a minute; so does query_selector_all).
            anchors = len(tree.body.get_elements_by_tag_name("a"))
            return anchors, extract_plain_text(tree)

        found["resiliparse: parse + text (links not read)"] = resiliparse
    except ImportError:
        print("resiliparse not installed: skipped")
    return found


def _chunk(docs: list[Document]) -> int:
    for doc in docs:
        PROCESSORS["lexbor"].process(doc)
    return len(docs)


def throughput(docs: list[Document], threads: int, parser: str, passes: int = 2) -> str:
    """Pages per second of ``parser``'s HtmlLinks over ``passes`` of ``docs`` in ``threads``
    threads, and the process's CPU seconds per wall second (above 1: parsing ran in parallel)."""
    work = docs * passes
    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(PROCESSORS[parser].process, work))
    wall = time.perf_counter() - start
    return f"{len(work) / wall:7.0f} ({(time.process_time() - cpu) / wall:.2f} cores)"


def pool_throughput(docs: list[Document], processes: int, passes: int = 2) -> float:
    work = docs * passes
    batches = [work[i : i + 16] for i in range(0, len(work), 16)]
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_chunk, batches[:processes]))  # start the workers before timing
        start = time.perf_counter()
        done = sum(pool.map(_chunk, batches))
    return done / (time.perf_counter() - start)


#: the processors whose results --record and --compare keep
RECORDED = {
    "lexbor": HtmlLinks(),
    "lxml": HtmlLinks(parser="lxml"),
    "lexbor+media": HtmlLinks(include_media=True),
}


def results(roots: list[Path], max_text: int | None) -> dict[tuple[str, str], object]:
    """What each of :data:`RECORDED` finds on every page under ``roots``, by (processor,
    page URL); with ``max_text``, their simhash reads that many characters (0: all)."""
    recorded = RECORDED
    if max_text is not None:
        recorded = {
            name: HtmlLinks(include_media=p.include_media, parser=p.parser, max_text=max_text)
            for name, p in RECORDED.items()
        }
    found: dict[tuple[str, str], object] = {}
    for root in roots:
        for doc in load(root, limit=None):
            for name, processor in recorded.items():
                ex = processor.process(doc)
                links = tuple((link.url, link.kind, link.nofollow) for link in ex.links)
                flags = (ex.canonical, ex.noindex, ex.nofollow)
                found[name, f"{root}/{doc.url}"] = (links, flags, ex.fingerprint, dict(ex.skipped))
    return found


def record_or_compare(args: argparse.Namespace, roots: list[Path]) -> None:
    found = results(roots, args.max_text)
    if args.record:
        args.record.write_bytes(pickle.dumps(found))
        print(f"{len(found)} results ({len(found) // len(RECORDED)} pages) in {args.record}")
        return
    before = pickle.loads(args.compare.read_bytes())
    keys = before.keys() | found.keys()
    differ = sorted(key for key in keys if before.get(key) != found.get(key))
    for processor, page in differ[:20]:
        print(f"  differs: {processor} {page}")
    print(f"{len(found)} results ({len(found) // len(RECORDED)} pages): {len(differ)} differ")
    if differ:
        sys.exit(1)


def as_hosts(docs: list[Document], hosts: int, limit: int = 4000) -> list[Document]:
    """``limit`` of ``docs`` under ``hosts`` host names (each with its host in its body, as
    the docs web serves them), in a shuffled order."""
    pairs = [(doc, host) for doc in docs for host in range(hosts)]
    random.Random(1).shuffle(pairs)
    return [
        Document(
            url=doc.url.replace("docs.example", f"h{host}.docs.test"),
            content_type=doc.content_type,
            body=doc.body.replace(b"</body>", b"<p>h%d.docs.test</p></body>" % host, 1),
        )
        for doc, host in pairs[:limit]
    ]


def per_page_on_hosts(roots: list[Path], hosts: int) -> None:
    print(f"HtmlLinks (lexbor tree), one thread, each site under {hosts} host names, shuffled:")
    for root in roots:
        docs = as_hosts(load(root, limit=None), hosts)
        for doc in docs[:500]:  # the caches as a running crawl has them
            PROCESSORS["lexbor"].process(doc)
        ms = per_page(PROCESSORS["lexbor"].process, docs[500:], repeat=1)
        print(f"  {ms:6.2f} CPU ms/page  {len(docs) - 500:5} pages  {root}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=[DEFAULT_DIR], metavar="DIR")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--record", type=Path, metavar="FILE", help="write every page's results")
    group.add_argument("--compare", type=Path, metavar="FILE", help="compare with --record's")
    group.add_argument("--hosts", type=int, metavar="N", help="each site under N host names")
    parser.add_argument("--max-text", type=int, metavar="CHARS", help="the simhash's text bound")
    args = parser.parse_args()
    if args.record or args.compare:
        record_or_compare(args, args.dirs)
        return
    if args.hosts:
        per_page_on_hosts(args.dirs, args.hosts)
        return
    root = args.dirs[0]
    docs = load(root)
    if not docs:
        sys.exit(f"no .html files under {root}: install python3.11-doc or name a directory")
    size = sum(len(d.body) for d in docs) / len(docs)
    links = sum(len(PROCESSORS["lexbor"].process(d).links) for d in docs) / len(docs)
    print(f"{len(docs)} pages from {root}, {size / 1e3:.0f} kB and {links:.0f} links each")
    print(f"{os.cpu_count()} cores; one thread:")
    for name, fn in candidates().items():
        print(f"  {name:<46} {per_page(fn, docs):6.2f} CPU ms/page")
    print("HtmlLinks pages/s:          lexbor               lxml")
    for threads in (1, 2, 8, 20):
        row = "  ".join(throughput(docs, threads, parser) for parser in _html.PARSERS)
        print(f"  {threads:>2} threads          {row}")
    print(f"   2-process pool (lexbor)  {pool_throughput(docs, 2):7.0f}")
    print(f"(threads alive: {threading.active_count()})")
    if len(args.dirs) > 1:
        print("HtmlLinks (lexbor tree), one thread, every page, best of 3 passes:")
        for other in args.dirs:
            every = load(other, limit=None)
            size = sum(len(d.body) for d in every) / max(len(every), 1)
            ms = per_page(PROCESSORS["lexbor"].process, every, repeat=3)
            print(f"  {ms:6.2f} CPU ms/page  {len(every):5} pages of {size / 1e3:4.0f} kB  {other}")


if __name__ == "__main__":
    main()
