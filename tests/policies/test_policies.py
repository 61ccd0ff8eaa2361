"""The refresh-allocation policies: the paper's figures, optimality, caps, the registry."""

from __future__ import annotations

import dataclasses
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize

from refresher import policies
from refresher._errors import ConfigError
from refresher.policies import _model, _table

DAY = 86_400.0
PAPER_RATES = np.array([1.0, 2.0, 3.0, 4.0, 5.0])  # changes per day
PAPER_BUDGET = 5.0  # fetches per day
BUILTIN = ("uniform", "proportional", "optimal", "optimal-age")

examples = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policies registered or loaded by one test stay out of the others."""
    monkeypatch.setattr(policies._registry, "_registered", {})


# --- the paper's example (Cho & Garcia-Molina 2003; docs/model.md) ----------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("uniform", [1.0, 1.0, 1.0, 1.0, 1.0]),
        ("proportional", [0.33, 0.67, 1.0, 1.33, 1.67]),
        ("optimal", [1.15, 1.36, 1.35, 1.14, 0.00]),
        # The paper prints 0.84 for f_1: its row is rounded to sum to 5. The
        # exact optimum is f_1 = 0.83487 (a general-purpose solver agrees, and the mean age,
        # 0.2503, matches to four decimals), which rounds to 0.83.
        ("optimal-age", [0.83, 0.97, 1.03, 1.07, 1.09]),
    ],
)
def test_the_papers_allocations_are_reproduced_to_two_decimals(
    name: str, expected: list[float]
) -> None:
    per_day = policies.get(name).allocate(PAPER_RATES, PAPER_BUDGET)
    assert np.round(per_day, 2).tolist() == expected
    # the same in the units refresher uses (changes and fetches per second)
    per_second = policies.get(name).allocate(PAPER_RATES / DAY, PAPER_BUDGET / DAY)
    np.testing.assert_allclose(per_second * DAY, per_day, rtol=1e-9)


def test_the_papers_optimal_age_row_is_the_optimum_rounded_to_sum_to_the_budget() -> None:
    f = policies.get("optimal-age").allocate(PAPER_RATES, PAPER_BUDGET)
    assert round(float(f[0]), 5) == 0.83487
    printed = np.array([0.84, 0.97, 1.03, 1.07, 1.09])
    assert np.abs(f - printed).max() < 0.0052
    assert policies.mean_age(PAPER_RATES, f) < policies.mean_age(PAPER_RATES, printed)


@pytest.mark.parametrize(
    ("name", "freshness", "age_days"),
    [
        ("uniform", 0.3651, 0.2543),
        ("proportional", 0.3167, 0.3730),
        ("optimal", 0.3739, None),
        ("optimal-age", None, 0.2503),
    ],
)
def test_the_papers_mean_freshness_and_age_are_reproduced_to_four_decimals(
    name: str, freshness: float | None, age_days: float | None
) -> None:
    f = policies.get(name).allocate(PAPER_RATES / DAY, PAPER_BUDGET / DAY)
    if freshness is not None:
        assert round(policies.mean_freshness(PAPER_RATES / DAY, f), 4) == freshness
    if age_days is not None:
        assert round(policies.mean_age(PAPER_RATES / DAY, f) / DAY, 4) == age_days


def test_optimal_gives_nothing_to_the_page_that_changes_too_often() -> None:
    result = policies.solve("optimal", PAPER_RATES, PAPER_BUDGET)
    assert result.rates[4] == 0.0
    # its marginal value at f = 0 (w/λ = 1/5) is below the price every other page pays
    assert result.multiplier >= 1.0 / 5.0


# --- random instances -----------------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn, *, weighted: bool = True) -> tuple[NDArray[np.float64], ...]:
    n = draw(st.integers(1, 40))
    log_rates = draw(st.lists(st.floats(-4.0, 3.0), min_size=n, max_size=n))
    rates = 10.0 ** np.array(log_rates)
    if weighted:
        weights = np.array(draw(st.lists(st.floats(0.05, 20.0), min_size=n, max_size=n)))
    else:
        weights = np.ones(n)
    budget = float(rates.sum()) * 10.0 ** draw(st.floats(-2.5, 2.0))
    return rates, weights, np.array(budget)


@st.composite
def capped_instances(draw: st.DrawFn) -> tuple[NDArray[np.float64], ...]:
    rates, weights, budget = draw(instances())
    n_hosts = draw(st.integers(1, 6))
    hosts = np.array(
        draw(st.lists(st.integers(0, n_hosts - 1), min_size=rates.size, max_size=rates.size))
    )
    # a host's share of the budget: 0 (closed) or a fraction a double resolves
    shares = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))
    share = np.array(draw(st.lists(shares, min_size=n_hosts, max_size=n_hosts)))
    caps = share * float(budget) * draw(st.floats(0.2, 3.0))
    return rates, weights, budget, hosts, caps


def marginal(name: str, rates: ArrayLike, f: ArrayLike) -> NDArray[np.float64]:
    if name == "optimal":
        return policies.marginal_freshness(rates, f)
    return policies.marginal_age(rates, f)


def objective(name: str, rates: ArrayLike, f: ArrayLike, weights: ArrayLike) -> float:
    if name == "optimal":
        return policies.mean_freshness(rates, f, weights)
    return -policies.mean_age(rates, f, weights)


@examples
@given(instances())
@pytest.mark.parametrize("name", BUILTIN)
def test_the_budget_is_spent_exactly(name: str, instance: tuple[NDArray[np.float64], ...]) -> None:
    rates, weights, budget = instance
    result = policies.solve(name, rates, float(budget), weights=weights)
    assert result.unplaced == 0.0
    assert math.isclose(result.rates.sum(), float(budget), rel_tol=1e-12)
    assert (result.rates >= 0.0).all()


@examples
@given(instances())
@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_every_fetched_page_has_the_same_marginal_value_and_no_idle_page_would_gain_more(
    name: str, instance: tuple[NDArray[np.float64], ...]
) -> None:
    rates, weights, budget = instance
    result = policies.solve(name, rates, float(budget), weights=weights)
    f, mu = result.rates, result.multiplier
    value = weights * marginal(name, rates, f)
    np.testing.assert_allclose(value[f > 0.0], mu, rtol=1e-7)
    assert (value[f == 0.0] <= mu * (1.0 + 1e-7)).all()


@examples
@given(instances(weighted=False))
def test_uniform_is_at_least_as_fresh_as_proportional(
    instance: tuple[NDArray[np.float64], ...],
) -> None:
    rates, _, budget = instance
    uniform = policies.get("uniform").allocate(rates, float(budget))
    proportional = policies.get("proportional").allocate(rates, float(budget))
    assert (
        policies.mean_freshness(rates, uniform)
        >= policies.mean_freshness(rates, proportional) - 1e-12
    )


@examples
@given(instances())
@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_the_optimum_beats_uniform_and_proportional_on_its_own_objective(
    name: str, instance: tuple[NDArray[np.float64], ...]
) -> None:
    rates, weights, budget = instance
    best = objective(
        name, rates, policies.get(name).allocate(rates, float(budget), weights=weights), weights
    )
    for other in ("uniform", "proportional"):
        f = policies.get(other).allocate(rates, float(budget))
        assert best >= objective(name, rates, f, weights) - 1e-9 * abs(best)


# --- host caps -------------------------------------------------------------------------


@examples
@given(capped_instances())
@pytest.mark.parametrize("name", BUILTIN)
def test_host_caps_are_never_exceeded_and_what_they_refuse_is_reported(
    name: str, instance: tuple[NDArray[np.float64], ...]
) -> None:
    rates, weights, budget, hosts, caps = instance
    result = policies.solve(
        name, rates, float(budget), weights=weights, hosts=hosts, host_caps=caps
    )
    per_host = np.bincount(hosts, result.rates, minlength=caps.size)
    assert (per_host <= caps * (1.0 + 1e-9) + 1e-300).all()
    # what a host with pages can take, it takes, until the budget is spent
    room = np.where(np.bincount(hosts, minlength=caps.size) > 0, caps, 0.0).sum()
    expected_unplaced = max(float(budget) - room, 0.0)
    assert math.isclose(result.unplaced, expected_unplaced, rel_tol=1e-9, abs_tol=1e-9 * budget)
    assert math.isclose(result.placed + 0.0, float(result.rates.sum()), rel_tol=1e-9, abs_tol=1e-12)


@examples
@given(capped_instances())
@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_a_capped_host_gets_its_own_multiplier_and_the_others_share_the_global_one(
    name: str, instance: tuple[NDArray[np.float64], ...]
) -> None:
    rates, weights, budget, hosts, caps = instance
    result = policies.solve(
        name, rates, float(budget), weights=weights, hosts=hosts, host_caps=caps
    )
    assert result.host_multipliers is not None and result.capped_hosts is not None
    mu_h = result.host_multipliers[hosts]
    f = result.rates
    value = weights * marginal(name, rates, f)
    np.testing.assert_allclose(value[f > 0.0], mu_h[f > 0.0], rtol=1e-7)
    assert (value[f == 0.0] <= mu_h[f == 0.0] * (1.0 + 1e-7)).all()
    assert (result.host_multipliers >= result.multiplier * (1.0 - 1e-12)).all()
    per_host = np.bincount(hosts, f, minlength=caps.size)
    capped = result.capped_hosts
    np.testing.assert_allclose(per_host[capped], caps[capped], rtol=1e-9)


@settings(max_examples=12, deadline=None)
@given(capped_instances())
@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_the_capped_optimum_is_at_least_as_good_as_a_general_purpose_solver(
    name: str, instance: tuple[NDArray[np.float64], ...]
) -> None:
    rates, weights, budget, hosts, caps = instance
    # at most 8 pages, none on a closed host (their rate is forced to 0 and the age is ∞)
    keep = np.flatnonzero(caps[hosts] > 0.0)[:8]
    rates, weights, hosts = rates[keep], weights[keep], hosts[keep]
    room = float(np.where(np.bincount(hosts, minlength=caps.size) > 0, caps, 0.0).sum())
    b = min(float(budget), 0.9 * room)
    if b <= 0.0:
        return
    ours = policies.get(name).allocate(rates, b, weights=weights, hosts=hosts, host_caps=caps)
    # SLSQP on x = f/scale, with analytic gradients; the caps and budget are linear
    n, scale = rates.size, b / rates.size
    member = (hosts[None, :] == np.arange(caps.size)[:, None]).astype(float)
    res = minimize(
        lambda x: -objective(name, rates, x * scale, weights),
        np.full(n, 1.0),
        jac=lambda x: -weights * marginal(name, rates, x * scale) * scale / weights.sum(),
        bounds=[(1e-12, None)] * n,
        constraints=[
            {
                "type": "eq",
                "fun": lambda x: x.sum() * scale - b,
                "jac": lambda x: np.full(n, scale),
            },
            {
                "type": "ineq",
                "fun": lambda x: caps - member @ x * scale,
                "jac": lambda x: -member * scale,
            },
        ],
        method="SLSQP",
        options={"maxiter": 300, "ftol": 1e-12},
    )
    # make the general-purpose answer feasible (it may overstep a cap by its tolerance);
    # with less than the budget spent it can only get worse
    theirs = np.maximum(res.x * scale, 0.0)
    per_host = np.bincount(hosts, theirs, minlength=caps.size)
    theirs *= np.minimum(
        1.0, np.divide(caps, per_host, out=np.ones_like(caps), where=per_host > 0)
    )[hosts]
    theirs *= min(1.0, b / theirs.sum())
    mine, other = objective(name, rates, ours, weights), objective(name, rates, theirs, weights)
    assert mine >= other - 1e-9 * abs(mine)


def test_caps_below_the_budget_leave_every_host_at_its_cap_and_report_the_rest() -> None:
    rates = np.array([1.0, 2.0, 3.0, 4.0])
    hosts = np.array([0, 0, 1, 2])
    caps = np.array([1.0, 0.5, 0.25])
    for name in BUILTIN:
        result = policies.solve(name, rates, 10.0, hosts=hosts, host_caps=caps)
        np.testing.assert_allclose(np.bincount(hosts, result.rates), caps, rtol=1e-12)
        assert math.isclose(result.unplaced, 10.0 - 1.75, rel_tol=1e-12)
        assert result.capped_hosts is not None and result.capped_hosts.all()


def test_a_cap_of_zero_keeps_a_host_out_entirely() -> None:
    rates = np.array([1.0, 2.0, 3.0])
    hosts = np.array([0, 1, 1])
    for name in BUILTIN:
        f = policies.get(name).allocate(rates, 3.0, hosts=hosts, host_caps=np.array([0.0, 9.0]))
        assert f[0] == 0.0
        assert math.isclose(f.sum(), 3.0, rel_tol=1e-12)


def test_an_infinite_cap_is_no_cap() -> None:
    rng = np.random.default_rng(3)
    rates = rng.lognormal(0.0, 1.5, 50)
    hosts = rng.integers(0, 5, 50)
    for name in BUILTIN:
        free = policies.get(name).allocate(rates, 20.0)
        capped = policies.get(name).allocate(rates, 20.0, hosts=hosts, host_caps=np.full(5, np.inf))
        np.testing.assert_allclose(capped, free, rtol=1e-9)


def test_uniform_under_caps_shares_the_rest_equally_among_uncapped_hosts() -> None:
    hosts = np.array([0, 0, 0, 0, 1, 2])
    result = policies.solve(
        "uniform", np.ones(6), 6.0, hosts=hosts, host_caps=np.array([2.0, 9.0, 9.0])
    )
    np.testing.assert_allclose(result.rates, [0.5, 0.5, 0.5, 0.5, 2.0, 2.0])
    assert result.multiplier == 2.0
    assert result.capped_hosts is not None
    assert result.capped_hosts.tolist() == [True, False, False]


# --- edge cases --------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN)
def test_no_pages_leave_the_whole_budget_unplaced(name: str) -> None:
    result = policies.solve(name, np.array([]), 5.0)
    assert result.rates.shape == (0,)
    assert result.unplaced == 5.0


@pytest.mark.parametrize("name", BUILTIN)
def test_a_zero_budget_fetches_nothing(name: str) -> None:
    result = policies.solve(name, PAPER_RATES, 0.0)
    assert (result.rates == 0.0).all()
    assert result.unplaced == 0.0


@pytest.mark.parametrize("name", ["optimal", "optimal-age", "proportional"])
def test_pages_that_never_change_get_nothing_while_others_can_use_the_budget(name: str) -> None:
    rates = np.array([0.0, 1.0, 0.0, 2.0])
    f = policies.get(name).allocate(rates, 3.0)
    assert f[0] == 0.0 and f[2] == 0.0
    assert math.isclose(f.sum(), 3.0, rel_tol=1e-12)


@pytest.mark.parametrize("name", ["optimal", "optimal-age", "proportional"])
def test_pages_that_never_change_take_the_budget_nobody_else_can(name: str) -> None:
    everything_still = policies.get(name).allocate(np.zeros(4), 2.0)
    np.testing.assert_allclose(everything_still, 0.5)
    # the changing page's host is full; the still page's host has room for the rest
    result = policies.solve(
        name,
        np.array([1.0, 0.0]),
        2.0,
        hosts=np.array([0, 1]),
        host_caps=np.array([0.5, 1.0]),
    )
    np.testing.assert_allclose(result.rates, [0.5, 1.0])
    assert math.isclose(result.unplaced, 0.5)


def test_optimal_age_fetches_every_page_that_changes() -> None:
    rates = np.array([1e-6, 1.0, 1e3, 1e6])
    f = policies.get("optimal-age").allocate(rates, 1.0)
    assert (f > 0.0).all()


def test_weightless_pages_are_not_fetched_by_the_optimal_policies() -> None:
    for name in ("optimal", "optimal-age"):
        f = policies.get(name).allocate(np.ones(3), 3.0, weights=np.array([1.0, 0.0, 2.0]))
        assert f[1] == 0.0 and f[2] > f[0] > 0.0


@pytest.mark.parametrize("name", BUILTIN)
def test_rates_spanning_eighteen_orders_of_magnitude_give_finite_rates(name: str) -> None:
    rates = 10.0 ** np.linspace(-12.0, 6.0, 37)
    result = policies.solve(name, rates, 0.3, weights=np.linspace(0.1, 3.0, 37))
    assert np.isfinite(result.rates).all()
    assert math.isclose(result.rates.sum(), 0.3, rel_tol=1e-12)


def test_bad_input_is_refused_with_what_to_fix() -> None:
    policy = policies.get("optimal")
    with pytest.raises(ValueError, match="rates must be finite"):
        policy.allocate(np.array([1.0, -1.0]), 1.0)
    with pytest.raises(ValueError, match="budget must be finite"):
        policy.allocate(np.ones(2), math.nan)
    with pytest.raises(ValueError, match="host_caps needs hosts"):
        policy.allocate(np.ones(2), 1.0, host_caps=np.ones(1))
    with pytest.raises(ValueError, match="host ids must lie in"):
        policy.allocate(np.ones(2), 1.0, hosts=np.array([0, 3]), host_caps=np.ones(2))


def test_an_allocation_cannot_be_changed() -> None:
    result = policies.solve("optimal", PAPER_RATES, PAPER_BUDGET)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.unplaced = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        result.rates[0] = 1.0


# --- the formulas --------------------------------------------------------------------------


def test_freshness_and_age_have_the_right_limits() -> None:
    np.testing.assert_array_equal(
        policies.freshness([0.0, 1.0, 0.0], [0.0, 0.0, 1.0]), [1.0, 0.0, 1.0]
    )
    np.testing.assert_array_equal(
        policies.age([0.0, 1.0, 0.0], [0.0, 0.0, 1.0]), [0.0, math.inf, 0.0]
    )
    # fetching far more often than the page changes: F̄ → 1 − x/2, Ā → λ/(6f²)
    assert math.isclose(float(policies.freshness(1e-9, 1.0)), 1.0 - 5e-10, rel_tol=1e-15)
    assert math.isclose(float(policies.age(1e-9, 1.0)), 1e-9 / 6.0, rel_tol=1e-8)


def test_the_marginal_values_are_the_derivatives_of_freshness_and_age() -> None:
    rates = np.array([1e-4, 0.3, 2.0, 5.0, 40.0])
    f = np.array([1.0, 0.01, 0.5, 50.0, 0.2])
    h = 1e-6 * f
    fresh = (policies.freshness(rates, f + h) - policies.freshness(rates, f - h)) / (2 * h)
    old = -(policies.age(rates, f + h) - policies.age(rates, f - h)) / (2 * h)
    np.testing.assert_allclose(policies.marginal_freshness(rates, f), fresh, rtol=1e-6)
    np.testing.assert_allclose(policies.marginal_age(rates, f), old, rtol=1e-6)


def test_the_tabulated_inverses_agree_with_the_exact_ones() -> None:
    rng = np.random.default_rng(0)
    v = -np.exp(rng.uniform(np.log(1e-10), np.log(80.0), 20_000))
    r, _ = _table.freshness_response()(v)
    exact = np.sqrt(2.0 * np.exp(v)) / _model.inverse_g(v)
    np.testing.assert_allclose(r, exact, rtol=1e-11)
    v = rng.uniform(-130.0, 45.0, 20_000)
    r, _ = _table.age_response()(v)
    exact = np.sqrt(2.0 * np.exp(v)) / _model.inverse_q(v)
    np.testing.assert_allclose(r, exact, rtol=1e-11)


def test_the_freshness_tables_slope_is_the_derivative_and_its_ramp_ends_at_the_drop_out() -> None:
    rng = np.random.default_rng(1)
    v = -np.exp(rng.uniform(np.log(1e-9), np.log(60.0), 2_000))
    _, slope = _table.freshness_response()(v)

    def exact(x: np.ndarray) -> np.ndarray:
        return np.sqrt(2.0 * np.exp(x)) / _model.inverse_g(x)

    h = 1e-5 * -v
    want = (exact(v + h) - exact(v - h)) / (2 * h)  # (R ≤ 1: its slope counts to 1e-9)
    np.testing.assert_allclose(slope, want, rtol=1e-7, atol=1e-9)
    # within 1e-10 of the drop-out R is a straight line to 0, and 0 with no slope past it
    top = float(exact(np.array([-1e-10]))[0])
    r, slope = _table.freshness_response()(np.array([-1e-10, -2.5e-11, 0.0, 3.0]))
    np.testing.assert_allclose(r, [top, 0.25 * top, 0.0, 0.0], rtol=1e-11)
    np.testing.assert_allclose(slope[1:], [-top / 1e-10, 0.0, 0.0])


def test_weighted_means_weigh_pages() -> None:
    assert policies.mean_freshness([1.0, 0.0], [0.0, 0.0], weights=[3.0, 1.0]) == 0.25
    assert math.isnan(policies.mean_age([], []))


# --- the registry ---------------------------------------------------------------------------


def test_the_builtin_policies_are_available_by_name() -> None:
    assert policies.available()[:4] == BUILTIN
    for name in BUILTIN:
        policy = policies.get(name)
        assert isinstance(policy, policies.Policy)
        assert policy.name == name


def test_an_unknown_policy_name_is_a_config_error_listing_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'fastest'") as info:
        policies.get("fastest")
    assert info.value.key == "policy.name"
    for name in BUILTIN:
        assert name in str(info.value)


class Half:
    """A third-party policy with only ``allocate``: half the budget, uniformly."""

    name = "half"

    def allocate(
        self,
        rates: ArrayLike,
        budget: float,
        *,
        weights: ArrayLike | None = None,
        hosts: ArrayLike | None = None,
        host_caps: ArrayLike | None = None,
    ) -> NDArray[np.float64]:
        n = np.asarray(rates).size
        return np.full(n, 0.5 * budget / n)


def test_a_registered_policy_is_found_and_its_unplaced_budget_computed() -> None:
    policies.register(Half())
    assert "half" in policies.available()
    result = policies.solve("half", np.ones(4), 2.0)
    assert result.unplaced == 1.0
    assert math.isnan(result.multiplier)


def test_the_builtin_names_cannot_be_taken() -> None:
    class Impostor(Half):
        name = "optimal"

    with pytest.raises(ValueError, match="built-in"):
        policies.register(Impostor())
    with pytest.raises(TypeError, match="not a policy"):
        policies.register(object())  # type: ignore[arg-type]


def test_a_policy_plugs_in_through_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "thirdparty_policy.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            class Everything:
                name = "everything-to-the-first"

                def allocate(self, rates, budget, *, weights=None, hosts=None, host_caps=None):
                    f = np.zeros(len(rates))
                    f[0] = budget
                    return f

            def broken():
                raise RuntimeError("no luck")
            """
        )
    )
    info = tmp_path / "thirdparty_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-policy\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[refresher.policies]\n"
        "everything-to-the-first = thirdparty_policy:Everything\n"
        "broken = thirdparty_policy:broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "thirdparty_policy", raising=False)
    assert "everything-to-the-first" in policies.available()
    f = policies.get("everything-to-the-first").allocate(np.ones(3), 3.0)
    assert f.tolist() == [3.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match=r"failed to load.*no luck"):
        policies.get("broken")


