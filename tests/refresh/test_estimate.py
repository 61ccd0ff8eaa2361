"""Change-rate estimation on simulated Poisson histories (deterministic seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from refresher.refresh._estimate import (
    Estimate,
    LogNormalPrior,
    Method,
    Prior,
    estimate_from_last_modified,
    estimate_irregular,
    estimate_log_normal,
    estimate_pages,
    estimate_regular,
    host_prior,
    last_modified_consistent,
    log_normal_host_prior,
)

HOUR = 3600.0
FETCHES = 50
PAGES = 4000


def no_prior(pages: int) -> Prior:
    return Prior(changes=np.zeros(pages), exposure=np.zeros(pages))


def history(
    rate: float | NDArray[np.float64],
    *,
    pages: int = PAGES,
    fetches: int = FETCHES,
    interval: float = HOUR,
    kind: str = "regular",
    seed: int = 1,
) -> tuple[NDArray[np.intp], NDArray[np.float64], NDArray[np.bool_], NDArray[np.float64]]:
    """Observations of pages changing as Poisson processes: (page, interval s, changed,
    seconds from the last change to the fetch — NaN where nothing changed)."""
    rng = np.random.default_rng(seed)
    shape = (pages, fetches)
    if kind == "regular":
        t = np.full(shape, interval)
    elif kind == "jittered":
        t = rng.uniform(0.5 * interval, 1.5 * interval, shape)
    else:  # "exponential": a very irregular schedule
        t = np.maximum(rng.exponential(interval, shape), 1e-3 * interval)
    lam = np.broadcast_to(np.asarray(rate, np.float64).reshape(-1, 1), shape)
    p_change = -np.expm1(-lam * t)
    changed = rng.random(shape) < p_change
    # given a change in (0, t], the time back from t to the last one is Exp(λ) cut at t
    u = rng.random(shape)
    since = -np.log1p(-u * p_change) / lam
    since = np.where(changed, since, np.nan)
    page = np.repeat(np.arange(pages), fetches)
    return page, t.ravel(), changed.ravel(), since.ravel()


def bias(estimate: Estimate | NDArray[np.float64], rate: float) -> float:
    values = estimate.rate if isinstance(estimate, Estimate) else estimate
    return float(values.mean() / rate - 1.0)


# --- regular intervals ----------------------------------------------------------------------


@pytest.mark.parametrize("lam_i", [0.1, 0.5, 1.0, 2.0, 3.0])
def test_chos_estimator_is_within_five_percent_at_fifty_regular_fetches_and_beats_the_naive_one(
    lam_i: float,
) -> None:
    rate = lam_i / HOUR
    page, _, changed, _ = history(rate)
    x = np.bincount(page, changed, minlength=PAGES)
    estimate = estimate_regular(FETCHES, x, HOUR)
    naive = x / (FETCHES * HOUR)
    assert abs(bias(estimate, rate)) < 0.05
    assert abs(bias(naive, rate)) > 2.0 * abs(bias(estimate, rate))
    if lam_i >= 0.5:
        assert bias(naive, rate) < -0.2  # several changes in one interval look like one


def test_chos_estimator_is_finite_when_every_fetch_changed() -> None:
    estimate = estimate_regular(50, 50, HOUR)
    assert math.isclose(estimate.rate[0], math.log(101.0) / HOUR)
    assert estimate.upper[0] == math.inf
    assert estimate.lower[0] > 0.0


def test_chos_estimator_gives_zero_and_a_finite_bound_when_nothing_changed() -> None:
    estimate = estimate_regular(50, 0, HOUR)
    assert estimate.rate[0] == 0.0 and estimate.n_eff[0] == 0.0
    assert 0.0 < estimate.upper[0] < 0.2 / HOUR


def test_the_effective_n_of_regular_fetches_counts_changes_seen_in_short_intervals() -> None:
    estimate = estimate_regular(1000, 10, HOUR)  # λI ≈ 0.01: every change is seen
    assert estimate.n_eff[0] == pytest.approx(10.0, rel=0.01)
    assert estimate.method.tolist() == [Method.REGULAR]


# --- irregular intervals --------------------------------------------------------------------


@pytest.mark.parametrize("lam_i", [0.1, 0.5, 1.0, 2.0, 3.0])
def test_the_irregular_estimate_is_within_five_percent_at_fifty_jittered_fetches(
    lam_i: float,
) -> None:
    rate = lam_i / HOUR
    page, t, changed, _ = history(rate, kind="jittered", seed=2)
    estimate = estimate_irregular(page, t, changed, PAGES, prior=no_prior(PAGES))
    assert abs(bias(estimate, rate)) < 0.05
    naive = np.bincount(page, changed, minlength=PAGES) / np.bincount(page, t, minlength=PAGES)
    assert abs(bias(naive, rate)) > 2.0 * abs(bias(estimate, rate))


def test_the_irregular_estimate_is_chos_estimator_when_the_intervals_are_regular() -> None:
    page, t, changed, _ = history(1.0 / HOUR, pages=200, seed=3)
    irregular = estimate_irregular(page, t, changed, 200, prior=no_prior(200))
    regular = estimate_regular(FETCHES, np.bincount(page, changed, minlength=200), HOUR)
    np.testing.assert_allclose(irregular.rate, regular.rate, rtol=1e-10)


@pytest.mark.parametrize("kind", ["jittered", "exponential"])
def test_the_irregular_estimate_recovers_the_rate_within_its_confidence_interval(
    kind: str,
) -> None:
    rng = np.random.default_rng(4)
    rates = np.exp(rng.uniform(np.log(0.05), np.log(3.0), PAGES)) / HOUR
    page, t, changed, _ = history(rates, kind=kind, seed=5)
    estimate = estimate_irregular(page, t, changed, PAGES, prior=no_prior(PAGES))
    covered = (estimate.lower <= rates) & (rates <= estimate.upper)
    assert 0.92 <= covered.mean() <= 0.98  # it claims 95 %
    narrower = estimate_irregular(page, t, changed, PAGES, prior=no_prior(PAGES), confidence=0.5)
    assert 0.42 <= ((narrower.lower <= rates) & (rates <= narrower.upper)).mean() <= 0.58


def test_a_page_that_never_changed_gets_a_small_rate_not_zero() -> None:
    # page 0 never changed; the others change about once an hour
    page, t, changed, _ = history(1.0 / HOUR, pages=20, seed=6)
    changed = np.where(page == 0, False, changed)
    estimate = estimate_irregular(page, t, changed, 20)
    assert 0.0 < estimate.rate[0] < 0.05 / HOUR
    assert estimate.upper[0] < 0.2 / HOUR


def test_a_page_that_always_changed_gets_a_finite_rate() -> None:
    page = np.zeros(30, np.intp)
    estimate = estimate_irregular(page, np.full(30, HOUR), np.ones(30, bool), 1, prior=no_prior(1))
    assert math.isclose(estimate.rate[0], math.log(61.0) / HOUR, rel_tol=1e-9)


def test_a_page_without_history_gets_its_prior() -> None:
    prior = Prior.from_rate([2.0 / HOUR, 3.0 / HOUR], strength=4.0)
    estimate = estimate_irregular(np.array([1]), np.array([HOUR]), np.array([True]), 2, prior=prior)
    assert estimate.method.tolist() == [Method.PRIOR, Method.IRREGULAR]
    assert math.isclose(estimate.rate[0], 2.0 / HOUR)
    assert estimate.n_eff[0] == 4.0
    assert estimate.fetches.tolist() == [0, 1]


def test_evidence_moves_a_page_from_its_prior_to_its_own_rate() -> None:
    true_rate, prior_rate = 2.0 / HOUR, 0.2 / HOUR
    prior = Prior.from_rate(prior_rate, strength=2.0, pages=1)
    estimates = []
    for fetches in (1, 10, 100, 1000):
        page, t, changed, _ = history(true_rate, pages=1, fetches=fetches, seed=7)
        estimates.append(estimate_irregular(page, t, changed, 1, prior=prior))
    errors = [abs(math.log(e.rate[0] / true_rate)) for e in estimates]
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 0.1
    assert [e.n_eff[0] for e in estimates] == sorted(e.n_eff[0] for e in estimates)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1.0, 1e5), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 29),
)
def test_one_more_change_never_lowers_the_estimate_and_the_interval_holds_it(
    observations: list[tuple[float, bool]], flip: int
) -> None:
    t = np.array([o[0] for o in observations])
    changed = np.array([o[1] for o in observations])
    more = changed.copy()
    more[flip % t.size] = True
    page = np.zeros(t.size, np.intp)
    prior = Prior.from_rate(1.0 / HOUR, strength=0.5, pages=1)
    before = estimate_irregular(page, t, changed, 1, prior=prior)
    after = estimate_irregular(page, t, more, 1, prior=prior)
    assert after.rate[0] >= before.rate[0] * (1.0 - 1e-12)
    for e in (before, after):
        assert e.lower[0] <= e.rate[0] <= e.upper[0]
        assert 0.0 < e.rate[0] < math.inf


# --- priors pooled per host ---------------------------------------------------------------


def test_host_prior_pools_each_host_and_falls_back_to_the_global_rate() -> None:
    # host 0 changes hourly, host 1 daily; host 2 has a page but no history yet
    rates = np.array([1.0] * 10 + [1.0 / 24.0] * 10 + [1.0]) / HOUR
    page_host = np.array([0] * 10 + [1] * 10 + [2])
    page, t, changed, _ = history(rates, pages=21, fetches=40, kind="jittered", seed=8)
    keep = page < 20
    prior = host_prior(page[keep], t[keep], changed[keep], page_host, 3)
    assert prior.rate[:10] == pytest.approx(np.full(10, 1.0 / HOUR), rel=0.2)
    assert prior.rate[10:20] == pytest.approx(np.full(10, 1.0 / 24.0 / HOUR), rel=0.3)
    assert prior.rate[10] < prior.rate[20] < prior.rate[0]  # the global rate lies between
    assert (prior.changes == 1.0).all()


def test_a_new_page_is_neither_starved_nor_over_fetched() -> None:
    # a new page on the hourly host starts from its host's rate, not 0 and not the fast mean
    rates = np.array([1.0] * 5 + [20.0] * 5) / HOUR
    page_host = np.array([0] * 5 + [1] * 5 + [0])
    page, t, changed, _ = history(rates, pages=10, fetches=60, kind="jittered", seed=9)
    estimate = estimate_pages(page, t, changed, 11, page_host=page_host, n_hosts=2)
    assert estimate.method[10] == Method.PRIOR
    assert estimate.rate[10] == pytest.approx(1.0 / HOUR, rel=0.25)


# --- Last-Modified --------------------------------------------------------------------------


def test_last_modified_change_times_give_a_sharper_nearly_unbiased_estimate() -> None:
    rate = 2.0 / HOUR  # λI = 2: most intervals hide more than one change
    page, t, changed, since = history(rate, kind="jittered", seed=10)
    lm = estimate_from_last_modified(page, t, changed, since, PAGES, prior=no_prior(PAGES))
    irregular = estimate_irregular(page, t, changed, PAGES, prior=no_prior(PAGES))
    assert abs(bias(lm, rate)) < 0.05
    assert lm.method.tolist() == [Method.LAST_MODIFIED] * PAGES
    # at λI = 2 a changed interval carries ~0.7 of a change's information; a known time, 1
    assert np.median(lm.n_eff) > 1.3 * np.median(irregular.n_eff)
    assert lm.rate.std() < 0.9 * irregular.rate.std()
    covered = (lm.lower <= rate) & (rate <= lm.upper)
    assert 0.92 <= covered.mean() <= 0.98


def _observation_times(
    changed: list[bool], modified: list[float]
) -> tuple[NDArray[np.float64], ...]:
    """Fetches an hour apart; ``modified`` is each fetch's Last-Modified, the first included."""
    times = HOUR * np.arange(len(modified), dtype=np.float64)
    lm = np.array(modified)
    return times[1:], times[:-1], lm[1:], lm[:-1], np.array(changed)


