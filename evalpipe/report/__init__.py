"""Renderings of a run comparison from its compare.json document (and run.json):
report.md, report.html, junit.xml and the terminal summary, each returned as text."""

from evalpipe.report.html import render_html
from evalpipe.report.junit import render_junit
from evalpipe.report.markdown import md_escape, render_markdown
from evalpipe.report.terminal import print_summary

__all__ = ["md_escape", "print_summary", "render_html", "render_junit", "render_markdown"]
