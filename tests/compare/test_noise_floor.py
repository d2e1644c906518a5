"""Run-level gating: teacher.parquet, the A/A noise floor, gates from run.json, compare.json v2."""

import json

import pytest
from fakes import TASK, make_samples, mutate, perturb_topk, set_token, write_run, write_variant

from evalpipe.compare import Status
from evalpipe.compare.gates import NO_TEACHER
from evalpipe.config.gate_settings import Gates, ScoreGates, TokenGates, Tolerance
from evalpipe.errors import UserError
from evalpipe.gates import registry
from evalpipe.pipeline.comparing import compare_across_runs, compare_run, write_outputs
from evalpipe.rundir import artifacts

RUN_KEYS = {"schema_version", "run_id", "reference", "variants", "status", "gates", "noise_floor", "comparisons"}
COMPARISON_KEYS = {
    "a", "b", "reference", "variant", "status", "reasons", "samples", "scores",
    "metrics_only_a", "metrics_only_b", "tokens", "teacher", "gates", "numerics", "distribution",
    "outputs_status", "paths", "tasks",
}


def _hard(samples, docs):
    for d in docs:
        samples = mutate(samples, d, set_token(2, 7))
    return samples


def _gate(vc, gate, task=TASK):
    (g,) = [g for g in vc.verdict.gates if g.gate == gate and g.task == task]
    return g


def _noise_run(tmp_path, noise_floor="legacy-aa", **kw):
    """legacy-aa has 1 hard divergence (run-to-run noise), sp 2: within 3 x A/A, beyond abs 0."""
    s = make_samples(8)
    t = make_samples(8, seed=5)
    variants = {"legacy": s, "legacy-aa": _hard(s, [3]), "sp": _hard(s, [1, 6])}
    teachers = {"legacy": t, "legacy-aa": mutate(t, 2, perturb_topk(0.5)), "sp": mutate(t, 4, perturb_topk(0.5))}
    return write_run(tmp_path / "run", variants, reference="legacy", teachers=teachers, noise_floor=noise_floor, **kw)


def test_noise_floor_bounds_the_other_comparisons(tmp_path):
    rc = compare_run(_noise_run(tmp_path))
    assert rc.doc.variants == ["sp"] and rc.noise_floor.variant == "legacy-aa"
    (sp,) = rc.comparisons
    g = _gate(sp, "free_hard_divergences")
    assert (g.status, g.measured, g.aa_value, g.threshold) == ("pass", 2.0, 1.0, 3.0)
    kl = _gate(sp, "teacher_kl_p99")
    assert kl.aa_value == _gate(rc.noise_floor, "teacher_kl_p99").measured > 0 and kl.status == "pass"
    assert sp.status is Status.EQUIVALENT and rc.status is Status.EQUIVALENT
    # the A/A comparison has no A/A of its own: abs bounds, and it fails them, but it is information only
    assert rc.noise_floor.status is Status.DIVERGENT
    assert _gate(rc.noise_floor, "free_hard_divergences").aa_value is None


def test_without_noise_floor_the_same_data_diverges(tmp_path):
    rc = compare_run(_noise_run(tmp_path, noise_floor=None))
    assert rc.noise_floor is None and rc.doc.variants == ["legacy-aa", "sp"]
    assert rc.comparisons[1].status is Status.DIVERGENT
    assert rc.comparisons[1].verdict.reasons[0].startswith(f"{TASK} free_hard_divergences: 2 > 0 (half floor 0; no A/A value)")


def test_noise_floor_of_another_reference_is_an_ordinary_variant(tmp_path):
    rc = compare_run(_noise_run(tmp_path), reference="sp")
    assert rc.noise_floor is None and rc.doc.variants == ["legacy", "legacy-aa"]


def test_teacher_on_one_side_only_skips_the_teacher_gates(tmp_path):
    root = _noise_run(tmp_path, noise_floor=None)
    (root / "sp" / artifacts.TEACHER_PARQUET).unlink()
    rc = compare_run(root, variants=["sp"])
    (sp,) = rc.comparisons
    assert sp.teacher is None and sp.doc.teacher is None
    g = _gate(sp, "teacher_kl_max")
    assert g.status == "skip" and g.detail == f"{TASK} teacher_kl_max: skipped, {NO_TEACHER}"


