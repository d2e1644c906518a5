import numpy as np
import pytest
from fakes import TASK, FakeSample, make_samples, mutate, set_token, tables

from evalpipe.compare.tokens import compare_tokens
from evalpipe.errors import UserError


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
    assert t.divergence_positions == [] and t.median_first_divergence is None
    assert t.max_abs_dlogprob == 0.0 and t.mean_abs_dlogprob == 0.0
    assert t.n_positions_compared == 6 * 8 and t.tokens_a == t.tokens_b == 48
    assert t.worst_divergence == [] and t.worst_logprob == []


def test_one_token_changed():
    a = make_samples(6)
    b = mutate(a, 3, set_token(5, 7))
    cmp = _cmp(a, b, shuffle=True)
    (t,) = cmp.summaries
    assert not t.identical
    assert t.n_ids_identical == 5 and t.n_identical == 5
    assert t.divergence_positions == [5] and t.median_first_divergence == 5.0
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
        assert t.n_length_diff == 1 and t.divergence_positions == [5]
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
    assert t.divergence_positions == [3]
    assert t.max_abs_dlogprob == 0.0
    assert t.n_positions_compared == 3 + 8


def test_samples_on_one_side_only():
    a = make_samples(5)
    b = [s for s in a if s.doc_id not in (1, 4)] + [FakeSample(TASK, 9, [5, 6], [-0.1, -0.2])]
    (t,) = _cmp(a, b).summaries
    assert t.n_samples == 3 and t.only_a == 2 and t.only_b == 1
    assert t.only_a_keys == [(1, 0), (4, 0)] and t.only_b_keys == [(9, 0)]
    assert t.n_ids_identical == 3 and not t.identical


def test_empty_generation_counts_as_a_sample():
    a = make_samples(2) + [FakeSample(TASK, 5, [], [])]
    (t,) = _cmp(a, a).summaries
    assert t.n_samples == 3 and t.identical
    b = mutate(a, 5, lambda s: s.copy(token_ids=[1], logprobs=[-0.5]))
    (t,) = _cmp(a, b).summaries
    assert t.divergence_positions == [0] and t.n_length_diff == 1


def test_without_samples_tables():
    a = make_samples(4)
    b = mutate(a, 0, set_token(0, 3))
    (t,) = _cmp(a, b, with_samples=False).summaries
    assert t.n_samples == 4 and t.divergence_positions == [0]
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
    assert t.divergence_positions == [2, 2, 6, 6]
    assert len(t.worst_divergence) == 1 and (t.worst_divergence[0].doc_id, t.worst_divergence[0].pos) == (1, 2)
    assert by_task["aaa"].divergence_positions == [4]


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

    with pytest.raises(UserError, match="duplicate"):
        compare_tokens(pa.concat_tables([ta, ta.slice(0, 1)]), ta, sa, sa)


# near-tie / hard divergences, top-k KL on the shared prefix

import math

from fakes import set_step

from evalpipe.compare.token_results import NEAR_TIE_GAP


