"""How long does `evalpipe compare` take on a run the size of a full GSM8K run?

Builds a synthetic run directory through the artifact writers: two variants, each
with samples.parquet, tokens.parquet (free-running) and teacher.parquet (the
reference's continuations scored by that variant), 1319 samples x 512 positions x
top-20 by default. The variant's logprobs are the reference's plus small noise on a
fifth of the samples (re-sorted, so close ranks swap, and now and then the k-th
entry is another token); a few samples diverge (near ties and hard flips, some end
early); in the teacher traces a few positions swap their top-1.

Then times, on that directory:
  1. the whole `evalpipe compare RUN_DIR` command end-to-end (exit code 0 or 1 is a
     verdict, both fine);
  2. compare_tokens in-process on the free-running tables and on the teacher tables.
The target is the whole command within 5 s on a 2-core machine. ``--noisy-share 1``
perturbs every sample: no position is bit-equal, the slowest case for the KL.

    .venv/bin/python benchmarks/compare_speed.py [--samples 1319] [--positions 512] [--topk 20]
        [--noisy-share 0.2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalpipe.compare.tokens import compare_tokens
from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RunDir

TARGET_S = 5.0
TASK = "gsm8k"
METRIC_COL = artifacts.SCORE_PREFIX + "exact_match,strict-match"
VOCAB = 32000
NOISY_SHARE = 0.2  # default share of samples whose logprobs carry the variant's noise
NOISE = 1e-3
BOUNDARY_SWAP_SHARE = 0.05  # noisy positions whose k-th entry is another token
DIVERGING_SHARE = 0.02  # free-running samples that generate other tokens
TEACHER_FLIPS = 40  # teacher-forced positions whose top-1 swaps


class Trace:
    """One side's per-position arrays, (samples, positions[, k]) plus a length per sample."""

    def __init__(self, ids: np.ndarray, lps: np.ndarray, topk_ids: np.ndarray, topk_lps: np.ndarray, lengths: np.ndarray):
        self.ids, self.lps, self.topk_ids, self.topk_lps, self.lengths = ids, lps, topk_ids, topk_lps, lengths

    def copy(self) -> Trace:
        return Trace(self.ids.copy(), self.lps.copy(), self.topk_ids.copy(), self.topk_lps.copy(), self.lengths.copy())

    def table(self, vocab_text: np.ndarray) -> pa.Table:
        n_s, n_p, k = self.topk_ids.shape
        keep = (np.arange(n_p)[None, :] < self.lengths[:, None]).ravel()
        n = int(keep.sum())
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k)
        ids = self.ids.ravel()[keep]
        return artifacts.tokens_table(
            {
                "task": pa.array(np.full(n, TASK, dtype=object), type=pa.string()),
                "doc_id": pa.array(np.repeat(np.arange(n_s, dtype=np.int64), n_p)[keep]),
                "repeat": pa.array(np.zeros(n, dtype=np.int32)),
                "pos": pa.array(np.tile(np.arange(n_p, dtype=np.int32), n_s)[keep]),
                "token_id": pa.array(ids.astype(np.int32)),
                "logprob": pa.array(self.lps.ravel()[keep].astype(np.float32)),
                "topk_ids": pa.ListArray.from_arrays(offsets, pa.array(self.topk_ids.reshape(-1, k)[keep].ravel().astype(np.int32))),
                "topk_logprobs": pa.ListArray.from_arrays(offsets, pa.array(self.topk_lps.reshape(-1, k)[keep].ravel().astype(np.float32))),
                "token_text": pa.array(vocab_text[ids], type=pa.string()),
            }
        )


def reference_trace(rng: np.random.Generator, n_s: int, n_p: int, k: int) -> Trace:
    """Greedy decoding: the generated token is the top-1; runners-up fall off geometrically."""
    top1 = rng.integers(0, VOCAB, size=(n_s, n_p))
    topk_ids = (top1[:, :, None] + 7919 * np.arange(k)[None, None, :]) % VOCAB
    head = -np.abs(rng.standard_normal((n_s, n_p))) * 0.3
    drops = rng.exponential(1.5, size=(n_s, n_p, k))
    drops[:, :, 0] = 0.0
    topk_lps = (head[:, :, None] - np.cumsum(drops, axis=2)).astype(np.float32)
    return Trace(top1, topk_lps[:, :, 0].copy(), topk_ids, topk_lps, np.full(n_s, n_p, dtype=np.int64))


