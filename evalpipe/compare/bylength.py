"""Per task and prompt length (and needle depth): scores and token diffs of long-context items.

Long-context tasks (``tasks/longctx``) write item metadata into samples.parquet
(:data:`evalpipe.rundir.artifacts.DOC_COLUMNS`): ``target_length`` (the prompt's exact token
count), ``length_kind`` ("round" or "edge": a length chosen at a layout boundary),
``length_tags`` (why), ``depth`` (where the needle sits, 0..1) and ``cluster`` (the
haystack several questions share). A layout change that breaks at a shard or block
boundary shows up at a few lengths and not at the others, so one number per task can
hide it; this module splits every such task by length and by depth.

For every task whose samples carry ``target_length`` (on either side):

* one :class:`LengthRow` per distinct length (sorted) and one :class:`DepthRow` per
  depth bin (depth rounded to the nearest ``DEPTH_STEP``; only non-empty bins);
* per row (:class:`GroupFigures`): the items, their clusters, per metric the paired
  score statistics of :meth:`evalpipe.compare.scores.PairedScores.summary` on the
  row's items (cluster-robust when the samples have ``cluster``; McNemar's exact p for
  0/1 metrics), the free-running figures (samples that diverge at all, hard / near-tie
  first divergences, max |Δlogprob|, top-k KL p99 / max over the shared prefixes) and
  the teacher-forced ones (KL p99 / max with where the max is, max |Δlogprob|, top-1
  flips, hard ones), over all positions and, when the task's teacher-forced traces hold
  prompt positions (``pos < 0``), separately for the prompt and the continuation.

Nothing is measured twice: the per-item score vectors (``ScoreComparison.paired``) and
the per-sample / per-position arrays of the token comparisons
(``TokenComparison.samples`` / ``.positions``) already hold every metric of
:mod:`evalpipe.compare.tokens` for every item and position; a row only selects the
items of its (task, doc_id, repeat) keys and aggregates them with the same reductions
the task summaries use, so a row's figures equal those of the task-level functions run
on tables filtered to the row's items (the tests check this). The cost is one key join
per table and a sort of the positions by group. A run whose samples have no
``target_length`` column (GSM8K) returns at the column check and pays nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalpipe.compare.scores import (
    ALPHA,
    CLUSTER_COLUMN,
    DEFAULT_MARGIN,
    Alignment,
    PairedScores,
    ScoreComparison,
    align_keys,
    optional_union_column,
    paired_scores,
)
from evalpipe.compare.token_results import SampleTokenDiffs, TokenComparison, prefix_values
from evalpipe.compare.token_summary import opt_float, quantile
from evalpipe.compare.tokens import compare_tokens
from evalpipe.documents.comparison import (
    DepthRow,
    FreeFigures,
    GroupFigures,
    GroupScore,
    LengthRow,
    TaskBreakdown,
    TeacherFigures,
)
from evalpipe.rundir.artifacts import SAMPLE_KEY

LENGTH_COLUMN = "target_length"
KIND_COLUMN = "length_kind"
TAGS_COLUMN = "length_tags"
DEPTH_COLUMN = "depth"
DEPTH_STEP = 0.1  # depth bins: the needle depth rounded to the nearest tenth
MAX_LISTED = 20  # changed items listed per row and metric (n_changed has the total)


# ---------------------------------------------------------------------------
# results: the document models documents.comparison.TaskBreakdown, LengthRow, DepthRow
# (each a GroupFigures), GroupScore, FreeFigures and TeacherFigures, built here
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# item metadata
# ---------------------------------------------------------------------------


def has_lengths(samples_a: pa.Table, samples_b: pa.Table) -> bool:
    """Whether a side's samples have the ``target_length`` column at all (the cheap check)."""
    return LENGTH_COLUMN in samples_a.column_names or LENGTH_COLUMN in samples_b.column_names


def _keys(task: Sequence[Any] | np.ndarray, doc_id: np.ndarray, repeat: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "task": pa.array([str(t) for t in task], type=pa.string()),
            "doc_id": pa.array(np.asarray(doc_id, dtype=np.int64)),
            "repeat": pa.array(np.asarray(repeat, dtype=np.int64)),
        }
    )


def _with_length(table: pa.Table) -> pa.Table:
    """The rows that carry a target length (none when the column is absent)."""
    if LENGTH_COLUMN not in table.column_names:
        return table.slice(0, 0)
    return table.filter(pc.is_valid(table.column(LENGTH_COLUMN)))


