"""The expected-value allocation under log-normal posteriors on the rates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refresher import policies
from refresher.policies import _expected


def _web(n: int = 300, seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lam = np.exp(rng.normal(-3.0, 1.5, n))
    hosts = rng.integers(0, 6, n)
    caps = np.array([0.5, 2.0, 0.1, np.inf, 1.0, 3.0])
    return lam, hosts, caps


@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_the_expected_allocation_reduces_to_plug_in_as_the_posterior_narrows(name: str) -> None:
    lam, hosts, caps = _web()
    plug = policies.solve(name, lam, 4.0, hosts=hosts, host_caps=caps)
    for sd, tol in ((0.0, 2e-3), (1e-3, 5e-3)):
        exp = policies.solve_expected(name, np.log(lam), sd, 4.0, hosts=hosts, host_caps=caps)
        assert np.abs(exp.rates - plug.rates).max() <= tol * plug.rates.max()
        value = policies.mean_freshness if name == "optimal" else policies.mean_age
        assert value(lam, exp.rates) == pytest.approx(value(lam, plug.rates), rel=1e-4)


def test_pages_whose_rates_are_equally_unknown_get_nearly_equal_shares() -> None:
    # The same posterior for every page: by symmetry each gets B/N.
    n = 200
    exp = policies.solve_expected("optimal", np.full(n, -2.0), np.full(n, 2.0), 5.0)
    assert exp.rates == pytest.approx(np.full(n, 5.0 / n), rel=1e-6)


def test_a_page_known_only_roughly_is_hedged_rather_than_dropped() -> None:
    # Plug-in drops a page whose λ̂ is past the cut-off; its posterior says it may be slow.
    theta = np.log(np.array([0.1, 0.1, 0.1, 5.0]))
    plug = policies.solve("optimal", np.exp(theta), 0.3)
    exp = policies.solve_expected("optimal", theta, np.array([0.1, 0.1, 0.1, 2.5]), 0.3)
    assert plug.rates[3] == 0.0
    assert exp.rates[3] > 0.0


def test_expected_freshness_is_the_posterior_mean_not_the_value_at_the_estimate() -> None:
    # A page fetched every second with ln λ ~ N(0, 1): a Monte Carlo mean over the posterior.
    rng = np.random.default_rng(0)
    lam = np.exp(rng.normal(0.0, 1.0, 200_000))
    mc = float(policies.freshness(lam, 1.0).mean())
    assert policies.expected_value("freshness", 0.0, 1.0, 1.0) == pytest.approx(mc, abs=3e-3)
    assert policies.expected_value("freshness", 0.0, 0.0, 1.0) == pytest.approx(
        float(policies.freshness(1.0, 1.0)), rel=1e-12
    )


# --- the solver's pages and the optimality conditions -------------------------------------


def _implied(name: str, alloc: policies.Allocation, theta, sd, weights, hosts, scale=1.0):
    """Each page's rate at its host's multiplier (× ``scale``), from the table's definition."""
    table = _expected._table(policies.EXPECTED_POLICIES[name])
    mu = np.full(theta.size, alloc.multiplier)
    if alloc.host_multipliers is not None:
        mu = np.asarray(alloc.host_multipliers)[hosts]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_w = np.zeros(theta.size) if weights is None else np.log(weights)
        u = table.solve(
            np.broadcast_to(sd, theta.shape), np.log(mu * scale) + table.power * theta - log_w
        )
    return np.where(np.isfinite(u), np.exp(theta - u), 0.0)


def _evaluate(table, theta, log_y, row, weight):
    """f and df/d ln μ per page at ln y = ``log_y`` (the solver's pages at ln μ = 0)."""
    pages = _expected.ExpectedPages(table, theta, log_y, row, weight)
    f, df = np.empty(theta.size), np.empty(theta.size)
    level = pages.level(np.array([0.0]))
    for start in range(0, theta.size, 1 << 15):
        b = slice(start, start + (1 << 15))
        pages.rates(b, level, None, f[b], df[b])
    return f, df