def perturbed(rng: np.random.Generator, ref: Trace, noisy_share: float, first_sorted: int) -> Trace:
    """The reference's trace with noise of ~NOISE nats on a share of the samples.

    Engines report the top-k sorted, so the noisy lists are re-sorted from slot
    ``first_sorted`` on (ranks close in logprob swap), and a few lose their last
    entry to a token the reference did not list (rank k vs k + 1).
    """
    out = ref.copy()
    n_s, n_p, k = ref.topk_ids.shape
    noisy = np.flatnonzero(rng.random(n_s) < noisy_share)
    lps = out.topk_lps[noisy] + (rng.standard_normal((len(noisy), n_p, k)) * NOISE).astype(np.float32)
    ids = out.topk_ids[noisy]
    order = np.argsort(-lps[:, :, first_sorted:], axis=2, kind="stable") + first_sorted
    lps[:, :, first_sorted:] = np.take_along_axis(lps, order, axis=2)
    ids[:, :, first_sorted:] = np.take_along_axis(ids, order, axis=2)
    swap = rng.random((len(noisy), n_p)) < BOUNDARY_SWAP_SHARE
    ids[:, :, -1] = np.where(swap, (ids[:, :, -1] + 1) % VOCAB, ids[:, :, -1])
    out.topk_lps[noisy], out.topk_ids[noisy] = lps, ids
    hit = out.topk_ids == ref.ids[:, :, None]  # the token's own logprob is its entry in the list
    out.lps = np.where(hit.any(axis=2), np.take_along_axis(out.topk_lps, hit.argmax(axis=2)[:, :, None], axis=2)[:, :, 0], out.lps)
    return out


def free_variant(rng: np.random.Generator, ref: Trace, noisy_share: float) -> Trace:
    """Noisy copy where a few samples take the runner-up at some position and continue elsewhere."""
    out = perturbed(rng, ref, noisy_share, first_sorted=1)  # greedy: the generated token stays top-1
    n_s, n_p, k = ref.topk_ids.shape
    div = np.flatnonzero(rng.random(n_s) < DIVERGING_SHARE)
    for s in div.tolist():  # a few dozen samples: a generator, not the code under test
        d = int(rng.integers(0, n_p))
        out.topk_ids[s, d, [0, 1]] = out.topk_ids[s, d, [1, 0]]
        out.ids[s, d] = out.topk_ids[s, d, 0]
        rest = n_p - d - 1
        if rest:
            fresh = rng.integers(0, VOCAB, size=rest)
            out.ids[s, d + 1 :] = fresh
            out.topk_ids[s, d + 1 :] = (fresh[:, None] + 7919 * np.arange(k)[None, :]) % VOCAB
        if rng.random() < 0.5:
            out.lengths[s] = int(rng.integers(d + 1, n_p + 1))
    return out


def teacher_variant(rng: np.random.Generator, ref: Trace, noisy_share: float) -> Trace:
    """The reference's tokens forced: same ids everywhere, noisy logprobs, a few top-1 swaps."""
    out = perturbed(rng, ref, noisy_share, first_sorted=0)
    n_s, n_p, _ = ref.topk_ids.shape
    flat = rng.choice(n_s * n_p, size=min(TEACHER_FLIPS, n_s * n_p), replace=False)
    s, p = np.unravel_index(flat, (n_s, n_p))
    out.topk_ids[s, p, 0], out.topk_ids[s, p, 1] = ref.topk_ids[s, p, 1], ref.topk_ids[s, p, 0]
    lp0, lp1 = out.topk_lps[s, p, 0].copy(), out.topk_lps[s, p, 1].copy()
    out.topk_lps[s, p, 0] = (lp0 + lp1) / 2 + 0.05
    out.topk_lps[s, p, 1] = (lp0 + lp1) / 2
    out.lps[s, p] = out.topk_lps[s, p, 1]  # the forced token is now B's runner-up
    out.ids = ref.ids.copy()
    return out


def samples_rows(n_s: int, trace: Trace, rng: np.random.Generator, flip_share: float) -> list[dict]:
    correct = (np.arange(n_s) % 3 != 0).astype(float)
    flips = rng.random(n_s) < flip_share
    scores = np.where(flips, 1.0 - correct, correct)
    return [
        {
            "task": TASK,
            "doc_id": i,
            "repeat": 0,
            "prompt_hash": f"h{i}",
            "prompt": f"Question: problem {i}?\nAnswer:",
            "target": str(i),
            "response": f"... so the answer is {i}.",
            "n_tokens": int(trace.lengths[i]),
            "finish_reason": "length",
            METRIC_COL: float(scores[i]),
            "answer:strict-match": str(i),
        }
        for i in range(n_s)
    ]


