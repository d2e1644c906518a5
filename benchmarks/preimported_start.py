"""What would a pre-imported interpreter save per in-process engine?

Every variant's worker is a new interpreter that imports vLLM, torch and lm-eval before its
engine starts; on a 2-core machine the end-to-end tests spend most of their CPU on such
starts (docs/measured.md). This measures, side by side in one run, the reference variant
of a config (its engine arguments and environment) started N times:
  fresh   a new interpreter each time (what evalpipe does today);
  forked  a child forked from one interpreter that imported vLLM, torch and lm-eval once;
and prints each start's CPU seconds (the child's own, from wait4), the time until `LLM(...)`
returned, the import paid once by the forking parent, and whether every start generated
bitwise the same tokens and logprobs.

    .venv/bin/python benchmarks/preimported_start.py [--repeats 2] [-c configs/default.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [f"Question: Tom has {i} apples and buys {i + 3} more. How many apples does he have?\nAnswer:" for i in range(8)]
MAX_TOKENS = 48


def engine_run(engine_args: dict[str, Any], out: Path) -> None:
    """One engine start and one greedy batch; the outputs and the start time to ``out``."""
    started = time.monotonic()
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args)
    start_s = time.monotonic() - started
    results = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5), use_tqdm=False)
    outputs = []
    for result in results:
        ids = list(result.outputs[0].token_ids)
        outputs.append([ids, [position[tid].logprob for tid, position in zip(ids, result.outputs[0].logprobs or [])]])
    out.write_text(json.dumps({"start_s": start_s, "outputs": outputs}))


def reference_engine(config_path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The config's reference variant as a run plans it: its engine arguments (the model
    resolved to its directory) and the environment the config adds."""
    from rich.console import Console

    from evalpipe.config.loading import load_config
    from evalpipe.pipeline.plan import make_plan
    from evalpipe.pipeline.runner import ensure_model
    from evalpipe.reporting import QuietReporter

    config = load_config(config_path)
    plan = make_plan(config, config_path, "gsm8k", variants=config.reference_name, noise_floor=False)
    reference = plan.variant(config.reference_name)
    model = ensure_model(plan, QuietReporter(Console(stderr=True)))
    return {**reference.engine_args, "model": model.directory}, {**reference.env_overrides, "HF_HUB_OFFLINE": "1"}


def fresh_start(job: Path, out: Path, env: dict[str, str]) -> float:
    """A new interpreter for one engine; its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, __file__, "--child", str(job), str(out)], env={**os.environ, **env}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def forked_starts(job: Path, work: Path, repeats: int, env: dict[str, str]) -> dict[str, Any]:
    """One interpreter imports once (in a process of its own, so this script stays clean),
    then forks a child per engine; the import's CPU and each child's."""
    out = work / "forked.json"
    subprocess.run([sys.executable, __file__, "--forker", str(job), str(work), str(repeats), str(out)],
                   env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def forker(job: Path, work: Path, repeats: int, out: Path) -> None:
    import threading

    import lm_eval.evaluator  # noqa: F401 - what a worker imports before its engine
    import torch  # noqa: F401
    from vllm import LLM  # noqa: F401

    own = resource.getrusage(resource.RUSAGE_SELF)
    engine_args = json.loads(job.read_text())
    children = []
    for i in range(repeats):
        pid = os.fork()
        if pid == 0:
            try:
                engine_run(engine_args, work / f"forked-{i}.json")
            finally:
                os._exit(0)
        _, status, usage = os.wait4(pid, 0)
        children.append({"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})
    out.write_text(json.dumps({"import_cpu_s": own.ru_utime + own.ru_stime, "threads_at_fork": len(os.listdir("/proc/self/task")),
                               "python_threads": threading.active_count(), "children": children}))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        engine_run(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["--forker"]:
        forker(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    args = parser.parse_args()

    from evalpipe.machine import describe

    engine_args, env = reference_engine(args.config)
    work = Path(tempfile.mkdtemp(prefix="evalpipe-preimport-"))
    job = work / "engine_args.json"
    job.write_text(json.dumps(engine_args))
    print(f"machine: {describe()}")
    print(f"config: {args.config}, reference engine, {args.repeats} starts each way, one after another")
    fresh = []
    for i in range(args.repeats):
        cpu = fresh_start(job, work / f"fresh-{i}.json", env)
        fresh.append({"cpu_s": cpu, **json.loads((work / f"fresh-{i}.json").read_text())})
    forked = forked_starts(job, work, args.repeats, env)
    for i, child in enumerate(forked["children"]):
        child.update(json.loads((work / f"forked-{i}.json").read_text()))
    outputs = [r["outputs"] for r in fresh + forked["children"]]
    print(f"{'start':<8} {'CPU s':>7} {'LLM() ready s':>14}")
    for name, runs in (("fresh", fresh), ("forked", forked["children"])):
        for r in runs:
            print(f"{name:<8} {r['cpu_s']:7.1f} {r['start_s']:14.1f}")
    mean = {name: sum(r["cpu_s"] for r in runs) / len(runs) for name, runs in (("fresh", fresh), ("forked", forked["children"]))}
    print(f"the forking parent's import, paid once: {forked['import_cpu_s']:.1f} CPU s "
          f"(OS threads at the fork: {forked['threads_at_fork']}, Python threads: {forked['python_threads']})")
    print(f"CPU per start, forked / fresh: {mean['forked'] / mean['fresh']:.2f}")
    print(f"outputs bitwise the same in every start: {all(o == outputs[0] for o in outputs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
