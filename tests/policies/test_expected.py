"""The expected-value allocation under log-normal posteriors on the rates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refresher import policies


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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    budget=st.floats(0.01, 50.0),
    name=st.sampled_from(["optimal", "optimal-age"]),
)
def test_the_expected_allocation_spends_the_budget_within_the_caps(
    n: int, seed: int, budget: float, name: str
) -> None:
    rng = np.random.default_rng(seed)
    theta = rng.normal(-2.0, 2.0, n)
    sd = rng.uniform(0.0, 3.0, n)
    hosts = rng.integers(0, 4, n)
    caps = rng.choice([0.05, 0.5, 5.0, np.inf], 4)
    a = policies.solve_expected(name, theta, sd, budget, hosts=hosts, host_caps=caps)
    per_host = np.bincount(hosts, a.rates, minlength=4)
    assert (a.rates >= 0).all()
    assert (per_host <= caps * (1 + 1e-9) + 1e-12).all()
    room = float(caps[np.bincount(hosts, minlength=4) > 0].sum())
    assert a.rates.sum() + a.unplaced == pytest.approx(budget, rel=1e-9)
    assert a.unplaced == pytest.approx(max(budget - room, 0.0), abs=1e-9 * budget)


def test_expected_freshness_is_the_posterior_mean_not_the_value_at_the_estimate() -> None:
    # A page fetched every second with ln λ ~ N(0, 1): a Monte Carlo mean over the posterior.
    rng = np.random.default_rng(0)
    lam = np.exp(rng.normal(0.0, 1.0, 200_000))
    mc = float(policies.freshness(lam, 1.0).mean())
    assert policies.expected_value("freshness", 0.0, 1.0, 1.0) == pytest.approx(mc, abs=3e-3)
    assert policies.expected_value("freshness", 0.0, 0.0, 1.0) == pytest.approx(
        float(policies.freshness(1.0, 1.0)), rel=1e-12
    )
