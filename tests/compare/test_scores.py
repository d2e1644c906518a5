import json
import math

import numpy as np
import pyarrow as pa
import pytest
from fakes import METRIC, TASK, make_samples, mutate, set_column, tables, write_run
from scipy import stats as sst

from evalpipe.compare import compare_tables, stats
from evalpipe.compare.scores import (
    DEFAULT_MARGIN,
    FLIPPED_SHOWN,
    align_keys,
    compare_scores,
    last_question,
    paired_scores,
)
from evalpipe.errors import UserError
from evalpipe.pipeline.comparing import compare_run
from evalpipe.rundir import artifacts


def _scores(a_samples, b_samples):
    sa, _ = tables(a_samples)
    sb, _ = tables(b_samples)
    return compare_scores(sa, sb)


def test_identical_scores():
    s = make_samples(10)
    res = _scores(s, s)
    (row,) = res.rows
    assert row.task == TASK and row.metric == METRIC
    assert row.n_paired == 10 and row.identical and row.n_changed == 0
    assert row.mean_a == row.mean_b == 0.5 and row.delta == 0.0
    assert row.binary and row.a_right_b_wrong == 0 and row.a_wrong_b_right == 0
    assert row.only_a == row.only_b == 0


def test_score_delta_hand_checked():
    # A scores doc_id % 2: 0,1,0,1,0,1,0,1,0,1 (5/10 right)
    a = make_samples(10)
    # B: doc 1 and doc 3 go right -> wrong, doc 4 goes wrong -> right (4/10 right)
    b = a
    for doc, value in ((1, 0.0), (3, 0.0), (4, 1.0)):
        b = mutate(b, doc, lambda s, v=value: s.copy(scores={METRIC: v}))
    (row,) = _scores(a, b).rows
    assert row.mean_a == pytest.approx(0.5)
    assert row.mean_b == pytest.approx(0.4)  # 5 - 2 + 1 = 4 right out of 10
    assert row.delta == pytest.approx(-0.1)
    assert row.n_changed == 3
    assert row.a_right_b_wrong == 2  # McNemar b
    assert row.a_wrong_b_right == 1  # McNemar c
    assert not row.identical


def test_non_binary_metric_and_missing_items():
    a = make_samples(4, scores=[0.5, 0.25, 1.0, 0.0])
    b = mutate(a, 1, lambda s: s.copy(scores={METRIC: 0.75}))
    b = [s for s in b if s.doc_id != 3]  # doc 3 only in A
    (row,) = _scores(a, b).rows
    assert not row.binary and row.a_right_b_wrong is None
    assert row.n_paired == 3 and row.only_a == 1 and row.only_b == 0
    assert row.mean_a == pytest.approx((0.5 + 0.25 + 1.0) / 3)
    assert row.mean_b == pytest.approx((0.5 + 0.75 + 1.0) / 3)
    assert row.delta == pytest.approx(0.5 / 3)
    assert row.n_changed == 1


def test_swap_keeps_abs_delta():
    a = make_samples(10)
    b = mutate(a, 2, lambda s: s.copy(scores={METRIC: 1.0}))
    ab, ba = _scores(a, b).rows[0], _scores(b, a).rows[0]
    assert ab.delta == -ba.delta and ab.delta != 0
    assert ab.n_changed == ba.n_changed
    assert ab.a_right_b_wrong == ba.a_wrong_b_right


def test_metric_only_on_one_side_and_per_task_rows():
    a = make_samples(3) + make_samples(2, task="other")
    b = [s.copy(scores={METRIC: s.scores[METRIC], "acc,none": 1.0}) for s in a]
    res = _scores(a, b)
    assert res.metrics_only_b == ("acc,none",) and res.metrics_only_a == ()
    assert [(r.task, r.metric) for r in res.rows] == sorted([(TASK, METRIC), ("other", METRIC)])


def test_null_scores_for_tasks_without_the_metric_are_skipped():
    a = make_samples(3) + [s.copy(scores={}) for s in make_samples(2, task="zzz")]
    res = _scores(a, a)
    assert [(r.task, r.metric) for r in res.rows] == [(TASK, METRIC)]


def test_paired_vectors_kept_for_later_statistics():
    a = make_samples(5)
    sa, _ = tables(a)
    paired, _, _ = paired_scores(sa, sa.take([4, 3, 2, 1, 0]))
    (p,) = paired
    assert p.doc_id.tolist() == [0, 1, 2, 3, 4]
    assert p.a.tolist() == p.b.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_align_keys_outer_join_and_duplicates():
    a = pa.table({"task": ["x", "x", "y"], "doc_id": [2, 1, 1], "repeat": [0, 0, 0]})
    b = pa.table({"task": ["y", "x", "w"], "doc_id": [1, 3, 0], "repeat": [0, 0, 0]})
    al = align_keys(a, b, artifacts.SAMPLE_KEY)
    # union sorted: (w,0) (x,1) (x,2) (x,3) (y,1)
    assert al.idx_a.tolist() == [-1, 1, 0, -1, 2]
    assert al.idx_b.tolist() == [2, -1, -1, 1, 0]
    with pytest.raises(UserError, match="duplicate"):
        align_keys(a, pa.concat_tables([b, b]), artifacts.SAMPLE_KEY)


