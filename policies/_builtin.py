"""The four built-in policies: uniform, proportional, optimal (freshness), optimal-age."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._solve import Allocation, Problem, optimal, water_fill
from ._table import age_response, freshness_response

__all__ = ["BUILTIN", "DEFAULT", "OptimalAge", "OptimalFreshness", "Proportional", "Uniform"]


class _Builtin:
    """``allocate`` returns the rates; ``solve`` the whole :class:`Allocation`."""

    name = ""

    def allocate(
        self,
        rates: ArrayLike,
        budget: float,
        *,
        weights: ArrayLike | None = None,
        hosts: ArrayLike | None = None,
        host_caps: ArrayLike | None = None,
    ) -> NDArray[np.float64]:
        """Fetch rate f_i (fetches per second) per page; see :meth:`solve`."""
        return self.solve(rates, budget, weights=weights, hosts=hosts, host_caps=host_caps).rates

    def solve(
        self,
        rates: ArrayLike,
        budget: float,
        *,
        weights: ArrayLike | None = None,
        hosts: ArrayLike | None = None,
        host_caps: ArrayLike | None = None,
        warm: Allocation | None = None,
    ) -> Allocation:
        """Split ``budget`` (fetches per second) over pages changing at ``rates`` (changes
        per second). ``hosts`` gives each page's host id, ``host_caps[h]`` the most fetches
        per second host h may receive (∞: no cap). ``warm``: an earlier allocation whose
        multipliers start the optimal policies' searches (hosts numbered alike; the answer
        does not depend on it). Raises ValueError on malformed input."""
        problem = Problem.build(rates, budget, weights=weights, hosts=hosts, host_caps=host_caps)
        return self._solve(problem, warm)

    def _solve(  # pragma: no cover - abstract
        self, problem: Problem, warm: Allocation | None
    ) -> Allocation:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


class Uniform(_Builtin):
    """f_i = B/N: every page alike (weights are not used). Under caps, water-filling: pages of
    capped hosts share their cap, the others share the rest equally."""

    name = "uniform"

    def _solve(self, problem: Problem, warm: Allocation | None) -> Allocation:
        return water_fill(self.name, problem, None)


class Proportional(_Builtin):
    """f_i = B·λ_i/Σλ: fetch in proportion to the change rate (weights are not used). Worse
    than uniform on freshness (Cho & Garcia-Molina); here as the baseline it is."""

    name = "proportional"

    def _solve(self, problem: Problem, warm: Allocation | None) -> Allocation:
        return water_fill(self.name, problem, problem.rates)


class OptimalFreshness(_Builtin):
    """Maximise Σ w_i·F̄(λ_i, f_i). Pages with w_i/λ_i ≤ μ (changing too often to be kept
    fresh at the going price) get nothing; so do pages that never change."""

    name = "optimal"

    def _solve(self, problem: Problem, warm: Allocation | None) -> Allocation:
        return optimal(self.name, freshness_response(), problem, warm)


class OptimalAge(_Builtin):
    """Minimise Σ w_i·Ā(λ_i, f_i). Every page that changes and has weight gets some budget."""

    name = "optimal-age"

    def _solve(self, problem: Problem, warm: Allocation | None) -> Allocation:
        return optimal(self.name, age_response(), problem, warm)


BUILTIN: tuple[_Builtin, ...] = (Uniform(), Proportional(), OptimalFreshness(), OptimalAge())

#: the policy a config names when it names none. Defined here, not in ``_registry``: the
#: registry imports ``refresher`` (for its error tree), whose config reads this name while
#: ``policies`` may still be importing.
DEFAULT = "optimal"
