"""Serve mode's lifecycle on the fake server (evalpipe/worker/fakes/server.py): evalpipe
starts it as it starts `vllm serve` (launch.command, a --config file, host and port),
waits for /health, talks HTTP, shares it or not, stops it. Without vLLM, in seconds.
What only vLLM's server shows (served outputs equal offline outputs on the real engine,
the probes in its API process and engine core, its own /health, TP/DP) stays in the slow
tests/e2e/test_serve.py.

One run serves most of the module (`served` is the reference, so its A/A noise floor
reuses its server):
  served       the reference, on a server of its own
  served~aa    the A/A run, on served's server (noise_floor.reuse_server)
  offline      the fake engine in its worker      -> IDENTICAL to the served one
  own          a second server of its own          -> IDENTICAL
  dead         its server fails to start           -> failed with the server's log
  refused      its server refuses top-5 logprobs   -> failed, naming the document
  hung         its server stops answering          -> stopped by the watchdog
  died         its server SIGKILLs itself mid-run  -> failed, naming the server's exit
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from processes import processes_of, wait_gone

from evalpipe.config.run_config import aa_variant_name
from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.documents.worker_job import ServerJob
from evalpipe.execution import serve
from evalpipe.execution.preimport import Preimport
from evalpipe.pipeline.plan import RUN_ID_ENV
from evalpipe.process_table import group_alive
from evalpipe.rundir import artifacts
from evalpipe.worker.engines import GenRequest, ScoreRequest
from evalpipe.worker.fakes import server as fake_server
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV, Behaviour, FakeEngine
from evalpipe.worker.http_engine import HttpEngine
from evalpipe.worker.journal import RequestJournal

LIMIT = 4
TOPK = 5
# The hung server's stall limit. The worker starts beside its server and its first request
# waits for it, saying so every 10 s (the heartbeat that keeps the watchdog quiet while a
# server starts); a limit under that fired on a loaded machine before the server had hung.
STALL = 15
TASK = "gsm8k_synth_4shot"
FAKE_SERVER = [sys.executable, "-m", "evalpipe.worker.fakes.server"]
AA = aa_variant_name("served")
# A tokenizer this machine lacks: the worker leaves tokenizing to the server at once instead
# of loading the real model's tokenizer (seconds, with vLLM's import) to find that it
# disagrees with the fake's bytes, as the other served variants do.
SERVER_TOKENIZES = {"tokenizer": "no-local-tokenizer"}


def fake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, FAKE_ENGINE_ENV: "1", **extra}


def served(behaviour: str | None = None, **launch) -> dict:
    """A variant on a fake server of its own (``behaviour``: the server's EVALPIPE_FAKE_ENGINE)."""
    variant: dict = {"launch": {"mode": "serve", "command": FAKE_SERVER, **launch}}
    if behaviour:
        variant["env"] = {FAKE_ENGINE_ENV: behaviour}
    return variant


def write_config(tmp: Path, name: str, variants: dict, reference: str, **overrides) -> Path:
    cfg = {
        "model": {"path": "builtin:tiny-gsm"},
        "engine": {"max_model_len": 4096, "seed": 0},
        "output": str(tmp / "runs"),
        "noise_floor": False,
        # the fake's tokens are bytes: no prompt position capture (see test_runs_on_the_fake_engine.py)
        "capture": {"topk": TOPK, "teacher_forcing": True, "prompt_positions": {"min_prompt_tokens": 1 << 16}},
        "reference": reference,
        "variants": variants,
        "tasks": {"gsm8k": [{"task": TASK, "num_fewshot": 4}]},
        **overrides,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def comparison(run_dir: Path, name: str) -> dict:
    data = json.loads((run_dir / "compare.json").read_text())
    return next(c for c in data["comparisons"] if c["variant"] == name)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fake-serve")
    path = write_config(tmp, "served", reference="served", noise_floor={"reuse_server": True}, variants={
        "served": served(),
        # the same fake model on both sides: A/A pairs by declaration (else IDENTICAL outputs prove nothing)
        "offline": {"expect": {"same_path": True}},
        "own": {**served(), "engine": SERVER_TOKENIZES, "expect": {"same_path": True}},
        "dead": served("fail_start"),
        # the server refuses top-5 logprobs, as vLLM's does
        "refused": {**served(), "engine": {"max_logprobs": 2, **SERVER_TOKENIZES}},
        "hung": {**served("hang_after=2", stall_timeout_s=STALL, stop_grace_s=5), "engine": SERVER_TOKENIZES},
        "died": {**served("exit_after=2,signal=KILL"), "engine": SERVER_TOKENIZES},
    })
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", str(LIMIT),
                           "--run-id", "fake-srv"], cwd=tmp, capture_output=True, text=True, timeout=600, env=fake_env())
    return {"proc": proc, "dir": tmp / "runs" / "fake-srv"}


