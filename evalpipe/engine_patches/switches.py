"""The environment switches of evalpipe's engine patches, and what each stands for.

Pure Python (no torch, no vLLM): the planner validates a variant's values with
:func:`check_env` before any engine starts (the layout model's switches too), and doctor
lists :data:`PATCHES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# CPU gaps of vLLM's expert parallelism, worked around (both or neither: the second gap
# only shows once the first is closed).
CPU_EP_ENV = "EVALPIPE_CPU_EP"
# The layout of a DeepSeek-V2-family MoE layer's tokens over the TP ranks at DP > 1 with
# expert parallelism: vLLM's own choice ("vllm": sequence-parallel MoE, all-gather before
# attention and reduce-scatter after it), or tokens replicated over TP with an all-reduce
# after attention ("replicated": what vLLM runs when SP MoE is not used), at the same
# DP/TP/EP. No engine argument switches this on CPU; see docs/sp-moe.md.
SP_MOE_ENV = "EVALPIPE_SP_MOE"
SP_MOE_VALUES = ("vllm", "replicated", "fixed")

# The reference layout model's switches (evalpipe/lab/layout, evalpipe's other code inside
# vLLM's processes): which layout it runs, and which faults of its zoo are on. The names
# are the zoo's (lab/layout/faults.py; a test keeps the two equal): the planner refuses an
# unknown one before any engine starts, the model when it is built.
LAYOUT_ENV = "EVALPIPE_LAYOUT"
LAYOUTS = ("legacy", "sp")
LAYOUT_FAULT_ENV = "EVALPIPE_LAYOUT_FAULT"
LAYOUT_FAULT_NAMES = (
    "shard_offset", "shard_offset_checked", "double_reduce", "heads_permuted", "scale_after_reduce",
    "padding_not_zeroed", "residual_not_rescaled", "tree_reduce", "reduce_fp64", "reduce_bf16",
    "nondeterministic_reduce", "hang", "sp_fallback", "subtle_last_layer_boundary",
    "attn_out_error_1e-1", "attn_out_error_1e-2", "attn_out_error_1e-3", "attn_out_error_1e-4", "attn_out_error_1e-5",
    "lone_decode_error", "cached_prefix_error", "chunk_continuation_error", "far_position_error",
    "recompute_error",
)

ON_VALUES = ("1", "on", "true")
OFF_VALUES = ("", "0", "off", "false")


@dataclass(frozen=True)
class Patch:
    """One change to vLLM: what it changes, why, for which version, asked for by which switch."""

    name: str
    switch: str
    target: str  # the vLLM object it replaces or adds to
    reason: str
    written_for: str  # the vLLM version it was written and tested against
    upstream: str  # where upstream tracks it


VLLM_VERSION = "0.32.0"

PATCHES: tuple[Patch, ...] = (
    Patch(
        name="cpu_all_gatherv",
        switch=f"{CPU_EP_ENV}=1",
        target="vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator.all_gatherv/reduce_scatterv",
        reason="the CPU communicator has no uneven all-gather / reduce-scatter, which expert parallelism "
               "(the allgather_reducescatter all2all) calls on every MoE layer",
        written_for=VLLM_VERSION,
        upstream="https://github.com/vllm-project/vllm/issues/57837 (expert parallel on CPU not functional)",
    ),
    Patch(
        name="cpu_experts_expert_map",
        switch=f"{CPU_EP_ENV}=1",
        target="vllm.model_executor.layers.fused_moe.experts.cpu_moe.CPUUnquantizedExperts.apply",
        reason="the CPU fused-MoE kernel ignores expert_map and indexes a rank's local expert weights "
               "with global expert ids (out of bounds under expert parallelism)",
        written_for=VLLM_VERSION,
        upstream="https://github.com/vllm-project/vllm/issues/57837 (expert parallel on CPU not functional)",
    ),
    Patch(
        name="sp_moe_replicated",
        switch=f"{SP_MOE_ENV}=replicated",
        target="vllm.config.parallel.ParallelConfig.use_sequence_parallel_moe",
        reason="stands for the legacy layout of the mission's A/B: sequence-parallel MoE off at the "
               "same DP/TP/EP, which no engine argument selects on CPU",
        written_for=VLLM_VERSION,
        upstream="none (an evalpipe switch, not a workaround)",
    ),
    Patch(
        name="sp_moe_fixed",
        switch=f"{SP_MOE_ENV}=fixed",
        target="vllm.model_executor.models.deepseek_v2.DeepseekV2DecoderLayer.forward, DeepseekV2Model.forward",
        reason="a fix of vLLM's own: whether hidden states are a TP shard is read from the row count, which "
               "cannot tell a one-token batch from its shard (docs/sp-moe.md)",
        written_for=VLLM_VERSION,
        upstream="docs/sp-moe.md (bug report with a minimal reproduction)",
    ),
)


def parse_bool(name: str, raw: str | None) -> bool:
    value = (raw or "").strip().lower()
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(f"{name}={raw!r} is not a switch value; use 1 (on) or 0 (off).")


def parse_sp_moe(raw: str | None) -> str:
    value = (raw or "vllm").strip().lower()
    if value not in SP_MOE_VALUES:
        raise ValueError(f"{SP_MOE_ENV}={raw!r} is not a layout; valid values: {', '.join(SP_MOE_VALUES)}.")
    return value


@dataclass(frozen=True)
class Requested:
    """What a process's environment asks of the engine patches."""

    cpu_ep: bool = False
    sp_moe: str = "vllm"

    @property
    def anything(self) -> bool:
        return self.cpu_ep or self.sp_moe != "vllm"


def requested(environ: Mapping[str, str]) -> Requested:
    """The switches in ``environ``; a ValueError with one sentence for a value that is none."""
    return Requested(cpu_ep=parse_bool(CPU_EP_ENV, environ.get(CPU_EP_ENV)),
                     sp_moe=parse_sp_moe(environ.get(SP_MOE_ENV)))


def parse_layout(raw: str | None) -> str:
    """``EVALPIPE_LAYOUT`` -> the layout model's layout (ValueError for another value)."""
    # unset is the default; set, it must be a layout as written: an empty or padded value
    # in a config is a slip, not a choice
    layout = "legacy" if raw is None else raw
    if layout not in LAYOUTS:
        raise ValueError(f"{LAYOUT_ENV}={raw!r} is not a layout; valid values: {', '.join(LAYOUTS)}.")
    return layout


def parse_faults(raw: str | None) -> frozenset[str]:
    """``EVALPIPE_LAYOUT_FAULT`` -> a set of the zoo's fault names (ValueError for another name)."""
    names = [p.strip() for p in (raw or "").split(",") if p.strip()]
    names = [n for n in names if n.lower() != "none"]
    unknown = [n for n in names if n not in LAYOUT_FAULT_NAMES]
    if unknown:
        raise ValueError(f"{LAYOUT_FAULT_ENV}: unknown fault {unknown[0]!r}; valid names: none, " + ", ".join(LAYOUT_FAULT_NAMES) + ".")
    return frozenset(names)


def check_env(environ: Mapping[str, str]) -> None:
    """Every evalpipe switch in ``environ`` has a value its reader takes; a ValueError
    with one sentence otherwise. The planner calls this, so a wrong value is refused
    before an engine spends a minute starting."""
    requested(environ)
    if LAYOUT_ENV in environ:
        parse_layout(environ[LAYOUT_ENV])
    if LAYOUT_FAULT_ENV in environ:
        parse_faults(environ[LAYOUT_FAULT_ENV])
