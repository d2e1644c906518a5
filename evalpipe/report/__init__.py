"""Human-readable renderings of a run comparison (markdown file, terminal summary)."""

from evalpipe.report.markdown import md_escape, render_markdown
from evalpipe.report.terminal import print_summary

__all__ = ["md_escape", "print_summary", "render_markdown"]
