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
