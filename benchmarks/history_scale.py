"""How big and how slow is a year of nightly history?

Builds a synthetic history through the real store (evalpipe.history.store): N nights x T
tasks x V variants (reference, its A/A run, one variant), 2 metrics per task, I items
per task (default 365 x 10 x 3, 1 319 items: GSM8K's size), per-item 0/1 correctness
drawn once and flipped a little each night, token summaries per task. At night
``--fault-night`` the variant loses 13 items per task (1 point) for good.

Then measures, on that database:
  1. its size (SQLite file) and the time to record one night;
  2. `nightly` bookkeeping for the last night: the series detection over every task x
     metric x variant and token measure (what `evalpipe nightly` adds to a run);
  3. the dashboard: data from the database + HTML, written to a file.
Targets: dashboard <= 5 s, database <= 50 MB.

    .venv/bin/python benchmarks/history_scale.py [--nights 365] [--tasks 10] [--items 1319] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalpipe.history.store import ItemScores, RunRecord, open_history  # noqa: E402
from evalpipe.nightly import night as nightly  # noqa: E402

DAY = 86400.0
METRICS = ("exact_match,strict-match", "exact_match,flexible-extract")


def night_record(i: int, args, rng, base: dict[str, np.ndarray], keys) -> RunRecord:
    fault = i >= args.fault_night
    variants = []
    for name, role in (("legacy", "reference"), ("legacy-aa", "aa"), ("sp", "variant")):
        scores = []
        for t in range(args.tasks):
            task = f"task{t:02d}"
            for m, metric in enumerate(METRICS):
                values = base[f"{task}{m}"].copy()
                noisy = rng.random(values.size) < 0.002  # the engine's own noise: a few items each night
                values[noisy] = 1 - values[noisy]
                if fault and name == "sp":
                    values[np.flatnonzero(base[f"{task}{m}"] == 1)[:13]] = 0
                scores.append(ItemScores(task, metric, keys[task], values))
        tokens = [
            {"task": f"task{t:02d}", "source": src, "kl_p99": float(rng.lognormal(-28, 1)), "kl_max": float(rng.lognormal(-25, 1)),
             "n_hard_divergences": 0.0, "n_near_tie_divergences": float(rng.integers(0, 3)), "n_divergent": float(rng.integers(0, 5)),
             "n_samples": args.items}
            for t in range(args.tasks) for src in ("free", "teacher")
        ] if role != "reference" else []
        variants.append({"name": name, "role": role, "status": None if role == "reference" else "EQUIVALENT", "exit_code": 0,
                         "components": {"vllm": "0.32.0", "vllm_ascend": f"c{i // 7:04d}"}, "settings": {"env": {"EVALPIPE_LAYOUT": name}},
                         "scores": scores, "tokens": tokens, "gates": []})
    run = {"run_id": f"night-{i:04d}", "kind": "nightly", "started_at": 1.7e9 + i * DAY, "config_path": "configs/default.yaml",
           "config_hash": "bench", "code_version": "bench", "model": "builtin:tiny-gsm", "model_fingerprint": None,
           "task_selector": "all", "status": "ok", "verdict": "EQUIVALENT", "reference": "legacy", "aa_variant": "legacy-aa",
           "hardware": {}, "run_dir": f"/nonexistent/night-{i:04d}"}
    return RunRecord(run, variants)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--items", type=int, default=1319)
    ap.add_argument("--fault-night", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None)
    args = ap.parse_args()
    args.fault_night = args.fault_night if args.fault_night is not None else args.nights - 5
    out = args.keep or Path(tempfile.mkdtemp(prefix="evalpipe-history-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    base = {f"task{t:02d}{m}": (rng.random(args.items) < 0.6).astype(np.float64) for t in range(args.tasks) for m in range(len(METRICS))}
    keys = {f"task{t:02d}": tuple((d, 0, f"h{t}-{d}") for d in range(args.items)) for t in range(args.tasks)}
    db_file = out / "history.sqlite"
    db_file.unlink(missing_ok=True)
    db = open_history(f"sqlite:///{db_file}", out)
    t0 = time.perf_counter()
    for i in range(args.nights - 1):
        db.write(night_record(i, args, rng, base, keys))
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    db.write(night_record(args.nights - 1, args, rng, base, keys))
    record_s = time.perf_counter() - t0
    nights = db.runs(kind="nightly")
    t0 = time.perf_counter()
    changes = nightly.series_changes(db, nights, alpha=1e-3, min_nights=2)
    detect_s = time.perf_counter() - t0
    flagged = [c for c in changes if c["state"] == "flagged"]
    # what the dashboard shows comes from the last night's judgement
    db.set_judgement(nights[-1]["run_id"], "REGRESSION", nights[-2]["run_id"], {"changes": changes, "reasons": []})
    t0 = time.perf_counter()
    path = nightly.build_dashboard(db, "bench", "history benchmark", out / "index.html")
    dash_s = time.perf_counter() - t0
    size_mb = db_file.stat().st_size / 1e6
    cells = args.nights * args.tasks * 3 * len(METRICS)
    print(f"history: {args.nights} nights x {args.tasks} tasks x 3 variants x {len(METRICS)} metrics x {args.items} items "
          f"({cells} score rows) in {db_file}")
    print(f"  database size            {size_mb:8.1f} MB   (target <= 50 MB: {size_mb / 50:.2f} of it)")
    print(f"  filling {args.nights - 1} nights        {fill_s:8.1f} s    ({fill_s / max(args.nights - 1, 1) * 1000:.0f} ms per night)")
    print(f"  recording one night      {record_s:8.2f} s")
    print(f"  series detection         {detect_s:8.2f} s    ({len(changes)} changes, {len(flagged)} flagged; "
          f"first flagged night {min((c['run_id'] for c in flagged), default=None)}, fault at night-{args.fault_night:04d})")
    print(f"  nightly bookkeeping      {record_s + detect_s:8.2f} s    (record + detection)")
    print(f"  dashboard (data + HTML)  {dash_s:8.2f} s    (target <= 5 s: {dash_s / 5:.2f} of it; {path.stat().st_size / 1e6:.1f} MB page)")
    if args.keep is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
