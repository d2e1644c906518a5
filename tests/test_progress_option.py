"""`evalpipe --progress jsonl|quiet run` on the fake engine (evalpipe/worker/fakes/engine.py):
stdout is JSON lines ending in the verdict, or the verdict's one line; the terminal's
output is tests/test_runs_on_the_fake_engine.py's."""

from __future__ import annotations

import json
from pathlib import Path

import in_process
import pytest
import yaml

from evalpipe import __version__
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


def _config(tmp: Path, reference: str = "1") -> Path:
    path = tmp / "ab.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"path": "builtin:tiny-gsm"}, "engine": {"max_model_len": 4096, "seed": 0},
        "output": str(tmp / "runs"), "noise_floor": False,
        "variants": {"a": {"env": {FAKE_ENGINE_ENV: reference}}, "b": {"env": {FAKE_ENGINE_ENV: "diverge=2"}}},
        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
    }))
    return path


def _run(tmp: Path, progress: str, run_id: str, reference: str = "1"):
    return in_process.evalpipe("--progress", progress, "run", "gsm8k", "-c", str(_config(tmp, reference)), "--limit", "2",
                               "--run-id", run_id, cwd=tmp, env={FAKE_ENGINE_ENV: "1"})


def test_json_lines_on_stdout_end_in_the_verdict(tmp_path):
    proc = _run(tmp_path, "jsonl", "jsonl")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]  # every line parses
    # the first step names the run (an info may come before it: on an empty cache, reading
    # the engine arguments of the vLLM install, once)
    steps = [e for e in events if e["event"] == "step"]
    assert steps[0]["run_id"] == "jsonl" and {e["event"] for e in events[:events.index(steps[0])]} <= {"info"}
    assert {"step", "verdict"} <= {e["event"] for e in events}
    assert any(e["event"] == "step" and e.get("variant") == "b" for e in events)
    assert events[-1] == {"event": "verdict", "text": "", "status": "DIVERGENT", "exit_code": 1,
                          "where": str(tmp_path / "runs" / "jsonl")}
    assert "DIVERGENT" in proc.stderr, "the summary the terminal shows goes to stderr"


def test_a_failed_run_ends_its_json_lines_with_the_failure(tmp_path):
    proc = _run(tmp_path, "jsonl", "failed", reference="fail_start")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[-1] == {"event": "verdict", "text": "", "status": "FAILED", "exit_code": 3, "where": None}
    assert "error:" in proc.stderr


def test_quiet_prints_the_verdict_alone(tmp_path):
    proc = _run(tmp_path, "quiet", "quiet")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"DIVERGENT (exit 1) {tmp_path / 'runs' / 'quiet'}"]


def test_an_unknown_progress_is_a_user_error(tmp_path):
    proc = in_process.evalpipe("--progress", "xml", "version", cwd=tmp_path)
    assert proc.returncode == 2 and "--progress 'xml' is not one of terminal, quiet, jsonl" in proc.stderr


def test_compare_ends_its_json_lines_with_the_verdict_too(tmp_path):
    assert _run(tmp_path, "quiet", "again").returncode == 1
    run_dir = tmp_path / "runs" / "again"
    proc = in_process.evalpipe("--progress", "jsonl", "compare", str(run_dir), "--output", str(tmp_path / "elsewhere"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[-1] == {"event": "verdict", "text": "", "status": "DIVERGENT", "exit_code": 1, "where": str(tmp_path / "elsewhere")}
    across = in_process.evalpipe("--progress", "quiet", "compare", str(run_dir / "a"), str(run_dir / "b"),
                                 "--output", str(tmp_path / "across"), cwd=tmp_path)
    assert across.returncode == 1 and across.stdout.splitlines() == [f"DIVERGENT (exit 1) {tmp_path / 'across'}"]


@pytest.mark.parametrize("args, code", [
    (["version"], 0),
    (["run", "gsm8k", "--bogus"], 2),  # the option parser's usage error
    (["run"], 2),  # a missing argument
    (["history"], 2),  # a command group without its command: help
    (["nosuch"], 2),
    (["--progress=jsonl", "compare", "/nonexistent/run"], 2),  # the option's other spelling; evalpipe's own refusal
    (["run", "gsm8k", "--help"], 0),
])
def test_every_command_s_stdout_is_json_lines_ending_in_its_one_verdict(tmp_path, args, code):
    """--progress jsonl is a contract for every command, usage errors and help included: what
    a command prints for people (tables, help, usage) goes to stderr."""
    argv = args if args[0].startswith("--progress") else ["--progress", "jsonl", *args]
    proc = in_process.evalpipe(*argv, cwd=tmp_path)
    assert proc.returncode == code, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["event"] for e in events].count("verdict") == 1 and events[-1]["event"] == "verdict", events
    assert events[-1]["exit_code"] == code and events[-1]["status"] == ("OK" if code == 0 else "USER_ERROR"), events
    if args == ["version"]:  # the answer itself is a record
        assert events[0] == {"event": "record", "text": __version__, "version": __version__}
    else:
        assert proc.stderr.strip(), "what people read went to stderr"


def test_the_commands_that_answer_in_tables_give_a_record_per_row(tmp_path):
    """The dry-run plan, `history list` and `history show` as records a machine reads: the
    same facts the tables and lines show people."""
    assert _run(tmp_path, "quiet", "recorded").returncode == 1
    plan = in_process.evalpipe("--progress", "jsonl", "run", "gsm8k", "-c", str(_config(tmp_path)), "--limit", "2",
                               "--dry-run", cwd=tmp_path, env={FAKE_ENGINE_ENV: "1"})
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    records = [e for e in map(json.loads, plan.stdout.splitlines()) if e["event"] == "record"]
    commands = {r["variant"]: r["commands"] for r in records if "commands" in r}
    assert set(commands) == {"a", "b"} and all(commands.values()), records
    assert [r["task"] for r in records if "task" in r] == ["gsm8k_synth_4shot"]
    assert {r["variant"] for r in records if "checks" in r} == {"a", "b"}
    listed = in_process.evalpipe("--progress", "jsonl", "history", "list", "--output", str(tmp_path / "runs"), cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = [e for e in map(json.loads, listed.stdout.splitlines()) if e["event"] == "record"]
    assert [(r["run_id"], r["verdict"]) for r in rows] == [("recorded", "DIVERGENT")]
    shown = in_process.evalpipe("--progress", "quiet", "history", "show", "recorded", "--output", str(tmp_path / "runs"),
                                cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("recorded (run) status ok, verdict DIVERGENT"), shown.stdout