def _key_table(table: pa.Table) -> pa.Table:
    return _keys(
        table.column("task").cast(pa.string()).to_pylist(),
        table.column("doc_id").to_numpy(zero_copy_only=False),
        table.column("repeat").to_numpy(zero_copy_only=False),
    )


def _text_or_none(values: np.ndarray) -> np.ndarray:
    return np.asarray([None if v is None else str(v) for v in values], dtype=object)


@dataclass(frozen=True, eq=False)
class _Items:
    """The long-context items of both sides (A's metadata where both have an item), in key order."""

    keys: pa.Table
    task: np.ndarray  # object
    length: np.ndarray  # int64
    kind: np.ndarray  # object (str / None)
    tags: np.ndarray
    depth: np.ndarray  # float64, NaN when unknown
    cluster: np.ndarray | None  # object; None: no cluster column

    @classmethod
    def of(cls, samples_a: pa.Table, samples_b: pa.Table) -> _Items:
        a, b = _with_length(samples_a), _with_length(samples_b)
        al = align_keys(_key_table(a), _key_table(b), SAMPLE_KEY, "samples")

        def col(name: str) -> np.ndarray | None:
            return optional_union_column(al, a, b, name)

        task, length = col("task"), col(LENGTH_COLUMN)  # both present: the key and the filter column
        if task is None or length is None:
            raise ValueError(f"long-context items need `task` and `{LENGTH_COLUMN}` columns on at least one side")
        kind, tags, depth, cluster = col(KIND_COLUMN), col(TAGS_COLUMN), col(DEPTH_COLUMN), col(CLUSTER_COLUMN)
        n = len(al)
        return cls(
            keys=_keys(task, al.codes[1], al.codes[2]),
            task=np.asarray(task, dtype=object),
            length=np.asarray(length, dtype=np.int64),
            kind=_text_or_none(kind) if kind is not None else np.full(n, None, dtype=object),
            tags=_text_or_none(tags) if tags is not None else np.full(n, None, dtype=object),
            depth=np.asarray([np.nan if v is None else float(v) for v in depth], dtype=np.float64)
            if depth is not None
            else np.full(n, np.nan),
            cluster=cluster,
        )

    def __len__(self) -> int:
        return len(self.length)

    def lookup(self, task: Sequence[Any] | np.ndarray, doc_id: np.ndarray, repeat: np.ndarray) -> np.ndarray:
        """The item row of each (task, doc_id, repeat), -1 for keys that are no long-context item."""
        n = len(doc_id)
        out = np.full(n, -1, dtype=np.int64)
        if n == 0 or len(self) == 0:
            return out
        al: Alignment = align_keys(_keys(task, doc_id, repeat), self.keys, SAMPLE_KEY, "samples")
        both = al.in_a & al.in_b
        out[al.idx_a[both]] = al.idx_b[both]
        return out


# ---------------------------------------------------------------------------
# groups
# ---------------------------------------------------------------------------


def depth_bin(depth: np.ndarray | float) -> np.ndarray:
    """Depth rounded to the nearest DEPTH_STEP (halves up), as the bin's label; NaN stays NaN."""
    # the epsilon keeps exact halves (0.95 / 0.1 = 9.4999...) rounding up
    steps = np.floor(np.asarray(depth, dtype=np.float64) / DEPTH_STEP + 0.5 + 1e-9)
    return np.round(steps * DEPTH_STEP, 10)


@dataclass(frozen=True, eq=False)
class _Groups:
    """A partition of (some) items into numbered groups; ``of[i]`` is item i's group or -1."""

    of: np.ndarray
    n: int

    def split(self, item_of_element: np.ndarray) -> list[np.ndarray]:
        """Per group, the indices of the elements (scores, samples, positions) whose item is in it."""
        if self.n == 0:
            return []
        item_of_element = np.asarray(item_of_element, dtype=np.int64)
        g = np.where(item_of_element >= 0, self.of[np.maximum(item_of_element, 0)], -1)
        keep = np.flatnonzero(g >= 0)
        order = keep[np.argsort(g[keep], kind="stable")]
        counts = np.bincount(g[keep], minlength=self.n)
        return np.split(order, np.cumsum(counts)[:-1])


def _label(values: Iterable[Any]) -> str | None:
    distinct = sorted({str(v) for v in values if v is not None})
    return ";".join(distinct) if distinct else None


# ---------------------------------------------------------------------------
# figures of one group
# ---------------------------------------------------------------------------


