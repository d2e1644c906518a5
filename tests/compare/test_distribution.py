"""Distributional token tests (evalpipe.compare.distribution), checked against reference
implementations: statsmodels' cluster-robust OLS for the effect and its interval, the
exhaustive enumeration of sign flips for the permutation p-value."""

import itertools

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats

from evalpipe.compare import distribution as D
from evalpipe.compare.distribution import ALTERNATIVE, PositionValues, cluster_mean, shift_tests, sign_flip_pvalue


def _clustered(rng, n_clusters, shift=0.0, cluster_sd=1.0, noise_sd=1.0):
    sizes = rng.integers(3, 40, size=n_clusters)
    clusters = np.repeat(np.arange(n_clusters), sizes)
    effects = rng.normal(0, cluster_sd, size=n_clusters)[clusters]
    values = shift + effects + rng.normal(0, noise_sd, size=len(clusters))
    return values, clusters


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cluster_mean_matches_statsmodels_cluster_robust_ols(seed):
    rng = np.random.default_rng(seed)
    values, clusters = _clustered(rng, 25, shift=0.3)
    ours = cluster_mean(values, clusters)
    fit = sm.OLS(values, np.ones(len(values))).fit(cov_type="cluster", cov_kwds={"groups": clusters}, use_t=True)
    assert ours.estimate == pytest.approx(float(fit.params[0]), rel=1e-12)
    assert ours.se == pytest.approx(float(fit.bse[0]), rel=1e-10)
    lo, hi = ours.interval(0.95)
    ref_lo, ref_hi = fit.conf_int(alpha=0.05)[0]
    assert (lo, hi) == (pytest.approx(ref_lo, rel=1e-9), pytest.approx(ref_hi, rel=1e-9))
    assert ours.n_clusters == 25 and ours.n_obs == len(values)


def test_cluster_se_is_wider_than_the_naive_one_when_positions_within_a_sample_move_together():
    rng = np.random.default_rng(3)
    values, clusters = _clustered(rng, 40, cluster_sd=1.0, noise_sd=0.1)
    naive = values.std(ddof=1) / np.sqrt(len(values))
    assert cluster_mean(values, clusters).se > 3 * naive


def test_one_sided_interval_has_no_upper_end_and_the_t_quantile_of_g_minus_1():
    cm = D.ClusterMean(estimate=1.0, se=0.5, n_obs=100, n_clusters=11)
    lo, hi = cm.interval(0.95, "greater")
    assert hi == np.inf and lo == pytest.approx(1.0 - stats.t.ppf(0.95, 10) * 0.5)
    assert D.ClusterMean(1.0, float("nan"), 3, 1).interval(0.95) == (-np.inf, np.inf)


def _exhaustive_pvalue(totals, alternative):
    obs = totals.sum()
    null = np.array([np.dot(s, totals) for s in itertools.product((1, -1), repeat=len(totals))])
    if alternative == "greater":
        return np.mean(null >= obs - 1e-12)
    return np.mean(np.abs(null) >= abs(obs) - 1e-12)


