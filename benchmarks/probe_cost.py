"""What the path probes cost the engine: the `sp` worker with and without them, side by side.

1. One real run (`evalpipe run gsm8k --variants legacy,sp --no-noise-floor --limit N`)
   gives the `sp` worker's input (sp/job.json) and its probe spec (sp/probes/spec.json).
2. sp's worker then runs once uncounted (a warm-up: the first worker after a run meets
   colder caches), then REPEATS times per arm in balanced pairs (on off, off on, on off
   ...), so that a steady drift in the machine's speed hits both arms alike. Each repetition
   writes into a fresh directory, with no request journal (no answer is reused) and
   teacher forcing on (against the run's legacy sequences).
   - probes on:  the environment the runner gives (probes' site directory first on
     PYTHONPATH, EVALPIPE_PROBES naming a copy of the spec that writes into the
     repetition's directory);
   - probes off: the same environment without either.
   An "on" repetition without a record holding forward passes, or an "off" one with a
   record, stops the benchmark: an arm that silently failed to switch measures nothing.
3. Prints, per arm, the median (min-max) of the worker's timings (manifest.json), the
   on/off ratios of the medians, the target (probes <= 3% on the task phase) with
   PASS/FAIL, and what the probes recorded. On a busy machine the timings are noisy:
   compare the ratio with the spread inside each arm before trusting a verdict.

    .venv/bin/python benchmarks/probe_cost.py [--limit 200] [--repeats 3] [-c configs/default.yaml]
                                              [--json FILE] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalpipe import machine  # noqa: E402
from evalpipe.documents.manifest import read_manifest  # noqa: E402
from evalpipe.probes import SITE_DIR, SPEC_ENV, SPEC_FILE  # noqa: E402
from evalpipe.probing.records import probe_env, read_records, records_dir  # noqa: E402
from evalpipe.rundir import artifacts

VARIANT = "sp"
REFERENCE = "legacy"
RUN_ID = "probe-cost"
TARGET = 1.03  # the issue's budget: probes cost <= 3% on the task phase
ARMS = ("on", "off")
# (manifest timing, label); the first is the one the target is about
TIMINGS = (
    ("tasks_s", "task phase (tasks_s)"),
    ("requests_s", "  from 1st request on"),
    ("engine_calls_s", "    engine calls"),
    ("teacher_s", "teacher forcing"),
    ("engine_start_s", "engine start"),
    ("total_s", "worker, start to end"),
    ("cpu_s", "worker CPU (user+sys)"),
)


class BenchmarkError(Exception):
    """A step that makes the figures meaningless: stop and say which."""


# ---------------------------------------------------------------------- the run


def make_run(config: str, limit: int, work: Path) -> Path:
    """The run whose sp worker is repeated; its directory."""
    cmd = [sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", config, "--variants", f"{REFERENCE},{VARIANT}",
           "--no-noise-floor", "--limit", str(limit), "--output", str(work), "--run-id", RUN_ID]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    run_dir = work / RUN_ID
    # the verdict (exit 0/1/4) does not matter here; both variants must have finished
    for name in (REFERENCE, VARIANT):
        manifest = run_dir / name / "manifest.json"
        if not manifest.is_file() or read_manifest(manifest).status != "ok":
            raise BenchmarkError(f"`{' '.join(cmd)}` exited {proc.returncode}; variant {name} did not finish:\n"
                                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    if not (run_dir / VARIANT / "job.json").is_file() or not (records_dir(run_dir / VARIANT) / SPEC_FILE).is_file():
        raise BenchmarkError(f"{run_dir / VARIANT} has no job.json or probes/{SPEC_FILE}")
    return run_dir


def variant_env(config: str, limit: int, work: Path) -> tuple[str, dict[str, str]]:
    """sp's interpreter and environment exactly as the runner builds them, minus any probe
    settings the caller's own environment might carry (that would switch the "off" arm on)."""
    from evalpipe.config.loading import load_config
    from evalpipe.pipeline.plan import make_plan

    plan = make_plan(load_config(config), config, "gsm8k", limit, variants=f"{REFERENCE},{VARIANT}",
                     output=str(work), run_id=RUN_ID, noise_floor=False)
    variant = plan.variant(VARIANT)
    env = variant.process_env()
    env.pop(SPEC_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep)
                                        if p and Path(p).resolve() != SITE_DIR)
    return variant.python, env


# ---------------------------------------------------------------------- one repetition


