"""Gates (evalpipe.compare.gates) and the IDENTICAL / EQUIVALENT / DIVERGENT verdict.

Unit tests use hand-computed statistics; the property tests check what must hold for
any data: a run against itself is IDENTICAL, swapping the sides keeps the status, and
a larger difference is never judged better than a smaller one.
"""

import json
import types

import pytest
from fakes import (
    METRIC,
    TASK,
    make_samples,
    mutate,
    perturb_topk,
    set_token,
    swap_top1,
    tables,
    token_table,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from evalpipe.compare import Status, compare_tables, decide
from evalpipe.compare.gates import (
    NO_TEACHER,
    NO_TEACHER_TASK,
    AASummaries,
    GateResult,
    evaluate_gates,
)
from evalpipe.config.gate_settings import Gates, ScoreGates, TokenGates, Tolerance
from evalpipe.gates import registry

PROPS = settings(max_examples=50, deadline=None)


def _vc(a, b, teacher_a=None, teacher_b=None, gates=None, aa=None):
    sa, ta = tables(a)
    sb, tb = tables(b)
    return compare_tables(
        sa, ta, sb, tb, label_a="legacy", label_b="sp", gates=gates, aa=aa,
        teacher_a=None if teacher_a is None else token_table(teacher_a),
        teacher_b=None if teacher_b is None else token_table(teacher_b),
    )


def _gates(margin=0.01, alpha=0.05, **tokens) -> Gates:
    return Gates(scores=ScoreGates(margin=margin, alpha=alpha), tokens=TokenGates(**tokens))


def _by_name(results, gate, task=TASK) -> GateResult:
    (g,) = [g for g in results if g.gate == gate and g.task == task]
    return g


def _flip(docs, to=0.0):
    def fn(samples):
        for d in docs:
            samples = mutate(samples, d, lambda s: s.copy(scores={METRIC: to}))
        return samples

    return fn


def _summary(**fields):
    """A free-running token summary of ``TASK`` with some fields overridden (also fields tokens.py may lack)."""
    s = make_samples(2)
    (t,) = _vc(s, s).tokens.summaries
    return types.SimpleNamespace(**{**t.__dict__, **fields})


# --- score gates --------------------------------------------------------------------


def test_equivalence_gate_hand_computed():
    # 10 items right on A, one wrong on B: d = (-1, 0 x 9), mean -0.1, sd sqrt(0.1), SE 0.1,
    # df 9, t(0.95, 9) = 1.8331: the 90% interval is [-0.2833, +0.0833].
    a = make_samples(10, scores=[1.0] * 10)
    b = _flip([4])(a)
    ok = _vc(a, b, gates=_gates(margin=0.5))
    g = _by_name(ok.verdict.gates, "score_equivalence")
    assert (g.status, g.metric, g.threshold) == ("pass", METRIC, 0.5)
    assert g.measured == pytest.approx(0.1 + 1.833113 * 0.1, abs=1e-6)
    assert g.detail == f"{TASK} {METRIC} score_equivalence: 90% CI [-0.283, +0.0833] inside \u00b10.5 (n 10)"
    bad = _vc(a, b, gates=_gates(margin=0.2))
    g = _by_name(bad.verdict.gates, "score_equivalence")
    assert g.status == "fail" and g.evidence == ("doc 4 repeat 0",)
    # minimum detectable difference: (t(0.975, 9) + t(0.8, 9)) x SE = (2.2622 + 0.8834) x 0.1
    assert g.detail == (
        f"{TASK} {METRIC} score_equivalence: 90% CI [-0.283, +0.0833] not inside \u00b10.2 "
        "(n 10, \u0394 -0.1, minimum detectable difference 0.315); flipped: doc 4 repeat 0"
    )
    assert bad.status is Status.DIVERGENT and bad.verdict.reasons[0] == g.detail


def test_mcnemar_gate_hand_computed():
    # 6 right->wrong, 0 wrong->right: p = 2 x 0.5^6 = 0.03125
    a = make_samples(10, scores=[1.0] * 10)
    b = _flip(range(6))(a)
    g = _by_name(_vc(a, b, gates=_gates(margin=0.9)).verdict.gates, "score_mcnemar")
    assert (g.status, g.measured, g.threshold) == ("fail", 0.03125, 0.05)
    assert g.detail == (
        f"{TASK} {METRIC} score_mcnemar: McNemar exact p 0.0312 < 0.05 (6 right\u2192wrong, 0 wrong\u2192right, n 10); "
        "flipped: doc 0 repeat 0, doc 1 repeat 0, doc 2 repeat 0, \u2026"
    )
    assert len(g.evidence) == 6
    vc = _vc(a, b, gates=_gates(margin=0.9, alpha=0.01))
    g = _by_name(vc.verdict.gates, "score_mcnemar")
    assert g.status == "pass" and g.detail.endswith("p 0.0312 >= 0.01 (6 right\u2192wrong, 0 wrong\u2192right, n 10)")
    # the equivalence gate at margin 0.9 fails too: -0.6 - t(0.99, 9) x SE leaves the margin
    assert vc.status is Status.DIVERGENT


def test_score_gates_skip_non_binary_without_t_test():
    a = make_samples(4, scores=[0.5, 0.25, 1.0, 0.0])
    b = _flip([0], to=0.75)(a)
    results = _vc(a, b, gates=_gates(margin=0.5)).verdict.gates
    g = _by_name(results, "score_mcnemar")
    assert g.status == "skip" and g.measured is None and "no paired t-test p-value" in g.detail
    assert _by_name(results, "score_equivalence").status in ("pass", "fail")


def test_identical_score_row_passes_trivially_and_gates_can_be_off():
    s = make_samples(3)
    vc = _vc(s, s)
    eq, mc = _by_name(vc.verdict.gates, "score_equivalence"), _by_name(vc.verdict.gates, "score_mcnemar")
    assert (eq.status, eq.measured, mc.status, mc.measured) == ("pass", 0.0, "pass", 1.0)
    assert eq.detail == f"{TASK} {METRIC} score_equivalence: scores identical on all 3 items"
    off = Gates(scores=ScoreGates(require_equivalence=False, fail_on_significant=False))
    a = make_samples(10, scores=[1.0] * 10)
    vc = _vc(a, _flip(range(6))(a), gates=off)
    assert not [g for g in vc.verdict.gates if g.gate.startswith("score_")]
    assert vc.status is Status.EQUIVALENT  # a score change the config chose not to gate


def test_rows_must_use_the_gates_margin():
    s = make_samples(3)
    row = _vc(s, s).scores.rows[0]
    with pytest.raises(ValueError, match="computed with margin 0.01 .* gates ask for margin 0.2"):
        evaluate_gates([row], [], None, _gates(margin=0.2))


# --- token gates --------------------------------------------------------------------


def test_hard_divergence_gate_bounds():
    a = make_samples(6)
    b = mutate(mutate(a, 1, set_token(2, 7)), 4, set_token(5, 7))
    (t,) = _vc(a, b).tokens.summaries
    assert t.n_hard_divergences == 2

    def gate(tol, aa=None):
        results = evaluate_gates([], [t], None, Gates(tokens=TokenGates(free_hard_divergences=tol)), aa)
        return _by_name(results, "free_hard_divergences")

    g = gate(Tolerance(abs=0))
    assert (g.status, g.measured, g.threshold, g.aa_value) == ("fail", 2.0, 0.0, None)
    assert g.evidence == ("doc 1 repeat 0 pos 2", "doc 4 repeat 0 pos 5")
    assert g.detail == (
        f"{TASK} free_hard_divergences: 2 > 0 (abs 0; no A/A value); first at doc 1 repeat 0 pos 2, doc 4 repeat 0 pos 5"
    )
    assert gate(Tolerance(abs=2)).status == "pass"  # the bound itself passes
    aa = AASummaries.of([_summary(n_hard_divergences=1)])
    g = gate(Tolerance(abs=0, rel_aa=3), aa)  # bound max(0, 3 x 1) = 3
    assert (g.status, g.threshold, g.aa_value) == ("pass", 3.0, 1.0)
    assert g.detail == f"{TASK} free_hard_divergences: 2 <= 3 (max(abs 0, 3 x A/A 1))"
    g = gate(Tolerance(abs=0, rel_aa=None), aa)  # the A/A value is ignored
    assert (g.status, g.threshold) == ("fail", 0.0) and "A/A not used" in g.detail


def test_teacher_kl_gates_relative_to_aa():
    worst = types.SimpleNamespace(doc_id=5, repeat=1, pos=2)
    t = _summary(kl_p99=0.15, kl_max=0.4, kl_max_at=(3, 0, 12), worst_kl=(worst,))
    aa = AASummaries.of([], [_summary(kl_p99=0.0, kl_max=0.2)])
    results = evaluate_gates([], [_summary()], [t], Gates(), aa)
    p99, mx = _by_name(results, "teacher_kl_p99"), _by_name(results, "teacher_kl_max")
    assert p99.detail == (
        f"{TASK} teacher_kl_p99: 0.15 > 0.001 (max(half floor 0.001, 3 x A/A 0)); worst at doc 3 repeat 0 pos 12, doc 5 repeat 1 pos 2"
    )
    assert p99.evidence == ("doc 3 repeat 0 pos 12", "doc 5 repeat 1 pos 2")
    # max: bound max(0.1, 3 x 0.2) = 0.6 (up to rounding), 0.4 passes
    assert (mx.status, mx.measured, mx.aa_value) == ("pass", 0.4, 0.2)
    assert mx.threshold == pytest.approx(0.6)


def test_teacher_kl_measured_from_data():
    ta = make_samples(4, seed=2)
    tb = mutate(ta, 2, perturb_topk(2.0, [3]))
    s = make_samples(4)
    vc = _vc(s, s, ta, tb)
    (tt,) = vc.teacher.summaries
    assert tt.n_positions_compared == 32 and tt.kl_max > 0.1
    g = _by_name(vc.verdict.gates, "teacher_kl_max")
    assert (g.status, g.measured) == ("fail", tt.kl_max)
    assert vc.status is Status.DIVERGENT
    assert vc.verdict.reasons[0] == _by_name(vc.verdict.gates, "teacher_kl_p99").detail
    assert vc.verdict.reasons[1] == g.detail and g.detail.endswith("; worst at doc 2 repeat 0 pos 3")
    loose = _vc(s, s, ta, tb, gates=_gates(teacher_kl_p99=Tolerance(abs=1), teacher_kl_max=Tolerance(abs=1)))
    assert loose.status is Status.EQUIVALENT
    assert f"{TASK} (teacher-forced): top-k lists differ on 1/4 samples with identical tokens and logprobs" in loose.verdict.reasons


def test_teacher_top1_gate():
    t = _summary(n_top1_hard=2, top1_hard_positions=((3, 0, 1), (4, 0, 6)))
    g = _by_name(evaluate_gates([], [_summary()], [t], Gates()), "teacher_hard_top1_flips")
    assert (g.status, g.measured, g.threshold) == ("fail", 2.0, 0.0)
    assert g.evidence == ("doc 3 repeat 0 pos 1", "doc 4 repeat 0 pos 6")
    older = _summary()  # a token comparison that predates the top-1 fields
    del older.n_top1_hard
    g = _by_name(evaluate_gates([], [older], [older], Gates()), "teacher_hard_top1_flips")
    assert g.status == "skip" and g.detail.endswith("skipped, this token comparison does not compute n_top1_hard")


def test_no_positions_counts_as_zero_only_without_samples():
    empty = _summary(n_samples=0, n_positions_compared=0, kl_p99=None, kl_max=None)
    g = _by_name(evaluate_gates([], [_summary()], [empty], Gates()), "teacher_kl_p99")
    assert (g.status, g.measured) == ("pass", 0.0)
    unmeasured = _summary(n_samples=3, n_positions_compared=0, kl_p99=None, kl_max=None)
    g = _by_name(evaluate_gates([], [_summary()], [unmeasured], Gates()), "teacher_kl_p99")
    assert g.status == "skip" and g.detail == f"{TASK} teacher_kl_p99: skipped, no position to compare in 3 samples"


def test_teacher_gates_skip_without_teacher_data():
    results = evaluate_gates([], [_summary()], None, Gates())
    for name in ("teacher_kl_p99", "teacher_kl_max", "teacher_hard_top1_flips"):
        g = _by_name(results, name)
        assert g.status == "skip" and g.detail == f"{TASK} {name}: skipped, {NO_TEACHER}"
    other = _vc(make_samples(1), make_samples(1)).tokens.summaries[0].model_copy(update={"task": "other"})
    g = _by_name(evaluate_gates([], [_summary()], [other], Gates()), "teacher_kl_max")
    assert g.status == "skip" and g.detail.endswith(NO_TEACHER_TASK)


def test_gate_order_and_json():
    a = make_samples(3) + make_samples(2, task="aaa", seed=4)
    vc = _vc(a, a, a, a)
    keys = [(g.task, g.gate, g.metric) for g in vc.verdict.gates]
    # per task, every gate of the registry in its order (a greedy task: the sampled gates are
    # not its); score gates name their metric
    per_task = [(g.name, METRIC if g.family == "scores" else None) for g in registry.GATES if g.family != "sampled"]
    assert keys == [("aaa", *k) for k in per_task] + [(TASK, *k) for k in per_task]
    d = vc.verdict.gates[0].model_dump(mode="json")
    assert set(d) == {"gate", "task", "metric", "status", "measured", "threshold", "aa_value", "detail", "evidence"}
    json.dumps(vc.doc.model_dump(mode="json")["gates"], allow_nan=False)


# --- verdict ------------------------------------------------------------------------


def test_identical_with_teacher_data_lists_gates_too():
    s = make_samples(3)
    vc = _vc(s, s, s, s)
    assert vc.status is Status.IDENTICAL
    assert vc.verdict.reasons == (
        f"{TASK}: 3/3 samples bitwise identical (24 tokens, ids and logprobs)",
        f"{TASK} (teacher-forced): 3/3 samples bitwise identical (24 positions)",
        f"{TASK} {METRIC}: 0.333 on both (3 items)",
    )
    statuses = {g.gate: g.status for g in vc.verdict.gates}
    assert statuses["teacher_kl_p99"] == "pass" and statuses["score_equivalence"] == "pass"


def test_teacher_difference_alone_keeps_it_from_identical():
    s = make_samples(3)
    vc = _vc(s, s, s, mutate(s, 1, lambda x: x.copy(logprobs=[v - 1e-3 for v in x.logprobs])))
    assert vc.status is Status.EQUIVALENT
    # the distributional gates skip: no A/A run
    distributional = len(registry.names("distributional"))
    greedy = len(registry.GATES) - len(registry.names("sampled"))  # a greedy comparison has no sampled gate
    assert vc.verdict.reasons[-1] == f"all {greedy - distributional} gates passed ({distributional} skipped)"


def test_divergent_lists_failing_gates_first_then_structure():
    a = make_samples(5)
    b = mutate([s for s in a if s.doc_id != 0], 3, set_token(1, 7))
    v = _vc(a, b).verdict
    assert v.status is Status.DIVERGENT
    assert v.reasons[0].startswith(f"{TASK} free_hard_divergences: 1 > 0")
    assert v.reasons[1] == f"{TASK}: 1 sample present only in 'legacy' (doc 0)"
    assert f"{TASK}: 1/4 samples generate different tokens (earliest at doc 3, position 1)" in v.reasons


def test_empty_comparison_is_divergent_with_no_gates():
    v = decide([], [])
    assert v.status is Status.DIVERGENT and v.gates == () and "no samples" in v.reasons[0]
    assert {"status": v.status.value, "reasons": list(v.reasons), "gates": list(v.gates), "outputs": v.outputs} == {
        "status": "DIVERGENT", "reasons": list(v.reasons), "gates": [], "outputs": None}


# --- properties ---------------------------------------------------------------------

tolerances = st.builds(
    Tolerance,
    abs=st.sampled_from([0.0, 1e-3, 0.1, 1.0, 3.0]),
    rel_aa=st.one_of(st.none(), st.sampled_from([0.0, 1.0, 3.0])),
)
any_gates = st.builds(
    Gates,
    scores=st.builds(
        ScoreGates,
        margin=st.sampled_from([0.001, 0.01, 0.05, 0.2]),
        alpha=st.sampled_from([0.01, 0.05, 0.2]),
        require_equivalence=st.booleans(),
        fail_on_significant=st.booleans(),
    ),
    tokens=st.builds(
        TokenGates,
        free_hard_divergences=tolerances,
        teacher_kl_p99=tolerances,
        teacher_kl_max=tolerances,
        teacher_hard_top1_flips=tolerances,
    ),
)
EPS = [0.0, 0.01, 0.1, 0.5, 2.0]  # top-k perturbations, from none to gross


@st.composite
def sizes(draw):
    return draw(st.integers(2, 6)), draw(st.integers(2, 5)), draw(st.integers(0, 50))


def _docs(draw, n):
    return sorted(draw(st.sets(st.integers(0, n - 1), max_size=n)))


def _variant(a, length, flips, hard, to=0.0):
    b = _flip(flips, to)(a)
    for d in hard:  # id 7 is never generated by make_samples: a hard divergence either way round
        b = mutate(b, d, set_token(length // 2, 7))
    return b


def _teacher(t, eps, kl_docs, top1_docs, length):
    for d in kl_docs:
        t = mutate(t, d, perturb_topk(eps, [0]))
    for d in top1_docs:
        t = mutate(t, d, swap_top1([length - 1]))
    return t


@PROPS
@given(sizes(), any_gates, st.booleans())
def test_property_self_comparison_is_identical(size, gates, with_teacher):
    n, length, seed = size
    a = make_samples(n, length=length, seed=seed)
    t = make_samples(n, length=length, seed=seed + 1) if with_teacher else None
    vc = _vc(a, a, t, t, gates=gates)
    assert vc.status is Status.IDENTICAL
    assert not [g for g in vc.verdict.gates if g.failed]


@PROPS
@given(sizes(), any_gates, st.data())
def test_property_swap_keeps_status(size, gates, data):
    """Every gate's status and measured value survive a swap (score flips both ways, hard
    divergences, top-k perturbations and top-1 flips in the teacher-forced data)."""
    n, length, seed = size
    a = make_samples(n, length=length, seed=seed, scores=data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    b = _variant(a, length, [], _docs(data.draw, n))
    for d in _docs(data.draw, n):
        b = mutate(b, d, lambda s: s.copy(scores={METRIC: 1.0 - s.scores[METRIC]}))
    ta = make_samples(n, length=length, seed=seed + 1)
    tb = _teacher(ta, data.draw(st.sampled_from(EPS)), _docs(data.draw, n), _docs(data.draw, n), length)
    ab, ba = _vc(a, b, ta, tb, gates=gates), _vc(b, a, tb, ta, gates=gates)
    assert ab.status is ba.status
    assert _symmetric_view(ab) == _symmetric_view(ba)


def _symmetric_view(vc):
    return [(g.task, g.gate, g.metric, g.status, g.measured, g.threshold) for g in vc.verdict.gates]


@PROPS
@given(sizes(), any_gates, st.data())
def test_property_larger_difference_is_never_better(size, gates, data):
    n, length, seed = size
    if gates.scores.margin > 0.3:  # TOST with a 0/1 metric is monotone for margins below 1/2
        return
    a = make_samples(n, length=length, seed=seed, scores=[1.0] * n)
    flips2, hard2 = _docs(data.draw, n), _docs(data.draw, n)
    flips1 = [d for d in flips2 if data.draw(st.booleans())]
    hard1 = [d for d in hard2 if data.draw(st.booleans())]
    kl2, top2 = _docs(data.draw, n), _docs(data.draw, n)
    kl1 = [d for d in kl2 if data.draw(st.booleans())]
    top1 = [d for d in top2 if data.draw(st.booleans())]
    i2 = data.draw(st.integers(0, len(EPS) - 1))
    i1 = data.draw(st.integers(0, i2))
    ta = make_samples(n, length=length, seed=seed + 1)
    small = _vc(a, _variant(a, length, flips1, hard1), ta, _teacher(ta, EPS[i1], kl1, top1, length), gates=gates)
    large = _vc(a, _variant(a, length, flips2, hard2), ta, _teacher(ta, EPS[i2], kl2, top2, length), gates=gates)
    assert large.status.severity >= small.status.severity
    failed_small = {(g.task, g.gate, g.metric) for g in small.verdict.gates if g.failed}
    failed_large = {(g.task, g.gate, g.metric) for g in large.verdict.gates if g.failed}
    assert failed_small <= failed_large


def test_swap_on_a_hand_made_case():
    a = make_samples(8, scores=[1.0] * 8)
    b = _variant(a, 8, [1, 2, 3], [5])
    ta = make_samples(8, seed=3)
    tb = _teacher(ta, 0.5, [1], [2, 6], 8)
    ab, ba = _vc(a, b, ta, tb), _vc(b, a, tb, ta)
    assert ab.status is ba.status is Status.DIVERGENT
    assert _symmetric_view(ab) == _symmetric_view(ba)
    failing = {g.gate for g in ab.verdict.gates if g.failed}
    assert failing == {"score_equivalence", "free_hard_divergences", "teacher_kl_p99", "teacher_kl_max",
                       "teacher_hard_top1_flips"}


def test_infinite_measure_fails_the_gate_instead_of_skipping():
    from fakes import make_samples, mutate, tables

    from evalpipe.compare.gates import evaluate_gates
    from evalpipe.compare.tokens import compare_tokens

    a = make_samples(3, length=4)
    nan = float("nan")
    b = mutate(a, 1, lambda s: s.copy(logprobs=[nan] * 4, topk_logprobs=[[nan, nan, nan]] * 4))
    (sa, ta), (sb, tb) = tables(a), tables(b)
    teacher = compare_tokens(ta, tb).summaries
    free = compare_tokens(ta, tb, sa, sb).summaries
    results = {g.gate: g for g in evaluate_gates([], free, teacher, Gates())}
    for name in ("teacher_kl_p99", "teacher_kl_max", "teacher_hard_top1_flips"):
        assert results[name].status == "fail", results[name].detail
    assert "inf" in results["teacher_kl_max"].detail


def test_free_kl_max_gate_catches_a_decode_only_fault():
    # Same tokens everywhere, but one decode position's distribution moved by far
    # more than noise: the teacher-forced side may never see such a batch-layout fault.
    from fakes import set_step

    a = make_samples(4, length=5)
    b = mutate(a, 2, set_step(3, a[2].token_ids[3], a[2].logprobs[3], [a[2].token_ids[3], 1, 2], [a[2].logprobs[3], a[2].logprobs[3] - 0.05, -9.0]))
    vc = _vc(a, b)
    g = _by_name(vc.verdict.gates, "free_kl_max")
    assert g.status == "fail" and g.measured > 0.1 and "doc 2 repeat 0 pos 3" in g.evidence
    assert vc.status.value == "DIVERGENT"
