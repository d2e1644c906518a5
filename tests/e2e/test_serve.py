"""Serve mode end to end on vLLM's real OpenAI server (CPU build): what only vLLM shows.
The lifecycle around a server (sharing it, a server that dies at start or mid-run, a
refused request, endpoint mode and its API key, Ctrl-C, SIGTERM, evalpipe's own SIGKILL
and resume) is tested on the fake server in tests/execution/test_serve.py.

- offline vs served, same variant: IDENTICAL (every token id, logprob and top-k entry
  bitwise, generation and teacher forcing). Both sides run one request at a time
  (max_num_seqs 1, concurrency 1): on this CPU build fp32 results depend on the batch
  shape, and a server forms its batches by arrival time (see docs/server-modes.md).
- the probes reach the server's API process and engine core.
- the watchdog stops a server whose engine core hangs in a collective (the `hang`
  fault) with its last progress and the server log's tail; the other variants are still
  compared, and no process of the run (engine cores included) outlives it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from processes import wait_gone

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 3.5  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 8
SEQUENTIAL = {"max_num_seqs": 1}
HANG = {"EVALPIPE_LAYOUT": "legacy", "EVALPIPE_LAYOUT_FAULT": "hang"}
STALL = 30


def write_config(tmp: Path, name: str, **overrides) -> Path:
    """The default config with ``overrides`` merged in (the runs pick their variants with --variants)."""
    cfg = {"extends": str(default_config()), "output": str(tmp / "runs"), "noise_floor": False, **overrides}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def evalpipe(*args: str, cwd: Path, env: dict | None = None, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalpipe", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def comparison(run_dir: Path, variant: str) -> dict:
    data = json.loads((run_dir / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == variant)


@pytest.fixture(scope="module")
def offline_vs_served(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("serve")
    legacy = {"EVALPIPE_LAYOUT": "legacy"}
    path = write_config(
        tmp, "served", engine=SEQUENTIAL, reference="offline",
        variants={
            "offline": {"env": legacy},
            # the same code behind a server: an A/A pair by declaration (else the same code on
            # both sides with IDENTICAL outputs is INCONCLUSIVE: nothing was compared)
            "served": {"env": legacy, "launch": {"mode": "serve", "concurrency": 1}, "expect": {"same_path": True}},
            # A collective that never returns, behind a server: the watchdog stops it after
            # STALL seconds without a finished request (and the server with it). An offline
            # worker's hang is the fake engine's: tests/pipeline/test_runs_on_the_fake_engine.py.
            "hung": {"env": HANG, "launch": {"mode": "serve", "stall_timeout_s": STALL, "stop_grace_s": 5}},
        },
    )
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "srv",
                    "--variants", "offline,served,hung", cwd=tmp)
    return {"proc": proc, "dir": tmp / "runs" / "srv"}


def test_offline_and_served_are_identical(offline_vs_served):
    run_dir = offline_vs_served["dir"]
    served = comparison(run_dir, "served")
    assert served["status"] == "IDENTICAL", json.dumps(served, indent=1)[:3000]
    text = (run_dir / "report.md").read_text()
    assert "served" in text and "IDENTICAL" in text
    # the served variant really went through a server: its log, its --config file, what it said about itself
    vdir = run_dir / "served"
    log = (vdir / "engine.log").read_text(errors="replace")
    assert "Uvicorn running" in log or "Application startup complete" in log
    # the API server, like the workers, forked from the run's pre-imported interpreter
    # (evalpipe/execution/preimport.py), not refused back into a new one
    assert "forked from a pre-imported interpreter" in log
    args = yaml.safe_load((vdir / "server-args.yaml").read_text())
    assert args["max-num-seqs"] == 1 and args["host"] == "127.0.0.1" and args["hf-overrides"]["layout_tp"] == 4
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["launch_mode"] == "serve" and manifest["engine"]["kind"] == "http"
    assert manifest["engine"]["tokenized_by"] == "local"  # checked against the server's /tokenize
    assert manifest["engine"]["server"]["version"]["version"]
    assert (vdir / "teacher.parquet").is_file() and (vdir / "tokens.parquet").is_file()


def test_vllm_s_own_counters_count_the_same_work_offline_and_served(offline_vs_served):
    """vLLM's counters of the scheduler's paths over the task, read from the offline engine's
    registry and from the server's /metrics: the same prompts one at a time, the same answers,
    so the same counts (prefix-cache hits included: the same cache sees the same requests).
    The steps alone may differ by a few: a server's requests arrive between its steps."""
    run_dir = offline_vs_served["dir"]
    task = "gsm8k_synth_4shot"
    offline, served = (json.loads((run_dir / v / "manifest.json").read_text())["engine_counters"][task]
                       for v in ("offline", "served"))
    steps = {"offline": offline.pop("engine_steps"), "served": served.pop("engine_steps")}
    shapes = {"offline": offline.pop("steps_by_tokens"), "served": served.pop("steps_by_tokens")}
    assert offline == served, (offline, served)
    assert offline["prompt_tokens"] == offline["prefix_cache_queries"] > 0 and offline["preemptions"] == 0, offline
    # one request at a time: a step per generated token (its prompt's step makes the first),
    # every later one a single request decoding alone (the one-token bucket)
    generated = offline["generation_tokens"]
    assert generated >= LIMIT and all(generated <= n <= generated + LIMIT for n in steps.values()), (steps, offline)
    assert all(s["1"] >= generated - LIMIT and sum(s.values()) == steps[v] for v, s in shapes.items()), (shapes, steps)
    assert "spec_decode_draft_tokens" not in offline, "no speculative decoding configured: the counter is not exposed"