FAILED = ["dead", "died", "hung", "refused"]


def test_served_outputs_equal_offline_ones_and_the_server_was_a_fake(run):
    run_dir = run["dir"]
    for name in ("offline", "own"):
        result = comparison(run_dir, name)
        assert result["status"] == "IDENTICAL", (name, result["reasons"])
        assert "4/4 samples bitwise identical" in result["reasons"][0], result["reasons"]
    vdir = run_dir / "served"
    log = (vdir / "engine.log").read_text()
    assert "evalpipe.worker.fakes.server --config" in log and "FAKE SERVER" in log
    args = yaml.safe_load((vdir / "server-args.yaml").read_text())
    assert args["host"] == "127.0.0.1" and args["max-model-len"] == 4096 and args["port"] > 0
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["launch_mode"] == "serve" and manifest["engine"]["kind"] == "http"
    assert manifest["engine"]["server"]["version"] == fake_server.VERSION
    # the worker's tokenizer (the real model's) disagreed with the fake's bytes: the server tokenized
    assert manifest["engine"]["tokenized_by"] == "server (the local tokenizer disagreed with it)"
    own = json.loads((run_dir / "own" / "manifest.json").read_text())["engine"]
    assert own["tokenized_by"] == "server"  # no tokenizer files here (SERVER_TOKENIZES)
    for name in ("served", "own", AA):
        assert (run_dir / name / "teacher.parquet").is_file() and (run_dir / name / "tokens.parquet").is_file()
    offline = artifacts.read_table(artifacts.VariantDir(run_dir / "offline").tokens).to_pylist()
    assert offline == artifacts.read_table(artifacts.VariantDir(vdir).tokens).to_pylist(), "token for token"


def test_the_aa_run_shares_the_references_server_and_a_variant_with_its_own_starts_one(run):
    run_dir, out = run["dir"], run["proc"].stdout
    assert "reusing served's server at http://127.0.0.1:" in " ".join(out.split())
    assert not (run_dir / AA / "server-args.yaml").exists() and not (run_dir / AA / "engine.log").exists()
    ports = {name: yaml.safe_load((run_dir / name / "server-args.yaml").read_text())["port"] for name in ("served", "own")}
    assert ports["served"] != ports["own"]
    noise_floor = json.loads((run_dir / "compare.json").read_text())["noise_floor"]
    assert noise_floor["variant"] == AA and noise_floor["status"] == "IDENTICAL", noise_floor["reasons"]
    aa_url = json.loads((run_dir / AA / "manifest.json").read_text())["engine"]["server"]["url"]
    assert aa_url == f"http://127.0.0.1:{ports['served']}"


def test_failed_servers_fail_their_variants_and_the_others_are_compared(run):
    proc, run_dir = run["proc"], run["dir"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())
    assert f"variants {', '.join(FAILED)} failed" in err and "the other variants were compared: IDENTICAL" in err
    assert "the server exited with code" in err and "engine.log" in err
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["failed_variants"] == FAILED and info["verdict"] == "IDENTICAL"
    assert "fail_start" in (run_dir / "dead" / "engine.log").read_text()  # the server's own words, kept
    assert wait_gone("fake-srv", 10) == [], "a server or worker outlived the run"


