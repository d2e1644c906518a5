"""The report's content as plain data, built from the comparison document and the run.json dict.

report.md and report.html show the same content in the same order, so both render
one view. The view holds no markup: structure (top-k items, which one to mark, gate
status) stays data for the templates. The renderers differ only in how untrusted
text is made safe, so the builder takes ``esc``: every piece of model or dataset
text, and every label that could clash with the output syntax, passes through it.

The comparison is read by attribute from its typed document
(:mod:`evalpipe.documents.comparison`); run.json is read tolerantly (any key may be missing).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from evalpipe.compare.code_paths import FAILED, NOT_RECORDED, SAME_CODE, VERIFIED, short
from evalpipe.compare.verdict import Status, fmt_delta, fmt_score, fmt_small
from evalpipe.documents.comparison import (
    Comparison,
    ComparisonDocument,
    FlippedItem,
    FreeFigures,
    GroupFigures,
    GroupScore,
    LengthRow,
    Paths,
    ScoreRow,
    SideCheck,
    TaskBreakdown,
    TeacherFigures,
    TokenSummary,
    WorstExample,
)
from evalpipe.documents.manifest import ProbeSummary
from evalpipe.documents.run_doc import RunDocument
from evalpipe.gates import registry
from evalpipe.redact import redact

Esc = Callable[..., str]  # (text, max_len=None) -> safe text

EXCERPT_CHARS = 160
EXCERPT_CONTEXT = 48
CONTEXT_CHARS = 200
TOPK_SHOWN = 5
FLIPPED_SHOWN = 10  # per task x metric; compare.json lists more
EVIDENCE_SHOWN = 10  # per failing gate
DASH = "\u2014"
ELLIPSIS = "\u2026"

# Failing gates first: they are why a run is DIVERGENT.
GATE_ORDER = {"fail": 0, "skip": 1, "pass": 2}

# Worst-example lists of a token summary, with their headings per comparison mode.
WORST_LISTS = (
    ("worst_divergence", "Earliest divergences", "Earliest top-1 differences"),
    ("worst_logprob", "Largest |Δlogprob| before any divergence", "Largest |Δlogprob|"),
    ("worst_kl", "Largest KL before any divergence", "Largest KL"),
)


# Unicode categories Cc, Cs, Zl and Zp
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def show_controls(s: str, keep: str = "") -> str:
    """Control, lone-surrogate and line-separator characters (model output can hold any) as \\uXXXX.

    They break table rows, are invalid in HTML and cannot be encoded as UTF-8.
    """
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", s)


# ---------------------------------------------------------------------------
# number formatting
# ---------------------------------------------------------------------------


def fmt_num(x: Any) -> str:
    """Gate values: counts as integers, measurements with 3 significant digits."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return DASH if x is None else str(x)
    if not math.isfinite(x):
        return "n/a"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.3g}"


def fmt_lp(x: float | None) -> str:
    if x is None:
        return "n/a"
    s = f"{x:.4g}"
    return "\u2212" + s[1:] if s.startswith("-") else s


def fmt_pct(n: int | None, total: int | None) -> str:
    if n is None or total is None:
        return DASH
    return f"{n}/{total} ({100.0 * n / total:.1f}%)" if total else "0/0"


def fmt_p(p: float | None) -> str:
    if p is None:
        return DASH
    if p >= 1.0:
        return "1"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def _fmt_mean_se(mean: float | None, se: float | None) -> str:
    return fmt_score(mean) if se is None or mean is None else f"{fmt_score(mean)} \u00b1 {fmt_score(se)}"


def fmt_where(doc: Any, repeat: Any, pos: Any = None) -> str:
    s = f"doc {doc}" + (f" repeat {repeat}" if repeat else "")
    return s if pos is None else f"{s} pos {pos}"


def _positions(items: Sequence[Sequence[int]] | None, total: int | None) -> str:
    """'doc 3 pos 5, doc 7 repeat 1 pos 0 (first 2 of 31)', or '' when there is none."""
    listed = [fmt_where(*item) for item in items or () if len(item) == 3]
    if not listed:
        return ""
    more = f" (first {len(listed)} of {total})" if total and total > len(listed) else ""
    return ", ".join(listed) + more


def _triple(v: Any) -> str:
    return fmt_where(*v) if isinstance(v, (list, tuple)) and len(v) == 3 else DASH


# ---------------------------------------------------------------------------
# examples (flipped items, worst positions)
# ---------------------------------------------------------------------------


def excerpts(a: str | None, b: str | None) -> tuple[str, str]:
    """Windows of both responses around their first differing character."""
    a, b = a or "", b or ""
    k = 0
    for k, (x, y) in enumerate(zip(a, b)):  # noqa: B007 - k is read after the loop
        if x != y:
            break
    else:
        k = min(len(a), len(b))
    start = max(0, k - EXCERPT_CONTEXT) if a != b else 0

    def cut(s: str) -> str:
        piece = s[start : start + EXCERPT_CHARS]
        return (ELLIPSIS if start > 0 else "") + piece + (ELLIPSIS if start + EXCERPT_CHARS < len(s) else "")

    return cut(a), cut(b)


def _quoted(text: Any) -> str:
    # Token texts are mostly whitespace and fragments: a JSON literal shows " the" and "\n" as they are.
    return json.dumps(str(text), ensure_ascii=False)


class _HasTask(Protocol):
    @property
    def task(self) -> str: ...


_T = TypeVar("_T", bound=_HasTask)


