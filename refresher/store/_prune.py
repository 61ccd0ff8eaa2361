"""The archive's retention, its index side: which index rows a pass drops, and the one
transaction that drops or moves them (the file work is :mod:`refresher.archive._retention`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from refresher.store._captures import (
    delete_captures,
    files_of,
    prune_candidates,
    records_in_files,
    rename_file,
)

__all__ = ["FilePlan", "PruneCalls", "PrunePlan", "apply_plan", "build_plan", "plan_prune"]

T = TypeVar("T")


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
    return build_plan(drop, records_in_files(con, files))


def build_plan(drop: Collection[int], records: Sequence[tuple[int, str, int, int]]) -> PrunePlan:
    """The plan for the files ``records`` (id, file, offset, span; by file and offset) are in:
    per file, the ids in ``drop`` go, the other records are kept."""
    plans: dict[str, list[Any]] = {}
    for rid, file, offset, span in records:
        plan = plans.setdefault(file, [[], [], 0])
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


class _Queued(Protocol):
    async def _call(self, fn: Callable[[Any], T]) -> T: ...


class PruneCalls:
    """A retention pass's two calls through a store's queue (both stores'; a mixin of the
    batched services)."""

    async def plan_prune(
        self: _Queued,
        *,
        keep_versions: int | None,
        max_bytes: int | None,
        protect: Callable[[], Collection[str]],
    ) -> PrunePlan:
        """``protect()`` (the WARC files not to touch) is asked in the store thread, after every
        batch queued before it committed and before any later one: no record can be indexed
        between the answer and the plan."""

        def plan(s: Any) -> PrunePlan:
            found: PrunePlan = s.plan_prune(
                keep_versions=keep_versions, max_bytes=max_bytes, protect=set(protect())
            )
            return found

        return await self._call(plan)

    async def apply_prune(
        self: _Queued, plan: PrunePlan, copies: dict[str, tuple[str, list[tuple[int, int]]]]
    ) -> None:
        await self._call(lambda s: s.apply_prune(plan, copies))
