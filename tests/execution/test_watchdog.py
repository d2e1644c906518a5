"""The no-progress watchdog's bookkeeping (pure) and run_worker enforcing it on a real
child process that stops talking (a stand-in interpreter: no engine is needed to be silent)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from processes import wait_gone

from evalpipe.documents.worker_events import read_event
from evalpipe.documents.worker_job import WorkerJob
from evalpipe.execution.launch import run_worker
from evalpipe.execution.watchdog import Watchdog
from evalpipe.pipeline.plan import PlannedVariant

# the fake interpreters below never read it
JOB = WorkerJob(variant="v", output_dir="v", engine_args={}, tasks=[], topk=1, data_dir="data")


def progress(done: int, total: int = 8, phase: str = "generate") -> dict:
    return {"event": "progress", "task": "gsm8k", "phase": phase, "done": done, "total": total}


def _read(event: dict):
    """The event as the parent reads it off the worker's stdout."""
    return read_event(json.dumps(event))


def test_not_armed_until_the_engine_is_up():
    dog = Watchdog(10)
    dog.see(_read({"event": "stage", "stage": "engine", "message": "starting engine"}), 0)
    assert not dog.stalled(1000), "a slow engine start is not the watchdog's business"
    dog.see(_read({"event": "stage", "stage": "engine_ready", "message": "engine ready"}), 100)
    assert not dog.stalled(110) and dog.stalled(110.5)


def test_only_a_finished_request_or_a_new_stage_counts_as_progress():
    dog = Watchdog(10)
    dog.see(_read(progress(1)), 0)
    dog.see(_read(progress(1)), 8)  # the same count again: no request finished
    assert dog.stalled(10.5)
    dog.see(_read(progress(2)), 10.5)
    assert not dog.stalled(20) and dog.stalled(21)
    assert "gsm8k generate 2/8 requests" in dog.describe(21)
    dog.see(_read(progress(0, 4, phase="loglikelihood")), 21)  # another phase starts from zero
    assert not dog.stalled(30)
    dog.see(_read({"event": "stage", "stage": "teacher", "message": "teacher forcing"}), 30)
    assert not dog.stalled(39) and "teacher forcing" in dog.describe(41)


def test_a_server_still_starting_after_the_task_began_disarms_it_until_its_requests_are_sent():
    """A served variant's task begins before its server is up: the wait, the tokenizer's load
    and lm-eval's request building are start-up, not a hang; the engine call that opens with
    0/n arms it again (the silence from there on is the engine's)."""
    dog = Watchdog(30)
    dog.see(_read({"event": "stage", "stage": "task", "message": "running gsm8k"}), 0)
    dog.see(_read({"event": "stage", "stage": "engine", "message": "waiting for the server (70s)"}), 70)
    assert not dog.stalled(200), "the server's start and what follows it until the first request"
    dog.see(_read(progress(0)), 200)
    assert not dog.stalled(230) and dog.stalled(231)
    assert "gsm8k generate 0/8 requests" in dog.describe(231)


def test_no_limit_never_stalls():
    dog = Watchdog(None)
    dog.see(_read(progress(1)), 0)
    assert not dog.stalled(1e9)


def fake_interpreter(tmp_path: Path, events: list[dict], then: str) -> str:
    """An executable standing in for the variant's Python: prints ``events`` as the worker
    would, then runs ``then`` (e.g. `sleep 600`, a hang)."""
    script = tmp_path / "fake-python"
    lines = "\n".join(f"echo '{json.dumps(e)}'" for e in events)
    script.write_text(f"#!/bin/bash\n{lines}\n{then}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def variant(tmp_path: Path, python: str, run_id: str) -> PlannedVariant:
    return PlannedVariant(name="v", description="", python=python, env_overrides={}, engine_args={}, run_id=run_id)


def test_a_silent_worker_is_stopped_by_the_stall_limit(tmp_path):
    python = fake_interpreter(tmp_path, [{"event": "stage", "stage": "engine_ready"}, progress(3)],
                              "echo 'engine: waiting in a collective' >&2; sleep 600")
    started = time.monotonic()
    outcome = run_worker(variant(tmp_path, python, "stall-unit"), JOB, tmp_path / "v", lambda e: None,
                         stall_timeout_s=2)
    assert time.monotonic() - started < 300, "stopped, not waited out (the worker sleeps 600 s)"
    assert outcome.stalled and outcome.exit_code == 3
    assert "made no progress for 2s" in outcome.error and "gsm8k generate 3/8 requests" in outcome.error
    assert "engine: waiting in a collective" in outcome.error, "the engine log's tail belongs in the error"
    assert wait_gone("stall-unit", 5) == []


def test_the_overall_time_limit_fires_on_a_worker_that_says_nothing(tmp_path):
    # Before the reader thread, a worker that printed nothing blocked the loop that checks --timeout.
    python = fake_interpreter(tmp_path, [], "sleep 600")
    started = time.monotonic()
    outcome = run_worker(variant(tmp_path, python, "timeout-unit"), JOB, tmp_path / "v", lambda e: None, timeout_s=1.5)
    assert time.monotonic() - started < 300, "stopped, not waited out (the worker sleeps 600 s)"
    assert not outcome.stalled and outcome.exit_code == 3 and "exceeded its time limit of 1.5s" in outcome.error
    assert wait_gone("timeout-unit", 5) == []


def test_a_worker_that_finishes_keeps_its_exit_code(tmp_path):
    python = fake_interpreter(tmp_path, [{"event": "error", "message": "task `x` failed: boom"}], "exit 2")
    outcome = run_worker(variant(tmp_path, python, "exit-unit"), JOB, tmp_path / "v", lambda e: None, stall_timeout_s=60)
    assert outcome.exit_code == 2 and outcome.error == "task `x` failed: boom" and not outcome.stalled


def test_a_worker_killed_without_a_word_is_named_by_its_signal(tmp_path):
    python = fake_interpreter(tmp_path, [{"event": "stage", "stage": "engine_ready"}],
                              "echo 'loading 40 GiB of weights' >&2; kill -KILL $$")
    outcome = run_worker(variant(tmp_path, python, "killed-unit"), JOB, tmp_path / "v", lambda e: None)
    assert outcome.exit_code == 128 + 9
    assert outcome.error.startswith("the worker of variant `v` was killed by SIGKILL (the kernel's out-of-memory killer")
    assert "loading 40 GiB of weights" in outcome.error
