"""Captured pieces as localize reads them, built by hand (tests/compare/test_localize.py,
tests/compare/test_unshard.py)."""

from __future__ import annotations

import numpy as np

from evalpipe.documents.captures import CapturedPiece, CaptureEntry

WIDTH = 8


def piece(values, *, module="attn.out", layer=0, layout="full", rank=None, world=1, rows=None, seq=0, shard_rows=None,
          columns=None, width=WIDTH, start=0, tokens=16, scale=1.0) -> CapturedPiece:
    values = np.asarray(values, dtype=np.float32)
    rows = list(range(len(values))) if rows is None else rows
    entry = CaptureEntry(sequence=seq, label=f"t doc {seq}", module=module, layer=layer, layout=layout, rank=rank,
                         world=world, rows=rows, batch_start=start, batch_tokens=tokens, shard_rows=shard_rows,
                         columns=columns, width=width, scale=scale, shape=values.shape, offset=0, pid=1)
    return CapturedPiece(entry, values)


def full_tensor(rows=4, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, WIDTH)).astype(np.float32)
