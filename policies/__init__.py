"""Refresh-allocation policies: how to split a fetch budget over pages.

Rates are changes per second (λ) and fetches per second (f, the budget B, host caps).
``get(name)`` returns a policy; ``policy.allocate(rates, budget, ...)`` returns f per page and
``solve(policy, rates, budget, ...)`` the whole :class:`Allocation` (with the budget the host
caps left unplaced). Built in: ``uniform``, ``proportional``, ``optimal`` (maximise weighted
mean freshness, Cho & Garcia-Molina) and ``optimal-age`` (minimise weighted mean age); more
plug in through the entry-point group ``refresher.policies``.
"""

from __future__ import annotations

from ._builtin import DEFAULT, OptimalAge, OptimalFreshness, Proportional, Uniform
from ._demand import WATER_FILL, Demand, Level, Point
from ._expected import EXPECTED_POLICIES, expected_value, solve_expected
from ._model import age, freshness, marginal_age, marginal_freshness, mean_age, mean_freshness
from ._registry import ENTRY_POINT_GROUP, Policy, available, get, register, solve
from ._solve import Allocation

__all__ = [
    "DEFAULT",
    "ENTRY_POINT_GROUP",
    "EXPECTED_POLICIES",
    "WATER_FILL",
    "Allocation",
    "Demand",
    "Level",
    "OptimalAge",
    "OptimalFreshness",
    "Point",
    "Policy",
    "Proportional",
    "Uniform",
    "age",
    "available",
    "expected_value",
    "freshness",
    "get",
    "marginal_age",
    "marginal_freshness",
    "mean_age",
    "mean_freshness",
    "register",
    "solve",
    "solve_expected",
]
