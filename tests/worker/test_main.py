"""evalpipe/worker/main.py: one variant's phases in the worker process, run here in the
test's process on the fake engine (the engine table's `fake` entry, chosen by its
variable). Pinned: a finished variant leaves its manifest, tables and `done` event; an
engine that cannot start fails the variant with its reason, in the manifest and as an
error event, without tables; and a task's failure is the user's when its data is not
available offline and the run's otherwise, in one sentence that points at the engine log."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from evalpipe.config.run_config import TaskSpec
from evalpipe.documents.worker_job import WorkerJob
from evalpipe.errors import ExitCode
from evalpipe.rundir import artifacts
from evalpipe.worker import main
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


class Recorder:
    """The events the worker would send its parent, kept."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def emit(self, event: str, **fields) -> None:
        self.events.append({"event": event, **fields})

    def progress(self, task: str, phase: str, done: int, total: int) -> None:
        self.emit("progress", task=task, phase=phase, done=done, total=total)


def _job(tmp_path: Path) -> WorkerJob:
    return WorkerJob(variant="v", output_dir=str(tmp_path / "v"), engine_args={"model": "fake-model"},
                     tasks=[TaskSpec(task="gsm8k_synth_4shot", limit=2)], seed=0, data_dir=str(tmp_path / "data"), topk=3)


def _manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "v" / artifacts.MANIFEST_JSON).read_text())


def test_a_variant_on_the_fake_engine_finishes_with_its_tables_and_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "1")
    events = Recorder()
    assert main.run(_job(tmp_path), events) == 0
    manifest = _manifest(tmp_path)
    assert manifest["status"] == "ok" and manifest["engine"]["kind"] == "fake"
    samples = pq.read_table(tmp_path / "v" / "samples.parquet")
    assert samples.num_rows == 2 and set(samples.column("task").to_pylist()) == {"gsm8k_synth_4shot"}
    assert pq.read_table(tmp_path / "v" / "tokens.parquet").num_rows > 0
    assert events.events[-1]["event"] == "done"
    assert any(e["event"] == "progress" for e in events.events)


def test_an_engine_that_cannot_start_fails_the_variant_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(FAKE_ENGINE_ENV, "fail_start")
    events = Recorder()
    code = main.run(_job(tmp_path), events)
    assert code != 0
    (error,) = [e for e in events.events if e["event"] == "error"]
    assert "fail_start" in error["message"]
    manifest = _manifest(tmp_path)
    assert manifest["status"] == "failed" and manifest["error"] == error["message"]
    assert not (tmp_path / "v" / "samples.parquet").exists()


def test_a_task_s_failure_is_the_user_s_only_when_its_data_is_not_available_offline(tmp_path):
    log = tmp_path / "engine.log"
    offline = main._task_failure("longbench_x", OSError("Couldn't reach 'org/set' on the Hub (LocalEntryNotFoundError)"), log)
    assert offline.code == ExitCode.USER_ERROR and offline.kind == "user"
    assert "`data_files:`" in offline.message and offline.message.endswith(".")
    broken = main._task_failure("gsm8k", KeyError("answer"), log)
    assert broken.code == ExitCode.FAILED and broken.kind == "run"
    assert broken.message.startswith("task `gsm8k` failed: KeyError") and str(log) in broken.message


def test_a_sampled_task_writes_a_row_per_sample_scored_on_its_own_answer(tmp_path, monkeypatch):
    import re

    from evalpipe.config.sampling import Sampling, sample_seed

    monkeypatch.setenv(FAKE_ENGINE_ENV, "1")
    job = _job(tmp_path).model_copy(update={"seed": 11, "tasks": [
        TaskSpec(task="gsm8k_synth_4shot", limit=3, sampling=Sampling(temperature=0.9, top_p=0.95, samples=4))]})
    assert main.run(job, Recorder()) == 0
    rows = pq.read_table(tmp_path / "v" / "samples.parquet").to_pylist()
    assert sorted((r["doc_id"], r["repeat"]) for r in rows) == [(d, s) for d in range(3) for s in range(4)]
    assert all(r["seed"] == sample_seed(11, "gsm8k_synth_4shot", r["doc_id"], 0, r["repeat"]) for r in rows)
    assert {(r["temperature"], r["top_p"], r["top_k"], r["min_p"]) for r in rows} == {(0.9, 0.95, 0, 0.0)}
    assert {r["cluster"] for r in rows} == {"doc 0", "doc 1", "doc 2"}
    assert len({r["response"] for r in rows}) > 3  # the samples of an item differ
    for r in rows:  # each row's answer is its own response's, not its item's first sample's
        numbers = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", r["response"])
        assert (r["answer:flexible-extract"] == "[invalid]") == (not numbers)
        assert r["score:exact_match,flexible-extract"] == float(r["answer:flexible-extract"] == r["target"])
    answers = {(r["doc_id"], r["answer:flexible-extract"]) for r in rows}
    assert len(answers) > 3


def test_progress_within_a_call_is_thinned_but_every_call_s_first_and_last_count_go_out():
    thin = main.ProgressThinning(interval_s=0.5)
    assert thin.passes("t", "generate", 0, 8, now=10.0)  # the requests handed over
    assert not thin.passes("t", "generate", 1, 8, now=10.1)
    assert thin.passes("t", "generate", 2, 8, now=10.6)
    assert thin.passes("t", "generate", 8, 8, now=10.7)  # the call's end
    # the next call opens at once, however soon after the last count
    assert thin.passes("t", "loglikelihood", 0, 3, now=10.75)
    assert thin.passes("u", "generate", 0, 8, now=10.8)


def test_each_task_records_what_vllm_s_counters_say_it_drove_the_engine_through(tmp_path, monkeypatch):
    """A reading before and after every task; the manifest keeps the difference per task (an
    engine that exposes no counters, as the fake one by default, leaves the map empty)."""
    from evalpipe.worker.fakes.engine import FakeEngine

    readings = iter([{"prefix_cache_hits": 40.0, "engine_steps": 3.0}, {"prefix_cache_hits": 296.0, "engine_steps": 19.0}])
    monkeypatch.setattr(FakeEngine, "counters", lambda self: next(readings))
    monkeypatch.setenv(FAKE_ENGINE_ENV, "1")
    assert main.run(_job(tmp_path), Recorder()) == 0
    assert _manifest(tmp_path)["engine_counters"] == {"gsm8k_synth_4shot": {"prefix_cache_hits": 256, "engine_steps": 16}}
