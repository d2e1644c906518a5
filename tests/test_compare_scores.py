import math

import pyarrow as pa
import pytest

from evalpipe import artifacts
from evalpipe.compare.scores import align_keys, compare_scores, paired_scores
from fakes import METRIC, TASK, make_samples, mutate, tables


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
    with pytest.raises(ValueError, match="duplicate"):
        align_keys(a, pa.concat_tables([b, b]), artifacts.SAMPLE_KEY)


def test_nan_mean_is_none_when_nothing_paired():
    a = make_samples(2)
    b = make_samples(2, task="other")
    rows = _scores(a, b).rows
    assert all(r.n_paired == 0 and r.mean_a is None and r.delta is None for r in rows)
    assert not any(isinstance(r.mean_a, float) and math.isnan(r.mean_a) for r in rows)
