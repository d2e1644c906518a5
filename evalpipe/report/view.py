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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from evalpipe.documents.comparison import (
    Comparison,
    ComparisonDocument,
    FlippedItem,
    FreeFigures,
    GateStatus,
    GroupFigures,
    GroupScore,
    LengthRow,
    ScoreRow,
    Status,
    TaskBreakdown,
    TeacherFigures,
    TokenSummary,
    WorstExample,
)
from evalpipe.documents.run_doc import RunDocument, RunModel
from evalpipe.gates import registry
from evalpipe.number_format import DASH, fmt_ci, fmt_delta, fmt_lp, fmt_mean_se, fmt_num, fmt_p, fmt_pct, fmt_score, fmt_small
from evalpipe.redact import redact
from evalpipe.report.formats import (
    CONTEXT_CHARS,
    ELLIPSIS,
    EXCERPT_CHARS,
    Esc,
    excerpts,
    fmt_positions,
    fmt_triple,
    fmt_where,
    quoted,
)
from evalpipe.report.sampled import sampling_section
from evalpipe.report.what_ran import INCONCLUSIVE_NOTE, unverified_note, what_ran_view

TOPK_SHOWN = 5
FLIPPED_SHOWN = 10  # per task x metric; compare.json lists more
EVIDENCE_SHOWN = 10  # per failing gate

# Failing gates first: they are why a run is DIVERGENT.
GATE_ORDER = {GateStatus.FAIL: 0, GateStatus.SKIP: 1, GateStatus.PASS: 2}

# Worst-example lists of a token summary, with their headings per comparison mode.
WORST_LISTS = (
    ("worst_divergence", "Earliest divergences", "Earliest top-1 differences"),
    ("worst_logprob", "Largest |Δlogprob| before any divergence", "Largest |Δlogprob|"),
    ("worst_kl", "Largest KL before any divergence", "Largest KL"),
)


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
        "text": esc(quoted(text)) if text is not None else None,
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
                "text": esc(quoted(texts[i])) if i < len(texts) and texts[i] is not None else None,
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
        "a": fmt_mean_se(r.mean_a, r.se_a),
        "b": fmt_mean_se(r.mean_b, r.se_b),
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
    ("largest KL at", lambda t: fmt_triple(t.kl_max_at)),
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
        notes.append(("Hard free-running divergences", fmt_positions(free.hard_divergences, free.n_hard_divergences)))
    if teacher and teacher.top1_hard_positions:
        notes.append(("Hard teacher-forced top-1 flips", fmt_positions(teacher.top1_hard_positions, teacher.n_top1_hard)))
    own = next((v for v in c.tasks or () if v.task == task), None)  # None: a file from before task verdicts
    return {
        "name": esc(task),
        "status": esc(own.status) if own is not None else "",
        # why a task is not a pass, when the comparison's reasons are about others too
        "why": esc(own.reasons[0]) if own is not None and not own.status.passed and own.reasons else "",
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
        "sampling": sampling_section(task, c, nf, esc),
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
                    "status": g.status.value,  # the templates test it
                    "detail": esc(g.finding),  # the gate, task and metric have columns of their own
                    "evidence": [esc(e) for e in g.evidence[:EVIDENCE_SHOWN]]
                    + ([esc(f"… {more} more in compare.json")] if more > 0 else []),
                }
            )
    rows.sort(key=lambda r: GATE_ORDER[GateStatus(r["status"])])
    return rows


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


def _model_text(model: RunModel) -> str:
    """The model as a reader reads it: its name (a built-in's) or its path, then what else the
    run recorded of it."""
    name = model.name or model.path
    fields = {"builtin": model.builtin, "fingerprint": model.fingerprint, "name": model.name, "path": model.path}
    extras = ", ".join(f"{k}={_scalar(v)}" for k, v in sorted(fields.items()) if v is not None and v != name)
    return f"{name} ({extras})" if name and extras else str(name or extras)


def _fields_text(d: dict[str, Any]) -> str:
    """A mapping as a reader reads it ("cpu AMD EPYC, cores 2, ..."), nested keys dotted, lists
    joined: never a serialised object."""
    def value(v: Any) -> str:
        return ", ".join(value(x) for x in v) if isinstance(v, list) else _scalar(v)

    return ", ".join(f"{k} {value(v)}" for k, v in sorted(flatten(d).items()) if v is not None)


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
    model = _model_text(RunModel.model_validate(redact(run.model.model_dump(mode="json", exclude_none=True))))
    if model:
        rows.append(("model", model))
    rows.extend((f"fingerprint {k}", _scalar(v)) for k, v in sorted(run.fingerprints.model_dump(exclude_none=True).items()))
    if run.status is not None:
        rows.append(("status", _scalar(run.status)))
    if run.hardware is not None:
        rows.append(("hardware", _fields_text(redact(run.hardware))))
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
# the whole report
# ---------------------------------------------------------------------------


def build_view(compare: ComparisonDocument, run: RunDocument | None, esc: Esc) -> dict[str, Any]:
    """Everything a report shows, in the order it shows it."""
    # run.json is redacted when written; one from before that (or handed in) is redacted here
    run = run if run is not None else RunDocument()
    nf = compare.noise_floor
    counts = compare.gate_counts()
    return {
        "run_id": esc(compare.run_id),
        "status": esc(compare.status),
        "unverified_note": esc(unverified_note(compare)),
        "verdict_note": esc(INCONCLUSIVE_NOTE) if compare.inconclusive_variants() and compare.status == Status.INCONCLUSIVE.value else "",
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
            "summary": esc(_gates_summary(counts, compare.inconclusive_variants(), compare.unverified or [])),
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
