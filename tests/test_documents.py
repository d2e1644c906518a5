"""The documents that cross a process or file boundary are typed and versioned (evalpipe/documents/):
one writer, one reader, a field the reader does not know or a version it does not read
refused in one sentence instead of silently dropped."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest
from fakes import make_samples, mutate, perturb_topk, set_token, write_run
from pydantic import ValidationError

from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import COMPARE_SCHEMA_VERSION, ComparisonDocument, read_comparison
from evalpipe.documents.journal import JOURNAL_FILE, JOURNAL_LINE_VERSION, JournalLine, read_journal_line
from evalpipe.documents.manifest import (
    MANIFEST_VERSION,
    ArtifactEntry,
    CollectiveCounts,
    DataFile,
    EngineInfo,
    Hardware,
    JournalSummary,
    ProbeSummary,
    ServerInfo,
    VariantManifest,
    migrate,
    read_manifest,
    write_manifest,
)
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
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import MANIFEST_JSON
from evalpipe.worker.http_engine import HttpEngine
from evalpipe.worker.journal import RequestJournal


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
    """Before, settings were copied by key into a class of their own and an unknown one
    vanished; now the engine takes the job's model as it is."""
    server = ServerJob(url="http://u:secret@h:1/v1", model="m", api_key_env="K", concurrency=3, request_timeout_s=9.0,
                       retries=1, ready_timeout_s=5.0, tokenizer="/tok", tokenizer_args={"tokenizer_mode": "slow"})
    engine = HttpEngine(server, lazy=True)
    try:
        assert engine.settings is server
    finally:
        engine.close()
    assert "secret" not in server.shown_url and server.headers() == {}


# ---------------------------------------------------------------------------
# compare.json
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compared_run(tmp_path_factory):
    """A real comparison with every optional section: the A/A noise floor, teacher-forced
    tokens, distributional tests and the (not recorded) path judgement."""
    from evalpipe.pipeline.comparing import compare_run, write_outputs

    s, t = make_samples(8), make_samples(8, seed=5)
    variants = {"legacy": s, "legacy-aa": mutate(s, 3, set_token(1, 999)), "sp": mutate(s, 1, set_token(1, 999))}
    teachers = {"legacy": t, "legacy-aa": mutate(t, 2, perturb_topk(0.5)), "sp": mutate(t, 4, perturb_topk(0.5))}
    root = write_run(tmp_path_factory.mktemp("compared") / "run", variants, reference="legacy", teachers=teachers,
                     noise_floor="legacy-aa")
    rc = compare_run(root)
    write_outputs(root, rc)
    return root, rc


def test_a_comparison_round_trips(compared_run):
    root, rc = compared_run
    path = artifacts.RunDir(root).compare_json
    doc = read_comparison(path)
    assert doc == rc.doc
    assert doc.noise_floor is not None and doc.comparisons[0].distribution and doc.comparisons[0].teacher
    assert doc.comparisons[0].paths is not None and doc.comparisons[0].paths.status == "not_recorded"
    assert path.read_text() == rc.to_json(), "the reader loses nothing the writer wrote"
    assert json.loads(path.read_text())["schema_version"] == COMPARE_SCHEMA_VERSION


