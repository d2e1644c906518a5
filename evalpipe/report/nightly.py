"""A night's judgement (nightly.json's document) as Markdown for a CI step summary and as
JUnit XML; evalpipe.nightly.night writes them beside nightly.json."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from evalpipe.documents.comparison import Status
from evalpipe.documents.nightly_doc import BaselineComparison, NightlyDocument, NightStatus
from evalpipe.number_format import fmt_p
from evalpipe.report.junit import xml_text
from evalpipe.report.markdown import md_escape

NIGHT_ICONS: dict[NightStatus, str] = {NightStatus.PASS: "✅", NightStatus.INCONCLUSIVE: "⚠️", NightStatus.REGRESSION: "❌",
                                       NightStatus.FAILED: "💥"}


def render_night_summary(j: NightlyDocument, dashboard: Path | None = None) -> str:
    """Markdown fit for a CI step summary."""
    icon = NIGHT_ICONS[j.status]
    lines = [f"## evalpipe nightly {md_escape(j.run_id)}: {icon} {j.status}", ""]
    lines.append(f"- tonight's verdict (variants vs reference): **{md_escape(str(j.verdict))}**")
    lines.append(f"- baseline night: {md_escape(j.baseline) if j.baseline else 'none yet (first passing night becomes it)'}")
    if dashboard:
        # not a code span: md_escape's backslashes would show inside one
        lines.append(f"- dashboard: {md_escape(str(dashboard))}")
    if j.reasons:
        lines += ["", "### Why", ""] + [f"- {md_escape(r)}" for r in j.reasons]
    if j.vs_baseline:
        lines += ["", "### Against the baseline night", "", "| variant | baseline | status | flips (task metric: right→wrong / wrong→right, McNemar p) |", "|---|---|---|---|"]
        for e in j.vs_baseline:
            if e.error is not None:
                lines.append(f"| {md_escape(e.variant)} | {md_escape(str(e.baseline))} | error | {md_escape(e.error)} |")
                continue
            flips = "; ".join(f"{md_escape(s.task)} {md_escape(s.metric)}: {_count(s.a_right_b_wrong)}/{_count(s.a_wrong_b_right)}, "
                              f"p {fmt_p(s.mcnemar_p)}" for s in e.scores)
            lines.append(f"| {md_escape(e.variant)} | {md_escape(str(e.baseline))} | {md_escape(str(e.status))} | {flips} |")
        for e in j.vs_baseline:
            for sc in e.scores:
                if sc.flipped:
                    items = ", ".join(f"doc {f.doc_id}" + (f" repeat {f.repeat}" if f.repeat else "") for f in sc.flipped[:20])
                    more = f" (+{len(sc.flipped) - 20} more)" if len(sc.flipped) > 20 else ""
                    lines.append(f"\n{md_escape(e.variant)}, {md_escape(sc.task)} {md_escape(sc.metric)}: "
                                 f"flipped {md_escape(items)}{more}")
    shown = [c for c in j.changes if c.state in ("flagged", "pending")]
    if shown:
        lines += ["", "### Changes in the series", ""]
        for c in shown:
            lines.append(f"- **{c.state}** {md_escape(c.summary)}")
            if c.bisect:
                lines.append("  - changed between " + md_escape(f"{c.last_good} and {c.first_bad}") + ": "
                             + "; ".join(md_escape(f"{b.component}: {b.before} → {b.after}") for b in c.bisect[:8]))
            if c.flipped:
                lines.append(f"  - {len(c.flipped)} items changed, first: " + md_escape(", ".join(
                    f"doc {f.doc_id} ({f.before:g}→{f.after:g})" for f in c.flipped[:10])))
    return "\n".join(lines) + "\n"


def render_night_junit(j: NightlyDocument) -> str:

    cases: list[tuple[str, str, tuple[str, str] | None]] = [("tonight", "variants_vs_reference", _tonight_failure(j))]
    for e in j.vs_baseline:
        cases.append(("vs_baseline", e.variant, _baseline_failure(e)))
    for c in j.changes:
        if c.state == "flagged" and c.regression:
            cases.append(("series", f"{c.task}[{c.metric}].{c.variant}", ("regression", c.summary) if c.open else None))
    suite = ET.Element("testsuite", name=xml_text(f"evalpipe.nightly.night.{j.run_id}"), tests=str(len(cases)),
                       failures=str(sum(1 for *_, bad in cases if bad)))
    for classname, name, bad in cases:
        case = ET.SubElement(suite, "testcase", classname=xml_text(classname), name=xml_text(name))
        if bad:
            kind, text = bad
            ET.SubElement(case, "failure", message=xml_text(text.splitlines()[0][:500]), type=kind).text = xml_text(text)
    root = ET.Element("testsuites", name="evalpipe.nightly.night")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _tonight_failure(j: NightlyDocument) -> tuple[str, str] | None:
    """(failure type, text) of tonight's own verdict, None when it passed."""
    if j.verdict is None or j.verdict.passed:
        return None
    if j.verdict is Status.INCONCLUSIVE:
        return "inconclusive", j.paths or "tonight's comparison proves nothing about the paths"
    return "regression", f"verdict {j.verdict}" + (f"\n{j.paths}" if j.paths else "")


def _baseline_failure(e: BaselineComparison) -> tuple[str, str] | None:
    """(failure type, text) of one variant against the baseline night, None when it passed."""
    if e.error is not None:
        return "error", e.error
    if e.status is not None and e.status.passed:
        return None
    text = f"{e.status}: " + "; ".join(e.reasons)[:2000]
    return ("inconclusive" if e.status is Status.INCONCLUSIVE else "regression"), text


def _count(n: int | None) -> str:
    return "—" if n is None else str(n)
