"""The reporters: the terminal's lines as before, quiet's silence, JSON lines for CI."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evalpipe.reporting import REPORTERS, Event, EventKind, JsonLinesReporter, QuietReporter, Reporter, TerminalReporter


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, highlight=False, width=160), out


def _tell(reporter: Reporter) -> None:
    reporter.step("[bold]run[/] r1 -> /tmp/r1", run_id="r1")
    reporter.info("[dim]recorded in the history x[/]")
    reporter.info("[not markup] kept as is", plain=True)
    reporter.note("[yellow]note:[/] a note")
    reporter.warning("[yellow]warning:[/] careful")
    reporter.failure("[bold red]variant b failed[/]; continuing with the other variants.", variant="b")
    reporter.verdict("DIVERGENT", 1, Path("/tmp/r1"))


def test_the_table_names_each_reporter():
    assert set(REPORTERS) == {"terminal", "quiet", "jsonl"}
    console, _ = _console()
    for make in REPORTERS.values():
        reporter = make(console)
        assert isinstance(reporter, Reporter) and isinstance(reporter.console, Console)


def test_terminal_prints_each_event_as_its_markup_and_the_verdict_only_with_a_line():
    console, out = _console()
    _tell(TerminalReporter(console))
    assert out.getvalue().splitlines() == [
        "run r1 -> /tmp/r1",
        "recorded in the history x",
        "[not markup] kept as is",
        "note: a note",
        "warning: careful",
        "variant b failed; continuing with the other variants.",
    ]


def test_quiet_shows_the_failure_and_the_verdict_only(capsys):
    console, out = _console()
    reporter = QuietReporter(console)
    _tell(reporter)
    reporter.console.print("a summary table nobody should see")
    assert out.getvalue().splitlines() == ["DIVERGENT (exit 1) /tmp/r1"]
    assert capsys.readouterr().err.splitlines() == ["variant b failed; continuing with the other variants."]


def test_json_lines_are_one_object_per_event_ending_in_the_verdict(capsys):
    console, out = _console()
    reporter = JsonLinesReporter(console)
    _tell(reporter)
    reporter.console.print("a progress bar")
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["event"] for line in lines] == ["step", "info", "info", "note", "warning", "failure", "verdict"]
    assert lines[0] == {"event": "step", "text": "run r1 -> /tmp/r1", "run_id": "r1"}
    assert lines[2]["text"] == "[not markup] kept as is"
    assert lines[5]["variant"] == "b"
    assert lines[-1] == {"event": "verdict", "text": "", "status": "DIVERGENT", "exit_code": 1, "where": "/tmp/r1"}
    assert "a progress bar" in captured.err and out.getvalue() == ""


def test_an_event_without_markup_has_its_text_as_given():
    assert Event(EventKind.INFO, "[b]x[/b]").text == "x"
    assert Event(EventKind.INFO, "[b]x[/b]", plain=True).text == "[b]x[/b]"


def _answer(reporter: Reporter) -> None:
    """A command's answer: a line of its own, then a table of two rows."""
    reporter.info("[dim]reading the history[/]")
    reporter.record("[bold]run[/] r1 (\\[escaped])", run_id="r1", where=Path("/tmp/r1"))
    table = Table("run id", "status")
    table.add_row("r1", "ok")
    table.add_row("r2", "failed")
    reporter.table(table, [{"run_id": "r1", "status": "ok"}, {"run_id": "r2", "status": "failed"}])
    reporter.verdict("OK", 0)


def test_a_command_s_answer_is_shown_by_the_terminal_and_the_quiet_reporter_alike():
    shown = []
    for make in (TerminalReporter, QuietReporter):
        console, out = _console()
        _answer(make(console))
        shown.append(out.getvalue().splitlines())
    terminal, quiet = shown
    assert terminal[:2] == ["reading the history", "run r1 ([escaped])"] and "r2" in terminal[-2]
    # quiet leaves out the progress, never the answer: the record and the whole table
    assert quiet == terminal[1:] + ["OK (exit 0)"]


def test_json_lines_carry_a_record_per_row_and_the_table_goes_to_stderr(capsys):
    console, out = _console()
    _answer(JsonLinesReporter(console))
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["event"] for line in lines] == ["info", "record", "record", "record", "verdict"]
    assert lines[1] == {"event": "record", "text": "run r1 ([escaped])", "run_id": "r1", "where": "/tmp/r1"}
    assert lines[2:4] == [{"event": "record", "text": "", "run_id": "r1", "status": "ok"},
                          {"event": "record", "text": "", "run_id": "r2", "status": "failed"}]
    assert "r2" in captured.err and "failed" in captured.err and out.getvalue() == ""
