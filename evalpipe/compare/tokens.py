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
  :func:`evalpipe.compare.topk.topk_kl` for the "missing mass" rule. KL is asymmetric, so the summaries
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

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from evalpipe.compare.scores import Alignment, align_keys, column_codes
from evalpipe.compare.token_results import NEAR_TIE_GAP, SampleTokenDiffs, TokenComparison
from evalpipe.compare.token_summary import summarize_tokens
from evalpipe.compare.topk import TopK, near_tie_of, prefix_metrics, topk_width
from evalpipe.errors import UserError
from evalpipe.rundir.artifacts import SAMPLE_KEY

TOKEN_KEY = SAMPLE_KEY + ("pos",)
_BIG = np.iinfo(np.int64).max

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


@dataclass(frozen=True)
class _Segments:
    """Per-position figures reduced to one value per sample's run of aligned positions (a
    segment), with the rows of the positions before each segment's first divergence."""

    starts: np.ndarray  # first row of each segment
    seg: np.ndarray  # the segment of each row
    first_div: np.ndarray  # position of the first divergence (_BIG: none)
    first_div_row: np.ndarray  # its row (_BIG: none)
    shared: np.ndarray  # positions before it
    max_dlp: np.ndarray
    sum_dlp: np.ndarray
    max_row: np.ndarray  # the row of the largest |dlogprob| there (_BIG: none)
    lp_diff: np.ndarray  # positions there whose logprob bits differ
    topk_diff: np.ndarray  # positions there whose top-k lists differ
    len_a: np.ndarray
    len_b: np.ndarray
    keys: pa.Table  # (task, doc_id, repeat) of each segment
    prefix_rows: np.ndarray
    dlp: np.ndarray  # |dlogprob| per row (0 outside the prefixes)
    signed: np.ndarray  # dlogprob per row
    pm: Any  # prefix_metrics of the prefix rows


def _segments(tokens_a: pa.Table, tokens_b: pa.Table, pal: Alignment, topk_a: TopK, topk_b: TopK,
              near_tie_gap: float) -> _Segments:
    n_pos = len(pal)
    if not n_pos:
        z = np.zeros(0, dtype=np.int64)
        f = np.zeros(0, dtype=np.float64)
        return _Segments(starts=z, seg=z, first_div=z, first_div_row=z, shared=z, max_dlp=f, sum_dlp=f, max_row=z,
                         lp_diff=z, topk_diff=z, len_a=z, len_b=z, keys=_empty_keys(), prefix_rows=z, dlp=f, signed=f,
                         pm=prefix_metrics(topk_a, topk_b, z, z, near_tie_gap))
    in_a, in_b = pal.in_a, pal.in_b
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
    max_seg = np.maximum.reduceat(dlp, starts)
    is_max = prefix & (max_seg[seg] > 0) & (dlp == max_seg[seg])
    pr = np.flatnonzero(prefix)
    pm = prefix_metrics(topk_a, topk_b, pal.idx_a[pr], pal.idx_b[pr], near_tie_gap)
    topk_row = np.zeros(n_pos, dtype=np.int64)
    topk_row[pr] = pm.topk_diff
    return _Segments(
        starts=starts, seg=seg, first_div=fd_seg, first_div_row=fd_row_seg,
        shared=np.add.reduceat(prefix.astype(np.int64), starts), max_dlp=max_seg, sum_dlp=np.add.reduceat(dlp, starts),
        max_row=np.minimum.reduceat(np.where(is_max, rows, _BIG), starts),
        lp_diff=np.add.reduceat((prefix & ~bits_eq).astype(np.int64), starts),
        topk_diff=np.add.reduceat(topk_row, starts),
        len_a=np.add.reduceat(in_a.astype(np.int64), starts), len_b=np.add.reduceat(in_b.astype(np.int64), starts),
        keys=_key_table(_take_union(pal, tokens_a, tokens_b, "task", starts), doc[starts], rep[starts]),
        prefix_rows=pr, dlp=dlp, signed=signed, pm=pm,
    )


