"""Tensor-parallel collectives of T virtual ranks, emulated in one process with plain torch.

A rank's data is one tensor of a Python list indexed by rank. The functions reproduce the
*data movement and the summation order* of the real collectives, because the summation
order is the only way a layout change shows up in fp32 numerics: a sum of T partial
products rounds differently when its operands are associated differently. They do not
reproduce the communication itself.

Token layout: a batch of ``n`` tokens is padded to ``T * ceil(n / T)`` rows and cut into T
contiguous shards of ``ceil(n / T)`` rows; rank r owns rows ``[r*s, (r+1)*s)``. Padding is
always at the end of the batch, so it sits in the last shard(s).

Heads: the attention heads are cut into T groups as evenly as possible, the first
``num_heads % T`` groups one head larger (6 heads on 4 ranks: 2, 2, 1, 1).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

Tensor = torch.Tensor


class ShardMismatch(RuntimeError):
    """A rank's shard does not sit where the batch size and the rank count say it must."""


# ----------------------------------------------------------------------------- geometry


def shard_size(num_tokens: int, world: int) -> int:
    if world < 1:
        raise ValueError(f"the number of ranks must be at least 1; got {world}")
    return max(1, math.ceil(num_tokens / world))


def padded_len(num_tokens: int, world: int) -> int:
    return shard_size(num_tokens, world) * world


def valid_rows(num_tokens: int, offset: int, size: int) -> int:
    """How many of a shard's ``size`` rows starting at ``offset`` are real tokens."""
    return max(0, min(size, num_tokens - offset))


def head_groups(num_heads: int, world: int) -> list[range]:
    """Contiguous head ranges per rank, as even as possible, larger groups first."""
    if not 1 <= world <= num_heads:
        raise ValueError(
            f"cannot split {num_heads} attention heads over {world} ranks; the rank count must be between 1 and {num_heads}"
        )
    base, extra = divmod(num_heads, world)
    groups, start = [], 0
    for r in range(world):
        size = base + (1 if r < extra else 0)
        groups.append(range(start, start + size))
        start += size
    return groups


def strided_head_groups(num_heads: int, world: int) -> list[range]:
    """Rank r gets heads r, r+T, r+2T, ...: the same group sizes as ``head_groups`` but an
    interleaved assignment, i.e. what a ``view(tokens, heads/T, T)`` produces where the
    layout expects ``view(tokens, T, heads/T)``."""
    head_groups(num_heads, world)  # same validation
    return [range(r, num_heads, world) for r in range(world)]


def head_columns(heads: range, head_dim: int) -> Tensor:
    """Column indices of the given heads in a ``[tokens, heads * head_dim]`` tensor."""
    idx = torch.tensor(list(heads), dtype=torch.long)
    return (idx[:, None] * head_dim + torch.arange(head_dim)[None, :]).reshape(-1)


# ----------------------------------------------------------------------------- padding


def pad_rows(x: Tensor, rows: int, mode: str = "zeros") -> Tensor:
    """Extend ``x`` to ``rows`` rows. ``replicate`` repeats the last row, which is what a
    reused buffer typically holds there (and is never all zeros by accident)."""
    n = x.shape[0]
    if rows < n:
        raise ValueError(f"cannot pad {n} rows down to {rows}")
    if rows == n:
        return x
    if mode == "zeros":
        fill = x.new_zeros((rows - n, *x.shape[1:]))
    elif mode == "replicate":
        fill = x[-1:].expand(rows - n, *x.shape[1:])
    else:
        raise ValueError(f"unknown padding mode {mode!r}; known: zeros, replicate")
    return torch.cat([x, fill], dim=0)


def unpad(x: Tensor, num_tokens: int) -> Tensor:
    return x[:num_tokens]


def zero_padding(shard: Tensor, valid: int) -> Tensor:
    """The shard with rows from ``valid`` on set to zero (a copy: the input may share storage
    with the residual)."""
    if valid >= shard.shape[0]:
        return shard
    out = shard.clone()
    out[valid:] = 0
    return out


# ----------------------------------------------------------------------------- shards


def take_shard(padded: Tensor, offset: int, size: int) -> Tensor:
    """Rows ``[offset, offset + size)`` of the padded batch; rows past its end repeat the last
    row (a read beyond the buffer returns whatever is there)."""
    part = padded[offset : offset + size]
    if part.shape[0] == size:
        return part
    return torch.cat([part, padded[-1:].expand(size - part.shape[0], *padded.shape[1:])], dim=0)


def split_shards(padded: Tensor, world: int) -> list[Tensor]:
    if padded.shape[0] % world:
        raise ValueError(f"{padded.shape[0]} rows do not split into {world} equal shards")
    return list(padded.chunk(world, dim=0)) if padded.shape[0] else [padded] * world


