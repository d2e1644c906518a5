"""The documents that cross a process boundary are typed and versioned (evalpipe/documents/):
one writer, one reader, a field the reader does not know or a version it does not read
refused in one sentence instead of silently dropped."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest
from fakes import make_samples, mutate, perturb_topk, set_token, write_run

from evalpipe import artifacts
from evalpipe.documents.comparison import COMPARE_SCHEMA_VERSION, ComparisonDocument, read_comparison
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


# ---------------------------------------------------------------------------
# compare.json
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compared_run(tmp_path_factory):
    """A real comparison with every optional section: the A/A noise floor, teacher-forced
    tokens, distributional tests and the (not recorded) path judgement."""
    from evalpipe.rundirs import compare_run, write_outputs

    s, t = make_samples(8), make_samples(8, seed=5)
    variants = {"legacy": s, "legacy-aa": mutate(s, 3, set_token(1, 999)), "sp": mutate(s, 1, set_token(1, 999))}
    teachers = {"legacy": t, "legacy-aa": mutate(t, 2, perturb_topk(0.5)), "sp": mutate(t, 4, perturb_topk(0.5))}
    root = write_run(tmp_path_factory.mktemp("compared") / "run", variants, reference="legacy", teachers=teachers,
                     noise_floor="legacy-aa")
    rc = compare_run(root)
    write_outputs(root, rc, {})
    return root, rc


def test_a_comparison_round_trips(compared_run):
    root, rc = compared_run
    path = artifacts.RunDir(root).compare_json
    doc = read_comparison(path)
    assert doc == rc.document()
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