@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_the_solvers_pages_compute_the_tables_definition_with_its_slope(name: str) -> None:
    rng = np.random.default_rng(7)
    n = 200_000
    table = _expected._table(policies.EXPECTED_POLICIES[name])
    theta = rng.normal(-5.0, 3.0, n)
    sigma = np.concatenate((rng.uniform(0.0, 5.0, n - 1000), np.zeros(1000)))
    row, weight = table.position(sigma)
    top = table.tops[row]
    # ln y across the grid, beyond both ends and, for freshness, close to, at and past the
    # cut-off of the lower row
    quarter = n // 4
    log_y = np.concatenate(
        (
            rng.uniform(-200.0, 120.0, 2 * quarter),
            top[2 * quarter : 3 * quarter] - np.exp(rng.uniform(-60.0, 2.0, quarter)),
            top[3 * quarter :] + rng.choice([0.0, 1e-300, 1e-3], n - 3 * quarter),
        )
    )
    f, df = _evaluate(table, theta, log_y, row, weight)
    u = table.solve(sigma, log_y)
    want = np.where(np.isfinite(u), np.exp(np.minimum(theta - u, 700.0)), 0.0)
    np.testing.assert_allclose(f, want, rtol=1e-9, atol=0.0)  # 1e-10 in u: rounding at c ≈ 40
    assert (df <= 0.0).all()
    # the slope against a difference on either side (the table is linear between its
    # columns: at a column the two sides differ), where the rate is smooth at that scale
    # (for freshness, away from the cut-off: within a gap g of it the rate curves on the
    # scale of g)
    h = 1e-8
    up, _ = _evaluate(table, theta, log_y + h, row, weight)
    down, _ = _evaluate(table, theta, log_y - h, row, weight)
    smooth = (f > 1e-200) & (np.abs(up - down) < 1e-3 * f)
    if name == "optimal":
        smooth &= top - log_y > 1e-3
    forward, backward = (up - f) / h, (f - down) / h
    close = np.isclose(df, forward, rtol=1e-5) | np.isclose(df, backward, rtol=1e-5)
    assert close[smooth].mean() > 0.9999


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 80),
    seed=st.integers(0, 100_000),
    budget=st.floats(0.005, 80.0),
    name=st.sampled_from(["optimal", "optimal-age"]),
    weighted=st.sampled_from([None, "some", "zeros"]),
    certain=st.booleans(),
)
def test_every_page_takes_what_its_hosts_multiplier_gives_it(
    n: int, seed: int, budget: float, name: str, weighted: str | None, certain: bool
) -> None:
    # The optimality conditions of the expected-value problem, read off the table's
    # definition: each valued page's rate is the one at its host's multiplier (the global one
    # below the cap), to 1e-6, or, on a cliff of Σf, one between those at μ·(1 ± 1e-7).
    rng = np.random.default_rng(seed)
    theta = rng.normal(-2.0, 2.0, n)
    sd = np.zeros(n) if certain else rng.uniform(0.0, 3.0, n)
    hosts = rng.integers(0, 5, n)
    caps = rng.choice([0.0, 0.05, 0.5, 5.0, np.inf], 5)
    weights = None
    if weighted is not None:
        weights = np.exp(rng.normal(0.0, 0.7, n))
        if weighted == "zeros":
            weights[rng.random(n) < 0.3] = 0.0
    a = policies.solve_expected(
        name, theta, sd, budget, weights=weights, hosts=hosts, host_caps=caps
    )
    f = np.asarray(a.rates)
    valued = np.ones(n, bool) if weights is None else weights > 0.0
    if valued.any():
        more = _implied(name, a, theta, sd, weights, hosts, scale=1.0 - 1e-7)
        less = _implied(name, a, theta, sd, weights, hosts, scale=1.0 + 1e-7)
        slack = 1e-12 * budget
        assert (f[valued] <= more[valued] * (1.0 + 1e-6) + slack).all()
        assert (f[valued] >= less[valued] * (1.0 - 1e-6) - slack).all()
    per_host = np.bincount(hosts, f, minlength=5)
    assert (per_host <= caps * (1.0 + 1e-9) + 1e-300).all()
    assert f.sum() + a.unplaced == pytest.approx(budget, rel=1e-9)
    room = float(caps[np.bincount(hosts, minlength=5) > 0].sum())
    assert a.unplaced == pytest.approx(max(budget - room, 0.0), abs=1e-9 * budget)
    if not valued.any():  # nothing to solve: no multipliers
        return
    assert a.capped_hosts is not None and a.host_multipliers is not None
    capped = a.capped_hosts & (np.bincount(hosts, valued, minlength=5) > 0)
    np.testing.assert_allclose(per_host[capped], caps[capped], rtol=1e-9)
    assert (a.host_multipliers >= a.multiplier * (1.0 - 1e-12)).all()


