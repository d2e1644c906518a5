"""What does evalpipe cost on top of the engine?

Runs, in one go and on the same machine state:
  1. `evalpipe run gsm8k --variants REF --limit N` (one variant: one engine, lm-eval,
     capture of every token's logprob and top-k, artifact writing);
  2. the very same prompts (token ids taken from that run) through a bare
     `vllm.LLM.generate` with the same engine args and SamplingParams
     (greedy, logprobs=k, the task's stop strings and max tokens).
Prints both generation times, their ratio, and how many times the engine started
per variant (counted in engine.log).

    .venv/bin/python benchmarks/overhead.py [--limit 200] [-c configs/default.yaml]
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

RAW_SCRIPT = r'''
import json, sys, time
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    job = json.load(open(sys.argv[1]))
    t0 = time.time()
    llm = LLM(**job["engine_args"])
    start_s = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], stop=job["stop"], logprobs=job["topk"], seed=0)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    t0 = time.time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    gen_s = time.time() - t0
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print("RAW_RESULT " + json.dumps({"engine_start_s": start_s, "generate_s": gen_s, "generated_tokens": n_tokens}))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    args = parser.parse_args()

    from evalpipe.config.loading import load_config
    from evalpipe.documents.manifest import read_manifest
    from evalpipe.documents.run_doc import read_run_document
    from evalpipe.rundir import artifacts

    cfg = load_config(args.config)
    ref = cfg.reference_name
    work = Path(tempfile.mkdtemp(prefix="evalpipe-overhead-"))

    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", args.config, "--variants", ref,
         "--limit", str(args.limit), "--output", str(work), "--run-id", "overhead"],
        capture_output=True, text=True,
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        return proc.returncode
    run_dir = work / "overhead"
    info = read_run_document(run_dir)
    assert info is not None and info.model.path, f"{run_dir} has no run.json naming its model"
    vdir = artifacts.VariantDir(run_dir / ref)
    manifest = read_manifest(vdir.manifest)
    task = cfg.tasks["gsm8k"][0].task
    evalpipe_task_s = manifest.timings[f"task:{task}_s"]
    engine_starts = vdir.engine_log.read_text(errors="replace").count("Initializing a V1 LLM engine")

    # The exact token ids the engine saw: re-encode the logged prompts the way the worker does.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(info.model.path)
    samples = artifacts.read_table(vdir.samples).to_pylist()
    prompts = [tokenizer.encode(s["prompt"], add_special_tokens=False) for s in samples]
    results = artifacts.read_json(vdir.results)
    gen_kwargs = results["configs"][task]["generation_kwargs"]
    job = {
        "engine_args": {**manifest.engine_args},
        "prompts": prompts,
        "stop": gen_kwargs["until"],
        "max_tokens": int(gen_kwargs.get("max_gen_toks", 256)),
        "topk": cfg.capture.topk,
    }
    job_path = work / "raw.json"
    job_path.write_text(json.dumps(job))
    script = work / "raw.py"
    script.write_text(RAW_SCRIPT)
    env = {**os.environ, **cfg.env, **cfg.variants[ref].env, "HF_HUB_OFFLINE": "1"}
    raw = subprocess.run([sys.executable, str(script), str(job_path)], capture_output=True, text=True, env=env)
    if raw.returncode != 0:
        print(raw.stderr[-3000:])
        return 3
    # vLLM logs to stdout too; the result is the one marked line.
    raw_res = json.loads(next(ln for ln in raw.stdout.splitlines() if ln.startswith("RAW_RESULT "))[len("RAW_RESULT "):])
    evalpipe_tokens = sum(s["n_tokens"] for s in samples)

    print(f"prompts: {len(prompts)} ({task}, 4-shot), generated tokens: evalpipe {evalpipe_tokens}, raw {raw_res['generated_tokens']}")
    print(f"{'':32}{'raw vllm.LLM':>14}{'evalpipe':>12}")
    print(f"{'engine start (s)':32}{raw_res['engine_start_s']:>14.1f}{manifest.timings['engine_start_s']:>12.1f}")
    print(f"{'generation phase (s)':32}{raw_res['generate_s']:>14.2f}{evalpipe_task_s:>12.2f}")
    print(f"{'  of which engine calls (s)':32}{raw_res['generate_s']:>14.2f}{manifest.timings['engine_calls_s']:>12.2f}"
          "   (evalpipe: incl. converting logprobs to captures)")
    print(f"ratio evalpipe / raw generation: {evalpipe_task_s / raw_res['generate_s']:.2f} "
          f"(engine calls alone: {manifest.timings['engine_calls_s'] / raw_res['generate_s']:.2f}; "
          "the rest is lm-eval building requests, few-shot contexts, filters and metrics)")
    print(f"engine starts per variant (evalpipe, from engine.log): {engine_starts}")
    print(f"evalpipe wall time for the one-variant run (incl. model check, lm-eval, artifacts): {wall:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
