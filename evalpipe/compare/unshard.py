"""Reassemble the full tensor of one module from what its ranks held, so that two layouts
(a legacy one that gathers, a sequence-parallel one that keeps token shards) are compared
element for element.

The pieces say how they were held (:mod:`evalpipe.probes.capture` names the layouts):
token shards are put back at their rows, head columns at their columns, partial sums are
added up (in float64, in rank order: the reduction's inputs compared, not its rounding),
replicated copies must agree. What cannot be put together -- a rank missing, columns that
overlap or leave a gap, copies that disagree -- is said, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalpipe.documents.captures import CapturedPiece


@dataclass(frozen=True)
class Reassembled:
    rows: np.ndarray  # absolute positions, ascending
    values: np.ndarray  # [rows, width] float64


@dataclass(frozen=True)
class NotReassembled:
    why: str


def reassemble(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    """The full tensor at the captured rows, from the pieces of one module, layer and sequence,
    at scale 1 (a piece held at an output scale is divided by it). The pieces of each forward
    pass (a prefill chunk, a decode step) are reassembled on their own, then their rows
    joined; a row two forward passes computed (a retried request) counts once."""
    if not pieces:
        return NotReassembled("nothing was captured")
    by_forward: dict[tuple[int, int], list[CapturedPiece]] = {}
    for p in pieces:
        by_forward.setdefault((p.entry.batch_start, p.entry.batch_tokens), []).append(p)
    if len(by_forward) == 1:
        return _reassemble_forward(pieces)
    rows: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for (start, tokens), group in sorted(by_forward.items()):
        got = _reassemble_forward(group)
        if isinstance(got, NotReassembled):
            return NotReassembled(f"in the forward pass of positions {start}-{start + tokens - 1}, {got.why}")
        rows.append(got.rows)
        values.append(got.values)
    all_rows = np.concatenate(rows)
    kept, first = np.unique(all_rows, return_index=True)
    return Reassembled(kept, np.concatenate(values)[first])


def _reassemble_forward(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    scales = {p.entry.scale for p in pieces}
    if len(scales) > 1:
        return NotReassembled(f"its pieces are held at several scales ({', '.join(f'{s:g}' for s in sorted(scales))})")
    got = _reassemble(pieces)
    scale = scales.pop()
    if isinstance(got, NotReassembled) or scale == 1.0:
        return got
    return Reassembled(got.rows, got.values / scale)


def _reassemble(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    layouts = {p.entry.layout for p in pieces}
    if len(layouts) > 1:
        return NotReassembled(f"its pieces come in several layouts ({', '.join(sorted(layouts))})")
    layout = layouts.pop()
    pieces = _first_of_each(pieces)
    if layout == "full":
        if len(pieces) > 1:
            return NotReassembled("it was captured by more than one process without a rank")
        return _rows_sorted(pieces[0].entry.rows, pieces[0].values.astype(np.float64))
    world = pieces[0].entry.world
    missing = sorted(set(range(world)) - {p.entry.rank for p in pieces if p.entry.rank is not None})
    if layout == "token_shards":
        return _token_shards(pieces)
    if missing:
        return NotReassembled(f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {world} "
                              "wrote no piece")
    if layout == "replicated":
        return _replicated(pieces)
    if layout == "head_columns":
        return _head_columns(pieces)
    return _partial_sum(pieces)


def _first_of_each(pieces: list[CapturedPiece]) -> list[CapturedPiece]:
    """One piece per (rank, rows): a forward pass seen twice (a retried request) counts once."""
    seen: dict[tuple[int | None, tuple[int, ...]], CapturedPiece] = {}
    for p in pieces:
        seen.setdefault((p.entry.rank, tuple(p.entry.rows)), p)
    return sorted(seen.values(), key=lambda p: (p.entry.rank if p.entry.rank is not None else -1, p.entry.rows))


def _rows_sorted(rows: list[int], values: np.ndarray) -> Reassembled:
    order = np.argsort(np.asarray(rows), kind="stable")
    return Reassembled(np.asarray(rows, dtype=np.int64)[order], values[order])


def _token_shards(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    by_row: dict[int, np.ndarray] = {}
    for p in pieces:
        for i, row in enumerate(p.entry.rows):
            if row in by_row:
                return NotReassembled(f"position {row} is held by more than one rank's shard")
            by_row[row] = p.values[i]
    rows = sorted(by_row)
    return Reassembled(np.asarray(rows, dtype=np.int64), np.stack([by_row[r] for r in rows]).astype(np.float64))


def _same_rows(pieces: list[CapturedPiece]) -> list[int] | None:
    rows = pieces[0].entry.rows
    return rows if all(p.entry.rows == rows for p in pieces) else None


def _replicated(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    rows = _same_rows(pieces)
    if rows is None:
        return NotReassembled("the ranks' copies hold different positions")
    first = pieces[0].values
    for p in pieces[1:]:
        if not np.array_equal(p.values, first):
            return NotReassembled(f"rank {p.entry.rank}'s copy differs from rank {pieces[0].entry.rank}'s "
                                  "(a replicated tensor is not the same on every rank)")
    return _rows_sorted(rows, first.astype(np.float64))


def _head_columns(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    rows = _same_rows(pieces)
    if rows is None:
        return NotReassembled("the ranks' column pieces hold different positions")
    width = pieces[0].entry.width
    out = np.zeros((len(rows), width), dtype=np.float64)
    covered = np.zeros(width, dtype=np.int64)
    for p in pieces:
        columns = np.concatenate([np.arange(a, b) for a, b in p.entry.columns or []] or [np.zeros(0, dtype=np.int64)])
        if len(columns) != p.values.shape[1] or (len(columns) and (columns.min() < 0 or columns.max() >= width)):
            return NotReassembled(f"rank {p.entry.rank}'s columns do not match its piece of {p.values.shape[1]} columns "
                                  f"in a width of {width}")
        out[:, columns] = p.values
        covered[columns] += 1
    if (covered > 1).any():
        return NotReassembled(f"column {int(np.flatnonzero(covered > 1)[0])} is held by more than one rank")
    if (covered == 0).any():
        return NotReassembled(f"column {int(np.flatnonzero(covered == 0)[0])} is held by no rank")
    return _rows_sorted(rows, out)


def _partial_sum(pieces: list[CapturedPiece]) -> Reassembled | NotReassembled:
    rows = _same_rows(pieces)
    if rows is None:
        return NotReassembled("the ranks' partial sums hold different positions")
    total = np.zeros(pieces[0].values.shape, dtype=np.float64)
    for p in pieces:  # rank order
        total += p.values.astype(np.float64)
    return _rows_sorted(rows, total)
