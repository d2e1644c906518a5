"""Per-token comparison of two traces of the same samples.

Two kinds of traces go through here with the same schema: free-running ones
(tokens.parquet: each side generated its own continuation) and teacher-forced ones
(teacher.parquet: both sides scored the reference's continuation, so the token ids
agree everywhere and the whole sequence is the shared prefix; what differs is the
logprob of the forced token and each side's own top-k at each position).

Both token tables are aligned on (task, doc_id, repeat, pos) with one vectorised
outer join (:func:`evalpipe.compare.scores.align_keys`, on the four keys packed into
one integer); per-sample reductions use
``np.*.reduceat`` over the sample segments, and each table's top-k lists are read
once into fixed-width matrices straight from the Arrow buffers, so the cost is a
few array passes and never a Python loop per token. Only the handful of "worst"
examples is built in a Python loop.

Terms used throughout:

* first divergence: the first position whose token ids differ, or the shorter
  length when one sequence is a strict prefix of the other (None if ids identical).
* shared prefix: the positions before the first divergence; these are the
  "compared positions". Logprob differences are measured there only: after a
  divergence the contexts differ and |dlogprob| means nothing.
* identical (bitwise): same ids, same length, and bit-equal logprob and top-k lists
  at every position.

* near tie: two tokens x_a (A's choice) and x_b (B's choice) are a near tie when
  x_b is in A's top-k, x_a is in B's top-k, and BOTH sides' logprob gaps are below
  ``near_tie_gap``: A's |logprob of x_a - A's top-k logprob of x_b| and B's
  |logprob of x_b - B's top-k logprob of x_a|. Requiring both (hard as soon as
  either gap reaches the threshold) makes the class independent of which variant is
  the reference: swapping A and B swaps the two gaps and nothing else.
* near-tie / hard first divergence: the rule above at the first divergence, with
  each side's generated token and its logprob. Every other divergence is hard,
  including one where a side has no token at that position (its sequence ended).
* top-1 agreement: at a compared position the two sides' top-1 ids
  (``topk_ids[0]``) agree, or they disagree; a disagreement is classified with the
  same rule, each side's own logprob being its ``topk_logprobs[0]``; a side with an
  empty list has no top-1 (hard against a listed one, agreement when both are
  empty). In a teacher-forced trace this is where the variant would have picked
  another token.
* top-k KL: the per-position divergence between the two top-k distributions, see
  :func:`topk_kl` for the "missing mass" rule. KL is asymmetric, so the summaries
  (``kl_p50``/``kl_p99``/``kl_max``, ``worst_kl``, ``kl_max_at``, ``kl_hist``) use
  the symmetric ``max(KL(A||B), KL(B||A))`` per position: it bounds both directions,
  stays in nats on the same scale as either KL (unlike Jensen-Shannon, which saturates
  at ln 2 and is ~4x smaller for small differences, so KL thresholds would not carry
  over), and is computed on a union ordered by token id, so swapping the variants
  gives bit-identical values.
* decade histograms (``kl_hist``, ``abs_dlogprob_hist``) over the compared positions:
  ``zero`` counts exact zeros, ``counts[i]`` the values x > 0 in
  [1e{d}, 1e{d+1}) for d = ``HIST_DECADES[i]``, the edges being the doubles the decimal
  literals parse to (so the first bin also holds everything below 1e-10 and the last
  everything from 100 up).

The aligned positions (:attr:`TokenComparison.positions`) and per-sample arrays
(:attr:`TokenComparison.samples`) are kept so that later checks need not re-align.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalpipe.compare.scores import Alignment, align_keys, column_codes, to_jsonable
from evalpipe.documents import comparison as schema
from evalpipe.errors import UserError
from evalpipe.rundir.artifacts import SAMPLE_KEY

TOKEN_KEY = SAMPLE_KEY + ("pos",)
_BIG = np.iinfo(np.int64).max
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
# Probability floor for the top-k KL (before renormalising), so log(P/Q) stays finite.
KL_FLOOR = 1e-12
_LOG_KL_FLOOR = float(np.log(KL_FLOOR))
# Tokens of side A shown before the position of a worst example.
CONTEXT_TOKENS = 24
# log10 decades of the plot histograms; values outside are clipped into the end bins.
HIST_DECADES = tuple(range(-10, 3))
# The powers of ten between those decades as the decimal literals parse: correctly
# rounded, so the same doubles on every CPU. floor(log10 x) and 10.0**d go through libm,
# whose last bit differs between machines right at the decade edges.
_DECADE_EDGES = np.array([float(f"1e{d}") for d in HIST_DECADES[1:]])
# Rows per chunk of the top-k passes: bounds the temporaries at a few MB each, which
# also keeps them in cache.
_ROW_CHUNK = 1 << 14


# ---------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorstExample:
    """One notable position with both top-k lists.

    ``kind`` is "earliest_divergence" (a sample's first divergence),
    "largest_dlogprob" (where a sample's |dlogprob| peaked) or "largest_kl" (one of
    the task's positions with the largest symmetric top-k KL). Token / top-k fields of
    a side are None when that side has no token at ``pos`` (its sequence ended).
    ``kl`` is the position's symmetric KL (None off the shared prefix). ``context`` is
    the text of up to CONTEXT_TOKENS tokens of A before ``pos`` ("…" first when
    there are earlier ones) followed by A's token at ``pos`` in ``[[ ]]`` (empty
    brackets when A has none there); None when A's trace has no token texts.
    """

    kind: str
    task: str
    doc_id: int
    repeat: int
    pos: int
    token_a: int | None
    token_b: int | None
    logprob_a: float | None
    logprob_b: float | None
    abs_dlogprob: float | None
    topk_ids_a: list[int] | None
    topk_logprobs_a: list[float] | None
    topk_ids_b: list[int] | None
    topk_logprobs_b: list[float] | None
    len_a: int
    len_b: int
    response_a: str | None = None
    response_b: str | None = None
    target: str | None = None
    kl: float | None = None
    context: str | None = None
    # Text of each side's token and of its top-k entries, where the traces' token_text
    # column knows the id (any id generated or forced anywhere in the two tables).
    token_text_a: str | None = None
    token_text_b: str | None = None
    topk_texts_a: list[str | None] | None = None
    topk_texts_b: list[str | None] | None = None

    def document(self) -> schema.WorstExample:
        return schema.WorstExample.model_validate(to_jsonable(self))


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


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _gather(table: pa.Table, column: str, idx: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
    out = np.full(len(idx), fill, dtype=dtype)
    if table.num_rows == 0 or len(idx) == 0:
        return out
    values = np.asarray(table.column(column).to_numpy(), dtype=dtype)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out


def _take_union(al: Alignment, a: pa.Table, b: pa.Table, column: str, rows: np.ndarray) -> list[Any]:
    """Python values of ``column`` for alignment rows ``rows`` (from A if present, else B)."""
    ia, ib = al.idx_a[rows], al.idx_b[rows]
    out: list[Any] = [None] * len(rows)
    from_a = np.flatnonzero(ia >= 0)
    from_b = np.flatnonzero((ia < 0) & (ib >= 0))
    if len(from_a):
        for i, v in zip(from_a.tolist(), a.column(column).take(pa.array(ia[from_a])).to_pylist()):
            out[i] = v
    if len(from_b):
        for i, v in zip(from_b.tolist(), b.column(column).take(pa.array(ib[from_b])).to_pylist()):
            out[i] = v
    return out


def _list_lengths(arr: pa.Array) -> np.ndarray:
    return np.asarray(pc.list_value_length(arr).fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _list_matrix(column: pa.ChunkedArray, k: int, fill: Any, dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """A list column as an (n, k) matrix padded with ``fill``, and each list's length (-1 = null list).

    ``dtype`` None keeps the values' own type. When every list has exactly k entries
    (the usual case) and no conversion is asked for, the matrix is a view of the Arrow
    value buffer: converting or copying ~10^7 values costs more than the comparison.
    """
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    lens = _list_lengths(arr)
    if n == 0 or k == 0:
        return np.full((n, k), fill, dtype=dtype), lens
    flat = arr.flatten()  # values of the non-null lists, honouring slice offsets
    if flat.null_count:
        flat = flat.fill_null(fill)
    values = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=dtype)
    if values.dtype.kind == "u":  # room for the -1 padding
        values = values.astype(np.int64)
    if (lens == k).all():
        return values.reshape(n, k), lens
    out = np.full((n, k), fill, dtype=dtype)
    used = np.maximum(lens, 0)
    row = np.repeat(np.arange(n), used)
    col = np.arange(len(values)) - np.repeat(np.cumsum(used) - used, used)
    out[row, col] = values
    return out, lens


@dataclass(frozen=True, eq=False)
class _TopK:
    """One table's top-k lists as fixed-width matrices (ids padded with -1, logprobs with -inf)."""

    ids: np.ndarray  # the column's integer type
    lps: np.ndarray  # float32, the schema's precision (bitwise comparisons need it)
    n_ids: np.ndarray  # list lengths, -1 for a null list
    n_lps: np.ndarray

    @classmethod
    def of(cls, table: pa.Table, k: int) -> _TopK:
        ids, n_ids = _list_matrix(table.column("topk_ids"), k, -1)
        lps, n_lps = _list_matrix(table.column("topk_logprobs"), k, -np.inf, np.float32)
        return cls(ids, lps, n_ids, n_lps)

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logprobs) of rows ``idx``; -1 gives an empty (all padding) row."""
        if len(self.ids) == 0:
            k = self.ids.shape[1]
            return np.full((len(idx), k), -1, dtype=np.int64), np.full((len(idx), k), -np.inf, dtype=np.float32)
        safe = np.maximum(idx, 0)
        ids, lps = self.ids[safe], self.lps[safe]
        missing = idx < 0
        ids[missing], lps[missing] = -1, -np.inf
        return ids, lps


def _topk_width(a: pa.Table, b: pa.Table) -> int:
    widths = [int(pc.max(pc.list_value_length(t.column("topk_ids"))).as_py() or 0) for t in (a, b) if t.num_rows]
    return max(widths, default=0)


def _kl_from_union(
    p: np.ndarray, lp: np.ndarray, q: np.ndarray, lq: np.ndarray, valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(KL(P||Q), KL(Q||P)) per row from raw masses and their logs on a common union of slots.

    Masses below KL_FLOOR are raised to it, then each side is renormalised over the
    valid slots. Working with the logs as given (the traces' own logprobs) rather than
    log(exp(.)) keeps identical inputs at exactly 0 and tiny KLs accurate.
    """
    low_p, low_q = p < KL_FLOOR, q < KL_FLOOR
    p = np.where(valid, np.where(low_p, KL_FLOOR, p), 0.0)
    q = np.where(valid, np.where(low_q, KL_FLOOR, q), 0.0)
    sp, sq = p.sum(axis=1), q.sum(axis=1)
    sp, sq = np.where(sp > 0, sp, 1.0), np.where(sq > 0, sq, 1.0)
    lp = np.where(low_p, _LOG_KL_FLOOR, lp) - np.log(sp)[:, None]
    lq = np.where(low_q, _LOG_KL_FLOOR, lq) - np.log(sq)[:, None]
    diff = np.where(valid, lp - lq, 0.0)
    kl_pq = np.maximum((p * diff).sum(axis=1) / sp, 0.0)
    kl_qp = np.maximum(-(q * diff).sum(axis=1) / sq, 0.0)
    return kl_pq, kl_qp