@pytest.mark.parametrize("alternative", ["two-sided", "greater"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sign_flip_pvalue_is_the_exhaustive_one_for_few_samples(seed, alternative):
    totals = np.random.default_rng(seed).normal(0.4, 1.0, size=10)
    assert sign_flip_pvalue(totals, alternative) == pytest.approx(_exhaustive_pvalue(totals, alternative), rel=1e-12)


def test_sign_flip_pvalue_monte_carlo_agrees_with_the_normal_limit_and_is_reproducible():
    rng = np.random.default_rng(5)
    totals = rng.normal(0.15, 1.0, size=400)
    p = sign_flip_pvalue(totals)
    # the sign-flip null of a sum of many totals is ~ N(0, sum totals^2)
    z = totals.sum() / np.sqrt(np.sum(totals**2))
    assert p == pytest.approx(2 * stats.norm.sf(abs(z)), abs=0.01)
    assert sign_flip_pvalue(totals) == p
    assert 1 / (1 + D.N_RESAMPLES) <= p <= 1


def test_sign_flip_pvalue_of_a_large_shift_is_the_smallest_possible_and_zero_totals_give_one():
    assert sign_flip_pvalue(np.full(100, 2.0)) == 1 / (1 + D.N_RESAMPLES)
    assert sign_flip_pvalue(np.full(100, 2.0), "greater") == 1 / (1 + D.N_RESAMPLES)
    assert sign_flip_pvalue(np.full(100, -2.0), "greater") == 1.0
    assert sign_flip_pvalue(np.zeros(30)) == 1.0
    assert sign_flip_pvalue(np.zeros(0)) == 1.0
    assert sign_flip_pvalue(np.array([3.0])) == 1.0, "one sample: nothing to permute"


def test_false_alarm_rate_of_the_sign_flip_test_under_symmetric_noise_is_at_most_alpha():
    rng = np.random.default_rng(11)
    ps = [sign_flip_pvalue(rng.standard_t(3, size=60)) for _ in range(400)]
    assert np.mean(np.array(ps) < 0.05) <= 0.08


def _values(ref_rows, samples, dlogprob, kl, task="t"):
    n = len(ref_rows)
    return PositionValues(
        ref_row=np.asarray(ref_rows), task=np.array([task] * n, dtype=object), sample=np.asarray(samples),
        dlogprob=np.asarray(dlogprob, dtype=float), kl=np.asarray(kl, dtype=float),
    )


def test_shift_tests_pair_positions_on_the_reference_row_and_subtract_the_aa_values():
    rng = np.random.default_rng(7)
    n_samples, per = 30, 20
    rows = np.arange(n_samples * per)
    samples = np.repeat(np.arange(n_samples), per)
    aa_d = rng.normal(0, 1e-3, size=len(rows))
    ab_d = aa_d + 5e-4 + rng.normal(0, 1e-4, size=len(rows))  # shifted by 0.5 x one position's spread
    aa_kl, ab_kl = np.full(len(rows), 1e-6), np.full(len(rows), 3e-6)
    # the A/A comparison lists its positions in another order and lacks two of them
    perm = rng.permutation(len(rows))[2:]
    aa = _values(rows[perm], samples[perm], aa_d[perm], aa_kl[perm])
    ab = _values(rows, samples, ab_d, ab_kl)
    by = {t.test: t for t in shift_tests(ab, aa, 0.95)}
    paired = np.sort(perm)
    shift = by["dlogprob_shift"]
    assert shift.estimate == pytest.approx(np.mean(ab_d[paired] - aa_d[paired]))
    assert shift.n_positions == len(rows) - 2 and shift.n_dropped == 2 and shift.n_samples == n_samples
    assert shift.ci_low < 5e-4 < shift.ci_high and shift.p_value < 1e-3
    assert shift.aa_position_sd == pytest.approx(np.std(aa_d[paired]))
    kl = by["kl_shift"]
    assert kl.estimate == pytest.approx(2e-6) and ALTERNATIVE[kl.test] == "greater" and kl.ci_high == np.inf


def test_shift_tests_see_no_shift_in_pure_noise_and_drop_non_finite_positions():
    rng = np.random.default_rng(8)
    rows = np.arange(600)
    samples = np.repeat(np.arange(30), 20)
    ab_d = rng.normal(0, 1e-3, size=600)
    ab_d[5] = np.nan
    ab = _values(rows, samples, ab_d, np.abs(ab_d))
    aa = _values(rows, samples, rng.normal(0, 1e-3, size=600), np.abs(rng.normal(0, 1e-3, size=600)))
    by = {t.test: t for t in shift_tests(ab, aa, 0.95)}
    assert by["dlogprob_shift"].n_dropped == 1 and by["dlogprob_shift"].p_value > 1e-3
    assert by["kl_shift"].p_value > 1e-3


def test_shift_tests_run_per_task():
    rows = np.arange(8)
    ab = PositionValues(rows, np.array(["a"] * 4 + ["b"] * 4, dtype=object), np.repeat(np.arange(4), 2),
                        np.ones(8), np.ones(8))
    aa = _values(rows, np.repeat(np.arange(4), 2), np.zeros(8), np.zeros(8))
    tests = shift_tests(ab, aa, 0.9)
    assert [(t.task, t.test, t.n_samples) for t in tests] == [
        ("a", "dlogprob_shift", 2), ("a", "kl_shift", 2), ("b", "dlogprob_shift", 2), ("b", "kl_shift", 2)
    ]