def _side(w: WorstExample, side: str) -> tuple[int | None, str | None, float | None, int]:
    """(token, its text, its logprob, sequence length) of side "a" or "b" at the example's position."""
    if side == "a":
        return w.token_a, w.token_text_a, w.logprob_a, w.len_a
    return w.token_b, w.token_text_b, w.logprob_b, w.len_b


def _token(w: WorstExample, side: str, esc: Esc) -> dict[str, Any]:
    tok, text, lp, length = _side(w, side)
    if tok is None:
        return {"ended": f"ended after {length} tokens"}
    return {
        "ended": None,
        "id": esc(str(tok)),
        "text": esc(_quoted(text)) if text is not None else None,
        "lp": fmt_lp(lp),
    }


def _topk(w: WorstExample, side: str, esc: Esc) -> dict[str, Any]:
    if side == "a":
        ids, lps, texts, mark = w.topk_ids_a or [], w.topk_logprobs_a or [], w.topk_texts_a or [], w.token_b
    else:
        ids, lps, texts, mark = w.topk_ids_b or [], w.topk_logprobs_b or [], w.topk_texts_b or [], w.token_a
    items = []
    for i, tid in enumerate(ids[:TOPK_SHOWN]):
        items.append(
            {
                "id": esc(str(tid)),
                "text": esc(_quoted(texts[i])) if i < len(texts) and texts[i] is not None else None,
                "lp": fmt_lp(lps[i]) if i < len(lps) else "?",
                "mark": mark is not None and tid == mark,
            }
        )
    return {"items": items, "more": len(ids) > TOPK_SHOWN}


def _example_view(w: WorstExample, esc: Esc) -> dict[str, Any]:
    ex_a, ex_b = excerpts(w.response_a, w.response_b)
    measures = []
    if w.kl is not None:
        measures.append(f"KL {fmt_small(w.kl)}")
    # at a divergence the two tokens differ, so their logprob difference means nothing
    if w.abs_dlogprob is not None and w.kind != "earliest_divergence":
        measures.append(f"|Δlogprob| {fmt_small(w.abs_dlogprob)}")
    context = w.context
    if context and len(context) > CONTEXT_CHARS:
        context = ELLIPSIS + context[-CONTEXT_CHARS:]
    return {
        "where": esc(fmt_where(w.doc_id, w.repeat, None) + f", position {w.pos}"),
        "measures": esc(", ".join(measures)),
        "token_a": _token(w, "a", esc),
        "token_b": _token(w, "b", esc),
        "topk_a": _topk(w, "a", esc),
        "topk_b": _topk(w, "b", esc),
        "context": esc(context) if context else "",
        "response_a": esc(ex_a),
        "response_b": esc(ex_b),
        "target": esc(w.target, EXCERPT_CHARS) if w.target else "",
    }


def _flipped_view(f: FlippedItem, esc: Esc) -> dict[str, Any]:
    ex_a, ex_b = excerpts(f.response_a, f.response_b)
    return {
        "where": esc(f"{f.doc_id}" + (f" repeat {f.repeat}" if f.repeat else "")),
        "scores": esc(f"{fmt_num(f.score_a)} \u2192 {fmt_num(f.score_b)}"),
        "question": esc(f.question, EXCERPT_CHARS),
        "target": esc(f.target, EXCERPT_CHARS),
        "answer_a": esc(f.answer_a, EXCERPT_CHARS),
        "answer_b": esc(f.answer_b, EXCERPT_CHARS),
        "response_a": esc(ex_a),
        "response_b": esc(ex_b),
    }


# ---------------------------------------------------------------------------
# per task
# ---------------------------------------------------------------------------


def _changed(r: ScoreRow) -> str:
    s = f"{r.n_changed}/{r.n_paired}"
    if r.binary and r.n_changed:
        s += f" ({r.a_right_b_wrong} right\u2192wrong, {r.a_wrong_b_right} wrong\u2192right)"
    if r.n_missing:
        s += f", {r.n_missing} scored on one side only"
    return s


def _stats_view(r: ScoreRow, esc: Esc) -> dict[str, Any]:
    """Means ± SE, Δ with its CI, McNemar, TOST, detectable Δ."""
    n = r.n_paired
    if n == 0:
        tost = "n/a"
    else:
        tost = ("yes " if r.equivalent else "no ") + fmt_ci(r.tost_ci_low, r.tost_ci_high)
    clusters = f" in {r.n_clusters} clusters" if r.n_clusters != n else ""
    return {
        "metric": esc(r.metric),
        "a": _fmt_mean_se(r.mean_a, r.se_a),
        "b": _fmt_mean_se(r.mean_b, r.se_b),
        "delta": f"{fmt_delta(r.delta)} {fmt_ci(r.ci_low, r.ci_high)}" if n else "n/a",
        "mcnemar": fmt_p(r.mcnemar_p),
        "tost": tost,
        "mdd": fmt_score(r.mdd),
        "n": f"{n}{clusters}",
    }


def _flipped_section(r: ScoreRow, esc: Esc) -> dict[str, Any] | None:
    if not r.flipped:
        return None
    total = r.n_flipped or len(r.flipped)
    shown = min(FLIPPED_SHOWN, len(r.flipped))
    return {
        "metric": esc(r.metric),
        "count": f"{total}" if total <= shown else f"first {shown} of {total}",
        "rows": [_flipped_view(f, esc) for f in r.flipped[:FLIPPED_SHOWN]],
    }