def test_budget_the_caps_leave_goes_to_the_weightless_pages_as_in_the_plug_in_solve() -> None:
    theta = np.log(np.array([0.1, 0.2, 0.3, 0.1, 0.1]))
    hosts = np.array([0, 0, 1, 2, 2])
    caps = np.array([0.1, 0.2, 1.0])
    weights = np.array([1.0, 1.0, 1.0, 0.0, 0.0])  # host 2 holds only weightless pages
    a = policies.solve_expected(
        "optimal", theta, 0.5, 2.0, weights=weights, hosts=hosts, host_caps=caps
    )
    plug = policies.solve(
        "optimal", np.exp(theta), 2.0, weights=weights, hosts=hosts, host_caps=caps
    )
    assert a.rates[3:] == pytest.approx([0.5, 0.5])  # host 2's room, shared
    assert a.unplaced == pytest.approx(plug.unplaced) == pytest.approx(2.0 - 1.3)
    np.testing.assert_allclose(a.rates[3:], plug.rates[3:])


@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_a_large_page_set_starts_from_its_cells_and_meets_the_same_conditions(name: str) -> None:
    rng = np.random.default_rng(11)
    n = 150_000  # over the size from which the first guess comes from cells
    theta = rng.normal(np.log(1 / 86_400), 2.0, n)
    sd = rng.uniform(0.05, 2.0, n)
    hosts = (1500 * rng.random(n) ** 4).astype(np.intp)
    caps = np.where(np.arange(1500) < 100, 0.002, np.inf)
    budget = n / 86_400
    a = policies.solve_expected(name, theta, sd, budget, hosts=hosts, host_caps=caps)
    f = np.asarray(a.rates)
    more = _implied(name, a, theta, sd, None, hosts, scale=1.0 - 1e-7)
    less = _implied(name, a, theta, sd, None, hosts, scale=1.0 + 1e-7)
    assert (f <= more * (1.0 + 1e-6) + 1e-15).all()
    assert (f >= less * (1.0 - 1e-6) - 1e-15).all()
    assert f.sum() == pytest.approx(budget, rel=1e-12)
    assert a.capped_hosts is not None and a.capped_hosts.sum() > 50


@pytest.mark.parametrize("name", ["optimal", "optimal-age"])
def test_a_hint_from_another_budget_changes_only_where_the_search_starts(name: str) -> None:
    rng = np.random.default_rng(5)
    n = 20_000
    theta = rng.normal(np.log(1 / 3600), 1.5, n)
    sd = rng.uniform(0.1, 1.5, n)
    hosts = (300 * rng.random(n) ** 3).astype(np.intp)
    caps = np.where(np.arange(300) < 40, 0.01, np.inf)
    args = (name, theta, sd)
    kwargs = {"hosts": hosts, "host_caps": caps}
    other = policies.solve_expected(*args, 2.0, **kwargs)
    plain = policies.solve_expected(*args, 2.3, **kwargs)
    hinted = policies.solve_expected(*args, 2.3, hint=other, **kwargs)
    assert hinted.multiplier == pytest.approx(plain.multiplier, rel=1e-7)
    assert hinted.rates.sum() == pytest.approx(2.3, rel=1e-12)
    f, g = np.asarray(plain.rates), np.asarray(hinted.rates)
    assert np.isclose(f, g, rtol=1e-6, atol=1e-12 * f.max()).mean() > 0.999
    assert plain.capped_hosts is not None and hinted.capped_hosts is not None
    assert (plain.capped_hosts == hinted.capped_hosts).all()
