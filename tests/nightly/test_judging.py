"""Judging recorded nights (no engine): baseline comparison, series changes, bisect
hint, exit status, the summary and JUnit outputs, the dashboard's data."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from nightly_fakes import write_night

from evalpipe.documents.worker_job import JOB_JSON, TeacherJob, WorkerJob, write_job
from evalpipe.history.store import open_history
from evalpipe.nightly import dashboard_data as dashboard
from evalpipe.nightly import judging
from evalpipe.nightly import night as nightly
from tests.nightly.conftest import BAD, GOOD


def test_a_fault_night_is_flagged_with_its_component_and_clears_after_the_fix(judged_nights):
    plan = [False] * 6 + [True] * 3 + [False] * 3
    db, results = judged_nights(plan)
    statuses = [r.judgement.status for r in results]
    assert statuses == ["PASS"] * 6 + ["REGRESSION"] * 3 + ["PASS"] * 3
    assert [r.exit_code for r in results] == [0] * 6 + [1] * 3 + [0] * 3
    # the first bad night: tonight's verdict and the baseline drift say it at once
    first = results[6].judgement
    assert first.baseline == "night-05"
    sp = next(e for e in first.vs_baseline if e.variant == "sp")
    assert sp.status == "DIVERGENT"
    assert next(e for e in first.vs_baseline if e.variant == "legacy").status == "IDENTICAL"
    # the second bad night: the series flags the step, at the first bad night, with the hint
    second = results[7].judgement
    flagged = [c for c in second.changes if c.state == "flagged" and c.regression]
    assert {(c.kind, c.variant) for c in flagged} >= {("score", "sp")}
    assert {c.first_bad for c in flagged} == {"night-06"}
    score = next(c for c in flagged if c.kind == "score")
    assert score.last_good == "night-05" and len(score.flipped) == 12
    assert score.flipped[0].model_dump() == {"doc_id": 0, "repeat": 0, "before": 1.0, "after": 0.0, "prompt": "Question 0?"}
    assert {"component": "vllm_ascend", "before": GOOD, "after": BAD} in [b.model_dump() for b in score.bisect]
    assert score.delta == pytest.approx(-12 / 200)
    # baselines stay on the last passing night while the fault lasts
    assert [r.judgement.baseline for r in results[6:9]] == ["night-05"] * 3
    # after the fix: nothing open, the change stays in the history as closed
    last = results[-1].judgement
    assert last.status == "PASS" and last.reasons == []
    closed = [c for c in last.changes if c.state == "flagged" and c.regression]
    assert closed and all(not c.open and c.first_bad == "night-06" for c in closed)


def test_outputs_name_the_regression(judged_nights):
    _, results = judged_nights([False, False, True, True])
    r = results[-1]
    md = r.outputs["markdown"].read_text()
    assert "REGRESSION" in md and "vllm\\_ascend: good1 → bad2" in md
    suite = ET.parse(r.outputs["junit"]).getroot().find("testsuite")
    failed = [c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None]
    assert "sp" in failed and "variants_vs_reference" in failed
    assert any(name.startswith("gsm8k_synth_4shot[exact_match,strict-match].sp") for name in failed)
    assert r.dashboard.is_file() and "night-02" in r.dashboard.read_text()


# -- the detector on synthetic per-item series (pure) ------------------------------


def _job(vdir, baseline_dir: str) -> WorkerJob:
    return WorkerJob(variant=vdir.name, output_dir=str(vdir.root), engine_args={}, tasks=[], topk=1, data_dir="data",
                     teacher=TeacherJob(enabled=True, baseline_dir=baseline_dir))


def test_night_over_night_teacher_forcing_only_on_the_baseline_s_own_sequences(tmp_path):
    from fakes import token_table
    from nightly_fakes import base_samples

    from evalpipe.rundir import artifacts

    base = write_night(tmp_path, 0)
    tonight = write_night(tmp_path, 1)
    good = base_samples()
    for night in (base, tonight):
        for name in ("legacy", "sp"):
            artifacts.write_table(artifacts.VariantDir(night / name).teacher, token_table(good))
    # without tonight's scoring of the baseline's sequences: free-running only
    plain = judging.vs_baseline(base, tonight, "sp", base.name)
    assert plain.teacher_forced is False and plain.teacher == [] and plain.status == "IDENTICAL"
    vd = artifacts.VariantDir(tonight / "sp")
    artifacts.write_table(vd.teacher_baseline, token_table(good))
    write_job(vd.root / JOB_JSON, _job(vd, baseline_dir=str(base / "legacy")))
    forced = judging.vs_baseline(base, tonight, "sp", base.name)
    assert forced.teacher_forced is True and forced.teacher[0].identical
    # scored against another night's sequences: not comparable, left out
    write_job(vd.root / JOB_JSON, _job(vd, baseline_dir=str(tonight / "legacy")))
    assert judging.vs_baseline(base, tonight, "sp", base.name).teacher_forced is False


# -- what ran: path probes ------------------------------------------------------------

SP_NEVER_RAN = ("variant `sp` never called `evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention` "
                "(0 calls in 1 process)")


def _probe_nights(tmp_path, plan):
    """Record and judge probed nights, one per entry of ``plan`` (write_night's options)."""
    db = open_history(None, tmp_path / "out")
    results = [nightly.record_and_judge(db, write_night(tmp_path / "runs", i, probes=True, **options), labels={}, alpha=1e-3,
                                        min_nights=2, dashboard=tmp_path / "dash" / "index.html", title="t")
               for i, options in enumerate(plan)]
    return db, results


def _failures(junit_path):
    suite = ET.parse(junit_path).getroot().find("testsuite")
    return {c.get("name"): c.find("failure").attrib for c in suite.findall("testcase") if c.find("failure") is not None}


def test_the_same_variant_night_over_night_with_probes_is_judged_on_its_outputs(tmp_path):
    _, results = _probe_nights(tmp_path, [{}, {}])
    j = results[1].judgement
    assert (j.status, results[1].exit_code) == ("PASS", 0)
    # same code, same probe profile, IDENTICAL outputs: meant to be the same, not "same_code"
    assert [(e.variant, e.status, e.paths.status if e.paths else None) for e in j.vs_baseline] == [
        ("legacy", "IDENTICAL", "verified"), ("sp", "IDENTICAL", "verified")]


def test_the_noise_floor_of_a_run_without_recorded_expectations_is_not_same_code(tmp_path):
    from evalpipe.rundir import artifacts

    run_dir = write_night(tmp_path, 0, probes=True)
    info = artifacts.read_json(run_dir / "run.json")
    for settings in info["variant_settings"].values():
        settings.pop("expect")
    artifacts.write_json(run_dir / "run.json", info)
    _, aa = judging.tonight_floor(run_dir)
    assert (aa.status.value, aa.paths.status) == ("IDENTICAL", "verified")


def test_a_night_whose_variant_fell_back_to_another_path_is_inconclusive(tmp_path):
    db, results = _probe_nights(tmp_path, [{}, {}, {"sp_ran": "legacy"}, {}])
    assert [r.judgement.status for r in results] == ["PASS", "PASS", "INCONCLUSIVE", "PASS"]
    assert [r.exit_code for r in results] == [0, 0, 4, 0]
    j = results[2].judgement
    assert j.verdict == "INCONCLUSIVE"
    assert j.reasons == [
        f"tonight's comparison proves nothing about the paths: {SP_NEVER_RAN}",
        "sp's comparison with baseline night-01 proves nothing about the paths: " + SP_NEVER_RAN.replace("`sp`", "`night-02/sp`"),
    ]
    sp = next(e for e in j.vs_baseline if e.variant == "sp")
    assert (sp.status, sp.outputs_status, sp.paths.status if sp.paths else None) == ("INCONCLUSIVE", "IDENTICAL", "failed")
    # an INCONCLUSIVE night is no baseline: the next night is judged against the last PASS
    assert results[3].judgement.baseline == "night-01"
    failures = _failures(results[2].outputs["junit"])
    assert failures["variants_vs_reference"] == {"message": j.reasons[0], "type": "inconclusive"}
    assert failures["sp"]["type"] == "inconclusive" and "legacy" not in failures
    md = results[2].outputs["markdown"].read_text()
    assert md.startswith("## evalpipe nightly night-02: ⚠️ INCONCLUSIVE")
    assert ("- tonight's comparison proves nothing about the paths: variant \\`sp\\` never called "
            "\\`evalpipe.lab.layout.model.LayoutDecoderLayer.\\_sp\\_attention\\` (0 calls in 1 process)") in md
    assert "| sp | night-01 | INCONCLUSIVE |" in md
    assert db.run("night-02").nightly_status == "INCONCLUSIVE"
    assert [n.status for n in dashboard.dashboard_data(db, "cfg1", "t", tmp_path / "d.html").nights] == [
        "PASS", "PASS", "INCONCLUSIVE", "PASS"]


def test_print_night_shows_an_inconclusive_night_with_its_reason(tmp_path):
    from rich.console import Console

    from evalpipe.reporting import TerminalReporter

    _, results = _probe_nights(tmp_path, [{}, {"sp_ran": "legacy"}])
    console = Console(record=True, width=400, color_system=None)
    nightly.print_night(results[1], TerminalReporter(console))
    text = console.export_text()
    assert "nightly night-01: INCONCLUSIVE (baseline night-00)" in text
    assert f"  - tonight's comparison proves nothing about the paths: {SP_NEVER_RAN}" in text


def test_a_regression_the_same_night_outranks_an_inconclusive_comparison(tmp_path):
    # tonight's build broke the legacy path, and sp silently ran it too
    _, results = _probe_nights(tmp_path, [{}, {}, {"reference_fault": True, "sp_ran": "legacy"}])
    r = results[2]
    assert (r.judgement.status, r.exit_code) == ("REGRESSION", 1)
    assert r.judgement.verdict == "INCONCLUSIVE"  # tonight's variants alone prove nothing
    assert r.judgement.reasons[0] == f"tonight's comparison proves nothing about the paths: {SP_NEVER_RAN}"
    assert any(reason.startswith("legacy drifted from baseline night-01: DIVERGENT") for reason in r.judgement.reasons)
    failures = _failures(r.outputs["junit"])
    assert failures["variants_vs_reference"]["type"] == "inconclusive" and failures["legacy"]["type"] == "regression"
    assert "❌ REGRESSION" in r.outputs["markdown"].read_text()