def _triplet(*values: float | None) -> str:
    return " / ".join(fmt_small(v) for v in values)


# (label, cell) of the token summary table; a cell is computed from one token summary.
TOKEN_ROWS: tuple[tuple[str, Callable[[TokenSummary], str]], ...] = (
    ("samples compared", lambda t: f"{t.n_samples}"),
    ("only in reference / variant", lambda t: f"{t.only_a} / {t.only_b}"),
    ("ids identical", lambda t: fmt_pct(t.n_ids_identical, t.n_samples)),
    ("bitwise identical", lambda t: fmt_pct(t.n_identical, t.n_samples)),
    ("differ in length", lambda t: fmt_num(t.n_length_diff)),
    ("median first divergence", lambda t: fmt_num(t.median_first_divergence)),
    ("first divergences near-tie / hard", lambda t: f"{fmt_num(t.n_near_tie_divergences)} / {fmt_num(t.n_hard_divergences)}"),
    ("positions compared", lambda t: fmt_num(t.n_positions_compared)),
    ("top-k sets equal", lambda t: fmt_pct(t.n_positions_topk_equal, t.n_positions_compared)),
    ("|Δlogprob| p50 / p99 / max", lambda t: _triplet(t.abs_dlogprob_p50, t.abs_dlogprob_p99, t.max_abs_dlogprob)),
    ("mean |Δlogprob|", lambda t: fmt_small(t.mean_abs_dlogprob)),
    ("KL p50 / p99 / max", lambda t: _triplet(t.kl_p50, t.kl_p99, t.kl_max)),
    ("largest KL at", lambda t: _triple(t.kl_max_at)),
    ("top-1 agreement", lambda t: fmt_pct(t.n_positions_compared - t.n_top1_disagree, t.n_positions_compared)),
    ("hard top-1 flips", lambda t: fmt_num(t.n_top1_hard)),
)


def _token_table(columns: list[tuple[str, TokenSummary]], esc: Esc) -> dict[str, Any] | None:
    if not columns:
        return None
    return {
        "columns": [esc(label) for label, _ in columns],
        "rows": [(esc(label), [esc(cell(t)) for _, t in columns]) for label, cell in TOKEN_ROWS],
    }


def _worst_lists(t: TokenSummary) -> tuple[list[WorstExample], ...]:
    """The worst-example lists of a token summary, in WORST_LISTS' order."""
    return t.worst_divergence, t.worst_logprob, t.worst_kl


def _worst_sections(t: TokenSummary | None, teacher: bool, esc: Esc) -> list[dict[str, Any]]:
    if t is None:
        return []
    out = []
    for (_, free_title, teacher_title), examples in zip(WORST_LISTS, _worst_lists(t)):
        if examples:
            title = f"{teacher_title} (teacher-forced)" if teacher else f"{free_title} (free-running)"
            out.append({"title": esc(title), "examples": [_example_view(w, esc) for w in examples]})
    return out


def _by_task(items: Iterable[_T] | None) -> dict[str, _T]:
    return {t.task: t for t in items or ()}


def _task_view(task: str, c: Comparison, nf: Comparison | None, esc: Esc) -> dict[str, Any]:
    rows = [r for r in c.scores if r.task == task]
    free = _by_task(c.tokens).get(task)
    teacher = _by_task(c.teacher).get(task)
    free_aa = _by_task(nf.tokens if nf else None).get(task)
    teacher_aa = _by_task(nf.teacher if nf else None).get(task)
    columns = [
        (label, t)
        for label, t in (
            ("free-running", free),
            ("free-running A/A", free_aa),
            ("teacher-forced", teacher),
            ("teacher-forced A/A", teacher_aa),
        )
        if t is not None
    ]
    margins = sorted({r.margin for r in rows if r.margin is not None})
    notes = []
    if free and free.hard_divergences:
        notes.append(("Hard free-running divergences", _positions(free.hard_divergences, free.n_hard_divergences)))
    if teacher and teacher.top1_hard_positions:
        notes.append(("Hard teacher-forced top-1 flips", _positions(teacher.top1_hard_positions, teacher.n_top1_hard)))
    return {
        "name": esc(task),
        "scores": [
            {
                "metric": esc(r.metric),
                "a": fmt_score(r.mean_a),
                "b": fmt_score(r.mean_b),
                "delta": fmt_delta(r.delta),
                "changed": esc(_changed(r)),
            }
            for r in rows
        ],
        "stats": [_stats_view(r, esc) for r in rows],
        "margin": ", ".join(f"{m:g}" for m in margins),
        "flipped": [f for f in (_flipped_section(r, esc) for r in rows) if f],
        "tokens": _token_table(columns, esc),
        "notes": [(esc(label), esc(text)) for label, text in notes],
        "worst": _worst_sections(free, False, esc) + _worst_sections(teacher, True, esc),
        "by_length": _length_section(task, c, nf, esc),
        # unescaped sources, for renderers that draw from the numbers (plots)
        "data": {"free": free, "teacher": teacher, "free_aa": free_aa, "teacher_aa": teacher_aa},
    }


# ---------------------------------------------------------------------------
# per length / depth (long-context tasks: compare.json "by_length")
# ---------------------------------------------------------------------------

LENGTH_NOTE = (
    "One row per prompt length (exact token count) and per needle-depth bin. Edge-case lengths sit at "
    "layout boundaries; tags: tpT:r = r tokens over a multiple of the tensor-parallel size T, "
    "block / block±1 = at or next to the attention block size. TF = teacher-forced; with prompt positions, "
    "cells read prompt / continuation. A/A = the reference against its own second run."
)


