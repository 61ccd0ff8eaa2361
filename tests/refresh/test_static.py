"""The probability that a page never changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher.refresh import _static
from refresher.refresh._static import static_of_pages, static_probability


def test_on_a_mostly_static_web_the_share_and_the_quiet_pages_are_found() -> None:
    rng = np.random.default_rng(5)
    n, k = 400, 20  # pages, fetches every 10 s
    static = rng.random(n) < 0.8
    lam = np.where(static, 0.0, np.exp(rng.normal(np.log(0.05), 0.5, n)))
    page = np.repeat(np.arange(n), k)
    t = np.full(n * k, 10.0)
    changed = rng.random(n * k) < -np.expm1(-lam[page] * t)
    p0, share = static_probability(
        page, t, changed, n + 1, prior_mean=np.full(n + 1, np.log(0.05)), sd=1.0
    )
    assert share == pytest.approx(static.mean(), abs=0.03)
    assert (p0[:n][~static] < 0.05).mean() > 0.95
    assert (p0[:n][static] > 0.9).all()
    assert p0[n] == pytest.approx(share)  # never fetched: the share


def test_without_observations_nothing_is_called_static() -> None:
    p0, share = static_probability(
        np.zeros(0, np.intp), np.zeros(0), np.zeros(0, bool), 3, prior_mean=np.zeros(3), sd=2.0
    )
    assert share == 0.0 and (p0 == 0).all()


def test_many_quiet_pages_read_a_table_that_agrees_with_the_sum_over_the_prior() -> None:
    rng = np.random.default_rng(8)
    n = 200_000  # quiet pages over a range of ln(λ·T) short enough for a table
    mean = rng.normal(np.log(1 / 86_400), 1.0, n)
    exposure = rng.uniform(600.0, 600_000.0, n)
    sd = 1.7
    likely = _static._quiet_likelihood(mean, exposure, sd)
    x, w = np.polynomial.hermite.hermgauss(24)
    lam = np.exp(mean[:, None] + sd * np.sqrt(2.0) * x[None, :])
    direct = np.exp(-lam * exposure[:, None]) @ (w / np.sqrt(np.pi))
    tiny = direct < 1e-300
    np.testing.assert_allclose(likely[~tiny], direct[~tiny], rtol=1e-7)
    changed = rng.random(n) < 0.5  # and P₀ through it: by the table and page by page
    p0, share = static_of_pages(exposure, changed, mean, sd)
    post = share / (share + (1.0 - share) * direct)
    np.testing.assert_allclose(p0[~changed], post[~changed], rtol=0, atol=1e-9)


def _log_likelihood(share: float, likely: np.ndarray, n_changed: int) -> float:
    return float(np.log(share + (1.0 - share) * likely).sum() + n_changed * np.log1p(-share))


def _share_of(likely: np.ndarray, n_changed: int) -> tuple[np.ndarray, float]:
    """static_of_pages over quiet pages whose likelihood L is ``likely`` and ``n_changed``
    pages that changed."""
    quiet = likely.size
    exposure = np.ones(quiet + n_changed)
    changed = np.arange(quiet + n_changed) >= quiet
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_static, "_quiet_likelihood", lambda mean, exposure, sd: likely)
        return static_of_pages(exposure, changed, np.zeros(exposure.size), 1.0)


@settings(max_examples=60, deadline=None)
@given(
    quiet=st.integers(1, 300),
    changed=st.integers(0, 300),
    power=st.floats(0.2, 6.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_share_maximises_the_likelihood_of_what_was_seen(
    quiet: int, changed: int, power: float, seed: int
) -> None:
    likely = np.random.default_rng(seed).random(quiet) ** power
    p0, share = _share_of(likely, changed)
    assert 0.0 <= share <= _static._MAX_SHARE
    best = _log_likelihood(share, likely, changed)
    # no share on a fine grid, nor a step of 1e-6 either way, is more likely
    grid = np.concatenate((np.linspace(0.0, _static._MAX_SHARE, 201), [share - 1e-6, share + 1e-6]))
    grid = grid[(grid >= 0.0) & (grid <= _static._MAX_SHARE)]
    assert all(_log_likelihood(s, likely, changed) <= best + 1e-9 for s in grid)
    if share > 0.0:
        np.testing.assert_allclose(p0[:quiet], share / (share + (1.0 - share) * likely))
    assert (p0[quiet:] == 0.0).all()


def test_the_share_is_the_likelihoods_maximum_where_em_had_not_reached_it() -> None:
    # few static pages among pages that were likely to stay quiet anyway: EM's share moves
    # by ever smaller steps, and 100 rounds from 0.5 stopped at 1.2 % where the maximum is
    # at 0.2 %
    likely = np.random.default_rng(3).uniform(0.3, 1.0, 20_000)
    n_seen = (1.0 / (0.002 + 0.998 * likely)).sum()  # quiet and changed pages
    _, share = _share_of(likely, round(n_seen) - likely.size)
    assert share == pytest.approx(0.002, rel=0.05)
    best = _log_likelihood(share, likely, round(n_seen) - likely.size)
    assert best > _log_likelihood(0.0117, likely, round(n_seen) - likely.size)


def test_the_share_stays_at_zero_or_its_cap_when_the_likelihood_keeps_rising_there() -> None:
    p0, share = _share_of(np.array([0.9, 0.95, 0.99]), 7)  # many changed pages: none static
    assert share == 0.0 and (p0 == 0.0).all()
    assert _share_of(np.array([1e-9, 1e-12]), 0)[1] == _static._MAX_SHARE
    p0, share = static_of_pages(np.array([10.0, 10.0]), np.array([True, True]), np.zeros(2), 1.0)
    assert share == 0.0 and (p0 == 0.0).all()
