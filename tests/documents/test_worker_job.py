"""job.json (evalpipe/documents/worker_job.py): a worker's job round-trips owner-only, a job of
another version or with a key the worker does not know is refused in one sentence (by the
worker too, as a user error), and the server settings reach the HTTP engine as they are."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest

from evalpipe.documents.worker_job import JOB_VERSION, ServerJob, TeacherJob, WorkerJob, read_job, write_job
from evalpipe.errors import ExitCode, UserError
from evalpipe.worker.http_engine import HttpEngine


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


def test_the_api_key_is_read_from_its_variable_at_each_use(monkeypatch):
    server = ServerJob(url="http://127.0.0.1:1/v1", api_key_env="EVALPIPE_TEST_KEY")
    monkeypatch.delenv("EVALPIPE_TEST_KEY", raising=False)
    assert server.headers() == {}
    monkeypatch.setenv("EVALPIPE_TEST_KEY", "sk-1")
    assert server.headers() == {"Authorization": "Bearer sk-1"}
    assert "sk-1" not in server.model_dump_json(), "the key itself is never written"


def test_an_unreadable_job_file_is_one_sentence(tmp_path):
    path = tmp_path / "job.json"
    path.write_text("{cut")
    with pytest.raises(UserError, match=r"job.json cannot be read as a worker job \(.*\); re-run the variant.$"):
        read_job(path)
    with pytest.raises(UserError, match="cannot be read as a worker job"):
        read_job(tmp_path / "missing.json")
