"""The estimate from per-page statistics against the estimate from the history it summarises.

The history-based reference below is the allocator's estimator as it read the observation
pairs before the statistics (the latest ``history`` pairs per page, host trust from the
Last-Modified test, the first copy's quiet time on trusted hosts, ``estimate_pages`` and
``static_probability``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from refresher.refresh._allocate import posterior_sd
from refresher.refresh._estimate import estimate_pages, last_modified_consistent
from refresher.refresh._estimate_stats import _newton, _Nodes, estimate_statistics, two_point_nodes
from refresher.refresh._static import static_probability
from refresher.store import ChangeStatistics, fold_observations
from refresher.store._change_stats import empty_state, read_statistics

Float = NDArray[np.float64]


@dataclass
class Fetches:
    page: NDArray[np.int64]
    finished: Float
    lm: Float
    changed: NDArray[np.bool_]
    host: NDArray[np.intp]  # per page
    n_hosts: int


def generate(
    pages: int, *, seed: int, regular: bool, fetches: int = 12, honest: float = 0.5
) -> Fetches:
    """Successful fetches of ``pages`` pages over ``pages // 8 + 1`` hosts; rates log-normal
    around one change an hour; intervals exponential around an hour or regular per page;
    Last-Modified the last change time on honest hosts, absent on the others."""
    rng = np.random.default_rng(seed)
    n_hosts = pages // 8 + 1
    host = rng.integers(0, n_hosts, pages).astype(np.intp)
    honest_host = rng.random(n_hosts) < honest
    rate = np.exp(rng.normal(np.log(1 / 3600), 1.5, pages))
    k = rng.integers(1, fetches + 1, pages)
    rows_page, rows_t, rows_lm, rows_c = [], [], [], []
    for i in range(pages):
        mean = 3600.0 * np.exp(rng.normal(0.0, 0.5))
        gaps = np.full(k[i], mean) if regular else np.maximum(rng.exponential(mean, k[i]), 1.0)
        times = 1.7e9 + np.cumsum(gaps)
        span = (times[0] - 86_400.0, times[-1])
        events = np.sort(rng.uniform(*span, rng.poisson(rate[i] * (span[1] - span[0]))))
        last = np.searchsorted(events, times) - 1  # the latest change before each fetch
        padded = np.r_[span[0] - 1e5, events]  # a change long before, if none in the span
        lm = padded[last + 1]
        changed = np.diff(last, prepend=last[0]) > 0
        rows_page.append(np.full(k[i], i))
        rows_t.append(times)
        rows_lm.append(lm if honest_host[host[i]] else np.full(k[i], np.nan))
        rows_c.append(changed)
    return Fetches(
        page=np.concatenate(rows_page).astype(np.int64),
        finished=np.concatenate(rows_t),
        lm=np.concatenate(rows_lm),
        changed=np.concatenate(rows_c),
        host=host,
        n_hosts=n_hosts,
    )


def statistics(f: Fetches) -> ChangeStatistics:
    n = f.host.size
    state = fold_observations(
        empty_state(n), np.arange(n, dtype=np.int64), f.page, f.finished, f.lm, f.changed, f.changed
    )
    return read_statistics(state, meaningful=False)


def from_history(
    f: Fetches,
    *,
    history: int,
    model: str = "log-normal",
    mixture: bool = True,
    fit_spread: bool = False,
    spread: float = 2.0,
):
    """The allocator's estimate from the latest ``history`` observation pairs per page."""
    n = f.host.size
    order = np.lexsort((f.finished, f.page))
    page, t_at, lm, c = f.page[order], f.finished[order], f.lm[order], f.changed[order]
    same = np.r_[False, page[1:] == page[:-1]]
    first_row = ~same
    # rank from the end within each page, to keep the latest `history` pairs
    from_end = np.zeros(page.size, dtype=np.int64)
    ends = np.r_[np.flatnonzero(page[1:] != page[:-1]), page.size - 1]
    count = np.diff(np.r_[-1, ends])
    from_end = np.repeat(ends, count) - np.arange(page.size)
    obs = same & (from_end < history)
    p = page[obs].astype(np.intp)
    prev, prev_lm = np.roll(t_at, 1)[obs], np.roll(lm, 1)[obs]
    fetched, lm_o, changed = t_at[obs], lm[obs], c[obs]
    intervals = fetched - prev
    trusted = last_modified_consistent(f.host[p], fetched, prev, lm_o, prev_lm, changed, f.n_hosts)
    since = np.where(np.isfinite(lm_o), np.maximum(fetched - lm_o, 0.0), np.nan)
    n_obs = np.bincount(page[same], minlength=n)
    first = first_row & np.isfinite(lm) & (t_at > lm)
    first &= (n_obs[page] <= history) & trusted[f.host[page]]
    p = np.concatenate((p, page[first]))
    intervals = np.concatenate((intervals, (t_at - lm)[first]))
    changed = np.concatenate((changed, np.zeros(int(first.sum()), dtype=bool)))
    since = np.concatenate((since, np.full(int(first.sum()), np.nan)))
    first_copy = np.r_[np.zeros(obs.sum(), bool), np.ones(int(first.sum()), bool)]
    est = estimate_pages(
        p,
        intervals,
        changed,
        n,
        page_host=f.host,
        n_hosts=f.n_hosts,
        since_change=since,
        trusted_hosts=trusted,
        model=model,
        mixture=mixture and model == "log-normal",
        fit_spread=fit_spread and model == "log-normal",
        spread=spread,
        first_copy=first_copy,
    )
    p0 = None
    if est.prior_mean is not None:
        assert est.prior_sd is not None
        real = ~first_copy  # a first copy's quiet time says nothing about changing at all
        p0, _ = static_probability(
            p[real], intervals[real], changed[real], n, prior_mean=est.prior_mean, sd=est.prior_sd
        )
    return est, p0


