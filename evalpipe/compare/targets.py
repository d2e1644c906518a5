"""What `evalpipe localize` looks at: the sequences where the variant's teacher-forced
logprobs part most from the reference's, and a bounded set of positions in each.

A sequence is the reference's own (prompt + continuation), so every configuration
prefills exactly the same tokens. Its divergence is the largest |Δlogprob| of the forced
token over its teacher-forced positions. The positions kept (rows of the hidden states):

- the K worst teacher-forced positions: the logprob of token p comes from the hidden
  state at p - 1, so that is the row kept;
- around every shard boundary of the configured tensor-parallel sizes (the last token of
  one shard and the first of the next) and sparse-block boundary;
- the last prompt token and the sequence's last token (next to any padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from evalpipe.rundir.sequences import ReferenceSequence, shard_boundaries

KEY = ("task", "doc_id", "repeat")


@dataclass(frozen=True)
class Target:
    label: str
    key: tuple[str, int, int]
    token_ids: list[int]
    prompt_len: int
    divergence: float  # the largest teacher-forced |Δlogprob|
    rows: dict[int, list[str]] = field(default_factory=dict)  # position -> why it is kept


def _per_position(table: pa.Table) -> dict[tuple[str, int, int, int], float]:
    cols = table.select([*KEY, "pos", "logprob"]).to_pydict()
    return {(t, int(d), int(r), int(p)): float(lp)
            for t, d, r, p, lp in zip(cols["task"], cols["doc_id"], cols["repeat"], cols["pos"], cols["logprob"])}


def teacher_divergence(reference: pa.Table, variant: pa.Table) -> dict[tuple[str, int, int], list[tuple[int, float]]]:
    """Per sequence, (pos, |Δlogprob|) at every position both sides scored (pos counts from
    the continuation's first token, as teacher.parquet does)."""
    a, b = _per_position(reference), _per_position(variant)
    out: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for key in sorted(a.keys() & b.keys()):
        d = abs(b[key] - a[key])
        out.setdefault(key[:3], []).append((key[3], d if np.isfinite(d) else float("inf")))
    return out


def choose_targets(sequences: list[ReferenceSequence], reference: pa.Table, variant: pa.Table, *, samples: int,
                   positions: int, tp_sizes: tuple[int, ...] = (), sparse_block: int | None = None,
                   decode_steps: int = 0) -> list[Target]:
    """The ``samples`` most divergent sequences with their kept rows (at most ``positions``
    worst ones plus the boundary rows, and the first ``decode_steps`` generated tokens'
    rows, which a decode-mode localize computes one forward pass each)."""
    divergence = teacher_divergence(reference, variant)
    ranked = sorted(
        (s for s in sequences if (s.task, s.doc_id, s.repeat) in divergence),
        key=lambda s: (-max(d for _, d in divergence[(s.task, s.doc_id, s.repeat)]), s.task, s.doc_id, s.repeat),
    )
    targets = []
    for seq in ranked[:samples]:
        key = (seq.task, seq.doc_id, seq.repeat)
        tokens = seq.prompt_token_ids + seq.continuation_ids
        n_prompt, total = len(seq.prompt_token_ids), len(tokens)
        rows: dict[int, list[str]] = {}

        def keep(row: int, why: str, rows: dict[int, list[str]] = rows, total: int = total) -> None:
            if 0 <= row < total and why not in rows.setdefault(row, []):
                rows[row].append(why)

        worst = sorted(divergence[key], key=lambda pd: (-pd[1], pd[0]))[:positions]
        for pos, d in worst:
            if d > 0:
                keep(n_prompt + pos - 1, f"teacher-forced |Δlogprob| {d:.3g} at position {n_prompt + pos}")
        for tp in sorted(set(tp_sizes)):
            for edge in shard_boundaries(total, tp):
                keep(edge - 1, f"last token of a shard (T = {tp})")
                keep(edge, f"first token of a shard (T = {tp})")
        if sparse_block:
            for edge in range(sparse_block, total, sparse_block):
                keep(edge - 1, f"last token of a sparse block ({sparse_block})")
                keep(edge, f"first token of a sparse block ({sparse_block})")
        keep(n_prompt - 1, "last prompt token")
        for step in range(decode_steps):
            keep(n_prompt + step, f"decode step {step + 1} (one token per forward pass)")
        keep(total - 1, "last token")
        targets.append(Target(
            label=f"{seq.task} doc {seq.doc_id}" + (f" repeat {seq.repeat}" if seq.repeat else ""),
            key=key, token_ids=tokens, prompt_len=n_prompt,
            divergence=max(d for _, d in divergence[key]), rows=dict(sorted(rows.items())),
        ))
    return targets