@dataclass(frozen=True)
class _Universe:
    """Every sample either side has (its samples.parquet's rows, else its tokens), and where
    each segment sits among them."""

    task: Any
    doc: np.ndarray
    rep: np.ndarray
    present_a: np.ndarray
    present_b: np.ndarray
    sidx_a: np.ndarray  # the sample's row in side A's samples.parquet (-1: none)
    sidx_b: np.ndarray
    seg_to_uni: np.ndarray  # each segment's sample


def _universe(sg: _Segments, samples_a: pa.Table | None, samples_b: pa.Table | None) -> _Universe:
    """The samples compared; a token row of a sample its side's samples.parquet does not list
    is refused (the artifacts are inconsistent)."""
    if samples_a is None or samples_b is None:
        n_seg = len(sg.starts)
        none = np.full(n_seg, -1, dtype=np.int64)
        return _Universe(task=sg.keys.column("task").to_pylist(), doc=sg.keys.column("doc_id").to_numpy(),
                         rep=sg.keys.column("repeat").to_numpy(), present_a=sg.len_a > 0, present_b=sg.len_b > 0,
                         sidx_a=none, sidx_b=none, seg_to_uni=np.arange(n_seg, dtype=np.int64))
    sal = align_keys(_sample_keys(samples_a), _sample_keys(samples_b), SAMPLE_KEY, "samples")
    task = _take_union(sal, samples_a, samples_b, "task", np.arange(len(sal)))
    doc, rep = sal.codes[1], sal.codes[2]
    m = align_keys(sg.keys, _key_table(task, doc, rep), SAMPLE_KEY, "samples")
    stray = m.in_a & ~m.in_b
    if stray.any():
        k = sg.keys.slice(int(m.idx_a[np.argmax(stray)]), 1).to_pylist()[0]
        raise UserError(
            f"tokens.parquet has rows for task {k['task']!r} doc {k['doc_id']} repeat {k['repeat']} "
            "that samples.parquet does not list; the artifacts are inconsistent."
        )
    seg_to_uni = np.full(len(sg.starts), -1, dtype=np.int64)
    ok = m.in_a & m.in_b
    seg_to_uni[m.idx_a[ok]] = m.idx_b[ok]
    for side, lens, present in (("A", sg.len_a, sal.in_a), ("B", sg.len_b, sal.in_b)):
        bad = (lens > 0) & ~present[seg_to_uni]
        if bad.any():
            k = sg.keys.slice(int(np.argmax(bad)), 1).to_pylist()[0]
            raise UserError(
                f"side {side} has tokens for task {k['task']!r} doc {k['doc_id']} repeat {k['repeat']} "
                "but no row for it in its samples.parquet; the artifacts are inconsistent."
            )
    return _Universe(task=task, doc=doc, rep=rep, present_a=sal.in_a, present_b=sal.in_b, sidx_a=sal.idx_a,
                     sidx_b=sal.idx_b, seg_to_uni=seg_to_uni)


