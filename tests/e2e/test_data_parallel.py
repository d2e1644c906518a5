"""Data parallel 1 vs 2 behind vLLM's real server (configs/data_parallel.yaml): the
configuration vLLM's offline engine refuses, run end to end on this CPU machine; and the
same two engine cores as a deployment over two nodes (a head serving HTTP with rank 0, a
headless node with rank 1, started through a launcher prefix that stands in for ssh), whose
node killed mid-run fails the variant, leaves nothing, and --resume finishes it."""

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
from processes import describe, processes_of, wait_gone

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 4.5  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

STANDIN = ["env", "EVALPIPE_STANDIN_NODE=1"]  # a launcher prefix, as [ssh, node1] would be
SPREAD = {
    "description": "two engine cores on two nodes (a head and a headless node)",
    "env": {"EVALPIPE_LAYOUT": "legacy"},
    "engine": {"data_parallel_size": 2},
    "expect": {"called": ["evalpipe.lab.layout.model.LayoutDecoderLayer._legacy_attention"],
               "per_forward": {"all_gather": 3, "all_to_all": 0}, "engine_processes": 2,
               "deployment": {"nodes": 2, "ranks_per_node": 1}},
    "launch": {"deployment": {"nodes": 2, "launchers": [[], STANDIN]}},
}


def _run(tmp: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(_config(tmp)), "--limit", "8",
                           "--no-noise-floor", "--output", str(tmp), "--run-id", run_id, *extra],
                          cwd=tmp, capture_output=True, text=True, timeout=1500)


def _config(tmp: Path) -> Path:
    path = tmp / "dp.yaml"
    if not path.is_file():
        base = yaml.safe_load((default_config().parent / "data_parallel.yaml").read_text())
        base["extends"] = str(default_config().parent / "serve.yaml")
        base["variants"]["spread"] = SPREAD
        path.write_text(yaml.safe_dump(base))
    return path


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("dp")
    proc = _run(tmp, "dp", "--variants", "dp1,dp2,spread")
    return {"proc": proc, "dir": tmp / "dp"}


def test_dp1_vs_dp2_runs_and_passes(dp_run):
    proc, run_dir = dp_run["proc"], dp_run["dir"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["verdict"] in ("IDENTICAL", "EQUIVALENT")
    # two engine cores really served dp2, one served dp1
    assert "EngineCore_DP1" in (run_dir / "dp2" / "engine.log").read_text()
    assert "EngineCore_DP1" not in (run_dir / "dp1" / "engine.log").read_text()
    args = (run_dir / "dp2" / "server-args.yaml").read_text()
    assert "data-parallel-size: 2" in args
    # the path probes saw every engine core: one for dp1, two for dp2 (DP indexes 0 and 1),
    # each building the layout model and running the legacy path
    for variant, indexes in (("dp1", [0]), ("dp2", [0, 1])):
        processes = json.loads((run_dir / variant / "probes.json").read_text())["processes"]
        cores = [p for p in processes if p["role"] == "engine_core"]
        assert sorted(p["switches"]["data_parallel_index"] for p in cores) == indexes, processes
        assert all(p["models"][0]["model_class"] == "evalpipe.lab.layout.model.LayoutForCausalLM" for p in cores)
        assert all(p["models"][0]["forwards"] > 0 for p in cores)
    dp2 = next(c for c in json.loads((run_dir / "compare.json").read_text())["comparisons"] if c["variant"] == "dp2")
    assert dp2["paths"]["status"] == "verified", dp2["paths"]
    assert "model built in 2 processes" in " ".join(dp2["paths"]["reasons"])
    assert wait_gone("dp", 10) == [], "a finished run left processes behind"


def test_the_same_ranks_over_two_nodes_serve_as_one_engine_with_each_rank_on_its_node(dp_run):
    run_dir = dp_run["dir"]
    spread = next(c for c in json.loads((run_dir / "compare.json").read_text())["comparisons"] if c["variant"] == "spread")
    assert spread["status"] in ("IDENTICAL", "EQUIVALENT"), spread["reasons"]
    assert spread["paths"]["status"] == "verified", spread["paths"]
    cores = [p for p in json.loads((run_dir / "spread" / "probes.json").read_text())["processes"] if p["role"] == "engine_core"]
    assert sorted((p["node"], p["switches"]["data_parallel_index"]) for p in cores) == [("0", 0), ("1", 1)], cores
    node1 = (run_dir / "spread" / "node-1.log").read_text()
    # vLLM's own headless rank, started through the launcher, with the flags the nightly gives node 1
    assert node1.startswith("$ [node 1] env EVALPIPE_STANDIN_NODE=1 env ") and "evalpipe.worker.headless" in node1
    assert "--data-parallel-start-rank 1" in node1 and "--headless" in node1 and "EngineCore_DP1" in node1
    assert "EngineCore_DP1" not in (run_dir / "spread" / "engine.log").read_text(), "rank 1 ran on node 1 only"


def _wait_for(path: Path, needle: str, proc: subprocess.Popen) -> None:
    while needle not in (path.read_text(errors="replace") if path.is_file() else ""):  # a state, not a duration
        assert proc.poll() is None, f"the run ended before {needle!r} appeared in {path}"
        time.sleep(0.5)


def _node_process(run_id: str, node: str) -> int:
    """The process of ``node`` that the launcher started (its guard's child): the deployment's node."""
    for pid in processes_of(run_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"EVALPIPE_NODE={node}".encode() in environ and b"evalpipe.worker.headless" in cmdline:
            return pid
    raise AssertionError(f"no process of node {node} found")


def test_a_node_killed_mid_run_fails_its_variant_alone_leaves_nothing_and_resume_finishes(tmp_path):
    # the deployment alone (a run of one variant compares nothing: INCONCLUSIVE once it finishes, exit 4)
    args = [sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(_config(tmp_path)), "--limit", "4",
            "--no-noise-floor", "--output", str(tmp_path), "--run-id", "killed", "--variants", "spread"]
    with open(tmp_path / "out", "w") as out:
        proc = subprocess.Popen(args, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # once the deployment serves (its worker has asked for answers), node 1 dies
            _wait_for(tmp_path / "out", "spread · gsm8k_synth_4shot · generate:", proc)
            os.kill(_node_process("killed", "1"), signal.SIGKILL)
            code = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    said = (tmp_path / "out").read_text()
    assert code == 3, said[-3000:]
    info = json.loads((tmp_path / "killed" / "run.json").read_text())
    assert info["status"] == "failed" and info["variant_status"]["spread"]["exit_code"] == 3, info
    error = info["variant_status"]["spread"]["error"]
    assert error.startswith("node 1, data-parallel rank 1, was killed by SIGKILL before the variant finished"), error
    left = wait_gone("killed", 60)
    assert left == [], describe(left)
    done = subprocess.run([*args, "--resume", str(tmp_path / "killed")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]  # finished; nothing to compare it with
    info = json.loads((tmp_path / "killed" / "run.json").read_text())
    assert info["status"] == "ok" and info["variant_status"]["spread"]["exit_code"] == 0, info
    assert (tmp_path / "killed" / "spread" / "tokens.parquet").is_file()
    assert wait_gone("killed", 30) == []
