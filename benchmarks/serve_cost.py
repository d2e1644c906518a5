"""What serve mode costs against offline, and what reusing the reference's server for
the A/A run saves. Prints numbers and ratios, measured side by side.

1. One run, two variants of the same numerics on the same prompts (default: the 600
   synthetic GSM8K items): `offline` (vllm.LLM in the worker) and `served` (the same
   engine arguments behind vLLM's OpenAI server, evalpipe's HTTP client). Per variant:
   engine start, the lm-eval task phase (and its part from the first request on, which
   excludes lm-eval building its requests), the engine calls and tokenizing inside it,
   teacher forcing. Target: served <= 1.10 x offline from the first request on.
2. Two default serve-mode runs (configs/serve.yaml: legacy, its A/A run, sp), one with
   a second engine for the A/A run, one with `noise_floor.reuse_server` (the A/A run
   sends its requests to legacy's server, reversed, with half the concurrency): wall
   time of each, and the noise each A/A run saw.

    .venv/bin/python benchmarks/serve_cost.py [--limit 600] [--skip-aa]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from evalpipe.documents.comparison import read_comparison
from evalpipe.documents.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def run(config: dict, tmp: Path, name: str, limit: int, *extra: str) -> tuple[Path, float]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "output": str(tmp / "runs")}))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(path), "--limit", str(limit),
                           "--run-id", name, *extra], capture_output=True, text=True, cwd=tmp)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"{name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return tmp / "runs" / name, wall


def timings(run_dir: Path, variant: str) -> dict[str, float]:
    return read_manifest(run_dir / variant / "manifest.json").timings


def noise(run_dir: Path, variant: str) -> str:
    doc = read_comparison(run_dir / "compare.json")
    c = next(c for c in [*doc.comparisons, *([doc.noise_floor] if doc.noise_floor else [])] if c.variant == variant)
    t = c.tokens[0]
    return (f"{c.status}: {t.n_identical}/{t.n_samples} samples bitwise, same ids {t.n_ids_identical}/{t.n_samples}, "
            f"max |dlogprob| {t.max_abs_dlogprob:.2e}, top-k lists differing at same ids {t.n_topk_diff_same_ids}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--skip-aa", action="store_true", help="only part 1")
    args = ap.parse_args()
    base = {"extends": str(CONFIGS / "default.yaml")}
    with tempfile.TemporaryDirectory(prefix="evalpipe-serve-cost-") as tmp_name:
        tmp = Path(tmp_name)
        legacy = {"EVALPIPE_LAYOUT": "legacy"}
        cfg = {**base, "reference": "offline", "noise_floor": False,
               "variants": {"offline": {"env": legacy}, "served": {"env": legacy, "launch": {"mode": "serve"}}}}
        run_dir, wall = run(cfg, tmp, "modes", args.limit, "--variants", "offline,served")
        off, srv = timings(run_dir, "offline"), timings(run_dir, "served")
        print(f"1. same {args.limit} prompts, offline vs served (one run, {wall:.0f} s wall)")
        print(f"   {'':<22}{'offline':>10}{'served':>10}{'ratio':>8}")
        for key, label in (("engine_start_s", "engine start"), ("tasks_s", "task phase"),
                           ("requests_s", "  from 1st request on"), ("engine_calls_s", "    engine calls"),
                           ("tokenize_s", "    tokenizing"),
                           ("teacher_s", "teacher forcing"), ("total_s", "variant, start to end")):
            print(f"   {label:<22}{off[key]:>9.1f}s{srv[key]:>9.1f}s{srv[key] / off[key]:>7.2f}x")
        ratio = srv["requests_s"] / off["requests_s"]
        print(f"   task phase from the first request on, served/offline = {ratio:.2f} "
              f"(target <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'}); before it, lm-eval builds the requests "
              "(served: while the server loads, sharing the CPU with it)")
        print(f"   served vs offline: {noise(run_dir, 'served')}")
        if args.skip_aa:
            return
        serve = {"extends": str(CONFIGS / "serve.yaml")}
        restart_dir, restart_wall = run({**serve, "noise_floor": True}, tmp, "aa-restart", args.limit)
        reuse_dir, reuse_wall = run({**serve, "noise_floor": {"reuse_server": True}}, tmp, "aa-reuse", args.limit)
        print("2. default serve-mode run (legacy, legacy-aa, sp)")
        print(f"   A/A with its own server:        {restart_wall:7.1f} s wall; A/A {noise(restart_dir, 'legacy-aa')}")
        print(f"   A/A reusing legacy's server:    {reuse_wall:7.1f} s wall; A/A {noise(reuse_dir, 'legacy-aa')}")
        print(f"   reuse/restart = {reuse_wall / restart_wall:.2f}")


if __name__ == "__main__":
    main()
