"""evalpipe/engine_patches/sp_moe.py: the SP-MoE fix still applies to the installed vLLM's source (and says so when it no longer does), and which layer's input is a shard."""

from __future__ import annotations

import inspect
import textwrap
from types import SimpleNamespace

import pytest

from evalpipe.engine_patches import sp_moe


def test_the_sp_moe_fix_still_applies_to_vllms_source():
    from vllm.model_executor.models import deepseek_v2

    for qualname, edits in sp_moe.EDITS.items():
        source = textwrap.dedent(inspect.getsource(getattr(deepseek_v2, qualname.split(".")[0]).forward))
        fixed = sp_moe.edited_source(qualname, source)
        for _old, new in edits:
            assert new in fixed
        compile(fixed, qualname, "exec")
    with pytest.raises(sp_moe.SourceChanged, match="no longer contains"):
        sp_moe.edited_source("DeepseekV2DecoderLayer.forward", "def forward(self):\n    return 1\n")


def _config(layer_sp: bool, pp: int = 1):
    hf = SimpleNamespace(n_routed_experts=8, first_k_dense_replace=1, moe_layer_freq=1)
    parallel = SimpleNamespace(use_sequence_parallel_moe=layer_sp, pipeline_parallel_size=pp)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf), parallel_config=parallel)


def test_a_layers_input_is_a_shard_exactly_after_an_sp_moe_layer():
    on = _config(True)
    assert [sp_moe.input_is_sequence_parallel(on, i) for i in range(4)] == [False, False, True, True]
    assert not any(sp_moe.input_is_sequence_parallel(_config(False), i) for i in range(4))
    assert not any(sp_moe.input_is_sequence_parallel(_config(True, pp=2), i) for i in range(4))
