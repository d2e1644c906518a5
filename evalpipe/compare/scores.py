"""Paired score comparison: per task x metric, the same (task, doc_id, repeat) items on both sides.

The per-item vectors are kept in :class:`PairedScores`; its summary is the document model
documents.comparison.ScoreRow, built here, that the verdict and the reports consume. Each row carries the
paired statistics of :mod:`evalpipe.compare.stats` (SEs, the t interval of the
difference, McNemar's exact test for 0/1 metrics, TOST against ``margin``, the minimum
detectable difference) and the items whose score changed (documents.comparison.FlippedItem).

Items are independent unless the samples table has a ``cluster`` column (long-context
tasks ask several questions about one document); then the SEs are cluster-robust.

This module also holds :func:`align_keys`, the vectorised outer join on key columns
that the token comparison reuses.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
from pydantic import BaseModel

from evalpipe.compare import stats
from evalpipe.documents.comparison import FlippedItem, ScoreRow
from evalpipe.errors import UserError
from evalpipe.rundir.artifacts import ANSWER_PREFIX, SAMPLE_KEY, SCORE_PREFIX, score_columns

# TOST equivalence margin on the metric's own scale: 0.01 = 1.0 point of a 0-1 accuracy.
DEFAULT_MARGIN = 0.01
CONF = 0.95  # two-sided interval of the difference
ALPHA = 0.05  # McNemar / TOST level (TOST's interval is the 1 - 2*ALPHA = 90% one)
POWER = 0.8  # for the minimum detectable difference
CLUSTER_COLUMN = "cluster"
FLIPPED_SHOWN = 20  # flipped items listed per task x metric (n_flipped has the total)
QUESTION_CHARS = 500
TAIL_CHARS = 200  # prompt excerpt when it has no "Question:"
RESPONSE_CHARS = 2000

# ---------------------------------------------------------------------------
# generic helpers
# ---------------------------------------------------------------------------


def to_jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars -> Python, NaN/inf -> None, tuples -> lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, BaseModel):  # a document model built here: its values, as plain as the rest
        return to_jsonable(obj.model_dump())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if hasattr(obj, "value") and isinstance(obj.value, str):  # Enum
        return obj.value
    return obj


def column_codes(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes for a key column of both sides; string columns get order-preserving codes."""
    if _is_text(a.type) or _is_text(b.type):
        both = pa.chunked_array(
            [c.cast(pa.string()) for c in _chunks(a) + _chunks(b)], type=pa.string()
        )
        enc = both.combine_chunks().dictionary_encode()
        dictionary = np.asarray(enc.dictionary.to_pylist(), dtype=object)
        rank = np.empty(len(dictionary), dtype=np.int64)
        rank[np.argsort(dictionary, kind="stable")] = np.arange(len(dictionary))
        idx = enc.indices.to_numpy(zero_copy_only=False)
        codes = rank[idx] if len(idx) else np.zeros(0, dtype=np.int64)
        return codes[: len(a)], codes[len(a) :]
    return (
        np.asarray(a.to_numpy() if hasattr(a, "to_numpy") else a, dtype=np.int64),
        np.asarray(b.to_numpy() if hasattr(b, "to_numpy") else b, dtype=np.int64),
    )


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)


def _chunks(arr: pa.ChunkedArray | pa.Array) -> list[pa.Array]:
    return list(arr.chunks) if isinstance(arr, pa.ChunkedArray) else [arr]


@dataclass(frozen=True)
class Alignment:
    """Outer join of two tables on key columns, sorted by the keys.

    Union rows are in key order; ``idx_a[i]`` / ``idx_b[i]`` are the row
    numbers of union row ``i`` in table A / B, or -1 when that side lacks the key.
    ``codes`` holds the integer key columns (string keys as order-preserving codes).
    """

    keys: tuple[str, ...]
    codes: tuple[np.ndarray, ...]
    idx_a: np.ndarray
    idx_b: np.ndarray

    @property
    def in_a(self) -> np.ndarray:
        return self.idx_a >= 0

    @property
    def in_b(self) -> np.ndarray:
        return self.idx_b >= 0

    def __len__(self) -> int:
        return len(self.idx_a)


