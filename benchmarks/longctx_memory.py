"""Peak memory of the worker and size of the artifacts for long prompts: bounded
teacher-forced prompt capture (the default `capture.prompt_positions`) vs keeping every
prompt position, side by side in one go on the same machine state.

Each side is one `evalpipe run` of the passkey probe on the reference variant of the
default config (no A/A run), with the longest prompt at --length tokens (the generator
also adds its layout edge-case lengths near 2048). While it runs, the RSS of the worker
process and of its whole process tree (the worker plus vLLM's engine-core process) is
sampled every 0.1 s from /proc.

    .venv/bin/python benchmarks/longctx_memory.py [--length 16384] [-c configs/default.yaml]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _worker_pid(root: int) -> int | None:
    """The evalpipe worker below ``root`` (the `evalpipe run` process)."""
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"evalpipe.worker.main" in cmd:
            return pid
        stack += _children(pid)
    return None


def _tree_rss(pid: int) -> int:
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += _rss(p)
        stack += _children(p)
    return total


def run_side(name: str, base: dict, every_position: bool, length: int, out: Path) -> dict:
    cfg = dict(base)
    ref = cfg.get("reference") or next(iter(cfg["variants"]))
    cfg["variants"] = {ref: cfg["variants"][ref]}
    cfg["noise_floor"] = False
    cfg["tasks"] = {"probe": [{"task": "longctx_passkey"}]}
    cfg["longctx"] = {**(cfg.get("longctx") or {}), "lengths": [length], "items_per_length": 1}
    if every_position:
        cfg["capture"] = {**(cfg.get("capture") or {}), "prompt_positions": {"min_prompt_tokens": 1, "every": 1}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalpipe", "run", "probe", "-c", str(path), "--output", str(out), "--run-id", name],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    peak_worker = peak_tree = 0
    while proc.poll() is None:
        worker = _worker_pid(proc.pid)
        if worker is not None:
            peak_worker = max(peak_worker, _rss(worker))
            peak_tree = max(peak_tree, _tree_rss(worker))
        time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: evalpipe run failed (exit {proc.returncode}):\n{proc.stderr.read()[-2000:]}")
    vdir = out / name / ref
    import pyarrow.parquet as pq

    teacher = pq.ParquetFile(vdir / "teacher.parquet").metadata.num_rows
    return {
        "seconds": time.time() - t0,
        "peak_worker": peak_worker,
        "peak_tree": peak_tree,
        "teacher_rows": teacher,
        "sizes": {f: (vdir / f).stat().st_size for f in ("samples.parquet", "tokens.parquet", "teacher.parquet")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=16384, help="longest prompt, tokens")
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "default.yaml"))
    args = ap.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="evalpipe-longctx-mem-") as tmp:
        sides = {
            "bounded": run_side("bounded", base, False, args.length, Path(tmp)),
            "every_position": run_side("every_position", base, True, args.length, Path(tmp)),
        }
    print(f"passkey probe, longest prompt {args.length} tokens (+ edge-case lengths), one variant, teacher forcing on")
    print(f"{'':28}{'bounded (default)':>20}{'every position':>20}{'ratio':>10}")
    b, e = sides["bounded"], sides["every_position"]
    rows = [
        ("peak RSS worker, MiB", b["peak_worker"] / mib, e["peak_worker"] / mib),
        ("peak RSS worker+engine, MiB", b["peak_tree"] / mib, e["peak_tree"] / mib),
        ("teacher-forced rows", b["teacher_rows"], e["teacher_rows"]),
        ("teacher.parquet, KiB", b["sizes"]["teacher.parquet"] / 1024, e["sizes"]["teacher.parquet"] / 1024),
        ("tokens.parquet, KiB", b["sizes"]["tokens.parquet"] / 1024, e["sizes"]["tokens.parquet"] / 1024),
        ("samples.parquet, KiB", b["sizes"]["samples.parquet"] / 1024, e["sizes"]["samples.parquet"] / 1024),
        ("wall, s", b["seconds"], e["seconds"]),
    ]
    for label, x, y in rows:
        print(f"{label:28}{x:>20,.1f}{y:>20,.1f}{(y / x if x else float('nan')):>10.2f}")


if __name__ == "__main__":
    main()
