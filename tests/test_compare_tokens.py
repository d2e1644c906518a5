import numpy as np
import pytest

from evalpipe.compare.tokens import compare_tokens
from fakes import TASK, FakeSample, make_samples, mutate, set_token, tables


def _cmp(a_samples, b_samples, *, with_samples=True, shuffle=False, worst_k=5):
    sa, ta = tables(a_samples)
    sb, tb = tables(b_samples)
    if shuffle:
        rng = np.random.default_rng(1)
        ta, tb = ta.take(rng.permutation(ta.num_rows)), tb.take(rng.permutation(tb.num_rows))
        sa, sb = sa.take(rng.permutation(sa.num_rows)), sb.take(rng.permutation(sb.num_rows))
    if with_samples:
        return compare_tokens(ta, tb, sa, sb, worst_k=worst_k)
    return compare_tokens(ta, tb, worst_k=worst_k)


def test_identical():
    s = make_samples(6)
    (t,) = _cmp(s, s).summaries
    assert t.task == TASK and t.n_samples == 6 and t.identical
    assert t.n_ids_identical == t.n_identical == 6
    assert t.divergence_positions == () and t.median_first_divergence is None
    assert t.max_abs_dlogprob == 0.0 and t.mean_abs_dlogprob == 0.0
    assert t.n_positions_compared == 6 * 8 and t.tokens_a == t.tokens_b == 48
    assert t.worst_divergence == () and t.worst_logprob == ()


def test_one_token_changed():
    a = make_samples(6)
    b = mutate(a, 3, set_token(5, 7))
    cmp = _cmp(a, b, shuffle=True)
    (t,) = cmp.summaries
    assert not t.identical
    assert t.n_ids_identical == 5 and t.n_identical == 5
    assert t.divergence_positions == (5,) and t.median_first_divergence == 5.0
    (w,) = t.worst_divergence
    assert (w.doc_id, w.pos, w.token_a, w.token_b) == (3, 5, a[3].token_ids[5], 7)
    assert w.topk_ids_a == [a[3].token_ids[5], a[3].token_ids[5] + 1, a[3].token_ids[5] + 2]
    assert w.topk_ids_b == [7, 8, 9]
    assert w.response_a == a[3].response
    d = cmp.samples
    i = int(np.flatnonzero(d.doc_id == 3)[0])
    assert d.first_divergence[i] == 5 and d.shared_prefix[i] == 5
    assert (d.first_divergence[d.doc_id != 3] == -1).all()


def test_logprob_only_difference():
    a = make_samples(4)

    def bump(s):
        lps = list(s.logprobs)
        lps[2] = float(np.float32(lps[2]) + np.float32(3e-6))
        return s.copy(logprobs=lps)

    b = mutate(a, 1, bump)
    (t,) = _cmp(a, b).summaries
    assert t.n_ids_identical == 4 and t.n_identical == 3
    assert t.n_logprob_diff_same_ids == 1 and t.n_positions_logprob_diff == 1
    expected = abs(float(np.float32(b[1].logprobs[2])) - float(np.float32(a[1].logprobs[2])))
    assert t.max_abs_dlogprob == pytest.approx(expected) and t.max_abs_dlogprob_same_ids == t.max_abs_dlogprob
    assert 1e-6 < t.max_abs_dlogprob < 1e-5
    assert t.mean_abs_dlogprob == pytest.approx(expected / 32)
    (w,) = t.worst_logprob
    assert (w.doc_id, w.pos, w.token_a) == (1, 2, a[1].token_ids[2]) and w.token_a == w.token_b


def test_topk_only_difference_is_not_identical():
    a = make_samples(3)
    b = mutate(a, 0, lambda s: s.copy(topk_ids=[[t, t + 5, t + 2] for t in s.token_ids]))
    (t,) = _cmp(a, b).summaries
    assert t.n_ids_identical == 3 and t.n_identical == 2
    assert t.n_logprob_diff_same_ids == 0 and t.n_topk_diff_same_ids == 1
    assert not t.identical


def test_strict_prefix_and_length_difference():
    a = make_samples(3)
    b = mutate(a, 2, lambda s: s.copy(token_ids=s.token_ids[:5], logprobs=s.logprobs[:5]))
    for x, y in ((a, b), (b, a)):
        cmp = _cmp(x, y)
        (t,) = cmp.summaries
        assert t.n_length_diff == 1 and t.divergence_positions == (5,)
        (w,) = t.worst_divergence
        assert w.doc_id == 2 and w.pos == 5 and {w.len_a, w.len_b} == {5, 8}
        assert (w.token_a is None) != (w.token_b is None)
        i = int(np.flatnonzero(cmp.samples.doc_id == 2)[0])
        assert cmp.samples.shared_prefix[i] == 5


