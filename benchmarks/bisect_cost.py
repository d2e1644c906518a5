"""What does `evalpipe bisect` cost against a plain `git bisect run`, and which finds the commit?

In one go, on the sixteen-commit plugin repository of evalpipe.lab.bisect_repo (a benign
change at 3, a broken build at 7, a nondeterministic one at 9 reverted at 10, the harmful
W_o x (1 + 1e-3) at 11; see docs/bisect.md):

  1. `evalpipe bisect --limit N`: the good build once with its A/A run, then one run per
     step (two for a DIFFERENT build), token evidence against the good build's floor;
  2. `git bisect run` with a score-window oracle, as a nightly's accuracy check judges: each
     step runs the whole A/B (the good build and the checked-out one, `evalpipe run
     --no-noise-floor --limit N`) and calls the commit bad when a score moved by more than
     the window (10 points, vllm-ascend's GSM8K threshold), skip when the run failed.

Prints, for each: engine runs, steps, wall time, and the commit it names (and whether it is
the harmful one).

    .venv/bin/python benchmarks/bisect_cost.py [--limit 10] [--window 0.10]
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

from evalpipe.lab import bisect_repo as R
from evalpipe.machine import describe, one_line

EVALPIPE = [sys.executable, "-m", "evalpipe"]
DEFAULT = ROOT / "configs" / "default.yaml"


def score_window_step(good_tree: Path, repo: Path, limit: int, window: float, work: Path) -> int:
    """One `git bisect run` step: the whole A/B of the good build and the checked-out tree."""
    count = work / "steps"
    count.write_text(str(int(count.read_text() or 0) + 1) if count.exists() else "1")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    cfg = work / f"ab-{sha[:12]}.yaml"
    base = {"EVALPIPE_LAYOUT": "sp"}
    cfg.write_text(json.dumps({
        "extends": str(DEFAULT), "output": str(work / "runs"), "reference": "good",
        "variants": {"good": {"env": {**base, "PYTHONPATH": str(good_tree)}},
                     "candidate": {"env": {**base, "PYTHONPATH": str(repo)}}},
    }))
    run = subprocess.run([*EVALPIPE, "run", "gsm8k", "-c", str(cfg), "--limit", str(limit), "--no-noise-floor",
                          "--variants", "good,candidate", "--run-id", sha[:12]], capture_output=True, text=True)
    compare = work / "runs" / sha[:12] / "compare.json"
    if run.returncode not in (0, 1, 4) or not compare.is_file():
        return 125
    rows = json.loads(compare.read_text())["comparisons"][0]["scores"]
    moved = max((abs(r["delta"] or 0.0) for r in rows), default=0.0)
    return 1 if moved > window else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--window", type=float, default=0.10)
    parser.add_argument("--step", nargs=3, metavar=("GOOD_TREE", "REPO", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        good_tree, repo, work = map(Path, args.step)
        sys.exit(score_window_step(good_tree, repo, args.limit, args.window, work))

    print(f"machine: {one_line(describe())}")
    with tempfile.TemporaryDirectory(prefix="bisect-cost-") as tmp_s:
        tmp = Path(tmp_s)
        shas = R.build_repository(tmp / "repo")
        harmful = shas[R.HARMFUL]

        cfg = tmp / "bisect.yaml"
        cfg.write_text(json.dumps({"extends": str(DEFAULT), "output": str(tmp / "runs"),
                                   "bisect": {"repo": str(tmp / "repo"), "variant": "sp"}}))
        t0 = time.monotonic()
        ours = subprocess.run([*EVALPIPE, "bisect", "-c", str(cfg), "--good", shas[0], "--bad", shas[-1], "--limit",
                               str(args.limit)], cwd=tmp, capture_output=True, text=True)
        ours_s = time.monotonic() - t0
        journal = json.loads(next((tmp / "bisect").glob("*/bisect.json")).read_text())
        named = journal["answer"]["first_different"] if journal["answer"] else None
        runs = sum(len(s["attempts"]) for s in journal["steps"])
        print(f"evalpipe bisect: exit {ours.returncode}; {len(journal['steps'])} steps, {runs} candidate runs, 2 good-build "
              f"runs (the reference and its A/A), then localize (a run of two builds and its own engine starts); "
              f"{ours_s:.0f} s in all; names "
              f"{(named or 'nothing')[:12]} ({'the harmful commit' if named == harmful else 'NOT the harmful commit'})")

        # git bisect run, score window, the whole A/B each step
        work = tmp / "git-bisect"
        work.mkdir()
        good_tree = tmp / "good-tree"
        good_tree.mkdir()
        subprocess.run(f"git -C {tmp / 'repo'} archive {shas[0]} | tar -x -C {good_tree}", shell=True, check=True,
                       executable="/bin/bash")
        git = ["git", "-C", str(tmp / "repo")]
        subprocess.run([*git, "bisect", "start", shas[-1], shas[0]], check=True, capture_output=True)
        t0 = time.monotonic()
        theirs = subprocess.run([*git, "bisect", "run", sys.executable, str(Path(__file__).resolve()), "--limit",
                                 str(args.limit), "--window", str(args.window), "--step", str(good_tree), str(tmp / "repo"),
                                 str(work)], capture_output=True, text=True, env={**os.environ})
        theirs_s = time.monotonic() - t0
        found = next((line.split()[0] for line in theirs.stdout.splitlines() if "is the first bad commit" in line), None)
        steps = int((work / "steps").read_text()) if (work / "steps").exists() else 0
        verdict = "the harmful commit" if found and harmful.startswith(found) else "NOT the harmful commit"
        print(f"git bisect run, score window ±{args.window:g}: {steps} steps, {2 * steps} runs (the whole A/B each); "
              f"{theirs_s:.0f} s; names {(found or 'nothing')[:12]} ({verdict})")
        print(f"ratio of wall times (evalpipe / git bisect run): {ours_s / max(theirs_s, 1e-9):.2f}")


if __name__ == "__main__":
    main()
