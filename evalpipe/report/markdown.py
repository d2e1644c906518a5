"""report.md: verdict first, then the run header, then per comparison and task the evidence.

Model and dataset text is untrusted: every piece of it goes through :func:`md_escape`
and lands inside a table cell, so it can neither break the layout (pipes, newlines,
backticks) nor inject HTML (``<``/``>``) into a rendered page.
"""

from __future__ import annotations

import unicodedata

import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import jinja2

from evalpipe.compare.run import RunComparison, VariantComparison, variant_names_from_info
from evalpipe.compare.scores import FlippedItem, ScoreRow
from evalpipe.compare.tokens import TaskTokenSummary, WorstExample
from evalpipe.compare.verdict import fmt_delta, fmt_score, fmt_small

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE_NAME = "report.md.j2"
EXCERPT_CHARS = 160
EXCERPT_CONTEXT = 48
TOPK_SHOWN = 5
FLIPPED_SHOWN = 10  # per task x metric in the report; compare.json lists more

_MD_SPECIAL = "\\`*_[]|~"


def md_escape(text: Any, max_len: int | None = None) -> str:
    """Escape arbitrary text for a markdown table cell or inline position.

    Backslash-escapes markdown punctuation (including ``|`` and backticks), turns
    ``&``, ``<`` and ``>`` into entities and newlines into ``<br>``.
    """
    if text is None:
        return ""
    s = str(text)
    if max_len is not None and len(s) > max_len:
        s = s[:max_len] + "\u2026"
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in s)
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    s = s.replace("\n", "<br>")
    # Other control and line-separator characters (model output can hold any) would
    # break a table row in some renderers; show them as escapes instead.
    return "".join(
        f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in s
    )


def _excerpts(a: str | None, b: str | None) -> tuple[str, str]:
    """Windows of both responses around their first differing character."""
    a, b = a or "", b or ""
    k = 0
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            break
    else:
        k = min(len(a), len(b))
    start = max(0, k - EXCERPT_CONTEXT) if a != b else 0

    def cut(s: str) -> str:
        piece = s[start : start + EXCERPT_CHARS]
        return ("\u2026" if start > 0 else "") + piece + ("\u2026" if start + EXCERPT_CHARS < len(s) else "")

    return cut(a), cut(b)


def _fmt_lp(x: float | None) -> str:
    if x is None:
        return "n/a"
    s = f"{x:.4g}"
    return "\u2212" + s[1:] if s.startswith("-") else s


def _topk(ids: Sequence[int] | None, lps: Sequence[float] | None, highlight: Iterable[int | None]) -> str:
    if not ids:
        return "\u2014"
    marks = {h for h in highlight if h is not None}
    lps = list(lps or [])
    parts = []
    for i, tid in enumerate(ids[:TOPK_SHOWN]):
        lp = _fmt_lp(lps[i]) if i < len(lps) else "?"
        item = f"{tid} ({lp})"
        parts.append(f"**{item}**" if tid in marks else item)
    if len(ids) > TOPK_SHOWN:
        parts.append("\u2026")
    return ", ".join(parts)


def _token(tok: int | None, lp: float | None, length: int) -> str:
    if tok is None:
        return f"(ended after {length} tokens)"
    return f"`{tok}` ({_fmt_lp(lp)})"


def _example_view(w: WorstExample) -> dict[str, Any]:
    ex_a, ex_b = _excerpts(w.response_a, w.response_b)
    return {
        "where": f"doc {w.doc_id}" + (f", repeat {w.repeat}" if w.repeat else "") + f", position {w.pos}",
        "token_a": _token(w.token_a, w.logprob_a, w.len_a),
        "token_b": _token(w.token_b, w.logprob_b, w.len_b),
        "dlogprob": fmt_small(w.abs_dlogprob),
        "topk_a": _topk(w.topk_ids_a, w.topk_logprobs_a, [w.token_b]),
        "topk_b": _topk(w.topk_ids_b, w.topk_logprobs_b, [w.token_a]),
        "len_a": w.len_a,
        "len_b": w.len_b,
        "response_a": md_escape(ex_a),
        "response_b": md_escape(ex_b),
        "target": md_escape(w.target, max_len=EXCERPT_CHARS) if w.target else "",
    }


def _pct(n: int, total: int) -> str:
    return f"{n}/{total} ({100.0 * n / total:.1f}%)" if total else "0/0"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "\u2014"
    if p >= 1.0:
        return "1"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def _fmt_mean_se(mean: float | None, se: float | None) -> str:
    return fmt_score(mean) if se is None or mean is None else f"{fmt_score(mean)} \u00b1 {fmt_score(se)}"


