"""Compact terminal summary of a run comparison (rich tables + verdict line)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from evalpipe.compare.run import RunComparison, VariantComparison
from evalpipe.compare.verdict import ARROW, Status, fmt_delta, fmt_score, fmt_small

STATUS_STYLE = {Status.IDENTICAL: "bold green", Status.DIFFERENT: "bold red"}
MAX_REASONS = 8


def _style(status: Status) -> str:
    return STATUS_STYLE.get(status, "bold yellow")


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "\u2014"


def comparison_table(c: VariantComparison) -> Table:
    table = Table(
        title=Text.assemble(Text(f"{c.variant} vs {c.reference}: "), Text(c.status.value, style=_style(c.status))),
        title_justify="left",
        show_lines=False,
    )
    for name, justify in (
        ("task", "left"),
        ("samples", "right"),
        ("ids identical", "right"),
        ("bitwise", "right"),
        ("median 1st div", "right"),
        ("max |\u0394lp|", "right"),
        ("scores", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    tok = {t.task: t for t in c.tokens.summaries}
    for task in sorted(set(tok) | {r.task for r in c.scores.rows}):
        t = tok.get(task)
        scores = [
            f"{r.metric}: {fmt_score(r.mean_a)} {ARROW} {fmt_score(r.mean_b)}"
            + ("" if r.identical else f" ({fmt_delta(r.delta)}, {r.n_changed} changed)")
            for r in c.scores.rows
            if r.task == task
        ]
        samples = "\u2014"
        if t is not None:
            samples = str(t.n_samples)
            if t.only_a or t.only_b:
                samples += f" (+{t.only_a}/+{t.only_b} one-sided)"
        table.add_row(
            Text(task),
            Text(samples),
            Text(_pct(t.n_ids_identical, t.n_samples) if t else "\u2014"),
            Text(_pct(t.n_identical, t.n_samples) if t else "\u2014"),
            Text("\u2014" if t is None or t.median_first_divergence is None else f"{t.median_first_divergence:g}"),
            Text(fmt_small(t.max_abs_dlogprob) if t else "\u2014"),
            Text("\n".join(scores) or "\u2014"),
        )
    return table


def print_summary(run_comparison: RunComparison, console: Console | None = None) -> None:
    """Per comparison a table of tasks, then the overall verdict line and its first reasons."""
    console = console or Console()
    rc = run_comparison
    for c in rc.comparisons:
        console.print(comparison_table(c))
    console.print(Text.assemble(Text(f"{rc.run_id}: "), Text(rc.status.value, style=_style(rc.status))))
    for c in rc.comparisons:
        if c.status is Status.IDENTICAL:
            continue
        reasons = list(c.verdict.reasons)
        for r in reasons[:MAX_REASONS]:
            console.print(Text(f"  {c.variant}: {r}"))
        if len(reasons) > MAX_REASONS:
            console.print(Text(f"  {c.variant}: \u2026 {len(reasons) - MAX_REASONS} more in report.md"))
