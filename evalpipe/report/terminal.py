"""Compact terminal summary of a run comparison: verdict line, what ran, scores, tokens, failed gates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from evalpipe.documents.comparison import Comparison, ComparisonDocument, LengthRow, Status
from evalpipe.documents.localization import LocalizeDocument
from evalpipe.number_format import DASH, fmt_delta, fmt_num, fmt_score, fmt_small
from evalpipe.report.formats import show_controls
from evalpipe.report.localize import terminal_sentence
from evalpipe.report.what_ran import (
    unverified_note,
    what_ran_view,
)

STATUS_STYLE: dict[Status, str] = {
    Status.IDENTICAL: "bold green",
    Status.EQUIVALENT: "bold cyan",
    Status.INCONCLUSIVE: "bold yellow",
    Status.DIVERGENT: "bold red",
}
PATH_STYLE = "yellow"
MAX_REASONS = 8
VALUE_WIDTH = 10  # what-ran table: the narrowest a value column gets


def _style(status: str) -> str:
    return STATUS_STYLE[Status(status)]


def _plain(text: Any, max_len: int | None = None) -> str:
    """The terminal's ``esc``: rich Text prints no markup, but control characters would reach the terminal."""
    return show_controls("" if text is None else str(text))


def _text(value: Any, style: str = "") -> Text:
    """Untrusted text (names, details, records) for the terminal, control characters shown as \\uXXXX."""
    return Text(_plain(value), style=style)


def _pct(n: int | None, total: int | None) -> str:
    return f"{100.0 * n / total:.1f}%" if n is not None and total else DASH


def _table(title: str, columns: list[tuple[str, bool]], wrap: str | None = None) -> Table:
    """Columns are (name, left-aligned); only the column named ``wrap`` may wrap, so numbers never get squeezed out."""
    table = Table(title=escape(title), title_justify="left")
    for name, left in columns:
        table.add_column(escape(name), justify="left" if left else "right", no_wrap=name != wrap)
    return table


def scores_table(compare: ComparisonDocument) -> Table:
    """One row per variant x task x metric: both scores, the delta, items that changed."""
    table = _table(
        f"scores (reference: {compare.reference})",
        [("variant", True), ("task", True), ("metric", True), ("ref", False), ("variant", False),
         ("\u0394", False), ("changed", False)],
    )
    for c in compare.comparisons:
        for r in sorted(c.scores, key=lambda r: (r.task, r.metric)):
            table.add_row(
                _text(c.variant), _text(r.task), _text(r.metric),
                fmt_score(r.mean_a), fmt_score(r.mean_b), fmt_delta(r.delta), f"{r.n_changed}/{r.n_paired}",
            )
    return table


def tokens_table(compare: ComparisonDocument) -> Table:
    """One row per variant x task: how many samples generate the same tokens; teacher-forced KL when present."""
    comparisons = compare.comparisons
    with_teacher = any(c.teacher for c in comparisons)
    columns = [("variant", True), ("task", True), ("samples", False), ("same ids", False), ("bitwise", False),
               ("median 1st div", False), ("hard div", False), ("max |\u0394lp|", False)]
    if with_teacher:
        columns += [("TF KL p99", False), ("TF hard top-1", False)]
    table = _table("generated tokens", columns + [("verdict", True)])
    for c in comparisons:
        teacher = {t.task: t for t in c.teacher or ()}
        own = {v.task: v.status for v in c.tasks or ()}  # each task's own verdict (a file from before them: the comparison's)
        for t in c.tokens:
            n = t.n_samples
            samples = str(n) + (f" (+{t.only_a}/+{t.only_b} one-sided)" if t.only_a or t.only_b else "")
            row: list[Any] = [
                _text(c.variant), _text(t.task), samples,
                _pct(t.n_ids_identical, n), _pct(t.n_identical, n),
                fmt_num(t.median_first_divergence), fmt_num(t.n_hard_divergences),
                fmt_small(t.max_abs_dlogprob),
            ]
            if with_teacher:
                tf = teacher.get(t.task)
                row += [fmt_small(tf.kl_p99), fmt_num(tf.n_top1_hard)] if tf else [DASH, DASH]
            status = own.get(t.task, c.status)
            table.add_row(*row, _text(status, style=_style(status)))
    return table