def test_identical_inputs_kl_zero_and_topk_sets_equal():
    s = make_samples(6)
    (t,) = _cmp(s, s).summaries
    assert t.kl_p50 == t.kl_p99 == t.kl_max == 0.0
    assert t.n_positions_topk_equal == t.n_positions_compared == 48 and t.share_topk_equal == 1.0
    assert t.abs_dlogprob_p50 == t.abs_dlogprob_p99 == 0.0
    assert t.n_near_tie_divergences == t.n_hard_divergences == 0 and t.hard_divergences == []
    assert t.near_tie_gap == NEAR_TIE_GAP
    d = t.model_dump(mode="json")
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
    # The summaries use max(KL(A||B), KL(B||A)) per position. Reverse directions:
    #   pos 0: KL(Q||P) = 0.4 ln(0.4/0.5) + 0.4 ln(0.4/0.3) = -0.089257 + 0.115073 = 0.025816
    #   pos 1: KL(Q||P) = 1/3 [ln(1/2) + ln(3/2) + ln 3] = 1/3 ln(9/4) = 0.270310
    # both larger than the forward ones, so the symmetric values are the reverse ones.
    kl0_r = 0.4 * ln(0.4 / 0.5) + 0.4 * ln(0.4 / 0.3)
    kl1_r = ln(9 / 4) / 3
    assert kl0_r == pytest.approx(0.025816, abs=1e-6) and kl1_r == pytest.approx(0.270310, abs=1e-6)
    cmp = _cmp(a, b)
    (t,) = cmp.summaries
    assert t.n_positions_compared == 2 and t.n_positions_topk_equal == 1 and t.share_topk_equal == 0.5
    assert t.kl_max == pytest.approx(kl1_r, rel=1e-5)
    assert t.kl_p50 == pytest.approx((kl0_r + kl1_r) / 2, rel=1e-5)  # linear interpolation of 2 values
    assert t.kl_p99 == pytest.approx(kl0_r + 0.99 * (kl1_r - kl0_r), rel=1e-5)
    assert sorted(cmp.samples.prefix_kl) == pytest.approx([kl0_r, kl1_r], rel=1e-5)
    assert sorted(cmp.samples.prefix_kl_ab) == pytest.approx([kl0, kl1], rel=1e-5)  # the forward KL is kept
    assert t.kl_max_at == (0, 0, 1)
    # |dlogprob|: ln(0.5/0.4) = 0.2231 and ln(0.6/0.3) = 0.6931
    assert t.max_abs_dlogprob == pytest.approx(ln(2), rel=1e-5)
    assert t.abs_dlogprob_p50 == pytest.approx((ln(1.25) + ln(2)) / 2, rel=1e-5)


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
    assert t.divergence_positions == [2, 2, 2]
    assert t.n_near_tie_divergences == 1 and t.n_hard_divergences == 2
    assert t.hard_divergences == [(1, 0, 2), (2, 0, 2)]
    d = cmp.samples
    assert d.near_tie.tolist() == [True, False, False, False]
    # A's gap is defined whenever B's token is in A's top-k (doc 1 is hard for the other reason)
    assert d.divergence_gap[:3] == pytest.approx([0.2, 0.2, 1.5], abs=1e-6) and np.isnan(d.divergence_gap[3])
    # the threshold is a keyword: at 2 nats the 1.5-nat divergence is a near-tie too
    sa, ta = tables(a)
    sb, tb = tables(b)
    (t2,) = compare_tokens(ta, tb, sa, sb, near_tie_gap=2.0).summaries
    assert t2.n_near_tie_divergences == 2 and t2.hard_divergences == [(1, 0, 2)] and t2.near_tie_gap == 2.0
    j = t.model_dump(mode="json")
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
    assert t.n_near_tie_divergences == 0 and t.n_hard_divergences == 1 and t.hard_divergences == [(2, 0, 5)]


def test_hard_divergence_list_is_capped():
    a = make_samples(25)
    b = [s.copy() for s in a]
    for s in b:
        s.token_ids[0] = 1  # default top-k [1, 2, 3] does not hold A's token
    (t,) = _cmp(a, b).summaries
    assert t.n_hard_divergences == 25 and len(t.hard_divergences) == 20
    assert t.hard_divergences[0] == (0, 0, 0)


# top-1 agreement, symmetric KL, worst-KL examples with context, histograms

import json

import pyarrow as pa

from evalpipe.compare.token_results import CONTEXT_TOKENS, HIST_DECADES
from evalpipe.compare.token_summary import _decade_hist


def _with_text(table: pa.Table) -> pa.Table:
    """``table`` with token_text "<doc.pos>" on every row, so contexts are easy to read."""
    docs, pos = table.column("doc_id").to_pylist(), table.column("pos").to_pylist()
    i = table.schema.get_field_index("token_text")
    return table.set_column(i, "token_text", pa.array([f"<{d}.{p}>" for d, p in zip(docs, pos)], pa.string()))


def _forced(a_lists, b_lists):
    """A teacher-forced pair: both sides score the same tokens (A's top-1), each with its own top-k.

    ``*_lists`` are per position (topk_ids, topk_logprobs); a side's token logprob is its
    top-k entry for the forced token, or -4 when it does not list it.
    """
    tokens = [ids[0] for ids, _ in a_lists]

    def side(lists):
        lps = [dict(zip(ids, lp)).get(tok, -4.0) for tok, (ids, lp) in zip(tokens, lists)]
        return FakeSample(TASK, 0, list(tokens), lps, topk_ids=[list(i) for i, _ in lists],
                          topk_logprobs=[list(lp) for _, lp in lists])

    return [side(a_lists)], [side(b_lists)]


