"""What the per-token comparison (:mod:`evalpipe.compare.tokens`) gives: the result
types, per sample and per task, and the constants they are defined with. The terms are
defined in that module's docstring."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from evalpipe.compare.scores import Alignment
from evalpipe.documents.comparison import TokenSummary

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
# result types (a task's summary is the document model documents.comparison.TokenSummary)
# ---------------------------------------------------------------------------


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
    summaries: tuple[TokenSummary, ...]
    samples: SampleTokenDiffs | None = dataclasses.field(default=None, repr=False, compare=False)
    positions: Alignment | None = dataclasses.field(default=None, repr=False, compare=False)
