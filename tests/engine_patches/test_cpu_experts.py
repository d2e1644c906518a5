"""evalpipe/engine_patches/cpu_experts.py: with expert parallelism on CPU, a token routed to another rank's expert weighs nothing here."""

from __future__ import annotations

import torch

from evalpipe.engine_patches import cpu_experts


def test_routing_to_other_ranks_experts_weighs_nothing():
    expert_map = torch.tensor([-1, -1, 0, 1, -1, -1, -1, -1], dtype=torch.int32)  # this rank: experts 2, 3
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3]])
    ids = torch.tensor([[3, 5], [0, 2]], dtype=torch.int32)
    local_weights, local_ids = cpu_experts.localize_routing(weights, ids, expert_map)
    assert local_ids.dtype == ids.dtype
    assert local_ids.tolist() == [[1, 0], [0, 0]]
    assert torch.equal(local_weights, torch.tensor([[0.6, 0.0], [0.0, 0.3]]))
