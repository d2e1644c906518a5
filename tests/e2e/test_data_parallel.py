"""Data parallel 1 vs 2 behind vLLM's real server (configs/data_parallel.yaml): the
configuration vLLM's offline engine refuses, run end to end on this CPU machine, sampled
(temperature 0.6, common random numbers: DP2 must draw the samples DP1 draws); and the same
two engine cores as a deployment over two nodes (a head serving HTTP with rank 0, vLLM's
headless rank 1 started through a launcher prefix that stands in for ssh).

A node killed mid-run (the variant fails alone, nothing is left, --resume finishes it) is
evalpipe's own lifecycle, the same whatever the node runs: tests/execution/test_deployment.py
and tests/cluster/test_cluster_runs.py kill nodes of fake-engine deployments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from processes import wait_gone
from rundir_checks import sampled_sequences

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 5.4  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 8
SAMPLING = {"temperature": 0.6, "samples": 3}
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
    return subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(_config(tmp)), "--limit", str(LIMIT),
                           "--no-noise-floor", "--output", str(tmp), "--run-id", run_id, *extra],
                          cwd=tmp, capture_output=True, text=True, timeout=1500)


def _config(tmp: Path) -> Path:
    path = tmp / "dp.yaml"
    if not path.is_file():
        base = yaml.safe_load((default_config().parent / "data_parallel.yaml").read_text())
        base["extends"] = str(default_config().parent / "serve.yaml")
        base["variants"]["spread"] = SPREAD
        base["seed"], base["sampling"] = 1234, SAMPLING
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
    # the same seeds draw the same samples on one engine core or two (fp32 logprobs move in
    # their last bits with the batch, which can flip a near tie: at most one sample here)
    drawn = LIMIT * SAMPLING["samples"]
    assert dp2["samples"] == {"a": drawn, "b": drawn}
    one, two = sampled_sequences(run_dir, "dp1"), sampled_sequences(run_dir, "dp2")
    assert len(one) == drawn and sum(one[k] == two[k] for k in one) >= len(one) - 1
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