def _group_scores(paired: list[tuple[PairedScores, np.ndarray]], margin: float, alpha: float) -> list[GroupScore]:
    """Per metric the fields of the row's :class:`ScoreRow` a row needs; ``changed`` lists the
    first MAX_LISTED (doc_id, repeat) whose score differs."""
    out = []
    for p, sel in paired:
        sub = dataclasses.replace(
            p,
            doc_id=p.doc_id[sel],
            repeat=p.repeat[sel],
            a=p.a[sel],
            b=p.b[sel],
            only_a=0,
            only_b=0,
            cluster=None if p.cluster is None else p.cluster[sel],
            row_a=None if p.row_a is None else p.row_a[sel],
            row_b=None if p.row_b is None else p.row_b[sel],
        )
        if np.isnan(sub.a).all() and np.isnan(sub.b).all():
            continue  # the metric does not apply to these items
        r = sub.summary(margin=margin, alpha=alpha)
        changed = np.flatnonzero(sub.changed())[:MAX_LISTED]
        out.append(
            GroupScore(
                metric=r.metric,
                binary=r.binary,
                n_paired=r.n_paired,
                n_clusters=r.n_clusters,
                n_missing=r.n_missing,
                mean_a=r.mean_a,
                mean_b=r.mean_b,
                delta=r.delta,
                se_delta=r.se_delta,
                ci_low=r.ci_low,
                ci_high=r.ci_high,
                ci_conf=r.ci_conf,
                df=r.df,
                mcnemar_p=r.mcnemar_p,
                n_changed=r.n_changed,
                a_right_b_wrong=r.a_right_b_wrong,
                a_wrong_b_right=r.a_wrong_b_right,
                changed=[(int(sub.doc_id[i]), int(sub.repeat[i])) for i in changed],
            )
        )
    return out


def _free_figures(d: SampleTokenDiffs, samples: np.ndarray, positions: np.ndarray) -> FreeFigures:
    """Free-running figures of a row's paired samples, as :func:`evalpipe.compare.token_summary.summarize_tokens`
    reduces a task, over the samples/positions given: ``n_divergent`` the samples whose token ids differ
    anywhere, ``n_positions`` the shared-prefix positions compared."""
    s = samples[d.paired[samples]]
    fd = d.first_divergence[s]
    div = fd >= 0
    near = div & (d.near_tie[s] if d.near_tie is not None else np.zeros(len(s), dtype=bool))
    mx = d.max_abs_dlogprob[s][d.shared_prefix[s] > 0]
    kl = d.prefix_kl[positions] if d.prefix_kl is not None and len(positions) else np.zeros(0)
    return FreeFigures(
        n_samples=len(s),
        n_divergent=int(div.sum()),
        n_near_tie_divergences=int(near.sum()),
        n_hard_divergences=int(div.sum() - near.sum()),
        n_positions=len(positions),
        max_abs_dlogprob=opt_float(mx.max()) if len(mx) else None,
        kl_p99=quantile(kl, 99),
        kl_max=quantile(kl, 100),
    )


def _teacher_figures(d: SampleTokenDiffs, pal: Alignment, positions: np.ndarray) -> TeacherFigures:
    """Teacher-forced figures over a set of positions (all, the prompt's, or the continuation's):
    ``n_samples`` the samples with a position in the set, ``kl_max_at`` (doc_id, repeat, pos) of
    kl_max, None when kl_max is 0 or None."""
    n = len(positions)
    kl = prefix_values(d.prefix_kl)[positions] if n else np.zeros(0)
    adl = prefix_values(d.prefix_abs_dlogprob)[positions] if n else np.zeros(0)
    kl_max = quantile(kl, 100)
    at = None
    if kl_max:  # prefix positions are in key order: the first maximum is the task summary's
        row = int(prefix_values(d.prefix_rows)[positions[int(np.argmax(kl))]])
        at = (int(pal.codes[1][row]), int(pal.codes[2][row]), int(pal.codes[3][row]))
    return TeacherFigures(
        n_samples=len(np.unique(prefix_values(d.prefix_sample)[positions])) if n else 0,
        n_positions=n,
        kl_p99=quantile(kl, 99),
        kl_max=kl_max,
        kl_max_at=at,
        max_abs_dlogprob=opt_float(adl.max()) if n else None,
        n_top1_disagree=int(prefix_values(d.prefix_top1_disagree)[positions].sum()) if n else 0,
        n_top1_hard=int(prefix_values(d.prefix_top1_hard)[positions].sum()) if n else 0,
    )


