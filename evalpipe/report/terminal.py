"""Compact terminal summary of a run comparison: verdict line, what ran, scores, tokens, failed gates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from evalpipe.compare.verdict import Status, fmt_delta, fmt_score, fmt_small
from evalpipe.report.view import (
    DASH,
    as_dict,
    fmt_num,
    gate_counts,
    inconclusive_variants,
    judged_entries,
    path_reasons,
    paths_inconclusive,
    reference_of,
    show_controls,
    variant_of,
    what_ran_view,
)

STATUS_STYLE = {
    "IDENTICAL": "bold green",
    "EQUIVALENT": "bold cyan",
    "INCONCLUSIVE": "bold yellow",
    "DIVERGENT": "bold red",
}
UNKNOWN_STYLE = "bold magenta"  # a status no evalpipe writes (a hand-edited or very old compare.json)
PATH_STYLE = "yellow"
MAX_REASONS = 8
VALUE_WIDTH = 10  # what-ran table: the narrowest a value column gets


def _style(status: Any) -> str:
    return STATUS_STYLE.get(str(status), UNKNOWN_STYLE)


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


def scores_table(compare: Mapping[str, Any]) -> Table:
    """One row per variant x task x metric: both scores, the delta, items that changed."""
    table = _table(
        f"scores (reference: {compare.get('reference', '')})",
        [("variant", True), ("task", True), ("metric", True), ("ref", False), ("variant", False),
         ("\u0394", False), ("changed", False)],
    )
    for c in compare.get("comparisons") or ():
        for r in sorted(c.get("scores") or (), key=lambda r: (str(r.get("task")), str(r.get("metric")))):
            table.add_row(
                _text(c.get("variant")), _text(r.get("task")), _text(r.get("metric")),
                fmt_score(r.get("mean_a")), fmt_score(r.get("mean_b")), fmt_delta(r.get("delta")),
                f"{r.get('n_changed', 0)}/{r.get('n_paired', 0)}",
            )
    return table


def tokens_table(compare: Mapping[str, Any]) -> Table:
    """One row per variant x task: how many samples generate the same tokens; teacher-forced KL when present."""
    comparisons = list(compare.get("comparisons") or ())
    with_teacher = any(c.get("teacher") for c in comparisons)
    columns = [("variant", True), ("task", True), ("samples", False), ("same ids", False), ("bitwise", False),
               ("median 1st div", False), ("hard div", False), ("max |\u0394lp|", False)]
    if with_teacher:
        columns += [("TF KL p99", False), ("TF hard top-1", False)]
    table = _table("generated tokens", columns + [("verdict", True)])
    for c in comparisons:
        teacher = {str(t.get("task")): t for t in c.get("teacher") or ()}
        for t in c.get("tokens") or ():
            n = t.get("n_samples", 0)
            only_a, only_b = t.get("only_a", 0), t.get("only_b", 0)
            samples = str(n) + (f" (+{only_a}/+{only_b} one-sided)" if only_a or only_b else "")
            row: list[Any] = [
                _text(c.get("variant")), _text(t.get("task")), samples,
                _pct(t.get("n_ids_identical"), n), _pct(t.get("n_identical"), n),
                fmt_num(t.get("median_first_divergence")), fmt_num(t.get("n_hard_divergences")),
                fmt_small(t.get("max_abs_dlogprob")),
            ]
            if with_teacher:
                tf = teacher.get(str(t.get("task"))) or {}
                row += [fmt_small(tf.get("kl_p99")) if tf else DASH, fmt_num(tf.get("n_top1_hard"))]
            status = c.get("status", "")
            table.add_row(*row, _text(status, style=_style(status)))
    return table


def _length_figure(row: Mapping[str, Any]) -> float | None:
    """The row's teacher-forced KL max (all positions), else its free-running one."""
    for part in ("teacher", "free"):
        fig = row.get(part)
        if fig and fig.get("kl_max") is not None:
            return float(fig["kl_max"])
    return None


def length_lines(compare: Mapping[str, Any]) -> list[str]:
    """One line per comparison x long-context task: the lengths, where the KL max is lowest and
    highest (edge-case lengths marked), and the lengths whose scores changed."""
    out = []
    for c in compare.get("comparisons") or ():
        for entry in c.get("by_length") or ():
            rows = list(entry.get("lengths") or ())
            if not rows:
                continue
            lengths = [int(r.get("target_length") or 0) for r in rows]
            n_edge = sum(r.get("length_kind") == "edge" for r in rows)
            span = f"{len(rows)} lengths {min(lengths)}\u2013{max(lengths)}" + (f" ({n_edge} edge)" if n_edge else "")
            valued = [(v, r) for r in rows if (v := _length_figure(r)) is not None]
            mode = "TF" if any(r.get("teacher") for r in rows) else "free"

            def at(v: float, r: Mapping[str, Any]) -> str:
                edge = " edge" if r.get("length_kind") == "edge" else ""
                return f"{fmt_small(v)} at {r.get('target_length')}{edge}"

            kl = ""
            if valued:
                lo, hi = min(valued, key=lambda x: x[0]), max(valued, key=lambda x: x[0])
                kl = f"; {mode} KL max {at(*lo)} .. {at(*hi)}"
            changed = [
                f"{r.get('target_length')} ({sum(s.get('n_changed') or 0 for s in r.get('scores') or ())})"
                for r in rows
                if any(s.get("n_changed") for s in r.get("scores") or ())
            ]
            scores = f"; score changed at {', '.join(changed)}" if changed else "; no score change at any length"
            out.append(f"per length, {c.get('variant')} {entry.get('task')}: {span}{kl}{scores}")
    return out


