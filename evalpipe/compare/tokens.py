"""Per-token comparison of two free-running generations of the same samples.

Both token tables are aligned on (task, doc_id, repeat, pos) with one vectorised
outer join (:func:`evalpipe.compare.scores.align_keys`); per-sample reductions use
``np.*.reduceat`` over the sample segments, so the cost is a few array passes and
never a Python loop per token. Only the handful of "worst" examples is built in a
Python loop.

Terms used throughout:

* first divergence: the first position whose token ids differ, or the shorter
  length when one sequence is a strict prefix of the other (None if ids identical).
* shared prefix: the positions before the first divergence. Logprob differences are
  measured there only: after a divergence the contexts differ and |dlogprob| means
  nothing.
* identical (bitwise): same ids, same length, and bit-equal logprob and top-k lists
  at every position.

* near-tie divergence: at the first divergence, A's token is in B's top-k, B's token
  is in A's top-k, and the reference's (A's) gap between the two tokens,
  |A's logprob of its own token - A's top-k logprob of B's token|, is below
  ``near_tie_gap``. Every other divergence is hard, including one where a side has no
  token at that position (its sequence ended first).
* top-k KL: KL(A||B) between the two top-k distributions of a shared-prefix position,
  see :func:`topk_kl` for the "missing mass" rule.

The aligned positions (:attr:`TokenComparison.positions`) and per-sample arrays
(:attr:`TokenComparison.samples`) are kept so that later checks need not re-align.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalpipe.artifacts import SAMPLE_KEY
from evalpipe.compare.scores import Alignment, align_keys, to_jsonable

TOKEN_KEY = SAMPLE_KEY + ("pos",)
_BIG = np.iinfo(np.int64).max
# Cap on (doc_id, repeat) pairs listed for samples present on one side only.
MAX_LISTED_KEYS = 10
# Cap on (doc_id, repeat, pos) triples listed for hard divergences (the count is exact).
MAX_LISTED_HARD = 20
# Near-tie threshold on the reference's logprob gap between the two diverging tokens,
# in nats. 0.5 nats is a probability ratio of ~1.65: two candidates that close can swap
# rank from reduction-order / kernel-choice rounding alone (observed |dlogprob| of
# bf16 engines is ~1e-2..1e-1 per token, and it accumulates over the prefix), whereas a
# change that really alters the model's preference moves the gap by whole nats.
NEAR_TIE_GAP = 0.5
# Probability floor for the top-k KL (before renormalising), so log(P/Q) stays finite.
KL_FLOOR = 1e-12
# Positions per chunk of the (n, k, k) broadcast in the top-k KL (bounds peak memory).
_KL_CHUNK = 1 << 15


# ---------------------------------------------------------------------------
# result types
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorstExample:
    """One notable sample: where it diverged (or where |dlogprob| peaked) and both top-k lists.

    ``kind`` is "earliest_divergence" or "largest_dlogprob". Token / top-k fields of a
    side are None when that side has no token at ``pos`` (its sequence ended).
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

    def to_dict(self) -> dict[str, Any]:
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


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
    kl_p50: float | None = None  # KL(A||B) of the top-k distributions, see topk_kl
    kl_p99: float | None = None
    kl_max: float | None = None
    abs_dlogprob_p50: float | None = None  # the max is max_abs_dlogprob
    abs_dlogprob_p99: float | None = None

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

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["n_divergent"] = self.n_divergent
        d["share_ids_identical"] = to_jsonable(self.share_ids_identical)
        d["share_identical"] = to_jsonable(self.share_identical)
        d["identical"] = self.identical
        return d


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
    prefix_kl: np.ndarray | None = None
    prefix_topk_equal: np.ndarray | None = None

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


@dataclass(frozen=True)
class TokenComparison:
    summaries: tuple[TaskTokenSummary, ...]
    samples: SampleTokenDiffs | None = dataclasses.field(default=None, repr=False, compare=False)
    positions: Alignment | None = dataclasses.field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": [s.to_dict() for s in self.summaries]}


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