def _length_figure(row: LengthRow) -> float | None:
    """The row's teacher-forced KL max (all positions), else its free-running one."""
    for fig in (row.teacher, row.free):
        if fig is not None and fig.kl_max is not None:
            return float(fig.kl_max)
    return None


def length_lines(compare: ComparisonDocument) -> list[str]:
    """One line per comparison x long-context task: the lengths, where the KL max is lowest and
    highest (edge-case lengths marked), and the lengths whose scores changed."""
    out = []
    for c in compare.comparisons:
        for entry in c.by_length or ():
            rows = entry.lengths
            if not rows:
                continue
            lengths = [r.target_length for r in rows]
            n_edge = sum(r.length_kind == "edge" for r in rows)
            span = f"{len(rows)} lengths {min(lengths)}\u2013{max(lengths)}" + (f" ({n_edge} edge)" if n_edge else "")
            valued = [(v, r) for r in rows if (v := _length_figure(r)) is not None]
            mode = "TF" if any(r.teacher is not None for r in rows) else "free"

            def at(v: float, r: LengthRow) -> str:
                edge = " edge" if r.length_kind == "edge" else ""
                return f"{fmt_small(v)} at {r.target_length}{edge}"

            kl = ""
            if valued:
                lo, hi = min(valued, key=lambda x: x[0]), max(valued, key=lambda x: x[0])
                kl = f"; {mode} KL max {at(*lo)} .. {at(*hi)}"
            changed = [
                f"{r.target_length} ({sum(s.n_changed for s in r.scores)})"
                for r in rows
                if any(s.n_changed for s in r.scores)
            ]
            scores = f"; score changed at {', '.join(changed)}" if changed else "; no score change at any length"
            out.append(f"per length, {c.variant} {entry.task}: {span}{kl}{scores}")
    return out


def sampled_lines(compare: ComparisonDocument) -> list[str]:
    """One line per comparison x sampled task: the samples that left the reference's path
    against what the distributions allow, and the A/A run's."""
    out = []
    aa = {t.task: t for t in (compare.noise_floor.sampling if compare.noise_floor else None) or ()}
    for c in compare.comparisons:
        for t in c.sampling or ():
            allowed = "no prediction" if t.predicted is None else f"<= {fmt_small(t.predicted)} predicted"
            floor = aa.get(t.task)
            versus = "" if floor is None else f"; A/A {floor.divergent}/{floor.samples}"
            out.append(f"{c.variant} {t.task} sampled at temperature {t.temperature:g}: {t.divergent}/{t.samples} samples "
                       f"left the reference's path ({allowed}){versus}")
    return out


def failed_gates_table(compare: ComparisonDocument) -> Table | None:
    rows = [(c, g) for c in compare.comparisons for g in c.gates if g.failed]
    if not rows:
        return None
    table = _table(
        "failed gates",
        [("variant", True), ("gate", True), ("task", True), ("metric", True), ("measured", False),
         ("threshold", False), ("A/A", False), ("detail", True)],
        wrap="detail",
    )
    for c, g in rows:
        table.add_row(
            _text(c.variant), _text(g.gate), _text(g.task), _text(g.metric or DASH),
            fmt_num(g.measured), fmt_num(g.threshold), fmt_num(g.aa_value), _text(g.detail),
        )
    return table


def _path_lines(c: Comparison) -> list[str]:
    """Why an INCONCLUSIVE comparison proves nothing: its path reasons (the comparison's own
    reasons when its paths do not say), or that it was compared unverified."""
    reasons = c.path_reasons if c.paths_inconclusive else list(c.reasons)
    if c.unverified and c.paths_inconclusive:
        reasons = [c.reasons[0], *reasons]  # the unverified sides, first of its reasons
    outputs = f" (the outputs alone: {c.outputs_status})" if c.outputs_status else ""
    what = "compared unverified" if c.unverified_only else "the paths prove nothing"
    head = f"{c.variant} vs {c.reference}: {what}{outputs}"
    lines = [_plain(head)] + [f"  - {_plain(r)}" for r in reasons[:MAX_REASONS]]
    if len(reasons) > MAX_REASONS:
        lines.append(f"  \u2026 {len(reasons) - MAX_REASONS} more in report.md")
    return lines