def test_nan_mean_is_none_when_nothing_paired():
    a = make_samples(2)
    b = make_samples(2, task="other")
    rows = _scores(a, b).rows
    assert all(r.n_paired == 0 and r.mean_a is None and r.delta is None for r in rows)
    assert not any(isinstance(r.mean_a, float) and math.isnan(r.mean_a) for r in rows)


# ---------------------------------------------------------------------------
# paired statistics on the rows
# ---------------------------------------------------------------------------

def _flip(samples, docs):
    """B: the given docs get the opposite 0/1 score and another response."""
    out = samples
    for doc in docs:
        out = mutate(
            out, doc, lambda s: s.copy(scores={METRIC: 1.0 - s.scores[METRIC]}, response=f"The answer is {s.doc_id + 100}.")
        )
    return out


def test_row_statistics_hand_checked():
    # same 10 items as test_score_delta_hand_checked: d = B - A = [0,-1,0,-1,1,0,0,0,0,0]
    # d̄ = -0.1, Σ(d - d̄)² = 2.9, SE = √(2.9/9/10) = 0.179505, df = 9 (see test_compare_stats.py)
    a = make_samples(10)
    (row,) = _scores(a, _flip(a, [1, 3, 4])).rows
    se = math.sqrt(2.9 / 90)
    assert row.se_delta == pytest.approx(se) and row.df == 9 and row.n_clusters == 10
    assert row.se_a == pytest.approx(math.sqrt(2.5 / 90)) and row.se_b == pytest.approx(math.sqrt(2.4 / 90))
    q = sst.t.ppf(0.975, 9)
    assert (row.ci_low, row.ci_high) == pytest.approx((-0.1 - q * se, -0.1 + q * se))
    assert row.ci_conf == 0.95
    assert row.mcnemar_p == 1.0  # b = 2, c = 1: 2 · P(X ≤ 1 | Bin(3, 1/2)) = 1
    assert row.margin == DEFAULT_MARGIN == 0.01 and not row.equivalent
    q90 = sst.t.ppf(0.95, 9)
    assert (row.tost_ci_low, row.tost_ci_high) == pytest.approx((-0.1 - q90 * se, -0.1 + q90 * se))
    assert row.tost_p_lower == pytest.approx(sst.t.sf((-0.1 + 0.01) / se, 9))
    assert row.tost_p_upper == pytest.approx(sst.t.sf((0.01 + 0.1) / se, 9))
    assert row.mdd == pytest.approx((q + sst.t.ppf(0.8, 9)) * se)


def test_identical_rows_have_degenerate_statistics():
    s = make_samples(10)
    (row,) = _scores(s, s).rows
    assert row.se_delta == 0.0 and (row.ci_low, row.ci_high) == (0.0, 0.0)
    assert row.mcnemar_p == 1.0 and row.equivalent
    # no item changed: the detectable difference comes from the rule-of-three floor, not SE 0
    assert row.mdd == pytest.approx((sst.t.ppf(0.975, 9) + sst.t.ppf(0.8, 9)) * math.sqrt(3) / 10)
    assert (row.tost_p_lower, row.tost_p_upper) == (0.0, 0.0)
    assert row.n_flipped == 0 and row.flipped == []
    assert row.se_a == row.se_b == pytest.approx(math.sqrt(2.5 / 90))


def test_margin_is_passed_through():
    a = make_samples(10)
    b = _flip(a, [1, 3, 4])
    sa, ta = tables(a)
    sb, tb = tables(b)
    # 90% CI [-0.429, 0.229]: inside ±0.5, not inside ±0.01
    assert compare_scores(sa, sb, margin=0.5).rows[0].equivalent
    assert compare_scores(sa, sb, margin=0.5).rows[0].margin == 0.5
    vc = compare_tables(sa, ta, sb, tb, margin=0.5)
    assert vc.scores.rows[0].equivalent and vc.doc.scores[0].margin == 0.5
    assert not compare_tables(sa, ta, sb, tb).scores.rows[0].equivalent
    with pytest.raises(UserError, match="margin"):
        compare_scores(sa, sb, margin=0.0)


def test_margin_through_compare_run(tmp_path):
    a = make_samples(10)
    root = write_run(tmp_path / "run-m", {"ref": a, "new": _flip(a, [1, 3, 4])}, reference="ref")
    assert compare_run(root).comparisons[0].scores.rows[0].margin == 0.01
    row = compare_run(root, margin=0.5).comparisons[0].scores.rows[0]
    assert row.margin == 0.5 and row.equivalent


def test_non_binary_metric_statistics():
    a = make_samples(4, scores=[0.5, 0.25, 1.0, 0.0])
    b = mutate(a, 1, lambda s: s.copy(scores={METRIC: 0.75}))
    (row,) = _scores(a, b).rows
    assert row.mcnemar_p is None  # McNemar only for 0/1 metrics
    ref = stats.paired_difference([0.5, 0.25, 1.0, 0.0], [0.5, 0.75, 1.0, 0.0])
    assert row.se_delta == pytest.approx(ref.se) and row.df == 3
    (f,) = row.flipped
    assert (f.doc_id, f.score_a, f.score_b) == (1, 0.25, 0.75)