def _rewrite(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["comparisons"][0].update(verdict="x"), "comparisons.0.verdict: Extra inputs are not permitted; re-run"),
    (lambda d: d["comparisons"][0]["gates"][0].update(status="DIFFERENT"), "comparisons.0.gates.0.status: Input should be"),
    (lambda d: d.update(status="DIFFERENT"), "status: Input should be 'IDENTICAL', 'EQUIVALENT', 'INCONCLUSIVE' or 'DIVERGENT'"),
])
def test_a_comparison_the_reader_does_not_know_is_one_sentence(compared_run, tmp_path, edit, fragment):
    root, _ = compared_run
    path = tmp_path / "compare.json"
    path.write_text(artifacts.RunDir(root).compare_json.read_text())
    _rewrite(path, edit)
    with pytest.raises(UserError) as err:
        read_comparison(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and fragment in text and text.endswith(f"`evalpipe compare {tmp_path}` to rewrite it.")
    assert "\n" not in text


@pytest.mark.parametrize("version, fragment", [
    (2, "was written by an older evalpipe (schema 2)"),
    (None, "was written by another evalpipe (schema None)"),
    (4, "was written by another evalpipe (schema 4)"),
])
def test_a_comparison_of_another_schema_is_refused_in_one_sentence(compared_run, tmp_path, version, fragment):
    """compare.json is derived data: an older one is rewritten from the artifacts, not migrated."""
    root, _ = compared_run
    path = tmp_path / "compare.json"
    path.write_text(artifacts.RunDir(root).compare_json.read_text())
    _rewrite(path, lambda d: d.update(schema_version=version) if version is not None else d.pop("schema_version"))
    with pytest.raises(UserError, match="re-run `evalpipe compare .*` to rewrite it.$") as err:
        read_comparison(path)
    assert fragment in str(err.value)


def test_an_unreadable_comparison_is_one_sentence(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as a comparison"):
        read_comparison(path)


def test_the_document_owns_the_schema_version():
    assert ComparisonDocument.model_fields["schema_version"].default == COMPARE_SCHEMA_VERSION == 3
# -- manifest.json ---------------------------------------------------------------------

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


# -- the request journal's lines ------------------------------------------------------

def test_a_journal_line_round_trips_with_its_version(tmp_path):
    path = tmp_path / JOURNAL_FILE
    journal = RequestJournal(path)
    answer = {"token_ids": [1, 2], "logprobs": [-0.5, float("-inf")], "finish_reason": "stop"}
    journal.put("k1", answer)
    journal.close()
    text = path.read_text()
    assert text.count("\n") == 1 and " " not in text, "one compact line per answer"
    assert json.loads(text)["v"] == JOURNAL_LINE_VERSION
    line = read_journal_line(text, path, 1)
    assert line == JournalLine(key="k1", answer=answer)
    again = RequestJournal(path)
    assert again.get("k1") == answer and again.loaded == 1  # -inf comes back as -inf
    again.close()


def test_a_journal_line_from_before_the_version_is_read_and_a_cut_one_skipped(tmp_path):
    path = tmp_path / JOURNAL_FILE
    path.write_text('{"key": "old", "answer": {"text": "4"}}\n{"v": 1, "key": "new", "answer": {}}\n{"v": 1, "key": "cu')
    assert read_journal_line('{"key": "old", "answer": {"text": "4"}}', path, 1) == JournalLine(key="old", answer={"text": "4"})
    journal = RequestJournal(path)
    assert journal.loaded == 2 and journal.get("old") == {"text": "4"}
    journal.put("after", {"n": 1})  # not glued to the cut line
    journal.close()
    assert RequestJournal(path).loaded == 3


@pytest.mark.parametrize("line, fragment", [
    ('{"v": 2, "key": "k", "answer": {}}', "line 2 is a journal entry of version 2; this evalpipe reads version 1"),
    ('{"v": 1, "key": "k", "answer": {}, "at": 5}', "line 2: at: Extra inputs are not permitted; move the journal out of the variant directory"),
    ('{"v": 1, "answer": {}}', "line 2: key: Field required"),
    ('[1, 2]', "line 2 is not a journal entry (a JSON object)"),
])
def test_a_journal_line_this_evalpipe_cannot_read_is_one_sentence(tmp_path, line, fragment):
    path = tmp_path / JOURNAL_FILE
    path.write_text('{"v": 1, "key": "a", "answer": {}}\n' + line + "\n")
    with pytest.raises(UserError, match=JOURNAL_FILE) as err:
        RequestJournal(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_worker_refuses_a_journal_it_cannot_read_as_a_user_error(tmp_path):
    """Before any engine starts: the variant fails with the journal's sentence (exit 2),
    and its manifest says so."""
    from evalpipe.worker import main

    vdir = tmp_path / "v"
    vdir.mkdir()
    (vdir / JOURNAL_FILE).write_text('{"v": 2, "key": "k", "answer": {}}\n')
    job = WorkerJob(variant="v", output_dir=str(vdir), engine_args={"model": str(tmp_path)}, tasks=[], topk=1,
                    data_dir=str(tmp_path / "data"), journal=JOURNAL_FILE)
    events = []

    class Events:
        def emit(self, event, **fields):
            events.append((event, fields))

    assert main.run(job, Events()) == ExitCode.USER_ERROR  # type: ignore[arg-type]
    kind, message = events[-1][1]["kind"], events[-1][1]["message"]
    assert kind == "user" and "line 1 is a journal entry of version 2" in message
    manifest = read_manifest(vdir / MANIFEST_JSON)
    assert manifest.status == "failed" and manifest.error == message


def test_the_parent_marks_a_stopped_worker_s_manifest_failed_and_keeps_the_rest(tmp_path):
    """read -> copy with the change -> write: nothing the worker wrote is lost."""
    from types import SimpleNamespace

    from evalpipe.pipeline import bookkeeping
    running = _manifest().model_copy(update={"status": "running", "artifacts": None, "finished_at": None})
    path = tmp_path / MANIFEST_JSON
    write_manifest(path, running)
    bookkeeping.close_manifest(tmp_path, SimpleNamespace(ok=False, error="made no progress for 60 s"))
    closed = read_manifest(path)
    assert closed.status == "failed" and closed.error == "made no progress for 60 s" and closed.finished_at
    assert closed.model_copy(update={"status": "running", "error": None, "finished_at": None}) == running
    write_manifest(path, closed.model_copy(update={"status": "ok"}))
    bookkeeping.close_manifest(tmp_path, SimpleNamespace(ok=False, error="late"))
    assert read_manifest(path).status == "ok", "a worker that said it finished is not overruled"


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
    (lambda d: d.update(verdikt="OK"), "run.json: verdikt: Extra inputs are not permitted; fix it, or restore it from a copy."),
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


# ---------------------------------------------------------------------------
# the worker's events
# ---------------------------------------------------------------------------


def test_worker_events_round_trip_as_one_line_each():
    from evalpipe.documents.worker_events import ErrorEvent, ProgressEvent, event_line, make_event, read_event

    progress = make_event("progress", task="gsm8k", phase="generate", done=3, total=8)
    line = event_line(progress)
    assert line.endswith("\n") and line.count("\n") == 1 and json.loads(line)["v"] == 1
    assert read_event(line) == progress and isinstance(progress, ProgressEvent)
    error = make_event("error", kind="user", message="bad task")
    assert read_event(event_line(error)) == ErrorEvent(kind="user", message="bad task")


def test_a_worker_event_of_before_the_typed_stream_is_read_as_version_1():
    from evalpipe.documents.worker_events import StageEvent, read_event

    assert read_event('{"event": "stage", "stage": "engine_ready", "message": "ready"}') == StageEvent(stage="engine_ready", message="ready")


def test_an_event_this_evalpipe_does_not_read_is_said_and_a_stray_print_ignored():
    from evalpipe.documents.worker_events import ErrorEvent, read_event

    assert read_event("loading weights 50%") is None and read_event("[1, 2]") is None
    odd = read_event('{"v": 2, "event": "progress", "task": "t", "phase": "p", "done": 1, "total": 2}')
    assert isinstance(odd, ErrorEvent) and "does not read" in odd.message and "same evalpipe" in odd.message
    unknown = read_event('{"event": "celebrate"}')
    assert isinstance(unknown, ErrorEvent) and "celebrate" in unknown.message


def test_the_worker_cannot_send_a_field_the_event_lacks():
    from evalpipe.documents.worker_events import make_event

    with pytest.raises(ValidationError):
        make_event("done", seconds=1.0, extra="x")