class _Elements:
    """The elements of one comparison mapped to items: score vectors, free samples/positions, teacher ones."""

    def __init__(
        self, items: _Items, scores: ScoreComparison, tokens: TokenComparison | None, teacher: TokenComparison | None
    ) -> None:
        tasks = set(items.task.tolist())
        self.scores = [(p, items.lookup([p.task] * len(p.doc_id), p.doc_id, p.repeat)) for p in scores.paired if p.task in tasks]
        self.free = self._trace(items, tokens)
        self.teacher = self._trace(items, teacher)
        self.teacher_pos = np.zeros(0, np.int64)  # read only with a teacher
        if self.teacher is not None:
            d, pal, _, _ = self.teacher
            self.teacher_pos = pal.codes[3][d.prefix_rows] if d.prefix_rows is not None and len(d.prefix_rows) else np.zeros(0, np.int64)

    @staticmethod
    def _trace(items: _Items, tc: TokenComparison | None):
        if tc is None or tc.samples is None or tc.positions is None:
            return None
        d = tc.samples
        sample_item = items.lookup(d.task, d.doc_id, d.repeat)
        prefix_item = sample_item[d.prefix_sample] if d.prefix_sample is not None and len(d.prefix_sample) else np.zeros(0, np.int64)
        return d, tc.positions, sample_item, prefix_item


def _figures(
    groups: _Groups,
    el: _Elements,
    items: _Items,
    prompt_split: dict[str, bool],
    margin: float,
    alpha: float,
) -> list[GroupFigures]:
    """The figures of every group of ``groups`` (each group lies within one task): a length or a
    depth bin of one task.

    ``n_items`` counts the group's items on either side, ``n_clusters`` the distinct clusters among
    them (= n_items without a cluster column). ``teacher_prompt`` / ``teacher_continuation`` split
    ``teacher`` by ``pos < 0`` / ``pos >= 0``; both are None when the task's teacher-forced traces
    have no prompt position (then ``teacher`` is the continuation). ``free`` / ``teacher`` are None
    when that comparison was not made (no teacher.parquet on a side)."""
    item_groups = groups.split(np.arange(len(items)))
    score_groups = [(p, groups.split(m)) for p, m in el.scores]
    if el.free is not None:
        d, _, s_item, p_item = el.free
        free_s, free_p = groups.split(s_item), groups.split(p_item)
    if el.teacher is not None:
        dt, palt, _, tp_item = el.teacher
        teach_p = groups.split(tp_item)
    out = []
    for g in range(groups.n):
        members = item_groups[g]
        task = str(items.task[members[0]])
        n_clusters = len(members)
        if items.cluster is not None:  # an item without a label is a cluster of its own
            n_clusters = len({("c", str(c)) if c is not None else ("i", int(i)) for i, c in zip(members, items.cluster[members])})
        scores = _group_scores([(p, split[g]) for p, split in score_groups if p.task == task and len(split[g])], margin, alpha)
        free = _free_figures(d, free_s[g], free_p[g]) if el.free is not None else None
        teacher = prompt = cont = None
        if el.teacher is not None:
            pos_idx = teach_p[g]
            teacher = _teacher_figures(dt, palt, pos_idx)
            if prompt_split.get(task):
                neg = el.teacher_pos[pos_idx] < 0
                prompt = _teacher_figures(dt, palt, pos_idx[neg])
                cont = _teacher_figures(dt, palt, pos_idx[~neg])
        out.append(GroupFigures(n_items=len(members), n_clusters=n_clusters, scores=scores, free=free, teacher=teacher,
                                teacher_prompt=prompt, teacher_continuation=cont))
    return out


# ---------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------


