"""The probability that a page never changes."""

from __future__ import annotations

import numpy as np
import pytest

from refresher.refresh._static import WIDE_SHARE, static_probability


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


def quiet_pages(exposures: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One quiet interval per page, of the given lengths (seconds)."""
    n = exposures.size
    return np.arange(n), exposures.astype(np.float64), np.zeros(n, bool)


def test_a_wide_spread_mixed_in_keeps_a_fifth_of_its_odds_that_a_quiet_page_changes() -> None:
    # every page quiet: the share is pinned at its cap, so the odds compare L alone
    page, t, changed = quiet_pages(np.geomspace(10.0, 3000.0, 50))
    mean = np.full(50, np.log(0.05))
    narrow, _ = static_probability(page, t, changed, 50, prior_mean=mean, sd=0.7)
    wide, _ = static_probability(page, t, changed, 50, prior_mean=mean, sd=2.0)
    mixed, _ = static_probability(page, t, changed, 50, prior_mean=mean, sd=0.7, wide_sd=2.0)

    def odds(p0: np.ndarray) -> np.ndarray:
        return (1.0 - p0) / p0

    assert (odds(mixed) >= WIDE_SHARE * odds(wide) * (1 - 1e-9)).all()
    low, high = np.minimum(odds(narrow), odds(wide)), np.maximum(odds(narrow), odds(wide))
    assert ((odds(mixed) >= low * (1 - 1e-9)) & (odds(mixed) <= high * (1 + 1e-9))).all()
    long = t > 300.0  # quiet for minutes: sharper than the wide spread alone …
    assert (mixed[long] > wide[long]).all()
    longer = t > 1000.0  # … and far from as sure as the narrow one alone
    assert (odds(narrow)[longer] < 0.01 * odds(mixed)[longer]).all()


def test_a_wide_spread_that_is_not_wider_changes_nothing() -> None:
    page, t, changed = quiet_pages(np.geomspace(10.0, 3000.0, 20))
    mean = np.full(20, np.log(0.05))
    alone, _ = static_probability(page, t, changed, 20, prior_mean=mean, sd=1.0)
    for wide_sd in (1.0, 0.5):
        same, _ = static_probability(page, t, changed, 20, prior_mean=mean, sd=1.0, wide_sd=wide_sd)
        np.testing.assert_array_equal(same, alone)