def _stats_view(r: ScoreRow) -> dict[str, Any]:
    """Cells of the statistics table: means ± SE, Δ with its CI, McNemar, TOST, detectable Δ."""
    if r.n_paired == 0:
        tost = "n/a"
    else:
        tost = ("yes " if r.equivalent else "no ") + _fmt_ci(r.tost_ci_low, r.tost_ci_high)
    clusters = f" in {r.n_clusters} clusters" if r.n_clusters != r.n_paired else ""
    return {
        "metric": md_escape(r.metric),
        "a": _fmt_mean_se(r.mean_a, r.se_a),
        "b": _fmt_mean_se(r.mean_b, r.se_b),
        "delta": f"{fmt_delta(r.delta)} {_fmt_ci(r.ci_low, r.ci_high)}" if r.n_paired else "n/a",
        "mcnemar": _fmt_p(r.mcnemar_p),
        "tost": tost,
        "mdd": fmt_score(r.mdd),
        "n": f"{r.n_paired}{clusters}",
    }


def _flipped_view(f: FlippedItem) -> dict[str, Any]:
    ex_a, ex_b = _excerpts(f.response_a, f.response_b)
    return {
        "where": f"{f.doc_id}" + (f" repeat {f.repeat}" if f.repeat else ""),
        "scores": f"{f.score_a:g} \u2192 {f.score_b:g}",
        "question": md_escape(f.question, max_len=EXCERPT_CHARS),
        "target": md_escape(f.target, max_len=EXCERPT_CHARS),
        "answer_a": md_escape(f.answer_a, max_len=EXCERPT_CHARS),
        "answer_b": md_escape(f.answer_b, max_len=EXCERPT_CHARS),
        "response_a": md_escape(ex_a),
        "response_b": md_escape(ex_b),
    }


def _hard_list(t: TaskTokenSummary) -> str:
    """'doc 3 pos 5, doc 7 repeat 1 pos 0, ... (first 20 of 31)' or '' when there is none."""
    items = [f"doc {d}" + (f" repeat {r}" if r else "") + f" pos {p}" for d, r, p in t.hard_divergences]
    if not items:
        return ""
    more = f" (first {len(items)} of {t.n_hard_divergences})" if t.n_hard_divergences > len(items) else ""
    return ", ".join(items) + more


def _task_view(c: VariantComparison, t: TaskTokenSummary | None, task: str) -> dict[str, Any]:
    scores = [
        {
            "metric": md_escape(r.metric),
            "a": fmt_score(r.mean_a),
            "b": fmt_score(r.mean_b),
            "delta": fmt_delta(r.delta),
            "changed": (
                f"{r.n_changed}/{r.n_paired}"
                + (f" ({r.a_right_b_wrong} right\u2192wrong, {r.a_wrong_b_right} wrong\u2192right)" if r.binary and r.n_changed else "")
                + (f", {r.n_missing} scored on one side only" if r.n_missing else "")
            ),
        }
        for r in c.scores.rows
        if r.task == task
    ]
    rows = [r for r in c.scores.rows if r.task == task]
    margins = sorted({r.margin for r in rows})
    flipped = [
        {
            "metric": md_escape(r.metric),
            "count": (
                f"{r.n_flipped}" if r.n_flipped <= min(FLIPPED_SHOWN, len(r.flipped))
                else f"first {min(FLIPPED_SHOWN, len(r.flipped))} of {r.n_flipped}"
            ),
            "rows": [_flipped_view(f) for f in r.flipped[:FLIPPED_SHOWN]],
        }
        for r in rows
        if r.flipped
    ]
    view: dict[str, Any] = {
        "name": md_escape(task),
        "scores": scores,
        "stats": [_stats_view(r) for r in rows],
        "margin": ", ".join(f"{m:g}" for m in margins),
        "flipped": flipped,
        "tokens": None,
    }
    if t is not None:
        view["tokens"] = {
            "samples": t.n_samples,
            "only": f"{t.only_a} / {t.only_b}",
            "ids_identical": _pct(t.n_ids_identical, t.n_samples),
            "identical": _pct(t.n_identical, t.n_samples),
            "median_div": "\u2014" if t.median_first_divergence is None else f"{t.median_first_divergence:g}",
            "max_dlp": fmt_small(t.max_abs_dlogprob),
            "mean_dlp": fmt_small(t.mean_abs_dlogprob),
            "positions": t.n_positions_compared,
            "length_diff": t.n_length_diff,
            "near_tie": f"{t.n_near_tie_divergences} / {t.n_hard_divergences}",
            "gap": f"{t.near_tie_gap:g}",
            "topk_equal": _pct(t.n_positions_topk_equal, t.n_positions_compared),
            "kl": " / ".join(fmt_small(x) for x in (t.kl_p50, t.kl_p99, t.kl_max)),
            "dlp_pct": " / ".join(fmt_small(x) for x in (t.abs_dlogprob_p50, t.abs_dlogprob_p99, t.max_abs_dlogprob)),
            "hard": _hard_list(t),
        }
        view["worst_divergence"] = [_example_view(w) for w in t.worst_divergence]
        view["worst_logprob"] = [_example_view(w) for w in t.worst_logprob]
    return view


