"""The probability that a page never changes."""

from __future__ import annotations

import numpy as np
import pytest

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
