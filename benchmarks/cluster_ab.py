"""What does running the variants at once on a Ray cluster cost and save?

In one go, on the same machine state:
  1. the default A/B (`legacy`, its A/A run `legacy-aa`, `sp`) here, one variant after
     another: `evalpipe run gsm8k --limit N --cluster off`;
  2. the same run on a Ray cluster of three nodes started on this machine's loopback
     (evalpipe.cluster.local), each variant on a node of its own, artifacts back through Ray;
  3. the per-variant overhead of the cluster path on its own: a placement group made ready,
     an actor started in it and answering, and a finished variant directory packed on a
     node and unpacked into the run directory (bytes and seconds).
Prints both wall times and their ratio, the overheads, and whether the two runs wrote the
same bytes. The three nodes share this machine's cores: on a 2-core machine three engines
contend for them, so the cluster figure is a floor on overhead, not a speed-up.

Then, on paper: the wall time of a GLM-5 A/B (three engines) sequential vs on three node
groups: sequential 3 (S + E) against max over variants (S + E) plus the overhead measured
in 3, for an engine start S and a GSM8K evaluation E per variant. By default from figures
that can be cited (PAPER below: vllm-ascend's own limits, logs and CI baselines), or your
own (--start-s, --eval-s).

    .venv/bin/python benchmarks/cluster_ab.py [--limit 8] [--start-s S --eval-s E]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalpipe.cluster import transfer
from evalpipe.cluster.local import start
from evalpipe.machine import describe, one_line

VARIANTS = ("legacy", "legacy-aa", "sp")
TABLES = ("samples.parquet", "tokens.parquet", "teacher.parquet")


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "evalpipe", *args], cwd=cwd, env=env, capture_output=True, text=True)
    took = time.time() - t0
    if done.returncode not in (0, 1, 4):
        raise SystemExit(f"`evalpipe {' '.join(args)}` failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return took


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_PROBE = r'''
import json, sys, time
from evalpipe.cluster.session import connect, disconnect
from evalpipe.cluster.placement import one_group, wait_ready, release
ray = connect(sys.argv[1])
@ray.remote
class Probe:
    def ping(self):
        return 1
rows = []
for i in range(5):
    t0 = time.time()
    slot = one_group(ray, {"CPU": 1.0}, f"bench-{i}")
    wait_ready(ray, slot.group, what="probe", asked="{CPU: 1}", address=sys.argv[1], timeout_s=60,
               say=lambda s: None, cancelled=lambda: False)
    placed = time.time() - t0
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    actor = Probe.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(slot.group, placement_group_bundle_index=0)).remote()
    ray.get(actor.ping.remote())
    started = time.time() - t0 - placed
    ray.kill(actor)
    release(ray, slot.group)
    rows.append((placed, started))
disconnect()
print(json.dumps(rows))
'''


# Cited figures for the on-paper GLM-5 estimate (vllm-project/vllm-ascend at 182b75e unless said).
PAPER_START_S = {
    # weights loaded, no warm-up: "Model runner load_model total time: 360.75 seconds"
    # (DeepSeek-V4-Pro w4a8 on an Atlas 800I A3, issue #16983): a floor on S
    "load only (issue #16983)": 360.75,
    # tests/e2e/conftest.py RemoteOpenAIServer: `max_wait_seconds or 2800`, the longest the
    # nightly waits for /health: a ceiling on S
    "nightly's wait limit (tests/e2e/conftest.py)": 2800.0,
}
GSM8K_ITEMS = 1319  # the test split
GSM8K_MAX_TOKENS = 256  # lm-eval's max_gen_toks default (lm_eval/models/api_models.py), the task sets none
# GLM-5.1-W8A8 on one A3 node, 64 prompts at batch 32: the CI's output-throughput baseline
# (tests/e2e/nightly/single_node/models/configs/GLM-5.1-W8A8-PrefillMC2.yaml, TP16, `baseline: 156.6562`)
GLM_TOKENS_PER_S = 156.6562


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--start-s", type=float, default=None, help="GLM-5: one engine's start, seconds (default: cited bounds)")
    parser.add_argument("--eval-s", type=float, default=None, help="GLM-5: one variant's evaluation, seconds (default: cited)")
    args = parser.parse_args()
    print(f"machine: {one_line(describe())}")
    work = Path(tempfile.mkdtemp(prefix="evp-bench-"))
    root = Path(tempfile.mkdtemp(prefix="evp-ray-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    t0 = time.time()
    cluster = start([{"CPU": 1.0}] * 3, root)
    print(f"local cluster of 3 nodes up in {time.time() - t0:.1f}s at {cluster.address}")
    try:
        config = work / "ab.yaml"
        config.write_text(json.dumps({"extends": str(Path(args.config).resolve()), "output": str(work / "runs"),
                                      "noise_floor": True,
                                      "cluster": {"address": cluster.address, "distinct_nodes": True,
                                                  "scratch": str(work / "scratch")}}))
        common = ["run", "gsm8k", "-c", str(config), "--limit", str(args.limit)]
        here = _run([*common, "--run-id", "here", "--cluster", "off"], work, env)
        there = _run([*common, "--run-id", "there"], work, env)
        print(f"default A/B, --limit {args.limit}: here (sequential) {here:.1f}s, cluster (3 nodes at once) {there:.1f}s, "
              f"cluster/here {there / here:.2f}")
        same = all(_sha(work / "runs" / "here" / v / t) == _sha(work / "runs" / "there" / v / t)
                   for v in VARIANTS for t in TABLES)
        print(f"same bytes in {len(VARIANTS) * len(TABLES)} tables: {same}")

        probe = subprocess.run([sys.executable, "-c", _PROBE, cluster.address], env=env, capture_output=True, text=True,
                               cwd=ROOT)
        if probe.returncode != 0:
            raise SystemExit(probe.stderr[-3000:])
        rows = json.loads(probe.stdout.strip().splitlines()[-1])
        placed = sorted(r[0] for r in rows)[len(rows) // 2]
        started = sorted(r[1] for r in rows)[len(rows) // 2]
        print(f"per variant, median of {len(rows)}: placement group ready {placed * 1000:.0f} ms, "
              f"actor started and answering {started * 1000:.0f} ms")
        for variant in VARIANTS:
            source = work / "runs" / "there" / variant
            t0 = time.time()
            packed = transfer.pack(source)
            pack_s = time.time() - t0
            t0 = time.time()
            transfer.unpack_into(packed, work / "unpacked" / variant)
            unpack_s = time.time() - t0
            print(f"transfer {variant}: {len(packed) / 1e6:.2f} MB, pack {pack_s * 1000:.0f} ms, unpack {unpack_s * 1000:.0f} ms")
        overhead = placed + started
        if args.start_s is not None and args.eval_s is not None:
            starts, eval_s = {"yours": args.start_s}, args.eval_s
        else:
            starts, eval_s = PAPER_START_S, GSM8K_ITEMS * GSM8K_MAX_TOKENS / GLM_TOKENS_PER_S
            print(f"on paper, cited: E = {GSM8K_ITEMS} items x at most {GSM8K_MAX_TOKENS} tokens / {GLM_TOKENS_PER_S} "
                  f"token/s (GLM-5.1 one-node CI baseline) = {eval_s:.0f}s per variant, at most")
        for what, start_s in starts.items():
            one = start_s + eval_s
            print(f"on paper, GLM-5 A/B, S = {start_s:g}s ({what}), E = {eval_s:.0f}s: sequential {3 * one:.0f}s, "
                  f"three node groups {one + overhead:.0f}s (+ the transfer of its directories), ratio "
                  f"{(one + overhead) / (3 * one):.2f}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
