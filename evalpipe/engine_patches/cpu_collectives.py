"""Uneven all-gather and reduce-scatter for vLLM's CPU communicator (``EVALPIPE_CPU_EP=1``).

Expert parallelism's allgather_reducescatter all2all gathers every rank's tokens before
the experts (``all_gatherv``) and sums the experts' outputs back to their ranks after
them (``reduce_scatterv``), with per-rank token counts that differ. vLLM 0.32.0's
``CpuCommunicator`` inherits both from the base class, which raises
NotImplementedError. These implementations use torch.distributed on the
communicator's group (gloo on CPU): the all-gather pads every rank's rows to the
largest count and drops the padding afterwards; the reduce-scatter all-reduces the
whole tensor and keeps this rank's rows. Both are exact (no reordering of a sum beyond
what the all-reduce itself does), neither is fast, which on a model this small does
not matter.
"""

from __future__ import annotations

from typing import Any


def _counts(communicator: Any, rows: int, sizes: list[int] | None) -> list[int]:
    world = communicator.world_size
    if sizes is None:
        return [rows] * world
    if len(sizes) != world:
        raise ValueError(f"sizes has {len(sizes)} entries for a group of {world} ranks")
    return [int(s) for s in sizes]


def all_gatherv(communicator: Any, input_: Any, dim: int = 0, sizes: list[int] | None = None) -> Any:
    """``input_`` (a tensor or a list of tensors) from every rank, concatenated along ``dim``
    in rank order; rank r contributes ``sizes[r]`` rows (all equal when ``sizes`` is None)."""
    if isinstance(input_, (list, tuple)):
        return [_gather_one(communicator, t, dim, sizes) for t in input_]
    return _gather_one(communicator, input_, dim, sizes)


def _gather_one(communicator: Any, tensor: Any, dim: int, sizes: list[int] | None) -> Any:
    import torch
    import torch.distributed as dist

    moved = tensor.movedim(dim, 0).contiguous()
    counts = _counts(communicator, moved.shape[0], sizes)
    mine = counts[communicator.rank_in_group]
    if moved.shape[0] != mine:
        raise ValueError(f"this rank holds {moved.shape[0]} rows, sizes say {mine}")
    widest = max(counts)
    padded = torch.nn.functional.pad(moved, (0, 0) * (moved.dim() - 1) + (0, widest - mine)) if widest > mine else moved
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded, group=communicator.device_group)
    out = torch.cat([piece[:n] for piece, n in zip(pieces, counts)], dim=0)
    return out.movedim(0, dim)


def reduce_scatterv(communicator: Any, input_: Any, dim: int = -1, sizes: list[int] | None = None) -> Any:
    """The sum over ranks of ``input_``, of which this rank keeps its ``sizes[rank]`` rows along
    ``dim`` (equal shares when ``sizes`` is None)."""
    import torch.distributed as dist

    moved = input_.movedim(dim, 0).contiguous()
    world = communicator.world_size
    if sizes is None:
        if moved.shape[0] % world:
            raise ValueError(f"{moved.shape[0]} rows do not split evenly over {world} ranks")
        sizes = [moved.shape[0] // world] * world
    counts = _counts(communicator, moved.shape[0], sizes)
    if sum(counts) != moved.shape[0]:
        raise ValueError(f"sizes sum to {sum(counts)}, the tensor has {moved.shape[0]} rows")
    total = moved.clone()
    dist.all_reduce(total, group=communicator.device_group)
    start = sum(counts[: communicator.rank_in_group])
    mine = total[start:start + counts[communicator.rank_in_group]].contiguous()
    return mine.movedim(0, dim)


def install() -> None:
    """Give vLLM's CpuCommunicator the two methods (only where it still lacks them)."""
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    if CpuCommunicator.all_gatherv is DeviceCommunicatorBase.all_gatherv:
        CpuCommunicator.all_gatherv = all_gatherv  # type: ignore[method-assign,assignment]
    if CpuCommunicator.reduce_scatterv is DeviceCommunicatorBase.reduce_scatterv:
        CpuCommunicator.reduce_scatterv = reduce_scatterv  # type: ignore[method-assign,assignment]
