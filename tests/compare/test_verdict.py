import json

import pytest
from fakes import METRIC, TASK, make_samples, mutate, set_token, tables, write_run, write_variant

from evalpipe.compare import Status, compare_tables, decide
from evalpipe.compare.verdict import worst_status
from evalpipe.documents.run_doc import read_run_document
from evalpipe.errors import UserError
from evalpipe.gates import registry
from evalpipe.number_format import fmt_delta
from evalpipe.pipeline.comparing import compare_run, compare_variants, write_outputs
from evalpipe.rundir import artifacts


def _vc(a, b, **kw):
    sa, ta = tables(a)
    sb, tb = tables(b)
    return compare_tables(sa, ta, sb, tb, label_a="legacy", label_b="sp", **kw)


def test_identical_variants():
    s = make_samples(5)
    vc = _vc(s, s)
    assert vc.status is Status.IDENTICAL
    assert vc.verdict.reasons == (
        f"{TASK}: 5/5 samples bitwise identical (40 tokens, ids and logprobs)",
        f"{TASK} {METRIC}: 0.400 on both (5 items)",
    )


def test_one_token_changed_points_at_doc_and_position():
    a = make_samples(10)
    b = mutate(a, 7, set_token(3, 1))
    b = mutate(b, 2, set_token(6, 1))
    vc = _vc(a, b)
    assert vc.status is Status.DIVERGENT
    assert f"{TASK}: 2/10 samples generate different tokens (earliest at doc 7, position 3)" in vc.verdict.reasons


def test_logprob_only_difference_reports_max():
    a = make_samples(4)
    b = mutate(a, 1, lambda s: s.copy(logprobs=[s.logprobs[0] - 3.1e-6] + s.logprobs[1:]))
    vc = _vc(a, b)
    # no gate looks at logprobs of the free-running tokens: a change, but within the gates
    assert vc.status is Status.EQUIVALENT and vc.status.passed
    reason, gates_line = vc.verdict.reasons
    # without teacher-forced data its gates skip, and the distributional ones with them
    measured = len(registry.names("scores")) + len(registry.names("free-running"))
    greedy = len(registry.ORDER) - len(registry.names("sampled"))  # a greedy comparison has no sampled gate
    assert gates_line == f"all {measured} gates passed ({greedy - measured} skipped)"
    assert reason.startswith(f"{TASK}: logprobs differ on 1/4 samples with identical tokens (max |\u0394logprob| ")
    assert "e-06)" in reason


def test_score_change_reason_with_hand_checked_numbers():
    a = make_samples(10)  # 0.5
    b = mutate(a, 1, lambda s: s.copy(scores={METRIC: 0.0}))
    b = mutate(b, 3, lambda s: s.copy(scores={METRIC: 0.0}))
    vc = _vc(a, b)
    assert vc.status is Status.DIVERGENT
    assert (
        f"{TASK} {METRIC}: 0.500 \u2192 0.300 (\u0394 \u22120.200, 2 items changed: 2 right\u2192wrong, 0 wrong\u2192right)"
        in vc.verdict.reasons
    )


def test_missing_samples_make_it_different():
    a = make_samples(5)
    b = [s for s in a if s.doc_id not in (0, 3)]
    vc = _vc(a, b)
    assert vc.status is Status.DIVERGENT
    assert f"{TASK}: 2 samples present only in 'legacy' (doc 0, 3)" in vc.verdict.reasons
    vc = _vc(b, a)
    assert f"{TASK}: 2 samples present only in 'sp' (doc 0, 3)" in vc.verdict.reasons


def test_swap_keeps_status_and_abs_delta():
    a = make_samples(10)
    b = mutate(a, 4, lambda s: s.copy(scores={METRIC: 1.0}))
    b = mutate(b, 4, set_token(0, 2))
    ab, ba = _vc(a, b), _vc(b, a)
    assert ab.status is ba.status is Status.DIVERGENT
    assert abs(ab.scores.rows[0].delta) == abs(ba.scores.rows[0].delta) == pytest.approx(0.1)
    assert len(ab.verdict.reasons) == len(ba.verdict.reasons)


def test_empty_is_not_identical():
    v = decide([], [])
    assert v.status is Status.DIVERGENT and "no samples" in v.reasons[0]


def test_metric_only_on_one_side():
    a = make_samples(3)
    b = [s.copy(scores={**s.scores, "acc,none": 1.0}) for s in a]
    vc = _vc(a, b)
    assert vc.status is Status.DIVERGENT
    assert "metrics reported only by 'sp': acc,none" in vc.verdict.reasons


