"""The report's content as plain data, built from compare.json and run.json dicts.

report.md and report.html show the same content in the same order, so both render
one view. The view holds no markup: structure (top-k items, which one to mark, gate
status) stays data for the templates. The renderers differ only in how untrusted
text is made safe, so the builder takes ``esc``: every piece of model or dataset
text, and every label that could clash with the output syntax, passes through it.

Only ``dict.get`` with defaults reads the compare dict, so older compare.json files
(no gates, no teacher-forced or A/A comparison, fewer token fields) still render.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from evalpipe.artifacts import variant_names_from_info
from evalpipe.compare.code_paths import FAILED, NOT_RECORDED, SAME_CODE, VERIFIED, short
from evalpipe.compare.verdict import Status, fmt_delta, fmt_score, fmt_small
from evalpipe.documents.comparison import ComparisonDocument
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


def as_dict(compare: Any) -> dict[str, Any]:
    """The compare.json dict of a ComparisonDocument; also accepts the dict itself or an
    object with ``to_dict()``."""
    if isinstance(compare, ComparisonDocument):
        return compare.model_dump(mode="json")
    if isinstance(compare, Mapping):
        return dict(compare)
    to_dict = getattr(compare, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"expected the compare.json dict, got {type(compare).__name__}")


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


def _token(w: Mapping[str, Any], side: str, esc: Esc) -> dict[str, Any]:
    tok = w.get(f"token_{side}")
    if tok is None:
        return {"ended": f"ended after {w.get(f'len_{side}', '?')} tokens"}
    text = w.get(f"token_text_{side}")
    return {
        "ended": None,
        "id": esc(str(tok)),
        "text": esc(_quoted(text)) if text is not None else None,
        "lp": fmt_lp(w.get(f"logprob_{side}")),
    }


def _topk(w: Mapping[str, Any], side: str, other: str, esc: Esc) -> dict[str, Any]:
    ids = list(w.get(f"topk_ids_{side}") or [])
    lps = list(w.get(f"topk_logprobs_{side}") or [])
    texts = list(w.get(f"topk_texts_{side}") or [])
    mark = w.get(f"token_{other}")
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


def _example_view(w: Mapping[str, Any], esc: Esc) -> dict[str, Any]:
    ex_a, ex_b = excerpts(w.get("response_a"), w.get("response_b"))
    measures = []
    if w.get("kl") is not None:
        measures.append(f"KL {fmt_small(w['kl'])}")
    # at a divergence the two tokens differ, so their logprob difference means nothing
    if w.get("abs_dlogprob") is not None and w.get("kind") != "earliest_divergence":
        measures.append(f"|Δlogprob| {fmt_small(w['abs_dlogprob'])}")
    context = w.get("context")
    if context and len(context) > CONTEXT_CHARS:
        context = ELLIPSIS + context[-CONTEXT_CHARS:]
    pos = w.get("pos")
    return {
        "where": esc(fmt_where(w.get("doc_id"), w.get("repeat"), None) + f", position {pos}"),
        "measures": esc(", ".join(measures)),
        "token_a": _token(w, "a", esc),
        "token_b": _token(w, "b", esc),
        "topk_a": _topk(w, "a", "b", esc),
        "topk_b": _topk(w, "b", "a", esc),
        "context": esc(context) if context else "",
        "response_a": esc(ex_a),
        "response_b": esc(ex_b),
        "target": esc(w.get("target"), EXCERPT_CHARS) if w.get("target") else "",
    }


def _flipped_view(f: Mapping[str, Any], esc: Esc) -> dict[str, Any]:
    ex_a, ex_b = excerpts(f.get("response_a"), f.get("response_b"))
    score_a, score_b = f.get("score_a"), f.get("score_b")
    return {
        "where": esc(f"{f.get('doc_id')}" + (f" repeat {f['repeat']}" if f.get("repeat") else "")),
        "scores": esc(f"{fmt_num(score_a)} \u2192 {fmt_num(score_b)}"),
        "question": esc(f.get("question"), EXCERPT_CHARS),
        "target": esc(f.get("target"), EXCERPT_CHARS),
        "answer_a": esc(f.get("answer_a"), EXCERPT_CHARS),
        "answer_b": esc(f.get("answer_b"), EXCERPT_CHARS),
        "response_a": esc(ex_a),
        "response_b": esc(ex_b),
    }


# ---------------------------------------------------------------------------
# per task
# ---------------------------------------------------------------------------


def _changed(r: Mapping[str, Any]) -> str:
    s = f"{r.get('n_changed', 0)}/{r.get('n_paired', 0)}"
    if r.get("binary") and r.get("n_changed"):
        s += f" ({r.get('a_right_b_wrong')} right\u2192wrong, {r.get('a_wrong_b_right')} wrong\u2192right)"
    if r.get("n_missing"):
        s += f", {r['n_missing']} scored on one side only"
    return s


def _stats_view(r: Mapping[str, Any], esc: Esc) -> dict[str, Any]:
    """Means ± SE, Δ with its CI, McNemar, TOST, detectable Δ."""
    n = r.get("n_paired") or 0
    if n == 0:
        tost = "n/a"
    else:
        tost = ("yes " if r.get("equivalent") else "no ") + fmt_ci(r.get("tost_ci_low"), r.get("tost_ci_high"))
    n_clusters = r.get("n_clusters", n)
    clusters = f" in {n_clusters} clusters" if n_clusters != n else ""
    return {
        "metric": esc(r.get("metric")),
        "a": _fmt_mean_se(r.get("mean_a"), r.get("se_a")),
        "b": _fmt_mean_se(r.get("mean_b"), r.get("se_b")),
        "delta": f"{fmt_delta(r.get('delta'))} {fmt_ci(r.get('ci_low'), r.get('ci_high'))}" if n else "n/a",
        "mcnemar": fmt_p(r.get("mcnemar_p")),
        "tost": tost,
        "mdd": fmt_score(r.get("mdd")),
        "n": f"{n}{clusters}",
    }


def _flipped_section(r: Mapping[str, Any], esc: Esc) -> dict[str, Any] | None:
    flipped = list(r.get("flipped") or [])
    if not flipped:
        return None
    total = r.get("n_flipped") or len(flipped)
    shown = min(FLIPPED_SHOWN, len(flipped))
    return {
        "metric": esc(r.get("metric")),
        "count": f"{total}" if total <= shown else f"first {shown} of {total}",
        "rows": [_flipped_view(f, esc) for f in flipped[:FLIPPED_SHOWN]],
    }


def _top1_agree(t: Mapping[str, Any]) -> str:
    n_pos = t.get("n_positions_compared")
    n_dis = t.get("n_top1_disagree")
    if n_dis is not None and n_pos is not None:
        return fmt_pct(n_pos - n_dis, n_pos)
    share = t.get("share_top1_agree")
    return DASH if share is None else f"{100.0 * share:.1f}%"


def _triplet(t: Mapping[str, Any], *keys: str) -> str:
    return " / ".join(fmt_small(t.get(k)) for k in keys)


# (label, cell) of the token summary table; a cell is computed from one TaskTokenSummary dict.
TOKEN_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("samples compared", lambda t: f"{t.get('n_samples', 0)}"),
    ("only in reference / variant", lambda t: f"{t.get('only_a', 0)} / {t.get('only_b', 0)}"),
    ("ids identical", lambda t: fmt_pct(t.get("n_ids_identical"), t.get("n_samples"))),
    ("bitwise identical", lambda t: fmt_pct(t.get("n_identical"), t.get("n_samples"))),
    ("differ in length", lambda t: fmt_num(t.get("n_length_diff"))),
    ("median first divergence", lambda t: fmt_num(t.get("median_first_divergence"))),
    ("first divergences near-tie / hard", lambda t: f"{fmt_num(t.get('n_near_tie_divergences'))} / {fmt_num(t.get('n_hard_divergences'))}"),
    ("positions compared", lambda t: fmt_num(t.get("n_positions_compared"))),
    ("top-k sets equal", lambda t: fmt_pct(t.get("n_positions_topk_equal"), t.get("n_positions_compared"))),
    ("|Δlogprob| p50 / p99 / max", lambda t: _triplet(t, "abs_dlogprob_p50", "abs_dlogprob_p99", "max_abs_dlogprob")),
    ("mean |Δlogprob|", lambda t: fmt_small(t.get("mean_abs_dlogprob"))),
    ("KL p50 / p99 / max", lambda t: _triplet(t, "kl_p50", "kl_p99", "kl_max")),
    ("largest KL at", lambda t: _triple(t.get("kl_max_at"))),
    ("top-1 agreement", _top1_agree),
    ("hard top-1 flips", lambda t: fmt_num(t.get("n_top1_hard"))),
)


def _token_table(columns: list[tuple[str, Mapping[str, Any]]], esc: Esc) -> dict[str, Any] | None:
    if not columns:
        return None
    return {
        "columns": [esc(label) for label, _ in columns],
        "rows": [(esc(label), [esc(cell(t)) for _, t in columns]) for label, cell in TOKEN_ROWS],
    }


def _worst_sections(t: Mapping[str, Any] | None, teacher: bool, esc: Esc) -> list[dict[str, Any]]:
    out = []
    for key, free_title, teacher_title in WORST_LISTS:
        examples = list((t or {}).get(key) or [])
        if examples:
            title = f"{teacher_title} (teacher-forced)" if teacher else f"{free_title} (free-running)"
            out.append({"title": esc(title), "examples": [_example_view(w, esc) for w in examples]})
    return out


def _by_task(items: Iterable[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    return {str(t.get("task")): t for t in items or ()}


def _task_view(task: str, c: Mapping[str, Any], nf: Mapping[str, Any], esc: Esc) -> dict[str, Any]:
    rows = [r for r in c.get("scores") or () if r.get("task") == task]
    free = _by_task(c.get("tokens")).get(task)
    teacher = _by_task(c.get("teacher")).get(task)
    free_aa = _by_task(nf.get("tokens")).get(task)
    teacher_aa = _by_task(nf.get("teacher")).get(task)
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
    margins = sorted({r.get("margin") for r in rows if r.get("margin") is not None})
    notes = []
    if free and free.get("hard_divergences"):
        notes.append(("Hard free-running divergences", _positions(free["hard_divergences"], free.get("n_hard_divergences"))))
    if teacher and teacher.get("top1_hard_positions"):
        notes.append(("Hard teacher-forced top-1 flips", _positions(teacher["top1_hard_positions"], teacher.get("n_top1_hard"))))
    return {
        "name": esc(task),
        "scores": [
            {
                "metric": esc(r.get("metric")),
                "a": fmt_score(r.get("mean_a")),
                "b": fmt_score(r.get("mean_b")),
                "delta": fmt_delta(r.get("delta")),
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


def _primary_metric(entry: Mapping[str, Any]) -> str | None:
    """The metric the table shows: the first 0/1 metric of the task, else its first metric."""
    metrics = [str(m) for m in entry.get("metrics") or ()]
    binary = {
        str(s.get("metric"))
        for r in entry.get("lengths") or ()
        for s in r.get("scores") or ()
        if s.get("binary")
    }
    return next((m for m in metrics if m in binary), metrics[0] if metrics else None)


def _score_of(row: Mapping[str, Any], metric: str | None) -> Mapping[str, Any]:
    return next((s for s in row.get("scores") or () if str(s.get("metric")) == metric), {})


def _trace_source(entry: Mapping[str, Any]) -> str:
    """'teacher' when the rows carry teacher-forced figures, else 'free'."""
    rows = list(entry.get("lengths") or ()) + list(entry.get("depths") or ())
    return "teacher" if any(r.get("teacher") for r in rows) else "free"


def _split_cell(row: Mapping[str, Any] | None, key: str, fmt: Callable[[Any], str], split: bool, source: str) -> str:
    """One figure of a row: 'prompt / continuation' when split, else over all positions."""
    if not row:
        return DASH
    if source == "free":
        return fmt((row.get("free") or {}).get(key)) if row.get("free") else DASH
    if split:
        parts = [row.get("teacher_prompt"), row.get("teacher_continuation")]
        return " / ".join(fmt(p.get(key)) if p else DASH for p in parts)
    return fmt((row.get("teacher") or {}).get(key)) if row.get("teacher") else DASH


def _n_items(row: Mapping[str, Any]) -> str:
    n, g = row.get("n_items", 0), row.get("n_clusters", row.get("n_items", 0))
    return f"{n}" + (f" in {g} clusters" if g != n else "")


def _free_div(row: Mapping[str, Any]) -> str:
    f = row.get("free")
    if not f:
        return DASH
    return f"{f.get('n_divergent', 0)}/{f.get('n_samples', 0)} ({f.get('n_hard_divergences', 0)} hard)"


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


def _group_cells(
    row: Mapping[str, Any], aa_row: Mapping[str, Any] | None, metric: str | None, source: str, split: bool, with_aa: bool
) -> list[str]:
    s = _score_of(row, metric)
    n = s.get("n_paired") or 0
    cells = [
        fmt_score(s.get("mean_a")) if s else DASH,
        fmt_score(s.get("mean_b")) if s else DASH,
        f"{fmt_delta(s.get('delta'))} {fmt_ci(s.get('ci_low'), s.get('ci_high'))}" if n else "n/a",
        fmt_p(s.get("mcnemar_p")) if s else DASH,
        _free_div(row),
        _split_cell(row, "kl_max", fmt_small, split, source),
    ]
    if with_aa:
        cells.append(_split_cell(aa_row, "kl_max", fmt_small, split, source))
    cells.append(_split_cell(row, "max_abs_dlogprob", fmt_small, split, source))
    if source == "teacher":
        cells.append(_split_cell(row, "n_top1_hard", fmt_num, split, source))
    return cells


def _kind(row: Mapping[str, Any]) -> str:
    kind, tags = row.get("length_kind") or DASH, row.get("length_tags")
    return f"{kind} ({tags})" if tags else str(kind)


def _span(values: Sequence[Any]) -> str:
    vals = [int(v) for v in values or ()]
    if not vals:
        return DASH
    return str(vals[0]) if len(vals) == 1 else f"{min(vals)}\u2013{max(vals)} ({len(vals)})"


def _length_section(
    task: str, c: Mapping[str, Any], nf: Mapping[str, Any], esc: Esc
) -> dict[str, Any] | None:
    entry = _by_task(c.get("by_length")).get(task)
    if not entry:
        return None
    aa = _by_task(nf.get("by_length")).get(task) if nf else None
    metric = _primary_metric(entry)
    source = _trace_source(entry)
    split = bool(entry.get("has_prompt_positions")) and source == "teacher"
    with_aa = aa is not None
    ref, var = str(c.get("reference", c.get("a"))), str(c.get("variant", c.get("b")))
    aa_len = {r.get("target_length"): r for r in (aa or {}).get("lengths") or ()}
    aa_depth = {r.get("depth_bin"): r for r in (aa or {}).get("depths") or ()}
    lengths = [
        {
            "edge": r.get("length_kind") == "edge",
            "cells": [esc(x) for x in [fmt_num(r.get("target_length")), _kind(r), _n_items(r)]
                      + _group_cells(r, aa_len.get(r.get("target_length")), metric, source, split, with_aa)],
        }
        for r in entry.get("lengths") or ()
    ]
    depths = [
        {
            "edge": False,
            "cells": [
                esc(x)
                for x in [
                    f"{r.get('depth_bin', 0):.1f} ({r.get('depth_min', 0):.2f}\u2013{r.get('depth_max', 0):.2f})",
                    _span(r.get("lengths")),
                    _n_items(r),
                ]
                + _group_cells(r, aa_depth.get(r.get("depth_bin")), metric, source, split, with_aa)
            ],
        }
        for r in entry.get("depths") or ()
    ]
    others = [m for m in entry.get("metrics") or () if m != metric]
    return {
        "metric": esc(metric or DASH),
        "other_metrics": esc(", ".join(map(str, others))) if others else "",
        "note": esc(LENGTH_NOTE),
        "length_columns": [esc(x) for x in _group_columns(["length", "kind (tags)", "items"], ref, var, metric, source, split, with_aa)],
        "lengths": lengths,
        "depth_columns": [esc(x) for x in _group_columns(["depth", "lengths", "items"], ref, var, metric, source, split, with_aa)],
        "depths": depths,
        # unescaped sources, for the plots
        "data": {"ab": entry, "aa": aa, "source": source, "split": split},
    }


def _comparison_view(c: Mapping[str, Any], nf: Mapping[str, Any], esc: Esc) -> dict[str, Any]:
    tasks = sorted(
        {str(r.get("task")) for r in c.get("scores") or ()}
        | set(_by_task(c.get("tokens")))
        | set(_by_task(c.get("teacher")))
    )
    only = [
        esc(f"metrics reported only by {who}: {', '.join(map(str, ms))}")
        for who, ms in ((c.get("reference"), c.get("metrics_only_a")), (c.get("variant"), c.get("metrics_only_b")))
        if ms
    ]
    return {
        "reference": esc(c.get("reference", c.get("a"))),
        "variant": esc(c.get("variant", c.get("b"))),
        "status": esc(c.get("status", "")),
        "outputs_status": esc(c.get("outputs_status") or ""),
        "reasons": [esc(r) for r in c.get("reasons") or ()],
        "only": only,
        "tasks": [_task_view(task, c, nf, esc) for task in tasks],
    }


# ---------------------------------------------------------------------------
# gates
# ---------------------------------------------------------------------------


def _gate_rows(compare: Mapping[str, Any], esc: Esc) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in compare.get("comparisons") or ():
        for g in c.get("gates") or ():
            status = str(g.get("status", "skip"))
            evidence = [str(e) for e in g.get("evidence") or ()]
            more = len(evidence) - EVIDENCE_SHOWN
            rows.append(
                {
                    "variant": esc(c.get("variant", c.get("b"))),
                    "gate": esc(g.get("gate")),
                    "task": esc(g.get("task")),
                    "metric": esc(g.get("metric")) if g.get("metric") else "",
                    # fmt_num passes a non-number through as text
                    "measured": esc(fmt_num(g.get("measured"))),
                    "threshold": esc(fmt_num(g.get("threshold"))),
                    "aa": esc(fmt_num(g.get("aa_value"))),
                    # the templates test it; any other value is shown as text
                    "status": status if status in GATE_ORDER else esc(status),
                    "detail": esc(g.get("detail")),
                    "evidence": [esc(e) for e in evidence[:EVIDENCE_SHOWN]]
                    + ([esc(f"… {more} more in compare.json")] if more > 0 else []),
                }
            )
    rows.sort(key=lambda r: GATE_ORDER.get(r["status"], 1))
    return rows


def gate_counts(compare: Mapping[str, Any]) -> dict[str, int]:
    counts = {"total": 0, "fail": 0, "skip": 0, "pass": 0}
    for c in compare.get("comparisons") or ():
        for g in c.get("gates") or ():
            counts["total"] += 1
            status = g.get("status")
            if status in counts:
                counts[status] += 1
    return counts


def _gates_summary(counts: Mapping[str, int], inconclusive: Sequence[str]) -> str:
    if not counts["total"]:
        return "No gate was evaluated."
    skipped = f", {counts['skip']} skipped" if counts["skip"] else ""
    if counts["fail"]:
        return f"{counts['fail']} of {counts['total']} gates failed{skipped}."
    if inconclusive:
        # the gates judge outputs only: passing them is no pass when the paths prove nothing
        return (f"All {counts['total'] - counts['skip']} evaluated output gates passed{skipped}, but the paths of "
                f"{', '.join(inconclusive)} prove nothing: {Status.INCONCLUSIVE.value} (see What ran).")
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


def _variant_settings(run_info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> settings dict from run.json "variants" (list of objects or mapping) or "variant_settings"."""
    out: dict[str, dict[str, Any]] = {}
    v = run_info.get("variants")
    if isinstance(v, dict):
        out.update({str(k): s for k, s in v.items() if isinstance(s, dict)})
    elif isinstance(v, list):
        for item in v:
            if isinstance(item, dict) and item.get("name"):
                out[str(item["name"])] = {k: s for k, s in item.items() if k != "name"}
    extra = run_info.get("variant_settings")
    if isinstance(extra, dict):
        for k, s in extra.items():
            if isinstance(s, dict):
                out.setdefault(str(k), {}).update(s)
    return out