@pytest.mark.parametrize(
    ("model", "mixture", "fit"),
    [
        ("log-normal", True, False),
        ("log-normal", True, True),
        ("log-normal", False, True),
        ("log-normal", False, False),
        ("gamma", False, False),
    ],
)
def test_with_regular_intervals_the_statistics_give_the_historys_estimate_exactly(
    model: str, mixture: bool, fit: bool
) -> None:
    f = generate(400, seed=1, regular=True)
    want, want_p0 = from_history(f, history=64, model=model, mixture=mixture, fit_spread=fit)
    got, got_p0 = estimate_statistics(
        statistics(f), f.host, f.n_hosts, history=64, model=model, mixture=mixture, fit_spread=fit
    )
    assert got.prior_sd == want.prior_sd
    if model == "log-normal" and not fit:
        assert got.prior_sd == 2.0
    if model == "log-normal":  # the rounds to 1e-5, the estimate to 1e-8 (both from θ̂'s start)
        np.testing.assert_allclose(np.log(got.rate), np.log(want.rate), rtol=0, atol=1e-9)
    np.testing.assert_allclose(got.rate, want.rate, rtol=1e-6)
    np.testing.assert_allclose(got.n_eff, want.n_eff, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got.lower, want.lower, rtol=1e-6)
    np.testing.assert_array_equal(got.method, want.method)
    np.testing.assert_array_equal(got.fetches, want.fetches)
    if model == "log-normal":
        assert got_p0 is not None and want_p0 is not None
        np.testing.assert_allclose(got_p0, want_p0, rtol=1e-6, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), honest=st.sampled_from([0.0, 0.5, 1.0]))
def test_a_fitted_spread_gives_the_estimate_of_that_spread_configured(
    seed: int, honest: float
) -> None:
    # the host means are found under the sd the estimate uses, not the configured one: a
    # fitted sd of s estimates exactly as a configured s (the history's estimator too)
    f = generate(80, seed=seed, regular=bool(seed % 2), fetches=4, honest=honest)
    fitted, _ = estimate_statistics(
        statistics(f), f.host, f.n_hosts, history=64, mixture=True, fit_spread=True
    )
    assert fitted.prior_sd is not None and fitted.prior_mean is not None
    same, _ = estimate_statistics(
        statistics(f), f.host, f.n_hosts, history=64, mixture=True, spread=fitted.prior_sd
    )
    assert same.prior_mean is not None
    # to the rounds' precision: the fitted sd's rounds start from the configured sd's first
    # solve, the configured one's from each page's own rate, and the rounds stop at Newton
    # steps of 1e-5 (errors of order 1e-10)
    np.testing.assert_allclose(fitted.prior_mean, same.prior_mean, rtol=1e-9)
    np.testing.assert_allclose(fitted.rate, same.rate, rtol=1e-9)
    history, _ = from_history(f, history=64, fit_spread=True)
    assert history.prior_sd is not None and history.prior_mean is not None
    configured, _ = from_history(f, history=64, spread=history.prior_sd)
    assert configured.prior_mean is not None
    np.testing.assert_allclose(history.prior_mean, configured.prior_mean, rtol=1e-12)
    np.testing.assert_allclose(history.rate, configured.rate, rtol=1e-12)


