"""Per-task summaries of a per-token comparison (:mod:`evalpipe.compare.tokens`): quantiles,
decade histograms, the worst examples with their context, the positions a gate points at."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalpipe.compare.scores import Alignment
from evalpipe.compare.token_results import (
    CONTEXT_TOKENS,
    HIST_DECADES,
    MAX_LISTED_HARD,
    MAX_LISTED_KEYS,
    NEAR_TIE_GAP,
    SampleTokenDiffs,
    prefix_values,
)
from evalpipe.documents.comparison import Histogram, TokenSummary, WorstExample

# The powers of ten between those decades as the decimal literals parse: correctly
# rounded, so the same doubles on every CPU. floor(log10 x) and 10.0**d go through libm,
# whose last bit differs between machines right at the decade edges.
_DECADE_EDGES = np.array([float(f"1e{d}") for d in HIST_DECADES[1:]])


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


def _histogram(x: np.ndarray) -> Histogram:
    zero, counts = _decade_hist(x)
    return Histogram(decades=list(HIST_DECADES), zero=zero, counts=list(counts))


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
        w.model_copy(update={
            "token_text_a": vocab.get(w.token_a) if w.token_a is not None else None,
            "token_text_b": vocab.get(w.token_b) if w.token_b is not None else None,
            "topk_texts_a": texts(w.topk_ids_a),
            "topk_texts_b": texts(w.topk_ids_b),
        })
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


def _sample_fields(d: SampleTokenDiffs, sl: slice) -> dict[str, Any]:
    """A task's samples: which each side has, which are identical, their lengths and the
    |dlogprob| on the shared prefixes."""
    paired, ids_id = d.paired[sl], d.ids_identical[sl]
    only_a = d.in_a[sl] & ~d.in_b[sl]
    only_b = d.in_b[sl] & ~d.in_a[sl]
    mx = d.max_abs_dlogprob[sl]
    mx_paired = mx[paired & (d.shared_prefix[sl] > 0)]
    mx_same = mx[ids_id & (d.shared_prefix[sl] > 0)]
    total_cnt = int(d.shared_prefix[sl][paired].sum())
    n_samples, n_ids_identical, n_identical = int(paired.sum()), int(ids_id.sum()), int(d.identical[sl].sum())
    return dict(
        n_samples=n_samples,
        only_a=int(only_a.sum()),
        only_b=int(only_b.sum()),
        only_a_keys=[(int(a), int(b)) for a, b in zip(d.doc_id[sl][only_a][:MAX_LISTED_KEYS], d.repeat[sl][only_a])],
        only_b_keys=[(int(a), int(b)) for a, b in zip(d.doc_id[sl][only_b][:MAX_LISTED_KEYS], d.repeat[sl][only_b])],
        n_ids_identical=n_ids_identical,
        n_identical=n_identical,
        n_logprob_diff_same_ids=int((ids_id & (d.n_logprob_diff[sl] > 0)).sum()),
        n_topk_diff_same_ids=int((ids_id & (d.n_logprob_diff[sl] == 0) & (d.n_topk_diff[sl] > 0)).sum()),
        n_length_diff=int((paired & (d.len_a[sl] != d.len_b[sl])).sum()),
        tokens_a=int(d.len_a[sl][paired].sum()),
        tokens_b=int(d.len_b[sl][paired].sum()),
        n_positions_compared=total_cnt,
        n_positions_logprob_diff=int(d.n_logprob_diff[sl][paired].sum()),
        max_abs_dlogprob=opt_float(mx_paired.max()) if len(mx_paired) else None,
        mean_abs_dlogprob=opt_float(d.sum_abs_dlogprob[sl][paired].sum() / total_cnt) if total_cnt else None,
        max_abs_dlogprob_same_ids=opt_float(mx_same.max()) if len(mx_same) else None,
        n_divergent=n_samples - n_ids_identical,
        share_ids_identical=n_ids_identical / n_samples if n_samples else None,
        share_identical=n_identical / n_samples if n_samples else None,
        identical=not only_a.any() and not only_b.any() and n_identical == n_samples,
    )


def _divergence_fields(d: SampleTokenDiffs, sl: slice, near_all: np.ndarray, worst: Any, worst_k: int,
                       near_tie_gap: float) -> dict[str, Any]:
    """A task's first divergences: where, the earliest and the largest-|dlogprob| samples, near
    ties apart from hard divergences."""
    idx = np.arange(sl.start, sl.stop)
    paired, fd = d.paired[sl], d.first_divergence[sl]
    div = paired & (fd >= 0)
    positions = np.sort(fd[div])
    # earliest divergences: by (pos, doc_id, repeat)
    div_idx = idx[div]
    order = np.lexsort((d.repeat[div_idx], d.doc_id[div_idx], d.first_divergence[div_idx]))
    worst_div = div_idx[order][:worst_k]
    # largest |dlogprob| on the shared prefix
    lp_idx = idx[paired & (np.nan_to_num(d.max_abs_dlogprob[sl], nan=0.0) > 0)]
    order = np.lexsort((d.repeat[lp_idx], d.doc_id[lp_idx], -d.max_abs_dlogprob[lp_idx]))
    worst_lp = lp_idx[order][:worst_k]
    near = div & near_all[sl]
    hard_idx = idx[div & ~near]
    hard = [(int(a), int(b), int(c)) for a, b, c in zip(d.doc_id[hard_idx][:MAX_LISTED_HARD], d.repeat[hard_idx][:MAX_LISTED_HARD],
                                                       d.first_divergence[hard_idx][:MAX_LISTED_HARD])]
    return dict(
        divergence_positions=[int(p) for p in positions],
        median_first_divergence=float(np.median(positions)) if len(positions) else None,
        worst_divergence=list(worst("earliest_divergence", worst_div, d.first_divergence_row[worst_div])),
        worst_logprob=list(worst("largest_dlogprob", worst_lp, d.max_dlogprob_row[worst_lp])),
        near_tie_gap=float(near_tie_gap),
        n_near_tie_divergences=int(near.sum()),
        n_hard_divergences=len(hard_idx),
        hard_divergences=hard,
    )


def _position_fields(d: SampleTokenDiffs, pal: Alignment, rows: np.ndarray, worst: Any, worst_k: int) -> dict[str, Any]:
    """A task's positions on the shared prefixes (``rows``, in key order): how far the two
    distributions agree there (top-k sets, KL, the top-1 token)."""
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
    return dict(
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
        top1_hard_positions=list(_key_triples(pal, _rows_of(d, top1_hard[:MAX_LISTED_HARD]))),
        worst_kl=list(worst("largest_kl", _rows_of(d, worst_kl, d.prefix_sample), _rows_of(d, worst_kl))),
        kl_max_at=(_key_triples(pal, _rows_of(d, kl_at)) or (None,))[0],
        kl_hist=_histogram(kl),
        abs_dlogprob_hist=_histogram(adl),
    )


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
) -> tuple[TokenSummary, ...]:
    """Per task summary (loop over tasks only) with the ``worst_k`` notable samples of each
    kind: its samples, its first divergences, its prefix positions."""
    n = len(d)
    if n == 0:
        return ()
    task = d.task
    bounds = np.flatnonzero(np.r_[True, task[1:] != task[:-1]])
    ends = np.r_[bounds[1:], n]
    prefix_sample = d.prefix_sample if d.prefix_sample is not None else np.zeros(0, dtype=np.int64)
    pr_order = np.argsort(prefix_sample, kind="stable")
    pr_sorted = prefix_sample[pr_order]
    near_all = d.near_tie if d.near_tie is not None else np.zeros(n, dtype=bool)
    worst = functools.partial(_worst, d=d, pal=pal, tokens_a=tokens_a, tokens_b=tokens_b, samples_a=samples_a, samples_b=samples_b)
    out = []
    for start, end in zip(bounds.tolist(), ends.tolist()):
        sl = slice(start, end)
        lo, hi = np.searchsorted(pr_sorted, [start, end]) if len(prefix_sample) else (0, 0)
        rows = pr_order[lo:hi] if len(prefix_sample) else np.zeros(0, dtype=np.int64)
        out.append(TokenSummary(task=str(task[start]), **_sample_fields(d, sl),
                                **_divergence_fields(d, sl, near_all, worst, worst_k, near_tie_gap),
                                **_position_fields(d, pal, rows, worst, worst_k)))
    return tuple(out)
