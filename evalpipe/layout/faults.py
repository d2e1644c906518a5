"""Switchable faults of the reference layout model, each modelled on a real class of bug.

Selected per engine with ``EVALPIPE_LAYOUT_FAULT`` (comma-separated names; absent or
``none``: no fault). They exist so that evalpipe can be pointed at a change whose effect
is known in advance: a harmful fault must be reported DIVERGENT, a benign one must not.
Step numbers ①..⑥ are those of the layout change the model reproduces (see
:mod:`evalpipe.layout.model`).

``layout`` says which layout a fault acts on; asking for it under the other layout is an
error rather than a silent no-op. ``needs_scale`` faults only exist when an output scale
is in use (``layout_out_scale`` != 1 in the engine's ``hf_overrides``).

Pure Python: importable without torch or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_ENV = "EVALPIPE_LAYOUT_FAULT"


@dataclass(frozen=True)
class Fault:
    name: str
    harmful: bool
    layout: str
    doc: str
    needs_scale: bool = False
    raises: bool = False  # the fault is caught by the model itself: the engine fails loudly


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "shard_offset",
            harmful=True,
            layout="sp",
            doc=(
                "A missing input check (⑤). Every rank reads its token shard one row later than its "
                "rank offset (an off-by-one in local_start), and the check that would compare the "
                "shard's start and length with rank * ceil(n / T) is skipped. The misread rows are "
                "used as if they sat at the expected tokens, so each token is computed from its "
                "successor's hidden state: silent misalignment, which is exactly what ⑤ exists to "
                "turn into an error."
            ),
        ),
        Fault(
            "shard_offset_checked",
            harmful=True,
            layout="sp",
            raises=True,
            doc=(
                "The same off-by-one read as `shard_offset`, with the input check (⑤) in place: the "
                "first forward (vLLM's profiling run at engine start) raises ShardMismatch naming the "
                "rank, the expected and the actual offset. Stands for the guard doing its job; the "
                "variant fails instead of producing numbers."
            ),
        ),
        Fault(
            "double_reduce",
            harmful=True,
            layout="sp",
            doc=(
                "The reduction done twice: the O projection keeps its own all-reduce "
                "(reduce_results=True, the legacy ④ duty) and the pass-through path's single "
                "reduce_scatter (⑥) sums again, so every token's attention output is T times too "
                "large. This is the case the PR's capability probe rejects (`not "
                "o_proj.reduce_results`)."
            ),
        ),
        Fault(
            "heads_permuted",
            harmful=True,
            layout="sp",
            doc=(
                "The all_to_all (⑥) sends head groups to the wrong ranks: the send buffer is viewed "
                "as [tokens, heads/T, T] instead of [tokens, T, heads/T], so rank r receives the "
                "interleaved heads r, r+T, ... while its O-projection slice holds the weights of the "
                "contiguous group r. The group sizes still match, so nothing fails; each rank "
                "multiplies another rank's heads. No effect with T = 1."
            ),
        ),
        Fault(
            "scale_after_reduce",
            harmful=True,
            layout="sp",
            needs_scale=True,
            doc=(
                "The output scale applied after instead of before the reduction, with the "
                "reduction running in a half-precision (fp16) buffer as in an fp16 deployment: the "
                "partial products are summed in fp16 and the scale is applied to that fp16 sum, "
                "which overflows to inf wherever |scale x sum| > 65504 and rounds every value to "
                "11 bits. With layout_out_scale = 2**14 on tiny-gsm, a large share of attention "
                "output elements overflow on every layer; the infs become NaN logits."
            ),
        ),
        Fault(
            "padding_not_zeroed",
            harmful=True,
            layout="sp",
            doc=(
                "Padding rows not zeroed (⑤ and the output's tail zeroing skipped). A shard's "
                "padding rows keep what the reused buffer held (here: a copy of the batch's last "
                "real row). They reach a later computation through ③: the batch's Q/K/V are "
                "assembled from every rank's rows by a scatter-add whose padded index entries repeat "
                "the last real slot, which is harmless only for zero rows. With stale rows, the "
                "last real token of every batch whose size is not a multiple of T gets its "
                "query, key and value multiplied by (1 + number of padding rows), and the "
                "corrupted key/value is what the KV cache keeps for that token."
            ),
        ),
        Fault(
            "residual_not_rescaled",
            harmful=True,
            layout="sp",
            needs_scale=True,
            doc=(
                "With an output scale in use, the attention and MLP outputs are scaled but the "
                "residual is not rescaled on layer 0 (the PR's `residual *= 1/routed_scaling_factor` "
                "when layer_idx == 0 is missing): the embedding enters the residual stream with the "
                "wrong weight relative to every later layer's contribution."
            ),
        ),
        Fault(
            "tree_reduce",
            harmful=False,
            layout="sp",
            doc=(
                "A different but correct summation order: the reduce_scatter (⑥) sums the partial "
                "products pairwise, (p0 + p1) + (p2 + p3), instead of around the ring. Stands for a "
                "different collective algorithm (tree vs ring, another library version); only the "
                "last bits of fp32 sums move."
            ),
        ),
        Fault(
            "reduce_fp64",
            harmful=False,
            layout="sp",
            doc=(
                "The reduce_scatter (⑥) accumulates in float64 and casts the result back to the "
                "model dtype: a more precise reduction (as some collectives libraries do for small "
                "messages). Moves last bits only."
            ),
        ),
        Fault(
            "reduce_bf16",
            harmful=True,
            layout="sp",
            doc=(
                "The reduce_scatter (⑥) communicates and accumulates in bfloat16 (8-bit mantissa) "
                "and casts back, as a bandwidth-saving reduction would. Counted as harmful for an "
                "fp32 model: it perturbs every attention output by up to ~2^-8 relative on every "
                "layer, orders of magnitude beyond the layout change's last-bit noise (measured "
                "figures in the layout model's report); whether a given set of gates calls it "
                "EQUIVALENT is the gates' choice."
            ),
        ),
        Fault(
            "subtle_last_layer_boundary",
            harmful=True,
            layout="sp",
            doc=(
                "Deliberately subtle: only on the last decoder layer, and only at the first token "
                "of each shard except the first, the smallest head group's all_to_all receive row "
                "is taken from the neighbouring shard's last token (an off-by-one at the shard "
                "boundary in the receive layout). One head of one layer at a few tokens per batch: "
                "accuracy barely moves, per-token logits do."
            ),
        ),
    )
}


def parse_faults(value: str | None) -> frozenset[str]:
    """``EVALPIPE_LAYOUT_FAULT`` -> a set of known fault names (ValueError otherwise)."""
    names = [p.strip() for p in (value or "").split(",") if p.strip()]
    names = [n for n in names if n.lower() != "none"]
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(
            f"{FAULT_ENV}: unknown fault {unknown[0]!r}; valid names: none, " + ", ".join(FAULTS) + "."
        )
    return frozenset(names)
