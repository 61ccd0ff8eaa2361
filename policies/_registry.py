"""Policies by name: the built-ins, ``register``-ed ones and the entry-point group.

A third-party package plugs a policy in with an entry point in the group
``refresher.policies``; the name is the entry point's name and the object it loads is a
policy, a class or a factory taking no arguments that returns one::

    [project.entry-points."refresher.policies"]
    my-policy = "my_package.policies:MyPolicy"

Entry points are read lazily, on the first lookup of a name that is not already known.
"""

from __future__ import annotations

import math
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from refresher._errors import ConfigError

from ._builtin import BUILTIN, DEFAULT, _Builtin
from ._solve import Allocation, Problem, group_sum

__all__ = ["DEFAULT", "ENTRY_POINT_GROUP", "Policy", "available", "get", "register", "solve"]

ENTRY_POINT_GROUP = "refresher.policies"


@runtime_checkable
class Policy(Protocol):
    """A refresh-allocation policy: splits a fetch budget over pages.

    ``allocate`` returns f_i in fetches per second for pages changing at ``rates`` (changes
    per second) so that Σf = ``budget`` where the caps allow: ``hosts`` gives each page's
    integer host id and ``host_caps[h]`` the most fetches per second host h may receive.
    A policy may also offer ``solve`` with the same arguments, returning an
    :class:`Allocation` (the built-ins do); :func:`solve` works with either.
    """

    name: str

    def allocate(
        self,
        rates: ArrayLike,
        budget: float,
        *,
        weights: ArrayLike | None = None,
        hosts: ArrayLike | None = None,
        host_caps: ArrayLike | None = None,
    ) -> NDArray[np.float64]: ...


_BUILTIN: dict[str, Policy] = {p.name: p for p in BUILTIN}
_registered: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Make ``policy`` available under ``policy.name`` (replacing an earlier registration of
    that name). Returns it. The built-in names cannot be taken."""
    if not isinstance(policy, Policy) or not isinstance(policy.name, str) or not policy.name:
        raise TypeError(
            f"{policy!r} is not a policy: it needs a non-empty str `name` and an `allocate` method"
        )
    if policy.name in _BUILTIN:
        raise ValueError(f"{policy.name!r} is a built-in policy; register yours under another name")
    _registered[policy.name] = policy
    return policy


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load(ep: EntryPoint) -> Policy:
    where = f"entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r}"
    try:
        obj = ep.load()
        if isinstance(obj, type) or (not isinstance(obj, Policy) and callable(obj)):
            obj = obj()
    except Exception as e:
        raise ConfigError(
            f"policy {ep.name!r} failed to load from {where}: {e}; fix or uninstall that package",
            key="policy.name",
        ) from e
    if not isinstance(obj, Policy):
        raise ConfigError(
            f"{where} gave {obj!r}, which is not a policy (it needs `name` and `allocate`)",
            key="policy.name",
        )
    return obj


def available() -> tuple[str, ...]:
    """Every policy name: the built-ins in order, then the others sorted."""
    others = (set(_registered) | set(_entry_points())) - set(_BUILTIN)
    return (*_BUILTIN, *sorted(others))


def get(name: str) -> Policy:
    """The policy called ``name``; :class:`ConfigError` (key ``policy.name``) if unknown."""
    known = _BUILTIN.get(name) or _registered.get(name)
    if known is not None:
        return known
    ep = _entry_points().get(name)
    if ep is None:
        raise ConfigError(
            f"unknown policy {name!r}; choose one of: {', '.join(available())}",
            key="policy.name",
        )
    policy = _load(ep)
    _registered[name] = policy
    return policy


def solve(
    policy: Policy | str,
    rates: ArrayLike,
    budget: float,
    *,
    weights: ArrayLike | None = None,
    hosts: ArrayLike | None = None,
    host_caps: ArrayLike | None = None,
    warm: Allocation | None = None,
) -> Allocation:
    """Allocate with ``policy`` (or the policy of that name) and return the whole
    :class:`Allocation`, including the budget the caps left ``unplaced`` (fetches per second).

    For a policy that only has ``allocate`` the multiplier is unknown (NaN); the rates are
    checked (one finite rate ≥ 0 per page) and the unplaced budget is B − Σf. ``warm``: an
    earlier allocation for the built-in policies to start their searches from (hosts
    numbered alike; the same answer without it); other policies do not see it."""
    p = get(policy) if isinstance(policy, str) else policy
    kwargs = {"weights": weights, "hosts": hosts, "host_caps": host_caps}
    if isinstance(p, _Builtin):
        return p.solve(rates, budget, warm=warm, **kwargs)
    method = getattr(p, "solve", None)
    if callable(method):
        result = method(rates, budget, **kwargs)
        if isinstance(result, Allocation):
            return result
    problem = Problem.build(rates, budget, **kwargs)
    f = np.array(p.allocate(rates, budget, **kwargs), dtype=np.float64)
    if f.shape != problem.rates.shape or not (np.isfinite(f).all() and (f >= 0.0).all()):
        raise ValueError(
            f"policy {p.name!r} returned {f.shape} rates; expected one finite rate ≥ 0 per page"
        )
    capped = None
    if problem.hosts is not None and problem.caps is not None:
        used = group_sum(problem.hosts, f, problem.caps.size)
        capped = used >= problem.caps * (1.0 - 1e-9)
        capped.flags.writeable = False
    f.flags.writeable = False
    return Allocation(
        policy=p.name,
        rates=f,
        budget=problem.budget,
        unplaced=max(problem.budget - float(f.sum()), 0.0),
        multiplier=math.nan,
        capped_hosts=capped,
    )
