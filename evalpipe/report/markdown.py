"""report.md: verdict and gates first, then the run header, then per comparison and task the evidence.

Model and dataset text is untrusted: every piece of it goes through :func:`md_escape`
(the ``esc`` of :func:`evalpipe.report.view.build_view`) and lands in a table cell or
after a label, so it can neither break the layout (pipes, newlines, backticks) nor
inject HTML (``<``/``>``) into a rendered page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import jinja2

from evalpipe.documents.comparison import ComparisonDocument
from evalpipe.documents.localization import LocalizeDocument
from evalpipe.documents.run_doc import RunDocument
from evalpipe.report.formats import show_controls
from evalpipe.report.localize import markdown_section
from evalpipe.report.view import build_view

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE_NAME = "report.md.j2"

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
    return show_controls(s.replace("\n", "<br>"))


def template_environment(autoescape: bool) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=autoescape,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_markdown(
    compare: ComparisonDocument, run: RunDocument | None = None, localizations: Sequence[LocalizeDocument] = ()
) -> str:
    """report.md from the comparison and run.json (and localize.json's "Where it starts" when
    given); the same inputs give the same bytes."""
    view = build_view(compare, run, md_escape)
    view["localizations"] = [markdown_section(doc, md_escape) for doc in localizations]
    # markdown, not HTML: every text in the view is already md_escape'd
    text = template_environment(autoescape=False).get_template(TEMPLATE_NAME).render(**view)
    # collapse runs of blank lines left by template control blocks
    lines, blank = [], 0
    for line in text.splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"