# pos 0: near tie: top-1 10 vs 11, each in the other's list; A's gap 0.2, B's gap 0.2
# pos 1: hard by A's gap: A 20 vs B 21, A's gap |-0.3 - -1.0| = 0.7 >= 0.5 (B's gap 0.2)
# pos 2: hard: A's top-1 30 is not in B's list (B's top-1 31 is in A's, gap 0.2)
# pos 3: hard by B's gap: A's gap 0.2, B's gap |-0.45 - -1.2| = 0.75 >= 0.5
# pos 4: same lists, top-1 agrees
_TOP1 = [  # per position: (A's top-k ids, logprobs), (B's top-k ids, logprobs)
    (([10, 11, 12], [-0.5, -0.7, -3.0]), ([11, 10, 12], [-0.6, -0.8, -3.0])),
    (([20, 21, 22], [-0.3, -1.0, -2.0]), ([21, 20, 22], [-0.5, -0.7, -2.0])),
    (([30, 31, 32], [-0.4, -0.6, -2.0]), ([31, 33, 34], [-0.2, -2.5, -3.0])),
    (([40, 41, 42], [-0.4, -0.6, -2.0]), ([41, 40, 42], [-0.45, -1.2, -2.0])),
    (([50, 51, 52], [-0.1, -2.0, -3.0]), ([50, 51, 52], [-0.1, -2.0, -3.0])),
]
_TOP1_A, _TOP1_B = [a for a, _ in _TOP1], [b for _, b in _TOP1]


def test_top1_near_tie_vs_hard_hand_computed():
    a, b = _forced(_TOP1_A, _TOP1_B)
    (t,) = _cmp(a, b).summaries
    assert t.n_ids_identical == 1 and t.n_positions_compared == 5  # forced: the whole sequence is compared
    assert t.n_top1_disagree == 4 and t.n_top1_hard == 3
    assert t.share_top1_agree == pytest.approx(0.2)
    assert t.top1_hard_positions == [(0, 0, 1), (0, 0, 2), (0, 0, 3)]
    # the threshold is the same keyword as for first divergences: at 1 nat only pos 2 stays hard
    sa, ta = tables(a)
    sb, tb = tables(b)
    (t1,) = compare_tokens(ta, tb, sa, sb, near_tie_gap=1.0).summaries
    assert t1.n_top1_disagree == 4 and t1.n_top1_hard == 1 and t1.top1_hard_positions == [(0, 0, 2)]
    j = t.model_dump(mode="json")
    assert j["n_top1_hard"] == 3 and j["top1_hard_positions"] == [[0, 0, 1], [0, 0, 2], [0, 0, 3]]


def test_top1_identical_and_empty():
    s = make_samples(3)
    (t,) = _cmp(s, s).summaries
    assert t.n_top1_disagree == t.n_top1_hard == 0 and t.share_top1_agree == 1.0 and t.top1_hard_positions == []
    (t,) = _cmp([FakeSample(TASK, 0, [], [])], [FakeSample(TASK, 0, [], [])]).summaries
    assert t.n_positions_compared == 0 and t.share_top1_agree is None and t.kl_max is None and t.kl_max_at is None


def test_top1_counts_and_kl_summaries_survive_swap():
    a, b = _forced(_TOP1_A, _TOP1_B)
    cmp_ab, cmp_ba = _cmp(a, b), _cmp(b, a)
    (ab,), (ba,) = cmp_ab.summaries, cmp_ba.summaries
    # pos 1 is hard on A's gap and pos 3 on B's: with A's gap alone each would flip class on swap
    for f in ("n_top1_disagree", "n_top1_hard", "share_top1_agree", "top1_hard_positions", "kl_p50", "kl_p99",
              "kl_max", "kl_max_at", "kl_hist", "abs_dlogprob_hist", "n_positions_topk_equal"):
        assert getattr(ab, f) == getattr(ba, f), f  # exactly: the union is summed in id order
    assert np.array_equal(cmp_ab.samples.prefix_kl, cmp_ba.samples.prefix_kl)
    assert ab.kl_max > 0


def test_first_divergence_hard_when_either_gap_is_large():
    # A's gap 0.2 (near), B's gap 0.8 (not): hard whichever side is the reference
    a, b = _diverging(0, 0.2, 0.8)
    for x, y in (([a], [b]), ([b], [a])):
        (t,) = _cmp(x, y).summaries
        assert t.n_near_tie_divergences == 0 and t.n_hard_divergences == 1 and t.hard_divergences == [(0, 0, 2)]


