"""Switchable faults of the reference layout model, each modelled on a real class of bug.

Selected per engine with ``EVALPIPE_LAYOUT_FAULT`` (comma-separated names; absent or
``none``: no fault). They exist so that evalpipe can be pointed at a change whose effect
is known in advance: a harmful fault must be reported DIVERGENT, a benign one must not.
Step numbers ①..⑥ are those of the layout change the model reproduces (see
:mod:`evalpipe.lab.layout.model`).

``layout`` says which layout a fault acts on (``any``: both); asking for it under the
other layout is an error rather than a silent no-op. ``needs_scale`` faults only exist when an output scale
is in use (``layout_out_scale`` != 1 in the engine's ``hf_overrides``); ``out_scale`` is
the scale to demonstrate them with on the built-in model.

The "measured" sentences come from ``evalpipe run gsm8k --limit 100`` (tiny-gsm, fp32,
T = 4, default gates, reference ``legacy``; the correct ``sp`` layout measures max
|dlogprob| 2.4e-6 and teacher-forced KL max 2.8e-12 nats there) on an earlier build of
tiny-gsm (GSM phase only, strict-match 0.55), before its weights shipped; the shipped
model's figures for every fault on 600 items are in docs/calibration.md
(``evalpipe calibrate``).

Pure Python: importable without torch or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalpipe.engine_patches.switches import LAYOUT_FAULT_ENV as FAULT_ENV
from evalpipe.engine_patches.switches import parse_faults

__all__ = ["FAULT_ENV", "FAULTS", "Fault", "parse_faults"]


@dataclass(frozen=True)
class Fault:
    name: str
    harmful: bool
    layout: str
    doc: str
    needs_scale: bool = False
    out_scale: float | None = None  # layout_out_scale to run a needs_scale fault with
    raises: bool = False  # the fault is caught by the model itself: the engine fails loudly
    magnitude: float | None = None  # graded faults: the relative error they inject
    hangs: bool = False  # tests of the watchdog only: the engine stops making progress
    falls_back: bool = False  # the variant silently runs another path: only the path probes can tell
    # where `evalpipe localize` must find it first: (decoder layer, capture point); layer
    # LAST_LAYER is the model's last. None: nowhere (benign, or the engine fails first)
    place: tuple[int, str] | None = None


LAST_LAYER = -1


# Graded systematic errors for the sensitivity curve: the attention output of one decoder
# layer (GRADED_LAYER, the middle one of the built-in model's three) multiplied by
# (1 + magnitude) on the sp path. A wrong scaling factor in one layer (a mis-set
# routed_scaling_factor, a scale applied to one layer twice, a quantisation scale off
# by a rounding) is this kind of bug: small, systematic, invisible in any one position.
GRADED_LAYER = 1

# The `hang` fault's trigger: past the engine's start-up forwards (profiling and warm-up
# runs take a handful), so the engine comes up and finishes some requests first.
HANG_AFTER_FORWARDS = 60
GRADED_MAGNITUDES = ("1e-1", "1e-2", "1e-3", "1e-4", "1e-5")
GRADED_PREFIX = "attn_out_error_"


def _graded(text: str) -> Fault:
    return Fault(
        f"{GRADED_PREFIX}{text}",
        harmful=True,
        layout="sp",
        magnitude=float(text),
        place=(GRADED_LAYER, "attn.out"),
        doc=(
            f"Graded systematic error: layer {GRADED_LAYER}'s attention output is multiplied by "
            f"(1 + {text}) after the reduce_scatter (⑥), every token, every batch. Harmful by "
            "construction (a relative error that a correct layout change never makes); the "
            "sensitivity curve in docs/calibration.md says from which magnitude each gate family "
            "sees it."
        ),
    )


# The path-specific faults: the graded error's 1e-2 (a one-percent scale on layer GRADED_LAYER's
# attention output), applied only where one engine path runs, as the layout bugs that live in
# one scheduler path do (docs/scenarios.md says which scenario drives which path).
PATH_ERROR = 1e-2
FAR_POSITION = 1536  # positions from here on: a context near the 2048-token window of configs/scenarios.yaml


def _path_fault(name: str, where: str, scenario: str) -> Fault:
    return Fault(
        name, harmful=True, layout="sp", place=(GRADED_LAYER, "attn.out"),
        doc=(f"Path-specific: layer {GRADED_LAYER}'s attention output multiplied by (1 + {PATH_ERROR:g}) only {where}; "
             f"everywhere else sp is exact. Whether a run sees it depends on whether that path ran: "
             f"`{scenario}` drives it (docs/scenarios.md)."),
    )


PATH_FAULTS = (
    _path_fault("lone_decode_error", "in forward passes of a single token (one request decoding alone)",
                "gsm8k_synth_4shot with schedule: one_at_a_time"),
    _path_fault("cached_prefix_error", "on the tokens of a prefill that continues a prefix the prefix cache held",
                "scenario_prefix_cache"),
    _path_fault("chunk_continuation_error", "on the tokens of a prefill chunk after the first (a prompt longer than "
                "max_num_batched_tokens)", "scenario_chunked_prefill"),
    _path_fault("far_position_error", f"at positions {FAR_POSITION} and beyond (a context near the window)", "scenario_near_limit"),
    _path_fault("recompute_error", "on the tokens that recompute a request after the scheduler preempted it",
                "scenario_preemption"),
)


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "shard_offset",
            harmful=True,
            place=(0, "attn.in"),
            layout="sp",
            doc=(
                "A missing input check (⑤). Every rank reads its token shard one row later than its "
                "rank offset (an off-by-one in local_start), and the check that would compare the "
                "shard's start and length with rank * ceil(n / T) is skipped. The misread rows are "
                "used as if they sat at the expected tokens, so each token is computed from its "
                "successor's hidden state: silent misalignment, which is exactly what ⑤ exists to "
                "turn into an error. Measured: accuracy 0.55 -> 0.02, every sample diverges."
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
            place=(0, "attn.out"),
            layout="sp",
            doc=(
                "The reduction done twice: the O projection keeps its own all-reduce "
                "(reduce_results=True, the legacy ④ duty) and the pass-through path's single "
                "reduce_scatter (⑥) sums again, so every token's attention output is T times too "
                "large. This is the case the PR's capability probe rejects (`not "
                "o_proj.reduce_results`). Measured: accuracy 0.55 -> 0.05, 99/100 samples diverge."
            ),
        ),
        Fault(
            "heads_permuted",
            harmful=True,
            place=(0, "attn.heads"),
            layout="sp",
            doc=(
                "The all_to_all (⑥) sends head groups to the wrong ranks: the send buffer is viewed "
                "as [tokens, heads/T, T] instead of [tokens, T, heads/T], so rank r receives the "
                "interleaved heads r, r+T, ... while its O-projection slice holds the weights of the "
                "contiguous group r. The group sizes still match, so nothing fails; each rank "
                "multiplies another rank's heads. No effect with T = 1. Measured: accuracy 0.55 -> "
                "0.01, every sample diverges."
            ),
        ),
        Fault(
            "scale_after_reduce",
            harmful=True,
            place=(0, "attn.out"),
            layout="sp",
            needs_scale=True,
            out_scale=16384.0,
            doc=(
                "The output scale applied after instead of before the reduction, with the "
                "reduction running in a half-precision (fp16) buffer as in an fp16 deployment: the "
                "partial products are summed in fp16 and the scale is applied to that fp16 sum, "
                "which rounds every value to 11 bits and overflows to inf wherever |scale x sum| > "
                "65504. tiny-gsm's reduced O-projection outputs reach |6.1| (layers 1-2; p99 2.6), so "
                "2**14 = 16384 is the smallest power of two that overflows (on ~0.07% of elements); "
                "one inf makes its token's next RMSNorm NaN and attention spreads NaN to every later "
                "token. At 2**13 or below nothing overflows and only the fp16 rounding remains "
                "(max |dlogprob| 3e-3: bf16-level, EQUIVALENT under the default gates). Measured at "
                "16384: NaN logprobs from the first overflow on, accuracy 0.55 -> 0.01."
            ),
        ),
        Fault(
            "padding_not_zeroed",
            harmful=True,
            place=(0, "attn.heads"),
            layout="sp",
            doc=(
                "Padding rows not zeroed (⑤ and the output's tail zeroing skipped). A shard's "
                "padding rows keep what the reused buffer held (here: a copy of the batch's last "
                "real row). They reach a later computation through ③: the batch's Q/K/V are "
                "assembled from every rank's rows by a scatter-add whose padded index entries repeat "
                "the last real slot, which is harmless only for zero rows. With stale rows, the "
                "last real token of every batch whose size is not a multiple of T gets its "
                "query, key and value multiplied by (1 + number of padding rows), and the "
                "corrupted key/value is what the KV cache keeps for that token. Decode batches hit "
                "it whenever the number of running sequences is not a multiple of T; teacher "
                "forcing rarely does (full prefill steps are multiples of T). Measured: 16/100 "
                "samples diverge (15 hard), accuracy 0.55 -> 0.49, teacher-forced logprobs "
                "unchanged."
            ),
        ),
        Fault(
            "residual_not_rescaled",
            harmful=True,
            place=(0, "attn.residual"),
            layout="sp",
            needs_scale=True,
            out_scale=16384.0,
            doc=(
                "With an output scale in use, the attention and MLP outputs are scaled but the "
                "residual is not rescaled on layer 0 (the PR's `residual *= 1/routed_scaling_factor` "
                "when layer_idx == 0 is missing): the embedding enters the residual stream with the "
                "wrong weight relative to every later layer's contribution (any scale != 1 shows "
                "it; the larger, the worse). Measured at 16384: accuracy 0.55 -> 0.00."
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
                "last bits of fp32 sums move. Measured: EQUIVALENT, max |dlogprob| 2.4e-6."
            ),
        ),
        Fault(
            "reduce_fp64",
            harmful=False,
            layout="sp",
            doc=(
                "The reduce_scatter (⑥) accumulates in float64 and casts the result back to the "
                "model dtype: a more precise reduction (as some collectives libraries do for small "
                "messages). Moves last bits only. Measured: EQUIVALENT, max |dlogprob| 2.4e-6."
            ),
        ),
        Fault(
            "reduce_bf16",
            harmful=True,
            place=(0, "attn.out"),
            layout="sp",
            doc=(
                "The reduce_scatter (⑥) communicates and accumulates in bfloat16 (8-bit mantissa) "
                "and casts back, as a bandwidth-saving reduction would. On an fp32 deployment this is "
                "a precision loss, harmful: it perturbs every attention output by up to 2^-8 relative "
                "on every layer, the error of running the model in bfloat16, which an fp32 claim rules "
                "out (the fp32 vs bf16 positive control, configs/dtype_control.yaml, is DIVERGENT "
                "too). Measured (200 items): teacher-forced KL p99 5.3e-6 and max 5.1e-5 nats, "
                "free-running KL max 6.9e-5, max |dlogprob| 0.011, against 8e-13 / 5e-12 / 4e-6 for "
                "the correct layout; no token, answer or score changes. The fp32 floors "
                "(docs/numerics.md) catch it; under half-precision floors, which a bf16 deployment "
                "gets (where this reduction is what the model computes in anyway), it passes. "
                "Contrast `scale_after_reduce`: a half-precision accumulator that overflows is "
                "harmful under any gates."
            ),
        ),
        Fault(
            "nondeterministic_reduce",
            harmful=False,
            layout="any",
            doc=(
                "The O projection's partial products are summed in a random rank order on every "
                "forward (drawn from the operating system, so no seed repeats it): a collective "
                "whose summation order depends on arrival times, as non-deterministic all-reduce / "
                "reduce_scatter implementations on accelerators do. Benign: the same sum, other "
                "last bits. On a reference it makes the A/A run noisy, the regime of a bf16 "
                "accelerator deployment (configs/numerics_bf16_noisy.yaml)."
            ),
        ),
        Fault(
            "hang",
            harmful=False,
            layout="any",
            hangs=True,
            doc=(
                "For the watchdog's tests only: from the "
                f"{HANG_AFTER_FORWARDS}th forward of the engine on, layer 0's first collective "
                "never returns, as an HCCL collective whose peer died and whose time-out never "
                "fires; the hung thread takes no SIGTERM (only SIGKILL ends it), like a thread "
                "stuck in a device call. Looks benign (the numerics are untouched) and produces "
                "no error: the engine simply stops making progress. Not part of the calibration zoo."
            ),
        ),
        Fault(
            "sp_fallback",
            harmful=False,
            layout="sp",
            falls_back=True,
            doc=(
                "The sp variant silently takes the legacy path, as PR #18671's decoder layer does when "
                "one of its conditions fails (the input is not a shard, V1 runner, PP = 1, sequence-"
                "parallel MoE, enable_dsa_cp, the MLA wrapper's capability check): every layer "
                "gathers (①), attends, reduces and scatters (④) as `legacy` does, and nothing "
                "says so. The outputs are `legacy`'s exactly, so no output comparison can tell: "
                "the path probes must (no all_to_all, every all_gather back). Must come out "
                "INCONCLUSIVE, never EQUIVALENT or IDENTICAL."
            ),
        ),
        Fault(
            "subtle_last_layer_boundary",
            harmful=True,
            place=(LAST_LAYER, "attn.heads"),
            layout="sp",
            doc=(
                "Deliberately subtle: only on the last decoder layer, and only at the first token "
                "of each shard except the first, the smallest head group's all_to_all receive row "
                "is taken from the neighbouring shard's last token (an off-by-one at the shard "
                "boundary in the receive layout). One head of one layer at a few tokens per batch: "
                "accuracy barely moves, per-token logits do. Measured: no token or score changes, "
                "but free-running logprobs move by up to 0.63 (KL 0.82 nats) at positions where both "
                "sides still agree; teacher forcing (large prefill shards) sees only 1.5e-4, which "
                "the fp32 floors catch (teacher-forced KL max 1.1e-5)."
            ),
        ),
    )
} | {f.name: f for f in map(_graded, GRADED_MAGNITUDES)} | {f.name: f for f in PATH_FAULTS}


def graded_magnitude(faults: frozenset[str]) -> float:
    """The relative error of the graded fault among ``faults`` (0.0 when there is none)."""
    return sum(FAULTS[n].magnitude or 0.0 for n in faults)