@pytest.mark.parametrize(
    ("what", "changed", "modified", "trusted"),
    [
        ("consistent", [True, False, True], [-10.0, 1800.0, 1800.0, 9000.0], True),
        ("in the future", [True, False], [-10.0, 4000.0, 4000.0], False),
        ("moved without the content", [False, True], [-10.0, 100.0, 5000.0], False),
        ("content moved alone", [True, True], [-10.0, -10.0, 5000.0], False),
        # HTTP dates have whole seconds: changes just before and just after the fetch at 0
        ("two changes in the second of a fetch", [True, True], [0.0, 0.0, 5000.0], True),
        ("a date unmoved a second before the fetch", [True, True], [-1.0, -1.0, 5000.0], False),
        ("missing", [True, True], [-10.0, math.nan, 5000.0], False),
        ("older than the last fetch", [True, True], [-10.0, 1000.0, 2000.0], False),
        ("never changed", [False, False], [-10.0, -10.0, -10.0], False),
    ],
)
def test_a_hosts_last_modified_is_trusted_only_when_it_moves_with_the_content_and_not_ahead(
    what: str, changed: list[bool], modified: list[float], trusted: bool
) -> None:
    now, before, lm, lm_before, c = _observation_times(changed, modified)
    hosts = np.zeros(c.size, np.intp)
    result = last_modified_consistent(hosts, now, before, lm, lm_before, c, 2)
    assert result.tolist() == [trusted, False], what  # host 1 has no observations


