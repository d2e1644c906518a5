"""docs/calibration.md: the calibration table, with the command and the machine."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

from evalpipe.compare.calibration import DETECTORS, smallest_caught, summarize, summarize_sampled
from evalpipe.compare.gates import DISTRIBUTION_GATES, FREE_GATES, GATE_ORDER, TEACHER_GATES
from evalpipe.compare.numerics import Numerics
from evalpipe.documents.calibration import CalibrationRow, SensitivityPoint
from evalpipe.documents.run_doc import RunDocument
from evalpipe.machine import one_line
from evalpipe.number_format import fmt_delta
from evalpipe.report.markdown import md_escape


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def _ci(lo: float | None, hi: float | None) -> str:
    return "—" if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def _detectors(families: Sequence[str], gates: Sequence[str]) -> str:
    joined = ", ".join(gates)
    return ", ".join(families) + (f" ({joined})" if joined else "") if families else "—"


def _sampled(rows: Sequence[CalibrationRow]) -> bool:
    return any(r.sampled is not None for r in rows)


def _sampled_header(rows: Sequence[CalibrationRow]) -> str:
    first = next(r.sampled for r in rows if r.sampled is not None)
    return f"sampled at temperature {first.temperature:g}, {first.samples}/item: verdict, outcome (detectors)"


def _sampled_cell(r: CalibrationRow) -> str:
    if r.sampled is None:
        return "—"
    return md_escape(f"{r.sampled.status}, {r.sampled.outcome} ({_detectors(r.sampled.detectors, r.sampled.failed_gates)})")


def _sampled_summary(rows: Sequence[CalibrationRow], harmful: Sequence[CalibrationRow], fallback: Sequence[CalibrationRow],
                     benign: Sequence[CalibrationRow]) -> list[str]:
    """The bold summary line of the sampled run (the last column), when the zoo ran sampled."""
    counts = summarize_sampled(rows)
    if counts is None:
        return []
    first = next(r.sampled for r in rows if r.sampled is not None)

    def caught(group: Sequence[CalibrationRow]) -> int:
        return sum(r.sampled is not None and r.sampled.outcome == "caught" for r in group)

    return [
        f"**Sampled at temperature {first.temperature:g} ({first.samples} per item, common random numbers, "
        f"docs/sampling.md): harmful caught: {caught(harmful)}/{len(harmful)}. "
        + (f"Fallbacks flagged INCONCLUSIVE: {caught(fallback)}/{len(fallback)}. " if fallback else "")
        + f"Benign kept clean: {counts.clean}/{len(benign)}.**",
        "",
    ]


def render_calibration(
    rows: Sequence[CalibrationRow],
    run: RunDocument,
    *,
    command: str,
    seconds: float,
    run_dir: Path,
    sensitivity: Sequence[SensitivityPoint] = (),
    firing: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
    plot: str | None = None,
    numerics: Numerics | None = None,
) -> str:
    counts = summarize(rows)
    harmful = [r for r in rows if r.expected == "harmful"]
    benign = [r for r in rows if r.expected == "benign"]
    fallback = [r for r in rows if r.expected == "fallback"]
    hw = run.hardware or {}
    versions = run.versions or {}
    metric = next((r.metric for r in rows if r.metric), "—")
    lines = [
        "# Calibration: what a PASS is worth",
        "",
        "Every entry of the reference layout model's fault zoo, run as a variant against the",
        "`legacy` layout on the same items, judged by evalpipe's default gates. Harmful entries",
        "must come out DIVERGENT, benign ones IDENTICAL or EQUIVALENT, and a variant that silently",
        "leaves its declared path (a fallback) INCONCLUSIVE: its outputs are the old path's, only the",
        "path probes can tell.",
        "",
        f"Regenerate: `{command}` ({seconds / 60:.0f} min on the machine below).",
        f"Machine: {one_line(hw)}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        f"Run: `{run_id(run, run_dir)}`; items per variant: {max((r.n_items for r in rows), default=0)}.",
        "",
        f"**Harmful caught: {sum(r.outcome == 'caught' for r in harmful)}/{len(harmful)}. "
        + (f"Fallbacks flagged INCONCLUSIVE: {sum(r.outcome == 'caught' for r in fallback)}/{len(fallback)}. " if fallback else "")
        + f"Benign kept clean: {counts.clean}/{len(benign)}.**",
        "",
        *_sampled_summary(rows, harmful, fallback, benign),
        *(
            [f"Numerics: {numerics.describe()}; the `auto` floors of that precision apply (docs/numerics.md).", ""]
            if numerics is not None
            else []
        ),
        f"Score columns are for `{md_escape(metric)}` (paired difference variant − legacy, 95% CI, McNemar exact p);",
        "detectors are the gate families that failed; detection cost is the smallest number of",
        "items, in doc order, after which the verdict on those items alone is already DIVERGENT",
        "(computed on this run's outputs: a smaller run batches its prompts differently, which",
        "matters for the faults tied to the batch layout).",
        "",
        *_localize_lines(rows),
        "| variant | expected | verdict | outcome | Δ score [95% CI] | McNemar p | detectors (failed gates) | detection cost | localized first (known place) |"
        + (f" {_sampled_header(rows)} |" if _sampled(rows) else ""),
        "|---|---|---|---|---:|---:|---|---:|---|" + ("---|" if _sampled(rows) else ""),
    ]
    for r in rows:
        lines.append(
            f"| {md_escape(r.variant)} | {r.expected} | {r.status} | {r.outcome} | "
            f"{fmt_delta(r.delta)} {_ci(r.ci_low, r.ci_high)} | {_p(r.mcnemar_p)} | {md_escape(_detectors(r.detectors, r.failed_gates))} | "
            f"{'—' if r.detection_cost is None else r.detection_cost} | {_placed(r)} |"
            + (f" {_sampled_cell(r)} |" if _sampled(rows) else "")
        )
    lines += _by_task_section(rows) + _sensitivity_section(sensitivity, plot) + _firing_section(firing)
    lines += ["", "## The entries", ""]
    for r in rows:
        lines.append(f"- **{md_escape(r.variant)}** ({r.expected}): {md_escape(r.doc)}")
    return "\n".join(lines) + "\n"


def _by_task_section(rows: Sequence[CalibrationRow]) -> list[str]:
    """Which task caught which entry: each task's own verdict (a zoo run over several tasks,
    e.g. the engine-path scenarios; one task says nothing the table above does not)."""
    tasks = sorted({t for r in rows for t in r.by_task})
    if len(tasks) < 2:
        return []
    out = ["", "## Which task catches which entry", "",
           "Each task's own verdict (its gates against its own A/A figures, docs/verdict.md): a path-specific",
           "fault is DIVERGENT only in the tasks that drive its engine path (docs/scenarios.md).", "",
           "| variant | expected | " + " | ".join(md_escape(t) for t in tasks) + " |",
           "|---|---|" + "---|" * len(tasks)]
    for r in rows:
        cells = [f"**{s}**" if (s := r.by_task.get(t, "—")) == "DIVERGENT" else s for t in tasks]
        out.append(f"| {md_escape(r.variant)} | {r.expected} | " + " | ".join(cells) + " |")
    return out


def _placed(r: CalibrationRow) -> str:
    if r.localized is None:
        return "—"
    mark = {True: "✓", False: "✗", None: ""}[r.placed]
    return f"{r.localized} ({r.expected_place or '—'}) {mark}".rstrip()


def _localize_lines(rows: Sequence[CalibrationRow]) -> list[str]:
    """The localization column's summary, and the smallest graded error still placed right."""
    judged = [r for r in rows if r.placed is not None]
    if not judged:
        return []
    graded = sorted((r for r in judged if r.expected == "graded"), key=lambda r: r.variant)
    placed = [r for r in graded if r.placed]
    line = (f"`evalpipe localize` (the last column: the first module above its A/A floor, and in brackets the "
            f"entry's known place) named the known place for {sum(bool(r.placed) for r in judged)}/{len(judged)} entries")
    if graded:
        line += (f"; of the graded errors it placed {', '.join(r.variant for r in placed) or 'none'} and missed "
                 f"{', '.join(r.variant for r in graded if not r.placed) or 'none'}")
    return [line + " (docs/localize.md).", ""]