def test_divergence_followed_by_same_tokens_only_counts_prefix():
    a = make_samples(2)

    def change(s):
        ids, lps = list(s.token_ids), list(s.logprobs)
        ids[3] = 1
        lps[6] = lps[6] - 2.0  # after the divergence: must not count
        return s.copy(token_ids=ids, logprobs=lps)

    b = mutate(a, 0, change)
    (t,) = _cmp(a, b).summaries
    assert t.divergence_positions == (3,)
    assert t.max_abs_dlogprob == 0.0
    assert t.n_positions_compared == 3 + 8


def test_samples_on_one_side_only():
    a = make_samples(5)
    b = [s for s in a if s.doc_id not in (1, 4)] + [FakeSample(TASK, 9, [5, 6], [-0.1, -0.2])]
    (t,) = _cmp(a, b).summaries
    assert t.n_samples == 3 and t.only_a == 2 and t.only_b == 1
    assert t.only_a_keys == ((1, 0), (4, 0)) and t.only_b_keys == ((9, 0),)
    assert t.n_ids_identical == 3 and not t.identical


def test_empty_generation_counts_as_a_sample():
    a = make_samples(2) + [FakeSample(TASK, 5, [], [])]
    (t,) = _cmp(a, a).summaries
    assert t.n_samples == 3 and t.identical
    b = mutate(a, 5, lambda s: s.copy(token_ids=[1], logprobs=[-0.5]))
    (t,) = _cmp(a, b).summaries
    assert t.divergence_positions == (0,) and t.n_length_diff == 1


def test_without_samples_tables():
    a = make_samples(4)
    b = mutate(a, 0, set_token(0, 3))
    (t,) = _cmp(a, b, with_samples=False).summaries
    assert t.n_samples == 4 and t.divergence_positions == (0,)
    assert t.worst_divergence[0].response_a is None


def test_several_tasks_and_repeats_and_worst_order():
    a = make_samples(4) + make_samples(3, task="aaa", seed=1) + [
        s.copy(repeat=1) for s in make_samples(4, seed=2)
    ]
    b = mutate(a, 2, set_token(6, 1))
    b = mutate(b, 1, set_token(2, 1))
    b = mutate(b, 0, set_token(4, 1), task="aaa")
    cmp = _cmp(a, b, shuffle=True, worst_k=1)
    by_task = {t.task: t for t in cmp.summaries}
    assert [t.task for t in cmp.summaries] == ["aaa", TASK]
    t = by_task[TASK]
    assert t.n_samples == 8
    # docs 1 and 2 diverge at repeat 0 and at repeat 1 (the repeat-1 copies were mutated too)
    assert t.divergence_positions == (2, 2, 6, 6)
    assert len(t.worst_divergence) == 1 and (t.worst_divergence[0].doc_id, t.worst_divergence[0].pos) == (1, 2)
    assert by_task["aaa"].divergence_positions == (4,)


def test_swap_symmetry():
    a = make_samples(6)
    b = mutate(a, 3, set_token(5, 7))
    b = mutate(b, 1, lambda s: s.copy(logprobs=[x - 0.25 for x in s.logprobs]))
    (ab,) = _cmp(a, b).summaries
    (ba,) = _cmp(b, a).summaries
    for f in ("n_samples", "n_ids_identical", "n_identical", "divergence_positions", "max_abs_dlogprob"):
        assert getattr(ab, f) == getattr(ba, f)
    assert ab.worst_divergence[0].token_a == ba.worst_divergence[0].token_b


def test_duplicate_positions_rejected():
    a = make_samples(1)
    sa, ta = tables(a)
    import pyarrow as pa

    with pytest.raises(ValueError, match="duplicate"):
        compare_tokens(pa.concat_tables([ta, ta.slice(0, 1)]), ta, sa, sa)


# ---------------------------------------------------------------------------
# near-tie / hard divergences, top-k KL on the shared prefix
# ---------------------------------------------------------------------------

import math

from evalpipe.compare.tokens import NEAR_TIE_GAP, topk_kl
from fakes import set_step


