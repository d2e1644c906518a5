"""Expert parallelism in vLLM's CPU fused-MoE experts (``EVALPIPE_CPU_EP=1``).

Under expert parallelism a rank holds only its local experts' weights, and the router's
top-k ids are global; ``expert_map`` (global id -> local index, -1 elsewhere) says which
are local. vLLM 0.32.0's ``CPUUnquantizedExperts.apply`` passes the global ids to the
kernel unchanged, which then reads weights past the rank's own (a SIGSEGV in
cpu_fused_moe.cpp, or silently another expert's weights). The fix maps the ids to local
indexes and gives the slots of other ranks' experts weight 0: those rows add exactly
nothing here, and the rank that holds the expert adds them in the reduce-scatter that
follows.
"""

from __future__ import annotations

import functools
from typing import Any


def localize_routing(topk_weights: Any, topk_ids: Any, expert_map: Any) -> tuple[Any, Any]:
    """(weights, local ids): other ranks' experts get weight 0 and local index 0."""
    import torch

    local = expert_map[topk_ids.long()]
    here = local >= 0
    weights = torch.where(here, topk_weights, torch.zeros_like(topk_weights))
    ids = torch.where(here, local, torch.zeros_like(local)).to(topk_ids.dtype)
    return weights, ids


def install() -> None:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    original = CPUUnquantizedExperts.apply
    if getattr(original, "__evalpipe_patch__", False):
        return

    @functools.wraps(original)
    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,  # noqa: ANN001, ANN202
              global_num_experts, expert_map, *rest, **kwargs):
        if expert_map is not None:
            topk_weights, topk_ids = localize_routing(topk_weights, topk_ids, expert_map)
        return original(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                        global_num_experts, expert_map, *rest, **kwargs)

    apply.__evalpipe_patch__ = True  # type: ignore[attr-defined]
    CPUUnquantizedExperts.apply = apply  # type: ignore[method-assign]
