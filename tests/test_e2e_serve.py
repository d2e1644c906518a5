"""Serve and endpoint modes end to end on vLLM's real OpenAI server (CPU build): no mocks.

- offline vs served, same variant: IDENTICAL (every token id, logprob and top-k entry
  bitwise, generation and teacher forcing). Both sides run one request at a time
  (max_num_seqs 1, concurrency 1): on this CPU build fp32 results depend on the batch
  shape, and a server forms its batches by arrival time (see docs/server-modes.md).
- a server that dies at start fails its variant with the tail of its log; the others
  still run and are compared.
- endpoint mode against a server the test started, with an API key that never reaches
  an artifact.
- Ctrl-C, SIGTERM, evalpipe's own SIGKILL and a server killed mid-run leave no process
  of the run behind; a second Ctrl-C stops at once what the first stops politely.
- the watchdog stops a hung server (the `hang` fault) with its last progress and the
  server log's tail; the other variants are still compared (an offline worker's hang:
  tests/test_runs_on_the_fake_engine.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import processes_of, wait_gone

from evalpipe.config.run_config import DEFAULT_CONFIG
from evalpipe.pipeline.plan import RUN_ID_ENV

pytestmark = pytest.mark.slow

LIMIT = 8
SEQUENTIAL = {"max_num_seqs": 1}
HANG = {"EVALPIPE_LAYOUT": "legacy", "EVALPIPE_LAYOUT_FAULT": "hang"}
STALL = 30


def write_config(tmp: Path, name: str, **overrides) -> Path:
    """The default config with ``overrides`` merged in (the runs pick their variants with --variants)."""
    cfg = {"extends": str(DEFAULT_CONFIG), "output": str(tmp / "runs"), "noise_floor": False, **overrides}
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
            # The server refuses a window beyond the model's and exits while starting.
            "dead": {"env": legacy, "launch": {"mode": "serve"}, "engine": {"max_model_len": 99999}},
            # The server refuses top-5 logprobs beyond its --max-logprobs: every request fails.
            "refused": {"env": legacy, "launch": {"mode": "serve"}, "engine": {"max_logprobs": 2}},
            # A collective that never returns, behind a server: the watchdog stops it after
            # STALL seconds without a finished request (and the server with it). An offline
            # worker's hang is the fake engine's: tests/test_runs_on_the_fake_engine.py.
            "hung": {"env": HANG, "launch": {"mode": "serve", "stall_timeout_s": STALL, "stop_grace_s": 5}},
        },
    )
    proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "srv",
                    "--variants", "offline,served,dead,refused,hung", cwd=tmp)
    return {"proc": proc, "dir": tmp / "runs" / "srv"}


def test_offline_and_served_are_identical(offline_vs_served):
    run_dir = offline_vs_served["dir"]
    served = comparison(run_dir, "served")
    assert served["status"] == "IDENTICAL", json.dumps(served, indent=1)[:3000]
    text = (run_dir / "report.md").read_text()
    assert "served" in text and "IDENTICAL" in text
    # the served variant really went through a server: its log, its --config file, what it said about itself
    vdir = run_dir / "served"
    assert "Uvicorn running" in (vdir / "engine.log").read_text() or "Application startup complete" in (vdir / "engine.log").read_text()
    args = yaml.safe_load((vdir / "server-args.yaml").read_text())
    assert args["max-num-seqs"] == 1 and args["host"] == "127.0.0.1" and args["hf-overrides"]["layout_tp"] == 4
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["launch_mode"] == "serve" and manifest["engine"]["kind"] == "http"
    assert manifest["engine"]["tokenized_by"] == "local"  # checked against the server's /tokenize
    assert manifest["engine"]["server"]["version"]["version"]
    assert (vdir / "teacher.parquet").is_file() and (vdir / "tokens.parquet").is_file()


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
    # the engine core's own switches and collectives (legacy's virtual gathers), read where they happened
    # every finished pass made its 3 gathers; a pass the shutdown cut short made at most 2 more
    partial = core["calls"]["virtual:all_gather"] - 3 * model["forwards"]
    assert core["switches"]["max_num_seqs"] == 1 and partial in range(0, 3 * model["running_forwards"] + 1), (partial, model)
    (offline,) = [p for p in records(run_dir, "offline") if p["models"]]
    assert offline["role"] == "evalpipe_worker", "offline, the engine runs inside the worker"
    # the manifest carries the summary, and probes.json is a verified artifact
    manifest = json.loads((run_dir / "served" / "manifest.json").read_text())
    assert manifest["probes"]["processes"] == {"api_server": 1, "engine_core": 1, "evalpipe_worker": 1}
    assert "probes.json" in manifest["artifacts"]
    # a variant that stopped half-way still says what its processes built
    hung = json.loads((run_dir / "hung" / "probes.json").read_text())
    assert any(p["models"] for p in hung["processes"]), "the hung server's engine core recorded its model"


def test_a_server_that_dies_fails_its_variant_and_the_others_are_compared(offline_vs_served):
    proc, run_dir = offline_vs_served["proc"], offline_vs_served["dir"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "variants dead, refused, hung failed" in err
    assert "the server exited with code" in err and "engine.log" in err
    assert "Traceback" not in proc.stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_variants"] == ["dead", "refused", "hung"]
    assert info["verdict"] == "IDENTICAL"  # offline vs served, written before the run was marked failed
    assert "99999" in (run_dir / "dead" / "engine.log").read_text()  # the server's own words, kept
    assert wait_gone("srv") == []


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


def test_a_refused_request_fails_its_variant_naming_the_document(offline_vs_served):
    info = json.loads((offline_vs_served["dir"] / "run.json").read_text())
    error = info["variant_status"]["refused"]["error"]
    assert "gsm8k_synth_4shot" in error and "doc " in error and "the server answered 400" in error, error
    assert not (offline_vs_served["dir"] / "refused" / "samples.parquet").exists()  # no answers scored as wrong


def test_endpoint_mode_attaches_to_a_running_server_and_keeps_its_key_out_of_artifacts(tmp_path, builtin_model_dir):
    from evalpipe.config.run_config import load_config
    from evalpipe.pipeline.plan import make_plan

    key = "sk-evalpipe-test-7f3a91"
    from evalpipe.execution.serve import free_port

    port = free_port("127.0.0.1")
    plan = make_plan(load_config(write_config(tmp_path, "base", engine=SEQUENTIAL)), "base", "gsm8k", variants="legacy",
                     noise_floor=False)
    legacy = plan.variants[0]
    from evalpipe.execution import serve

    args_file = tmp_path / "server.yaml"
    serve.write_server_args(args_file, serve.server_args({**legacy.engine_args, "model": str(builtin_model_dir)},
                                                        legacy.launch, port))
    env = {**legacy.process_env(), "VLLM_API_KEY": key, RUN_ID_ENV: "endpoint-server"}
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(serve.server_command(sys.executable, legacy.launch, args_file), env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        path = write_config(
            tmp_path, "endpoint", engine=SEQUENTIAL, reference="offline",
            variants={
                "offline": {"env": {"EVALPIPE_LAYOUT": "legacy"}},
                "ep": {"launch": {"mode": "endpoint", "url": f"http://127.0.0.1:{port}", "api_key_env": "EP_KEY",
                                  "concurrency": 1, "ready_timeout_s": 300}},
            },
        )
        proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "ep", "--variants", "offline,ep", cwd=tmp_path,
                        env={**os.environ, "EP_KEY": key})
        # a server evalpipe did not start runs code the probes cannot see: nothing is proven
        # about its path, whatever the outputs say, and the verdict says so plainly
        assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
        run_dir = tmp_path / "runs" / "ep"
        ep = comparison(run_dir, "ep")
        assert ep["status"] == "INCONCLUSIVE" and ep["outputs_status"] == "IDENTICAL", ep["reasons"]
        assert "path not verifiable in endpoint mode" in ep["reasons"][0]
        assert "path not verifiable in endpoint mode" in (run_dir / "report.md").read_text()
        assert "path not verifiable in endpoint mode" in " ".join(proc.stdout.split())
        manifest = json.loads((run_dir / "ep" / "manifest.json").read_text())
        assert manifest["launch_mode"] == "endpoint"
        assert [m["id"] for m in manifest["engine"]["server"]["models"]] == [str(builtin_model_dir)]
        for f in run_dir.rglob("*"):
            if f.is_file():
                assert key.encode() not in f.read_bytes(), f"the API key leaked into {f}"
        assert server.poll() is None, "evalpipe must never stop a server it did not start"
    finally:
        serve.stop_group(server, 30)
        log.close()


def start_served_run(tmp: Path, run_id: str, *, served_first: bool = False, variants: dict | None = None,
                     extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
    """An offline and a served variant (by default); ``served_first``: the served one is
    the reference and runs first, so its server and worker are up within a minute."""
    variants = variants or {
        "offline": {"env": {"EVALPIPE_LAYOUT": "legacy"}},
        "served": {"env": {"EVALPIPE_LAYOUT": "sp"}, "launch": {"mode": "serve"}},
    }
    served = {n for n, v in variants.items() if v.get("launch", {}).get("mode") == "serve"}
    order = sorted(variants, key=lambda n: (n in served) != served_first)
    path = write_config(tmp, run_id, reference=order[0], variants=variants)
    proc = subprocess.Popen([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", "64",
                             "--run-id", run_id, "--variants", ",".join(order), *extra], cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, tmp / "runs" / run_id


def wait_for_served_generation(proc: subprocess.Popen, run_dir: Path, timeout: float = 600) -> None:
    """Until the served variant's client reports generation progress."""
    deadline = time.time() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if "served · gsm8k_synth_4shot · generate" in line:
            return
        assert time.time() < deadline, "the served variant never started generating"
    raise AssertionError(f"evalpipe ended before the served variant generated: {proc.wait()} {proc.stderr.read()[-2000:]}")


