"""manifest.json (evalpipe/documents/manifest.py): a variant's manifest round-trips writing
only what is known, a version-less one reads as version 1, one of another version or with
an unknown key is refused in one sentence, and the parent's read-copy-write of a stopped
worker's manifest loses nothing."""

from __future__ import annotations

import json

import pytest

from evalpipe.documents.manifest import (
    MANIFEST_VERSION,
    ArtifactEntry,
    CollectiveCounts,
    DataFile,
    EngineInfo,
    Hardware,
    JournalSummary,
    ManifestStatus,
    ProbeSummary,
    ServerInfo,
    VariantManifest,
    migrate,
    read_manifest,
    write_manifest,
)
from evalpipe.errors import UserError
from evalpipe.rundir.artifacts import MANIFEST_JSON


def _manifest() -> VariantManifest:
    """Every field a finished served variant's manifest has: the worker's, the parent's probe summary."""
    return VariantManifest(
        variant="sp", status="ok", python="/usr/bin/python3", argv=["-m", "evalpipe.worker.main", "job.json"],
        env={"HOME": "/root", "HF_TOKEN": "<redacted>"}, engine_kind="http", launch_mode="serve",
        engine_args={"model": "m", "tensor_parallel_size": 2, "enforce_eager": True},
        versions={"python": "3.11.9", "vllm": "0.32.0", "vllm_ascend": None},
        hardware=Hardware(cpu="AMD EPYC", isa=["avx2"], machine="x86_64", system="Linux", cpus=2),
        started_at=1.0, finished_at=9.0,
        data_files={"gsm8k": {"test": DataFile(path="/data/gsm8k.jsonl", sha256="a" * 64)}},
        engine=EngineInfo(kind="http", max_model_len=2048, model="m",
                          server=ServerInfo(url="http://127.0.0.1:8000/v1", models=[{"id": "m"}], version={"version": "0.32.0"}),
                          ready_wait_s=3.5, tokenized_by="local",
                          journal=JournalSummary(file="requests.journal.jsonl", answers_found=2, answers_reused=2)),
        truncated_prompts=0, n_samples=8, timings={"engine_start_s": 3.5, "task:gsm8k_s": 2.0, "total_s": 8.0},
        artifacts={"samples.parquet": ArtifactEntry(bytes=10, sha256="b" * 64, rows=8),
                   "job.json": ArtifactEntry(bytes=5, sha256="c" * 64)},
        probes=ProbeSummary(mode="serve", verifiable=True, processes={"api_server": 1}, models=["LlamaForCausalLM"],
                            layers={"LlamaDecoderLayer": 2}, switches={"sp": True}, calls={"f": 3}, absent=[],
                            collectives_per_forward={"all_reduce": CollectiveCounts(counts={"4": 2}, forwards=2)},
                            forwards=2),
    )


def test_a_manifest_round_trips(tmp_path):
    manifest = _manifest()
    path = tmp_path / MANIFEST_JSON
    write_manifest(path, manifest)
    assert read_manifest(path) == manifest
    raw = json.loads(path.read_text())
    assert raw["version"] == MANIFEST_VERSION
    # what is not known is not written (as before the model): no error, no rows of a JSON file
    assert "error" not in raw and "rows" not in raw["artifacts"]["job.json"]
    assert raw["versions"]["vllm_ascend"] is None, "a package that is not installed stays said"


def test_a_manifest_from_before_the_version_is_read_as_version_1(tmp_path):
    """A run directory of an earlier evalpipe stays comparable: its manifest had no version,
    and each field was added over time (an old served variant: no tokenizer or wait, the
    old hardware record, no artifacts record)."""
    old = {"variant": "legacy", "status": "ok", "python": "/p", "argv": [], "env": {}, "engine_kind": "http",
           "engine_args": {"model": "m"}, "versions": {"vllm": "0.7.0"},
           "hardware": {"machine": "x86_64", "system": "Linux", "cpus": 4}, "started_at": 1, "finished_at": 2,
           "engine": {"kind": "http", "max_model_len": 512, "model": "m", "server": {"url": "http://h/v1", "models": []}},
           "timings": {"total_s": 3}, "n_samples": 4}
    path = tmp_path / MANIFEST_JSON
    path.write_text(json.dumps(old))
    manifest = read_manifest(path)
    assert manifest.version == MANIFEST_VERSION and manifest.launch_mode == "offline"
    assert manifest.hardware == Hardware(machine="x86_64", system="Linux", cpus=4)
    assert manifest.engine is not None and manifest.engine.tokenized_by is None and manifest.artifacts is None
    assert manifest.timings == {"total_s": 3.0}
    assert migrate(old) == {**old, "version": MANIFEST_VERSION}


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(version=2), "is a variant manifest of version 2; this evalpipe reads version 1"),
    (lambda d: d.update(name="sp"), "manifest.json: name: Extra inputs are not permitted; restore it or re-run the variant."),
    (lambda d: d["engine"].update(gpus=8), "manifest.json: engine.gpus: Extra inputs are not permitted"),
    (lambda d: d["artifacts"]["job.json"].pop("sha256"), "manifest.json: artifacts.job.json.sha256: Field required"),
    (lambda d: d.update(status="paused"), "manifest.json: status: Input should be 'running', 'ok' or 'failed'"),
])
def test_a_manifest_this_evalpipe_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = _manifest().model_dump(mode="json")
    edit(raw)
    path = tmp_path / MANIFEST_JSON
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError, match="manifest.json") as err:
        read_manifest(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_manifest_that_is_no_json_object_is_one_sentence(tmp_path):
    path = tmp_path / MANIFEST_JSON
    for text, fragment in (("{cut", "cannot be read ("), ("[1]", "is not a variant manifest (a JSON object)")):
        path.write_text(text)
        with pytest.raises(UserError) as err:
            read_manifest(path)
        assert fragment in str(err.value) and str(err.value).endswith("restore it or re-run the variant.")


def test_the_parent_marks_a_stopped_worker_s_manifest_failed_and_keeps_the_rest(tmp_path):
    """read -> copy with the change -> write: nothing the worker wrote is lost."""
    from types import SimpleNamespace

    from evalpipe.pipeline import bookkeeping
    running = _manifest().model_copy(update={"status": ManifestStatus.RUNNING, "artifacts": None, "finished_at": None})
    path = tmp_path / MANIFEST_JSON
    write_manifest(path, running)
    bookkeeping.close_manifest(tmp_path, SimpleNamespace(ok=False, error="made no progress for 60 s"))
    closed = read_manifest(path)
    assert closed.status == "failed" and closed.error == "made no progress for 60 s" and closed.finished_at
    assert closed.model_copy(update={"status": ManifestStatus.RUNNING, "error": None, "finished_at": None}) == running
    write_manifest(path, closed.model_copy(update={"status": ManifestStatus.OK}))
    bookkeeping.close_manifest(tmp_path, SimpleNamespace(ok=False, error="late"))
    assert read_manifest(path).status == "ok", "a worker that said it finished is not overruled"