def test_identical_inputs_kl_zero_and_topk_sets_equal():
    s = make_samples(6)
    (t,) = _cmp(s, s).summaries
    assert t.kl_p50 == t.kl_p99 == t.kl_max == 0.0
    assert t.n_positions_topk_equal == t.n_positions_compared == 48 and t.share_topk_equal == 1.0
    assert t.abs_dlogprob_p50 == t.abs_dlogprob_p99 == 0.0
    assert t.n_near_tie_divergences == t.n_hard_divergences == 0 and t.hard_divergences == ()
    assert t.near_tie_gap == NEAR_TIE_GAP
    d = t.to_dict()
    assert d["kl_max"] == 0.0 and d["share_topk_equal"] == 1.0 and d["hard_divergences"] == []


def test_kl_hand_computed_two_positions():
    ln = math.log
    a = [FakeSample(TASK, 0, [10, 20], [ln(0.5), ln(0.6)],
                    topk_ids=[[10, 11, 12], [20, 21, 22]],
                    topk_logprobs=[[ln(0.5), ln(0.3), ln(0.1)], [ln(0.6), ln(0.2), ln(0.1)]])]
    b = [FakeSample(TASK, 0, [10, 20], [ln(0.4), ln(0.3)],
                    topk_ids=[[10, 11, 13], [20, 21, 22]],
                    topk_logprobs=[[ln(0.4), ln(0.4), ln(0.1)], [ln(0.3), ln(0.3), ln(0.3)]])]
    # pos 0: union {10, 11, 12, 13}. A lists 0.5+0.3+0.1, leftover 0.1 -> token 13 (the only
    #   one A lacks) gets 0.1; B lists 0.4+0.4+0.1, leftover 0.1 -> token 12 gets 0.1.
    #   P = (0.5, 0.3, 0.1, 0.1), Q = (0.4, 0.4, 0.1, 0.1), both sum to 1 already:
    #   KL = 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.1 ln(1) + 0.1 ln(1)
    #      = 0.111572 - 0.086305 = 0.025267
    # pos 1: same ids {20, 21, 22}, nothing missing; renormalise over the union:
    #   P = (0.6, 0.2, 0.1) / 0.9 = (2/3, 2/9, 1/9), Q = (1/3, 1/3, 1/3)
    #   KL = 2/3 ln 2 + 2/9 ln(2/3) + 1/9 ln(1/3) = 0.462098 - 0.090103 - 0.122068 = 0.249927
    kl0 = 0.5 * ln(0.5 / 0.4) + 0.3 * ln(0.3 / 0.4)
    kl1 = 2 / 3 * ln(2) + 2 / 9 * ln(2 / 3) + 1 / 9 * ln(1 / 3)
    assert kl0 == pytest.approx(0.025267, abs=1e-6) and kl1 == pytest.approx(0.249927, abs=1e-6)
    cmp = _cmp(a, b)
    (t,) = cmp.summaries
    assert t.n_positions_compared == 2 and t.n_positions_topk_equal == 1 and t.share_topk_equal == 0.5
    assert t.kl_max == pytest.approx(kl1, rel=1e-5)
    assert t.kl_p50 == pytest.approx((kl0 + kl1) / 2, rel=1e-5)  # linear interpolation of 2 values
    assert t.kl_p99 == pytest.approx(kl0 + 0.99 * (kl1 - kl0), rel=1e-5)
    assert sorted(cmp.samples.prefix_kl) == pytest.approx([kl0, kl1], rel=1e-5)
    # |dlogprob|: ln(0.5/0.4) = 0.2231 and ln(0.6/0.3) = 0.6931
    assert t.max_abs_dlogprob == pytest.approx(ln(2), rel=1e-5)
    assert t.abs_dlogprob_p50 == pytest.approx((ln(1.25) + ln(2)) / 2, rel=1e-5)


def test_kl_floor_keeps_it_finite():
    ln = math.log
    # both lists already hold all the mass (leftover 0): the token a side lacks gets 0,
    # floored to 1e-12. P = (0.9, 0.1, 1e-12), Q = (0.9, 1e-12, 0.1), each / (1 + 1e-12):
    # KL ~= 0.1 ln(0.1 / 1e-12) + 1e-12 ln(1e-12 / 0.1) ~= 0.1 * 25.328 = 2.5328
    ids_a = np.array([[1, 2]]); lp_a = np.array([[ln(0.9), ln(0.1)]])
    ids_b = np.array([[1, 3]]); lp_b = np.array([[ln(0.9), ln(0.1)]])
    kl, same = topk_kl(ids_a, lp_a, ids_b, lp_b)
    assert kl[0] == pytest.approx(0.1 * ln(0.1 / 1e-12), rel=1e-6) and not same[0]
    # padding (-1 / -inf) is ignored; order does not matter for set equality
    kl, same = topk_kl(np.array([[2, 1, -1]]), np.array([[ln(0.1), ln(0.9), -np.inf]]), ids_a, lp_a)
    assert kl[0] == pytest.approx(0.0, abs=1e-12) and same[0]