def _kl_fixture():
    """Two samples, logprob -0.5 everywhere; B changes one runner-up logprob at four positions.

    The change d at (doc 0, pos 27) = 1.0, (doc 0, pos 3) = (doc 1, pos 2) = 0.5 (equal KL:
    key order decides), (doc 1, pos 4) = 0.1; larger d, larger KL.
    """
    a = [FakeSample(TASK, 0, list(range(100, 130)), [-0.5] * 30), FakeSample(TASK, 1, list(range(200, 206)), [-0.5] * 6)]
    b = [s.copy() for s in a]
    for s, pos, d in ((0, 27, 1.0), (0, 3, 0.5), (1, 2, 0.5), (1, 4, 0.1)):
        ids, lps = b[s].topk()
        lps = [list(x) for x in lps]
        lps[pos][1] -= d
        b[s] = b[s].copy(topk_ids=ids, topk_logprobs=lps)
    return a, b


def test_worst_kl_order_context_and_kl_max_at():
    a, b = _kl_fixture()
    sa, ta = tables(a)
    sb, tb = tables(b)
    cmp = compare_tokens(_with_text(ta), tb, sa, sb, worst_k=3)
    (t,) = cmp.summaries
    assert [(w.kind, w.doc_id, w.pos) for w in t.worst_kl] == [("largest_kl", 0, 27), ("largest_kl", 0, 3), ("largest_kl", 1, 2)]
    kls = [w.kl for w in t.worst_kl]
    assert kls[0] > kls[1] == kls[2] > 0 and kls[0] == t.kl_max
    assert t.kl_max_at == (0, 0, 27)
    w0, w1 = t.worst_kl[0], t.worst_kl[1]
    # 24 tokens before pos 27 are pos 3..26; pos 0..2 exist, hence the ellipsis
    assert CONTEXT_TOKENS == 24
    assert w0.context == "\u2026" + "".join(f"<0.{p}>" for p in range(3, 27)) + "[[<0.27>]]"
    assert w1.context == "<0.0><0.1><0.2>[[<0.3>]]"
    assert w0.token_a == w0.token_b == 127 and w0.topk_logprobs_b[1] == pytest.approx(-2.5)
    # the largest-|dlogprob| examples carry context and KL too (token logprobs are equal here: none)
    assert t.worst_logprob == []
    d = t.model_dump(mode="json")
    assert d["worst_kl"][0]["context"] == w0.context and d["kl_max_at"] == [0, 0, 27]
    # A's token texts absent (null column, or no column): no context, the rest unchanged
    for ta_plain in (ta, ta.drop_columns(["token_text"])):
        (u,) = compare_tokens(ta_plain, tb, sa, sb, worst_k=3).summaries
        assert [w.context for w in u.worst_kl] == [None] * 3
        assert [(w.doc_id, w.pos, w.kl) for w in u.worst_kl] == [(w.doc_id, w.pos, w.kl) for w in t.worst_kl]


def test_worst_kl_ignores_zero_kl_and_respects_worst_k():
    s = make_samples(3)
    (t,) = _cmp(s, s).summaries
    assert t.worst_kl == [] and t.kl_max == 0.0 and t.kl_max_at is None
    a, b = _kl_fixture()
    (t,) = _cmp(a, b, worst_k=10).summaries
    assert [(w.doc_id, w.pos) for w in t.worst_kl] == [(0, 27), (0, 3), (1, 2), (1, 4)]
    (t,) = _cmp(a, b, worst_k=0).summaries
    assert t.worst_kl == [] and t.kl_max_at == (0, 0, 27)


def test_context_of_divergence_examples():
    a = make_samples(3)
    b = mutate(a, 2, lambda s: s.copy(token_ids=s.token_ids[:5], logprobs=s.logprobs[:5]))
    sa, ta = tables(a)
    sb, tb = tables(b)
    # A is the longer one: its token at the divergence is marked
    (t,) = compare_tokens(_with_text(ta), _with_text(tb), sa, sb).summaries
    (w,) = t.worst_divergence
    assert w.kl is None and w.context == "<2.0><2.1><2.2><2.3><2.4>[[<2.5>]]"
    # A ended first: nothing to mark
    (t,) = compare_tokens(_with_text(tb), _with_text(ta), sb, sa).summaries
    assert t.worst_divergence[0].context == "<2.0><2.1><2.2><2.3><2.4>[[]]"