def failed_gates_table(compare: Mapping[str, Any]) -> Table | None:
    rows = [
        (c, g)
        for c in compare.get("comparisons") or ()
        for g in c.get("gates") or ()
        if g.get("status") == "fail"
    ]
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
            _text(c.get("variant")), _text(g.get("gate")), _text(g.get("task")),
            _text(g.get("metric") or DASH), fmt_num(g.get("measured")), fmt_num(g.get("threshold")),
            fmt_num(g.get("aa_value")), _text(g.get("detail") or ""),
        )
    return table


def _path_lines(c: Mapping[str, Any]) -> list[str]:
    """Why an INCONCLUSIVE comparison proves nothing: its path reasons (the comparison's own
    reasons when the paths are missing, a hand-made compare.json)."""
    reasons = path_reasons(c) if paths_inconclusive(c) else [str(r) for r in c.get("reasons") or ()]
    outputs = f" (the outputs alone: {c['outputs_status']})" if c.get("outputs_status") else ""
    head = f"{variant_of(c)} vs {reference_of(c)}: the paths prove nothing{outputs}"
    lines = [_plain(head)] + [f"  - {_plain(r)}" for r in reasons[:MAX_REASONS]]
    if len(reasons) > MAX_REASONS:
        lines.append(f"  \u2026 {len(reasons) - MAX_REASONS} more in report.md")
    return lines


def what_ran_table(compare: Mapping[str, Any]) -> Table | None:
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


def _print_paths(compare: Mapping[str, Any], console: Console) -> None:
    for c, _ in judged_entries(compare):
        if c.get("status") == Status.INCONCLUSIVE.value:
            for line in _path_lines(c):
                console.print(Text(line, style=PATH_STYLE))
    table = what_ran_table(compare)
    if table is not None:
        console.print(table)


def _gates_passed_line(counts: Mapping[str, int], compare: Mapping[str, Any]) -> Text:
    skipped = f" ({counts['skip']} skipped)" if counts["skip"] else ""
    passed = counts["total"] - counts["skip"]
    if inconclusive_variants(compare):
        # the gates see outputs only; reading "passed" here would take an unproven run for a pass
        return Text(f"all {passed} output gates passed{skipped}, but the paths prove nothing: "
                    f"{Status.INCONCLUSIVE.value}", style=PATH_STYLE)
    return Text(f"all {passed} gates passed{skipped}", style="green")


def print_summary(compare: Any, console: Console | None = None) -> None:
    """Verdict line, why the paths prove nothing (INCONCLUSIVE) and what ran, the scores and
    token tables, then the failed gates (or that all passed)."""
    console = console or Console()
    compare = as_dict(compare)
    status = compare.get("status", "")
    console.print(Text.assemble(_text(f"{compare.get('run_id', '')}: "), _text(status, style=_style(status))))
    nf = compare.get("noise_floor")
    if nf:
        console.print(Text.assemble(
            _text(f"A/A noise floor ({nf.get('variant', nf.get('b', ''))}): "),
            _text(nf.get("status", ""), style=_style(nf.get("status"))),
        ))
    _print_paths(compare, console)
    console.print(scores_table(compare))
    console.print(tokens_table(compare))
    for line in length_lines(compare):
        console.print(_text(line))
    counts = gate_counts(compare)
    failed = failed_gates_table(compare)
    if failed is not None:
        console.print(failed)
    elif counts["total"]:
        console.print(_gates_passed_line(counts, compare))
    else:
        # no gates: the reasons are the only account of what differs (the path reasons are printed above)
        for c in compare.get("comparisons") or ():
            if c.get("status") == "IDENTICAL":
                continue
            shown = set(path_reasons(c)) if c.get("status") == Status.INCONCLUSIVE.value else set()
            reasons = [str(r) for r in c.get("reasons") or () if str(r) not in shown]
            for r in reasons[:MAX_REASONS]:
                console.print(_text(f"  {c.get('variant')}: {r}"))
            if len(reasons) > MAX_REASONS:
                console.print(_text(f"  {c.get('variant')}: \u2026 {len(reasons) - MAX_REASONS} more in report.md"))