def test_status_helpers():
    assert worst_status([Status.IDENTICAL, Status.DIVERGENT]) is Status.DIVERGENT
    assert worst_status([Status.EQUIVALENT, Status.IDENTICAL]) is Status.EQUIVALENT
    assert worst_status([]) is Status.INCONCLUSIVE, "no comparison is no pass"
    # a divergence found outranks a comparison that proved nothing: the run is then DIVERGENT
    assert [s.value for s in sorted(Status, key=lambda s: s.severity)] == ["IDENTICAL", "EQUIVALENT", "INCONCLUSIVE", "DIVERGENT"]
    assert worst_status([Status.INCONCLUSIVE, Status.DIVERGENT]) is Status.DIVERGENT
    assert worst_status([Status.EQUIVALENT, Status.INCONCLUSIVE]) is Status.INCONCLUSIVE
    assert {s.value: s.passed for s in Status} == {"IDENTICAL": True, "EQUIVALENT": True, "INCONCLUSIVE": False, "DIVERGENT": False}
    assert {s.value: s.exit_code for s in Status} == {"IDENTICAL": 0, "EQUIVALENT": 0, "INCONCLUSIVE": 4, "DIVERGENT": 1}
    assert fmt_delta(-0.02) == "\u22120.020" and fmt_delta(2e-5) == "+2e-05" and fmt_delta(0.0) == "0"


# --- run directory orchestration -------------------------------------------------------


def _run(tmp_path, b_mut=None, **kw):
    a = make_samples(8) + make_samples(4, task="aaa", seed=3)
    b = b_mut(a) if b_mut else a
    return write_run(tmp_path / "run-1", {"legacy": a, "sp": b, "sp2": a}, reference="legacy", **kw)


def test_compare_run_and_overall_status(tmp_path):
    root = _run(tmp_path, lambda a: mutate(a, 2, set_token(1, 9)))
    rc = compare_run(root)
    assert rc.doc.reference == "legacy" and rc.doc.variants == ["sp", "sp2"]
    assert [c.status for c in rc.comparisons] == [Status.DIVERGENT, Status.IDENTICAL]
    assert rc.status is Status.DIVERGENT
    d = rc.doc.model_dump(mode="json")
    assert d["status"] == "DIVERGENT" and d["comparisons"][1]["status"] == "IDENTICAL"
    rc2 = compare_run(root, variants=["sp2"])
    assert rc2.status is Status.IDENTICAL and rc2.doc.variants == ["sp2"]


def test_compare_json_byte_identical(tmp_path):
    root = _run(tmp_path, lambda a: mutate(a, 2, lambda s: s.copy(logprobs=[x - 1e-3 for x in s.logprobs])))
    write_outputs(root, compare_run(root))
    first = (root / artifacts.COMPARE_JSON).read_bytes()
    first_md = (root / artifacts.REPORT_MD).read_bytes()
    # same artifacts written with rows in another order
    info = read_run_document(root)
    a = make_samples(8) + make_samples(4, task="aaa", seed=3)
    write_variant(root, "legacy", a, shuffle_seed=5)
    write_outputs(root, compare_run(root), info)
    assert (root / artifacts.COMPARE_JSON).read_bytes() == first
    assert (root / artifacts.REPORT_MD).read_bytes() == first_md
    parsed = json.loads(first)
    assert parsed["schema_version"] == 3 and parsed["reference"] == "legacy"
    assert "NaN" not in first.decode()


def test_nan_becomes_null(tmp_path):
    a = make_samples(3)
    # B scores none of TASK's items (the column exists because of another task): no paired mean
    b = [s.copy(scores={}) for s in a] + make_samples(1, task="zzz")
    vc = _vc(a, b)
    (row,) = [r for r in vc.scores.rows if r.task == TASK]
    assert row.n_paired == 0 and row.n_missing == 3 and row.mean_b is None
    text = json.dumps(vc.doc.model_dump(mode="json"), allow_nan=False)
    assert '"mean_b": null' in text


def test_missing_artifacts_raise_one_sentence(tmp_path):
    root = _run(tmp_path)
    (root / "sp" / artifacts.SAMPLES_PARQUET).unlink()
    with pytest.raises(UserError, match=r"variant 'sp' in .*run-1 has no samples.parquet; did its run finish\?"):
        compare_run(root)
    with pytest.raises(UserError, match="has no directory"):
        compare_run(root, variants=["nope"])
    with pytest.raises(UserError, match="nothing to compare"):
        compare_run(root, variants=["legacy"])


def test_variants_default_from_directories(tmp_path):
    root = tmp_path / "r"
    s = make_samples(2)
    write_variant(root, "b", s)
    write_variant(root, "a", s)
    rc = compare_run(root)  # no run.json: reference = first variant by name
    assert rc.doc.reference == "a" and rc.doc.variants == ["b"] and rc.doc.run_id == "r"
    vc = compare_variants(artifacts.VariantDir(root / "a"), artifacts.VariantDir(root / "b"))
    assert vc.status is Status.IDENTICAL


def test_stray_tokens_are_reported():
    a = make_samples(2)
    sa, ta = tables(a)
    sb, _ = tables(a[:1])  # B's samples.parquet lacks doc 1, its tokens.parquet has it
    with pytest.raises(UserError, match="inconsistent"):
        compare_tables(sa, ta, sb, ta)