def test_logprob_example_has_kl_and_context():
    a = make_samples(2)
    b = mutate(a, 1, lambda s: s.copy(logprobs=s.logprobs[:3] + [s.logprobs[3] - 0.25] + s.logprobs[4:]))
    sa, ta = tables(a)
    sb, tb = tables(b)
    (t,) = compare_tokens(_with_text(ta), tb, sa, sb).summaries
    (w,) = t.worst_logprob
    assert (w.doc_id, w.pos) == (1, 3) and w.context == "<1.0><1.1><1.2>[[<1.3>]]"
    assert w.kl is not None and w.kl > 0 and w.kl == t.kl_max


def test_decade_histogram_bins():
    decades = list(HIST_DECADES)
    assert decades == list(range(-10, 3)) and len(decades) == 13
    # Edges are the decimal literals as parsed (correctly rounded everywhere), never a
    # libm log10/pow result, so these cases hold on every CPU.
    powers = np.array([float(f"1e{d}") for d in decades])
    zero, counts = _decade_hist(powers)
    assert zero == 0 and counts == (1,) * 13
    # one ulp below a power of ten belongs to the decade below
    zero, counts = _decade_hist(np.nextafter(powers[1:], 0))
    assert counts == (1,) * 12 + (0,)
    # one ulp above stays in the power's own decade
    zero, counts = _decade_hist(np.nextafter(powers, np.inf))
    assert counts == (1,) * 13
    x = np.array([0.0, 0.0, 0.0, 1e-300, 3e-11, 1e-10, 9.99e-10, 1e-9, 0.5, 1.0, 99.9, 100.0, 1e5, np.inf, np.nan])
    zero, counts = _decade_hist(x)
    assert zero == 3
    expected = [0] * 13
    for dec in (-10, -10, -10, -10, -9, -1, 0, 1, 2, 2, 2):  # below 1e-10 clips up, >= 100 and inf clip down
        expected[dec + 10] += 1
    assert list(counts) == expected  # NaN counted nowhere
    assert _decade_hist(np.zeros(0)) == (0, (0,) * 13)


def test_histograms_in_summary_and_json():
    s = make_samples(4)
    (t,) = _cmp(s, s).summaries
    assert t.kl_hist.zero == t.abs_dlogprob_hist.zero == t.n_positions_compared == 32
    assert t.kl_hist.counts == t.abs_dlogprob_hist.counts == [0] * 13
    b = mutate(s, 1, lambda x: x.copy(logprobs=[x.logprobs[0] - 0.25] + x.logprobs[1:]))
    (t,) = _cmp(s, b).summaries
    # one position moved by 0.25 nats (float32 rounding: still the 1e-1 decade); its KL is positive too
    assert t.abs_dlogprob_hist.zero == 31 and t.abs_dlogprob_hist.counts[HIST_DECADES.index(-1)] == 1
    assert t.kl_hist.zero == 31 and sum(t.kl_hist.counts) == 1
    d = t.model_dump(mode="json")
    for name in ("kl_hist", "abs_dlogprob_hist"):
        assert set(d[name]) == {"decades", "zero", "counts"}
        assert d[name]["decades"] == list(range(-10, 3)) and len(d[name]["counts"]) == 13
    assert d["abs_dlogprob_hist"]["zero"] == 31 and d["abs_dlogprob_hist"]["counts"][9] == 1
    assert not any(k.endswith("_hist_zero") for k in d)
    assert json.loads(json.dumps(d)) == d  # plain JSON


