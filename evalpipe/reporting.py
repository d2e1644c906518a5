"""How the pipeline tells what it does: one Reporter interface, three ways to show it.

The pipeline (pipeline/, nightly/, commands/) never prints: it hands a typed :class:`Event`
to its :class:`Reporter`. The reporters are one table, :data:`REPORTERS`, which the CLI's
``--progress`` option names:

- ``terminal``: today's rich lines (the event's markup, as before);
- ``quiet``: only failures, what a command answers (its records) and the final verdict;
- ``jsonl``: one JSON object per event on stdout, for CI (``{"event": ..., "text": ...}``
  and the event's fields); what the rich renderers draw (progress bars, the summary
  tables) goes to stderr so stdout stays JSON lines.

Renderers that draw more than a line (report/ tables, progress bars) write to
:attr:`Reporter.console`, which each reporter chooses. A command whose answer is a table
(`history list`, the dry-run plan, the calibration table) hands it to :meth:`Reporter.table`
with the rows as records: a person reads the table, a machine reads one record per row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from rich.console import Console, RenderableType
from rich.text import Text


class EventKind(str, Enum):
    STEP = "step"  # a stage begins: the run, a variant, the model, the cluster
    INFO = "info"  # a line about the progress (a path written, a history recorded)
    NOTE = "note"  # something the user may want to know (a plan's note)
    WARNING = "warning"  # something went wrong that does not cost the run
    FAILURE = "failure"  # something failed (a variant, tonight's run)
    RECORD = "record"  # one item of a command's answer: a row of its table, a file written, a check, a version
    VERDICT = "verdict"  # the run's (or night's) outcome: its status and exit code


@dataclass(frozen=True)
class Event:
    """One thing to tell. ``markup``: the rich text the terminal shows (``plain``: the
    text printed as is, no markup); ``fields``: what a machine reads (JSON lines)."""

    kind: EventKind
    markup: str
    plain: bool = False
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The text without its markup."""
        return self.markup if self.plain else Text.from_markup(self.markup).plain

    def as_json(self) -> dict[str, Any]:
        return {"event": self.kind.value, "text": self.text, **self.fields}


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


class Reporter:
    """Where the pipeline's events go. Subclasses decide :meth:`emit` and :attr:`console`."""

    console: Console
    ended = False  # a verdict was told: the command's outcome is known

    def emit(self, event: Event) -> None:
        raise NotImplementedError

    def step(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        self.emit(Event(EventKind.STEP, markup, plain, fields))

    def info(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        self.emit(Event(EventKind.INFO, markup, plain, fields))

    def note(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        self.emit(Event(EventKind.NOTE, markup, plain, fields))

    def warning(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        self.emit(Event(EventKind.WARNING, markup, plain, fields))

    def failure(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        self.emit(Event(EventKind.FAILURE, markup, plain, fields))

    def record(self, markup: str, *, plain: bool = False, **fields: Any) -> None:
        """One item of the command's answer, as a line and as fields."""
        self.emit(Event(EventKind.RECORD, markup, plain, {k: _jsonable(v) for k, v in fields.items()}))

    def table(self, table: RenderableType, rows: list[dict[str, Any]]) -> None:
        """A command's answer as a table: drawn for a reader, each row a record (without a
        line of its own: the table is the rows' text)."""
        self.draw(table)
        for row in rows:
            self.record("", **row)

    def draw(self, renderable: RenderableType) -> None:
        """What takes more than a line (a table): on :attr:`console`."""
        self.console.print(renderable)

    def verdict(self, status: str | None, exit_code: int, where: Path | None = None, markup: str = "") -> None:
        """The outcome. ``markup``: the terminal's line for it ("" when a renderer already
        drew it, as the comparison's summary does)."""
        self.ended = True
        self.emit(Event(EventKind.VERDICT, markup, fields={"status": status, "exit_code": int(exit_code),
                                                           "where": _jsonable(where)}))


class TerminalReporter(Reporter):
    """Each event's markup as a line of the console (the verdict: only when it has one)."""

    def __init__(self, console: Console):
        self.console = console

    def emit(self, event: Event) -> None:
        if event.markup:
            self.console.print(event.markup, soft_wrap=True, markup=not event.plain)


class QuietReporter(Reporter):
    """Failures (on stderr), what the command answers (its records and tables) and the
    verdict's one line; nothing of the progress."""

    SHOWN = (EventKind.FAILURE, EventKind.VERDICT)

    def __init__(self, console: Console):
        self.out = console
        self.console = Console(quiet=True)

    def emit(self, event: Event) -> None:
        if event.kind is EventKind.VERDICT:
            status, code, where = (event.fields.get(k) for k in ("status", "exit_code", "where"))
            self.out.print(f"{status or 'no verdict'} (exit {code})" + (f" {where}" if where else ""),
                           markup=False, soft_wrap=True)
        elif event.kind is EventKind.RECORD:
            if event.markup:
                self.out.print(event.markup, soft_wrap=True, markup=not event.plain)
        elif event.kind in self.SHOWN:
            print(event.text, file=sys.stderr, flush=True)

    def draw(self, renderable: RenderableType) -> None:
        self.out.print(renderable)  # an answer, not progress


class JsonLinesReporter(Reporter):
    """One JSON object per event on stdout; the rich renderers' output on stderr."""

    def __init__(self, console: Console, stream: IO[str] | None = None):
        self.stream = stream
        self.console = Console(stderr=True, highlight=False, width=console.width)

    def emit(self, event: Event) -> None:
        out = self.stream or sys.stdout
        if event.kind is EventKind.VERDICT and event.markup:
            self.console.print(event.markup, soft_wrap=True, markup=not event.plain)  # the line a reader looks for
        out.write(json.dumps(event.as_json(), default=str) + "\n")
        out.flush()


# The reporters by the name --progress gives: the one table the CLI and its help read.
REPORTERS: dict[str, Callable[[Console], Reporter]] = {
    "terminal": TerminalReporter,
    "quiet": QuietReporter,
    "jsonl": JsonLinesReporter,
}
