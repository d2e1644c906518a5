"""The documents that cross a process boundary are typed and versioned (evalpipe/documents/):
one writer, one reader, a field the reader does not know or a version it does not read
refused in one sentence instead of silently dropped."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest

from evalpipe.config import Expectations, Gates
from evalpipe.documents.nightly_doc import (
    NIGHTLY_JSON,
    NIGHTLY_VERSION,
    NightlyDocument,
    read_nightly_document,
    write_nightly_document,
)
from evalpipe.documents.run_doc import (
    RUN_VERSION,
    Attempt,
    Fingerprints,
    NoiseFloorEntry,
    RunDocument,
    RunModel,
    Timings,
    VariantSettings,
    VariantStatus,
    read_run_document,
    write_run_document,
)
from evalpipe.documents.worker_job import JOB_VERSION, ServerJob, TeacherJob, WorkerJob, read_job, write_job
from evalpipe.errors import ExitCode, UserError
from evalpipe.worker.http_engine import ServerSettings


def _job(tmp_path, **changes) -> WorkerJob:
    base = WorkerJob(variant="sp", output_dir=str(tmp_path / "sp"), engine_args={"model": "m"}, tasks=[{"task": "t"}],
                     topk=5, data_dir=str(tmp_path / "data"), server=ServerJob(url="http://u:pw@127.0.0.1:1/v1"),
                     teacher=TeacherJob(enabled=True, reference_dir=str(tmp_path / "legacy")))
    return base.model_copy(update=changes)


def test_a_job_round_trips_owner_only(tmp_path):
    job = _job(tmp_path)
    path = tmp_path / "job.json"
    write_job(path, job)
    assert read_job(path) == job
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "it keeps the real URL and engine arguments"
    assert json.loads(path.read_text())["version"] == JOB_VERSION


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.pop("version"), "of version None; this evalpipe reads version 1"),
    (lambda d: d.update(version=2), "of version 2; this evalpipe reads version 1"),
    (lambda d: d["server"].update(tokenizer_path="x"), "server.tokenizer_path: Extra inputs are not permitted"),
    (lambda d: d.update(topk="many"), "topk: Input should be a valid integer"),
])
def test_a_job_the_worker_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = json.loads(_job(tmp_path).model_dump_json())
    edit(raw)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="job.json") as err:
        read_job(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_worker_refuses_an_unreadable_job_as_a_user_error(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"version": 99}))
    proc = subprocess.run([sys.executable, "-m", "evalpipe.worker.main", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.USER_ERROR, proc.stderr
    event = json.loads(proc.stdout.strip().splitlines()[-1])
    assert event["event"] == "error" and event["kind"] == "user" and "version 99" in event["message"]


def test_the_http_engine_takes_every_server_setting():
    """Before, settings were copied by key and an unknown one vanished; now each is a field of both."""
    server = ServerJob(url="http://h:1/v1", model="m", api_key_env="K", concurrency=3, request_timeout_s=9.0, retries=1,
                       ready_timeout_s=5.0, tokenizer="/tok", tokenizer_args={"tokenizer_mode": "slow"})
    settings = ServerSettings.from_job(server)
    assert {k: getattr(settings, k) for k in ServerJob.model_fields} == server.model_dump()


# -- run.json ------------------------------------------------------------------------


def _run_doc() -> RunDocument:
    return RunDocument(
        run_id="run-1", config_path="cfg.yaml", config={"gates": {"scores": {"margin": 0.02}}, "seed": 0},
        fingerprints=Fingerprints(config_sha256="a" * 64, code="0.1.0"), task_selector="gsm8k",
        tasks=[{"group": "gsm8k", "task": "gsm8k_synth_4shot", "limit": 8}], reference="legacy",
        variants=["legacy", "legacy-aa", "sp"],
        variant_settings={"legacy": VariantSettings(description="ref", env={"LAYOUT": "legacy"}, expect={"same_path": True}),
                          "sp": VariantSettings(env={"LAYOUT": "sp"}, engine={"max_num_seqs": 8})},
        noise_floor=NoiseFloorEntry(variant="legacy-aa", of="legacy", reverse_order=True),
        model=RunModel(path="/m", fingerprint="f" * 64, builtin=True, name="builtin:tiny"), kind="nightly",
        status="failed", variant_status={"legacy": VariantStatus(exit_code=0, seconds=1.5, error=None)},
        timings=Timings(model_s=0.5), failed_variants=["sp"], attempts=[Attempt(at=1.0, kept=[], previous_status="interrupted")],
    )


def test_a_run_document_round_trips_and_keeps_only_what_was_set(tmp_path):
    doc = _run_doc()
    write_run_document(tmp_path, doc)
    assert read_run_document(tmp_path) == doc == read_run_document(tmp_path / "run.json")
    raw = json.loads((tmp_path / "run.json").read_text())
    assert raw["version"] == RUN_VERSION and "verdict" not in raw and "stalled" not in raw["variant_status"]["legacy"]
    assert read_run_document(tmp_path / "elsewhere") is None, "no run.json: no document"
    # what the readers ask of it
    assert doc.noise_floor_of("legacy") == "legacy-aa" and doc.noise_floor_of("sp") is None and doc.aa_variant == "legacy-aa"
    assert doc.gates_of().scores.margin == 0.02 and RunDocument().gates_of() == Gates()
    assert doc.expectations_of("legacy") == Expectations(same_path=True) and doc.expectations_of("sp") is None
    # patched by copy, validated, and set fields unset again (resume)
    later = doc.updated(status="ok", verdict="EQUIVALENT").without("failed_variants")
    assert later.status == "ok" and later.failed_variants == [] and "failed_variants" not in later.as_mapping()
    with pytest.raises(ValueError):
        doc.updated(status="finished")


def test_a_run_document_redacts_what_it_writes(tmp_path):
    doc = _run_doc().updated(error="server `vllm serve --api-key sk_secret123` died")
    write_run_document(tmp_path, doc)
    assert "sk_secret123" not in (tmp_path / "run.json").read_text()


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(verdikt="OK"), "run.json: verdikt: Extra inputs are not permitted; fix or remove it."),
    (lambda d: d["noise_floor"].update(name="x"), "run.json: noise_floor.name: Extra inputs are not permitted"),
    (lambda d: d["variant_settings"]["sp"].update(pyhton="/x"), "run.json: variant_settings.sp.pyhton: Extra inputs"),
    (lambda d: d.update(version=2), "is a run.json of version 2; this evalpipe reads version 1"),
    (lambda d: d.update(status="finished"), "run.json: status: Input should be"),
])
def test_a_run_json_this_evalpipe_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = json.loads(_run_doc().model_dump_json(exclude_unset=True))
    raw["version"] = RUN_VERSION
    edit(raw)
    (tmp_path / "run.json").write_text(json.dumps(raw))
    with pytest.raises(UserError) as err:
        read_run_document(tmp_path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_version_less_run_json_is_migrated(tmp_path):
    """run.json written before it had a version (earlier evalpipe, hand-built run directories)
    still reads, its older shapes of variants and model brought to version 1."""
    (tmp_path / "run.json").write_text(json.dumps({
        "run_id": "old", "reference": "legacy", "model": "/models/tiny",
        "variants": [{"name": "legacy", "env": {"LAYOUT": "legacy"}}, "sp"],
        "noise_floor": {"variant": "legacy-aa", "of": "legacy", "reverse_order": True}, "status": "ok",
    }))
    doc = read_run_document(tmp_path)
    assert doc is not None and doc.version == RUN_VERSION and doc.variants == ["legacy", "sp"]
    assert doc.variant_settings["legacy"].env == {"LAYOUT": "legacy"} and doc.model.path == "/models/tiny"
    assert doc.noise_floor_of("legacy") == "legacy-aa" and doc.status == "ok"
    (tmp_path / "run.json").write_text(json.dumps({"variants": {"a": {"engine": {"x": 1}}, "b": {}}}))
    doc = read_run_document(tmp_path)
    assert doc is not None and doc.variants == ["a", "b"] and doc.variant_settings["a"].engine == {"x": 1}
    (tmp_path / "run.json").write_text("{}")
    assert read_run_document(tmp_path) == RunDocument()


# -- nightly.json --------------------------------------------------------------------


def _night() -> NightlyDocument:
    return NightlyDocument(run_id="night-3", status="REGRESSION", verdict="EQUIVALENT", baseline="night-2",
                           reasons=["sp drifted from baseline night-2: DIVERGENT"],
                           vs_baseline=[{"variant": "sp", "status": "DIVERGENT", "baseline": "night-2"}],
                           changes=[{"state": "flagged", "run_id": "night-3"}], paths=None)


def test_a_nightly_document_round_trips(tmp_path):
    path = tmp_path / NIGHTLY_JSON
    write_nightly_document(path, _night())
    assert read_nightly_document(path) == _night()
    assert json.loads(path.read_text())["version"] == NIGHTLY_VERSION
    assert read_nightly_document(tmp_path / "none.json") is None
    # the history keeps the judgement without the file's version
    assert "version" not in _night().judgement() and _night().judgement()["baseline"] == "night-2"


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(baselin="x"), "nightly.json: baselin: Extra inputs are not permitted"),
    (lambda d: d.update(version=7), "is a nightly.json of version 7; this evalpipe reads version 1"),
    (lambda d: d.update(status="GREEN"), "nightly.json: status: Input should be"),
])
def test_a_nightly_json_this_evalpipe_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = json.loads(_night().model_dump_json())
    edit(raw)
    path = tmp_path / NIGHTLY_JSON
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError) as err:
        read_nightly_document(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_version_less_nightly_json_reads_as_version_1(tmp_path):
    raw = json.loads(_night().model_dump_json())
    raw.pop("version")
    path = tmp_path / NIGHTLY_JSON
    path.write_text(json.dumps(raw))
    assert read_nightly_document(path) == _night()
