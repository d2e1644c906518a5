"""report.html: the markdown report's content, one self-contained file with inline plots.

No script, no external stylesheet, font or image: the page opens offline. Safety
of untrusted text rests on jinja2's autoescape, so the view hands the template raw
text; :func:`html_text` only makes control characters visible (they are invalid in
HTML and some model output holds them).
"""

from __future__ import annotations

from typing import Any, Sequence

from evalpipe.documents.comparison import ComparisonDocument, Status, TaskBreakdown, TokenSummary
from evalpipe.documents.localization import LocalizeDocument
from evalpipe.documents.run_doc import RunDocument
from evalpipe.report import localize, plots
from evalpipe.report.formats import show_controls
from evalpipe.report.markdown import template_environment
from evalpipe.report.view import build_view

TEMPLATE_NAME = "report.html.j2"
# each has a badge colour in report.html.j2; any other text gets the grey "unknown" one
KNOWN_STATUSES = {s.value for s in Status}


def html_text(text: Any, max_len: int | None = None) -> str:
    """Plain text for the autoescaping template: truncated, controls shown as \\uXXXX, newlines kept."""
    if text is None:
        return ""
    s = str(text)
    if max_len is not None and len(s) > max_len:
        s = s[:max_len] + "\u2026"
    return show_controls(s.replace("\r\n", "\n").replace("\r", "\n"), keep="\n\t")


def status_class(status: str) -> str:
    """The badge class of a comparison status (the document admits no other)."""
    return {s: s.lower() for s in KNOWN_STATUSES}[status]


_NOT_DRAWN = {"png": None, "alt": "", "note": "Plots were not drawn for this page (a simulated night); compare.json holds the figures."}


def _plots(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's two plots, or for each a line saying why there is none."""
    # matplotlib is slow to import and only report.html needs it

    free: TokenSummary | None = data["free"]
    free_aa: TokenSummary | None = data["free_aa"]
    teacher = data["teacher"] is not None
    ab, aa = (data["teacher"], data["teacher_aa"]) if teacher else (free, free_aa)
    mode = "teacher-forced" if teacher else "free-running"
    dist = plots.distribution_plot(ab, aa, mode)
    div = plots.divergence_plot(free.divergence_positions if free else None,
                                free_aa.divergence_positions if free_aa else None)
    return [
        {
            "png": dist,
            "alt": f"distribution of per-position KL and |Δlogprob| ({mode})",
            "note": f"No per-position KL or |Δlogprob| distribution for this task ({mode}).",
        },
        {
            "png": div,
            "alt": "first-divergence positions (free-running)",
            "note": "No free-running divergence: every paired sample generated the same token ids."
            if free is not None
            else "No free-running token comparison for this task.",
        },
    ]


def _length_plots(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-length and per-depth trend plots of a long-context task, or a line saying why there is none."""
    ab: TaskBreakdown = data["ab"]
    aa: TaskBreakdown | None = data["aa"]
    source, split = data["source"], data["split"]
    mode = "teacher-forced" if source == "teacher" else "free-running"
    zero = f"Every {mode} KL max and max |Δlogprob| is 0 or missing"
    return [
        {
            "png": plots.length_plot(ab.lengths, aa.lengths if aa else None, source, split),
            "alt": f"KL max and max |Δlogprob| ({mode}) against prompt length",
            "note": f"{zero} at every length: nothing to plot against prompt length.",
        },
        {
            "png": plots.depth_plot(ab.depths, aa.depths if aa else None, source, split),
            "alt": f"KL max and max |Δlogprob| ({mode}) against needle depth",
            "note": f"{zero} at every depth: nothing to plot against needle depth."
            if ab.depths
            else "The items carry no needle depth.",
        },
    ]


def _localization(doc: LocalizeDocument, draw: bool, index: int = 0) -> dict[str, Any]:
    """One variant's part of the "Where it starts" section: localize.view's content and its
    two plots (the first variant's plots keep the plain ids)."""
    suffix = f"-{index}" if index else ""
    section = localize.view(doc, html_text)
    if not draw:
        section["plots"] = [dict(_NOT_DRAWN, id="")]
        return section
    section["plots"] = [
        {
            "id": f"localize-heatmap{suffix}",
            "png": plots.localize_heatmap(doc),
            "alt": "heatmap of layer by module: log10 of the relative L2 error over its floor, "
                   "the first module above its floor outlined",
            "note": "No module has a value to draw: nothing could be compared.",
        },
        {
            "id": f"localize-curve{suffix}",
            "png": plots.localize_curve(doc),
            "alt": "relative L2 error of the residual stream after each layer: reference vs variant, "
                   "reference vs A/A, and the floor",
            "note": "No per-layer residual stream to draw.",
        },
    ]
    return section


def render_html(
    compare: ComparisonDocument, run: RunDocument | None = None, *, plots: bool = True,
    localizations: Sequence[LocalizeDocument] = (),
) -> str:
    """report.html from the comparison and run.json (and localize.json's "Where it starts"
    when given). ``plots=False`` leaves the plots out (a line says so): drawing them is
    most of the page's cost, which a simulated history of many nights need not pay for
    every night."""
    view = build_view(compare, run, html_text)
    view["localizations"] = [_localization(doc, plots, i) for i, doc in enumerate(localizations)]
    for c in view["comparisons"]:
        for t in c["tasks"]:
            t["plots"] = _plots(t["data"]) if plots else [_NOT_DRAWN]
            if t.get("by_length"):
                t["by_length"]["plots"] = _length_plots(t["by_length"]["data"]) if plots else [_NOT_DRAWN]
    env = template_environment(autoescape=True)
    env.filters["status_class"] = status_class
    return env.get_template(TEMPLATE_NAME).render(**view)
