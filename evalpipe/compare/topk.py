"""Top-k distributions of two engines at the same positions: the per-position KL between
them, the near-tie rule, and the metrics of the positions both sides agree on (the
shared prefix), computed on fixed-width matrices read once from the Arrow lists.

The terms (near tie, top-k KL and its "missing mass" rule, top-1 agreement) are defined
in :mod:`evalpipe.compare.tokens`, which aligns the traces and summarises these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Probability floor for the top-k KL (before renormalising), so log(P/Q) stays finite.
KL_FLOOR = 1e-12
_LOG_KL_FLOOR = float(np.log(KL_FLOOR))
# Rows per chunk of the top-k passes: bounds the temporaries at a few MB each, which
# also keeps them in cache.
_ROW_CHUNK = 1 << 14


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
class TopK:
    """One table's top-k lists as fixed-width matrices (ids padded with -1, logprobs with -inf)."""

    ids: np.ndarray  # the column's integer type
    lps: np.ndarray  # float32, the schema's precision (bitwise comparisons need it)
    n_ids: np.ndarray  # list lengths, -1 for a null list
    n_lps: np.ndarray

    @classmethod
    def of(cls, table: pa.Table, k: int) -> TopK:
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


def topk_width(a: pa.Table, b: pa.Table) -> int:
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


def near_tie_of(
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


def prefix_metrics(ta: TopK, tb: TopK, ra: np.ndarray, rb: np.ndarray, near_tie_gap: float) -> _PrefixMetrics:
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
            near, _ = near_tie_of(
                fa[:, 0], la[flip, 0].astype(np.float64), fa, la[flip],
                fb[:, 0], lb[flip, 0].astype(np.float64), fb, lb[flip], near_tie_gap,
            )
            disagree[lo + flip] = True
            hard[lo + flip] = ~near | broken[flip]
    return _PrefixMetrics(diff, kl_ab, kl_ba, same, disagree, hard)


def _nonfinite_rows(lps: np.ndarray) -> np.ndarray:
    return (np.isnan(lps) | np.isposinf(lps)).any(axis=1)