def _diverging(doc: int, gap_a: float, gap_b: float, b_lists_a_token: bool = True):
    """A and B generate 7 vs 9 at position 2; A's top-k gap between them is gap_a, B's is gap_b."""
    base = FakeSample(TASK, doc, [5, 6, 7, 8], [-0.1, -0.1, -0.4, -0.1])
    a = set_step(2, 7, -0.4, [7, 9, 50], [-0.4, -0.4 - gap_a, -3.0])(base.copy())
    b_ids = [9, 7, 50] if b_lists_a_token else [9, 51, 50]
    b = set_step(2, 9, -0.4, b_ids, [-0.4, -0.4 - gap_b, -3.0])(base.copy())
    return a, b


def _near_tie_fixture():
    pairs = [
        _diverging(0, 0.2, 0.3),  # near-tie: each token in the other's top-k, gap 0.2 < 0.5
        _diverging(1, 0.2, 0.3, b_lists_a_token=False),  # hard: A's token not in B's top-k
        _diverging(2, 1.5, 1.2),  # hard: in both top-k lists but gap 1.5 > 0.5
    ]
    same = FakeSample(TASK, 3, [5, 6, 7, 8], [-0.1] * 4)
    return [p[0] for p in pairs] + [same], [p[1] for p in pairs] + [same.copy()]


def test_near_tie_vs_hard_divergence():
    a, b = _near_tie_fixture()
    cmp = _cmp(a, b, shuffle=True)
    (t,) = cmp.summaries
    assert t.divergence_positions == (2, 2, 2)
    assert t.n_near_tie_divergences == 1 and t.n_hard_divergences == 2
    assert t.hard_divergences == ((1, 0, 2), (2, 0, 2))
    d = cmp.samples
    assert d.near_tie.tolist() == [True, False, False, False]
    # A's gap is defined whenever B's token is in A's top-k (doc 1 is hard for the other reason)
    assert d.divergence_gap[:3] == pytest.approx([0.2, 0.2, 1.5], abs=1e-6) and np.isnan(d.divergence_gap[3])
    # the threshold is a keyword: at 2 nats the 1.5-nat divergence is a near-tie too
    sa, ta = tables(a)
    sb, tb = tables(b)
    (t2,) = compare_tokens(ta, tb, sa, sb, near_tie_gap=2.0).summaries
    assert t2.n_near_tie_divergences == 2 and t2.hard_divergences == ((1, 0, 2),) and t2.near_tie_gap == 2.0
    j = t.to_dict()
    assert j["n_near_tie_divergences"] == 1 and j["hard_divergences"] == [[1, 0, 2], [2, 0, 2]]


def test_near_tie_classification_survives_swap():
    a, b = _near_tie_fixture()
    (ab,) = _cmp(a, b).summaries
    (ba,) = _cmp(b, a).summaries
    for f in ("n_near_tie_divergences", "n_hard_divergences", "hard_divergences"):
        assert getattr(ab, f) == getattr(ba, f)
    assert ab.kl_max is not None and ba.kl_max is not None


def test_length_divergence_is_hard():
    a = make_samples(3)
    b = mutate(a, 2, lambda s: s.copy(token_ids=s.token_ids[:5], logprobs=s.logprobs[:5]))
    (t,) = _cmp(a, b).summaries
    assert t.n_near_tie_divergences == 0 and t.n_hard_divergences == 1 and t.hard_divergences == ((2, 0, 5),)


def test_hard_divergence_list_is_capped():
    a = make_samples(25)
    b = [s.copy() for s in a]
    for s in b:
        s.token_ids[0] = 1  # default top-k [1, 2, 3] does not hold A's token
    (t,) = _cmp(a, b).summaries
    assert t.n_hard_divergences == 25 and len(t.hard_divergences) == 20
    assert t.hard_divergences[0] == (0, 0, 0)
