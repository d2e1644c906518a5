"""The token layout of sequence-parallel MoE models at DP > 1 with expert parallelism
(``EVALPIPE_SP_MOE``).

vLLM decides it in one property, ``ParallelConfig.use_sequence_parallel_moe``: true with
DP > 1, TP > 1, expert parallelism and the allgather_reducescatter all2all (the only
one the CPU build has). Then ``DeepseekV2DecoderLayer`` keeps each MoE layer's tokens
sharded over the TP ranks, all-gathers them before attention and reduce-scatters after
it; otherwise the tokens are replicated over TP and attention's output is all-reduced.
``replicated`` makes the property false in every engine process: the same DP/TP/EP and
the same experts, the other layout — the legacy side of the mission's A/B on vLLM's own
layer code.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap

from evalpipe.errors import UserError


def install_replicated() -> None:
    from vllm.config.parallel import ParallelConfig

    def use_sequence_parallel_moe(self) -> bool:  # noqa: ANN001
        return False

    use_sequence_parallel_moe.__evalpipe_patch__ = True  # type: ignore[attr-defined]
    ParallelConfig.use_sequence_parallel_moe = property(use_sequence_parallel_moe)  # type: ignore[method-assign,assignment]


# The fix ``fixed`` applies to vLLM's deepseek_v2.py (see docs/sp-moe.md): whether the
# hidden states between two decoder layers are a TP shard is decided by the model's
# structure (the layer before is a sequence-parallel MoE layer). vLLM 0.32.0 infers it
# from the row count instead, and a TP shard of a one-token batch has as many rows as the
# whole batch (ceil(1 / TP) = 1). With one token on a DP rank, the second SP MoE layer
# then takes its shard for the full batch, so TP rank 1 attends to a padding row, and
# the model's end skips the all-gather, so TP rank 1 computes its share of the
# vocabulary's logits from a padding row too.
EDITS: dict[str, tuple[tuple[str, str], ...]] = {
    "DeepseekV2DecoderLayer.forward": (
        ("and hidden_states.shape[0] != full_num_tokens",
         "and self.evalpipe_input_is_sequence_parallel"),
    ),
    "DeepseekV2Model.forward": (
        ("hidden_states.shape[0] != positions.shape[0] and not layer.use_sequence_parallel_moe",
         "layer.evalpipe_input_is_sequence_parallel and not layer.use_sequence_parallel_moe"),
        ("if hidden_states.shape[0] != positions.shape[0]:",
         "if self.layers[self.end_layer - 1].use_sequence_parallel_moe:"),
    ),
}


class SourceChanged(UserError):
    """vLLM's source no longer holds the text a patch replaces: the patch needs a look."""


def edited_source(qualname: str, source: str) -> str:
    """``source`` of ``qualname`` with :data:`EDITS` applied, each found exactly once (a run of
    white space in an edit matches any run of white space: the edits do not depend on
    how vLLM breaks its lines; each replacement is one line, inside brackets or a
    condition)."""
    for old, new in EDITS[qualname]:
        pattern = re.compile(r"\s+".join(re.escape(word) for word in old.split()))
        found = list(pattern.finditer(source))
        if len(found) != 1:
            raise SourceChanged(f"{qualname} no longer contains {old!r} exactly once (the fix was written for "
                                "vLLM 0.32.0); re-check docs/sp-moe.md against this vLLM")
        source = source[:found[0].start()] + new + source[found[0].end():]
    return source


def input_is_sequence_parallel(vllm_config, layer_idx: int) -> bool:  # noqa: ANN001
    """True when decoder layer ``layer_idx - 1`` is an SP MoE layer, so its output (the input
    of ``layer_idx``) is a TP shard; decided as vLLM decides ``use_sequence_parallel_moe``
    of a layer."""
    config = vllm_config.model_config.hf_config
    parallel = vllm_config.parallel_config
    before = layer_idx - 1
    return bool(
        parallel.use_sequence_parallel_moe
        and parallel.pipeline_parallel_size == 1
        and before >= 0
        and config.n_routed_experts is not None
        and before >= config.first_k_dense_replace
        and before % getattr(config, "moe_layer_freq", 1) == 0
    )


def install_fixed() -> None:
    from vllm.model_executor.models import deepseek_v2

    layer_class = deepseek_v2.DeepseekV2DecoderLayer
    if getattr(layer_class.forward, "__evalpipe_patch__", False):
        return
    for qualname in EDITS:
        owner = getattr(deepseek_v2, qualname.split(".")[0])
        original = owner.forward
        source = edited_source(qualname, textwrap.dedent(inspect.getsource(original)))
        namespace: dict = {}
        exec(compile(source, f"<evalpipe fix of {qualname}>", "exec"), deepseek_v2.__dict__, namespace)  # noqa: S102
        forward = functools.wraps(original)(namespace["forward"])
        forward.__evalpipe_patch__ = True  # type: ignore[attr-defined]
        owner.forward = forward
    original_init = layer_class.__init__

    @functools.wraps(original_init)
    def __init__(self, vllm_config, *args, **kwargs):  # noqa: ANN001, ANN202, N807
        original_init(self, vllm_config, *args, **kwargs)
        self.evalpipe_input_is_sequence_parallel = input_is_sequence_parallel(vllm_config, self.layer_idx)

    layer_class.__init__ = __init__  # type: ignore[method-assign]