def build_run(root: Path, n_s: int, n_p: int, k: int, noisy_share: float, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    vocab_text = np.array([f" t{i}" for i in range(VOCAB)], dtype=object)
    ref = reference_trace(rng, n_s, n_p, k)
    candidate = (free_variant(rng, ref, noisy_share), teacher_variant(rng, ref, noisy_share), 0.01)
    sides = {"reference": (ref, ref, 0.0), "candidate": candidate}
    rows = {}
    for name, (free, teacher, flip_share) in sides.items():
        vdir = RunDir(root).variant(name)
        write_manifest(vdir.manifest, VariantManifest(variant=name, status="ok"))
        artifacts.write_table(vdir.samples, artifacts.samples_table(samples_rows(n_s, free, rng, flip_share)))
        free_t, teacher_t = free.table(vocab_text), teacher.table(vocab_text)
        artifacts.write_table(vdir.tokens, free_t)
        artifacts.write_table(vdir.teacher, teacher_t)
        rows[name] = free_t.num_rows
    artifacts.write_json(RunDir(root).run_json, {"run_id": root.name, "reference": "reference", "variants": list(sides)})
    return rows


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1319)
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--topk", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="Runs of the CLI; the median is compared with the target.")
    parser.add_argument("--keep", type=Path, default=None, help="Write the run directory here and keep it.")
    parser.add_argument("--noisy-share", type=float, default=NOISY_SHARE, help="Share of samples the variant perturbs (1 = every position differs).")
    args = parser.parse_args()

    if args.keep:
        root = args.keep.resolve()
        root.mkdir(parents=True, exist_ok=True)
        cleanup = False
    else:
        root = Path(tempfile.mkdtemp(prefix="evalpipe-compare-speed-")) / "bench-run"
        cleanup = True
    try:
        rows, t_build = timed(lambda: build_run(root, args.samples, args.positions, args.topk, args.noisy_share))
        # the command first, while this process holds little memory: a parent holding
        # gigabytes slows the child's start measurably
        cli_runs = [
            timed(
                lambda: subprocess.run(
                    [sys.executable, "-m", "evalpipe", "compare", str(root)], cwd=ROOT, capture_output=True, text=True, check=False
                )
            )
            for _ in range(args.repeats)
        ]
        proc = cli_runs[-1][0]
        cli_times = sorted(t for _, t in cli_runs)
        t_cli = float(np.median(cli_times))
        rd = RunDir(root)
        tables, t_read = timed(
            lambda: {
                name: {kind: artifacts.read_table(getattr(rd.variant(name), kind)) for kind in ("samples", "tokens", "teacher")}
                for name in ("reference", "candidate")
            }
        )
        a, b = tables["reference"], tables["candidate"]
        free, t_free = timed(lambda: compare_tokens(a["tokens"], b["tokens"], a["samples"], b["samples"]))
        teach, t_teacher = timed(lambda: compare_tokens(a["teacher"], b["teacher"], a["samples"], b["samples"]))
    finally:
        if cleanup:
            shutil.rmtree(root.parent, ignore_errors=True)

    (ft,), (tt,) = free.summaries, teach.summaries
    print(f"run: {args.samples} samples x {args.positions} positions x top-{args.topk}, 2 variants"
          + (f" (kept in {root})" if not cleanup else ""))
    print(f"rows per tokens table: reference {rows['reference']}, candidate {rows['candidate']}")
    print(f"{'phase':<34}{'positions':>12}{'seconds':>10}")
    for label, n, secs in (
        ("build + write synthetic run", None, t_build),
        ("read 6 parquet tables", None, t_read),
        ("compare_tokens free-running", ft.n_positions_compared, t_free),
        ("compare_tokens teacher-forced", tt.n_positions_compared, t_teacher),
        ("compare_tokens free + teacher", ft.n_positions_compared + tt.n_positions_compared, t_free + t_teacher),
    ):
        print(f"{label:<34}{'' if n is None else n:>12}{secs:>10.2f}")
    runs = ", ".join(f"{t:.2f}" for t in cli_times)
    print(f"{'evalpipe compare RUN_DIR (CLI)':<34}{'':>12}{t_cli:>10.2f}   median of {runs} s; exit code {proc.returncode}")
    print("  (the CLI reads 6 tables, compares, writes compare.json, report.md, report.html with plots, junit.xml)")
    print(f"CLI wall / {TARGET_S:g} s target: {t_cli / TARGET_S:.2f}"
          f"; in-process free + teacher / target: {(t_free + t_teacher) / TARGET_S:.2f}")
    print(f"free: {ft.n_divergent} divergent ({ft.n_hard_divergences} hard); "
          f"teacher: {getattr(tt, 'n_top1_disagree', 'n/a')} top-1 disagreements, kl_max {tt.kl_max}")
    if proc.returncode not in (0, 1):
        print(proc.stderr.strip()[-2000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
