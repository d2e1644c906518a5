"""Paired statistics: hand-computed examples, scipy cross-checks, degenerate cases, properties."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sst

from evalpipe.compare.stats import (
    cluster_codes,
    mcnemar_exact,
    minimum_detectable_difference,
    one_sample_t_pvalue,
    paired_difference,
    quantile,
    tost,
)

pytestmark = pytest.mark.filterwarnings("error")  # no RuntimeWarnings from degenerate inputs

# 10 items. A = doc_id % 2; B flips doc 1 and 3 right->wrong and doc 4 wrong->right.
A10 = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
B10 = [0, 0, 0, 0, 1, 1, 0, 1, 0, 1]
# On paper:
#   d = B - A = [0, -1, 0, -1, 1, 0, 0, 0, 0, 0],  d̄ = -1/10 = -0.1
#   Σ(d - d̄)² = 7·0.1² + 2·0.9² + 1·1.1² = 0.07 + 1.62 + 1.21 = 2.9
#   s² = 2.9/9,  SE = √(s²/10) = √(2.9/90) = 0.179505...
#   t_{0.975, 9} = 2.262157 (table value 2.262)  ->  95% CI = -0.1 ± 0.406070
#   mean_a = 0.5, SE_a = √(10·0.25/9/10) = √(2.5/90) = 0.166667
#   mean_b = 0.4, Σ(b - 0.4)² = 4·0.36 + 6·0.16 = 2.4, SE_b = √(2.4/90) = 0.163299
#   McNemar: b = 2, c = 1, p = 2·P(X ≤ 1 | Bin(3, 1/2)) = 2·(1 + 3)/8 = 1
#   TOST at ±0.01: 90% CI = -0.1 ± 1.833113·0.179505 = [-0.429054, 0.229054] -> not equivalent
SE10 = math.sqrt(2.9 / 90)


def test_hand_computed_ten_items():
    r = paired_difference(A10, B10)
    assert r.n == 10 and r.n_clusters == 10 and r.df == 9
    assert r.diff == pytest.approx(-0.1)
    assert r.se == pytest.approx(SE10) and r.se == pytest.approx(0.179505, abs=1e-6)
    assert r.mean_a == 0.5 and r.se_a == pytest.approx(math.sqrt(2.5 / 90))
    assert r.mean_b == pytest.approx(0.4) and r.se_b == pytest.approx(math.sqrt(2.4 / 90))
    assert r.ci_low == pytest.approx(-0.1 - 2.262157 * SE10, abs=1e-6)
    assert r.ci_high == pytest.approx(-0.1 + 2.262157 * SE10, abs=1e-6)
    assert (r.ci_low, r.ci_high) == pytest.approx((-0.506070, 0.306070), abs=1e-6)
    assert mcnemar_exact(2, 1) == 1.0
    eq = tost(r.diff, r.se, 0.01, df=r.df)
    assert not eq.equivalent
    assert (eq.ci_low, eq.ci_high) == pytest.approx((-0.429054, 0.229054), abs=1e-6)


def test_ten_items_against_scipy():
    r = paired_difference(A10, B10)
    d = np.subtract(B10, A10, dtype=float)
    # the SE and t interval are those of the one-sample t test on the differences
    assert r.se == pytest.approx(sst.sem(d))
    ci = sst.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert (r.ci_low, r.ci_high) == pytest.approx((ci.low, ci.high))
    # TOST p-values are the two one-sided t tests against ∓margin
    eq = tost(r.diff, r.se, 0.5, df=r.df)
    p_lower = sst.ttest_1samp(d, -0.5, alternative="greater").pvalue
    p_upper = sst.ttest_1samp(d, 0.5, alternative="less").pvalue
    assert eq.p_lower == pytest.approx(p_lower) and eq.p_upper == pytest.approx(p_upper)
    assert eq.equivalent and max(eq.p_lower, eq.p_upper) < 0.05


def test_conf_level_and_quantiles():
    r = paired_difference(A10, B10, conf=0.99)
    q = sst.t.ppf(0.995, 9)
    assert r.ci_high - r.diff == pytest.approx(q * SE10)
    eq = tost(0.0, 1.0, 10.0)  # df None: normal quantiles
    assert eq.ci_high == pytest.approx(sst.norm.ppf(0.95))
    eq_t = tost(0.0, 1.0, 10.0, df=4)
    assert eq_t.ci_high == pytest.approx(sst.t.ppf(0.95, 4))


# ---------------------------------------------------------------------------
# clusters
# ---------------------------------------------------------------------------

# Clustered by hand: d = [1, 0 | 0, -1 | 1, 1] in clusters x, y, z (G = 3, n_g = 2), d̄ = 1/3.
#   D_g - n_g·d̄ = 1 - 2/3, -1 - 2/3, 2 - 2/3 = 1/3, -5/3, 4/3; squares sum to 42/9 = 14/3
#   SE² = G/(G-1) · 14/3 / n² = 3/2 · 14/3 / 36 = 7/36  ->  SE = √7/6 = 0.440959, df = G - 1 = 2
#   unclustered: Σ(d - d̄)² = 3·(2/3)² + 2·(1/3)² + (4/3)² = 10/3, s² = 2/3, SE² = 1/9 -> SE = 1/3, df = 5
D6 = [1, 0, 0, -1, 1, 1]
C6 = ["x", "x", "y", "y", "z", "z"]


def test_clustered_se_hand_computed():
    zeros = np.zeros(6)
    r = paired_difference(zeros, D6, clusters=C6)
    assert r.n_clusters == 3 and r.df == 2
    assert r.diff == pytest.approx(1 / 3)
    assert r.se == pytest.approx(math.sqrt(7) / 6)
    q = sst.t.ppf(0.975, 2)  # 4.302653
    assert (r.ci_low, r.ci_high) == pytest.approx((1 / 3 - q * math.sqrt(7) / 6, 1 / 3 + q * math.sqrt(7) / 6))
    u = paired_difference(zeros, D6)
    assert u.se == pytest.approx(1 / 3) and u.df == 5 and u.n_clusters == 6
    # the per-side SEs use the same estimator: side B is D6 itself, side A is constant
    assert r.se_b == pytest.approx(r.se) and r.se_a == 0.0


def test_singleton_clusters_equal_unclustered_exactly():
    # With the G/(G-1) factor and G = n: n/(n-1) · Σ(d_i - d̄)²/n² = s²/n, the plain SE.
    # (Without the factor it would be √((n-1)/n) times smaller.)
    r = paired_difference(A10, B10, clusters=list(range(10)))
    u = paired_difference(A10, B10)
    assert r.n_clusters == 10 and r.df == u.df == 9
    assert r.se == pytest.approx(u.se, rel=1e-12)
    assert r.se_a == pytest.approx(u.se_a, rel=1e-12) and r.se_b == pytest.approx(u.se_b, rel=1e-12)
    assert (r.ci_low, r.ci_high) == pytest.approx((u.ci_low, u.ci_high), rel=1e-12)
    raw = math.sqrt(float(np.sum((np.subtract(B10, A10) + 0.1) ** 2))) / 10
    assert raw == pytest.approx(u.se * math.sqrt(9 / 10))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=2, max_size=40))
def test_singleton_clusters_property(pairs):
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    r = paired_difference(a, b, clusters=[f"doc{i}" for i in range(len(a))])
    u = paired_difference(a, b)
    assert r.df == u.df and r.diff == u.diff
    assert r.se == pytest.approx(u.se, rel=1e-9, abs=1e-15)


def test_cluster_codes():
    assert cluster_codes(None, 3).tolist() == [0, 1, 2]
    assert cluster_codes(["b", "a", "b"], 3).tolist() == [1, 0, 1]
    # missing labels are clusters of their own
    codes = cluster_codes(["a", None, float("nan"), "a"], 4)
    assert codes[0] == codes[3] and len(set(codes.tolist())) == 3
    with pytest.raises(ValueError, match="labels"):
        cluster_codes([1, 2], 3)


# ---------------------------------------------------------------------------
# McNemar
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("b", [0, 1, 2, 3, 5, 8, 13, 21, 40])
@pytest.mark.parametrize("c", [0, 1, 2, 4, 7, 12, 30])
def test_mcnemar_matches_binomtest(b, c):
    expected = 1.0 if b + c == 0 else sst.binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=60))
def test_one_sample_t_pvalue_matches_scipy(values):
    d = np.asarray(values)
    assume(np.std(d, ddof=1) > 1e-9 * max(1.0, float(np.max(np.abs(d)))))
    assert one_sample_t_pvalue(d) == pytest.approx(sst.ttest_1samp(d, 0.0).pvalue, rel=1e-7, abs=1e-300)


@pytest.mark.parametrize("df", [None, 1, 3, 30])
@pytest.mark.parametrize("p", [0.025, 0.5, 0.8, 0.975])
def test_quantiles_match_scipy(p, df):
    expected = sst.norm.ppf(p) if df is None else sst.t.ppf(p, df)
    assert quantile(p, df) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_mcnemar_known_values_and_large_counts():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 1) == 1.0  # 2 · 1/2
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(480, 560) == pytest.approx(sst.binomtest(480, 1040).pvalue, rel=1e-9)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


# ---------------------------------------------------------------------------
# TOST and minimum detectable difference
# ---------------------------------------------------------------------------


def test_tost_zero_se():
    inside = tost(0.004, 0.0, 0.01)
    assert inside.equivalent and inside.p_lower == inside.p_upper == 0.0
    assert inside.ci_low == inside.ci_high == 0.004
    edge = tost(0.01, 0.0, 0.01)  # on the margin: not strictly inside
    assert not edge.equivalent and edge.p_upper == 1.0 and edge.p_lower == 0.0
    outside = tost(-0.2, 0.0, 0.01)
    assert not outside.equivalent and outside.p_lower == 1.0


def test_tost_undefined_se_and_bad_margin():
    r = tost(0.1, None, 0.01)
    assert not r.equivalent and r.p_lower is None and r.ci_low is None
    assert not tost(None, None, 0.01).equivalent
    assert not tost(0.0, 0.1, 0.5, df=0).equivalent  # no degrees of freedom
    with pytest.raises(ValueError):
        tost(0.0, 0.1, 0.0)


def test_minimum_detectable_difference():
    z = sst.norm.ppf(0.975) + sst.norm.ppf(0.8)
    assert minimum_detectable_difference(1.0) == pytest.approx(z) and z == pytest.approx(2.8016, abs=1e-4)
    assert minimum_detectable_difference(0.02) == pytest.approx(0.02 * z)
    assert minimum_detectable_difference(1.0, df=9) == pytest.approx(sst.t.ppf(0.975, 9) + sst.t.ppf(0.8, 9))
    # a true difference of one MDD is detected by the two-sided z test with 80% power
    mdd = minimum_detectable_difference(0.05)
    zc = sst.norm.ppf(0.975)
    power = sst.norm.sf(zc - mdd / 0.05) + sst.norm.cdf(-zc - mdd / 0.05)
    assert power == pytest.approx(0.8, abs=1e-4)
    assert minimum_detectable_difference(0.0) == 0.0
    assert minimum_detectable_difference(None) is None
    assert minimum_detectable_difference(0.1, df=0) is None


# ---------------------------------------------------------------------------
# degenerate inputs
# ---------------------------------------------------------------------------


def test_empty():
    r = paired_difference([], [])
    assert r.n == 0 and r.df is None
    assert r.mean_a is r.se is r.diff is r.ci_low is r.ci_high is None
    assert not tost(r.diff, r.se, 0.01, df=r.df).equivalent
    assert minimum_detectable_difference(r.se) is None


@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("clustered", [False, True])
def test_identical_vectors(n, clustered):
    x = np.arange(n, dtype=float) % 2
    r = paired_difference(x, x, clusters=["one"] * n if clustered else None)  # even a single cluster
    assert r.diff == 0.0 and r.se == 0.0 and (r.ci_low, r.ci_high) == (0.0, 0.0)
    assert mcnemar_exact(0, 0) == 1.0
    for margin in (1e-300, 1e-9, 0.01, 5.0):
        assert tost(r.diff, r.se, margin, df=r.df).equivalent
    assert minimum_detectable_difference(r.se, df=r.df) == 0.0


def test_single_item_that_changed():
    r = paired_difference([0.0], [1.0])
    assert r.n == 1 and r.diff == 1.0 and r.df == 0
    assert r.se is None and r.ci_low is None and r.se_a is None
    assert not tost(r.diff, r.se, 10.0, df=r.df).equivalent


def test_zero_variance_of_differences():
    # every item moves by the same amount: SE 0, the CI collapses onto it
    # (binary fractions, so the differences are exactly equal in floating point)
    r = paired_difference([0.25, 0.5, 0.75], [0.5, 0.75, 1.0])
    assert r.se == 0.0 and r.ci_low == r.ci_high == r.diff == 0.25
    assert tost(r.diff, r.se, 0.3, df=r.df).equivalent and not tost(r.diff, r.se, 0.25, df=r.df).equivalent
    g1 = paired_difference([0, 1, 0], [1, 0, 0], clusters=["d", "d", "d"])  # one cluster: not estimable
    assert g1.se is None and g1.n_clusters == 1


def test_bad_inputs():
    with pytest.raises(ValueError):
        paired_difference([0, 1], [0])
    with pytest.raises(ValueError):
        paired_difference([0, float("nan")], [0, 1])


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------

scores = st.sampled_from([0.0, 0.25, 0.5, 1.0])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(scores, scores, st.integers(0, 4)), min_size=0, max_size=30),
    st.booleans(),
    st.floats(1e-3, 0.5),
)
def test_swapping_sides_negates_the_difference(items, clustered, margin):
    a = [i[0] for i in items]
    b = [i[1] for i in items]
    clusters = [i[2] for i in items] if clustered else None
    ab = paired_difference(a, b, clusters=clusters)
    ba = paired_difference(b, a, clusters=clusters)
    if ab.n == 0:
        assert ab == ba
        return
    assert ba.diff == -ab.diff
    assert ba.se == ab.se and ba.df == ab.df
    assert (ba.se_a, ba.se_b) == (ab.se_b, ab.se_a)
    if ab.ci_low is not None:
        assert (ba.ci_low, ba.ci_high) == (-ab.ci_high, -ab.ci_low)
    t_ab = tost(ab.diff, ab.se, margin, df=ab.df)
    t_ba = tost(ba.diff, ba.se, margin, df=ba.df)
    assert t_ab.equivalent == t_ba.equivalent
    assert (t_ba.p_lower, t_ba.p_upper) == (t_ab.p_upper, t_ab.p_lower)
    assert minimum_detectable_difference(ab.se, df=ab.df) == minimum_detectable_difference(ba.se, df=ba.df)
    right_wrong = sum(1 for x, y in zip(a, b) if x == 1.0 and y == 0.0)
    wrong_right = sum(1 for x, y in zip(a, b) if x == 0.0 and y == 1.0)
    assert mcnemar_exact(right_wrong, wrong_right) == mcnemar_exact(wrong_right, right_wrong)


scale = st.one_of(st.just(1.0), st.floats(1.001, 100.0), st.integers(2, 50).map(float))


@settings(max_examples=200, deadline=None)
@given(st.floats(-1, 1), st.floats(0, 1), st.floats(1e-3, 0.5), scale, st.one_of(st.none(), st.integers(1, 60)))
def test_scaling_up_never_makes_equivalent(diff, se, margin, k, df):
    before = tost(diff, se, margin, df=df)
    after = tost(k * diff, k * se, margin, df=df)
    if not before.equivalent:
        assert not after.equivalent


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-2, 2), min_size=1, max_size=25), st.floats(1e-3, 0.5), scale)
def test_scaling_item_differences_never_makes_equivalent(d, margin, k):
    zeros = np.zeros(len(d))
    before = paired_difference(zeros, np.asarray(d, dtype=float))
    after = paired_difference(zeros, k * np.asarray(d, dtype=float))
    assert after.df == before.df
    if not tost(before.diff, before.se, margin, df=before.df).equivalent:
        assert not tost(after.diff, after.se, margin, df=after.df).equivalent


@settings(max_examples=150, deadline=None)
@given(st.floats(-1, 1), st.floats(1e-6, 1), st.floats(1e-3, 0.5), st.one_of(st.none(), st.integers(1, 60)))
def test_tost_interval_rule_matches_p_values(diff, se, margin, df):
    r = tost(diff, se, margin, df=df)
    worst = max(r.p_lower, r.p_upper)
    assume(abs(worst - 0.05) > 1e-9)
    assert r.equivalent == (worst < 0.05)


def test_no_change_se_is_the_rule_of_three_bound():
    from evalpipe.compare.stats import no_change_se

    # 0 changes in n items: the 95% upper bound on the change rate solves (1 - p)^n = 0.05
    n = 600
    p_upper = 1 - 0.05 ** (1 / n)
    assert p_upper == pytest.approx(3 / n, rel=0.01)
    assert no_change_se(n) == pytest.approx(math.sqrt(p_upper / n), rel=0.01)
    assert minimum_detectable_difference(no_change_se(n)) == pytest.approx(4.85 / n, rel=0.01)
    assert no_change_se(0) is None and no_change_se(None) is None