def prepare_repetition(run_dir: Path, rep_dir: Path, arm: str, base_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The job (and for "on" the spec) of one repetition in its own directory; its environment."""
    rep_dir.mkdir(parents=True)
    job = artifacts.read_json(run_dir / VARIANT / "job.json")
    job["output_dir"] = str(rep_dir)
    job["journal"] = None  # a journal would answer from the earlier run instead of the engine
    job_path = rep_dir / "job.json"
    artifacts.write_json(job_path, job, private=True)
    if arm == "off":
        return job_path, dict(base_env)
    spec = artifacts.read_json(records_dir(run_dir / VARIANT) / SPEC_FILE)
    spec["out_dir"] = str(records_dir(rep_dir))
    spec_path = records_dir(rep_dir) / SPEC_FILE
    artifacts.write_json(spec_path, spec)
    return job_path, probe_env(base_env, spec_path)


def run_worker(python: str, job_path: Path, env: dict[str, str], timeout_s: float) -> tuple[int, float]:
    """Run the worker to its end (its log in engine.log, its events in events.jsonl);
    its pid and the CPU seconds it used."""
    rep_dir = job_path.parent
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(rep_dir / "engine.log", "wb") as log, open(rep_dir / "events.jsonl", "wb") as events:
        proc = subprocess.Popen([python, "-m", "evalpipe.worker.main", str(job_path)], stdout=events, stderr=log,
                                env=env, cwd=ROOT)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise BenchmarkError(f"worker in {rep_dir} exceeded --timeout {timeout_s:g}s") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0:
        errors = [e.get("message") for e in read_events(rep_dir) if e.get("event") == "error"]
        tail = (rep_dir / "engine.log").read_text(errors="replace")[-2000:]
        raise BenchmarkError(f"worker in {rep_dir} exited {code}: {errors}\n{tail}")
    return proc.pid, cpu_s


def read_events(rep_dir: Path) -> list[dict[str, Any]]:
    events = []
    for line in (rep_dir / "events.jsonl").read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def checked_record(rep_dir: Path, arm: str, pid: int) -> dict[str, Any] | None:
    """What the probes recorded in this repetition, after checking the arm really switched:
    "on" has a readable record of the worker's process with a model and forward passes,
    "off" has no record and no probe variable in the worker's environment."""
    records, unreadable = read_records(records_dir(rep_dir))
    env = read_manifest(rep_dir / "manifest.json").env
    if arm == "off":
        if records or unreadable or SPEC_ENV in env or str(SITE_DIR) in env.get("PYTHONPATH", ""):
            raise BenchmarkError(f"probes-off repetition {rep_dir} ran with probes (records: {len(records)}, "
                                 f"{SPEC_ENV} {'set' if SPEC_ENV in env else 'unset'})")
        return None
    mine = next((r for r in records if r.pid == pid), None)
    if unreadable or mine is None or not mine.models or not sum(m.forwards for m in mine.models):
        raise BenchmarkError(f"probes-on repetition {rep_dir} recorded nothing usable (records of pids "
                             f"{[r.pid for r in records]}, worker pid {pid}, unreadable {unreadable}); "
                             f"see its engine.log for 'evalpipe probes: not active'")
    files = [p for p in records_dir(rep_dir).glob("*.json") if p.name != SPEC_FILE]
    return {
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "model_class": mine.models[0].model_class,
        "forward_passes": sum(m.forwards for r in records for m in r.models),
        "counted_calls": sum(n for r in records for n in r.calls.values()),
        "collectives": sum(n for r in records for n in r.collectives.values()),
    }


def replayed_cost(record: dict[str, Any], task_s: float, rounds: int = 200) -> dict[str, float]:
    """The probes' own work in a run, timed without the engine's noise: the record's forward
    passes and counted calls replayed through the same code the probes run (a forward
    pass's snapshot and histogram update, each call's counting, a record write per flush
    interval of the task phase), ``rounds`` times; seconds per run and share of ``task_s``."""
    import tempfile

    from evalpipe.probes.engine_hooks import EngineHooks
    from evalpipe.probes.patching import counting
    from evalpipe.probes.record import ModelRecord, ProcessRecord

    forwards = record["forward_passes"]
    calls_per_forward = max(1, round(record["counted_calls"] / max(1, forwards)))
    writes = max(1, int(task_s / 0.5))
    with tempfile.TemporaryDirectory() as out:
        proc = ProcessRecord(out, "replay")
        model = ModelRecord("replay.Model", {"replay.Layer": 3}, [])
        proc.models.append(model)
        # the wrapper a probed function runs through, around a function that does nothing
        probed = [counting(lambda: None, lambda args, kwargs, i=i: proc.enter(f"f{i}", "all_gather@virtual" if i else None,
                                                                            args, kwargs),
                           proc.leave, EngineHooks.compiling) for i in range(3)]
        t0 = time.perf_counter()
        for _ in range(rounds):
            for _ in range(forwards):
                snapshot = proc.forward_started(model, 8)
                for i in range(calls_per_forward):
                    probed[i % 3]()
                proc.forward_finished(model, snapshot)
        counting = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for _ in range(writes):
            proc.dirty = True
            proc.write()
        writing = time.perf_counter() - t0
    own = counting + writing
    return {"counting_s": counting, "writing_s": writing, "own_s": own, "share": own / task_s}


def outputs_digest(rep_dir: Path) -> str:
    """The generated tokens and teacher-forced logprobs: the probes must change none of them."""
    digest = hashlib.sha256()
    out = artifacts.VariantDir(rep_dir)
    for path in (out.tokens, out.teacher):
        table = artifacts.read_table(path)
        for name in sorted(table.column_names):
            digest.update(name.encode())
            digest.update(repr(table.column(name).to_pylist()).encode())
    return digest.hexdigest()[:16]


def repetition(run_dir: Path, work: Path, index: int, arm: str, python: str, base_env: dict[str, str],
               timeout_s: float) -> dict[str, Any]:
    rep_dir = work / "repetitions" / f"{index:02d}-{arm}"
    job_path, env = prepare_repetition(run_dir, rep_dir, arm, base_env)
    started = time.time()
    pid, cpu_s = run_worker(python, job_path, env, timeout_s)
    wall_s = time.time() - started
    timings = read_manifest(rep_dir / "manifest.json").timings
    return {
        "index": index,
        "arm": arm,
        "timings": {**{k: timings.get(k) for k, _ in TIMINGS if k != "cpu_s"}, "cpu_s": cpu_s},
        "wall_s": wall_s,
        "record": checked_record(rep_dir, arm, pid),
        "outputs": outputs_digest(rep_dir),
    }


# ---------------------------------------------------------------------- figures


def arm_figures(reps: list[dict[str, Any]], arm: str) -> dict[str, dict[str, float]]:
    figures = {}
    for key, _ in TIMINGS:
        values = [r["timings"][key] for r in reps if r["arm"] == arm and r["timings"].get(key) is not None]
        if values:
            figures[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return figures


def paired_ratios(reps: list[dict[str, Any]], key: str) -> list[float]:
    """on/off of each neighbouring pair (1st on with 1st off ...): less exposed to slow drift
    than the ratio of the medians."""
    on = [r["timings"][key] for r in reps if r["arm"] == "on"]
    off = [r["timings"][key] for r in reps if r["arm"] == "off"]
    return [a / b for a, b in zip(on, off)]


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    arms = {arm: arm_figures(reps, arm) for arm in ARMS}
    ratios = {k: arms["on"][k]["median"] / arms["off"][k]["median"] for k in arms["on"] if k in arms["off"]}
    spreads = {arm: arms[arm]["tasks_s"]["max"] / arms[arm]["tasks_s"]["min"] - 1 for arm in ARMS}
    records = [r["record"] for r in reps if r["record"]]
    return {
        "arms": arms,
        "ratios": ratios,
        "paired_tasks_ratios": paired_ratios(reps, "tasks_s"),
        "tasks_spread": spreads,
        "target": TARGET,
        "verdict": "PASS" if ratios["tasks_s"] <= TARGET else "FAIL",
        "record": records[-1],
        # the size follows the pid's digits; the counts must not move between repetitions
        "records_agree": len({tuple(v for k, v in sorted(r.items()) if k != "bytes") for r in records}) == 1,
        "replayed": replayed_cost(records[-1], arms["on"]["tasks_s"]["median"]),
        "outputs_identical": len({r["outputs"] for r in reps}) == 1,
    }


def print_table(summary: dict[str, Any], header: dict[str, Any]) -> None:
    arms, ratios = summary["arms"], summary["ratios"]
    print(f"\nprobe cost: `{VARIANT}` worker, {header['task']}, {header['n_samples']} samples, "
          f"{header['repeats']} repetitions per arm in the order {' '.join(header['order'])}")
    print(f"machine: {machine.one_line(header['machine'])}; load average {header['load_start']:.2f} at start, "
          f"{header['load_end']:.2f} at end")
    print("  (other processes may share these CPUs: timings from a busy machine are noisy, "
          "which is why the arms alternate)")
    print(f"{'':26}{'probes off':>24}{'probes on':>24}{'on/off':>9}")
    for key, label in TIMINGS:
        if key not in ratios:
            continue
        cells = [f"{a[key]['median']:.2f} s ({a[key]['min']:.2f}-{a[key]['max']:.2f})" for a in (arms["off"], arms["on"])]
        verdict = f"   target <= {TARGET:.2f}: {summary['verdict']}" if key == "tasks_s" else ""
        print(f"{label:<26}{cells[0]:>24}{cells[1]:>24}{ratios[key]:>9.3f}{verdict}")
    paired = summary["paired_tasks_ratios"]
    print(f"task phase, on/off per alternation: {', '.join(f'{r:.3f}' for r in paired)} "
          f"(median {statistics.median(paired):.3f})")
    spread = max(summary["tasks_spread"].values())
    if spread > TARGET - 1:
        print(f"note: the task phase varies by {spread:.1%} inside one arm, more than the {TARGET - 1:.0%} budget: "
              "the verdict is within this machine's noise; more --repeats (or a quiet machine) narrow it")
    rec = summary["record"]
    print(f"record (probes on): {rec['files']} file(s), {rec['bytes']:,} bytes; model {rec['model_class']}; "
          f"{rec['forward_passes']:,} forward passes, {rec['counted_calls']:,} counted calls "
          f"({rec['collectives']:,} collectives) "
          f"{'in every repetition' if summary['records_agree'] else 'in the last repetition (the counts differ between them)'}")
    own = summary["replayed"]
    print(f"the probes' own work, replayed without the engine (noise-free bound): {own['own_s'] * 1e3:.1f} ms per run "
          f"({own['counting_s'] * 1e3:.1f} ms counting, {own['writing_s'] * 1e3:.1f} ms writing the record) = "
          f"{own['share']:.3%} of the task phase")
    print(f"outputs (generated tokens, teacher-forced logprobs) identical in every repetition: "
          f"{'yes' if summary['outputs_identical'] else 'NO'}")


# ---------------------------------------------------------------------- main


def alternating(repeats: int) -> list[str]:
    """Balanced pairs: on off, off on, on off ... (a plain on off on off puts every pair's
    first, slower-or-faster slot on the same arm)."""
    return [arm for i in range(repeats) for arm in (ARMS if i % 2 == 0 else ARMS[::-1])]


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    print(f"run: gsm8k, {REFERENCE},{VARIANT}, --limit {args.limit} (in {work})", flush=True)
    t0 = time.time()
    run_dir = make_run(args.config, args.limit, work)
    print(f"  done in {time.time() - t0:.0f} s", flush=True)
    python, base_env = variant_env(args.config, args.limit, work)
    order = alternating(args.repeats)
    warm = repetition(run_dir, work, len(order), "off", python, base_env, args.timeout)
    print(f"  warm-up (not counted), probes off: tasks_s {warm['timings']['tasks_s']:.2f}", flush=True)
    reps = []
    for index, arm in enumerate(order):
        rep = repetition(run_dir, work, index, arm, python, base_env, args.timeout)
        print(f"  repetition {index + 1}/{len(order)} probes {arm:<3}: tasks_s {rep['timings']['tasks_s']:.2f}, "
              f"worker {rep['wall_s']:.0f} s", flush=True)
        reps.append(rep)
    job = artifacts.read_json(run_dir / VARIANT / "job.json")
    manifest = read_manifest(run_dir / VARIANT / "manifest.json")
    header = {
        "task": ",".join(t["task"] for t in job["tasks"]),
        "n_samples": manifest.n_samples,
        "repeats": args.repeats,
        "order": order,
        "machine": machine.describe(),
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
    }
    return {"header": header, "summary": summarize(reps), "repetitions": reps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=200, help="documents of gsm8k (default 200)")
    ap.add_argument("--repeats", type=int, default=3, help="worker runs per arm (default 3)")
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one worker may take")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the run and repetition directories")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    args.config = str(Path(args.config).resolve())
    work = Path(tempfile.mkdtemp(prefix="evalpipe-probe-cost-"))
    try:
        result = measure(args, work)
    except BenchmarkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(result["summary"], result["header"])
    if args.json:
        doc = {"benchmark": "probe_cost", "limit": args.limit, "config": args.config, **result}
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