def align_keys(a: pa.Table, b: pa.Table, keys: Sequence[str], what: str = "rows") -> Alignment:
    """Vectorised full outer join of ``a`` and ``b`` on ``keys`` (no Python loop per row).

    Raises ValueError if a key occurs twice on the same side.
    """
    keys = tuple(keys)
    na, nb = a.num_rows, b.num_rows
    codes = []
    for k in keys:
        ca, cb = column_codes(a.column(k), b.column(k))
        codes.append(np.concatenate([ca, cb]).astype(np.int64, copy=False))
    side = np.concatenate([np.zeros(na, dtype=np.int8), np.ones(nb, dtype=np.int8)])
    row = np.concatenate([np.arange(na, dtype=np.int64), np.arange(nb, dtype=np.int64)])
    n = na + nb
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Alignment(keys, tuple(empty for _ in keys), empty, empty)
    order = np.lexsort(tuple([side] + codes[::-1]))
    sorted_codes = [c[order] for c in codes]
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for c in sorted_codes:
        new[1:] |= c[1:] != c[:-1]
    group = np.cumsum(new) - 1
    n_groups = int(group[-1]) + 1
    s_side, s_row = side[order], row[order]
    for s, label in ((0, "A"), (1, "B")):
        counts = np.bincount(group[s_side == s], minlength=n_groups)
        if counts.size and counts.max() > 1:
            g = int(np.argmax(counts > 1))
            first = int(np.flatnonzero(group == g)[0])
            dup = {k: int(sorted_codes[i][first]) for i, k in enumerate(keys)}
            raise UserError(f"side {label} has duplicate {what} for key {dup} on columns {list(keys)}.")
    idx_a = np.full(n_groups, -1, dtype=np.int64)
    idx_b = np.full(n_groups, -1, dtype=np.int64)
    idx_a[group[s_side == 0]] = s_row[s_side == 0]
    idx_b[group[s_side == 1]] = s_row[s_side == 1]
    starts = np.flatnonzero(new)
    return Alignment(keys, tuple(c[starts] for c in sorted_codes), idx_a, idx_b)


def union_column(alignment: Alignment, a: pa.Table, b: pa.Table, column: str) -> np.ndarray:
    """Values of ``column`` for every union row, taken from A where present, else from B."""
    va = np.asarray(a.column(column).to_numpy(zero_copy_only=False)) if a.num_rows else None
    vb = np.asarray(b.column(column).to_numpy(zero_copy_only=False)) if b.num_rows else None
    out = np.empty(len(alignment), dtype=object)
    ia, ib = alignment.idx_a, alignment.idx_b
    if va is not None:
        out[ia >= 0] = va[ia[ia >= 0]]
    if vb is not None:
        mask = (ia < 0) & (ib >= 0)
        out[mask] = vb[ib[mask]]
    return out


def _float_column(table: pa.Table, column: str, idx: np.ndarray) -> np.ndarray:
    """Float values at rows ``idx`` (-1 -> NaN); nulls become NaN."""
    out = np.full(len(idx), np.nan, dtype=np.float64)
    if table.num_rows == 0:
        return out
    col = table.column(column).cast(pa.float64()).to_numpy(zero_copy_only=False)
    col = np.asarray(col, dtype=np.float64)
    ok = idx >= 0
    out[ok] = col[idx[ok]]
    return out


# ---------------------------------------------------------------------------
# scores
# ---------------------------------------------------------------------------


