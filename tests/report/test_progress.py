"""What a person watching a run sees of the worker's events (evalpipe/report/progress.py):
ProgressView.handle(variant) turns each event into console output -- on a plain log (CI) one
progress line per 25% instead of a redrawn bar, on a terminal a bar per variant, task and
phase; stage messages, finished tasks with their metrics (no stderr), errors and the end;
with ``lines`` (variants running at once) every line names its variant; text from the
worker is printed as it is, never read as rich markup.
"""

from __future__ import annotations

import io

from rich.console import Console

from evalpipe.documents.worker_events import DoneEvent, ErrorEvent, ProgressEvent, StageEvent, TaskDoneEvent
from evalpipe.report.progress import ProgressView


def _console(terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=terminal, color_system=None), out


def test_a_plain_log_gets_one_progress_line_per_quarter():
    console, out = _console()
    on_event = ProgressView(console).handle("sp")
    for done in range(101):
        on_event(ProgressEvent(task="gsm8k", phase="generate", done=done, total=100))
    on_event(ProgressEvent(task="gsm8k", phase="teacher", done=0, total=0))  # nothing to do: 100% at once
    assert out.getvalue().splitlines() == [
        "  sp · gsm8k · generate: 0/100", "  sp · gsm8k · generate: 25/100", "  sp · gsm8k · generate: 50/100",
        "  sp · gsm8k · generate: 75/100", "  sp · gsm8k · generate: 100/100", "  sp · gsm8k · teacher: 0/0",
    ]


def test_stages_tasks_and_the_end_and_lines_naming_the_variant():
    for lines, who in ((False, ""), (True, "sp: ")):
        console, out = _console()
        on_event = ProgressView(console, lines=lines).handle("sp")
        on_event(StageEvent(stage="engine", message="starting the engine"))
        on_event(StageEvent(stage="task", message="gsm8k", task="gsm8k"))  # the task's own line comes with its result
        on_event(TaskDoneEvent(task="gsm8k", metrics={"acc": 0.5, "acc_stderr": 0.1, "n": 3}, seconds=2.34))
        on_event(DoneEvent(seconds=12.0))
        assert out.getvalue().splitlines() == [
            f"  {who}starting the engine", f"  {who}gsm8k: acc 0.5000 (2.3s)", f"  {who}done in 12.0s"], lines


def test_worker_text_is_not_read_as_markup():
    """(Variant names are plain names, config/run_config.py: they hold no brackets.)"""
    console, out = _console()
    on_event = ProgressView(console, lines=True).handle("sp")
    on_event(StageEvent(stage="warning", message="[red]not red[/red]"))
    on_event(ErrorEvent(kind="engine", message="[bold]boom[/bold] at x[1]"))
    assert out.getvalue().splitlines() == [
        "  sp: [red]not red[/red]", "  sp: engine error: [bold]boom[/bold] at x[1]"]


def test_a_terminal_gets_a_bar_that_a_finished_task_closes():
    console, out = _console(terminal=True)
    view = ProgressView(console)
    on_event = view.handle("sp")
    for done in (0, 5, 10):
        on_event(ProgressEvent(task="gsm8k", phase="generate", done=done, total=10))
    on_event(TaskDoneEvent(task="gsm8k", metrics={"acc": 1.0}, seconds=1.0))
    text = out.getvalue()
    assert "sp · gsm8k · generate" in text and "10/10" in text
    assert "sp · gsm8k · generate: " not in text  # a bar, not the log lines
    assert text.rstrip().endswith("gsm8k: acc 1.0000 (1.0s)")
    view.close()  # closing again is harmless