def length_breakdown(
    samples_a: pa.Table,
    samples_b: pa.Table,
    scores: ScoreComparison,
    tokens: TokenComparison | None = None,
    teacher: TokenComparison | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    alpha: float = ALPHA,
) -> list[TaskBreakdown] | None:
    """Per long-context task (sorted by name) its length and depth rows (compare.json's ``by_length``):
    every task whose samples carry ``target_length``; None when none does. A length row joins the
    distinct ``length_kind`` / ``length_tags`` of its items with ';' and lists the depth bins present;
    a depth row holds the items whose needle depth rounds to ``depth_bin`` over every length.

    ``scores`` / ``tokens`` / ``teacher`` are the comparison's own results (their
    per-item and per-position arrays are grouped, not recomputed); ``tokens`` and
    ``teacher`` may be None (their figures are then None).
    """
    if not has_lengths(samples_a, samples_b):
        return None
    items = _Items.of(samples_a, samples_b)
    if len(items) == 0:
        return None
    el = _Elements(items, scores, tokens, teacher)
    task_names = sorted(set(items.task.tolist()))
    prompt_split = {t: False for t in task_names}
    if el.teacher is not None and len(el.teacher_pos):
        _, _, _, tp_item = el.teacher
        neg = (el.teacher_pos < 0) & (tp_item >= 0)
        for t in set(items.task[tp_item[neg]].tolist()):
            prompt_split[str(t)] = True

    # groups: (task, length) and (task, depth bin), numbered in output order
    task_code = {t: i for i, t in enumerate(task_names)}
    tcode = np.asarray([task_code[str(t)] for t in items.task], dtype=np.int64)
    len_keys = sorted(set(zip(tcode.tolist(), items.length.tolist())))
    len_index = {k: i for i, k in enumerate(len_keys)}
    len_groups = _Groups(np.asarray([len_index[k] for k in zip(tcode.tolist(), items.length.tolist())], dtype=np.int64), len(len_keys))
    dbin = depth_bin(items.depth)
    has_depth = ~np.isnan(dbin)
    depth_keys = sorted(set(zip(tcode[has_depth].tolist(), dbin[has_depth].tolist())))
    depth_index = {k: i for i, k in enumerate(depth_keys)}
    depth_of = np.full(len(items), -1, dtype=np.int64)
    depth_of[has_depth] = [depth_index[k] for k in zip(tcode[has_depth].tolist(), dbin[has_depth].tolist())]
    depth_groups = _Groups(depth_of, len(depth_keys))

    len_fig = _figures(len_groups, el, items, prompt_split, margin, alpha)
    depth_fig = _figures(depth_groups, el, items, prompt_split, margin, alpha)
    len_members = len_groups.split(np.arange(len(items)))
    depth_members = depth_groups.split(np.arange(len(items)))

    per_task: dict[int, tuple[list[LengthRow], list[DepthRow]]] = {i: ([], []) for i in range(len(task_names))}
    for g, (tc, length) in enumerate(len_keys):
        m = len_members[g]
        bins = dbin[m][~np.isnan(dbin[m])]
        per_task[tc][0].append(
            LengthRow(
                target_length=int(length),
                length_kind=_label(items.kind[m]),
                length_tags=_label([t for t in items.tags[m] if t]),
                depths=[float(x) for x in sorted(set(bins.tolist()))],
                **dict(len_fig[g]),
            )
        )
    for g, (tc, b) in enumerate(depth_keys):
        m = depth_members[g]
        per_task[tc][1].append(
            DepthRow(
                depth_bin=float(b),
                depth_min=float(items.depth[m].min()),
                depth_max=float(items.depth[m].max()),
                lengths=[int(x) for x in sorted(set(items.length[m].tolist()))],
                **dict(depth_fig[g]),
            )
        )
    tasks = []
    for i, name in enumerate(task_names):
        metrics = sorted({p.metric for p, m in el.scores if p.task == name})
        lengths, depths = per_task[i]
        tasks.append(TaskBreakdown(task=name, metrics=metrics, has_prompt_positions=prompt_split[name], depth_step=DEPTH_STEP,
                                   lengths=lengths, depths=depths))
    return tasks


class _Artifacts(Protocol):
    samples: pa.Table
    tokens: pa.Table
    teacher: pa.Table | None


def _only_tasks(table: pa.Table | None, tasks: list[str]) -> pa.Table | None:
    if table is None:
        return None
    return table.filter(pc.is_in(table.column("task").cast(pa.string()), value_set=pa.array(tasks, type=pa.string())))


def breakdown_artifacts(
    a: _Artifacts, b: _Artifacts, *, margin: float = DEFAULT_MARGIN, alpha: float = ALPHA
) -> list[TaskBreakdown] | None:
    """:func:`length_breakdown` of two variants' artifacts (VariantArtifacts) on their own.

    Compares the scores and traces of the long-context tasks only (the comparison of a
    run does this as part of its task-level comparison and passes its results instead).
    """
    if not has_lengths(a.samples, b.samples):
        return None
    tasks = sorted({str(t) for t in pc.unique(pa.concat_arrays([
        _with_length(s).column("task").cast(pa.string()).combine_chunks() for s in (a.samples, b.samples)
    ])).to_pylist()})
    if not tasks:
        return None
    sa, sb = _only_tasks(a.samples, tasks), _only_tasks(b.samples, tasks)
    paired, _, _ = paired_scores(sa, sb)
    tokens = compare_tokens(_only_tasks(a.tokens, tasks), _only_tasks(b.tokens, tasks), sa, sb, worst_k=0)
    teacher = None
    if a.teacher is not None and b.teacher is not None:
        teacher = compare_tokens(_only_tasks(a.teacher, tasks), _only_tasks(b.teacher, tasks), worst_k=0)
    return length_breakdown(sa, sb, ScoreComparison(rows=(), paired=tuple(paired)), tokens, teacher, margin=margin, alpha=alpha)