def _kl_aligned(la: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both KLs for rows whose two full id lists are equal slot by slot: no padding, nothing missing.

    The arithmetic of :func:`_kl_from_union` without its masks, the floor applied to
    the logprobs: this is the path nearly every position of two close variants takes.
    """
    la64 = np.maximum(la, _LOG_KL_FLOOR, dtype=np.float64)
    lb64 = np.maximum(lb, _LOG_KL_FLOOR, dtype=np.float64)
    p, q = np.exp(la64), np.exp(lb64)
    sp, sq = p.sum(axis=1), q.sum(axis=1)
    diff = la64 - lb64
    diff -= (np.log(sp) - np.log(sq))[:, None]
    kl_pq = np.maximum(np.einsum("ij,ij->i", p, diff) / sp, 0.0)
    kl_qp = np.maximum(-np.einsum("ij,ij->i", q, diff) / sq, 0.0)
    return kl_pq, kl_qp


def _kl_union(
    ia: np.ndarray, la: np.ndarray, ib: np.ndarray, lb: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both KLs and top-k set equality for rows with any id lists, on their union sorted by id.

    Each row's 2k entries are sorted by (id, side, slot) packed into one int64, which
    pairs a token listed by both sides as adjacent A-then-B entries. Id order does
    not depend on which side is A, so swapping the sides gives the same sums.
    """
    m, k = ia.shape
    width = 2 * k
    bits = max(1, (width - 1).bit_length())
    va, vb = ia >= 0, ib >= 0
    la64, lb64 = la.astype(np.float64), lb.astype(np.float64)
    pa_ = np.where(va, np.exp(la64), 0.0)
    pb_ = np.where(vb, np.exp(lb64), 0.0)
    rest_a = np.maximum(0.0, 1.0 - pa_.sum(axis=1))
    rest_b = np.maximum(0.0, 1.0 - pb_.sum(axis=1))
    sentinel = int(max(ia.max(initial=0), ib.max(initial=0))) + 1  # padding sorts last
    ids = np.concatenate([np.where(va, ia, sentinel), np.where(vb, ib, sentinel)], axis=1).astype(np.int64)
    packed = np.sort((ids << bits) | np.arange(width, dtype=np.int64), axis=1)
    sid, slot = packed >> bits, packed & ((1 << bits) - 1)
    valid = sid != sentinel
    from_a = slot < k
    pair_next = np.zeros((m, width), dtype=bool)  # A entry whose token B lists too (B's entry follows)
    pair_next[:, :-1] = (sid[:, :-1] == sid[:, 1:]) & from_a[:, :-1] & ~from_a[:, 1:] & valid[:, :-1]
    keep = valid.copy()  # one union entry per token: drop B's half of a pair
    keep[:, 1:] &= ~pair_next[:, :-1]
    zeros = np.zeros((m, k))
    p_e = np.take_along_axis(np.concatenate([pa_, zeros], axis=1), slot, axis=1)
    lp_e = np.take_along_axis(np.concatenate([la64, zeros], axis=1), slot, axis=1)
    q_e = np.take_along_axis(np.concatenate([zeros, pb_], axis=1), slot, axis=1)
    lq_e = np.take_along_axis(np.concatenate([zeros, lb64], axis=1), slot, axis=1)
    q_next, lq_next = np.zeros_like(q_e), np.zeros_like(lq_e)
    q_next[:, :-1], lq_next[:, :-1] = q_e[:, 1:], lq_e[:, 1:]
    b_only = keep & ~from_a
    a_only = keep & from_a & ~pair_next
    n_miss_a, n_miss_b = b_only.sum(axis=1), a_only.sum(axis=1)  # union tokens each side lacks
    # an unlisted token is at most as likely as the side's last listed one
    cap_a = np.where(va, pa_, 1.0).min(axis=1, initial=1.0)
    cap_b = np.where(vb, pb_, 1.0).min(axis=1, initial=1.0)
    fill_a = np.where(n_miss_a > 0, np.minimum(rest_a / np.maximum(n_miss_a, 1), cap_a), 0.0)[:, None]
    fill_b = np.where(n_miss_b > 0, np.minimum(rest_b / np.maximum(n_miss_b, 1), cap_b), 0.0)[:, None]
    with np.errstate(divide="ignore"):
        log_fill_a, log_fill_b = np.log(fill_a), np.log(fill_b)
    p = np.where(from_a, p_e, fill_a)
    lp = np.where(from_a, lp_e, log_fill_a)
    q = np.where(from_a, np.where(pair_next, q_next, fill_b), q_e)
    lq = np.where(from_a, np.where(pair_next, lq_next, log_fill_b), lq_e)
    kl_ab, kl_ba = _kl_from_union(p, np.where(keep, lp, 0.0), q, np.where(keep, lq, 0.0), keep)
    return kl_ab, kl_ba, (n_miss_a == 0) & (n_miss_b == 0)


def _kl_pair(
    ids_a: np.ndarray, lp_a: np.ndarray, ids_b: np.ndarray, lp_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: KL(A||B), KL(B||A) and top-k id set equality, for (m, k) padded matrices of equal width."""
    n = len(ids_a)
    kl_ab, kl_ba = np.zeros(n), np.zeros(n)
    same = np.ones(n, dtype=bool)
    if ids_a.shape[1] == 0:
        return kl_ab, kl_ba, same
    aligned = (ids_a == ids_b).all(axis=1) & (ids_a >= 0).all(axis=1)
    fast, slow = np.flatnonzero(aligned), np.flatnonzero(~aligned)
    if len(fast):
        kl_ab[fast], kl_ba[fast] = _kl_aligned(lp_a[fast], lp_b[fast])
    if len(slow):
        kl_ab[slow], kl_ba[slow], same[slow] = _kl_union(ids_a[slow], lp_a[slow], ids_b[slow], lp_b[slow])
    return kl_ab, kl_ba, same


def _pad_width(ids: np.ndarray, lps: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    n, w = ids.shape
    if w == k:
        return ids, lps
    return (
        np.concatenate([ids, np.full((n, k - w), -1, dtype=ids.dtype)], axis=1),
        np.concatenate([lps, np.full((n, k - w), -np.inf, dtype=lps.dtype)], axis=1),
    )


def topk_kl(
    ids_a: np.ndarray, lp_a: np.ndarray, ids_b: np.ndarray, lp_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: KL(A||B) between two top-k distributions, and whether the top-k id sets are equal.

    Inputs are (n, k) arrays padded with id -1 / logprob -inf. Both distributions are
    put on the union of the two id sets. "Missing mass" rule: a token in one list but
    not in the other gets, on the side that lacks it, that side's leftover mass
    ``max(0, 1 - sum(exp(own top-k logprobs)))`` divided equally among all the union
    tokens that side lacks, but at most that side's smallest listed probability: a
    token outside a top-k list is no more likely than the list's last entry. (Without
    that cap a token entering at rank k, a rounding-level event, would be given the
    whole leftover mass, often tenths of the distribution, and score tens of nats.)
    Then every union entry is floored at ``KL_FLOOR`` (1e-12)
    and each side is renormalised to sum to 1 over the union, so the KL is finite; mass
    outside the union is ignored. Identical inputs give exactly 0. The rule treats both
    sides alike, so KL(B||A) is this function with the sides swapped; the summaries use
    the larger of the two. Rows are processed in chunks; rows whose lists agree slot by
    slot skip the union.
    """
    ids_a, ids_b = np.asarray(ids_a, dtype=np.int64), np.asarray(ids_b, dtype=np.int64)
    lp_a, lp_b = np.asarray(lp_a, dtype=np.float64), np.asarray(lp_b, dtype=np.float64)
    k = max(ids_a.shape[1], ids_b.shape[1])
    ids_a, lp_a = _pad_width(ids_a, lp_a, k)
    ids_b, lp_b = _pad_width(ids_b, lp_b, k)
    n = len(ids_a)
    kl = np.zeros(n)
    same = np.ones(n, dtype=bool)
    for lo in range(0, n, _ROW_CHUNK):  # chunks of rows, not tokens
        sl = slice(lo, min(n, lo + _ROW_CHUNK))
        kl[sl], _, same[sl] = _kl_pair(ids_a[sl], lp_a[sl], ids_b[sl], lp_b[sl])
    return kl, same


def _tie_gap(own_lp: np.ndarray, other_tok: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> np.ndarray:
    """One side's |logprob of its own token - its top-k logprob of the other side's token|; NaN if not listed."""
    if ids.shape[1] == 0:  # no top-k lists: nothing can be shown to be a near tie
        return np.full(len(ids), np.nan)
    hit = (ids == other_tok[:, None]) & (ids >= 0)
    found = hit.any(axis=1)
    other_lp = lps[np.arange(len(ids)), np.argmax(hit, axis=1)].astype(np.float64)
    return np.where(found, np.abs(own_lp - other_lp), np.nan)


def _near_tie(
    tok_a: np.ndarray,
    lp_a: np.ndarray,
    ids_a: np.ndarray,
    lps_a: np.ndarray,
    tok_b: np.ndarray,
    lp_b: np.ndarray,
    ids_b: np.ndarray,
    lps_b: np.ndarray,
    near_tie_gap: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(near tie?, A's gap) for competing tokens tok_a vs tok_b (-1 = that side has none); see the module docstring."""
    gap_a = _tie_gap(lp_a, tok_b, ids_a, lps_a)
    gap_b = _tie_gap(lp_b, tok_a, ids_b, lps_b)
    both = (tok_a >= 0) & (tok_b >= 0)
    gap_a = np.where(both, gap_a, np.nan)
    with np.errstate(invalid="ignore"):
        near = both & (gap_a < near_tie_gap) & (gap_b < near_tie_gap)
    return near, gap_a


@dataclass(frozen=True, eq=False)
class _PrefixMetrics:
    topk_diff: np.ndarray
    kl_ab: np.ndarray
    kl_ba: np.ndarray
    topk_equal: np.ndarray
    top1_disagree: np.ndarray
    top1_hard: np.ndarray


def _prefix_metrics(ta: _TopK, tb: _TopK, ra: np.ndarray, rb: np.ndarray, near_tie_gap: float) -> _PrefixMetrics:
    """Per shared-prefix position (rows ra[i] of A, rb[i] of B, both present): every top-k quantity, in one pass."""
    n, k = len(ra), ta.ids.shape[1]
    diff = (ta.n_ids[ra] != tb.n_ids[rb]) | (ta.n_lps[ra] != tb.n_lps[rb])
    kl_ab, kl_ba = np.zeros(n), np.zeros(n)
    same = np.ones(n, dtype=bool)
    disagree, hard = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for lo in range(0, n if k else 0, _ROW_CHUNK):
        sl = slice(lo, min(n, lo + _ROW_CHUNK))
        ia, la = ta.take(ra[sl])
        ib, lb = tb.take(rb[sl])
        # padding is equal on both sides whenever the lengths are, so whole rows compare
        differs = (ia != ib).any(axis=1) | (la.view(np.uint32) != lb.view(np.uint32)).any(axis=1)
        diff[sl] |= differs
        todo = np.flatnonzero(differs)  # bit-equal rows: KL exactly 0, sets equal
        if len(todo):
            kl_ab[lo + todo], kl_ba[lo + todo], same[lo + todo] = _kl_pair(ia[todo], la[todo], ib[todo], lb[todo])
        # Non-finite logprobs on one side (an overflow, a NaN) are the largest
        # difference there is, not a missing measurement.
        # (-inf is the padding of short top-k lists, so only NaN / +inf count)
        broken = differs & (_nonfinite_rows(la) ^ _nonfinite_rows(lb))
        if broken.any():
            where = lo + np.flatnonzero(broken)
            kl_ab[where] = kl_ba[where] = np.inf
            same[where] = False
        flip = np.flatnonzero((ia[:, 0] != ib[:, 0]) | broken)
        if len(flip):
            fa, fb = ia[flip], ib[flip]
            near, _ = _near_tie(
                fa[:, 0], la[flip, 0].astype(np.float64), fa, la[flip],
                fb[:, 0], lb[flip, 0].astype(np.float64), fb, lb[flip], near_tie_gap,
            )
            disagree[lo + flip] = True
            hard[lo + flip] = ~near | broken[flip]
    return _PrefixMetrics(diff, kl_ab, kl_ba, same, disagree, hard)


def _nonfinite_rows(lps: np.ndarray) -> np.ndarray:
    return (np.isnan(lps) | np.isposinf(lps)).any(axis=1)


def _align_positions(tokens_a: pa.Table, tokens_b: pa.Table) -> Alignment:
    """:func:`align_keys` on (task, doc_id, repeat, pos), with the four keys packed into one int64.

    Sorting one packed column instead of four is several times faster at ~10^6
    positions. Packing keeps the key order (task code in the high bits), so the
    result is the same; when the ranges do not fit in 62 bits, or a key is duplicated
    (for the error message in the columns' own terms), the plain join runs.
    """
    def plain() -> Alignment:
        keys = list(TOKEN_KEY)
        return align_keys(tokens_a.select(keys), tokens_b.select(keys), TOKEN_KEY, "token positions")

    if tokens_a.num_rows == 0 or tokens_b.num_rows == 0:
        return plain()
    cols = [column_codes(tokens_a.column("task"), tokens_b.column("task"))] + [
        (np.asarray(tokens_a.column(k).to_numpy(), np.int64), np.asarray(tokens_b.column(k).to_numpy(), np.int64))
        for k in TOKEN_KEY[1:]
    ]
    lows = [int(min(ca.min(), cb.min())) for ca, cb in cols]
    widths = [max(1, (int(max(ca.max(), cb.max())) - lo).bit_length()) for (ca, cb), lo in zip(cols, lows)]
    if sum(widths) > 62:
        return plain()
    shifts = [sum(widths[i + 1 :]) for i in range(len(widths))]
    packed = [
        functools.reduce(np.bitwise_or, [(c[side] - lo) << sh for c, lo, sh in zip(cols, lows, shifts)])
        for side in (0, 1)
    ]
    try:
        al = align_keys(pa.table({"key": packed[0]}), pa.table({"key": packed[1]}), ("key",), "token positions")
    except UserError:  # duplicate keys: the plain path names them
        return plain()
    codes = tuple(((al.codes[0] >> sh) & ((1 << w) - 1)) + lo for sh, w, lo in zip(shifts, widths, lows))
    return Alignment(TOKEN_KEY, codes, al.idx_a, al.idx_b)


def _key_table(task: list[Any] | np.ndarray, doc_id: np.ndarray, repeat: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "task": pa.array(list(task), type=pa.string()),
            "doc_id": pa.array(np.asarray(doc_id, dtype=np.int64)),
            "repeat": pa.array(np.asarray(repeat, dtype=np.int64)),
        }
    )


def _empty_keys() -> pa.Table:
    return _key_table([], np.zeros(0, np.int64), np.zeros(0, np.int64))


def _sample_keys(table: pa.Table) -> pa.Table:
    return _key_table(
        table.column("task").cast(pa.string()).to_pylist(),
        table.column("doc_id").to_numpy(),
        table.column("repeat").to_numpy(),
    )


# ---------------------------------------------------------------------------
# main entry point
# ---------------------------------------------------------------------------


def sample_token_diffs(
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None = None,
    samples_b: pa.Table | None = None,
    *,
    near_tie_gap: float = NEAR_TIE_GAP,
) -> tuple[SampleTokenDiffs, Alignment]:
    """Align both token tables and compute the per-sample arrays (vectorised)."""
    pal = _align_positions(tokens_a, tokens_b)
    n_pos = len(pal)
    in_a, in_b = pal.in_a, pal.in_b
    k = _topk_width(tokens_a, tokens_b)
    topk_a, topk_b = _TopK.of(tokens_a, k), _TopK.of(tokens_b, k)

    # --- per-position quantities -------------------------------------------------
    if n_pos:
        tcode, doc, rep, pos = pal.codes
        new = np.ones(n_pos, dtype=bool)
        new[1:] = (tcode[1:] != tcode[:-1]) | (doc[1:] != doc[:-1]) | (rep[1:] != rep[:-1])
        starts = np.flatnonzero(new)
        seg = np.cumsum(new) - 1
        ids_a = _gather(tokens_a, "token_id", pal.idx_a, -1, np.int64)
        ids_b = _gather(tokens_b, "token_id", pal.idx_b, -1, np.int64)
        lp_a = _gather(tokens_a, "logprob", pal.idx_a, np.nan, np.float32)
        lp_b = _gather(tokens_b, "logprob", pal.idx_b, np.nan, np.float32)
        mismatch = ~(in_a & in_b & (ids_a == ids_b))
        rows = np.arange(n_pos, dtype=np.int64)
        fd_seg = np.minimum.reduceat(np.where(mismatch, pos, _BIG), starts)
        fd_row_seg = np.minimum.reduceat(np.where(mismatch, rows, _BIG), starts)
        prefix = pos < fd_seg[seg]  # positions before the first divergence (same ids there)
        bits_eq = lp_a.view(np.uint32) == lp_b.view(np.uint32)
        signed = np.where(bits_eq, 0.0, lp_b.astype(np.float64) - lp_a.astype(np.float64))
        dlp = np.abs(signed)
        dlp = np.where(np.isnan(dlp), np.inf, dlp)  # NaN on one side only: flag as maximal
        dlp = np.where(prefix, dlp, 0.0)
        cnt_seg = np.add.reduceat(prefix.astype(np.int64), starts)
        max_seg = np.maximum.reduceat(dlp, starts)
        sum_seg = np.add.reduceat(dlp, starts)
        is_max = prefix & (max_seg[seg] > 0) & (dlp == max_seg[seg])
        amax_row_seg = np.minimum.reduceat(np.where(is_max, rows, _BIG), starts)
        lpdiff_seg = np.add.reduceat((prefix & ~bits_eq).astype(np.int64), starts)
        pr = np.flatnonzero(prefix)
        pm = _prefix_metrics(topk_a, topk_b, pal.idx_a[pr], pal.idx_b[pr], near_tie_gap)
        topk_row = np.zeros(n_pos, dtype=np.int64)
        topk_row[pr] = pm.topk_diff
        topk_seg = np.add.reduceat(topk_row, starts)
        len_a_seg = np.add.reduceat(in_a.astype(np.int64), starts)
        len_b_seg = np.add.reduceat(in_b.astype(np.int64), starts)
        seg_keys = _key_table(_take_union(pal, tokens_a, tokens_b, "task", starts), doc[starts], rep[starts])
    else:
        starts = np.zeros(0, dtype=np.int64)
        z = np.zeros(0, dtype=np.int64)
        fd_seg = fd_row_seg = amax_row_seg = cnt_seg = lpdiff_seg = topk_seg = len_a_seg = len_b_seg = z
        max_seg = sum_seg = np.zeros(0, dtype=np.float64)
        seg_keys = _empty_keys()
        seg = z
        prefix = np.zeros(0, dtype=bool)
        dlp = signed = np.zeros(0, dtype=np.float64)
        pr = z
        pm = _prefix_metrics(topk_a, topk_b, z, z, near_tie_gap)

    # --- the sample universe ------------------------------------------------------
    if samples_a is not None and samples_b is not None:
        sal = align_keys(_sample_keys(samples_a), _sample_keys(samples_b), SAMPLE_KEY, "samples")
        uni_rows = np.arange(len(sal))
        uni_task = _take_union(sal, samples_a, samples_b, "task", uni_rows)
        uni_doc, uni_rep = sal.codes[1], sal.codes[2]
        present_a, present_b = sal.in_a, sal.in_b
        sidx_a, sidx_b = sal.idx_a, sal.idx_b
        m = align_keys(seg_keys, _key_table(uni_task, uni_doc, uni_rep), SAMPLE_KEY, "samples")
        stray = m.in_a & ~m.in_b
        if stray.any():
            i = int(m.idx_a[np.argmax(stray)])
            k = seg_keys.slice(i, 1).to_pylist()[0]
            raise UserError(
                f"tokens.parquet has rows for task {k['task']!r} doc {k['doc_id']} repeat {k['repeat']} "
                "that samples.parquet does not list; the artifacts are inconsistent."
            )
        seg_to_uni = np.full(len(starts), -1, dtype=np.int64)
        ok = m.in_a & m.in_b
        seg_to_uni[m.idx_a[ok]] = m.idx_b[ok]
        for side, lens, present in (("A", len_a_seg, present_a), ("B", len_b_seg, present_b)):
            bad = (lens > 0) & ~present[seg_to_uni]
            if bad.any():
                k = seg_keys.slice(int(np.argmax(bad)), 1).to_pylist()[0]
                raise UserError(
                    f"side {side} has tokens for task {k['task']!r} doc {k['doc_id']} repeat {k['repeat']} "
                    "but no row for it in its samples.parquet; the artifacts are inconsistent."
                )
    else:
        n_seg = len(starts)
        seg_to_uni = np.arange(n_seg, dtype=np.int64)
        uni_task = seg_keys.column("task").to_pylist()
        uni_doc = seg_keys.column("doc_id").to_numpy()
        uni_rep = seg_keys.column("repeat").to_numpy()
        present_a, present_b = len_a_seg > 0, len_b_seg > 0
        sidx_a = sidx_b = np.full(n_seg, -1, dtype=np.int64)

    n_uni = len(uni_doc)

    def scatter(values: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
        out = np.full(n_uni, fill, dtype=dtype)
        out[seg_to_uni] = values
        return out

    both = present_a & present_b
    first_div = scatter(np.where(fd_seg == _BIG, -1, fd_seg), -1, np.int64)
    first_div_row = scatter(np.where(fd_row_seg == _BIG, -1, fd_row_seg), -1, np.int64)
    cnt = scatter(cnt_seg, 0, np.int64)
    max_dlp = scatter(max_seg, np.nan, np.float64)
    max_dlp = np.where(cnt > 0, max_dlp, np.nan)
    first_div = np.where(both, first_div, -1)
    first_div_row = np.where(both, first_div_row, -1)

    # --- first divergences classified (vectorised) ---------------------------------
    div_s = np.flatnonzero(first_div_row >= 0)
    div_r = first_div_row[div_s]
    ra, rb = pal.idx_a[div_r], pal.idx_b[div_r]
    ids_da, lps_da = topk_a.take(ra)
    ids_db, lps_db = topk_b.take(rb)
    near_s, gap_s = _near_tie(
        _gather(tokens_a, "token_id", ra, -1, np.int64), _gather(tokens_a, "logprob", ra, np.nan, np.float64), ids_da, lps_da,
        _gather(tokens_b, "token_id", rb, -1, np.int64), _gather(tokens_b, "logprob", rb, np.nan, np.float64), ids_db, lps_db,
        near_tie_gap,
    )
    near_tie = np.zeros(n_uni, dtype=bool)
    near_tie[div_s] = near_s
    div_gap = np.full(n_uni, np.nan, dtype=np.float64)
    div_gap[div_s] = gap_s
    diffs = SampleTokenDiffs(
        task=np.asarray(uni_task, dtype=object),
        doc_id=np.asarray(uni_doc, dtype=np.int64),
        repeat=np.asarray(uni_rep, dtype=np.int64),
        in_a=np.asarray(present_a, dtype=bool),
        in_b=np.asarray(present_b, dtype=bool),
        len_a=scatter(len_a_seg, 0, np.int64),
        len_b=scatter(len_b_seg, 0, np.int64),
        first_divergence=first_div,
        first_divergence_row=first_div_row,
        shared_prefix=np.where(both, cnt, 0),
        max_abs_dlogprob=np.where(both, max_dlp, np.nan),
        sum_abs_dlogprob=np.where(both, scatter(sum_seg, 0.0, np.float64), 0.0),
        max_dlogprob_row=np.where(both, scatter(np.where(amax_row_seg == _BIG, -1, amax_row_seg), -1, np.int64), -1),
        n_logprob_diff=np.where(both, scatter(lpdiff_seg, 0, np.int64), 0),
        n_topk_diff=np.where(both, scatter(topk_seg, 0, np.int64), 0),
        sample_idx_a=np.asarray(sidx_a, dtype=np.int64),
        sample_idx_b=np.asarray(sidx_b, dtype=np.int64),
        near_tie=near_tie,
        divergence_gap=div_gap,
        prefix_rows=pr,
        prefix_sample=seg_to_uni[seg[pr]] if len(pr) else np.zeros(0, dtype=np.int64),
        prefix_abs_dlogprob=np.asarray(dlp[pr], dtype=np.float64),
        prefix_dlogprob=np.asarray(signed[pr], dtype=np.float64),
        prefix_kl=np.maximum(pm.kl_ab, pm.kl_ba),
        prefix_topk_equal=pm.topk_equal,
        prefix_kl_ab=pm.kl_ab,
        prefix_top1_disagree=pm.top1_disagree,
        prefix_top1_hard=pm.top1_hard,
        first_row=scatter(starts, -1, np.int64),
    )
    return diffs, pal


def opt_float(x: float) -> float | None:
    """NaN (nothing measured) -> None; +inf stays: it marks non-finite logprobs on one
    side, which is the largest difference there is (JSON writes it as null)."""
    return None if np.isnan(x) else float(x)


def quantile(x: np.ndarray, q: float) -> float | None:
    """Percentile ``q`` (linear interpolation; 100 = max); None when empty or not finite."""
    if len(x) == 0:
        return None
    if q >= 100:
        return opt_float(np.max(x))
    x = np.asarray(x, dtype=np.float64)
    infinite = np.isposinf(x)
    if infinite.any():
        # linear interpolation between two infinities gives NaN; between a finite
        # value and an infinity the percentile is infinite, so compute it on a stand-in
        big = np.finfo(np.float64).max
        v = float(np.percentile(np.where(infinite, big, x), q))
        return np.inf if v >= big / 2 else opt_float(v)
    with np.errstate(invalid="ignore"):
        return opt_float(np.percentile(x, q))


def _decade_hist(x: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """(exact zeros, counts per HIST_DECADES decade) of the non-NaN values of ``x`` (all >= 0)."""
    x = x[~np.isnan(x)]
    pos = x[x > 0]
    # Bin i holds [edge[i-1], edge[i]); below the first edge clips into the first decade,
    # from the last one (inf included) into the last.
    bins = np.searchsorted(_DECADE_EDGES, pos, side="right")
    counts = np.bincount(bins, minlength=len(HIST_DECADES))
    return int(np.count_nonzero(x == 0)), tuple(int(c) for c in counts)


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest positive values, largest first, ties in index order (NaN never)."""
    cand = np.flatnonzero(values > 0)
    if k <= 0 or len(cand) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(cand) > k:  # partition first: a full sort of every position costs more than the rest
        cut = np.partition(values[cand], len(cand) - k)[len(cand) - k]
        cand = cand[values[cand] >= cut]
    return cand[np.lexsort((cand, -values[cand]))][:k]


def _context(d: SampleTokenDiffs, pal: Alignment, tokens_a: pa.Table, s: int, r: int) -> str | None:
    """A's text just before alignment row ``r`` of sample ``s``, with A's token at ``r`` in [[ ]]."""
    if "token_text" not in tokens_a.column_names or d.first_row is None or d.first_row[s] < 0:
        return None
    ia = pal.idx_a[int(d.first_row[s]) : r + 1]
    before = ia[:-1][ia[:-1] >= 0]
    shown = before[-CONTEXT_TOKENS:]
    at = int(ia[-1])
    rows = np.concatenate([shown, [at] if at >= 0 else []]).astype(np.int64)
    texts = tokens_a.column("token_text").take(pa.array(rows)).to_pylist()
    if any(t is None for t in texts):
        return None
    marked = texts.pop() if at >= 0 else ""
    return ("\u2026" if len(before) > len(shown) else "") + "".join(texts) + "[[" + marked + "]]"


def _worst(
    kind: str,
    sel: np.ndarray,
    rows: np.ndarray,
    d: SampleTokenDiffs,
    pal: Alignment,
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None,
    samples_b: pa.Table | None,
) -> tuple[WorstExample, ...]:
    """Examples for samples ``sel[i]`` at alignment rows ``rows[i]`` (a handful)."""
    out: list[WorstExample] = []
    if len(sel) == 0:
        return ()
    pr = d.prefix_rows if d.prefix_rows is not None else np.zeros(0, dtype=np.int64)
    for s, r in zip(sel.tolist(), rows.tolist()):
        ia, ib = int(pal.idx_a[r]), int(pal.idx_b[r])
        pos = int(pal.codes[3][r])

        def side(table: pa.Table, i: int) -> tuple[Any, Any, Any, Any]:
            if i < 0:
                return None, None, None, None
            row = table.slice(i, 1).select(["token_id", "logprob", "topk_ids", "topk_logprobs"]).to_pylist()[0]
            return row["token_id"], row["logprob"], row["topk_ids"], row["topk_logprobs"]

        tok_a, lp_a, tk_a, tkl_a = side(tokens_a, ia)
        tok_b, lp_b, tk_b, tkl_b = side(tokens_b, ib)
        dlp = abs(float(lp_a) - float(lp_b)) if lp_a is not None and lp_b is not None else None

        def text(table: pa.Table | None, i: int, col: str) -> str | None:
            if table is None or i < 0 or col not in table.column_names:
                return None
            return table.column(col)[i].as_py()

        j = int(np.searchsorted(pr, r))
        kl = float(d.prefix_kl[j]) if d.prefix_kl is not None and j < len(pr) and pr[j] == r else None
        sa, sb = int(d.sample_idx_a[s]), int(d.sample_idx_b[s])
        out.append(
            WorstExample(
                kind=kind,
                task=str(d.task[s]),
                doc_id=int(d.doc_id[s]),
                repeat=int(d.repeat[s]),
                pos=pos,
                token_a=tok_a,
                token_b=tok_b,
                logprob_a=lp_a,
                logprob_b=lp_b,
                abs_dlogprob=dlp,
                topk_ids_a=tk_a,
                topk_logprobs_a=tkl_a,
                topk_ids_b=tk_b,
                topk_logprobs_b=tkl_b,
                len_a=int(d.len_a[s]),
                len_b=int(d.len_b[s]),
                response_a=text(samples_a, sa, "response"),
                response_b=text(samples_b, sb, "response"),
                target=text(samples_a, sa, "target") if sa >= 0 else text(samples_b, sb, "target"),
                kl=kl,
                context=_context(d, pal, tokens_a, s, r),
            )
        )
    return _with_texts(out, tokens_a, tokens_b)


def _with_texts(examples: list[WorstExample], *tables: pa.Table) -> tuple[WorstExample, ...]:
    """Fill the token / top-k texts of ``examples`` from the tables' token_text column."""
    wanted = {t for w in examples for t in (w.token_a, w.token_b) if t is not None}
    wanted |= {t for w in examples for ids in (w.topk_ids_a, w.topk_ids_b) if ids for t in ids}
    vocab = _vocabulary(tables, wanted)
    if not vocab:
        return tuple(examples)

    def texts(ids: list[int] | None) -> list[str | None] | None:
        return None if ids is None else [vocab.get(int(t)) for t in ids]

    return tuple(
        dataclasses.replace(
            w,
            token_text_a=vocab.get(w.token_a) if w.token_a is not None else None,
            token_text_b=vocab.get(w.token_b) if w.token_b is not None else None,
            topk_texts_a=texts(w.topk_ids_a),
            topk_texts_b=texts(w.topk_ids_b),
        )
        for w in examples
    )


def _vocabulary(tables: tuple[pa.Table, ...], wanted: set[int]) -> dict[int, str]:
    """id -> text for the ``wanted`` ids that some table's token_text records."""
    vocab: dict[int, str] = {}
    ids = pa.array(sorted(wanted), type=pa.int32())
    for table in tables:
        if "token_text" not in table.column_names or table.num_rows == 0 or not wanted:
            continue
        mask = pc.and_(pc.is_in(table["token_id"], value_set=ids), pc.is_valid(table["token_text"]))
        pairs = table.select(["token_id", "token_text"]).filter(mask)
        unique = pairs.group_by("token_id").aggregate([("token_text", "min")])
        vocab.update(zip(unique["token_id"].to_pylist(), unique["token_text_min"].to_pylist()))
    return vocab


def _key_triples(pal: Alignment, rows: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """(doc_id, repeat, pos) of alignment rows."""
    return tuple(zip(pal.codes[1][rows].tolist(), pal.codes[2][rows].tolist(), pal.codes[3][rows].tolist()))


def _rows_of(d: SampleTokenDiffs, prefix_idx: np.ndarray, per_prefix: np.ndarray | None = None) -> np.ndarray:
    """Alignment rows (or ``per_prefix`` values) of shared-prefix positions ``prefix_idx``."""
    values = d.prefix_rows if per_prefix is None else per_prefix
    if len(prefix_idx) == 0 or values is None:
        return np.zeros(0, dtype=np.int64)
    return values[prefix_idx]


def summarize_tokens(
    d: SampleTokenDiffs,
    pal: Alignment,
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None = None,
    samples_b: pa.Table | None = None,
    *,
    worst_k: int = 5,
    near_tie_gap: float = NEAR_TIE_GAP,
) -> tuple[TaskTokenSummary, ...]:
    """Per task summary (loop over tasks only) with the ``worst_k`` notable samples of each kind."""
    out = []
    n = len(d)
    if n == 0:
        return ()
    task = d.task
    bounds = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
    ends = np.r_[bounds[1:], n]
    paired_all, ids_id_all, id_all = d.paired, d.ids_identical, d.identical
    prefix_sample = d.prefix_sample if d.prefix_sample is not None else np.zeros(0, dtype=np.int64)
    n_pr = len(prefix_sample)
    if n_pr:
        pr_order = np.argsort(prefix_sample, kind="stable")
        pr_sorted = prefix_sample[pr_order]
    near_all = d.near_tie if d.near_tie is not None else np.zeros(n, dtype=bool)
    worst = functools.partial(_worst, d=d, pal=pal, tokens_a=tokens_a, tokens_b=tokens_b, samples_a=samples_a, samples_b=samples_b)
    for start, end in zip(bounds.tolist(), ends.tolist()):
        sl = slice(start, end)
        idx = np.arange(start, end)
        paired = paired_all[sl]
        ids_id = ids_id_all[sl]
        only_a = d.in_a[sl] & ~d.in_b[sl]
        only_b = d.in_b[sl] & ~d.in_a[sl]
        fd = d.first_divergence[sl]
        div = paired & (fd >= 0)
        positions = np.sort(fd[div])
        cnt = d.shared_prefix[sl][paired]
        mx = d.max_abs_dlogprob[sl]
        mx_paired = mx[paired & (d.shared_prefix[sl] > 0)]
        mx_same = mx[ids_id & (d.shared_prefix[sl] > 0)]
        total_cnt = int(cnt.sum())
        # earliest divergences: by (pos, doc_id, repeat)
        div_idx = idx[div]
        order = np.lexsort((d.repeat[div_idx], d.doc_id[div_idx], d.first_divergence[div_idx]))
        worst_div = div_idx[order][:worst_k]
        # largest |dlogprob| on the shared prefix
        lp_sel = paired & (np.nan_to_num(mx, nan=0.0) > 0)
        lp_idx = idx[lp_sel]
        order = np.lexsort((d.repeat[lp_idx], d.doc_id[lp_idx], -d.max_abs_dlogprob[lp_idx]))
        worst_lp = lp_idx[order][:worst_k]
        # near-tie / hard first divergences
        near = div & near_all[sl]
        hard_idx = idx[div & ~near]
        hard = tuple(
            (int(a), int(b), int(c))
            for a, b, c in zip(
                d.doc_id[hard_idx][:MAX_LISTED_HARD],
                d.repeat[hard_idx][:MAX_LISTED_HARD],
                d.first_divergence[hard_idx][:MAX_LISTED_HARD],
            )
        )
        # per-position distribution agreement over the shared prefix
        if n_pr:
            lo, hi = np.searchsorted(pr_sorted, [start, end])
            rows = pr_order[lo:hi]
        else:
            rows = np.zeros(0, dtype=np.int64)
        n_rows = len(rows)
        kl = prefix_values(d.prefix_kl)[rows] if n_rows else np.zeros(0)
        adl = prefix_values(d.prefix_abs_dlogprob)[rows] if n_rows else np.zeros(0)
        n_same = int(prefix_values(d.prefix_topk_equal)[rows].sum()) if n_rows else 0
        n_top1_dis = int(prefix_values(d.prefix_top1_disagree)[rows].sum()) if n_rows else 0
        top1_hard = rows[prefix_values(d.prefix_top1_hard)[rows]] if n_rows else rows
        kl_max = quantile(kl, 100)
        # prefix rows are in key order, so index order breaks ties by key
        worst_kl = rows[_largest(kl, worst_k)]
        kl_at = rows[[int(np.argmax(kl))]] if kl_max else rows[:0]
        kl_zero, kl_hist = _decade_hist(kl)
        adl_zero, adl_hist = _decade_hist(adl)
        out.append(
            TaskTokenSummary(
                task=str(task[start]),
                n_samples=int(paired.sum()),
                only_a=int(only_a.sum()),
                only_b=int(only_b.sum()),
                only_a_keys=tuple(
                    (int(a), int(b)) for a, b in zip(d.doc_id[sl][only_a][:MAX_LISTED_KEYS], d.repeat[sl][only_a])
                ),
                only_b_keys=tuple(
                    (int(a), int(b)) for a, b in zip(d.doc_id[sl][only_b][:MAX_LISTED_KEYS], d.repeat[sl][only_b])
                ),
                n_ids_identical=int(ids_id.sum()),
                n_identical=int(id_all[sl].sum()),
                n_logprob_diff_same_ids=int((ids_id & (d.n_logprob_diff[sl] > 0)).sum()),
                n_topk_diff_same_ids=int((ids_id & (d.n_logprob_diff[sl] == 0) & (d.n_topk_diff[sl] > 0)).sum()),
                n_length_diff=int((paired & (d.len_a[sl] != d.len_b[sl])).sum()),
                tokens_a=int(d.len_a[sl][paired].sum()),
                tokens_b=int(d.len_b[sl][paired].sum()),
                n_positions_compared=total_cnt,
                n_positions_logprob_diff=int(d.n_logprob_diff[sl][paired].sum()),
                divergence_positions=tuple(int(p) for p in positions),
                median_first_divergence=float(np.median(positions)) if len(positions) else None,
                max_abs_dlogprob=opt_float(mx_paired.max()) if len(mx_paired) else None,
                mean_abs_dlogprob=opt_float(d.sum_abs_dlogprob[sl][paired].sum() / total_cnt) if total_cnt else None,
                max_abs_dlogprob_same_ids=opt_float(mx_same.max()) if len(mx_same) else None,
                worst_divergence=worst("earliest_divergence", worst_div, d.first_divergence_row[worst_div]),
                worst_logprob=worst("largest_dlogprob", worst_lp, d.max_dlogprob_row[worst_lp]),
                near_tie_gap=float(near_tie_gap),
                n_near_tie_divergences=int(near.sum()),
                n_hard_divergences=len(hard_idx),
                hard_divergences=hard,
                n_positions_topk_equal=n_same,
                share_topk_equal=n_same / n_rows if n_rows else None,
                kl_p50=quantile(kl, 50),
                kl_p99=quantile(kl, 99),
                kl_max=kl_max,
                abs_dlogprob_p50=quantile(adl, 50),
                abs_dlogprob_p99=quantile(adl, 99),
                n_top1_disagree=n_top1_dis,
                n_top1_hard=len(top1_hard),
                share_top1_agree=(n_rows - n_top1_dis) / n_rows if n_rows else None,
                top1_hard_positions=_key_triples(pal, _rows_of(d, top1_hard[:MAX_LISTED_HARD])),
                worst_kl=worst("largest_kl", _rows_of(d, worst_kl, d.prefix_sample), _rows_of(d, worst_kl)),
                kl_max_at=(_key_triples(pal, _rows_of(d, kl_at)) or (None,))[0],
                kl_hist_zero=kl_zero,
                kl_hist=kl_hist,
                abs_dlogprob_hist_zero=adl_zero,
                abs_dlogprob_hist=adl_hist,
            )
        )
    return tuple(out)


def compare_tokens(
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None = None,
    samples_b: pa.Table | None = None,
    *,
    worst_k: int = 5,
    near_tie_gap: float = NEAR_TIE_GAP,
) -> TokenComparison:
    """Compare two tokens tables (A = reference, B = variant).

    With the samples tables, the sample set is theirs (so samples that generated no
    token still count, and responses are attached to the worst examples); without
    them it is the set of samples with at least one token row. ``near_tie_gap`` (nats)
    is the near-tie threshold (both sides' logprob gaps) for first divergences and
    top-1 disagreements.
    """
    d, pal = sample_token_diffs(tokens_a, tokens_b, samples_a, samples_b, near_tie_gap=near_tie_gap)
    summaries = summarize_tokens(
        d, pal, tokens_a, tokens_b, samples_a, samples_b, worst_k=worst_k, near_tie_gap=near_tie_gap
    )
    return TokenComparison(summaries=summaries, samples=d, positions=pal)
