"""Distributional token tests: does the A/B comparison differ from the A/A one?

A per-position gate (KL p99 <= bound) can only see an error larger than the noise of
one position. A systematic error far below that still shows when thousands of
positions are taken together: it pushes the forced token's logprob one way (noise
does not), or it raises the per-position KL above what the engine's own noise gives.
Both tests here work on the teacher-forced traces, where every variant scored the
reference's exact tokens, so every position of A/B has a partner in A/A (the
reference against its own re-run).

Per position p of the reference's continuations (the same positions in both
comparisons, joined on the reference's teacher-forced row):

* ``dlogprob_shift``: x_p = (lp_B - lp_A) - (lp_A' - lp_A) = lp_B - lp_A', the signed
  difference of the forced token's logprob, A/B minus A/A. Two-sided.
* ``kl_shift``: x_p = KL(A, B) - KL(A, A'), the symmetric top-k KL of the two
  comparisons. One-sided (a fault adds divergence).

Positions of one sample are not independent (one corrupted key/value moves every
later position of that sample), so the sample is the unit of inference:

* effect: the mean per position, mu = sum x / N, with a cluster-robust (CR1) standard
  error over samples, SE^2 = G/(G-1) * sum_g (sum_{p in g} (x_p - mu))^2 / N^2, and a
  t interval with G-1 degrees of freedom (the estimator of a regression on a constant
  with standard errors clustered by sample; the tests check it against statsmodels);
* p-value: a sign-flip permutation test over samples (scipy.stats.permutation_test,
  one sample, ``permutation_type="samples"``) on the sum of the samples' totals. Under
  "B is another draw of the engine's noise, like A'", swapping B and A' in a sample
  flips the sign of its total, whatever the positions' dependence within it. Exact for
  up to EXACT_MAX_SAMPLES samples, otherwise N_RESAMPLES random flips from a fixed
  seed (so compare.json stays a pure function of the artifacts).

Pure numpy/scipy over arrays the token comparison already holds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from evalpipe.compare.stats import quantile
from evalpipe.config.gate_settings import SIGN_FLIP_RESAMPLES
from evalpipe.documents.comparison import ShiftTest

EXACT_MAX_SAMPLES = 16
N_RESAMPLES = SIGN_FLIP_RESAMPLES  # the config bounds alpha by the smallest p-value it allows
SEED = 0
TESTS = ("dlogprob_shift", "kl_shift")
ALTERNATIVE = {"dlogprob_shift": "two-sided", "kl_shift": "greater"}


@dataclass(frozen=True)
class ClusterMean:
    """Mean per position with its cluster-robust standard error (clusters = samples)."""

    estimate: float
    se: float
    n_obs: int
    n_clusters: int

    def interval(self, confidence: float, alternative: str = "two-sided") -> tuple[float, float]:
        """t interval with n_clusters - 1 degrees of freedom; one-sided: (lower, +inf)."""
        if self.n_clusters < 2 or not np.isfinite(self.se):
            return -np.inf, np.inf
        df = self.n_clusters - 1
        if alternative == "greater":
            return self.estimate - quantile(confidence, df) * self.se, np.inf
        q = quantile(0.5 + confidence / 2, df)
        return self.estimate - q * self.se, self.estimate + q * self.se


def cluster_mean(values: np.ndarray, clusters: np.ndarray) -> ClusterMean:
    """Mean of ``values`` with the CR1 cluster-robust standard error (module docstring)."""
    values = np.asarray(values, dtype=np.float64)
    _, codes = np.unique(clusters, return_inverse=True)
    n, g = len(values), int(codes.max()) + 1 if len(values) else 0
    if n == 0:
        return ClusterMean(float("nan"), float("nan"), 0, 0)
    mu = float(values.sum() / n)
    if g < 2:
        return ClusterMean(mu, float("nan"), n, g)
    resid = np.bincount(codes, weights=values - mu, minlength=g)
    se = float(np.sqrt(g / (g - 1) * np.sum(resid**2)) / n)
    return ClusterMean(mu, se, n, g)


@functools.lru_cache(maxsize=8)
def _random_signs(n: int) -> np.ndarray:
    # One fixed sign matrix per cluster count: the same draws for every test of a run
    # (reproducible), and cached because a calibration scans hundreds of prefixes.
    rng = np.random.default_rng(SEED)
    return rng.integers(0, 2, size=(N_RESAMPLES, n), dtype=np.int8) * 2 - 1


def sign_flip_pvalue(totals: np.ndarray, alternative: str = "two-sided") -> float:
    """Permutation p-value of sum(totals) under random sign flips of the clusters' totals.

    Exact (every flip) up to EXACT_MAX_SAMPLES clusters, through
    scipy.stats.permutation_test; beyond that Monte Carlo with N_RESAMPLES fixed-seed
    flips and the observed arrangement counted in, p = (1 + #{|null| >= |obs|}) / (1 + R),
    which is how scipy counts it too."""
    totals = np.asarray(totals, dtype=np.float64)
    if len(totals) < 2 or not np.any(totals):
        return 1.0  # one sample has no arrangement to compare with (and scipy refuses it)
    if len(totals) <= EXACT_MAX_SAMPLES:
        # scipy.stats costs a command a second to import: loaded when a test runs, not with the gates
        from scipy import stats  # noqa: PLC0415

        res = stats.permutation_test(
            (totals,), lambda x, axis: np.sum(x, axis=axis), permutation_type="samples",
            vectorized=True, n_resamples=np.inf, alternative=alternative,
        )
        return float(res.pvalue)
    observed = totals.sum()
    null = _random_signs(len(totals)) @ totals
    # relative tolerance as in scipy: ties of the statistic up to rounding count as extreme
    eps = 1e-14 * max(abs(observed), 1.0)
    if alternative == "greater":
        extreme = np.count_nonzero(null >= observed - eps)
    elif alternative == "less":
        extreme = np.count_nonzero(null <= observed + eps)
    else:
        extreme = np.count_nonzero(np.abs(null) >= abs(observed) - eps)
    return float((1 + extreme) / (1 + N_RESAMPLES))


def measured(value: float | None) -> float:
    """A test's figure to compute with: NaN where it measured nothing (null once written)."""
    return math.nan if value is None else value


@dataclass(frozen=True)
class PositionValues:
    """Per teacher-forced position of one comparison: the reference's row, the sample
    it belongs to, the signed logprob difference B - A and the symmetric KL."""

    ref_row: np.ndarray
    task: np.ndarray
    sample: np.ndarray  # sample code, unique within the comparison
    dlogprob: np.ndarray
    kl: np.ndarray

    @classmethod
    def of(cls, comparison: Any) -> "PositionValues | None":
        """From a TokenComparison that kept its arrays (None when it did not)."""
        d, pal = comparison.samples, comparison.positions
        if d is None or pal is None or d.prefix_rows is None or d.prefix_dlogprob is None:
            return None
        rows = d.prefix_rows
        return cls(
            ref_row=pal.idx_a[rows],
            task=np.asarray(d.task, dtype=object)[d.prefix_sample],
            sample=d.prefix_sample,
            dlogprob=d.prefix_dlogprob,
            kl=d.prefix_kl,
        )


def shift_tests(ab: PositionValues, aa: PositionValues, confidence: float) -> list[ShiftTest]:
    """Both tests for every task of ``ab``; positions are paired on the reference's row."""
    _, i_ab, i_aa = np.intersect1d(ab.ref_row, aa.ref_row, assume_unique=True, return_indices=True)
    # sums in the comparison's key order, not in the order of the reference's table rows:
    # the same artifacts with their rows shuffled must give the same bits
    order = np.argsort(i_ab, kind="stable")
    i_ab, i_aa = i_ab[order], i_aa[order]
    out = []
    for task in sorted(set(ab.task.tolist())):
        in_task = ab.task[i_ab] == task
        n_task = int(np.count_nonzero(ab.task == task))
        j_ab, j_aa = i_ab[in_task], i_aa[in_task]
        for test in TESTS:
            x_ab = ab.dlogprob[j_ab] if test == "dlogprob_shift" else ab.kl[j_ab]
            x_aa = aa.dlogprob[j_aa] if test == "dlogprob_shift" else aa.kl[j_aa]
            x = x_ab - x_aa
            ok = np.isfinite(x)
            x, clusters = x[ok], ab.sample[j_ab][ok]
            cm = cluster_mean(x, clusters)
            alternative = ALTERNATIVE[test]
            lo, hi = cm.interval(confidence, alternative)
            _, codes = np.unique(clusters, return_inverse=True)
            totals = np.bincount(codes, weights=x) if len(x) else np.zeros(0)
            aa_vals = x_aa[np.isfinite(x_aa)]
            out.append(
                ShiftTest(
                    test=test,
                    task=task,
                    estimate=cm.estimate,
                    ci_low=lo,
                    ci_high=hi,
                    confidence=confidence,
                    p_value=sign_flip_pvalue(totals, alternative),
                    n_positions=int(cm.n_obs),
                    n_samples=int(cm.n_clusters),
                    aa_position_sd=float(np.std(aa_vals)) if len(aa_vals) else None,
                    n_dropped=int(n_task - cm.n_obs),
                )
            )
    return out
