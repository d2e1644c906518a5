"""evalpipe/pipeline/bookkeeping.py: opening a run directory (a new one running from now,
one that holds no run or cannot be made refused in one sentence, a finished run not
reopened), the environment each worker measured lifted into run.json (the reference's
for the header, whenever it finishes), and a stopped or interrupted variant's manifest
marked failed while a finished one is left alone."""

from __future__ import annotations

import signal

import pytest
from fakes import make_samples, update_manifest, write_run
from plans import fake_plan

from evalpipe.config.errors import ConfigError
from evalpipe.documents.manifest import read_manifest
from evalpipe.documents.run_doc import read_run_document, write_run_document
from evalpipe.execution import launch
from evalpipe.pipeline import bookkeeping
from evalpipe.pipeline.plan import run_info
from evalpipe.rundir import artifacts
from evalpipe.rundir.lock import unlock_run_dir


@pytest.fixture
def plan(tmp_path):
    return fake_plan(tmp_path, {"a": {}, "b": {}}, "r1")


def test_a_new_run_directory_is_made_and_its_run_starts_running(plan):
    rd = artifacts.RunDir(plan.run_dir)
    try:
        info, kept = bookkeeping.open_run_dir(rd, run_info(plan))
    finally:
        unlock_run_dir(plan.run_dir)
    assert rd.root.is_dir() and kept == []
    assert info.status == "running" and info.started_at and info.variant_status == {}
    assert info.variants == ["a", "b"]


def test_a_directory_that_holds_no_run_or_cannot_be_made_is_refused(plan, tmp_path):
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and holds no run"):
        bookkeeping.open_run_dir(artifacts.RunDir(plan.run_dir), run_info(plan))
    assert (plan.run_dir / "notes.txt").read_text() == "mine"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create the run directory"):
        bookkeeping.open_run_dir(artifacts.RunDir(blocker / "run"), run_info(plan))


def test_a_finished_run_is_not_reopened(plan):
    write_run_document(plan.run_dir, run_info(plan).updated(status="ok", verdict="IDENTICAL"))
    try:
        with pytest.raises(ConfigError, match="has already finished"):
            bookkeeping.open_run_dir(artifacts.RunDir(plan.run_dir), run_info(plan))
    finally:
        unlock_run_dir(plan.run_dir)


def test_each_variant_s_versions_beside_its_settings_and_the_reference_s_in_the_header(plan, tmp_path):
    run = write_run(tmp_path / "run", {"a": make_samples(2), "b": make_samples(2)})
    for name, vllm in (("a", "0.32.0"), ("b", "0.33.0")):
        update_manifest(artifacts.VariantDir(run / name), versions={"vllm": vllm, "vllm_ascend": None},
                        hardware={"cpus": 8 if name == "a" else 2})
    info = run_info(plan)
    info = bookkeeping.record_environment(info, "b", run / "b")  # on a cluster another variant may finish first
    assert info.variant_settings["b"].versions == {"vllm": "0.33.0"}, "what is not installed is left out"
    assert info.versions == {"vllm": "0.33.0"} and info.hardware["cpus"] == 2
    info = bookkeeping.record_environment(info, "a", run / "a", header=True)
    assert info.versions == {"vllm": "0.32.0"} and info.hardware["cpus"] == 8, "the reference's header wins"
    info = bookkeeping.record_environment(info, "b", run / "b")
    assert info.versions == {"vllm": "0.32.0"} and info.variant_settings["a"].versions == {"vllm": "0.32.0"}
    assert bookkeeping.record_environment(info, "b", tmp_path / "no-such-variant") == info, "no manifest, nothing to say"


def test_a_stopped_variant_is_marked_failed_and_a_finished_one_kept(tmp_path):
    run = write_run(tmp_path / "run", {"a": make_samples(2), "b": make_samples(2)})
    a, b = artifacts.VariantDir(run / "a"), artifacts.VariantDir(run / "b")
    update_manifest(a, status="running")
    bookkeeping.mark_stopped(a, "made no progress for 60 s")
    bookkeeping.mark_stopped(b, "late")
    stopped = read_manifest(a.manifest)
    assert (stopped.status, stopped.error) == ("failed", "made no progress for 60 s") and stopped.finished_at
    assert read_manifest(b.manifest).status == "ok"
    bookkeeping.mark_stopped(artifacts.VariantDir(tmp_path / "never-started"), "x")  # no manifest: nothing to mark
    assert not (tmp_path / "never-started").exists()


def test_ctrl_c_marks_the_run_interrupted_and_the_running_variant_failed(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", {"a": make_samples(2), "b": make_samples(2)})
    update_manifest(artifacts.VariantDir(run / "b"), status="running")
    info = read_run_document(run)
    write_run_document(run, info.updated(status="running", variant_status={"a": {"exit_code": 0}}))
    monkeypatch.setattr(launch, "interrupts", [signal.SIGINT])
    bookkeeping.mark_interrupted(run)
    after = read_run_document(run)
    assert (after.status, after.interrupted_by, after.finished_variants) == ("interrupted", "SIGINT", ["a"])
    assert after.error == "interrupted by SIGINT; finished variants: a"
    assert read_manifest(artifacts.VariantDir(run / "b").manifest).error == "interrupted by SIGINT"
    assert read_manifest(artifacts.VariantDir(run / "a").manifest).status == "ok"