def _magnitude(m: float) -> str:
    return f"{m:.0e}".replace("e-0", "e-").replace("e+0", "e")


def _sensitivity_section(points: Sequence[SensitivityPoint], plot: str | None) -> list[str]:
    if not points:
        return []
    sizes = sorted({p.n_items for p in points})
    lines = [
        "",
        "## Sensitivity: graded systematic errors",
        "",
        "The `attn_out_error_*` entries multiply one layer's attention output by (1 + ε). Per",
        f"magnitude, the verdict and the gate families that catch it on the first {' and on all '.join(str(n) for n in sizes)} items.",
        "",
        "| ε | " + " | ".join(f"verdict ({n} items) | caught by ({n} items)" for n in sizes) + " |",
        "|---|" + "---|---|" * len(sizes),
    ]
    by = {(p.magnitude, p.n_items): p for p in points}
    for m in sorted({p.magnitude for p in points}, reverse=True):
        cells = []
        for n in sizes:
            p = by.get((m, n))
            cells += ["—", "—"] if p is None else [p.status, ", ".join(p.families) or "—"]
        lines.append(f"| {_magnitude(m)} | " + " | ".join(cells) + " |")
    lines += ["", "Smallest ε each gate family catches:", "", "| family | " + " | ".join(f"{n} items" for n in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    smallest = {n: smallest_caught(points, n) for n in sizes}
    for family in DETECTORS:
        cells = [("—" if (eps := smallest[n][family]) is None else _magnitude(eps)) for n in sizes]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    if plot:
        lines += [
            "",
            f"![measured / threshold per gate against ε]({plot})",
            "",
            "The plot shows, per gate, measured / threshold on all items (a token gate fails above 1; a",
            "distributional gate needs its p-value below alpha as well: hollow markers are not significant).",
        ]
    return lines


def _firing_section(firing: Mapping[str, Mapping[str, tuple[int, int]]] | None) -> list[str]:
    if not firing:
        return []
    lines = [
        "",
        "## False alarms, measured",
        "",
        "How often each gate failed where nothing is wrong: the two A/A pairs (reference vs A/A2 with",
        "the A/A run as noise floor, reference vs A/A with the A/A2 as noise floor) and every benign",
        "entry above. Fired / evaluated.",
        "",
        "| gate | A/A pairs | benign entries |",
        "|---|---:|---:|",
    ]
    for gate in GATE_ORDER:
        cells = []
        for key in ("aa_pairs", "benign"):
            fired, total = (firing.get(key) or {}).get(gate, (0, 0))
            cells.append(f"{fired}/{total}" if total else "—")
        lines.append(f"| {md_escape(gate)} | " + " | ".join(cells) + " |")
    return lines


PLOTTED = FREE_GATES[1:] + TEACHER_GATES[:2] + DISTRIBUTION_GATES


def sensitivity_plot(points: Sequence[SensitivityPoint]) -> bytes:
    """measured / threshold against ε (log-log) for the continuous gates, on all items."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_all = max(p.n_items for p in points)
    pts = sorted((p for p in points if p.n_items == n_all), key=lambda p: p.magnitude)
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = "osD^v<>"
    for gate, marker in zip(PLOTTED, markers):
        measured = [(p, r) for p in pts if (r := p.ratios.get(gate)) is not None]
        xs = [p.magnitude for p, _ in measured]
        ys = [max(r, 1e-6) for _, r in measured]
        if not xs:
            continue
        line = ax.plot(xs, ys, "-", label=gate, linewidth=1)[0]
        for (p, _), x, y in zip(measured, xs, ys):
            hollow = gate in DISTRIBUTION_GATES and not p.significant.get(gate, False)
            ax.plot([x], [y], marker, color=line.get_color(), markerfacecolor="none" if hollow else line.get_color())
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("relative error ε in one layer's attention output")
    ax.set_ylabel("measured / threshold")
    ax.set_title(f"Sensitivity of the default gates ({n_all} items)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return buf.getvalue()


def run_id(run: RunDocument, run_dir: Path) -> str:
    return run.run_id or Path(run_dir).name
