"""Where the path-specific faults act (evalpipe.lab.layout.faults.PATH_FAULTS): the rows of a
forward pass that belong to the engine path each one lives in, read from the pass's positions
alone (torch only: tested without vLLM)."""

from __future__ import annotations

import torch

from evalpipe.lab.layout.faults import FAR_POSITION


def path_fault_rows(
    faults: frozenset[str], positions: torch.Tensor, chunk_tokens: int, recomputed: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The rows of a forward pass a path-specific fault acts on (a boolean mask), None for none.
    A request's tokens sit in the pass as a run of consecutive positions: a run longer than one
    token that starts past position 0 is a prefill continuing what the engine computed before,
    either the next chunk of a prompt longer than the budget (it starts at a multiple of
    ``chunk_tokens``) or the rest of a prompt whose start the prefix cache held (it starts at a
    whole KV block elsewhere; a cached prefix of a whole number of chunks reads as a chunk). A
    recompute after preemption looks like any prefill: ``recomputed`` marks its rows, as the
    scheduler told the model runner (evalpipe.lab.layout.resumed)."""
    n = positions.shape[0]
    mask = torch.zeros(n, dtype=torch.bool, device=positions.device)
    if "lone_decode_error" in faults and n == 1:
        mask[:] = True
    if "far_position_error" in faults:
        mask |= positions >= FAR_POSITION
    if "recompute_error" in faults and recomputed is not None:
        mask |= recomputed
    continued = {"cached_prefix_error", "chunk_continuation_error"} & faults
    if continued and n > 1:
        starts = torch.ones(n, dtype=torch.bool, device=positions.device)
        starts[1:] = positions[1:] != positions[:-1] + 1
        run_id = torch.cumsum(starts.long(), 0) - 1
        first = positions[starts]
        length = torch.bincount(run_id, minlength=int(first.shape[0]))
        resumed = (first > 0) & (length > 1)
        at_chunk = first % chunk_tokens == 0
        if "chunk_continuation_error" in faults:
            mask |= (resumed & at_chunk)[run_id]
        if "cached_prefix_error" in faults:
            mask |= (resumed & ~at_chunk)[run_id]
    return mask if bool(mask.any()) else None
