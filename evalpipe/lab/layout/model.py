"""Reference layout model: vLLM's Llama with the data layout around attention of T virtual
tensor-parallel ranks, legacy or sequence-parallel pass-through, plus switchable faults.

It reproduces, in one process and with plain torch ops, the layout change of a
sequence-parallel (SP) attention path: the residual stream between decoder layers is
sharded by tokens over T ranks, and attention either

``legacy``  ① all_gathers the shards into the full batch, runs attention, computes the O
            projection as per-rank partial products over the ranks' head groups
            (row-parallel), reduces them in rank order and ④ scatters the result back into
            shards; or
``sp``      lets the shards pass straight through: ⑤ every rank checks that its shard sits
            at ``rank * ceil(n / T)`` with ``ceil(n / T)`` rows and zeroes its padding rows;
            attention hands back local shards; ⑥ one all_to_all turns ``[local tokens, all
            heads]`` into ``[all tokens, own heads]``, each rank computes its partial O
            projection (any output scale applied here, before the reduction), and a single
            ring reduce_scatter sums and re-shards in one step.

Both layouts compute the same function; they differ in the order in which the T partial
products are summed, so in fp32 they agree up to the last bits. The attention kernel and
the KV cache are vLLM's own: every token of the batch goes through ``self.attn`` once, as
in the plain model (③, fetching other ranks' KV, is folded into that call: the ranks'
local Q/K/V rows are scatter-added into the batch, see ``collectives.fold_into_batch``).

Selection: ``EVALPIPE_LAYOUT`` (``legacy`` default, or ``sp``) and ``EVALPIPE_LAYOUT_FAULT``
in the engine's environment; ``layout_tp`` (default 4) and ``layout_out_scale`` (default
1.0) in the model config, usually through ``hf_overrides`` together with
``architectures: [EvalpipeLayoutForCausalLM]``. Faults: :mod:`evalpipe.lab.layout.faults`.

Output scale: with ``layout_out_scale = c`` the whole residual stream is carried at c times
its size (the fp16 overflow guard of the PR, where c = 1 / routed_scaling_factor): the
attention output is scaled (sp: on the partial products before the reduction; legacy:
after it), the residual is rescaled on layer 0, and the MLP output is scaled (the PR's MoE
skips its routed scaling instead). The final RMSNorm removes c again, so the result
matches c = 1. The norms that see the scaled stream get their epsilon scaled by c**2, so
for a power of two the scale is exactly neutral (the fp16 deployment this stands for keeps
its epsilon, a deliberate small change that would only blur the faults' signal here).

Deviations from real tensor parallelism, on purpose:
- Heads need not divide by T. They are split into T groups as evenly as possible, larger
  groups first (tiny-gsm's 6 heads on 4 ranks: 2, 2, 1, 1), so the ranks' partial
  products have unequal widths. T must not exceed the number of heads.
- The KV heads, the QKV projection and the MLP are not split by rank: only the layout of
  the tokens and the O projection's reduction are emulated, because that is where the
  two layouts differ.
- vLLM itself runs with tensor_parallel_size 1; the T ranks are virtual.
- The model always runs eagerly (``ignore_torch_compile``): its per-rank Python loops and
  shape checks are not meant for graph capture, and it is a reference, not a fast path.
"""

from __future__ import annotations

import random
import signal
import time
from typing import cast

import torch
import torch.nn.functional as F
from vllm.compilation.decorators import ignore_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.logger import init_logger
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from vllm.model_executor.models.utils import extract_layer_index

from evalpipe.lab.layout import collectives as C
from evalpipe.lab.layout.faults import GRADED_LAYER, HANG_AFTER_FORWARDS, PATH_ERROR, graded_magnitude
from evalpipe.lab.layout.path_faults import path_fault_rows
from evalpipe.lab.layout.plugin import ARCHITECTURE
from evalpipe.lab.layout.resumed import resumed_rows, watch_resumed_requests
from evalpipe.lab.layout.settings import LayoutSettings, resolve
from evalpipe.probes import runtime as probes
from evalpipe.probes.collectives import VIRTUAL_GROUP  # the virtual ranks' collectives reach the probes under it

# Under the vllm logger namespace so the line lands in the engine log with vLLM's own.
logger = init_logger(f"vllm.{__name__}")

# Arrival order of a non-deterministic collective: from the operating system, so that no
# seed (vLLM seeds torch and random) makes two runs sum in the same orders.
_SYSTEM_RANDOM = random.SystemRandom()