def test_a_host_whose_page_drops_out_at_the_root_is_not_held_at_its_cap() -> None:
    # Found by hypothesis: host 2's page 24 (w/λ = 0.0675) drops out exactly at μ, and with
    # it host 2 falls below its cap. The bracket's interpolation held host 2 at its cap (it
    # was over it at the lower end) and scaled the others down to what was left, off μ.
    rates = np.ones(30)
    rates[[5, 6, 22, 23, 24, 29]] = [421.69650343, 10.0, 10.0, 316.22776602, 133.35214322, 100.0]
    weights = np.ones(30)
    weights[[1, 6, 14, 22, 24]] = [3.0, 19.0, 2.0, 6.0, 9.0]
    hosts = np.zeros(30, np.intp)
    hosts[[1, 6, 14, 26, 27, 28]] = 1
    hosts[[22, 24]] = 2
    caps = np.array([0.0, 177.12273321, 22.14034165])
    result = policies.solve(
        "optimal", rates, 70.84909328, weights=weights, hosts=hosts, host_caps=caps
    )
    f = result.rates
    assert result.capped_hosts is not None and not result.capped_hosts[2]
    value = weights * marginal("optimal", rates, f)
    np.testing.assert_allclose(value[f > 0.0], result.multiplier, rtol=1e-7)
    assert f.sum() == pytest.approx(70.84909328, rel=1e-12)