#: the agreement stated in README and the module docstring, on exponential intervals (the
#: hardest case: regular intervals agree exactly): |Δ ln λ̂| in the median, and as a share of
#: the page's own posterior sd of ln λ at the 95th percentile and at most; the mean Δ ln λ̂.
#: Fixed seeds: the bounds hold on nearly every generated web, not on all (over 150 seeds × 3
#: mixes, 3 of 135,000 pages were beyond 0.5 sd, the worst at 3.3: README)
MEDIAN_LOG_ERROR = 0.01
P95_OF_SD = 0.1
MAX_OF_SD = 0.5
BIAS = 0.015


@pytest.mark.parametrize("honest", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("seed", [11, 4242])
def test_with_irregular_intervals_the_two_point_rule_agrees_with_the_history(
    seed: int, honest: float
) -> None:
    f = generate(300, seed=seed, regular=False, honest=honest)
    want, want_p0 = from_history(f, history=64)
    got, got_p0 = estimate_statistics(statistics(f), f.host, f.n_hosts, history=64, mixture=True)
    err = np.log(got.rate / want.rate)
    of_sd = np.abs(err) / posterior_sd(want)
    assert np.median(np.abs(err)) < MEDIAN_LOG_ERROR
    assert np.quantile(of_sd, 0.95) < P95_OF_SD
    assert of_sd.max() < MAX_OF_SD
    assert abs(err.mean()) < BIAS
    np.testing.assert_array_equal(got.method, want.method)
    assert got_p0 is not None and want_p0 is not None
    assert np.abs(got_p0 - want_p0).max() < 0.05


def test_a_long_history_is_worth_the_window_and_centred_on_all_of_it() -> None:
    f = generate(200, seed=5, regular=True, fetches=40)
    want, _ = from_history(f, history=8)
    got, _ = estimate_statistics(statistics(f), f.host, f.n_hosts, history=8, mixture=True)
    assert got.fetches.max() == want.fetches.max() <= 8 + 1  # + the first copy's quiet time
    # the same evidence per page, within what the window's part of the history differs by
    ratio = got.n_eff[want.n_eff > 1] / want.n_eff[want.n_eff > 1]
    assert 0.7 < np.median(ratio) < 1.3


@given(
    st.lists(st.floats(1.0, 1e6), min_size=1, max_size=30),
)
def test_two_nodes_keep_the_count_mean_and_variance_of_ln_t(t: list[float]) -> None:
    u = np.log(np.array(t))
    moments = np.array([[u.sum()], [(u * u).sum()], [(u**3).sum()]])
    t0, t1, share = two_point_nodes(np.array([float(u.size)]), moments)
    v = np.log(np.array([t0[0], t1[0]]))
    w = np.array([share[0], 1.0 - share[0]])
    assert w.min() >= 0.0
    assert (w * v).sum() == pytest.approx(u.mean(), abs=1e-6)
    assert (w * v * v).sum() == pytest.approx((u * u).mean(), rel=1e-6, abs=1e-6)


def test_newtons_steps_clipped_onto_the_ends_of_its_bracket_do_not_cycle() -> None:
    # a page of bench_estimate's 1 M whose 20 intervals all changed, as two nodes: from
    # θ = −7.97 the steps went −6.59, −2.59 (each clipped to 4, each landing exactly on the
    # bracket's other end), −6.59, … for all 100 steps, and stopped at −2.59
    nodes = _Nodes(
        np.array([193.48367973911405]),
        np.array([6837.271057888596]),
        np.array([5.423944320980697]),
        np.array([14.576055679019305]),
    )
    theta, info, mean = np.array([-7.968481298695434]), np.empty(1), -9.071097564702114
    zero = np.zeros(1)
    _newton(theta, np.ones(1, bool), nodes, zero, zero, np.array([mean]), 0.25, info)

    def gradient(th: float) -> float:
        u = math.exp(th) * np.array([nodes.t0[0], nodes.t1[0]])
        w = np.array([nodes.w0[0], nodes.w1[0]])
        return float((w * u / np.expm1(u)).sum()) - (th - mean) * 0.25

    assert abs(gradient(float(theta[0]))) < 1e-9
    assert -4.34 < theta[0] < -4.32


def test_a_point_that_does_not_pair_observes_nothing_but_starts_the_next_pair() -> None:
    ids = np.array([1], dtype=np.int64)
    page = np.ones(3, dtype=np.int64)
    at, lm = np.array([10.0, 30.0, 50.0]), np.full(3, np.nan)
    changed = np.array([False, True, False])
    both = fold_observations(empty_state(1), ids, page, at, lm, changed, changed)
    cut = fold_observations(
        empty_state(1), ids, page, at, lm, changed, changed, np.array([True, False, True])
    )
    assert both["stat_n"][0] == 2 and both["stat_time"][0] == 40.0
    # the point at 30 s (a fetch whose change since the sitemap read before it is unknown)
    # leaves out (10, 30] and pairs the next one with itself: (30, 50]
    assert cut["stat_n"][0] == 1 and cut["stat_time"][0] == 20.0 and cut["stat_changes"][0] == 0
    assert cut["stat_last_ok"][0] == 50.0


def _with_paired(f: Fetches) -> tuple[ChangeStatistics, ChangeStatistics]:
    """The statistics of ``f`` folded whole, and folded with each page's second observation
    left out of the sums and kept as a timeline's Last-Modified pair (as the store keeps a
    page's first fetch after a sitemap read, :mod:`refresher.store._timeline`)."""
    n = f.host.size
    ids = np.arange(n, dtype=np.int64)
    order = np.lexsort((f.finished, f.page))
    page, at, lm, c = f.page[order], f.finished[order], f.lm[order], f.changed[order]
    rank = np.arange(page.size) - np.searchsorted(page, page)
    cut = rank == 2
    whole = fold_observations(empty_state(n), ids, page, at, lm, c, c)
    state = fold_observations(empty_state(n), ids, page, at, lm, c, c, ~cut)
    t = (at - np.roll(at, 1))[cut]
    after = np.minimum(np.maximum((at - lm)[cut], 0.0), t)  # seconds since the change
    quiet = np.where(c[cut], after, t)
    state |= {
        "tl_pair_n": np.bincount(page[cut], minlength=n).astype(np.float64),
        "tl_pair_changes": np.bincount(page[cut], c[cut], minlength=n),
        "tl_pair_quiet": np.bincount(page[cut], quiet, minlength=n),
    }
    return read_statistics(whole, meaningful=False), read_statistics(state, meaningful=False)


def test_a_timelines_last_modified_pairs_count_where_the_hosts_last_modified_is_trusted() -> None:
    f = generate(60, seed=5, regular=False, honest=1.0)
    whole, paired = _with_paired(f)
    assert paired.paired is not None and paired.paired.sum() > 20
    est = {
        name: estimate_statistics(s, f.host, f.n_hosts, history=8, model="log-normal")[0]
        for name, s in (("whole", whole), ("paired", paired))
    }
    without = replace(paired, paired=None, paired_changes=None, paired_quiet=None)
    est["without"] = estimate_statistics(without, f.host, f.n_hosts, history=8)[0]
    # the same evidence as the pairs folded whole, but for the empirical Bayes rounds' start
    np.testing.assert_allclose(est["paired"].rate, est["whole"].rate, rtol=1e-3)
    assert np.abs(np.log(est["without"].rate / est["whole"].rate)).max() > 0.05


def test_a_timelines_last_modified_pairs_change_nothing_where_it_is_not_trusted() -> None:
    f = generate(60, seed=5, regular=False, honest=1.0)
    f.lm[::7] += 1000.0  # Last-Modified values that do not move with the content
    _, paired = _with_paired(f)
    without = replace(paired, paired=None, paired_changes=None, paired_quiet=None)
    est = estimate_statistics(paired, f.host, f.n_hosts, history=8)[0]
    same = estimate_statistics(without, f.host, f.n_hosts, history=8)[0]
    np.testing.assert_array_equal(est.rate, same.rate)