# Reductions of the sp layout's reduce_scatter (⑥) by fault; the default is the ring.
_REDUCE_SCATTER = {
    "tree_reduce": (C.reduce_scatter_tree, None),
    "reduce_fp64": (C.reduce_scatter_ring, torch.float64),
    "reduce_bf16": (C.reduce_scatter_ring, torch.bfloat16),
}


class LayoutDecoderLayer(LlamaDecoderLayer):
    # vLLM types it nn.Module (attn_layer_type is any module class); this layer reads LlamaAttention's parts
    self_attn: LlamaAttention

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config=None, attn_layer_type=LlamaAttention):
        super().__init__(vllm_config, prefix=prefix, config=config, attn_layer_type=attn_layer_type)
        hf_config = config or vllm_config.model_config.hf_config
        # the prefill chunk: where a chunked prefill's continuations start (the path faults tell them from cache hits)
        self.chunk_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        self.layer_idx = extract_layer_index(prefix)
        self.is_last_layer = self.layer_idx == hf_config.num_hidden_layers - 1
        self.num_heads = self.self_attn.total_num_heads
        self.head_dim = self.self_attn.head_dim
        self.o_weight: torch.Tensor | None = None
        self.forwards = 0
        self.eps = self.input_layernorm.variance_epsilon
        self.use_settings(resolve(hf_config))

    def use_settings(self, settings: LayoutSettings) -> None:
        self.settings = settings
        self.graded_error = graded_magnitude(settings.faults)
        if "recompute_error" in settings.faults:
            watch_resumed_requests()
        scaled = settings.out_scale**2 * self.eps
        # Layer 0's input norm sees the embedding before the rescale; every other norm sees
        # the scaled stream.
        self.input_layernorm.variance_epsilon = self.eps if self.layer_idx == 0 else scaled
        self.post_attention_layernorm.variance_epsilon = scaled
        device = self._o_proj_weight().device
        self.columns = [C.head_columns(g, self.head_dim).to(device) for g in C.head_groups(self.num_heads, settings.tp)]
        self.strided_columns = [
            C.head_columns(g, self.head_dim).to(device) for g in C.strided_head_groups(self.num_heads, settings.tp)
        ]
        self._slice_o_weight()

    def keep_o_weight(self) -> None:
        """Keep W_o as loaded: vLLM's CPU build repacks linear weights for its GEMM kernels
        after loading and drops the plain tensor, but every rank needs its column slice."""
        self.o_weight = self._o_proj_weight().detach().clone()
        self._slice_o_weight()

    def _o_proj_weight(self) -> torch.Tensor:
        # the layer's quant method registers it at run time, so the checker sees nn.Module.__getattr__'s Tensor | Module
        return cast(torch.Tensor, self.self_attn.o_proj.weight)

    def _slice_o_weight(self) -> None:
        w = self.o_weight
        self.o_weight_slices = None if w is None else [w.index_select(1, cols).contiguous() for cols in self.columns]

    # ------------------------------------------------------------------ decoder layer

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None):
        s = self.settings
        scale = s.out_scale
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            if scale != 1.0 and not s.has("residual_not_rescaled"):
                residual = residual * scale
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)

        if hidden_states.shape[0] == 0:
            hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        elif s.layout == "sp" and not s.has("sp_fallback"):
            self._hang_when_due()
            hidden_states = self._sp_attention(positions, hidden_states)
        else:
            self._hang_when_due()
            hidden_states = self._legacy_attention(positions, hidden_states)

        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        # the residual stream is held at the output scale (neutral by construction): recorded
        # with its pieces, so that localize compares it with an unscaled reference's
        self._capture("attn.residual", [residual], "full", scale=scale)
        hidden_states = self.mlp(hidden_states)
        if scale != 1.0:
            hidden_states = hidden_states * scale
        if probes.capturing():
            self._capture("mlp.out", [hidden_states], "full", scale=scale)
            self._capture("layer.out", [hidden_states + residual], "full", scale=scale)
        return hidden_states, residual

    # ------------------------------------------------------------------ shared pieces

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.self_attn.qkv_proj(x)
        return qkv

    def _attend(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions, q, k)
        return attn.attn(q, k, v)

    def _o_partial(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s row-parallel share of the O projection: its head group's columns of
        the attention output times the matching slice of W_o (bias on rank 0 only)."""
        if self.o_weight_slices is None:
            raise RuntimeError(
                f"{ARCHITECTURE}: the O-projection weights were not captured at load time; "
                "load the model through its load_weights (a real checkpoint, not load_format=dummy)."
            )
        bias = self.self_attn.o_proj.bias if rank == 0 else None
        return F.linear(x, self.o_weight_slices[rank], bias)

    def _capture(self, module: str, pieces: list[torch.Tensor], layout: str, **how) -> None:
        """What the ranks hold at this point, for `evalpipe localize` (nothing unless it watches)."""
        probes.capture(module, self.layer_idx, pieces, layout, world=len(pieces) if layout != "full" else 1, **how)

    def _hang_when_due(self) -> None:
        """The `hang` fault: layer 0's collective never returns once the engine is past its
        start-up forwards. Like a thread stuck inside a device call, the hung thread takes
        no SIGTERM or SIGINT (they stay pending for it): only SIGKILL ends it."""
        if self.layer_idx != 0 or not self.settings.has("hang"):
            return
        self.forwards += 1
        if self.forwards > HANG_AFTER_FORWARDS:
            logger.warning("layout fault `hang`: forward %d waits forever in a collective", self.forwards)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
            while True:
                time.sleep(3600)

    def _nondeterministic(self) -> bool:
        return self.settings.has("nondeterministic_reduce")

    def _random_reduce(self, partials: list[torch.Tensor]) -> torch.Tensor:
        """The partial products summed in a random order per token, from a generator seeded
        by the operating system on every call (no seed makes two runs sum alike)."""
        generator = torch.Generator().manual_seed(_SYSTEM_RANDOM.getrandbits(63))
        return C.reduce_random_order(partials, generator)

    # ------------------------------------------------------------------ legacy: ① ... ④

    def _legacy_attention(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        world = self.settings.tp
        n = x.shape[0]
        padded = C.padded_len(n, world)
        shards = C.split_shards(C.pad_rows(x, padded), world)

        self._capture("attn.in", shards, "token_shards", shard_rows=padded // world)
        full = C.unpad(C.all_gather(shards), n)  # ①
        probes.collective("all_gather", VIRTUAL_GROUP, *shards)
        attn_out = self._attend(positions, self._qkv(full))
        heads = [attn_out.index_select(1, self.columns[r]) for r in range(world)]
        self._capture("attn.heads", heads, "head_columns", columns=self.columns, width=attn_out.shape[1])
        partials = [self._o_partial(heads[r], r) for r in range(world)]
        self._capture("attn.partials", partials, "partial_sum")
        reduced = self._random_reduce(partials) if self._nondeterministic() else C.reduce_rank_order(partials)
        if self.settings.out_scale != 1.0:
            reduced = reduced * self.settings.out_scale
        out_shards = C.scatter(C.pad_rows(reduced, padded), world)  # ④
        probes.collective("reduce_scatter", VIRTUAL_GROUP, *partials)

        out = C.unpad(C.all_gather(out_shards), n)
        self._capture("attn.out", [out], "full", scale=self.settings.out_scale)
        return out

    # ------------------------------------------------------------------ sp: ⑤ ... ⑥

    def _sp_attention(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s = self.settings
        world = s.tp
        n = x.shape[0]
        size = C.shard_size(n, world)
        padded = size * world

        # The shard buffer's padding rows hold whatever was there before; ⑤ must clear them.
        buffer = C.pad_rows(x, padded, mode="replicate")
        shift = 1 if (s.has("shard_offset") or s.has("shard_offset_checked")) else 0
        local = []
        for rank in range(world):
            offset = rank * size + shift
            shard = C.take_shard(buffer, offset, size)
            if not s.has("shard_offset"):
                C.check_shard(rank=rank, offset=offset, rows=shard.shape[0], num_tokens=n, world=world)  # ⑤
            if not s.has("padding_not_zeroed"):
                shard = C.zero_padding(shard, C.valid_rows(n, offset, size))  # ⑤
            local.append(shard)
        self._capture("attn.in", local, "token_shards", shard_rows=size)

        qkv = C.fold_into_batch(C.all_gather([self._qkv(shard) for shard in local]), n)  # ③
        attn_out = self._attend(positions, qkv)
        attn_shards = C.split_shards(C.pad_rows(attn_out, padded), world)

        columns = self.strided_columns if s.has("heads_permuted") else self.columns
        received = C.all_to_all(attn_shards, columns)  # ⑥ [all tokens, own heads]
        probes.collective("all_to_all", VIRTUAL_GROUP, *attn_shards)
        if s.has("subtle_last_layer_boundary") and self.is_last_layer and world > 1:
            firsts = torch.arange(1, world) * size
            received[-1][firsts] = received[-1][firsts - 1]
        # what each rank holds before its O projection, as the layout says it holds it
        self._capture("attn.heads", received, "head_columns", columns=self.columns, width=attn_out.shape[1])
        partials = [self._o_partial(received[r], r) for r in range(world)]
        self._capture("attn.partials", partials, "partial_sum")

        if s.has("scale_after_reduce"):
            out_shards = [
                (shard * s.out_scale).to(x.dtype)
                for shard in C.reduce_scatter_ring(partials, acc_dtype=torch.float16)
            ]
        else:
            if s.out_scale != 1.0:
                partials = [p * s.out_scale for p in partials]
            if s.has("double_reduce"):
                partials = C.all_reduce(partials)
                probes.collective("all_reduce", VIRTUAL_GROUP, *partials)
            if self._nondeterministic():
                out_shards = C.split_shards(self._random_reduce(partials), world)  # ⑥, arrival order
            else:
                reduce, acc_dtype = next(
                    (_REDUCE_SCATTER[f] for f in _REDUCE_SCATTER if s.has(f)), (C.reduce_scatter_ring, None)
                )
                out_shards = [shard.to(x.dtype) for shard in reduce(partials, acc_dtype=acc_dtype)]  # ⑥

        probes.collective("reduce_scatter", VIRTUAL_GROUP, *partials)
        if not s.has("padding_not_zeroed"):
            out_shards = [C.zero_padding(sh, C.valid_rows(n, j * size, size)) for j, sh in enumerate(out_shards)]
        out = C.unpad(C.all_gather(out_shards), n)
        if self.graded_error and self.layer_idx == GRADED_LAYER:
            # multiplied in fp32 (a bf16 multiplier would round 1 + 1e-2 to 1.0078); in a bf16
            # model a relative error below half an ulp (2^-9, ~2e-3) still rounds away on
            # every element: there the graded faults from 1e-3 down compute exactly what sp does
            out = (out.float() * (1.0 + self.graded_error)).to(out.dtype)
        recomputed = resumed_rows(n, positions.device) if "recompute_error" in s.faults else None
        if self.layer_idx == GRADED_LAYER and (rows := path_fault_rows(s.faults, positions, self.chunk_tokens, recomputed)) is not None:
            out = out.clone()
            out[rows] = (out[rows].float() * (1.0 + PATH_ERROR)).to(out.dtype)
        self._capture("attn.out", [out], "full", scale=self.settings.out_scale)
        return out


@ignore_torch_compile
class LayoutModel(LlamaModel):
    pass


class LayoutForCausalLM(LlamaForCausalLM):
    """vLLM's LlamaForCausalLM with LayoutDecoderLayer: loads Llama checkpoints unchanged."""

    # its layers report their virtual ranks' pieces to `evalpipe localize` themselves
    evalpipe_captures = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", layer_type=LayoutDecoderLayer):
        tp, pp = get_tensor_model_parallel_world_size(), get_pp_group().world_size
        if (tp, pp) != (1, 1):
            raise ValueError(
                f"{ARCHITECTURE} emulates its tensor-parallel ranks in one process; run it with "
                f"tensor_parallel_size 1 and pipeline_parallel_size 1 (got {tp} and {pp}) and set the "
                "virtual rank count with hf_overrides.layout_tp."
            )
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)
        self.final_eps = self.model.norm.variance_epsilon
        self.use_settings(self.layout_settings())
        logger.info("%s: %s", ARCHITECTURE, self.layout_settings().describe())

    def _init_model(self, vllm_config: VllmConfig, prefix: str = "", layer_type=LayoutDecoderLayer):
        return LayoutModel(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        for layer in self._layout_layers():
            layer.keep_o_weight()
        return loaded

    def _layout_layers(self) -> list[LayoutDecoderLayer]:
        return [m for m in self.model.layers if isinstance(m, LayoutDecoderLayer)]

    def layout_settings(self) -> LayoutSettings:
        return self._layout_layers()[0].settings

    def use_settings(self, settings: LayoutSettings) -> None:
        """Switch layout, faults, rank count or scale on a built model (the environment
        decides at start). Only between requests, and only with prefix caching off: cached
        KV blocks were computed under the previous settings."""
        for layer in self._layout_layers():
            layer.use_settings(settings)
        self.model.norm.variance_epsilon = settings.out_scale**2 * self.final_eps