def test_cluster_column_gives_cluster_robust_se():
    a = make_samples(10)
    b = _flip(a, [1, 3, 4])
    sa, _ = tables(a)
    sb, _ = tables(b)
    clusters = [f"passage{i // 2}" for i in range(10)]  # 5 documents with 2 questions each
    sa_c = set_column(sa, "cluster", clusters)
    (row,) = compare_scores(sa_c, sb).rows  # the column on one side is enough
    ref = stats.paired_difference(
        [float(i % 2) for i in range(10)], [0, 0, 0, 0, 1, 1, 0, 1, 0, 1], clusters=clusters
    )
    assert row.n_clusters == 5 and row.df == 4
    assert row.se_delta == pytest.approx(ref.se) and row.ci_low == pytest.approx(ref.ci_low)
    # d by cluster: [0,-1], [0,-1], [1,0], [0,0], [0,0]; sums -1,-1,1,0,0; minus 2·d̄ = -0.2:
    # -0.8, -0.8, 1.2, 0.2, 0.2 -> squares 0.64+0.64+1.44+0.04+0.04 = 2.8; SE² = 5/4 · 2.8/100 = 0.035
    assert row.se_delta == pytest.approx(math.sqrt(0.035))
    # both sides with the column, rows shuffled: same row
    sb_c = set_column(sb, "cluster", clusters)
    perm = np.random.default_rng(3).permutation(10)
    (row2,) = compare_scores(sa_c.take(perm), sb_c).rows
    assert row2 == row
    # singleton clusters reproduce the unclustered row exactly (same df, SE up to rounding)
    (single,) = compare_scores(set_column(sa, "cluster", list(range(10))), sb).rows
    (plain,) = compare_scores(sa, sb).rows
    assert single.df == plain.df and single.se_delta == pytest.approx(plain.se_delta, rel=1e-12)


def test_flipped_items_with_texts():
    a = make_samples(10)
    b = _flip(a, [1, 3, 4])
    sa, _ = tables(a)
    sb, _ = tables(b)
    prompts = [
        f"Question: 1+1?\nAnswer: 2\n\nQuestion: What is {i}+{i}?\nAnswer:" for i in range(10)
    ]
    (row,) = compare_scores(set_column(sa, "prompt", prompts), sb).rows
    assert row.n_flipped == 3 and [f.doc_id for f in row.flipped] == [1, 3, 4]
    f = row.flipped[0]
    assert (f.score_a, f.score_b, f.repeat) == (1.0, 0.0, 0)
    assert f.question == "What is 1+1?"
    assert f.target == "42"
    assert (f.response_a, f.response_b) == ("The answer is 1.", "The answer is 101.")
    assert (f.answer_a, f.answer_b) == ("1.", "101.")  # answer:strict-match, the metric's filter
    d = row.model_dump(mode="json")
    assert d["n_flipped"] == 3 and d["flipped"][2]["doc_id"] == 4 and d["flipped"][2]["score_b"] == 1.0


def test_flipped_items_capped_with_total():
    a = make_samples(30)
    (row,) = _scores(a, _flip(a, range(30))).rows
    assert row.n_flipped == 30 and len(row.flipped) == FLIPPED_SHOWN == 20
    assert [f.doc_id for f in row.flipped] == list(range(20))
    # every item flips, 15 each way: b = c, McNemar p = 1
    assert row.a_right_b_wrong == row.a_wrong_b_right == 15 and row.mcnemar_p == 1.0


def test_last_question():
    assert last_question("Question: a?\nAnswer: 1\n\nQuestion: b?\nAnswer:") == "b?"
    assert last_question("Question: only one") == "only one"
    long = "x" * 150 + "y" * 200
    assert last_question(long) == "\u2026" + "y" * 200
    assert last_question("short prompt") == "short prompt"
    assert last_question(None) is None


def test_statistics_json_is_stable_and_nan_free():
    a = make_samples(12) + make_samples(3, task="other", seed=2)
    b = _flip(a, [2, 5])
    b = [s for s in b if not (s.task == "other" and s.doc_id == 0)]
    sa, _ = tables(a)
    sb, _ = tables(b)
    first = json.dumps([r.model_dump(mode="json") for r in compare_scores(sa, sb).rows], sort_keys=True, allow_nan=False)
    perm = np.random.default_rng(1).permutation(sa.num_rows)
    again = json.dumps([r.model_dump(mode="json") for r in compare_scores(sa.take(perm), sb).rows], sort_keys=True, allow_nan=False)
    assert first == again


def test_no_paired_items_statistics_are_null():
    rows = _scores(make_samples(2), make_samples(2, task="other")).rows
    for r in rows:
        d = r.model_dump(mode="json")
        assert d["se_delta"] is None and d["ci_low"] is None and d["mcnemar_p"] is None
        assert d["equivalent"] is False and d["mdd"] is None and d["flipped"] == []
