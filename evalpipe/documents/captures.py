"""The tensor captures `evalpipe localize` asks the engine for: written inside the engine's
processes by :mod:`evalpipe.probes.capture` (``<pid>.jsonl`` + ``<pid>.bin`` per process),
read here into typed pieces with their floats.

One line per stored piece: which watched sequence, module and layer it comes from, which
rank of how many held it and in which layout, the absolute positions of its rows, and where
its float32 values sit in the process's ``.bin`` file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import numpy as np

from evalpipe.documents.base import Document, validated
from evalpipe.errors import UserError

CAPTURE_VERSION: Final = 1  # evalpipe.probes.capture.CAPTURE_VERSION (standard library side)
Layout = Literal["full", "replicated", "token_shards", "head_columns", "partial_sum"]


class CaptureEntry(Document):
    version: Literal[1] = CAPTURE_VERSION
    sequence: int
    label: str
    module: str
    layer: int
    layout: Layout
    rank: int | None = None
    world: int = 1
    rows: list[int]  # absolute positions of the stored rows
    batch_start: int  # the forward pass's first position (a chunked prefill has several)
    batch_tokens: int
    shard_rows: int | None = None  # token_shards: rows per rank
    columns: list[tuple[int, int]] | None = None  # head_columns: runs [start, stop) of the full width
    width: int  # the full tensor's width
    scale: float = 1.0  # the model holds this tensor at this factor: the comparison divides it out
    shape: tuple[int, int]
    offset: int
    dtype: Literal["float32"] = "float32"
    pid: int


@dataclass(frozen=True)
class CapturedPiece:
    entry: CaptureEntry
    values: np.ndarray  # [len(entry.rows), entry.shape[1]] float32


def read_captures(directory: Path) -> list[CapturedPiece]:
    """Every piece the processes wrote under ``directory`` (none: an empty list)."""
    pieces: list[CapturedPiece] = []
    for index in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        data = index.with_suffix(".bin").read_bytes() if index.with_suffix(".bin").is_file() else b""
        for number, line in enumerate(index.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{index}:{number}"
            try:
                raw = json.loads(line)
            except ValueError as err:
                raise UserError(f"{where} is not a JSON line ({err}); run `evalpipe localize` again.") from None
            if not isinstance(raw, dict) or raw.get("version") != CAPTURE_VERSION:
                version = raw.get("version") if isinstance(raw, dict) else None
                raise UserError(f"{where} is a capture of version {version!r}; this evalpipe reads version "
                                f"{CAPTURE_VERSION}: run `evalpipe localize` again.")
            entry = validated(CaptureEntry, raw, where, "run `evalpipe localize` again")
            count = entry.shape[0] * entry.shape[1]
            end = entry.offset + 4 * count
            if end > len(data) or entry.shape[0] != len(entry.rows):
                raise UserError(f"{where} points past the end of {index.with_suffix('.bin').name} or does not match "
                                "its rows (the engine stopped while writing?); run `evalpipe localize` again.")
            values = np.frombuffer(data, dtype="<f4", count=count, offset=entry.offset).reshape(entry.shape)
            pieces.append(CapturedPiece(entry, values))
    return pieces
