"""The prior's spread of ln λ, fitted to what the pages showed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refresher.refresh._spread import SAMPLE, SpreadEvidence, fit_spread, sample

CENTRE = math.log(1 / 600)  # one change in ten minutes


def regular_pages(
    n: int, sd: float, *, seed: int, intervals: int = 8, every: float = 600.0, offset: float = 0.0
) -> SpreadEvidence:
    """``n`` pages with ln λ ~ N(CENTRE, sd²), each fetched ``intervals`` times ``every``
    seconds apart (no change times); their prior mean is CENTRE + ``offset``."""
    rng = np.random.default_rng(seed)
    lam = np.exp(rng.normal(CENTRE, sd, n))
    changes = rng.binomial(intervals, -np.expm1(-lam * every)).astype(np.float64)
    return SpreadEvidence(
        quiet=(intervals - changes) * every,
        timed=np.zeros(n),
        t0=np.full(n, every),
        w0=changes,
        t1=np.full(n, every),
        w1=np.zeros(n),
        changed=changes > 0,
        mean=np.full(n, CENTRE + offset),
    )


@pytest.mark.parametrize(("truth", "low", "high"), [(0.5, 0.35, 0.75), (2.5, 1.9, 3.4)])
def test_the_spread_the_pages_show_is_found(truth: float, low: float, high: float) -> None:
    fitted = fit_spread(regular_pages(3000, truth, seed=1), spread=2.0)
    assert low <= fitted <= high, fitted


def test_where_the_centres_lie_does_not_change_the_spread() -> None:
    exact = fit_spread(regular_pages(2000, 1.0, seed=2), spread=2.0)
    shifted = fit_spread(regular_pages(2000, 1.0, seed=2, offset=2.5), spread=2.0)
    assert shifted == exact


@pytest.mark.parametrize("spread", [0.7, 2.0, 3.0])
def test_while_no_page_has_changed_the_configured_spread_stands(spread: float) -> None:
    quiet = regular_pages(500, 1.0, seed=3, intervals=1, every=5.0)
    quiet = SpreadEvidence(
        **{name: getattr(quiet, name) for name in SpreadEvidence.__slots__}
        | {"w0": np.zeros(500), "changed": np.zeros(500, bool), "quiet": np.full(500, 5.0)}
    )
    assert fit_spread(quiet, spread=spread) == pytest.approx(spread, rel=0.1)
    if spread == 2.0:  # on the grid: the configured value itself, no float off it
        assert fit_spread(quiet, spread=spread) == spread


def test_a_few_pages_move_the_spread_less_than_many() -> None:
    few = fit_spread(regular_pages(40, 0.4, seed=4), spread=2.0)
    many = fit_spread(regular_pages(3000, 0.4, seed=4), spread=2.0)
    assert many < few <= 2.0


def test_pages_that_never_change_do_not_widen_the_changing_ones() -> None:
    # half the pages are static: seen as the quiet ones that a spread of 0.5 cannot explain
    changing = regular_pages(1500, 0.5, seed=5)
    static = regular_pages(1500, 0.5, seed=6)
    zero = np.zeros(1500)
    both = SpreadEvidence(
        quiet=np.r_[changing.quiet, np.full(1500, 8 * 600.0)],
        timed=np.r_[changing.timed, zero],
        t0=np.r_[changing.t0, static.t0],
        w0=np.r_[changing.w0, zero],
        t1=np.r_[changing.t1, static.t1],
        w1=np.r_[changing.w1, zero],
        changed=np.r_[changing.changed, np.zeros(1500, bool)],
        mean=np.r_[changing.mean, static.mean],
    )
    assert fit_spread(both, spread=2.0, static_share=0.5) <= 0.75
    assert fit_spread(both, spread=2.0, static_share=0.0) > 1.0  # as if they were slow


def test_without_pages_or_with_a_bad_spread() -> None:
    empty = regular_pages(0, 1.0, seed=7)
    assert fit_spread(empty, spread=1.5) == 1.5
    with pytest.raises(ValueError, match="spread must be > 0"):
        fit_spread(regular_pages(10, 1.0, seed=7), spread=0.0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    sd=st.floats(0.1, 5.0),
    seed=st.integers(0, 1000),
    intervals=st.integers(1, 20),
    share=st.floats(0.0, 0.99),
)
def test_the_fit_is_always_a_spread_between_a_quarter_and_four(
    n: int, sd: float, seed: int, intervals: int, share: float
) -> None:
    fitted = fit_spread(
        regular_pages(n, sd, seed=seed, intervals=intervals), spread=2.0, static_share=share
    )
    assert 0.25 - 1e-9 <= fitted <= 4.0 + 1e-9


def test_a_large_web_is_judged_on_an_even_sample_of_its_pages() -> None:
    pages = np.arange(10, 1_000_010, dtype=np.intp)
    picked = sample(pages)
    assert picked.size == SAMPLE
    assert picked[0] == pages[0] and picked[-1] == pages[-1]
    gaps = np.diff(picked)
    assert gaps.min() >= 244 and gaps.max() <= 245  # evenly spaced
    few = np.arange(5, dtype=np.intp)
    assert sample(few) is few
