"""The store is the only owner of SQL: no module outside ``refresher/store/`` talks to a database.

Every other part asks the store through its named interface (:class:`refresher.store.Store`); a
raw connection or a callable run inside the store must not leak out. This test reads the source
of every module of the package, of ``policies/`` and of ``bench/``, and fails on anything that
issues SQL or reaches into the store's connection.

Exempt, and why:

- ``analysis/``: offline studies of *finished* history files (a stopped store, a snapshot, a
  comparison run's copy). It reads them through the documented SQL views of
  :mod:`refresher.store._views`, which are the store's read API for people (the same SQL a stock
  ``duckdb -readonly snapshot.duckdb`` runs); it never opens a live store and is not imported
  by refresher.
- ``bench/bench_daemon.py``'s ``build_store`` and ``query``: the memory benchmark generates a
  store of a million pages in one SQL statement (through the store's API it would take longer
  than what it measures) and reads figures from finished runs; each is marked with
  ``# sql-ok:`` and a reason, and no other line of ``bench/`` may issue SQL.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
STORE = ROOT / "refresher" / "store"

#: what issuing SQL or reaching into a connection looks like in Python source
SQL = re.compile(
    r"\.(execute|executemany|sql|fetchall|fetchone|fetchnumpy|fetchdf|cursor)\("
    r"|\bduckdb\.connect\b|\bimport duckdb\b|\bpsycopg\b|\bsqlite3\b"
    r"|\.con\b|\._con\b|\._call\("
)
#: a line explaining its exemption
EXEMPT = "# sql-ok:"


def sources() -> list[Path]:
    files = [*(ROOT / "refresher").rglob("*.py"), *(ROOT / "policies").rglob("*.py")]
    files += (ROOT / "bench").rglob("*.py")
    return sorted(p for p in files if STORE not in p.parents)


def offending_lines(path: Path, root: Path = ROOT) -> list[str]:
    hits = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        code = line.split("#", 1)[0] if EXEMPT not in line else ""
        if SQL.search(code):
            hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def test_no_module_outside_the_store_issues_sql_or_touches_a_connection() -> None:
    files = sources()
    assert any(p.name == "_allocate.py" for p in files)  # the scan sees the package
    hits = [hit for path in files for hit in offending_lines(path)]
    assert hits == [], "SQL outside refresher/store/; add a named store method:\n" + "\n".join(hits)


def test_the_scan_catches_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "rows = store.con.execute('SELECT 1').fetchall()\n"
        "x = await service._call(lambda s: s)\n"
        "import duckdb\n"
        "fine = 1  # .execute( in a comment is fine\n"
        "ok = con.execute('x')  # sql-ok: an exempt line says why\n"
    )
    hits = offending_lines(bad, root=tmp_path)
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3"]
