"""Paired statistics for per-item scores: difference with CI, McNemar, TOST, detectable effect.

Pure numpy/scipy; nothing here knows about engines, artifacts or tasks. Side A is the
reference, side B the variant, and every difference is B - A.

Notation: n paired items with scores ``a_i``, ``b_i`` and differences
``d_i = b_i - a_i``; ``d̄ = mean(d)``.

Standard errors
    Unclustered:  SE(d̄) = sd(d, ddof=1) / √n.
    Clustered (items grouped in G clusters, e.g. several questions about one long
    document, which are not independent): with cluster sums ``D_g = Σ_{i∈g} d_i`` and
    cluster sizes ``n_g``,

        SE(d̄)² = G/(G-1) · Σ_g (D_g - n_g·d̄)² / n²

    i.e. the cluster-robust ("sandwich") variance of a mean with the usual
    small-sample factor G/(G-1) (Stata's CR1; its (N-1)/(N-K) factor is 1 for a mean,
    K = 1). When every item is its own cluster (G = n, n_g = 1) this is *exactly*
    sd(d, ddof=1)/√n: n/(n-1) · Σ(d_i - d̄)²/n² = s²/n. Without the factor it would be
    √((n-1)/n) times the unclustered SE. The per-side means get the same estimator
    applied to ``a`` and ``b``.

Intervals: Student t, not the normal z
    The CI is d̄ ± t_{1-(1-conf)/2, df} · SE with df = n - 1 (unclustered) or G - 1
    (clustered). Tasks in a test or smoke run have tens of items and long-context tasks
    may have only a handful of documents (clusters); z intervals are too narrow there
    and would let TOST claim equivalence too early. For n in the hundreds t and z
    agree to the third digit, so nothing is lost on full runs. G - 1 degrees of freedom
    is the standard choice for cluster-robust intervals with few clusters. TOST and the
    minimum detectable difference use the same df, so all numbers of a row agree.

Degenerate cases (no NaN, no warnings; "undefined" is ``None``)
    n = 0: everything is ``None``.
    All differences exactly 0 (identical vectors, any n ≥ 1): SE 0, CI [0, 0].
    n ≥ 2 (G ≥ 2) with zero variance of the differences: SE 0, CI [d̄, d̄].
    n = 1 (or G = 1) with a non-zero difference: the variance is not estimable,
    SE and CI are ``None``, TOST is not equivalent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# scipy.special, not scipy.stats: the same distribution functions (scipy.stats calls
# these), without the second of import time that scipy.stats costs every
# `evalpipe compare`. The tests check them against scipy.stats.
from scipy import special as _sp

__all__ = [
    "PairedDifference",
    "TostResult",
    "cluster_codes",
    "mcnemar_exact",
    "minimum_detectable_difference",
    "no_change_se",
    "one_sample_t_pvalue",
    "paired_difference",
    "quantile",
    "tost",
    "upper_tail",
]


def quantile(p: float, df: float | None) -> float:
    """Quantile of the standard normal (df None) or of Student t with df > 0 degrees of freedom."""
    if df is None or math.isinf(df):
        return float(_sp.ndtri(p))
    return float(_sp.stdtrit(df, p))


def upper_tail(x: float, df: float | None) -> float:
    """Upper tail P(T > x); exact 0 / 1 at ±inf."""
    if math.isinf(x):
        return 0.0 if x > 0 else 1.0
    if df is None or math.isinf(df):
        return float(_sp.ndtr(-x))
    return float(_sp.stdtr(df, -x))


def one_sample_t_pvalue(d: np.ndarray) -> float:
    """Two-sided p of Student's one-sample t-test of mean(d) = 0 (scipy.stats.ttest_1samp's
    pvalue); ``d`` holds at least two values that are not all equal."""
    n = len(d)
    t = float(np.mean(d) / (np.std(d, ddof=1) / math.sqrt(n)))
    return min(1.0, 2.0 * upper_tail(abs(t), n - 1))


def cluster_codes(clusters: Sequence[Any] | np.ndarray | None, n: int) -> np.ndarray:
    """Integer cluster codes 0..G-1 for n items (in sorted label order, so deterministic).

    ``None`` gives every item its own cluster; a missing label (None / NaN) inside the
    sequence also makes that item a cluster of its own.
    """
    if clusters is None:
        return np.arange(n, dtype=np.int64)
    labels = list(clusters.tolist() if isinstance(clusters, np.ndarray) else clusters)
    if len(labels) != n:
        raise ValueError(f"clusters has {len(labels)} labels for {n} items.")
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in labels]
    keys = [("1", i) if m else ("0", str(v)) for i, (v, m) in enumerate(zip(labels, missing))]
    # str() so that mixed int/str labels still sort; ints of one cluster map to one key.
    uniq = {k: None for k in sorted(set(keys))}
    code = {k: i for i, k in enumerate(uniq)}
    return np.asarray([code[k] for k in keys], dtype=np.int64)


def _mean_se(x: np.ndarray, codes: np.ndarray, n_clusters: int, clustered: bool) -> float | None:
    """SE of mean(x): sd/√n, or the CR1 cluster-robust SE; None when not estimable."""
    n = len(x)
    if n < 2 or (clustered and n_clusters < 2):
        return None
    if (x == x[0]).all():  # zero variance: exactly 0, whatever rounding the mean has
        return 0.0
    mean = float(np.mean(x))
    if not clustered:
        return math.sqrt(float(np.sum((x - mean) ** 2)) / (n - 1) / n)
    resid = x - mean
    sums = np.bincount(codes, weights=resid, minlength=n_clusters)
    var = n_clusters / (n_clusters - 1) * float(np.sum(sums**2)) / (n * n)
    return math.sqrt(var)


@dataclass(frozen=True)
class PairedDifference:
    """Means of both sides and their paired difference d̄ = mean(b - a) with a t interval.

    ``df`` is n - 1 (or G - 1 with clusters); ``ci_low``/``ci_high`` the two-sided
    ``conf`` interval; ``None`` marks what is undefined (see the module docstring).
    """

    n: int
    n_clusters: int
    mean_a: float | None
    se_a: float | None
    mean_b: float | None
    se_b: float | None
    diff: float | None
    se: float | None
    df: int | None
    conf: float
    ci_low: float | None
    ci_high: float | None


def _interval(center: float | None, se: float | None, df: int | None, conf: float) -> tuple[float | None, float | None]:
    if center is None or se is None:
        return None, None
    if se == 0.0:
        return center, center
    q = quantile(1.0 - (1.0 - conf) / 2.0, df)
    return center - q * se, center + q * se


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    clusters: Sequence[Any] | np.ndarray | None = None,
    conf: float = 0.95,
) -> PairedDifference:
    """Paired comparison of two score vectors (same items, same order).

    See the module docstring for the formulas. ``clusters`` (optional, one label per
    item) switches to cluster-robust SEs with G - 1 degrees of freedom.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf must be in (0, 1), got {conf}.")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d vectors of the same length, got {a.shape} and {b.shape}.")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a and b must be finite (drop unscored items before pairing).")
    n = len(a)
    clustered = clusters is not None
    codes = cluster_codes(clusters, n)
    g = int(codes.max()) + 1 if n else 0
    if n == 0:
        return PairedDifference(0, 0, None, None, None, None, None, None, None, conf, None, None)
    d = b - a
    diff = float(d[0]) if (d == d[0]).all() else float(np.mean(d))
    df = (g if clustered else n) - 1
    if not d.any():  # identical vectors: nothing moved, for any n and any clustering
        se: float | None = 0.0
        diff = 0.0
    else:
        se = _mean_se(d, codes, g, clustered)
    ci_low, ci_high = _interval(diff, se, df, conf)
    return PairedDifference(
        n=n,
        n_clusters=g,
        mean_a=float(np.mean(a)),
        se_a=_mean_se(a, codes, g, clustered),
        mean_b=float(np.mean(b)),
        se_b=_mean_se(b, codes, g, clustered),
        diff=diff,
        se=se,
        df=df,
        conf=conf,
        ci_low=ci_low,
        ci_high=ci_high,
    )


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    ``b`` = items right on A and wrong on B, ``c`` = wrong on A and right on B. Under
    H0 (no change in accuracy) b ~ Binomial(b + c, 1/2), so

        p = min(1, 2 · P(X ≤ min(b, c))),  X ~ Bin(b + c, 1/2)

    which equals scipy.stats.binomtest(b, b + c, 0.5).pvalue (the distribution is
    symmetric). p = 1 when there are no discordant pairs.
    """
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}.")
    n = b + c
    if n == 0 or b == c:
        return 1.0
    return min(1.0, 2.0 * float(_sp.bdtr(min(b, c), n, 0.5)))


@dataclass(frozen=True)
class TostResult:
    """Two one-sided tests for |difference| < margin.

    ``p_lower`` tests H0: diff ≤ -margin, ``p_upper`` tests H0: diff ≥ +margin;
    ``ci_low``/``ci_high`` is the (1 - 2α) interval. ``equivalent`` iff that interval
    lies strictly inside (-margin, +margin), which is the same as both p < α.
    ``None`` p-values / interval: the SE is not defined (e.g. a single item).
    """

    margin: float
    alpha: float
    ci_low: float | None
    ci_high: float | None
    p_lower: float | None
    p_upper: float | None
    equivalent: bool


def _one_sided_p(excess: float, se: float, df: int | None) -> float:
    """P(T > excess / se): small when the difference clears the margin by many SEs."""
    if se == 0.0:
        return 0.0 if excess > 0 else 1.0
    return upper_tail(excess / se, df)


def tost(
    diff: float | None,
    se: float | None,
    margin: float,
    alpha: float = 0.05,
    df: int | None = None,
) -> TostResult:
    """TOST equivalence test of a difference with standard error ``se`` against ±``margin``.

    Equivalent iff the (1 - 2α) CI diff ± q_{1-α} · se (q from t with ``df`` degrees of
    freedom, or the normal when ``df`` is None) lies inside (-margin, +margin); the
    one-sided p-values are P(T > (diff + margin)/se) and P(T > (margin - diff)/se).
    With se = 0 the interval is [diff, diff] and the p-values are 0 or 1.
    """
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}.")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}.")
    # one condition rather than a named flag: the checker narrows diff and se only through the test itself
    if (diff is None or se is None or not (math.isfinite(diff) and math.isfinite(se)) or se < 0
            or (se > 0 and df is not None and df < 1)):
        return TostResult(margin, alpha, None, None, None, None, False)
    diff, se = float(diff), float(se)
    if se == 0.0:
        lo = hi = diff
    else:
        q = quantile(1.0 - alpha, df)
        lo, hi = diff - q * se, diff + q * se
    p_lower = _one_sided_p(diff + margin, se, df)
    p_upper = _one_sided_p(margin - diff, se, df)
    equivalent = bool(-margin < lo and hi < margin)
    return TostResult(margin, alpha, lo, hi, p_lower, p_upper, equivalent)


def minimum_detectable_difference(
    se: float | None, alpha: float = 0.05, power: float = 0.8, df: int | None = None
) -> float | None:
    """Smallest true difference a two-sided level-α test detects with the given power.

        MDD = (q_{1-α/2} + q_{power}) · se

    with normal quantiles (z: 1.960 + 0.842 = 2.802 for the defaults), or t quantiles
    with ``df`` degrees of freedom to match t intervals. "No significant difference"
    says little about differences smaller than this. ``None`` if se is undefined.
    """
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}.")
    if se is None or not math.isfinite(se) or se < 0:
        return None
    if se == 0.0:
        return 0.0
    if df is not None and df < 1:
        return None
    return (quantile(1.0 - alpha / 2.0, df) + quantile(power, df)) * se


def no_change_se(n: int | None) -> float | None:
    """A floor for the SE of a paired 0/1 difference when none of ``n`` items changed.

    Zero discordant pairs among n bound the true share of changed items by 3/n (95%,
    the "rule of three": (1 - p)^n = 0.05 at p ≈ 3/n). Changes that go both ways with
    share p give var(d_i) = p, so SE = √(p/n) = √3 / n. Used for the minimum detectable
    difference only: it tells a reader what "nothing changed on n items" is worth
    (4.85 / n at α 0.05 and 80% power: 0.8 points on 600 items, 20 points on 24).
    With clustered items pass the number of clusters.
    """
    if n is None or n < 1:
        return None
    return math.sqrt(3.0) / n
