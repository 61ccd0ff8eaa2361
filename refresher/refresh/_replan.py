"""When the allocator plans again: once enough has been learned since the last plan, within
bounds.

A plan rests on the estimates of the fetches recorded before it. At a cold start each round of
fetches over the pages changes those estimates most (a page fetched once has no estimate, one
fetched twice its first interval), and a plan that waits a fixed 60 s for the next re-plan
spends the first minute on the prior's plan. So a plan is due when the fetches recorded since
the last one reach ``share`` of the pages tracked (half a round of new observations, by
default), and at the latest ``interval`` seconds after it (``policy.resolve_interval``: the
clock, which is all that a large node's half-round ever reaches); never sooner than ``floor``
seconds, nor than :data:`COST_FACTOR` times the last solve's own cost (the CPU seconds of its
estimate and plan), so re-planning costs at most 1/:data:`COST_FACTOR` of a core for them.

One rule, :func:`replan_reason`, a pure function of what the allocator knows; the daemon's
allocator (:class:`refresher.refresh._allocate.Allocator`) and the offline model
(:mod:`analysis.model`) both ask it, every :data:`POLL` seconds once the lower bound has passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from refresher._config import PolicyConfig

__all__ = [
    "COST_FACTOR",
    "POLL",
    "Reason",
    "ReplanRule",
    "earliest",
    "next_look",
    "replan_fetches",
    "replan_reason",
]

#: a re-plan waits at least this many times the last solve's duration (≤ 5 % of a core)
COST_FACTOR = 20.0
#: seconds between two looks at the count of recorded fetches, once the lower bound is past
POLL = 1.0

#: why a plan was made: the daemon's start, a setting changed (or a fleet's new solution),
#: the clock (``interval``), or the fetches recorded since the last plan (``share``)
Reason = Literal["start", "settings", "clock", "learned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanRule:
    """The re-plan rule's settings (``[policy]``)."""

    #: seconds, the longest between two plans (``policy.resolve_interval``)
    interval: float = 60.0
    #: fetches recorded since the last plan, as a share of the pages tracked, that call for a
    #: new plan before ``interval`` (``policy.replan_share``); 0: the clock alone
    share: float = 0.5
    #: seconds, the shortest between two plans that ``share`` calls for (``policy.replan_floor``)
    floor: float = 5.0

    @classmethod
    def from_config(cls, policy: PolicyConfig) -> ReplanRule:
        return cls(
            interval=policy.resolve_interval, share=policy.replan_share, floor=policy.replan_floor
        )


def earliest(rule: ReplanRule, solve_seconds: float) -> float:
    """Seconds after a plan before which no new one is made (a setting's change aside): the
    floor, or :data:`COST_FACTOR` × the last solve's cost (CPU seconds) when that is longer;
    never past ``interval``."""
    return min(rule.interval, max(rule.floor, COST_FACTOR * solve_seconds))


def replan_fetches(rule: ReplanRule, pages: int) -> float:
    """Fetches recorded since the last plan that call for a new one over ``pages`` pages: ``share``
    of them, at least one; ∞ when ``share`` is 0 (the clock alone)."""
    return max(rule.share * pages, 1.0) if rule.share > 0 else math.inf


def replan_reason(
    since: float, fetched: int, pages: int, solve_seconds: float, rule: ReplanRule
) -> Reason | None:
    """Why a plan is due ``since`` seconds after the last one, ``fetched`` fetches having been
    recorded since, over ``pages`` pages tracked, the last solve having taken
    ``solve_seconds``: "clock" once ``interval`` has passed, "learned" once the fetches reach
    ``share`` of the pages (at least one fetch) and :func:`earliest` has passed; None: not yet."""
    if since >= rule.interval:
        return "clock"
    if since >= earliest(rule, solve_seconds) and fetched >= replan_fetches(rule, pages):
        return "learned"
    return None


def next_look(since: float, rule: ReplanRule, solve_seconds: float) -> float:
    """Seconds to wait, ``since`` seconds after the last plan, before asking
    :func:`replan_reason` again: until :func:`earliest` while before it, then :data:`POLL`
    (the count of fetches can reach ``share`` at any moment), or straight to ``interval``
    when ``share`` is 0; never past ``interval``."""
    left = rule.interval - since
    lower = earliest(rule, solve_seconds)
    wait = lower - since if since < lower else POLL if rule.share > 0 else left
    return max(0.0, min(wait, left))