def test_chunked_and_ragged_tables_give_the_same_result():
    a = make_samples(5)
    b = mutate(a, 1, lambda s: s.copy(logprobs=[x - 0.01 for x in s.logprobs]))
    # ragged top-k: one position lists a single token on both sides, another two on B only
    def ragged(s, extra):
        ids, lps = s.topk()
        ids, lps = [list(x) for x in ids], [list(x) for x in lps]
        ids[2], lps[2] = ids[2][:1], lps[2][:1]
        ids[4], lps[4] = ids[4][: 2 + extra], lps[4][: 2 + extra]
        return s.copy(topk_ids=ids, topk_logprobs=lps)

    a = mutate(a, 3, lambda s: ragged(s, 1))
    b = mutate(b, 3, lambda s: ragged(s, 0))
    sa, ta = tables(a)
    sb, tb = tables(b)
    whole = compare_tokens(ta, tb, sa, sb)
    pieces = compare_tokens(pa.concat_tables([ta.slice(0, 7), ta.slice(7, 20), ta.slice(27)]),
                            pa.concat_tables([tb.slice(0, 13), tb.slice(13)]), sa, sb)
    assert whole.summaries == pieces.summaries
    (t,) = whole.summaries
    assert t.n_ids_identical == 5 and t.n_identical == 3 and t.n_topk_diff_same_ids == 1
    assert t.n_positions_topk_equal == 39  # doc 3 pos 4: B lacks A's third token


def test_packed_position_join_matches_the_plain_join():
    from evalpipe.compare.scores import align_keys
    from evalpipe.compare.tokens import TOKEN_KEY, _align_positions

    a = make_samples(4) + make_samples(3, task="aaa", seed=1) + [FakeSample(TASK, -7, [1, 2], [-0.1, -0.2])]
    b = [s.copy(repeat=1) if s.doc_id == 2 else s.copy() for s in a[1:]]
    _, ta = tables(a)
    _, tb = tables(b)
    huge = tb.set_column(1, "doc_id", pa.array([d + (1 << 60) * (i % 2) for i, d in enumerate(tb.column("doc_id").to_pylist())]))
    for x, y in ((ta, tb), (tb, ta), (ta, huge), (ta, ta.slice(0, 0))):  # the last two take the plain join
        got = _align_positions(x, y)
        want = align_keys(x.select(list(TOKEN_KEY)), y.select(list(TOKEN_KEY)), TOKEN_KEY)
        assert all(np.array_equal(g, w) for g, w in zip(got.codes, want.codes))
        assert np.array_equal(got.idx_a, want.idx_a) and np.array_equal(got.idx_b, want.idx_b)
    with pytest.raises(UserError, match=r"duplicate token positions for key \{'task': 1, 'doc_id': 0"):
        _align_positions(pa.concat_tables([ta, ta.slice(0, 1)]), tb)


def test_worst_examples_carry_token_and_topk_texts_from_the_traces():
    from fakes import make_samples, mutate, tables

    a = make_samples(3, length=4)
    b = mutate(a, 1, lambda s: s.copy(logprobs=[s.logprobs[0]] + [s.logprobs[1] - 0.5] + s.logprobs[2:]))
    sa, ta = tables(a)
    sb, tb = tables(b)

    def with_text(t):
        return t.set_column(t.column_names.index("token_text"), "token_text", pa.array([f"<{i}>" for i in t["token_id"].to_pylist()]))

    cmp = compare_tokens(with_text(ta), with_text(tb), sa, sb)
    (w,) = cmp.summaries[0].worst_logprob[:1]
    assert (w.doc_id, w.pos) == (1, 1)
    assert w.token_text_a == f"<{w.token_a}>" and w.token_text_b == f"<{w.token_b}>"
    # top-k entries are known where the id was generated somewhere in the traces
    assert w.topk_texts_a[0] == f"<{w.topk_ids_a[0]}>"
    assert len(w.topk_texts_a) == len(w.topk_ids_a)
    plain = compare_tokens(ta, tb, sa, sb).summaries[0].worst_logprob[0]
    assert plain.token_text_a is None and plain.topk_texts_a is None


def test_nan_logprobs_on_one_side_are_the_largest_difference_not_missing_data():
    # An fp16 overflow makes one variant's logits NaN: every measure must say "maximal".
    a = make_samples(3, length=4)
    nan = float("nan")
    b = mutate(a, 1, lambda s: s.copy(logprobs=[nan] * 4, topk_logprobs=[[nan, nan, nan]] * 4))
    (sa, ta), (sb, tb) = tables(a), tables(b)
    (t,) = compare_tokens(ta, tb, sa, sb).summaries
    assert t.kl_max == float("inf") and t.max_abs_dlogprob == float("inf")
    assert t.n_top1_hard == 4, "same top-1 id, but a NaN distribution is no near tie"
    assert t.kl_p99 == float("inf") and t.kl_p50 == 0.0
    d = json.loads(t.model_dump_json())
    assert d["kl_max"] is None, "JSON has no infinity: null, and the gates read the summary itself"
