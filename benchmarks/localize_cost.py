"""What does `evalpipe localize` cost, next to the run it localizes?

Runs the default config's reference against a zoo fault (offline, the A/A run included)
on a few GSM8K items, then localizes the fault and prints, side by side:

  time    per configuration: its engine start and its prefills, next to the same
          variant's engine start in the run, and the whole localize next to the run;
  memory  per configuration: the bytes its engine wrote (captures), next to the bound
          N sequences x kept positions x capture points x hidden floats (x 4 bytes;
          the virtual ranks' partial sums are four pieces of the hidden width each, so
          the layout model may write more than the bound of one full tensor per point).

    .venv/bin/python benchmarks/localize_cost.py [--limit 8] [--samples 4] [--positions 8]
        [--fault heads_permuted] [--run DIR]   (DIR: localize an existing run instead)
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalpipe.documents.manifest import read_manifest  # noqa: E402
from evalpipe.install import default_config  # noqa: E402

SP_PATH = "evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention"


def evalpipe(*args: str, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "evalpipe", *args], cwd=cwd, capture_output=True, text=True)
    return time.monotonic() - t0, proc


def make_run(tmp: Path, limit: int, fault: str) -> tuple[Path, float]:
    default = yaml.safe_load(default_config().read_text())
    cfg = {"extends": str(default_config()), "output": str(tmp / "runs"),
           "variants": {"legacy": default["variants"]["legacy"],
                        "fault": {"env": {"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": fault},
                                  "expect": {"called": [SP_PATH]}}}}
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    seconds, proc = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(limit), "--run-id", "bench", cwd=tmp)
    if proc.returncode not in (0, 1):
        sys.exit(f"the run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return tmp / "runs" / "bench", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--fault", default="heads_permuted")
    parser.add_argument("--run", type=Path, help="localize this run directory instead of making one")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="localize-bench-"))
    run_dir, run_s = (args.run, None) if args.run else make_run(tmp, args.limit, args.fault)
    variant = "fault" if args.run is None else None
    extra = ["--variant", variant] if variant else []
    seconds, proc = evalpipe("localize", str(run_dir), "--samples", str(args.samples), "--positions", str(args.positions),
                             *extra, cwd=tmp)
    if proc.returncode != 0:
        sys.exit(f"localize failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads((run_dir / "localize.json").read_text())["localizations"][-1]
    hidden = json.loads((Path(read_manifest(run_dir / doc["reference"] / "manifest.json").engine_args["model"])
                         / "config.json").read_text())["hidden_size"]
    layers = len({m["layer"] for m in doc["modules"]})
    points = len({m["module"] for m in doc["modules"]}) * layers
    rows = sum(len(s["rows"]) for s in doc["sequences"])
    print(f"machine: {os.cpu_count()} CPUs; {doc['variant']} vs {doc['reference']}: {len(doc['sequences'])} sequences, "
          f"{rows} kept positions, {points} capture points ({layers} layers), hidden {hidden}")
    print(f"answer: {doc['sentence']}")
    bound = rows * points * hidden * 4
    print(f"\n{'configuration':<14} {'engine start s':>15} {'in the run s':>13} {'prefill s':>10} {'captured MB':>12} "
          f"{'bound MB':>9} {'ratio':>6}")
    for name in [n for n in doc["seconds"] if n != "analysis"]:
        manifest = read_manifest(run_dir / "localize" / name / "manifest.json")
        timings = manifest.timings or {}
        in_run = read_manifest(run_dir / name / "manifest.json").timings or {}
        captured = doc["capture_bytes"][name]
        print(f"{name:<14} {timings.get('engine_start_s', float('nan')):>15.1f} {in_run.get('engine_start_s', float('nan')):>13.1f} "
              f"{timings.get('localize_s', float('nan')):>10.2f} {captured / 1e6:>12.2f} {bound / 1e6:>9.2f} "
              f"{captured / bound:>6.2f}")
    print(f"\nlocalize: {seconds:.0f} s wall ({doc['seconds']['analysis']:.2f} s of it the comparison)"
          + (f"; the run itself: {run_s:.0f} s; ratio {seconds / run_s:.2f}" if run_s else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