def test_estimate_pages_uses_last_modified_only_on_trusted_hosts() -> None:
    rates = np.full(6, 2.0 / HOUR)
    page, t, changed, since = history(rates, pages=6, fetches=80, kind="jittered", seed=11)
    page_host = np.array([0, 0, 0, 1, 1, 1, 1])  # page 6: no history yet
    estimate = estimate_pages(
        page,
        t,
        changed,
        7,
        page_host=page_host,
        n_hosts=2,
        since_change=since,
        trusted_hosts=np.array([True, False]),
    )
    assert estimate.method.tolist() == [Method.LAST_MODIFIED] * 3 + [Method.IRREGULAR] * 3 + [
        Method.PRIOR
    ]
    assert (estimate.lower[:6] < rates).sum() >= 5 and (rates < estimate.upper[:6]).sum() >= 5


# --- the log-normal prior -------------------------------------------------------------------


@pytest.mark.parametrize("lam_i", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("kind", ["jittered", "exponential"])
def test_the_log_normal_estimate_finds_the_rate_from_a_prior_ten_times_off(
    lam_i: float, kind: str
) -> None:
    rate = lam_i / HOUR
    page, t, changed, since = history(rate, kind=kind, seed=20)
    prior = LogNormalPrior(mean=np.full(PAGES, math.log(rate / 10.0)), sd=2.0)
    plain = estimate_log_normal(page, t, changed, PAGES, prior=prior)
    timed = estimate_log_normal(page, t, changed, PAGES, prior=prior, since_change=since)
    # The MAP of ln λ: its median, not its mean, is the one to hold to the truth. At λI = 0.1
    # fifty fetches see five changes, and the prior still holds back a tenth of ln 10.
    tolerance = 0.06 if lam_i > 0.1 else 0.2
    assert float(np.median(plain.rate)) == pytest.approx(rate, rel=tolerance)
    assert float(np.median(timed.rate)) == pytest.approx(rate, rel=tolerance)
    assert plain.method.tolist() == [Method.IRREGULAR] * PAGES
    saw_change = np.bincount(page, changed, minlength=PAGES) > 0
    assert ((timed.method == Method.LAST_MODIFIED) == saw_change).all()
    assert np.median(timed.n_eff) >= np.median(plain.n_eff)  # known times carry more


def test_the_log_normal_iteration_lands_on_the_same_estimate_from_any_start() -> None:
    rates = np.exp(np.random.default_rng(27).uniform(math.log(0.01), math.log(30.0), 500)) / HOUR
    page, t, changed, since = history(rates, pages=500, fetches=10, kind="exponential", seed=28)
    prior = LogNormalPrior(mean=np.full(500, math.log(1.0 / HOUR)))
    results = [
        estimate_log_normal(page, t, changed, 500, prior=prior, since_change=s, start=start)
        for s in (None, since)
        for start in (None, rates * 1e4, rates * 1e-6)
    ]
    for got in results[1:3]:
        np.testing.assert_allclose(got.rate, results[0].rate, rtol=1e-8)
    for got in results[4:]:
        np.testing.assert_allclose(got.rate, results[3].rate, rtol=1e-8)


def test_the_log_normal_interval_covers_rates_drawn_from_the_prior() -> None:
    rng = np.random.default_rng(21)
    centre = math.log(1.0 / HOUR)
    rates = np.exp(rng.normal(centre, 1.0, PAGES))
    page, t, changed, _ = history(rates, fetches=20, kind="jittered", seed=22)
    prior = LogNormalPrior(mean=np.full(PAGES, centre), sd=1.0)
    estimate = estimate_log_normal(page, t, changed, PAGES, prior=prior)
    covered = (estimate.lower <= rates) & (rates <= estimate.upper)
    assert 0.92 <= covered.mean() <= 0.98
    assert (estimate.lower < estimate.rate).all() and (estimate.rate < estimate.upper).all()


def test_a_page_fifty_times_faster_than_its_host_mates_is_not_dragged_down_to_their_rate() -> None:
    # The case that made us add the log-normal prior: a gamma prior of one pseudo-change at
    # the host's rate weighs as much as 1/rate seconds without a change.
    fast, slow = 50.0 / HOUR, 1.0 / HOUR
    rates = np.array([fast] + [slow] * 29)
    page, t, changed, since = history(rates, pages=30, fetches=12, interval=0.5 * HOUR, seed=23)
    host = np.zeros(30, np.intp)
    kwargs = {"page_host": host, "n_hosts": 1, "since_change": since, "trusted_hosts": [True]}
    log_normal = estimate_pages(page, t, changed, 30, **kwargs)  # type: ignore[arg-type]
    gamma = estimate_pages(page, t, changed, 30, model="gamma", **kwargs)  # type: ignore[arg-type]
    assert log_normal.rate[0] == pytest.approx(fast, rel=0.5)
    assert gamma.rate[0] < fast / 3
    assert float(np.median(log_normal.rate[1:])) == pytest.approx(slow, rel=0.5)


def test_a_page_that_changed_before_every_fetch_climbs_above_chos_bound() -> None:
    # Without change times, 12 changes in 12 hourly fetches cannot tell 5/h from 50/h; Cho's
    # estimator stops at ln(2n + 1)/I, which an allocation would take for a page worth
    # fetching often. Under a log-normal prior the estimate climbs past it, the more so the
    # longer the streak, and the interval stays open upwards.
    rates = np.array([50.0 / HOUR] + [0.2 / HOUR] * 29)
    host = np.zeros(30, np.intp)
    climbed = []
    for fetches in (6, 12, 24):
        page, t, changed, _ = history(rates, pages=30, fetches=fetches, seed=24)
        assert changed[page == 0].all()
        estimate = estimate_pages(page, t, changed, 30, page_host=host, n_hosts=1)
        assert estimate.rate[0] > math.log(2 * fetches + 1) / HOUR
        assert estimate.upper[0] > 2.0 * estimate.rate[0]
        climbed.append(estimate.rate[0])
    assert climbed == sorted(climbed)


def test_hosts_that_differ_keep_their_own_centre_and_a_host_without_history_the_global_one() -> (
    None
):
    rates = np.array([1.0] * 10 + [3.0] * 10) / HOUR
    page, t, changed, _ = history(rates, pages=20, fetches=30, kind="jittered", seed=25)
    page_host = np.array([0] * 10 + [1] * 10 + [2])
    prior = log_normal_host_prior(page, t, changed, page_host, 3)
    centres = np.exp(prior.mean)
    assert centres[:10] == pytest.approx(np.full(10, 1.0 / HOUR), rel=0.2)
    assert centres[10:20] == pytest.approx(np.full(10, 3.0 / HOUR), rel=0.2)
    assert centres[20] == pytest.approx(math.sqrt(3.0) / HOUR, rel=0.2)  # geometric mean


def test_hosts_alike_borrow_from_each_other() -> None:
    # every page has the same rate: a host seen through two pages is pulled to the rest
    rates = np.full(42, 1.0 / HOUR)
    page, t, changed, _ = history(rates, pages=42, fetches=8, kind="jittered", seed=26)
    page_host = np.repeat(np.arange(21), 2)
    own = log_normal_host_prior(page, t, changed, page_host, 21, host_strength=0.1)
    pooled = log_normal_host_prior(page, t, changed, page_host, 21)
    assert np.std(pooled.mean) < 0.5 * np.std(own.mean)


# --- input checks ---------------------------------------------------------------------------


def test_malformed_histories_are_refused_with_what_to_fix() -> None:
    one = np.zeros(1, np.intp)
    with pytest.raises(ValueError, match="intervals must be finite and > 0"):
        estimate_irregular(one, np.array([0.0]), np.array([True]), 1)
    with pytest.raises(ValueError, match=r"page_index must lie in \[0, 1\)"):
        estimate_irregular(one + 1, np.array([1.0]), np.array([True]), 1)
    with pytest.raises(ValueError, match="one entry per observation"):
        estimate_irregular(one, np.array([1.0, 2.0]), np.array([True]), 1)
    with pytest.raises(ValueError, match="no history and no prior"):
        estimate_irregular(np.zeros(0, np.intp), np.zeros(0), np.zeros(0, bool), 3)
    with pytest.raises(ValueError, match="since_change must be given"):
        estimate_from_last_modified(one, np.array([1.0]), np.array([True]), [math.nan], 1)
    with pytest.raises(ValueError, match="strength > 0"):
        Prior.from_rate(0.0)
    with pytest.raises(ValueError, match="model must be one of 'log-normal', 'gamma'"):
        estimate_pages(one, np.array([1.0]), np.array([True]), 1, model="beta")
    with pytest.raises(ValueError, match="pass model='gamma' with it"):
        estimate_pages(one, np.array([1.0]), np.array([True]), 1, prior=Prior.from_rate(1.0))
    with pytest.raises(ValueError, match="sd > 0"):
        LogNormalPrior(mean=np.zeros(1), sd=0.0)
    with pytest.raises(ValueError, match="since_change must be ≥ 0"):
        estimate_log_normal(
            one,
            np.array([1.0]),
            np.array([True]),
            1,
            prior=LogNormalPrior(mean=np.zeros(1)),
            since_change=[-1.0],
        )
    with pytest.raises(ValueError, match="needs observations"):
        log_normal_host_prior(np.zeros(0, np.intp), np.zeros(0), np.zeros(0, bool), [0], 1)


def test_with_the_mixture_pages_that_never_change_do_not_drag_the_changing_pages_centre_down() -> (
    None
):
    # 20 pages change hourly, 80 never: averaged over every page the centre falls 20-fold;
    # counted by their probability of changing, the quiet pages leave it near the changing ones.
    rates = np.array([1.0 / HOUR] * 20 + [1e-12] * 80)
    page, t, changed, _ = history(rates, pages=100, fetches=8, seed=31)
    host = np.zeros(100, np.intp)
    plain = estimate_pages(page, t, changed, 100, page_host=host, n_hosts=1)
    mixed = estimate_pages(page, t, changed, 100, page_host=host, n_hosts=1, mixture=True)
    assert plain.prior_mean is not None and mixed.prior_mean is not None
    assert math.exp(plain.prior_mean[0]) < 0.1 / HOUR
    assert math.exp(mixed.prior_mean[0]) > 0.3 / HOUR
    assert float(np.median(mixed.rate[:20])) == pytest.approx(1.0 / HOUR, rel=0.3)


def test_with_a_fitted_spread_pages_whose_rates_hardly_differ_are_told_apart_less() -> None:
    # 400 pages around one change an hour with sd 0.3 of ln λ, four hourly fetches each: a
    # prior of sd 2 reads the binomial noise of four intervals as rates far apart
    rng = np.random.default_rng(41)
    rates = np.exp(rng.normal(math.log(1.0 / HOUR), 0.3, 400))
    page, t, changed, _ = history(rates, pages=400, fetches=4, seed=41)
    host = np.zeros(400, np.intp)
    fixed = estimate_pages(page, t, changed, 400, page_host=host, n_hosts=1, mixture=True)
    fitted = estimate_pages(
        page, t, changed, 400, page_host=host, n_hosts=1, mixture=True, fit_spread=True
    )
    assert fixed.prior_sd == 2.0
    assert fitted.prior_sd is not None and fitted.prior_sd < 0.8
    error = {
        name: float(np.mean(np.log(est.rate / rates) ** 2))
        for name, est in (("fixed", fixed), ("fitted", fitted))
    }
    assert error["fitted"] < 0.5 * error["fixed"], error
    spread = {
        name: float(np.std(np.log(est.rate)))
        for name, est in (("fixed", fixed), ("fitted", fitted))
    }
    assert spread["fitted"] < 0.5 * spread["fixed"], spread


def test_a_page_whose_every_interval_changed_reaches_its_map_from_any_start() -> None:
    # its likelihood is flat above its intervals' rates, so Newton's steps are clipped to 4;
    # one landing exactly on the bracket's other end cycled between its ends for ever
    rng = np.random.default_rng(1)
    n, k = 20_000, 20
    t = np.exp(rng.uniform(math.log(100.0), math.log(10_000.0), (n, k))).ravel()
    page = np.repeat(np.arange(n), k)
    changed = np.ones(t.size, dtype=bool)
    prior = LogNormalPrior(mean=rng.uniform(-12.0, -7.0, n), sd=2.0)
    start = np.exp(rng.uniform(-10.0, 0.0, n))
    started = estimate_log_normal(page, t, changed, n, prior=prior, start=start)
    own = estimate_log_normal(page, t, changed, n, prior=prior)
    np.testing.assert_allclose(np.log(started.rate), np.log(own.rate), rtol=0, atol=1e-9)