def test_gates_come_from_run_json_unless_given(tmp_path):
    configured = Gates(tokens=TokenGates(free_hard_divergences=Tolerance(abs=2, rel_aa=None)))
    root = _noise_run(tmp_path, noise_floor=None, run_info={"config": {"gates": configured.model_dump(mode="json")}})
    rc = compare_run(root, variants=["sp"])
    assert rc.doc.gates == configured and rc.doc.model_dump(mode="json")["gates"] == configured.model_dump(mode="json")
    assert _gate(rc.comparisons[0], "free_hard_divergences").threshold == 2.0
    strict = Gates()
    rc = compare_run(root, variants=["sp"], gates=strict)
    assert rc.doc.gates == strict and rc.status is Status.DIVERGENT
    # the margin shorthand replaces the gates' margin, and the score rows follow it
    rc = compare_run(root, variants=["sp"], margin=0.3)
    assert rc.doc.gates.scores.margin == 0.3 and rc.comparisons[0].scores.rows[0].margin == 0.3


def test_invalid_gates_in_run_json_are_one_sentence(tmp_path):
    root = _noise_run(tmp_path, run_info={"config": {"gates": {"scores": {"margn": 0.1}}}})
    with pytest.raises(UserError, match=r"run.json: config.gates.scores.margn: Extra inputs are not permitted; fix it, or restore it from a copy."):
        compare_run(root)


def test_compare_json_v2_shape_and_bytes(tmp_path):
    root = _noise_run(tmp_path)
    write_outputs(root, compare_run(root))
    first = (root / artifacts.COMPARE_JSON).read_bytes()
    d = json.loads(first)
    assert set(d) == RUN_KEYS and d["schema_version"] == 3
    assert d["variants"] == ["sp"] and d["status"] == "EQUIVALENT"
    assert d["gates"] == Gates().model_dump(mode="json")
    assert set(d["noise_floor"]) == COMPARISON_KEYS and d["noise_floor"]["b"] == "legacy-aa"
    (c,) = d["comparisons"]
    assert set(c) == COMPARISON_KEYS
    greedy = [name for name in registry.ORDER if name not in registry.names("sampled")]  # no sampled gate: greedy
    assert [g["gate"] for g in c["gates"]] == greedy
    assert c["teacher"][0]["task"] == TASK and c["reasons"][-1] == f"all {len(greedy)} gates passed (0 skipped)"
    assert c["numerics"]["precision"] == "half" and c["numerics"]["aa_identical"] is not None
    assert [t["test"] for t in c["distribution"]] == ["dlogprob_shift", "kl_shift"]
    # one task: its own verdict is the comparison's, with the same gates
    assert [(t["task"], t["status"], t["gates_failed"]) for t in c["tasks"]] == [(TASK, "EQUIVALENT", 0)]
    assert c["tasks"][0]["gates_passed"] == sum(g["status"] == "pass" for g in c["gates"])
    assert "NaN" not in first.decode() and str(tmp_path) not in first.decode()
    # the same artifacts with their rows in another order: the same bytes
    s = make_samples(8)
    write_variant(root, "legacy", s, shuffle_seed=3, teacher=make_samples(8, seed=5))
    write_outputs(root, compare_run(root))
    assert (root / artifacts.COMPARE_JSON).read_bytes() == first


def test_across_runs_uses_run_a_gates_and_teacher(tmp_path):
    s, t = make_samples(6), make_samples(6, seed=2)
    loose = Gates(scores=ScoreGates(margin=0.5), tokens=TokenGates(free_hard_divergences=Tolerance(abs=1)))
    a = write_variant(tmp_path / "run1", "legacy", s, teacher=t)
    artifacts.write_json(tmp_path / "run1" / artifacts.RUN_JSON, {"config": {"gates": loose.model_dump(mode="json")}})
    b = write_variant(tmp_path / "run2", "legacy", _hard(s, [2]), teacher=mutate(t, 1, perturb_topk(0.01)))
    rc = compare_across_runs(a.root, b.root)
    assert rc.doc.gates == loose and rc.noise_floor is None
    (vc,) = rc.comparisons
    assert vc.teacher is not None and vc.status is Status.EQUIVALENT
    assert compare_across_runs(a.root, b.root, gates=Gates()).status is Status.DIVERGENT
