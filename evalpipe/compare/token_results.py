"""What the per-token comparison (:mod:`evalpipe.compare.tokens`) gives: the result
types, per sample and per task, and the constants they are defined with. The terms are
defined in that module's docstring."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from evalpipe.compare.scores import Alignment, to_jsonable
from evalpipe.documents import comparison as schema
from evalpipe.documents.comparison import WorstExample

# Cap on (doc_id, repeat) pairs listed for samples present on one side only.
MAX_LISTED_KEYS = 10
# Cap on (doc_id, repeat, pos) triples listed for hard divergences (the count is exact).
MAX_LISTED_HARD = 20
# Near-tie threshold on the logprob gap between the two competing tokens, in nats.
# 0.5 nats is a probability ratio of ~1.65: two candidates that close can swap rank
# from reduction-order / kernel-choice rounding alone (observed |dlogprob| of bf16
# engines is ~1e-2..1e-1 per token, and it accumulates over the prefix), whereas a
# change that really alters the model's preference moves the gap by whole nats.
NEAR_TIE_GAP = 0.5
# Tokens of side A shown before the position of a worst example.
CONTEXT_TOKENS = 24
# log10 decades of the plot histograms; values outside are clipped into the end bins.
HIST_DECADES = tuple(range(-10, 3))


# ---------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------


_HISTOGRAMS = (("kl_hist", "kl_hist_zero"), ("abs_dlogprob_hist", "abs_dlogprob_hist_zero"))


@dataclass(frozen=True)
class TaskTokenSummary:
    """Token-level comparison of one task, over samples present on both sides."""

    task: str
    n_samples: int  # paired samples
    only_a: int
    only_b: int
    only_a_keys: tuple[tuple[int, int], ...]  # (doc_id, repeat), first MAX_LISTED_KEYS
    only_b_keys: tuple[tuple[int, int], ...]
    n_ids_identical: int
    n_identical: int  # bitwise: ids, logprobs and top-k lists
    n_logprob_diff_same_ids: int  # ids identical, some logprob bits differ
    n_topk_diff_same_ids: int  # ids and logprobs identical, some top-k entry differs
    n_length_diff: int
    tokens_a: int
    tokens_b: int
    n_positions_compared: int  # shared-prefix positions
    n_positions_logprob_diff: int
    divergence_positions: tuple[int, ...]  # sorted first-divergence positions
    median_first_divergence: float | None
    max_abs_dlogprob: float | None  # over all shared-prefix positions
    mean_abs_dlogprob: float | None
    max_abs_dlogprob_same_ids: float | None  # over samples whose ids are identical
    worst_divergence: tuple[WorstExample, ...] = ()
    worst_logprob: tuple[WorstExample, ...] = ()
    # first divergences classified (see module docstring); n_near_tie + n_hard == n_divergent
    near_tie_gap: float = NEAR_TIE_GAP
    n_near_tie_divergences: int = 0
    n_hard_divergences: int = 0
    hard_divergences: tuple[tuple[int, int, int], ...] = ()  # (doc_id, repeat, pos), first MAX_LISTED_HARD
    # shared-prefix distribution agreement, per position (None when no position compared)
    n_positions_topk_equal: int = 0  # top-k id sets equal (order ignored)
    share_topk_equal: float | None = None
    kl_p50: float | None = None  # symmetric max(KL(A||B), KL(B||A)) of the top-k distributions
    kl_p99: float | None = None
    kl_max: float | None = None
    abs_dlogprob_p50: float | None = None  # the max is max_abs_dlogprob
    abs_dlogprob_p99: float | None = None
    # top-1 agreement over the compared positions; n_top1_hard <= n_top1_disagree
    n_top1_disagree: int = 0
    n_top1_hard: int = 0
    share_top1_agree: float | None = None
    top1_hard_positions: tuple[tuple[int, int, int], ...] = ()  # (doc_id, repeat, pos), first MAX_LISTED_HARD
    # positions with the largest symmetric KL (> 0 only), ties in key order
    worst_kl: tuple[WorstExample, ...] = ()
    kl_max_at: tuple[int, int, int] | None = None  # (doc_id, repeat, pos) of kl_max; None when kl_max is 0 or None
    # decade histograms over the compared positions (see module docstring); to_dict nests them
    kl_hist_zero: int = 0
    kl_hist: tuple[int, ...] = ()
    abs_dlogprob_hist_zero: int = 0
    abs_dlogprob_hist: tuple[int, ...] = ()

    @property
    def n_divergent(self) -> int:
        return self.n_samples - self.n_ids_identical

    @property
    def share_ids_identical(self) -> float | None:
        return self.n_ids_identical / self.n_samples if self.n_samples else None

    @property
    def share_identical(self) -> float | None:
        return self.n_identical / self.n_samples if self.n_samples else None

    @property
    def identical(self) -> bool:
        return self.only_a == 0 and self.only_b == 0 and self.n_identical == self.n_samples

    def document(self) -> schema.TokenSummary:
        d = to_jsonable(self)
        for name, zero in _HISTOGRAMS:  # the histograms nest their decades and zero count
            counts = [int(c) for c in getattr(self, name)] or [0] * len(HIST_DECADES)
            d[name] = {"decades": list(HIST_DECADES), "zero": int(d.pop(zero)), "counts": counts}
        d.update(n_divergent=self.n_divergent, share_ids_identical=to_jsonable(self.share_ids_identical),
                 share_identical=to_jsonable(self.share_identical), identical=self.identical)
        return schema.TokenSummary.model_validate(d)


@dataclass(frozen=True, eq=False)
class SampleTokenDiffs:
    """Per-sample arrays over the union of samples, sorted by (task, doc_id, repeat).

    ``first_divergence`` is -1 when ids are identical (or the sample is one-sided);
    ``*_row`` index rows of the position alignment (-1 when none).
    """

    task: np.ndarray
    doc_id: np.ndarray
    repeat: np.ndarray
    in_a: np.ndarray
    in_b: np.ndarray
    len_a: np.ndarray
    len_b: np.ndarray
    first_divergence: np.ndarray
    first_divergence_row: np.ndarray
    shared_prefix: np.ndarray
    max_abs_dlogprob: np.ndarray  # NaN when the shared prefix is empty
    sum_abs_dlogprob: np.ndarray
    max_dlogprob_row: np.ndarray
    n_logprob_diff: np.ndarray
    n_topk_diff: np.ndarray
    sample_idx_a: np.ndarray  # row in samples table A (-1 when unknown / absent)
    sample_idx_b: np.ndarray
    # first-divergence class: True near-tie, False hard or no divergence
    near_tie: np.ndarray | None = None
    divergence_gap: np.ndarray | None = None  # A's |gap| at the divergence; NaN if B's token not in A's top-k
    # per shared-prefix position (alignment row ``prefix_rows[i]``, sample ``prefix_sample[i]``)
    prefix_rows: np.ndarray | None = None
    prefix_sample: np.ndarray | None = None
    prefix_abs_dlogprob: np.ndarray | None = None
    prefix_dlogprob: np.ndarray | None = None  # signed lp_B - lp_A (0 where bit-equal; NaN/inf when non-finite)
    prefix_kl: np.ndarray | None = None  # symmetric: max(KL(A||B), KL(B||A))
    prefix_topk_equal: np.ndarray | None = None
    prefix_kl_ab: np.ndarray | None = None  # KL(A||B) alone
    prefix_top1_disagree: np.ndarray | None = None
    prefix_top1_hard: np.ndarray | None = None
    first_row: np.ndarray | None = None  # first alignment row of each sample (-1 when it has none)

    @property
    def paired(self) -> np.ndarray:
        return self.in_a & self.in_b

    @property
    def ids_identical(self) -> np.ndarray:
        return self.paired & (self.first_divergence < 0)

    @property
    def identical(self) -> np.ndarray:
        return self.ids_identical & (self.n_logprob_diff == 0) & (self.n_topk_diff == 0)

    def __len__(self) -> int:
        return len(self.doc_id)


def prefix_values(values: np.ndarray | None) -> np.ndarray:
    """One of a :class:`SampleTokenDiffs`' ``prefix_*`` arrays where it has shared-prefix positions:
    :func:`compare_tokens` sets them all together, the fields are Optional only for their default."""
    if values is None:
        raise ValueError("a SampleTokenDiffs with shared-prefix positions lacks one of its per-position arrays")
    return values


@dataclass(frozen=True)
class TokenComparison:
    summaries: tuple[TaskTokenSummary, ...]
    samples: SampleTokenDiffs | None = dataclasses.field(default=None, repr=False, compare=False)
    positions: Alignment | None = dataclasses.field(default=None, repr=False, compare=False)