def _primary_metric(entry: TaskBreakdown) -> str | None:
    """The metric the table shows: the first 0/1 metric of the task, else its first metric."""
    binary = {s.metric for r in entry.lengths for s in r.scores if s.binary}
    return next((m for m in entry.metrics if m in binary), entry.metrics[0] if entry.metrics else None)


def _score_of(row: GroupFigures, metric: str | None) -> GroupScore | None:
    return next((s for s in row.scores if s.metric == metric), None)


def _trace_source(entry: TaskBreakdown) -> str:
    """'teacher' when the rows carry teacher-forced figures, else 'free'."""
    rows: list[GroupFigures] = [*entry.lengths, *entry.depths]
    return "teacher" if any(r.teacher is not None for r in rows) else "free"


Figure = Callable[[FreeFigures | TeacherFigures], Any]  # one figure of a row's free-running or teacher-forced part


def _split_cell(row: GroupFigures | None, figure: Figure, fmt: Callable[[Any], str], split: bool, source: str) -> str:
    """One figure of a row: 'prompt / continuation' when split, else over all positions."""
    if row is None:
        return DASH
    if source == "free":
        return fmt(figure(row.free)) if row.free else DASH
    if split:
        parts = [row.teacher_prompt, row.teacher_continuation]
        return " / ".join(fmt(figure(p)) if p else DASH for p in parts)
    return fmt(figure(row.teacher)) if row.teacher else DASH


def _n_items(row: GroupFigures) -> str:
    return f"{row.n_items}" + (f" in {row.n_clusters} clusters" if row.n_clusters != row.n_items else "")


def _free_div(row: GroupFigures) -> str:
    f = row.free
    if not f:
        return DASH
    return f"{f.n_divergent}/{f.n_samples} ({f.n_hard_divergences} hard)"


def _group_columns(
    first: list[str], reference: str, variant: str, metric: str | None, source: str, split: bool, with_aa: bool
) -> list[str]:
    part = " prompt / cont." if split else ""
    mode = "TF" if source == "teacher" else "free-running"
    cols = first + [f"{reference} score", f"{variant} score", "Δ [95% CI]", "McNemar p", "free-running diverged (hard)"]
    cols.append(f"{mode} KL max{part}")
    if with_aa:
        cols.append(f"A/A {mode} KL max{part}")
    cols.append(f"{mode} max |Δlogprob|{part}")
    if source == "teacher":
        cols.append(f"TF hard top-1 flips{part}")
    return cols


def _kl_max(f: FreeFigures | TeacherFigures) -> float | None:
    return f.kl_max


def _max_abs_dlogprob(f: FreeFigures | TeacherFigures) -> float | None:
    return f.max_abs_dlogprob


def _top1_hard(f: FreeFigures | TeacherFigures) -> int | None:
    return f.n_top1_hard if isinstance(f, TeacherFigures) else None


def _group_cells(
    row: GroupFigures, aa_row: GroupFigures | None, metric: str | None, source: str, split: bool, with_aa: bool
) -> list[str]:
    s = _score_of(row, metric)
    cells = [
        fmt_score(s.mean_a) if s else DASH,
        fmt_score(s.mean_b) if s else DASH,
        f"{fmt_delta(s.delta)} {fmt_ci(s.ci_low, s.ci_high)}" if s and s.n_paired else "n/a",
        fmt_p(s.mcnemar_p) if s else DASH,
        _free_div(row),
        _split_cell(row, _kl_max, fmt_small, split, source),
    ]
    if with_aa:
        cells.append(_split_cell(aa_row, _kl_max, fmt_small, split, source))
    cells.append(_split_cell(row, _max_abs_dlogprob, fmt_small, split, source))
    if source == "teacher":
        cells.append(_split_cell(row, _top1_hard, fmt_num, split, source))
    return cells


def _kind(row: LengthRow) -> str:
    kind, tags = row.length_kind or DASH, row.length_tags
    return f"{kind} ({tags})" if tags else str(kind)


def _span(values: Sequence[Any]) -> str:
    vals = [int(v) for v in values or ()]
    if not vals:
        return DASH
    return str(vals[0]) if len(vals) == 1 else f"{min(vals)}\u2013{max(vals)} ({len(vals)})"


def _length_section(task: str, c: Comparison, nf: Comparison | None, esc: Esc) -> dict[str, Any] | None:
    entry = _by_task(c.by_length).get(task)
    if entry is None:
        return None
    aa = _by_task(nf.by_length if nf else None).get(task)
    metric = _primary_metric(entry)
    source = _trace_source(entry)
    split = entry.has_prompt_positions and source == "teacher"
    with_aa = aa is not None
    ref, var = c.reference, c.variant
    aa_len = {r.target_length: r for r in (aa.lengths if aa else ())}
    aa_depth = {r.depth_bin: r for r in (aa.depths if aa else ())}
    lengths = [
        {
            "edge": r.length_kind == "edge",
            "cells": [esc(x) for x in [fmt_num(r.target_length), _kind(r), _n_items(r)]
                      + _group_cells(r, aa_len.get(r.target_length), metric, source, split, with_aa)],
        }
        for r in entry.lengths
    ]
    depths = [
        {
            "edge": False,
            "cells": [
                esc(x)
                for x in [
                    f"{r.depth_bin:.1f} ({r.depth_min:.2f}\u2013{r.depth_max:.2f})",
                    _span(r.lengths),
                    _n_items(r),
                ]
                + _group_cells(r, aa_depth.get(r.depth_bin), metric, source, split, with_aa)
            ],
        }
        for r in entry.depths
    ]
    others = [m for m in entry.metrics if m != metric]
    return {
        "metric": esc(metric or DASH),
        "other_metrics": esc(", ".join(others)) if others else "",
        "note": esc(LENGTH_NOTE),
        "length_columns": [esc(x) for x in _group_columns(["length", "kind (tags)", "items"], ref, var, metric, source, split, with_aa)],
        "lengths": lengths,
        "depth_columns": [esc(x) for x in _group_columns(["depth", "lengths", "items"], ref, var, metric, source, split, with_aa)],
        "depths": depths,
        # unescaped sources, for the plots
        "data": {"ab": entry, "aa": aa, "source": source, "split": split},
    }