def check_shard(*, rank: int, offset: int, rows: int, num_tokens: int, world: int) -> None:
    """The input check of the pass-through layout: a rank's shard must start at
    ``rank * ceil(n / T)``, hold ``ceil(n / T)`` rows, and the T shards must cover the padded
    batch exactly. Raises ShardMismatch naming the first disagreement."""
    expected_rows = shard_size(num_tokens, world)
    expected_offset = rank * expected_rows
    problems = []
    if rows != expected_rows:
        problems.append(f"holds {rows} rows, expected ceil({num_tokens}/{world}) = {expected_rows}")
    if rows * world != padded_len(num_tokens, world):
        problems.append(f"{world} shards of {rows} rows do not make the padded batch of {padded_len(num_tokens, world)}")
    if offset != expected_offset:
        problems.append(f"starts at token {offset}, expected {rank} * {expected_rows} = {expected_offset}")
    if problems:
        raise ShardMismatch(
            f"sequence-parallel shard of rank {rank}/{world} does not match the batch of {num_tokens} tokens: "
            + "; ".join(problems)
        )


# ----------------------------------------------------------------------------- collectives


def all_gather(shards: Sequence[Tensor]) -> Tensor:
    """Every rank ends up with the concatenation of all shards in rank order."""
    return torch.cat(list(shards), dim=0)


def scatter(full: Tensor, world: int) -> list[Tensor]:
    """The inverse of ``all_gather``: rank r keeps its own shard."""
    return split_shards(full, world)


def all_to_all(shards: Sequence[Tensor], columns: Sequence[Tensor]) -> list[Tensor]:
    """``[local tokens, all heads]`` on every rank -> ``[all tokens, own heads]``.

    Rank r sends the columns ``columns[d]`` of its shard to rank d; rank d stacks what it
    receives in sender order, so its rows are the tokens of the whole padded batch."""
    return [torch.cat([shard.index_select(1, cols) for shard in shards], dim=0) for cols in columns]


def _accumulate(terms: Sequence[Tensor], acc_dtype: torch.dtype | None) -> Tensor:
    out = terms[0] if acc_dtype is None else terms[0].to(acc_dtype)
    for t in terms[1:]:
        out = out + (t if acc_dtype is None else t.to(acc_dtype))
    return out


def reduce_rank_order(partials: Sequence[Tensor], acc_dtype: torch.dtype | None = None) -> Tensor:
    """Sum over ranks, left to right: ``((p0 + p1) + p2) + ...``. The result is in
    ``acc_dtype`` (default: the partials' dtype)."""
    return _accumulate(partials, acc_dtype)


def reduce_random_order(partials: Sequence[Tensor], generator: torch.Generator) -> Tensor:
    """Sum over ranks in a random order drawn per row (per token): what a collective whose
    summation order depends on arrival times does, with no order shared by the tokens of
    a batch (an order shared by a whole forward would tie the noise of every sequence in
    it together)."""
    stacked = torch.stack(list(partials))  # [ranks, rows, cols]
    ranks, rows = stacked.shape[:2]
    order = torch.argsort(torch.rand(ranks, rows, generator=generator), dim=0)
    gathered = stacked.gather(0, order.to(stacked.device)[..., None].expand_as(stacked))
    return _accumulate(list(gathered.unbind(0)), None)


def reduce_scatter_ring(partials: Sequence[Tensor], acc_dtype: torch.dtype | None = None) -> list[Tensor]:
    """Ring reduce_scatter: rank j's shard is accumulated as it travels the ring, starting at
    rank j+1 and ending at rank j: ``((p[j+1] + p[j+2]) + ...) + p[j]``, restricted to
    shard j's rows. Results are in ``acc_dtype`` (default: the partials' dtype)."""
    world = len(partials)
    chunks = [split_shards(p, world) for p in partials]
    return [_accumulate([chunks[(j + k) % world][j] for k in range(1, world + 1)], acc_dtype) for j in range(world)]


def reduce_scatter_tree(partials: Sequence[Tensor], acc_dtype: torch.dtype | None = None) -> list[Tensor]:
    """reduce_scatter with a pairwise (recursive halving) summation order: ``(p0 + p1) + (p2
    + p3)``; an odd rank out is carried to the next level."""
    world = len(partials)
    level = [p if acc_dtype is None else p.to(acc_dtype) for p in partials]
    while len(level) > 1:
        paired = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return split_shards(level[0], world)


def all_reduce(partials: Sequence[Tensor]) -> list[Tensor]:
    """Every rank ends up with the rank-order sum."""
    total = reduce_rank_order(partials)
    return [total for _ in partials]


def fold_into_batch(padded: Tensor, num_tokens: int) -> Tensor:
    """The padded rows of all ranks folded back into the ``num_tokens`` rows of the batch.

    Real rows land on their own token; padding rows land on the last real token, the way a
    padded index buffer (slot mapping, positions) repeats its last entry. The scatter-add
    is exact only when the padding rows are zero, which the pass-through layout's input
    check guarantees by zeroing them."""
    index = torch.arange(padded.shape[0], device=padded.device).clamp_(max=max(num_tokens - 1, 0))
    out = padded.new_zeros((num_tokens, *padded.shape[1:]))
    return out.index_add_(0, index, padded)