def _comparison_view(c: VariantComparison) -> dict[str, Any]:
    tok = {t.task: t for t in c.tokens.summaries}
    tasks = sorted(set(tok) | {r.task for r in c.scores.rows})
    return {
        "reference": md_escape(c.reference),
        "variant": md_escape(c.variant),
        "status": c.status.value,
        "reasons": [md_escape(r) for r in c.verdict.reasons],
        "tasks": [_task_view(c, tok.get(task), task) for task in tasks],
    }


# ---------------------------------------------------------------------------
# run header from run.json (tolerant: any key may be missing or shaped differently)
# ---------------------------------------------------------------------------


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else "n/a"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    return str(v)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
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
    flat = {n: _flatten(s) for n, s in settings.items()}
    keys = sorted({k for f in flat.values() for k in f})
    if len(flat) > 1:
        keys = [k for k in keys if len({_scalar(f.get(k)) for f in flat.values()}) > 1]
    return {n: "; ".join(f"{k}={_scalar(f[k])}" for k in keys if k in f) for n, f in flat.items()}


def _run_header(rc: RunComparison, run_info: dict[str, Any]) -> dict[str, Any]:
    rows: list[tuple[str, str]] = [("run id", rc.run_id)]
    model = _model_text(run_info.get("model"))
    if model:
        rows.append(("model", model))
    fp = run_info.get("fingerprints", run_info.get("fingerprint"))
    if isinstance(fp, dict):
        rows.extend((f"fingerprint {k}", _scalar(v)) for k, v in sorted(_flatten(fp).items()))
    elif fp:
        rows.append(("fingerprint", _scalar(fp)))
    for key in ("status", "hardware"):
        if run_info.get(key) is not None:
            rows.append((key, _scalar(run_info[key])))
    versions = run_info.get("versions")
    if isinstance(versions, dict) and versions:
        rows.append(("versions", ", ".join(f"{k} {_scalar(v)}" for k, v in sorted(versions.items()) if v is not None)))

    names = variant_names_from_info(run_info) or [rc.reference] + rc.variants
    for n in [rc.reference] + rc.variants:
        if n not in names:
            names.append(n)
    dist = _distinguishing(_variant_settings(run_info))
    variants = [
        {
            "name": md_escape(n),
            "role": "reference" if n == rc.reference else ("compared" if n in rc.variants else "not compared"),
            "settings": md_escape(dist.get(n, "")),
        }
        for n in names
    ]
    timings = run_info.get("timings")
    timing_rows = []
    if isinstance(timings, dict):
        timing_rows = [(md_escape(k), md_escape(_scalar(v))) for k, v in sorted(_flatten(timings).items())]
    return {
        "rows": [(md_escape(k), md_escape(v)) for k, v in rows],
        "variants": variants,
        "timings": timing_rows,
    }


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=False,  # markdown, not HTML: text is escaped by md_escape before rendering
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_markdown(run_comparison: RunComparison, run_info: dict[str, Any] | None = None) -> str:
    """The report as markdown text; deterministic for the same inputs."""
    run_info = run_info or {}
    rc = run_comparison
    context = {
        "run_id": md_escape(rc.run_id),
        "status": rc.status.value,
        "comparisons": [_comparison_view(c) for c in rc.comparisons],
        "header": _run_header(rc, run_info),
    }
    text = _environment().get_template(TEMPLATE_NAME).render(**context)
    # collapse runs of blank lines left by template control blocks
    lines, blank = [], 0
    for line in text.splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"
