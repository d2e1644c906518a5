"""What vLLM's CPU build does that evalpipe's changes inside vLLM's processes
(evalpipe/engine_patches) work around and the rotary control shows: a fact of the installed
vLLM, not of one module. The tests of each patch are the modules' own files here; they and
this one fail when an upgrade breaks a patch or makes it unnecessary: then re-check
docs/sp-moe.md."""

from __future__ import annotations

import torch


def _rotary(heads: int, key_heads: int, flat: bool) -> tuple[float, float]:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=4096, is_neox_style=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(6)
    q = torch.randn(6, heads, 64, generator=generator)
    k = torch.randn(6, key_heads, 64, generator=generator)
    q_native, k_native = rope.forward_native(positions, q.clone(), k.clone())
    q_in, k_in = (q.reshape(6, -1).clone(), k.reshape(6, -1).clone()) if flat else (q.clone(), k.clone())
    q_op, k_op = rope.forward_cpu(positions, q_in, k_in)
    return (float((q_op.reshape(q.shape) - q_native).abs().max()), float((k_op.reshape(k.shape) - k_native).abs().max()))


def test_the_cpu_rotary_op_mis_rotates_a_3d_multi_head_query():
    """What configs/rotary_control.yaml shows on the model: MLA hands vLLM's CPU rotary op its
    query as [tokens, heads, 64]; with more than one head the op rotates it wrongly (the same
    values as [tokens, heads x 64] come out right). When an upgrade fixes the op, this fails:
    the control's expected verdict changes (docs/sp-moe.md)."""
    assert _rotary(1, 1, flat=False) == (0.0, 0.0)
    assert _rotary(2, 1, flat=True) == (0.0, 0.0)
    q_error, k_error = _rotary(2, 1, flat=False)
    assert q_error > 0.5 and k_error == 0.0, (q_error, k_error)