def _comparison_view(c: Comparison, nf: Comparison | None, esc: Esc) -> dict[str, Any]:
    tasks = sorted({r.task for r in c.scores} | set(_by_task(c.tokens)) | set(_by_task(c.teacher)))
    only = [
        esc(f"metrics reported only by {who}: {', '.join(ms)}")
        for who, ms in ((c.reference, c.metrics_only_a), (c.variant, c.metrics_only_b))
        if ms
    ]
    return {
        "reference": esc(c.reference),
        "variant": esc(c.variant),
        "status": esc(c.status),
        "outputs_status": esc(c.outputs_status or ""),
        "reasons": [esc(r) for r in c.reasons],
        "only": only,
        "tasks": [_task_view(task, c, nf, esc) for task in tasks],
    }


# ---------------------------------------------------------------------------
# gates
# ---------------------------------------------------------------------------


def _what_gate(name: str) -> str:
    """The gate's own words (evalpipe/gates/registry.py); a comparison written by another
    version may name a gate this one does not know."""
    known = registry.BY_NAME.get(name)
    return f"{known.label}: {known.sentence}" if known is not None else "a gate this version of evalpipe does not know"


def _gate_rows(compare: ComparisonDocument, esc: Esc) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in compare.comparisons:
        for g in c.gates:
            more = len(g.evidence) - EVIDENCE_SHOWN
            rows.append(
                {
                    "variant": esc(c.variant),
                    "gate": esc(g.gate),
                    "what": esc(_what_gate(g.gate)),
                    "task": esc(g.task),
                    "metric": esc(g.metric) if g.metric else "",
                    "measured": esc(fmt_num(g.measured)),
                    "threshold": esc(fmt_num(g.threshold)),
                    "aa": esc(fmt_num(g.aa_value)),
                    "status": g.status,  # the templates test it
                    "detail": esc(g.detail),
                    "evidence": [esc(e) for e in g.evidence[:EVIDENCE_SHOWN]]
                    + ([esc(f"… {more} more in compare.json")] if more > 0 else []),
                }
            )
    rows.sort(key=lambda r: GATE_ORDER[r["status"]])
    return rows


def gate_counts(compare: ComparisonDocument) -> dict[str, int]:
    counts = {"total": 0, "fail": 0, "skip": 0, "pass": 0}
    for c in compare.comparisons:
        for g in c.gates:
            counts["total"] += 1
            counts[g.status] += 1
    return counts


def _gates_summary(counts: Mapping[str, int], inconclusive: Sequence[str], unverified: Sequence[str] = ()) -> str:
    if not counts["total"]:
        return "No gate was evaluated."
    skipped = f", {counts['skip']} skipped" if counts["skip"] else ""
    if counts["fail"]:
        return f"{counts['fail']} of {counts['total']} gates failed{skipped}."
    # the gates judge outputs only: passing them is no pass when the paths prove nothing, or
    # when the outputs are files nothing vouches for
    buts = []
    if inconclusive:
        buts.append(f"the paths of {', '.join(inconclusive)} prove nothing")
    if unverified:
        buts.append(f"{', '.join(unverified)} {'was' if len(unverified) == 1 else 'were'} compared unverified (no manifest.json)")
    if buts:
        see = " (see What ran)" if inconclusive else ""
        return (f"All {counts['total'] - counts['skip']} evaluated output gates passed{skipped}, but "
                f"{' and '.join(buts)}: {Status.INCONCLUSIVE.value}{see}.")
    return f"All {counts['total'] - counts['skip']} evaluated gates passed{skipped}."


# ---------------------------------------------------------------------------
# run header from run.json (tolerant: any key may be missing or shaped differently)
# ---------------------------------------------------------------------------


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else "n/a"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    return str(v)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d} if prefix else {"": d}


def _model_text(model: Any) -> str | None:
    if model is None:
        return None
    if isinstance(model, dict):
        name = next((model[k] for k in ("name", "id", "path", "model") if model.get(k)), None)
        rest = {k: v for k, v in model.items() if not isinstance(v, (dict, list)) and v != name}
        extras = ", ".join(f"{k}={_scalar(v)}" for k, v in sorted(rest.items()))
        return f"{name} ({extras})" if name and extras else str(name or extras)
    return str(model)


