"""docs/calibration.md: the calibration table, with the command and the machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from evalpipe.compare.calibration import CalibrationRow, summarize
from evalpipe.compare.verdict import fmt_delta
from evalpipe.machine import one_line
from evalpipe.report.markdown import md_escape


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def _ci(lo: float | None, hi: float | None) -> str:
    return "—" if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def render_calibration(
    rows: Sequence[CalibrationRow],
    run_info: dict[str, Any],
    *,
    command: str,
    seconds: float,
    run_dir: Path,
) -> str:
    counts = summarize(rows)
    harmful = [r for r in rows if r.expected == "harmful"]
    benign = [r for r in rows if r.expected == "benign"]
    hw = run_info.get("hardware") or {}
    versions = run_info.get("versions") or {}
    metric = next((r.metric for r in rows if r.metric), "—")
    lines = [
        "# Calibration: what a PASS is worth",
        "",
        "Every entry of the reference layout model's fault zoo, run as a variant against the",
        "`legacy` layout on the same items, judged by evalpipe's default gates. Harmful entries",
        "must come out DIVERGENT, benign ones IDENTICAL or EQUIVALENT.",
        "",
        f"Regenerate: `{command}` ({seconds / 60:.0f} min on the machine below).",
        f"Machine: {one_line(hw)}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        f"Run: `{run_id(run_info, run_dir)}`; items per variant: {max((r.n_items for r in rows), default=0)}.",
        "",
        f"**Harmful caught: {counts['caught']}/{len(harmful)}. Benign kept clean: {counts['clean']}/{len(benign)}.**",
        "",
        f"Score columns are for `{md_escape(metric)}` (paired difference variant − legacy, 95% CI, McNemar exact p);",
        "detectors are the gate families that failed; detection cost is the smallest number of",
        "items, in doc order, after which the verdict on those items alone is already DIVERGENT",
        "(computed on this run's outputs: a smaller run batches its prompts differently, which",
        "matters for the faults tied to the batch layout).",
        "",
        "| variant | expected | verdict | outcome | Δ score [95% CI] | McNemar p | detectors (failed gates) | detection cost |",
        "|---|---|---|---|---:|---:|---|---:|",
    ]
    for r in rows:
        gates = ", ".join(r.failed_gates)
        detectors = ", ".join(r.detectors) + (f" ({gates})" if gates else "") if r.detectors else "—"
        lines.append(
            f"| {md_escape(r.variant)} | {r.expected} | {r.status} | {r.outcome} | "
            f"{fmt_delta(r.delta)} {_ci(r.ci_low, r.ci_high)} | {_p(r.mcnemar_p)} | {md_escape(detectors)} | "
            f"{'—' if r.detection_cost is None else r.detection_cost} |"
        )
    lines += ["", "## The entries", ""]
    for r in rows:
        lines.append(f"- **{md_escape(r.variant)}** ({r.expected}): {md_escape(r.doc)}")
    return "\n".join(lines) + "\n"


def run_id(run_info: dict[str, Any], run_dir: Path) -> str:
    return str(run_info.get("run_id") or Path(run_dir).name)
