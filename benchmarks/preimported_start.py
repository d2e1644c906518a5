"""What do pre-imported interpreters save a run, and do they change anything it records?

A local run forks its real-engine workers from a fork server that imported torch,
transformers and lm-eval once (evalpipe/execution/preimport.py). This runs the same
`evalpipe run` side by side, one after another, with `EVALPIPE_PREIMPORT=off` (every worker a
new interpreter) and on (the default), and prints each one's wall time and CPU seconds (its
whole process tree: evalpipe, guards, fork server, workers), the ratio, how each worker
and server started (from their logs), and whether the runs' artifacts are the same: every variant's
parquet files bitwise, its probe records but for their timestamps.

    .venv/bin/python benchmarks/preimported_start.py [--limit 4] [-c configs/default.yaml] [--repeats 1] [--served]

``--served``: every variant of the config behind its own vLLM API server (launch.mode: serve),
which is forked from the pre-imported interpreter too. Each server gets one request at a time
(launch.concurrency: 1): with several in flight, which requests share a forward pass depends on
when they arrive, and the sp layout's last bits with it, so two runs could not be compared
bitwise whatever started them.
"""

from __future__ import annotations

import argparse
import filecmp
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

VOLATILE = {"started_at", "updated_at", "pid", "ppid"}


def timed_run(config: str, limit: int, out: Path, run_id: str, switch: str) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", config, "--limit", str(limit),
                           "--output", str(out), "--run-id", run_id], env={**os.environ, "EVALPIPE_PREIMPORT": switch},
                          capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"`evalpipe run` with EVALPIPE_PREIMPORT={switch} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    run_dir = out / run_id
    starts = {v.name: _how_started(v) for v in sorted(run_dir.iterdir()) if (v / "engine.log").is_file()}
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "dir": run_dir, "starts": starts}


def _how_started(vdir: Path) -> str:
    """How the variant's worker (and its server, when served) started, from their logs."""
    said = []
    for log in (vdir / "engine.log", vdir / "worker.log"):
        for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
            if line.startswith("evalpipe: ") and "forked from a pre-imported interpreter" in line:
                said.append(f"{line.split()[1]} forked")
            elif line.startswith("evalpipe: a new interpreter for "):
                said.append(f"{line.split()[5]} new interpreter ({line.split('(', 1)[1].rstrip(')')})")
    return " + ".join(said) or "new interpreter"


def _records(run_dir: Path, variant: str) -> list[dict[str, Any]]:
    """A variant's probe records but their timestamps and process ids, its run's directory
    in argv (the job's path) written RUN."""
    processes = json.loads((run_dir / variant / "probes.json").read_text())["processes"]
    return [{k: [a.replace(str(run_dir), "RUN") for a in v] if k == "argv" else v for k, v in p.items() if k not in VOLATILE}
            for p in processes]


def same_artifacts(a: Path, b: Path) -> list[str]:
    """What differs between two runs' variants (nothing: an empty list)."""
    differ = []
    for variant in sorted(p.name for p in a.iterdir() if (p / "engine.log").is_file()):
        for parquet in sorted((a / variant).glob("*.parquet")):
            if not filecmp.cmp(parquet, b / variant / parquet.name, shallow=False):
                differ.append(f"{variant}/{parquet.name}")
        if _records(a, variant) != _records(b, variant):
            differ.append(f"{variant}/probes.json")
    return differ


def served_config(config: Path, work: Path) -> str:
    """``config`` with every variant behind a server of its own, one request at a time."""
    import yaml

    names = yaml.safe_load(config.read_text())["variants"]
    path = work / "served.yaml"
    path.write_text(yaml.safe_dump({"extends": str(config.resolve()),
                                    "variants": {name: {"launch": {"mode": "serve", "concurrency": 1}} for name in names}}))
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--served", action="store_true", help="every variant behind a vLLM API server of its own")
    args = parser.parse_args()

    from evalpipe.machine import describe

    work = Path(tempfile.mkdtemp(prefix="evalpipe-preimport-"))
    if args.served:
        args.config = served_config(Path(args.config), work)
    print(f"machine: {describe()}")
    print(f"config: {args.config}, gsm8k --limit {args.limit}, {args.repeats} run(s) each way, one after another")
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(args.repeats):
        for switch in ("off", "on"):
            runs[switch].append(timed_run(args.config, args.limit, work, f"{switch}-{i}", switch))
    print(f"{'EVALPIPE_PREIMPORT':<19} {'wall s':>7} {'CPU s':>7}  workers")
    for switch, done in runs.items():
        for r in done:
            starts = ", ".join(f"{v}: {how}" for v, how in r["starts"].items())
            print(f"{switch:<19} {r['wall_s']:7.1f} {r['cpu_s']:7.1f}  {starts}")
    mean = {s: sum(r["cpu_s"] for r in done) / len(done) for s, done in runs.items()}
    wall = {s: sum(r["wall_s"] for r in done) / len(done) for s, done in runs.items()}
    print(f"on / off: CPU {mean['on'] / mean['off']:.2f}, wall {wall['on'] / wall['off']:.2f}")
    differ = [d for r in runs["on"] + runs["off"][1:] for d in same_artifacts(runs["off"][0]["dir"], r["dir"])]
    print("artifacts (parquet bitwise, probe records but their timestamps): "
          + ("the same in every run" if not differ else f"DIFFERENT: {', '.join(differ)}"))
    return 0 if not differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
