"""The probability that a page never changes."""

from __future__ import annotations

import numpy as np
import pytest

from refresher.refresh._static import static_probability


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