def test_ctrl_c_stops_every_process_the_run_started(tmp_path):
    # SIGTERM, the polite stop a CI cancel sends, is the first signal of the next test
    sig, code = signal.SIGINT, 130
    run_id = "ctrl-c"
    proc, run_dir = start_served_run(tmp_path, run_id, served_first=True)
    try:
        wait_for_served_generation(proc, run_dir)
        assert len(processes_of(run_id)) >= 2, "expected the served variant's server and worker to be running"
        proc.send_signal(sig)  # what Ctrl-C (SIGINT) or a CI cancel (SIGTERM) sends to evalpipe
        assert proc.wait(timeout=120) == code
        assert wait_gone(run_id, 5) == [], "processes of the run survived the interrupt"
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "interrupted", info.get("status")
        assert info["interrupted_by"] == ("SIGINT" if sig == signal.SIGINT else "SIGTERM")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_evalpipe_killed_with_sigkill_takes_its_workers_and_servers_along_and_the_run_resumes(tmp_path):
    """kill -9 leaves evalpipe no chance to clean up: the guards notice its end (their
    stdin pipe closes) and stop the server's and the worker's process groups. The same
    command again continues the run: the answers the server had given (the variant's
    request journal) are not asked again."""
    from evalpipe.documents.journal import JOURNAL_FILE
    from evalpipe.worker.journal import RequestJournal

    run_id = "kill9"
    served = {"served": {"env": {"EVALPIPE_LAYOUT": "sp"}, "launch": {"mode": "serve"}}}
    proc, run_dir = start_served_run(tmp_path, run_id, variants=served)
    try:
        wait_for_served_generation(proc, run_dir)
        assert len(processes_of(run_id)) >= 4, "expected evalpipe, the server (and its engine core) and the worker"
        os.kill(proc.pid, signal.SIGKILL)  # evalpipe alone, not its group
        proc.wait()
        started = time.monotonic()
        assert wait_gone(run_id, 60) == [], "processes outlived evalpipe's SIGKILL"
        print(f"all processes of the run gone {time.monotonic() - started:.1f}s after evalpipe's SIGKILL")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    answered = RequestJournal(run_dir / "served" / JOURNAL_FILE).loaded
    assert answered >= 1, "the journal should hold the answers that had arrived"
    again, _ = start_served_run(tmp_path, run_id, variants=served)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, out[-2000:] + err[-2000:]
    assert "continuing the interrupted run; no variant had finished" in " ".join(out.split())
    manifest = json.loads((run_dir / "served" / "manifest.json").read_text())
    journal = manifest["engine"]["journal"]
    assert journal["answers_found"] == answered and journal["answers_reused"] == answered, journal
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    print(f"continued: {answered} of the served variant's answers came from its journal")