def _first_divergences(tokens_a: pa.Table, tokens_b: pa.Table, pal: Alignment, topk_a: TopK, topk_b: TopK,
                       first_div_row: np.ndarray, near_tie_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """(near tie, the gap there) of each sample's first divergence (False, NaN: none)."""
    n = len(first_div_row)
    div_s = np.flatnonzero(first_div_row >= 0)
    div_r = first_div_row[div_s]
    ra, rb = pal.idx_a[div_r], pal.idx_b[div_r]
    ids_da, lps_da = topk_a.take(ra)
    ids_db, lps_db = topk_b.take(rb)
    near_s, gap_s = near_tie_of(
        _gather(tokens_a, "token_id", ra, -1, np.int64), _gather(tokens_a, "logprob", ra, np.nan, np.float64), ids_da, lps_da,
        _gather(tokens_b, "token_id", rb, -1, np.int64), _gather(tokens_b, "logprob", rb, np.nan, np.float64), ids_db, lps_db,
        near_tie_gap,
    )
    near_tie = np.zeros(n, dtype=bool)
    near_tie[div_s] = near_s
    gap = np.full(n, np.nan, dtype=np.float64)
    gap[div_s] = gap_s
    return near_tie, gap


def sample_token_diffs(
    tokens_a: pa.Table,
    tokens_b: pa.Table,
    samples_a: pa.Table | None = None,
    samples_b: pa.Table | None = None,
    *,
    near_tie_gap: float = NEAR_TIE_GAP,
) -> tuple[SampleTokenDiffs, Alignment]:
    """Align both token tables and compute the per-sample arrays (vectorised), in three
    phases: the positions reduced per segment, the segments placed among the samples, the
    first divergences classified."""
    pal = _align_positions(tokens_a, tokens_b)
    k = topk_width(tokens_a, tokens_b)
    topk_a, topk_b = TopK.of(tokens_a, k), TopK.of(tokens_b, k)
    sg = _segments(tokens_a, tokens_b, pal, topk_a, topk_b, near_tie_gap)
    u = _universe(sg, samples_a, samples_b)
    n_uni = len(u.doc)

    def scatter(values: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
        out = np.full(n_uni, fill, dtype=dtype)
        out[u.seg_to_uni] = values
        return out

    both = u.present_a & u.present_b
    cnt = scatter(sg.shared, 0, np.int64)
    max_dlp = np.where(cnt > 0, scatter(sg.max_dlp, np.nan, np.float64), np.nan)
    first_div = np.where(both, scatter(np.where(sg.first_div == _BIG, -1, sg.first_div), -1, np.int64), -1)
    first_div_row = np.where(both, scatter(np.where(sg.first_div_row == _BIG, -1, sg.first_div_row), -1, np.int64), -1)
    near_tie, div_gap = _first_divergences(tokens_a, tokens_b, pal, topk_a, topk_b, first_div_row, near_tie_gap)
    pr, pm = sg.prefix_rows, sg.pm
    diffs = SampleTokenDiffs(
        task=np.asarray(u.task, dtype=object),
        doc_id=np.asarray(u.doc, dtype=np.int64),
        repeat=np.asarray(u.rep, dtype=np.int64),
        in_a=np.asarray(u.present_a, dtype=bool),
        in_b=np.asarray(u.present_b, dtype=bool),
        len_a=scatter(sg.len_a, 0, np.int64),
        len_b=scatter(sg.len_b, 0, np.int64),
        first_divergence=first_div,
        first_divergence_row=first_div_row,
        shared_prefix=np.where(both, cnt, 0),
        max_abs_dlogprob=np.where(both, max_dlp, np.nan),
        sum_abs_dlogprob=np.where(both, scatter(sg.sum_dlp, 0.0, np.float64), 0.0),
        max_dlogprob_row=np.where(both, scatter(np.where(sg.max_row == _BIG, -1, sg.max_row), -1, np.int64), -1),
        n_logprob_diff=np.where(both, scatter(sg.lp_diff, 0, np.int64), 0),
        n_topk_diff=np.where(both, scatter(sg.topk_diff, 0, np.int64), 0),
        sample_idx_a=np.asarray(u.sidx_a, dtype=np.int64),
        sample_idx_b=np.asarray(u.sidx_b, dtype=np.int64),
        near_tie=near_tie,
        divergence_gap=div_gap,
        prefix_rows=pr,
        prefix_sample=u.seg_to_uni[sg.seg[pr]] if len(pr) else np.zeros(0, dtype=np.int64),
        prefix_abs_dlogprob=np.asarray(sg.dlp[pr], dtype=np.float64),
        prefix_dlogprob=np.asarray(sg.signed[pr], dtype=np.float64),
        prefix_kl=np.maximum(pm.kl_ab, pm.kl_ba),
        prefix_topk_equal=pm.topk_equal,
        prefix_kl_ab=pm.kl_ab,
        prefix_top1_disagree=pm.top1_disagree,
        prefix_top1_hard=pm.top1_hard,
        first_row=scatter(sg.starts, -1, np.int64),
    )
    return diffs, pal


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
