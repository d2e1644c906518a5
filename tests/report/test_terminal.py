"""The terminal summary (evalpipe/report/terminal.py): print_summary of hand-built compare.json
documents (tests/support/report_samples.py) -- the verdict line and the A/A floor, the scores and
token tables (teacher-forced columns only when there is teacher-forced data), the failed gates,
the line that all passed, or without gates the reasons; the line per long-context task (length_lines) of a real comparison
of the long-context run (tests/report/conftest.py).
"""

from __future__ import annotations

import io
from typing import Any

from report_samples import TASK, as_document, comparison, gate, identical_compare, make_compare, print_summary
from rich.console import Console

from evalpipe.report.terminal import MAX_REASONS, length_lines
from tests.compare.test_bylength import LTASK


def _summary(d: dict[str, Any]) -> str:
    buf = io.StringIO()
    print_summary(d, Console(file=buf, width=220, color_system=None))
    return buf.getvalue()


def test_terminal_summary_divergent():
    out = _summary(make_compare())
    lines = out.splitlines()
    assert lines[0] == "run-1: DIVERGENT"
    assert "A/A noise floor (legacy-aa): EQUIVALENT" in out
    assert "scores (reference: legacy)" in out
    header = next(line for line in lines if "TF KL p99" in line)
    assert "TF hard top-1" in header
    row = next(line for line in lines if line.startswith("│ sp") and "%" in line)
    assert TASK in row and "83.3%" in row and "0.004" in row and "DIVERGENT" in row
    assert "failed gates" in out
    failed = [line for line in lines if line.startswith("│ sp") and "teacher_kl_max" in line]
    assert failed and "0.3" in failed[0] and "KL 0.3 > 0.1 at doc 5 pos 7" in failed[0]
    assert not any("teacher_kl_p99" in line for line in lines)


def test_terminal_summary_all_gates_passed():
    c = comparison(status="EQUIVALENT", gates=[gate("teacher_kl_p99", "pass", 0.001, 0.01), gate("x", "skip", None, None)])
    out = _summary(make_compare(status="EQUIVALENT", comparisons=[c]))
    assert out.startswith("run-1: EQUIVALENT")
    assert "all 1 gates passed (1 skipped)" in out and "failed gates" not in out


def test_terminal_summary_old_layout():
    out = _summary(identical_compare())
    assert out.startswith("run-1: IDENTICAL")
    assert "TF KL p99" not in out and "failed gates" not in out
    row = next(line for line in out.splitlines() if line.startswith("│ sp") and "%" in line)
    assert "100.0%" in row and "IDENTICAL" in row



def test_terminal_summary_without_gates_lists_the_reasons():
    """No gate was evaluated: the reasons are the only account, MAX_REASONS of them, control
    characters shown rather than sent to the terminal."""
    reasons = [f"{TASK}: reason {i}\x1b[2J" for i in range(MAX_REASONS + 3)]
    c = comparison(gates=[], reasons=reasons)
    out = _summary(make_compare(comparisons=[c]))
    listed = [line for line in out.splitlines() if line.startswith("  sp: ")]
    assert listed[0] == f"  sp: {TASK}: reason 0\\u001b[2J"
    assert len(listed) == MAX_REASONS + 1 and listed[-1] == "  sp: \u2026 3 more in report.md"
    assert "\x1b" not in out and "gates passed" not in out and "failed gates" not in out


def test_terminal_line_per_long_task(long_compare):
    (line,) = length_lines(as_document(long_compare))
    assert line.startswith(f"per length, sp {LTASK}: 4 lengths 1024–2049 (2 edge); TF KL max 0 at 1024 .. ")
    assert line.endswith("at 2049 edge; score changed at 2049 (2)")
    out = io.StringIO()
    print_summary(long_compare, Console(file=out, width=200, color_system=None))
    assert line in out.getvalue()


def test_a_sampled_task_gets_a_line_with_its_prediction_and_the_a_a_count():
    import types

    from evalpipe.report.terminal import sampled_lines
    from tests.report.test_sampled import task

    compare = types.SimpleNamespace(
        noise_floor=types.SimpleNamespace(sampling=[task(1)]),
        comparisons=[types.SimpleNamespace(variant="sp", sampling=[task(3, predicted=4.2)]),
                     types.SimpleNamespace(variant="greedy", sampling=None)])
    assert sampled_lines(compare) == [
        "sp t sampled at temperature 0.6: 3/20 samples left the reference's path (<= 4.2 predicted); A/A 1/20"]
    compare.noise_floor = None
    compare.comparisons[0].sampling = [task(0, predicted=None)]
    assert sampled_lines(compare) == ["sp t sampled at temperature 0.6: 0/20 samples left the reference's path (no prediction)"]


def test_the_token_rows_verdict_is_each_tasks_own():
    own = [{"task": TASK, "status": "INCONCLUSIVE", "reasons": ["variant `sp`: task ..."], "outputs_status": "EQUIVALENT",
            "gates_failed": 0, "gates_passed": 4}]
    out = _summary(make_compare(comparisons=[comparison(tasks=own)]))
    row = next(line for line in out.splitlines() if line.startswith("│ sp") and "%" in line)
    assert "INCONCLUSIVE" in row and "DIVERGENT" not in row
