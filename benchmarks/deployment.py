"""What does launching an engine as a deployment over two nodes cost, and what do three at once save?

In one go, on the same machine state, with the real engine (vLLM's CPU build, the built-in
layout model at data parallel 2, configs/data_parallel.yaml's `dp2`):
  1. the same two ranks as one node's server (`dp2`) and as a deployment over two nodes (a
     head with rank 0 and a headless node with rank 1, started through a launcher prefix
     that stands in for ssh): each variant's wall time and its engine start (the worker's
     wait for /health, from its manifest), side by side, and their ratio;
  2. three two-node deployments (the default A/B's `legacy`, its A/A run `legacy-aa` and
     `sp`, each over two nodes) on a Ray cluster of six nodes on this machine's loopback:
     one after another (`cluster.concurrency: 1`) against all at once, and their ratio.
The nodes share this machine's cores (2 on the machines this project runs on): three
deployments at once contend for them, so the second figure is a floor on what a cluster of
real nodes saves, not the saving itself.

Then, on paper: the users' A/B of three GLM-5 engines, each over two A3 nodes, with an
engine start S and one variant's GSM8K evaluation E: 3 (S + E) one after another on one pair
of nodes, S + E on six nodes (the figures cited in benchmarks/cluster_ab.py, or --start-s/--eval-s).

    .venv/bin/python benchmarks/deployment.py [--limit 8] [--start-s S --eval-s E]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalpipe.cluster.local import start
from evalpipe.machine import describe, one_line

STANDIN = ["env", "EVALPIPE_STANDIN_NODE=1"]
# cited in benchmarks/cluster_ab.py (vllm-ascend at 182b75e): S between weights loaded on an
# A3 (issue #16983) and the nightly's /health wait limit; E from the CI's GLM-5.1 throughput baseline
PAPER_START_S = {"load only (issue #16983)": 360.75, "nightly's wait limit (tests/e2e/conftest.py)": 2800.0}
PAPER_EVAL_S = 1319 * 256 / 156.6562


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "evalpipe", *args], cwd=cwd, env=env, capture_output=True, text=True)
    took = time.time() - t0
    if done.returncode not in (0, 1, 4):  # 4: a run of one variant compares nothing, which is all right here
        raise SystemExit(f"`evalpipe {' '.join(args)}` failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return took


def _ready_wait(run_dir: Path, variant: str) -> float:
    engine = json.loads((run_dir / variant / "manifest.json").read_text())["engine"]
    return float(engine["ready_wait_s"])


def one_node_against_two(work: Path, limit: int, env: dict[str, str]) -> None:
    dp = {"extends": str(ROOT / "configs" / "data_parallel.yaml"), "output": str(work / "runs"),
          "variants": {"spread": {"env": {"EVALPIPE_LAYOUT": "legacy"}, "engine": {"data_parallel_size": 2},
                                  "launch": {"deployment": {"nodes": 2, "launchers": [[], STANDIN]}}}}}
    config = work / "dp.yaml"
    config.write_text(json.dumps(dp))
    rows = {}
    for variant in ("dp2", "spread"):
        took = _run(["run", "gsm8k", "-c", str(config), "--limit", str(limit), "--no-noise-floor",
                     "--variants", variant, "--run-id", variant], work, env)
        rows[variant] = (took, _ready_wait(work / "runs" / variant, variant))
    (one, one_start), (two, two_start) = rows["dp2"], rows["spread"]
    print(f"DP2 of the layout model, --limit {limit}: one node {one:.1f}s (engine start {one_start:.1f}s), "
          f"two nodes {two:.1f}s (engine start {two_start:.1f}s); ratio {two / one:.2f}x wall, "
          f"{two_start / one_start:.2f}x start")


def three_at_once_against_one_after_another(work: Path, limit: int, env: dict[str, str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="evp-ray-", dir="/tmp"))
    t0 = time.time()
    cluster = start([{"CPU": 1.0}] * 6, root)
    print(f"local cluster of 6 nodes up in {time.time() - t0:.1f}s at {cluster.address}")
    try:
        times = {}
        for concurrency in (1, 3):
            config = work / f"ab{concurrency}.yaml"
            config.write_text(json.dumps({
                "extends": str(ROOT / "configs" / "serve.yaml"), "output": str(work / "runs"), "noise_floor": True,
                "engine": {"data_parallel_size": 2}, "launch": {"deployment": {"nodes": 2}},
                # six engine cores at once: 2 GiB of KV cache each (the default config's) ran a 24 GiB machine out
                # of memory (Ray's memory monitor killed a node's process at 21.8 of 23.5 GB); 1 GiB each fits
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                "cluster": {"address": cluster.address, "concurrency": concurrency, "scratch": str(work / "scratch")}}))
            times[concurrency] = _run(["run", "gsm8k", "-c", str(config), "--limit", str(limit),
                                       "--run-id", f"ab{concurrency}"], work, env)
            verdict = json.loads((work / "runs" / f"ab{concurrency}" / "run.json").read_text())["verdict"]
            print(f"  three two-node deployments, concurrency {concurrency}: {times[concurrency]:.1f}s, verdict {verdict}")
        print(f"three two-node deployments, --limit {limit}: one after another {times[1]:.1f}s, at once {times[3]:.1f}s "
              f"({times[3] / times[1]:.2f}x; the six nodes share this machine's cores)")
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--start-s", type=float, default=None, help="GLM-5: one engine's start, seconds (default: cited bounds)")
    parser.add_argument("--eval-s", type=float, default=None, help="GLM-5: one variant's evaluation, seconds (default: cited)")
    parser.add_argument("--skip-cluster", action="store_true", help="only the one-node/two-node comparison")
    parser.add_argument("--only-cluster", action="store_true", help="only the three deployments on the cluster")
    args = parser.parse_args()
    print(f"machine: {one_line(describe())}")
    work = Path(tempfile.mkdtemp(prefix="evp-bench-"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    if not args.only_cluster:
        one_node_against_two(work, args.limit, env)
    if not args.skip_cluster:
        three_at_once_against_one_after_another(work, args.limit, env)
    starts = {"given": args.start_s} if args.start_s is not None else PAPER_START_S
    eval_s = args.eval_s if args.eval_s is not None else PAPER_EVAL_S
    for what, start_s in starts.items():
        one = start_s + eval_s
        print(f"on paper, GLM-5 A/B of three two-node engines, S = {start_s:g}s ({what}), E = {eval_s:.0f}s: "
              f"one after another on one pair of A3 nodes {3 * one:.0f}s, at once on six A3 nodes {one:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
