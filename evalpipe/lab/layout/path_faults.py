"""Where the path-specific faults act (evalpipe.lab.layout.faults.PATH_FAULTS): the rows of a
forward pass that belong to the engine path each one lives in, read from the pass's positions
alone (torch only: tested without vLLM)."""

from __future__ import annotations

import torch

from evalpipe.lab.layout.faults import FAR_POSITION


def path_fault_rows(faults: frozenset[str], positions: torch.Tensor) -> torch.Tensor | None:
    """The rows of a forward pass a path-specific fault acts on (a boolean mask), None for none.
    A request's tokens sit in the pass as a run of consecutive positions: a run longer than one
    token that starts past position 0 is a prefill continuing what the engine computed before."""
    n = positions.shape[0]
    mask = torch.zeros(n, dtype=torch.bool, device=positions.device)
    if "lone_decode_error" in faults and n == 1:
        mask[:] = True
    if "far_position_error" in faults:
        mask |= positions >= FAR_POSITION
    if "continued_prefill_error" in faults and n > 1:
        starts = torch.ones(n, dtype=torch.bool, device=positions.device)
        starts[1:] = positions[1:] != positions[:-1] + 1
        run_id = torch.cumsum(starts.long(), 0) - 1
        first = positions[starts]
        length = torch.bincount(run_id, minlength=int(first.shape[0]))
        mask |= ((first > 0) & (length > 1))[run_id]
    return mask if bool(mask.any()) else None