def records(run_dir: Path, variant: str) -> list[dict]:
    return json.loads((run_dir / variant / "probes.json").read_text())["processes"]


def test_every_process_of_a_served_engine_recorded_what_it_ran(offline_vs_served):
    """The probes reach every process a variant starts: the offline worker's in-process
    engine, and the server's API process and engine core (which built the model)."""
    run_dir = offline_vs_served["dir"]
    served = comparison(run_dir, "served")
    assert served["paths"]["status"] == "verified", served["paths"]
    roles = sorted(p["role"] for p in records(run_dir, "served"))
    assert roles == ["api_server", "engine_core", "evalpipe_worker"], roles
    (core,) = [p for p in records(run_dir, "served") if p["role"] == "engine_core"]
    (model,) = core["models"]
    assert model["model_class"] == "evalpipe.lab.layout.model.LayoutForCausalLM"
    assert model["layers"] == {"evalpipe.lab.layout.model.LayoutDecoderLayer": 3}
    assert model["forwards"] > 0 and model["per_forward"]["all_gather"] == {"3": model["forwards"]}
    # the batch shapes it ran: at max_num_seqs 1 every decode step is one request alone (1 token),
    # and each of the LIMIT prompts is prefilled in passes of more
    bins = model["tokens_per_forward"]
    assert sum(bins.values()) == model["forwards"] and bins["1"] > 0, bins
    assert sum(n for size, n in bins.items() if size != "1") >= LIMIT, bins
    # the engine core's own switches and collectives (legacy's virtual gathers), read where they happened
    # every finished pass made its 3 gathers; a pass the shutdown cut short made at most 2 more
    partial = core["calls"]["virtual:all_gather"] - 3 * model["forwards"]
    assert core["switches"]["max_num_seqs"] == 1 and partial in range(0, 3 * model["running_forwards"] + 1), (partial, model)
    (offline,) = [p for p in records(run_dir, "offline") if p["models"]]
    assert offline["role"] == "evalpipe_worker", "offline, the engine runs inside the worker"
    # the manifest carries the summary, and probes.json is a verified artifact
    manifest = json.loads((run_dir / "served" / "manifest.json").read_text())
    assert manifest["probes"]["processes"] == {"api_server": 1, "engine_core": 1, "evalpipe_worker": 1}
    assert manifest["probes"]["tokens_per_forward"] == bins, "the summary holds the core's passes, the only builder"
    assert "probes.json" in manifest["artifacts"]
    # a variant that stopped half-way still says what its processes built
    hung = json.loads((run_dir / "hung" / "probes.json").read_text())
    assert any(p["models"] for p in hung["processes"]), "the hung server's engine core recorded its model"


def test_a_hung_server_fails_its_variant_and_leaves_no_process_behind(offline_vs_served):
    proc, run_dir = offline_vs_served["proc"], offline_vs_served["dir"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "variant hung failed" in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_variants"] == ["hung"]
    assert info["verdict"] == "IDENTICAL"  # offline vs served, written before the run was marked failed
    assert wait_gone("srv") == [], "a server's engine core outlived the run"


@pytest.mark.parametrize("name", ["hung"])
def test_the_watchdog_stops_a_hung_engine_with_its_last_progress_and_log(offline_vs_served, name):
    run_dir = offline_vs_served["dir"]
    status = json.loads((run_dir / "run.json").read_text())["variant_status"][name]
    error = status["error"]
    assert status["stalled"] and status["exit_code"] == 3, status
    assert error.startswith(f"variant `{name}` made no progress for {STALL}s (the stall limit; its last progress: "), error
    # the engine's log names the hang; in serve mode that is the server's log, not the client's
    log = "engine.log"
    assert f"last lines of {run_dir / name / log}" in error and "waits forever in a collective" in error, error
    # stopped after the limit, not after an overall time-out: engine start + STALL + a little
    assert status["seconds"] < 240, status
    manifest = json.loads((run_dir / name / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "made no progress" in manifest["error"]