def _distinguishing(settings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Per variant, the flattened settings whose values differ between variants (all if only one)."""
    flat = {n: flatten(s) for n, s in settings.items()}
    keys = sorted({k for f in flat.values() for k in f})
    if len(flat) > 1:
        keys = [k for k in keys if len({_scalar(f.get(k)) for f in flat.values()}) > 1]
    return {n: "; ".join(f"{k}={_scalar(f[k])}" for k in keys if k in f) for n, f in flat.items()}


def _run_header(compare: Mapping[str, Any], run_info: dict[str, Any], esc: Esc) -> dict[str, Any]:
    reference = str(compare.get("reference", ""))
    compared = [str(v) for v in compare.get("variants") or ()]
    nf = compare.get("noise_floor") or {}
    aa = str(nf.get("variant", nf.get("b", ""))) if nf else ""

    rows: list[tuple[str, str]] = [("run id", str(compare.get("run_id", "")))]
    model = _model_text(run_info.get("model"))
    if model:
        rows.append(("model", model))
    fp = run_info.get("fingerprints", run_info.get("fingerprint"))
    if isinstance(fp, dict):
        rows.extend((f"fingerprint {k}", _scalar(v)) for k, v in sorted(flatten(fp).items()))
    elif fp:
        rows.append(("fingerprint", _scalar(fp)))
    for key in ("status", "hardware"):
        if run_info.get(key) is not None:
            rows.append((key, _scalar(run_info[key])))
    versions = run_info.get("versions")
    if isinstance(versions, dict) and versions:
        rows.append(("versions", ", ".join(f"{k} {_scalar(v)}" for k, v in sorted(versions.items()) if v is not None)))
    gates = compare.get("gates")
    if isinstance(gates, dict):
        for group in sorted(gates):
            if isinstance(gates[group], dict):
                flat = flatten(gates[group])
                rows.append((f"{group} gates", ", ".join(f"{k}={_scalar(v)}" for k, v in sorted(flat.items()))))
    rows.append(("A/A noise floor", f"{aa} vs {reference}: {nf.get('status', '?')}" if nf else "not run"))

    names = variant_names_from_info(run_info) or []
    for n in [reference, *compared, aa]:
        if n and n not in names:
            names.append(n)
    dist = _distinguishing(_variant_settings(run_info))

    def role(n: str) -> str:
        if n == reference:
            return "reference"
        if n == aa:
            return "A/A noise floor"
        return "compared" if n in compared else "not compared"

    timings = run_info.get("timings")
    timing_rows = []
    if isinstance(timings, dict):
        timing_rows = [(esc(k), esc(_scalar(v))) for k, v in sorted(flatten(timings).items())]
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


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (an old or hand-edited compare.json)."""
    return value if isinstance(value, Mapping) else {}


def path_judgement(c: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A comparison's "paths" entry; None for compare.json from before the path probes."""
    paths = c.get("paths")
    return paths if isinstance(paths, Mapping) else None


def path_reasons(c: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in _mapping(path_judgement(c)).get("reasons") or ()]


def paths_inconclusive(c: Mapping[str, Any]) -> bool:
    """The paths prove nothing: an expectation failed, a side is unverifiable, or both ran the same code."""
    paths = path_judgement(c)
    return paths is not None and paths.get("status") in (FAILED, SAME_CODE)


def variant_of(c: Mapping[str, Any]) -> str:
    return str(c.get("variant", c.get("b", "")))


def reference_of(c: Mapping[str, Any]) -> str:
    return str(c.get("reference", c.get("a", "")))


def judged_entries(compare: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    """(comparison, is the A/A one): the comparisons, then the noise floor."""
    nf = compare.get("noise_floor")
    return [(c, False) for c in compare.get("comparisons") or ()] + ([(nf, True)] if nf else [])


def inconclusive_variants(compare: Mapping[str, Any]) -> list[str]:
    return [variant_of(c) for c in compare.get("comparisons") or () if c.get("status") == Status.INCONCLUSIVE.value]


def _side_summary(c: Mapping[str, Any], side: str) -> Mapping[str, Any] | None:
    """what_ran.a (the reference) or what_ran.b (the variant) of a comparison."""
    summary = _mapping(_mapping(path_judgement(c)).get("what_ran")).get(side)
    return summary if isinstance(summary, Mapping) else None


def _side_check(c: Mapping[str, Any], variant: str) -> Mapping[str, Any] | None:
    checks = _mapping(path_judgement(c)).get("checks") or ()
    return next((ch for ch in checks if isinstance(ch, Mapping) and str(ch.get("variant")) == variant), None)


@dataclass(frozen=True)
class _Column:
    """One side in the what-ran table: its summary (None: not recorded) and its expectations' check."""

    name: str
    role: str  # "reference", "A/A", or "" for a compared variant
    summary: Mapping[str, Any] | None
    check: Mapping[str, Any] | None

    @property
    def recorded(self) -> bool:
        return self.summary is not None and self.summary.get("verifiable") is not False

    @property
    def values(self) -> Mapping[str, Any]:
        return self.summary or {}

    @property
    def missing(self) -> str:
        """What the column says instead of values when it has none."""
        return NOT_RECORDED_CELL if self.summary is None else ENDPOINT_CELL


def _columns(compare: Mapping[str, Any]) -> list[_Column]:
    """The reference, every compared variant, then the A/A run."""
    entries = [c for c, _ in judged_entries(compare)]
    reference = str(compare.get("reference") or (reference_of(entries[0]) if entries else ""))
    # every comparison shares the reference: the first one that recorded it speaks for all
    ref_summary = next((s for c in entries if (s := _side_summary(c, "a")) is not None), None)
    ref_check = next((ch for c in entries if (ch := _side_check(c, reference)) is not None), None)
    columns = [_Column(reference, "reference", ref_summary, ref_check)]
    for c, aa in judged_entries(compare):
        name = variant_of(c)
        columns.append(_Column(name, "A/A" if aa else "", _side_summary(c, "b"), _side_check(c, name)))
    return columns


def _value_text(value: Any) -> str:
    """A switch value as a reader writes it: strings bare, lists comma-joined, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) if value else "[]"
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _switch_cell(name: str, summary: Mapping[str, Any]) -> str:
    switches = _mapping(summary.get("switches"))
    if name not in switches:
        return DASH
    value = switches[name]
    per_process = _mapping(value).get("per_process")
    if isinstance(per_process, list):
        return " | ".join(_value_text(v) for v in per_process)
    return _value_text(value)


def _processes_cell(summary: Mapping[str, Any]) -> str:
    roles = _mapping(summary.get("processes"))
    listed = ", ".join(f"{n} {role}" for role, n in roles.items()) or "no process recorded"
    reused = f" (reused {summary['server_of']}'s server)" if summary.get("server_of") else ""
    return f"{summary.get('mode', '?')}: {listed}{reused}"


def _models_cell(summary: Mapping[str, Any]) -> str:
    return ", ".join(short(str(m)) for m in summary.get("models") or ()) or "none"


def _layers_cell(summary: Mapping[str, Any]) -> str:
    layers = _mapping(summary.get("layers"))
    return ", ".join(f"{n} \u00d7 {short(str(cls))}" for cls, n in sorted(layers.items())) or "none"


def _calls_cell(name: str, summary: Mapping[str, Any]) -> str:
    if name in (summary.get("absent") or ()):
        return "absent"
    return fmt_num(_mapping(summary.get("calls")).get(name))


def _forwards(summary: Mapping[str, Any]) -> int:
    forwards = summary.get("forwards")
    return forwards if isinstance(forwards, int) else 0


def _collective_cell(kind: str, summary: Mapping[str, Any]) -> str:
    """"3 in 40/48, 0 in 8/48": each count of calls in one forward pass, most frequent first."""
    entry = _mapping(_mapping(summary.get("collectives_per_forward")).get(kind))
    forwards = entry.get("forwards", _forwards(summary))
    if not forwards:
        return "no forward pass"
    # a kind this side never called is 0 in every forward pass
    counts = _mapping(entry.get("counts")) or {"0": forwards}
    ordered = sorted(counts.items(), key=lambda kv: (-_count(kv[1]), str(kv[0])))
    return ", ".join(f"{value} in {n}/{forwards}" for value, n in ordered)


def _count(n: Any) -> int:
    return n if isinstance(n, int) else 0


def _no_collectives_cell(summary: Mapping[str, Any]) -> str:
    forwards = _forwards(summary)
    return f"none in {forwards}/{forwards}" if forwards else "no forward pass"


def _expectations_cell(check: Mapping[str, Any] | None) -> str:
    if check is None:
        return DASH
    if check.get("ok"):
        return "\u2713"
    failures = len(check.get("failures") or ())
    return f"{failures} failed" if failures else "not verified"


def _names_in(columns: Sequence[_Column], key: str) -> list[str]:
    """The keys of each column's ``key`` mapping, in the order the columns first name them."""
    names: dict[str, None] = {}
    for col in columns:
        names.update(dict.fromkeys(str(k) for k in _mapping(col.values.get(key))))
    return list(names)


Cell = Callable[[Mapping[str, Any]], str]


def _row_makers(recorded: Sequence[_Column]) -> list[tuple[str, Cell]]:
    """(label, cell of one summary) per row, the rows that depend on what was recorded included."""
    rows: list[tuple[str, Cell]] = [("processes", _processes_cell), ("model", _models_cell),
                                    ("decoder layers", _layers_cell)]
    kinds = _names_in(recorded, "collectives_per_forward")
    if kinds:
        rows += [(f"{kind} per forward pass", partial(_collective_cell, kind)) for kind in sorted(kinds)]
    else:
        rows.append(("collectives per forward pass", _no_collectives_cell))
    rows += [(f"calls of {short(name)}", partial(_calls_cell, name)) for name in _names_in(recorded, "calls")]
    rows += [(name, partial(_switch_cell, name)) for name in LAYOUT_SWITCHES]
    # any other switch only where the sides disagree: the table shows what sets them apart
    for name in sorted(set(_names_in(recorded, "switches")) - set(LAYOUT_SWITCHES)):
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


def _path_block(c: Mapping[str, Any], aa: bool, esc: Esc) -> dict[str, Any]:
    """A comparison's path judgement: one sentence, then its reasons (failures, evidence or a note)."""
    paths = _mapping(path_judgement(c))
    status = str(paths.get("status"))
    sentence = PATH_SENTENCES.get(status, f"the path judgement is {status}")
    if c.get("status") == Status.INCONCLUSIVE.value:
        sentence += f", so the comparison is {Status.INCONCLUSIVE.value}"
    if c.get("outputs_status"):
        sentence += f"; the outputs alone would be {c['outputs_status']}"
    kind = {VERIFIED: "evidence", NOT_RECORDED: "note"}.get(status, "failure")
    return {
        "variant": esc(variant_of(c)),
        "reference": esc(reference_of(c)),
        "aa": aa,
        "sentence": esc(sentence),
        "kind": kind,
        "lines": [esc(r) for r in path_reasons(c)],
    }


def what_ran_view(compare: Mapping[str, Any], esc: Esc) -> dict[str, Any] | None:
    """Each comparison's path judgement and the sides side by side; None when no comparison
    carries "paths" (compare.json from before the path probes, or a bare table comparison)."""
    judged = [(c, aa) for c, aa in judged_entries(compare) if path_judgement(c) is not None]
    if not judged:
        return None
    columns = _columns(compare)
    return {
        "paths": [_path_block(c, aa, esc) for c, aa in judged],
        # a table of columns that all say "not recorded" shows nothing
        "table": _what_ran_table(columns, esc) if any(col.summary is not None for col in columns) else None,
    }


# ---------------------------------------------------------------------------
# the whole report
# ---------------------------------------------------------------------------


def build_view(compare: Any, run_info: dict[str, Any] | None, esc: Esc) -> dict[str, Any]:
    """Everything a report shows, in the order it shows it."""
    compare = as_dict(compare)
    # run.json is redacted when written; one from before that (or handed in) is redacted here
    run_info = redact(run_info or {})
    nf = compare.get("noise_floor") or {}
    counts = gate_counts(compare)
    status = str(compare.get("status", ""))
    return {
        "run_id": esc(compare.get("run_id", "")),
        "status": esc(status),
        "verdict_note": esc(INCONCLUSIVE_NOTE) if status == Status.INCONCLUSIVE.value else "",
        "comparisons": [_comparison_view(c, nf, esc) for c in compare.get("comparisons") or ()],
        "noise_floor": (
            {
                "reference": esc(nf.get("reference", nf.get("a"))),
                "variant": esc(nf.get("variant", nf.get("b"))),
                "status": esc(nf.get("status", "")),
                "outputs_status": esc(nf.get("outputs_status") or ""),
            }
            if nf
            else None
        ),
        "gates": {
            "rows": _gate_rows(compare, esc),
            "counts": counts,
            "summary": esc(_gates_summary(counts, inconclusive_variants(compare))),
        },
        "what_ran": what_ran_view(compare, esc),
        "numerics": esc(_numerics_line(compare)),
        "header": _run_header(compare, run_info, esc),
    }


def _numerics_line(compare: Mapping[str, Any]) -> str:
    """Which precision's floors the token gates used (the reference's; the same for every comparison)."""
    n = next((c.get("numerics") for c in compare.get("comparisons") or () if isinstance(c.get("numerics"), Mapping)), None)
    if not n:
        return ""
    dtype = n.get("dtype") or "unknown"
    aa = {
        None: "no A/A run",
        True: "A/A bitwise identical at the teacher-forced positions",
        False: "A/A noisy at the teacher-forced positions",
    }.get(n.get("aa_identical"), "")
    return (
        f"Numerics: reference in {dtype} (from {n.get('source', 'unknown')}), {n.get('precision')} floors "
        f"(docs/numerics.md); {aa}."
    )
