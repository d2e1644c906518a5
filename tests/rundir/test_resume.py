"""Continuing an interrupted run (evalpipe/rundir/resume.py): finished variants are kept after
their artifacts are verified, a half-done variant starts again in a clean directory, and
a different command, a finished run or damaged artifacts are refused in one sentence.
Run directories built from fakes; kill -9 and resume of whole runs are in
tests/pipeline/test_runs_on_the_fake_engine.py (the fake engine) and tests/e2e/test_run.py (vLLM)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from fakes import make_samples, record_artifacts, update_manifest, write_run
from typer.testing import CliRunner

from evalpipe.cli import app
from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.documents.run_doc import RunDocument
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RunDir
from evalpipe.rundir.resume import ResumeRefused, first_difference, reopen

RUN_FIELDS = {
    "config": {"engine": {"max_num_seqs": 64}, "output": "reports/runs", "seed": 0},
    "tasks": [{"task": "gsm8k_synth_4shot", "limit": 8}],
    "variants": ["legacy", "sp", "bf16"],
    "reference": "legacy",
    "model": {"path": "builtin:tiny-gsm"},
}


def fresh() -> RunDocument:
    """The continuing command's run.json content: the same run."""
    return RunDocument.model_validate(copy.deepcopy(RUN_FIELDS))


def interrupted_run(root: Path) -> Path:
    """legacy finished (manifest ok + artifacts record), sp stopped half-way (manifest
    `running`), bf16 never started; a stale report from an earlier comparison."""
    s = make_samples(6)
    run_dir = write_run(root / "cut", {"legacy": s, "sp": s}, reference="legacy",
                        run_info={**copy.deepcopy(RUN_FIELDS), "status": "interrupted", "interrupted_by": "SIGTERM",
                                  "variant_status": {"legacy": {"exit_code": 0, "seconds": 9.0, "error": None}}})
    legacy = RunDir(run_dir).variant("legacy")
    record_artifacts(legacy, status="ok")
    sp = RunDir(run_dir).variant("sp")
    update_manifest(sp, status="running")
    (sp.root / JOURNAL_FILE).write_text('{"key": "k", "answer": {}}\n')
    (run_dir / "report.md").write_text("stale")
    return run_dir


def test_finished_variants_are_kept_and_the_rest_start_clean(tmp_path):
    run_dir = interrupted_run(tmp_path)
    info, kept = reopen(run_dir, fresh())
    assert kept == ["legacy"]
    assert [p.name for p in (run_dir / "sp").iterdir()] == [JOURNAL_FILE], \
        "a half-done variant starts again from nothing but the answers its server already gave"
    assert (run_dir / "legacy" / "samples.parquet").is_file()
    assert not (run_dir / "report.md").exists(), "a report of the earlier attempt must not stand beside the new run"
    assert info.status == "running" and "interrupted_by" not in info.as_mapping()
    assert info.as_mapping()["variant_status"] == {"legacy": {"exit_code": 0, "seconds": 9.0, "error": None}}
    assert info.attempts[-1].kept == ["legacy"] and info.attempts[-1].previous_status == "interrupted"


def test_a_variant_that_finished_as_evalpipe_died_is_kept_from_its_manifest(tmp_path):
    run_dir = interrupted_run(tmp_path)
    info = artifacts.read_json(RunDir(run_dir).run_json)
    info["variant_status"] = {}  # killed before it could write the variant's status
    artifacts.write_json(RunDir(run_dir).run_json, info)
    info, kept = reopen(run_dir, fresh())
    assert kept == ["legacy"] and info.variant_status["legacy"].exit_code == 0


@pytest.mark.parametrize("change, where", [
    (lambda f: f["config"]["engine"].update(max_num_seqs=1), "`config.engine.max_num_seqs`"),
    (lambda f: f["tasks"][0].update(limit=9), "the tasks and --limit of this command"),
    (lambda f: f["variants"].pop(), "the variants (--variants, --noise-floor) of this command"),
    (lambda f: f["config"].update(model={"path": "/models/other"}), "`config.model`"),
])
def test_another_command_is_refused_naming_the_difference(tmp_path, change, where):
    run_dir = interrupted_run(tmp_path)
    fields = copy.deepcopy(RUN_FIELDS)
    change(fields)
    with pytest.raises(ResumeRefused, match="cannot continue") as err:
        reopen(run_dir, RunDocument.model_validate(fields))
    assert where in str(err.value) and "unchanged" in str(err.value)
    assert (run_dir / "sp").exists(), "a refused resume must change nothing"


def test_the_output_root_alone_may_differ(tmp_path):
    fields = copy.deepcopy(RUN_FIELDS)
    fields["config"]["output"] = str(tmp_path)
    assert reopen(interrupted_run(tmp_path), RunDocument.model_validate(fields))[1] == ["legacy"]


def test_a_finished_run_is_not_continued(tmp_path):
    run_dir = interrupted_run(tmp_path)
    info = artifacts.read_json(RunDir(run_dir).run_json)
    artifacts.write_json(RunDir(run_dir).run_json, {**info, "status": "ok", "verdict": "EQUIVALENT"})
    with pytest.raises(ResumeRefused, match="has already finished \\(verdict EQUIVALENT\\)"):
        reopen(run_dir, fresh())


def test_a_kept_variant_with_altered_artifacts_is_refused(tmp_path):
    run_dir = interrupted_run(tmp_path)
    samples = run_dir / "legacy" / "samples.parquet"
    samples.write_bytes(samples.read_bytes()[:-10])
    with pytest.raises(ResumeRefused, match="samples.parquet does not match its manifest"):
        reopen(run_dir, fresh())


def test_first_difference_names_the_path():
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == "a.b[1]"
    assert first_difference({"a": 1}, {"a": 1, "c": 2}) == "c"
    assert first_difference([1], [1, 2]) == "the whole value"
    assert first_difference({"x": [1]}, {"x": [1]}) is None


def test_resume_on_the_command_line_needs_a_run_directory(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["run", "gsm8k", "--resume", str(tmp_path / "nothing")])
    assert out.exit_code == 2 and "not a run directory (no run.json there)" in out.output
    run_dir = interrupted_run(tmp_path)
    out = runner.invoke(app, ["run", "gsm8k", "--resume", str(run_dir), "--run-id", "other"])
    assert out.exit_code == 2 and "name different runs" in out.output


def test_a_kept_variant_s_manifest_is_read_once(tmp_path, monkeypatch):
    """Deciding it finished, verifying it and taking its status read one manifest: what
    was verified is what the status comes from (and a large run reads each once)."""
    run_dir = interrupted_run(tmp_path)
    info = artifacts.read_json(RunDir(run_dir).run_json)
    artifacts.write_json(RunDir(run_dir).run_json, {**info, "variant_status": {}})  # status from the manifest too
    reads = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "manifest.json":
            reads.append(self.parent.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    info, kept = reopen(run_dir, fresh())
    assert kept == ["legacy"] and info.variant_status["legacy"].exit_code == 0
    assert reads.count("legacy") == 1, reads