def _segment_any(flat_diff: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per list: does any of its elements differ? (cumsum trick; empty lists -> False)."""
    cs = np.concatenate([[0], np.cumsum(flat_diff, dtype=np.int64)])
    offs = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0), dtype=np.int64)])
    return (cs[offs[1:]] - cs[offs[:-1]]) > 0


def _topk_differs(tokens_a: pa.Table, tokens_b: pa.Table, ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
    """For row pairs (ra[i], rb[i]): do the top-k id or logprob lists differ (bitwise)?"""
    n = len(ra)
    if n == 0:
        return np.zeros(0, dtype=bool)
    ta, tb = pa.array(ra), pa.array(rb)
    ids_a = tokens_a.column("topk_ids").take(ta).combine_chunks()
    ids_b = tokens_b.column("topk_ids").take(tb).combine_chunks()
    lp_a = tokens_a.column("topk_logprobs").take(ta).combine_chunks()
    lp_b = tokens_b.column("topk_logprobs").take(tb).combine_chunks()
    li_a, li_b, ll_a, ll_b = (_list_lengths(x) for x in (ids_a, ids_b, lp_a, lp_b))
    diff = (li_a != li_b) | (ll_a != ll_b)
    same_len = np.flatnonzero(~diff)
    if len(same_len):
        sl = pa.array(same_len)
        fa = np.asarray(ids_a.take(sl).flatten().to_numpy(zero_copy_only=False))
        fb = np.asarray(ids_b.take(sl).flatten().to_numpy(zero_copy_only=False))
        d_ids = _segment_any(fa != fb, li_a[same_len])
        ga = np.asarray(lp_a.take(sl).flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
        gb = np.asarray(lp_b.take(sl).flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
        d_lp = _segment_any(ga.view(np.uint32) != gb.view(np.uint32), ll_a[same_len])
        diff[same_len] = d_ids | d_lp
    return diff


def _topk_matrix(table: pa.Table, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-width top-k of rows ``idx`` (-1 = no row): ids (n, k) padded with -1, logprobs padded with -inf."""
    n = len(idx)
    ids = np.full((n, k), -1, dtype=np.int64)
    lps = np.full((n, k), -np.inf, dtype=np.float64)
    ok = np.flatnonzero(idx >= 0)
    if len(ok) == 0 or k == 0:
        return ids, lps
    take = pa.array(idx[ok])
    for column, out, fill in (("topk_ids", ids, -1), ("topk_logprobs", lps, -np.inf)):
        lists = table.column(column).take(take).combine_chunks()
        full = np.maximum(_list_lengths(lists), 0)
        lens = np.minimum(full, k)
        flat = np.asarray(pc.list_flatten(lists).fill_null(fill).to_numpy(zero_copy_only=False), dtype=out.dtype)
        starts = np.concatenate([[0], np.cumsum(full)[:-1]]).astype(np.int64)
        row = np.repeat(np.arange(len(ok)), lens)
        col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        out[ok[row], col] = flat[np.repeat(starts, lens) + col]
    return ids, lps


def _topk_width(a: pa.Table, b: pa.Table) -> int:
    widths = [int(pc.max(pc.list_value_length(t.column("topk_ids"))).as_py() or 0) for t in (a, b) if t.num_rows]
    return max(widths, default=0)


def topk_kl(
    ids_a: np.ndarray, lp_a: np.ndarray, ids_b: np.ndarray, lp_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: KL(A||B) between two top-k distributions, and whether the top-k id sets are equal.

    Inputs are (n, k) arrays padded with id -1 / logprob -inf. Both distributions are
    put on the union of the two id sets. "Missing mass" rule: a token in one list but
    not in the other gets, on the side that lacks it, that side's leftover mass
    ``max(0, 1 - sum(exp(own top-k logprobs)))`` divided equally among all the union
    tokens that side lacks. Then every union entry is floored at ``KL_FLOOR`` (1e-12)
    and each side is renormalised to sum to 1 over the union, so the KL is finite; mass
    outside the union is ignored. Identical inputs give exactly 0. Vectorised as an
    (n, k, k) id-equality broadcast, in chunks of rows.
    """
    n = len(ids_a)
    kl = np.zeros(n, dtype=np.float64)
    same = np.ones(n, dtype=bool)
    for lo in range(0, n, _KL_CHUNK):  # chunks of rows, not tokens
        sl = slice(lo, min(n, lo + _KL_CHUNK))
        ia, ib = ids_a[sl], ids_b[sl]
        va, vb = ia >= 0, ib >= 0
        pa_ = np.where(va, np.exp(lp_a[sl]), 0.0)
        pb_ = np.where(vb, np.exp(lp_b[sl]), 0.0)
        eq = (ia[:, :, None] == ib[:, None, :]) & va[:, :, None] & vb[:, None, :]
        a_in_b = eq.any(axis=2)  # A's slot i also listed by B
        b_only = vb & ~eq.any(axis=1)  # B's slot j not listed by A
        a_only = va & ~a_in_b
        same[sl] = ~a_only.any(axis=1) & ~b_only.any(axis=1)
        rest_a = np.maximum(0.0, 1.0 - pa_.sum(axis=1))
        rest_b = np.maximum(0.0, 1.0 - pb_.sum(axis=1))
        n_miss_a = b_only.sum(axis=1)  # union tokens A lacks
        n_miss_b = a_only.sum(axis=1)  # union tokens B lacks
        fill_a = np.where(n_miss_a > 0, rest_a / np.maximum(n_miss_a, 1), 0.0)[:, None]
        fill_b = np.where(n_miss_b > 0, rest_b / np.maximum(n_miss_b, 1), 0.0)[:, None]
        # union = A's slots followed by B-only slots: (m, 2k) with a validity mask
        p = np.concatenate([pa_, np.where(b_only, fill_a, 0.0)], axis=1)
        q_on_a = np.where(a_in_b, (eq * pb_[:, None, :]).sum(axis=2), fill_b)
        q = np.concatenate([np.where(va, q_on_a, 0.0), np.where(b_only, pb_, 0.0)], axis=1)
        valid = np.concatenate([va, b_only], axis=1)
        p = np.where(valid, np.maximum(p, KL_FLOOR), 0.0)
        q = np.where(valid, np.maximum(q, KL_FLOOR), 0.0)
        p_sum, q_sum = p.sum(axis=1, keepdims=True), q.sum(axis=1, keepdims=True)
        p = p / np.where(p_sum > 0, p_sum, 1.0)
        q = q / np.where(q_sum > 0, q_sum, 1.0)
        terms = np.where(valid, p * (np.log(np.where(valid, p, 1.0)) - np.log(np.where(valid, q, 1.0))), 0.0)
        kl[sl] = np.maximum(terms.sum(axis=1), 0.0)
    return kl, same


def _classify_divergences(
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    ra: np.ndarray,
    rb: np.ndarray,
    k: int,
    near_tie_gap: float,
) -> tuple[np.ndarray, np.ndarray]:
    """For divergence rows (ra[i], rb[i]; -1 = that side has no token there): near-tie?, A's |gap|."""
    n = len(ra)
    if n == 0 or k == 0:  # no top-k lists: nothing can be shown to be a near-tie
        return np.zeros(n, dtype=bool), np.full(n, np.nan)
    tok_a = _gather(tokens_a, "token_id", ra, -1, np.int64)
    tok_b = _gather(tokens_b, "token_id", rb, -1, np.int64)
    lp_a = _gather(tokens_a, "logprob", ra, np.nan, np.float64)
    ids_a, lps_a = _topk_matrix(tokens_a, ra, k)
    ids_b, _ = _topk_matrix(tokens_b, rb, k)
    both = (ra >= 0) & (rb >= 0)
    b_tok_in_a = (ids_a == tok_b[:, None]) & (ids_a >= 0)
    a_tok_in_b = ((ids_b == tok_a[:, None]) & (ids_b >= 0)).any(axis=1)
    first = np.argmax(b_tok_in_a, axis=1)
    in_a = b_tok_in_a.any(axis=1)
    lp_b_under_a = np.where(in_a, lps_a[np.arange(n), first], np.nan)
    gap = np.abs(lp_a - lp_b_under_a)
    gap = np.where(both & in_a, gap, np.nan)
    near = both & in_a & a_tok_in_b & (gap < near_tie_gap)
    return near, gap


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
    pal = align_keys(tokens_a.select(list(TOKEN_KEY)), tokens_b.select(list(TOKEN_KEY)), TOKEN_KEY, "token positions")
    n_pos = len(pal)
    in_a, in_b = pal.in_a, pal.in_b

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
        dlp = np.abs(lp_a.astype(np.float64) - lp_b.astype(np.float64))
        dlp = np.where(bits_eq, 0.0, dlp)
        dlp = np.where(np.isnan(dlp), np.inf, dlp)  # NaN on one side only: flag as maximal
        dlp = np.where(prefix, dlp, 0.0)
        cnt_seg = np.add.reduceat(prefix.astype(np.int64), starts)
        max_seg = np.maximum.reduceat(dlp, starts)
        sum_seg = np.add.reduceat(dlp, starts)
        is_max = prefix & (max_seg[seg] > 0) & (dlp == max_seg[seg])
        amax_row_seg = np.minimum.reduceat(np.where(is_max, rows, _BIG), starts)
        lpdiff_seg = np.add.reduceat((prefix & ~bits_eq).astype(np.int64), starts)
        pr = np.flatnonzero(prefix)
        topk_row = np.zeros(n_pos, dtype=np.int64)
        topk_row[pr] = _topk_differs(tokens_a, tokens_b, pal.idx_a[pr], pal.idx_b[pr])
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
        dlp = np.zeros(0, dtype=np.float64)

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
            raise ValueError(
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
                raise ValueError(
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

    # --- near-tie classification and top-k KL (vectorised) -------------------------
    k = _topk_width(tokens_a, tokens_b)
    div_s = np.flatnonzero(first_div_row >= 0)
    div_r = first_div_row[div_s]
    near_s, gap_s = _classify_divergences(tokens_a, tokens_b, pal.idx_a[div_r], pal.idx_b[div_r], k, near_tie_gap)
    near_tie = np.zeros(n_uni, dtype=bool)
    near_tie[div_s] = near_s
    div_gap = np.full(n_uni, np.nan, dtype=np.float64)
    div_gap[div_s] = gap_s
    pr = np.flatnonzero(prefix)
    pr_ids_a, pr_lp_a = _topk_matrix(tokens_a, pal.idx_a[pr], k)
    pr_ids_b, pr_lp_b = _topk_matrix(tokens_b, pal.idx_b[pr], k)
    pr_kl, pr_same = topk_kl(pr_ids_a, pr_lp_a, pr_ids_b, pr_lp_b)
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
        prefix_kl=pr_kl,
        prefix_topk_equal=pr_same,
    )
    return diffs, pal


def _opt_float(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _quantile(x: np.ndarray, q: float) -> float | None:
    """Percentile ``q`` (linear interpolation; 100 = max); None when empty or not finite."""
    if len(x) == 0:
        return None
    if q >= 100:
        return _opt_float(np.max(x))
    with np.errstate(invalid="ignore"):
        return _opt_float(np.percentile(x, q))


def _worst(
    kind: str,
    sel: np.ndarray,
    row_of: np.ndarray,
    d: SampleTokenDiffs,
    pal: Alignment,
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None,
    samples_b: pa.Table | None,
) -> tuple[WorstExample, ...]:
    out = []
    for s in sel.tolist():  # a handful of samples
        r = int(row_of[s])
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
            )
        )
    return tuple(out)


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
    n_pr = 0 if d.prefix_sample is None else len(d.prefix_sample)
    if n_pr:
        pr_order = np.argsort(d.prefix_sample, kind="stable")
        pr_sorted = d.prefix_sample[pr_order]
    near_all = d.near_tie if d.near_tie is not None else np.zeros(n, dtype=bool)
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
        kl = d.prefix_kl[rows] if n_rows else np.zeros(0)
        adl = d.prefix_abs_dlogprob[rows] if n_rows else np.zeros(0)
        n_same = int(d.prefix_topk_equal[rows].sum()) if n_rows else 0
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
                max_abs_dlogprob=_opt_float(mx_paired.max()) if len(mx_paired) else None,
                mean_abs_dlogprob=_opt_float(d.sum_abs_dlogprob[sl][paired].sum() / total_cnt) if total_cnt else None,
                max_abs_dlogprob_same_ids=_opt_float(mx_same.max()) if len(mx_same) else None,
                worst_divergence=_worst(
                    "earliest_divergence", worst_div, d.first_divergence_row, d, pal, tokens_a, tokens_b, samples_a, samples_b
                ),
                worst_logprob=_worst(
                    "largest_dlogprob", worst_lp, d.max_dlogprob_row, d, pal, tokens_a, tokens_b, samples_a, samples_b
                ),
                near_tie_gap=float(near_tie_gap),
                n_near_tie_divergences=int(near.sum()),
                n_hard_divergences=int(len(hard_idx)),
                hard_divergences=hard,
                n_positions_topk_equal=n_same,
                share_topk_equal=n_same / n_rows if n_rows else None,
                kl_p50=_quantile(kl, 50),
                kl_p99=_quantile(kl, 99),
                kl_max=_quantile(kl, 100),
                abs_dlogprob_p50=_quantile(adl, 50),
                abs_dlogprob_p99=_quantile(adl, 99),
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
    is the near-tie threshold on the reference's logprob gap at a first divergence.
    """
    d, pal = sample_token_diffs(tokens_a, tokens_b, samples_a, samples_b, near_tie_gap=near_tie_gap)
    summaries = summarize_tokens(
        d, pal, tokens_a, tokens_b, samples_a, samples_b, worst_k=worst_k, near_tie_gap=near_tie_gap
    )
    return TokenComparison(summaries=summaries, samples=d, positions=pal)