def _clip(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[:limit] + "\u2026"


def last_question(prompt: str | None) -> str | None:
    """The text after the prompt's final "Question:" (without a trailing "Answer:"), else its last 200 chars."""
    if prompt is None:
        return None
    k = prompt.rfind("Question:")
    if k < 0:
        tail = prompt[-TAIL_CHARS:]
        return ("\u2026" + tail) if len(prompt) > TAIL_CHARS else tail
    q = prompt[k + len("Question:") :].strip()
    if q.endswith("Answer:"):
        q = q[: -len("Answer:")].rstrip()
    return _clip(q, QUESTION_CHARS)


@dataclass(frozen=True, eq=False)
class PairedScores:
    """Per-item scores of one task x metric, aligned by (doc_id, repeat); NaN = not scored."""

    task: str
    metric: str
    doc_id: np.ndarray
    repeat: np.ndarray
    a: np.ndarray
    b: np.ndarray
    only_a: int
    only_b: int
    # cluster label per item (None: every item is its own cluster)
    cluster: np.ndarray | None = None
    # row numbers of the items in the A / B samples tables (for the flipped-item texts)
    row_a: np.ndarray | None = None
    row_b: np.ndarray | None = None

    def changed(self) -> np.ndarray:
        """Mask of the items scored on both sides whose scores differ."""
        both = ~np.isnan(self.a) & ~np.isnan(self.b)
        return both & (self.a != self.b)

    def statistics(self, conf: float = CONF) -> stats.PairedDifference:
        """Paired difference over the items scored on both sides."""
        both = ~np.isnan(self.a) & ~np.isnan(self.b)
        clusters = self.cluster[both] if self.cluster is not None else None
        return stats.paired_difference(self.a[both], self.b[both], clusters=clusters, conf=conf)

    def summary(
        self, margin: float = DEFAULT_MARGIN, flipped: Sequence[FlippedItem] = (), alpha: float = ALPHA
    ) -> ScoreRow:
        va, vb = ~np.isnan(self.a), ~np.isnan(self.b)
        both = va & vb
        a, b = self.a[both], self.b[both]
        n = int(both.sum())
        mean_a = float(a.mean()) if n else None
        mean_b = float(b.mean()) if n else None
        delta = (mean_b - mean_a) if mean_a is not None and mean_b is not None else None  # both set iff n
        n_changed = int(np.count_nonzero(a != b))
        n_missing = int(np.count_nonzero(va ^ vb))
        binary = bool(n) and bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
        rw = int(np.count_nonzero((a == 1.0) & (b == 0.0))) if binary else None
        wr = int(np.count_nonzero((a == 0.0) & (b == 1.0))) if binary else None
        pdiff = self.statistics(CONF)
        eq = stats.tost(pdiff.diff, pdiff.se, margin, alpha=alpha, df=pdiff.df)
        return ScoreRow(
            task=self.task,
            metric=self.metric,
            n_paired=n,
            mean_a=mean_a,
            mean_b=mean_b,
            delta=delta,
            n_changed=n_changed,
            n_missing=n_missing,
            binary=binary,
            a_right_b_wrong=rw,
            a_wrong_b_right=wr,
            identical=n_changed == 0 and n_missing == 0,
            only_a=self.only_a,
            only_b=self.only_b,
            se_a=pdiff.se_a,
            se_b=pdiff.se_b,
            se_delta=pdiff.se,
            ci_low=pdiff.ci_low,
            ci_high=pdiff.ci_high,
            ci_conf=CONF,
            df=pdiff.df,
            n_clusters=pdiff.n_clusters,
            mcnemar_p=stats.mcnemar_exact(rw, wr) if rw is not None and wr is not None else None,  # both set iff binary
            margin=margin,
            alpha=alpha,
            tost_ci_low=eq.ci_low,
            tost_ci_high=eq.ci_high,
            tost_p_lower=eq.p_lower,
            tost_p_upper=eq.p_upper,
            equivalent=eq.equivalent,
            mdd=stats.minimum_detectable_difference(
                stats.no_change_se(pdiff.n_clusters) if binary and n_changed == 0 else pdiff.se,
                alpha=alpha, power=POWER, df=pdiff.df,
            ),
            n_flipped=n_changed,
            flipped=list(flipped),
        )


@dataclass(frozen=True)
class ScoreComparison:
    rows: tuple[ScoreRow, ...]
    paired: tuple[PairedScores, ...] = dataclasses.field(repr=False, compare=False, default=())
    metrics_only_a: tuple[str, ...] = ()
    metrics_only_b: tuple[str, ...] = ()


def metric_name(column: str) -> str:
    return column[len(SCORE_PREFIX) :] if column.startswith(SCORE_PREFIX) else column


def paired_scores(samples_a: pa.Table, samples_b: pa.Table) -> tuple[list[PairedScores], list[str], list[str]]:
    """Align two samples tables and return per task x metric paired vectors.

    Returns (paired, metrics only in A, metrics only in B). A metric is listed for a
    task when at least one item of that task has a value on either side.
    """
    cols_a, cols_b = set(score_columns(samples_a)), set(score_columns(samples_b))
    common = sorted(cols_a & cols_b)
    al = align_keys(samples_a.select(list(SAMPLE_KEY)), samples_b.select(list(SAMPLE_KEY)), SAMPLE_KEY, "samples")
    tasks = union_column(al, samples_a, samples_b, "task")
    doc_id, repeat = al.codes[1], al.codes[2]
    in_a, in_b = al.in_a, al.in_b
    paired_mask = in_a & in_b
    out: list[PairedScores] = []
    values = {c: (_float_column(samples_a, c, al.idx_a), _float_column(samples_b, c, al.idx_b)) for c in common}
    cluster = optional_union_column(al, samples_a, samples_b, CLUSTER_COLUMN)
    # Union rows are sorted by task code, i.e. by task name: contiguous task blocks.
    task_codes = al.codes[0]
    bounds = np.flatnonzero(np.r_[True, task_codes[1:] != task_codes[:-1]]) if len(al) else np.zeros(0, int)
    ends = np.r_[bounds[1:], len(al)].astype(int)
    for start, end in zip(bounds.tolist(), ends.tolist()):
        sl = slice(start, end)
        task = str(tasks[start])
        only_a = int(np.count_nonzero(in_a[sl] & ~in_b[sl]))
        only_b = int(np.count_nonzero(in_b[sl] & ~in_a[sl]))
        pm = paired_mask[sl]
        for c in common:
            va, vb = values[c][0][sl], values[c][1][sl]
            if np.isnan(va).all() and np.isnan(vb).all():
                continue  # metric does not apply to this task
            out.append(
                PairedScores(
                    task=task,
                    metric=metric_name(c),
                    doc_id=doc_id[sl][pm],
                    repeat=repeat[sl][pm],
                    a=va[pm],
                    b=vb[pm],
                    only_a=only_a,
                    only_b=only_b,
                    cluster=cluster[sl][pm] if cluster is not None else None,
                    row_a=al.idx_a[sl][pm],
                    row_b=al.idx_b[sl][pm],
                )
            )
    only_a_m = sorted(metric_name(c) for c in cols_a - cols_b)
    only_b_m = sorted(metric_name(c) for c in cols_b - cols_a)
    return out, only_a_m, only_b_m


def optional_union_column(al: Alignment, a: pa.Table, b: pa.Table, column: str) -> np.ndarray | None:
    """Like :func:`union_column` for a column that either side may lack; None if neither has it."""
    has_a, has_b = column in a.column_names, column in b.column_names
    if not (has_a or has_b):
        return None
    out = np.full(len(al), None, dtype=object)
    ia, ib = al.idx_a, al.idx_b
    if has_b and b.num_rows:
        vb = np.asarray(b.column(column).to_pylist(), dtype=object)
        out[ib >= 0] = vb[ib[ib >= 0]]
    if has_a and a.num_rows:  # A (the reference) wins where both sides have the item
        va = np.asarray(a.column(column).to_pylist(), dtype=object)
        out[ia >= 0] = va[ia[ia >= 0]]
    return out


def _cell(table: pa.Table, column: str, row: int) -> Any:
    if row < 0 or column not in table.column_names:
        return None
    return table.column(column)[row].as_py()


def _text(value: Any, limit: int) -> str | None:
    return None if value is None else _clip(str(value), limit)


def flipped_items(
    p: PairedScores, samples_a: pa.Table, samples_b: pa.Table, limit: int = FLIPPED_SHOWN
) -> tuple[FlippedItem, ...]:
    """The first ``limit`` items (by doc_id, repeat) whose score differs, with their texts.

    Prompt and target come from A (both sides ran the same prompt); responses and the
    filtered answers of the metric's filter from each side; long texts are clipped.
    """
    if p.row_a is None or p.row_b is None:
        return ()
    idx = np.flatnonzero(p.changed())[:limit]
    filt = p.metric.split(",", 1)[1] if "," in p.metric else None
    answer_col = ANSWER_PREFIX + filt if filt else None
    out = []
    for i in idx.tolist():
        ra, rb = int(p.row_a[i]), int(p.row_b[i])
        out.append(
            FlippedItem(
                doc_id=int(p.doc_id[i]),
                repeat=int(p.repeat[i]),
                score_a=float(p.a[i]),
                score_b=float(p.b[i]),
                question=last_question(_cell(samples_a, "prompt", ra)),
                target=_text(_cell(samples_a, "target", ra), QUESTION_CHARS),
                response_a=_text(_cell(samples_a, "response", ra), RESPONSE_CHARS),
                response_b=_text(_cell(samples_b, "response", rb), RESPONSE_CHARS),
                answer_a=_text(_cell(samples_a, answer_col, ra), QUESTION_CHARS) if answer_col else None,
                answer_b=_text(_cell(samples_b, answer_col, rb), QUESTION_CHARS) if answer_col else None,
            )
        )
    return tuple(out)


def compare_scores(
    samples_a: pa.Table, samples_b: pa.Table, *, margin: float = DEFAULT_MARGIN, alpha: float = ALPHA
) -> ScoreComparison:
    """Per task x metric summary of A vs B (B - A), sorted by (task, metric).

    ``margin`` is the TOST equivalence margin on the metric's scale (0.01 = 1 point of
    a 0-1 accuracy); ``alpha`` the level of TOST and of the minimum detectable difference.
    """
    if not margin > 0:
        raise UserError(f"the equivalence margin must be > 0, got {margin}.")
    paired, only_a_m, only_b_m = paired_scores(samples_a, samples_b)
    rows = tuple(
        p.summary(margin=margin, flipped=flipped_items(p, samples_a, samples_b), alpha=alpha) for p in paired
    )
    return ScoreComparison(rows=rows, paired=tuple(paired), metrics_only_a=tuple(only_a_m), metrics_only_b=tuple(only_b_m))