def _variant_settings(run: RunDocument) -> dict[str, dict[str, Any]]:
    """name -> the settings run.json records for it (credentials redacted: a run.json of an
    older evalpipe may keep them)."""
    out: dict[str, dict[str, Any]] = {n: {} for n in run.variants}
    for name, settings in run.variant_settings.items():
        out[name] = redact(settings.model_dump(mode="json", exclude_none=True, exclude_defaults=True))
    return out


def _distinguishing(settings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Per variant, the flattened settings whose values differ between variants (all if only one)."""
    flat = {n: flatten(s) for n, s in settings.items()}
    keys = sorted({k for f in flat.values() for k in f})
    if len(flat) > 1:
        keys = [k for k in keys if len({_scalar(f.get(k)) for f in flat.values()}) > 1]
    return {n: "; ".join(f"{k}={_scalar(f[k])}" for k in keys if k in f) for n, f in flat.items()}


def _run_header(compare: ComparisonDocument, run: RunDocument, esc: Esc) -> dict[str, Any]:
    reference = compare.reference
    compared = list(compare.variants)
    nf = compare.noise_floor
    aa = nf.variant if nf is not None else ""

    rows: list[tuple[str, str]] = [("run id", compare.run_id)]
    model = _model_text(redact(run.model.model_dump(mode="json", exclude_none=True)))
    if model:
        rows.append(("model", model))
    rows.extend((f"fingerprint {k}", _scalar(v)) for k, v in sorted(run.fingerprints.model_dump(exclude_none=True).items()))
    if run.status is not None:
        rows.append(("status", _scalar(run.status)))
    if run.hardware is not None:
        rows.append(("hardware", _scalar(redact(run.hardware))))
    if run.versions:
        rows.append(("versions", ", ".join(f"{k} {_scalar(v)}" for k, v in sorted(run.versions.items()) if v is not None)))
    for group, values in sorted(compare.gates.model_dump(mode="json").items()):
        flat = flatten(values)
        rows.append((f"{group} gates", ", ".join(f"{k}={_scalar(v)}" for k, v in sorted(flat.items()))))
    rows.append(("A/A noise floor", f"{aa} vs {reference}: {nf.status}" if nf is not None else "not run"))
    for name, placed in run.placements.items():  # a run on a Ray cluster: where each variant ran
        resources = ", ".join(f"{k} {v:g}" for k, v in sorted(placed.resources.items()))
        rows.append((f"{name} ran on", f"{placed.hostname} ({placed.node_ip}, Ray node {placed.node_id[:12]}) with "
                                       f"{resources or 'no resources'}; cluster {placed.cluster}"))

    names = list(run.variants)
    for n in [reference, *compared, aa]:
        if n and n not in names:
            names.append(n)
    dist = _distinguishing(_variant_settings(run))

    def role(n: str) -> str:
        if n == reference:
            return "reference"
        if n == aa:
            return "A/A noise floor"
        return "compared" if n in compared else "not compared"

    timing_rows = [(esc(k), esc(_scalar(v))) for k, v in sorted(run.timings.model_dump(exclude_none=True).items())]
    return {
        "rows": [(esc(k), esc(v)) for k, v in rows],
        "variants": [{"name": esc(n), "role": role(n), "settings": esc(dist.get(n, ""))} for n in names],
        "timings": timing_rows,
    }


# ---------------------------------------------------------------------------
# what ran (compare.json "paths": the path probes of each side, judged)
# ---------------------------------------------------------------------------

# The switches that decide how the model is laid out over processes: a row each, equal or not.
LAYOUT_SWITCHES = (
    "tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "enable_expert_parallel",
    "all2all_backend", "use_sequence_parallel_moe", "attention_backends", "dtype",
)
# The kernels vLLM's CPU build chose by processor (the probes' cpu_kernels): a row wherever
# recorded, equal or not, since the same config runs other kernels on another x86 kind.
PROCESSOR_SWITCHES = ("cpu_kernels",)
NOT_RECORDED_CELL = "not recorded"
ENDPOINT_CELL = "not verifiable (endpoint)"
PATH_SENTENCES = {
    FAILED: "the paths failed their expectations",
    SAME_CODE: "both sides ran the same code",
    VERIFIED: "each side ran the path its expectations declare",
    NOT_RECORDED: "the path probes recorded nothing to judge",
}
INCONCLUSIVE_NOTE = (
    "INCONCLUSIVE: the outputs were compared, but the path probes do not show each side running the code it "
    "claims, so the comparison proves nothing about the change (see What ran)."
)


def path_reasons(c: Comparison) -> list[str]:
    return list(c.paths.reasons) if c.paths is not None else []


def paths_inconclusive(c: Comparison) -> bool:
    """The paths prove nothing: an expectation failed, a side is unverifiable, or both ran the same code."""
    return c.paths is not None and c.paths.status in (FAILED, SAME_CODE)


def judged_entries(compare: ComparisonDocument) -> list[tuple[Comparison, bool]]:
    """(comparison, is the A/A one): the comparisons, then the noise floor."""
    nf = compare.noise_floor
    return [(c, False) for c in compare.comparisons] + ([(nf, True)] if nf is not None else [])


def unverified_only(c: Comparison) -> bool:
    """INCONCLUSIVE only because a side was compared without its manifest (its paths say nothing against it)."""
    return bool(c.unverified) and not paths_inconclusive(c)


def inconclusive_variants(compare: ComparisonDocument) -> list[str]:
    """The variants whose paths prove nothing (INCONCLUSIVE for another reason than being compared unverified)."""
    return [c.variant for c in compare.comparisons if c.status == Status.INCONCLUSIVE.value and not unverified_only(c)]


def unverified_note(compare: ComparisonDocument) -> str:
    """The reports' first words when variants were compared without their manifest; "" otherwise."""
    names = compare.unverified or []
    if not names:
        return ""
    sides = ", ".join(names)
    whose = "its files were" if len(names) == 1 else "their files were"
    return (f"Compared unverified (--unverified): {sides} had no manifest.json, so {whose} not checked against "
            f"what the engine wrote; every comparison that read {'it' if len(names) == 1 else 'them'} is "
            f"{Status.INCONCLUSIVE.value}, whatever the outputs say.")


def _side_summary(c: Comparison, side: str) -> ProbeSummary | None:
    """what_ran.a (the reference) or what_ran.b (the variant) of a comparison."""
    if c.paths is None:
        return None
    return c.paths.what_ran.a if side == "a" else c.paths.what_ran.b


def _side_check(c: Comparison, variant: str) -> SideCheck | None:
    checks = c.paths.checks if c.paths is not None else []
    return next((ch for ch in checks if ch.variant == variant), None)


@dataclass(frozen=True)
class _Column:
    """One side in the what-ran table: its summary (None: not recorded) and its expectations' check."""

    name: str
    role: str  # "reference", "A/A", or "" for a compared variant
    summary: ProbeSummary | None
    check: SideCheck | None

    @property
    def recorded(self) -> bool:
        return self.summary is not None and self.summary.verifiable

    @property
    def values(self) -> ProbeSummary:
        """The summary of a recorded column."""
        if self.summary is None:
            raise ValueError(f"the what-ran column {self.name} recorded nothing")
        return self.summary

    @property
    def missing(self) -> str:
        """What the column says instead of values when it has none."""
        return NOT_RECORDED_CELL if self.summary is None else ENDPOINT_CELL


def _columns(compare: ComparisonDocument) -> list[_Column]:
    """The reference, every compared variant, then the A/A run."""
    entries = [c for c, _ in judged_entries(compare)]
    reference = compare.reference
    # every comparison shares the reference: the first one that recorded it speaks for all
    ref_summary = next((s for c in entries if (s := _side_summary(c, "a")) is not None), None)
    ref_check = next((ch for c in entries if (ch := _side_check(c, reference)) is not None), None)
    columns = [_Column(reference, "reference", ref_summary, ref_check)]
    for c, aa in judged_entries(compare):
        columns.append(_Column(c.variant, "A/A" if aa else "", _side_summary(c, "b"), _side_check(c, c.variant)))
    return columns


def _value_text(value: Any) -> str:
    """A switch value as a reader writes it: strings bare, lists comma-joined, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) if value else "[]"
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _switch_cell(name: str, summary: ProbeSummary) -> str:
    if name not in summary.switches:
        return DASH
    value = summary.switches[name]
    # the engine's own value, any JSON; processes that resolved it differently are listed
    if isinstance(value, dict) and isinstance(value.get("per_process"), list):
        return " | ".join(_value_text(v) for v in value["per_process"])
    return _value_text(value)


def _processes_cell(summary: ProbeSummary) -> str:
    listed = ", ".join(f"{n} {role}" for role, n in summary.processes.items()) or "no process recorded"
    reused = f" (reused {summary.server_of}'s server)" if summary.server_of else ""
    return f"{summary.mode}: {listed}{reused}"


def _models_cell(summary: ProbeSummary) -> str:
    return ", ".join(short(m) for m in summary.models) or "none"


def _layers_cell(summary: ProbeSummary) -> str:
    return ", ".join(f"{n} \u00d7 {short(cls)}" for cls, n in sorted(summary.layers.items())) or "none"


def _calls_cell(name: str, summary: ProbeSummary) -> str:
    if name in summary.absent:
        return "absent"
    return fmt_num(summary.calls[name]) if name in summary.calls else DASH


def _collective_cell(kind: str, summary: ProbeSummary) -> str:
    """"3 in 40/48, 0 in 8/48": each count of calls in one forward pass, most frequent first."""
    entry = summary.collectives_per_forward.get(kind)
    forwards = entry.forwards if entry is not None else summary.forwards
    if not forwards:
        return "no forward pass"
    # a kind this side never called is 0 in every forward pass
    counts = (entry.counts if entry is not None else {}) or {"0": forwards}
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{value} in {n}/{forwards}" for value, n in ordered)


def _no_collectives_cell(summary: ProbeSummary) -> str:
    forwards = summary.forwards
    return f"none in {forwards}/{forwards}" if forwards else "no forward pass"


def _expectations_cell(check: SideCheck | None) -> str:
    if check is None:
        return DASH
    if check.ok:
        return "\u2713"
    failures = len(check.failures)
    return f"{failures} failed" if failures else "not verified"


def _names_in(columns: Sequence[_Column], names_of: Callable[[ProbeSummary], Iterable[str]]) -> list[str]:
    """The names each column's summary lists, in the order the columns first name them."""
    names: dict[str, None] = {}
    for col in columns:
        names.update(dict.fromkeys(names_of(col.values)))
    return list(names)


Cell = Callable[[ProbeSummary], str]


def _row_makers(recorded: Sequence[_Column]) -> list[tuple[str, Cell]]:
    """(label, cell of one summary) per row, the rows that depend on what was recorded included."""
    rows: list[tuple[str, Cell]] = [("processes", _processes_cell), ("model", _models_cell),
                                    ("decoder layers", _layers_cell)]
    kinds = _names_in(recorded, lambda s: s.collectives_per_forward)
    if kinds:
        rows += [(f"{kind} per forward pass", partial(_collective_cell, kind)) for kind in sorted(kinds)]
    else:
        rows.append(("collectives per forward pass", _no_collectives_cell))
    rows += [(f"calls of {short(name)}", partial(_calls_cell, name)) for name in _names_in(recorded, lambda s: s.calls)]
    rows += [(name, partial(_switch_cell, name)) for name in LAYOUT_SWITCHES]
    switches = set(_names_in(recorded, lambda s: s.switches))
    rows += [(name, partial(_switch_cell, name)) for name in PROCESSOR_SWITCHES if name in switches]
    # any other switch only where the sides disagree: the table shows what sets them apart
    for name in sorted(switches - set(LAYOUT_SWITCHES) - set(PROCESSOR_SWITCHES)):
        cell = partial(_switch_cell, name)
        if _differs([cell(col.values) for col in recorded]):
            rows.append((name, cell))
    return rows


def _differs(cells: Sequence[str]) -> bool:
    return len(set(cells)) > 1


def _what_ran_table(columns: Sequence[_Column], esc: Esc) -> dict[str, Any]:
    recorded = [col for col in columns if col.recorded]
    rows = []
    for i, (label, cell) in enumerate(_row_makers(recorded)):
        # a column without values says why once, in the first row
        cells = [cell(col.values) if col.recorded else (col.missing if i == 0 else DASH) for col in columns]
        differs = _differs([x for x, col in zip(cells, columns) if col.recorded])
        rows.append({"label": esc(label), "cells": [esc(x) for x in cells], "differs": differs})
    rows.append({"label": esc("expectations"), "cells": [esc(_expectations_cell(col.check)) for col in columns],
                 "differs": False})
    return {"columns": [{"name": esc(col.name), "role": col.role} for col in columns], "rows": rows,
            "differs": any(r["differs"] for r in rows)}


def _path_block(c: Comparison, paths: Paths, aa: bool, esc: Esc) -> dict[str, Any]:
    """A comparison's path judgement: one sentence, then its reasons (failures, evidence or a note)."""
    sentence = PATH_SENTENCES[paths.status]
    if c.status == Status.INCONCLUSIVE.value:
        sentence += f", so the comparison is {Status.INCONCLUSIVE.value}"
    if c.outputs_status:
        sentence += f"; the outputs alone would be {c.outputs_status}"
    kind = {VERIFIED: "evidence", NOT_RECORDED: "note"}.get(paths.status, "failure")
    return {
        "variant": esc(c.variant),
        "reference": esc(c.reference),
        "aa": aa,
        "sentence": esc(sentence),
        "kind": kind,
        "lines": [esc(r) for r in paths.reasons],
    }


def what_ran_view(compare: ComparisonDocument, esc: Esc) -> dict[str, Any] | None:
    """Each comparison's path judgement and the sides side by side; None when no comparison
    was judged (a bare table comparison)."""
    judged = [(c, c.paths, aa) for c, aa in judged_entries(compare) if c.paths is not None]
    if not judged:
        return None
    columns = _columns(compare)
    return {
        "paths": [_path_block(c, paths, aa, esc) for c, paths, aa in judged],
        # a table of columns that all say "not recorded" shows nothing
        "table": _what_ran_table(columns, esc) if any(col.summary is not None for col in columns) else None,
    }


# ---------------------------------------------------------------------------
# the whole report
# ---------------------------------------------------------------------------


def build_view(compare: ComparisonDocument, run: RunDocument | None, esc: Esc) -> dict[str, Any]:
    """Everything a report shows, in the order it shows it."""
    # run.json is redacted when written; one from before that (or handed in) is redacted here
    run = run if run is not None else RunDocument()
    nf = compare.noise_floor
    counts = gate_counts(compare)
    return {
        "run_id": esc(compare.run_id),
        "status": esc(compare.status),
        "unverified_note": esc(unverified_note(compare)),
        "verdict_note": esc(INCONCLUSIVE_NOTE) if inconclusive_variants(compare) and compare.status == Status.INCONCLUSIVE.value else "",
        "comparisons": [_comparison_view(c, nf, esc) for c in compare.comparisons],
        "noise_floor": (
            {
                "reference": esc(nf.reference),
                "variant": esc(nf.variant),
                "status": esc(nf.status),
                "outputs_status": esc(nf.outputs_status or ""),
            }
            if nf is not None
            else None
        ),
        "gates": {
            "rows": _gate_rows(compare, esc),
            "counts": counts,
            "summary": esc(_gates_summary(counts, inconclusive_variants(compare), compare.unverified or [])),
        },
        "what_ran": what_ran_view(compare, esc),
        "numerics": esc(_numerics_line(compare)),
        "header": _run_header(compare, run, esc),
    }


def _numerics_line(compare: ComparisonDocument) -> str:
    """Which precision's floors the token gates used (the reference's; the same for every comparison)."""
    if not compare.comparisons:
        return ""
    n = compare.comparisons[0].numerics
    aa = {
        None: "no A/A run",
        True: "A/A bitwise identical at the teacher-forced positions",
        False: "A/A noisy at the teacher-forced positions",
    }[n.aa_identical]
    return (
        f"Numerics: reference in {n.dtype or 'unknown'} (from {n.source}), {n.precision} floors "
        f"(docs/numerics.md); {aa}."
    )