def what_ran_table(compare: ComparisonDocument) -> Table | None:
    """The sides side by side, as in report.md's "What ran" (rows that differ in bold); None without records."""
    view = what_ran_view(compare, _plain)
    if view is None or view["table"] is None:
        return None
    table = Table(title="what ran", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    # on a narrow terminal the labels wrap before the values shrink below VALUE_WIDTH: the values are compared
    table.add_column("", overflow="fold")
    for col in view["table"]["columns"]:
        role = f" ({col['role']})" if col["role"] else ""
        table.add_column(Text(col["name"] + role), overflow="fold", min_width=VALUE_WIDTH)
    for row in view["table"]["rows"]:
        table.add_row(Text(row["label"], style="bold" if row["differs"] else ""), *(Text(x) for x in row["cells"]))
    return table


def _print_paths(compare: ComparisonDocument, console: Console) -> None:
    for c, _ in compare.judged_entries():
        if c.status == Status.INCONCLUSIVE.value:
            for line in _path_lines(c):
                console.print(Text(line, style=PATH_STYLE))
    table = what_ran_table(compare)
    if table is not None:
        console.print(table)


def _gates_passed_line(counts: Mapping[str, int], compare: ComparisonDocument) -> Text:
    skipped = f" ({counts['skip']} skipped)" if counts["skip"] else ""
    passed = counts["total"] - counts["skip"]
    if compare.unverified:
        # the gates see outputs only, and nothing vouches for these: no pass
        return Text(f"all {passed} output gates passed{skipped}, but {', '.join(compare.unverified)} "
                    f"{'was' if len(compare.unverified) == 1 else 'were'} compared unverified: "
                    f"{Status.INCONCLUSIVE.value}", style=PATH_STYLE)
    if compare.inconclusive_variants():
        # the gates see outputs only; reading "passed" here would take an unproven run for a pass
        return Text(f"all {passed} output gates passed{skipped}, but the paths prove nothing: "
                    f"{Status.INCONCLUSIVE.value}", style=PATH_STYLE)
    return Text(f"all {passed} gates passed{skipped}", style="green")


def print_summary(
    compare: ComparisonDocument, console: Console | None = None, *, localizations: Sequence[LocalizeDocument] = ()
) -> None:
    """Verdict line, why the paths prove nothing (INCONCLUSIVE) and what ran, the scores and
    token tables, then the failed gates (or that all passed), then where the difference
    starts (localize.json) when given."""
    console = console or Console()
    console.print(Text.assemble(_text(f"{compare.run_id}: "), _text(compare.status, style=_style(compare.status))))
    nf = compare.noise_floor
    if nf is not None:
        console.print(Text.assemble(_text(f"A/A noise floor ({nf.variant}): "), _text(nf.status, style=_style(nf.status))))
    if compare.unverified:
        console.print(_text(unverified_note(compare), style="bold yellow"))
    _print_paths(compare, console)
    console.print(scores_table(compare))
    console.print(tokens_table(compare))
    for line in length_lines(compare) + sampled_lines(compare):
        console.print(_text(line))
    counts = compare.gate_counts()
    failed = failed_gates_table(compare)
    if failed is not None:
        console.print(failed)
    elif counts["total"]:
        console.print(_gates_passed_line(counts, compare))
    else:
        # no gates: the reasons are the only account of what differs (the path reasons are printed above)
        for c in compare.comparisons:
            if c.status == Status.IDENTICAL.value:
                continue
            shown = set(c.path_reasons) if c.status == Status.INCONCLUSIVE.value else set()
            reasons = [r for r in c.reasons if r not in shown]
            for r in reasons[:MAX_REASONS]:
                console.print(_text(f"  {c.variant}: {r}"))
            if len(reasons) > MAX_REASONS:
                console.print(_text(f"  {c.variant}: \u2026 {len(reasons) - MAX_REASONS} more in report.md"))
    for doc in localizations:
        console.print(Text.assemble(_text("where it starts: ", style="bold"), _text(terminal_sentence(doc))))