def test_a_server_that_dies_at_start_fails_its_variant_with_its_log(run):
    status = json.loads((run["dir"] / "run.json").read_text())["variant_status"]["dead"]
    assert status["error"].startswith("the server exited with code 1 before the variant finished"), status
    assert f"last lines of {run['dir'] / 'dead' / 'engine.log'}" in status["error"]


def test_a_server_killed_mid_run_fails_its_variant_naming_the_server(run):
    status = json.loads((run["dir"] / "run.json").read_text())["variant_status"]["died"]
    error = status["error"]
    # the server process alone was killed: the guard around it reports 128 + SIGKILL
    assert error.startswith("the server exited with code 137 before the variant finished"), status
    assert "fake engine: ending the process after 2 requests" in error, "the server log's tail belongs in the error"
    manifest = json.loads((run["dir"] / "died" / "manifest.json").read_text())
    assert manifest["status"] == "failed"


def test_a_refused_request_fails_its_variant_naming_the_document(run):
    error = json.loads((run["dir"] / "run.json").read_text())["variant_status"]["refused"]["error"]
    assert f"{TASK} doc " in error and "the server answered 400" in error, error
    assert not (run["dir"] / "refused" / "samples.parquet").exists()  # no answers scored as wrong


def test_the_watchdog_stops_a_hung_server_with_its_last_progress_and_log(run):
    run_dir = run["dir"]
    status = json.loads((run_dir / "run.json").read_text())["variant_status"]["hung"]
    error = status["error"]
    assert status["stalled"] and status["exit_code"] == 3, status
    assert error.startswith(f"variant `hung` made no progress for {STALL}s (the stall limit; its last progress: "), error
    # the server's log, not the client's: it names the hang
    assert f"last lines of {run_dir / 'hung' / 'engine.log'}" in error and "hanging after 2 requests" in error, error
    assert status["seconds"] < 60, status
    manifest = json.loads((run_dir / "hung" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "made no progress" in manifest["error"]


def test_the_fake_server_answers_as_the_fake_engine_offline(tmp_path):
    """The HTTP engine on the fake server equals the fake engine in process, token for
    token: generation (stop strings, top-k), scoring (chosen positions, off-list tokens),
    a diverging behaviour, tokenizing, the EOS id."""
    port = serve.free_port("127.0.0.1")
    config = tmp_path / "server.yaml"
    serve.write_server_args(config, {"model": "m", "max-model-len": 4096, "host": "127.0.0.1", "port": port})
    server = subprocess.Popen([*FAKE_SERVER, "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=fake_env(**{FAKE_ENGINE_ENV: "diverge=3"}), start_new_session=True)
    try:
        http = HttpEngine(ServerJob(url=f"http://127.0.0.1:{port}", ready_timeout_s=30))
        offline = FakeEngine({}, Behaviour(diverge_at=3))
        prompt = "Question: 3 apples and 4 pears?\nAnswer:"
        ids = http.encode_many([prompt])[0]
        assert ids == offline.encode(prompt) and http.eos_token_id == offline.eos_token_id
        requests = [GenRequest(ids, 64, ["Question:"]), GenRequest(ids + [32], 30), GenRequest(ids, 5)]
        generated = http.generate(requests, TOPK)
        assert generated == offline.generate(requests, TOPK)
        other = [t + 1 if t < 255 else 97 for t in generated[0].token_ids]
        scored = [ScoreRequest(ids + generated[0].token_ids, start=len(ids)),
                  ScoreRequest(ids + other, start=len(ids), positions=[5, len(ids), len(ids) + 2])]
        assert http.score(scored, topk=TOPK) == offline.score(scored, topk=TOPK)
        assert http.decode(generated[0].token_ids) == offline.decode(generated[0].token_ids)
        assert http.info().server.version == fake_server.VERSION
        http.close()
    finally:
        serve.stop_group(server, 10)


def test_the_fake_server_refuses_to_start_without_its_variable(tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({"model": "m", "host": "127.0.0.1", "port": 1}))
    env = {k: v for k, v in os.environ.items() if k != FAKE_ENGINE_ENV}
    proc = subprocess.run([*FAKE_SERVER, "--config", str(config)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and f"starts only with {FAKE_ENGINE_ENV} set" in proc.stderr, proc.stderr


def test_endpoint_mode_attaches_to_a_running_server_and_keeps_its_key_out_of_artifacts(tmp_path):
    key = "sk-evalpipe-test-7f3a91"
    port = serve.free_port("127.0.0.1")
    args_file = tmp_path / "server.yaml"
    serve.write_server_args(args_file, {"model": "tiny", "host": "127.0.0.1", "port": port})
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen([*FAKE_SERVER, "--config", str(args_file)], stdout=log, stderr=subprocess.STDOUT,
                              env=fake_env(VLLM_API_KEY=key, **{RUN_ID_ENV: "endpoint-server"}), start_new_session=True)
    try:
        path = write_config(tmp_path, "endpoint", reference="offline", variants={
            "offline": {},
            "ep": {"launch": {"mode": "endpoint", "url": f"http://127.0.0.1:{port}", "api_key_env": "EP_KEY",
                              "ready_timeout_s": 60}, "engine": SERVER_TOKENIZES},
        })
        proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", str(LIMIT),
                               "--run-id", "ep"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env=fake_env(EP_KEY=key))
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
        assert [m["id"] for m in manifest["engine"]["server"]["models"]] == ["tiny"]
        for f in run_dir.rglob("*"):
            if f.is_file():
                assert key.encode() not in f.read_bytes(), f"the API key leaked into {f}"
        assert server.poll() is None, "evalpipe must never stop a server it did not start"
    finally:
        serve.stop_group(server, 10)
        log.close()


# ---------------------------------------------------------------- signals and kills mid-run

def start_served_run(tmp: Path, run_id: str, behaviour: str = "delay=0.3", limit: int = LIMIT, **launch) -> tuple[subprocess.Popen, Path]:
    """One served variant whose server answers slowly (``behaviour``), so it is caught mid-generation."""
    path = write_config(tmp, run_id, reference="served", variants={"served": {**served(behaviour, **launch), "engine": SERVER_TOKENIZES}})
    proc = subprocess.Popen([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", str(limit),
                             "--run-id", run_id], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=fake_env())
    return proc, tmp / "runs" / run_id


def wait_for_served_generation(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the served variant's client reports an answer (its first count, 0/n, only says the
    requests were sent)."""
    deadline = time.time() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.search(rf"served · {TASK} · generate: [1-9]", line):
            return
        assert time.time() < deadline, "the served variant never started generating"
    assert proc.stderr is not None
    raise AssertionError(f"evalpipe ended before the served variant generated: {proc.wait()} {proc.stderr.read()[-2000:]}")


def test_ctrl_c_stops_every_process_the_run_started(tmp_path):
    run_id = "ctrl-c-served"
    proc, run_dir = start_served_run(tmp_path, run_id)
    try:
        wait_for_served_generation(proc)
        assert len(processes_of(run_id)) >= 2, "expected the served variant's server and worker to be running"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to evalpipe
        assert proc.wait(timeout=60) == 130
        assert wait_gone(run_id, 5) == [], "processes of the run survived the interrupt"
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGINT"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_stops_politely_and_a_second_signal_at_once(tmp_path):
    """A server behind a launcher that takes no SIGTERM (as `docker exec` or an ssh
    without -tt forwards none) and a long stop_grace_s: SIGTERM (a CI cancel) stops the
    run in order and waits for it; a Ctrl-C after that kills every group at once."""
    run_id = "twice"
    stubborn = ["bash", "-c", "trap '' TERM; \"$@\"; sleep 600", "stubborn-launcher"]
    proc, run_dir = start_served_run(tmp_path, run_id, launcher=stubborn, stop_grace_s=600)
    try:
        wait_for_served_generation(proc)
        proc.send_signal(signal.SIGTERM)
        time.sleep(3)
        assert proc.poll() is None, "SIGTERM should still be waiting for the stubborn launcher (stop_grace_s 600)"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 143  # the run ends as the first signal asked
        assert wait_gone(run_id, 5) == [], "processes of the run survived the second signal"
        # not the 600 s of grace the first signal would have waited (half of it: a margin no busy machine eats)
        assert time.monotonic() - started < 300
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGTERM"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_evalpipe_killed_with_sigkill_takes_its_worker_and_server_along_and_the_run_resumes(tmp_path):
    """kill -9 leaves evalpipe no chance to clean up: the guards notice its end (their
    stdin pipe closes) and stop the server's and the worker's process groups. The same
    command again continues the run: the answers the server had given (the variant's
    request journal) are not asked again."""
    run_id = "kill9"
    proc, run_dir = start_served_run(tmp_path, run_id)
    try:
        wait_for_served_generation(proc)
        assert len(processes_of(run_id)) >= 3, "expected evalpipe, the server and the worker"
        os.kill(proc.pid, signal.SIGKILL)  # evalpipe alone, not its group
        proc.wait()
        assert wait_gone(run_id, 30) == [], "processes outlived evalpipe's SIGKILL"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    answered = RequestJournal(run_dir / "served" / JOURNAL_FILE).loaded
    assert answered >= 1, "the journal should hold the answers that had arrived"
    again, _ = start_served_run(tmp_path, run_id)
    out, err = again.communicate(timeout=300)
    # the reference alone: finished, compared with nothing (exit 4, INCONCLUSIVE)
    assert again.returncode == 4, out[-2000:] + err[-2000:]
    assert "continuing the interrupted run; no variant had finished" in " ".join(out.split())
    assert "only the reference `served` ran: nothing was compared" in " ".join(out.split())
    journal = json.loads((run_dir / "served" / "manifest.json").read_text())["engine"]["journal"]
    assert journal["answers_found"] == answered and journal["answers_reused"] == answered, journal
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"


def test_a_server_command_of_the_interpreter_is_forked_from_a_pre_imported_one_and_stopped(tmp_path):
    port = serve.free_port("127.0.0.1")
    starter = Preimport(modules=("json",))
    server = serve.ServerProcess(command=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                 url=f"http://127.0.0.1:{port}", log_path=tmp_path / "engine.log", grace_s=5.0,
                                 starter=starter)
    try:
        server.start({**os.environ, RUN_ID_ENV: f"srv-{tmp_path.name}"})
        assert server.proc is not None
        log = tmp_path / "engine.log"
        while "forked from a pre-imported interpreter" not in log.read_text():
            assert server.proc is not None and server.proc.poll() is None, log.read_text()
            time.sleep(0.05)
        child = int(re.search(r"process (\d+), forked", log.read_text()).group(1))
        # the log names the server's command, never the fork server's client
        assert log.read_text().startswith(f"$ {sys.executable} -m http.server {port}")
        while True:  # bound once its module runs
            try:
                with urllib.request.urlopen(server.url, timeout=5) as answer:
                    assert answer.status == 200
                break
            except OSError:
                assert server.proc.poll() is None, log.read_text()
                time.sleep(0.05)
        server.stop()
        assert not server.died and not group_alive(child)  # the forked server went with its client
    finally:
        server.stop()
        starter.close()
    assert wait_gone(f"srv-{tmp_path.name}") == []  # and the fork server with the run