def test_sigterm_stops_politely_and_a_second_signal_at_once(tmp_path):
    """A server behind a launcher that takes no SIGTERM (as `docker exec` or an ssh
    without -tt forwards none) and a long stop_grace_s: SIGTERM (a CI cancel) stops the
    run in order and waits for it; a Ctrl-C after that kills every group at once."""
    run_id = "twice"
    stubborn = ["bash", "-c", "trap '' TERM; \"$@\"; sleep 600", "stubborn-launcher"]
    served = {"served": {"env": {"EVALPIPE_LAYOUT": "sp"},
                         "launch": {"mode": "serve", "launcher": stubborn, "stop_grace_s": 600}}}
    proc, run_dir = start_served_run(tmp_path, run_id, variants=served)
    try:
        wait_for_served_generation(proc, run_dir)
        proc.send_signal(signal.SIGTERM)
        time.sleep(5)
        assert proc.poll() is None, "SIGTERM should still be waiting for the stubborn launcher (stop_grace_s 600)"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 143  # the run ends as the first signal asked
        assert wait_gone(run_id, 5) == [], "processes of the run survived the second signal"
        assert time.monotonic() - started < 15
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGTERM"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_server_killed_mid_run_fails_its_variant_with_its_log(tmp_path):
    run_id = "killed"
    proc, run_dir = start_served_run(tmp_path, run_id)
    try:
        wait_for_served_generation(proc, run_dir)
        servers = [p for p in processes_of(run_id)
                   if b"api_server" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert servers, "the served variant's server process was not found"
        os.killpg(os.getpgid(servers[0]), signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 3, out[-2000:] + err[-2000:]
        flat = " ".join(err.split())
        assert "variant served failed" in flat and "the server exited with code -9" in flat
        info = json.loads((run_dir / "run.json").read_text())
        assert info["failed_variants"] == ["served"]
        assert wait_gone(run_id, 30) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
