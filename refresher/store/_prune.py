"""The archive's retention, its index side: which index rows a pass drops, and the one
transaction that drops or moves them (the file work is :mod:`refresher.archive._retention`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from refresher.store._captures import (
    delete_captures,
    files_of,
    prune_candidates,
    records_in_files,
    rename_file,
)

__all__ = ["FilePlan", "PrunePlan", "apply_plan", "plan_prune"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FilePlan:
    file: str
    drop: tuple[int, ...]  # index row ids
    keep: tuple[tuple[int, int], ...]  # (offset, span) of the records kept, by offset
    dropped_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunePlan:
    files: tuple[FilePlan, ...]

    @property
    def records(self) -> int:
        return sum(len(f.drop) for f in self.files)


def plan_prune(
    con: Any, *, keep_versions: int | None, max_bytes: int | None, protect: Collection[str] = ()
) -> PrunePlan:
    """What a pass would remove (reads the index only)."""
    if keep_versions is None and max_bytes is None:
        return PrunePlan(files=())
    drop = set(prune_candidates(con, keep_versions=keep_versions, max_bytes=max_bytes))
    files = [f for f in files_of(con, sorted(drop)) if f not in protect]
    plans: dict[str, list[Any]] = {f: [[], [], 0] for f in files}
    for rid, file, offset, span in records_in_files(con, files):
        plan = plans[file]
        if rid in drop:
            plan[0].append(rid)
            plan[2] += span
        else:
            plan[1].append((offset, span))
    return PrunePlan(
        files=tuple(
            FilePlan(file=f, drop=tuple(p[0]), keep=tuple(p[1]), dropped_bytes=p[2])
            for f, p in plans.items()
        )
    )


def apply_plan(
    con: Any, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
) -> None:
    """The index change of a pass, in one transaction."""
    con.execute("BEGIN")
    try:
        for f in plan.files:
            delete_captures(con, f.drop)
            if f.file in copies:
                new, moves = copies[f.file]
                rename_file(con, f.file, new, moves)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
