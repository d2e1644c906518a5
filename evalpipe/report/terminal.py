"""Compact terminal summary of a run comparison (rich tables + verdict line)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from evalpipe.compare.run import RunComparison
from evalpipe.compare.verdict import Status, fmt_delta, fmt_score, fmt_small

STATUS_STYLE = {Status.IDENTICAL: "bold green", Status.DIFFERENT: "bold red"}
MAX_REASONS = 8


def _style(status: Status) -> str:
    return STATUS_STYLE.get(status, "bold yellow")


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "\u2014"


def scores_table(rc: RunComparison) -> Table:
    """One row per variant x task x metric: both scores, the delta, items that changed."""
    table = Table(title=f"scores (reference: {rc.reference})", title_justify="left")
    for name, justify in (("variant", "left"), ("task", "left"), ("metric", "left"), ("ref", "right"),
                          ("variant", "right"), ("\u0394", "right"), ("changed", "right")):
        table.add_column(name, justify=justify, no_wrap=justify == "left")  # type: ignore[arg-type]
    for c in rc.comparisons:
        for r in sorted(c.scores.rows, key=lambda r: (r.task, r.metric)):
            table.add_row(c.variant, r.task, r.metric, fmt_score(r.mean_a), fmt_score(r.mean_b),
                          fmt_delta(r.delta), f"{r.n_changed}/{r.n_paired}")
    return table


def tokens_table(rc: RunComparison) -> Table:
    """One row per variant x task: how many samples generate the same tokens."""
    table = Table(title="generated tokens", title_justify="left")
    for name in ("variant", "task", "samples", "same ids", "bitwise", "median 1st div", "max |\u0394lp|", "verdict"):
        left = name in ("variant", "task", "verdict")
        table.add_column(name, justify="left" if left else "right", no_wrap=left)
    for c in rc.comparisons:
        for t in c.tokens.summaries:
            samples = str(t.n_samples) + (f" (+{t.only_a}/+{t.only_b} one-sided)" if t.only_a or t.only_b else "")
            table.add_row(
                c.variant, t.task, samples,
                _pct(t.n_ids_identical, t.n_samples), _pct(t.n_identical, t.n_samples),
                "\u2014" if t.median_first_divergence is None else f"{t.median_first_divergence:g}",
                fmt_small(t.max_abs_dlogprob),
                Text(c.status.value, style=_style(c.status)),
            )
    return table


def print_summary(run_comparison: RunComparison, console: Console | None = None) -> None:
    """Per comparison a table of tasks, then the overall verdict line and its first reasons."""
    console = console or Console()
    rc = run_comparison
    console.print(scores_table(rc))
    console.print(tokens_table(rc))
    console.print(Text.assemble(Text(f"{rc.run_id}: "), Text(rc.status.value, style=_style(rc.status))))
    for c in rc.comparisons:
        if c.status is Status.IDENTICAL:
            continue
        reasons = list(c.verdict.reasons)
        for r in reasons[:MAX_REASONS]:
            console.print(Text(f"  {c.variant}: {r}"))
        if len(reasons) > MAX_REASONS:
            console.print(Text(f"  {c.variant}: \u2026 {len(reasons) - MAX_REASONS} more in report.md"))
