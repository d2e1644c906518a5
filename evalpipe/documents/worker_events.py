"""The worker's events: one JSON object per line on the worker's stdout, read by the parent
(evalpipe.execution.launch: the variant's error and the watchdog; evalpipe.report.progress: what
the terminal shows).

The worker may run another evalpipe than the parent (a variant's own Python environment),
so every line says its version (`v`); a line without one comes from a worker of before
the typed stream, whose events had the same fields, and is read as version 1. A line that
is JSON but no event this evalpipe reads becomes an error event that says so, instead of
vanishing; a line that is not JSON at all is a stray print (engine.log has the rest).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal, Union

from pydantic import Field, TypeAdapter, ValidationError

from evalpipe.documents.base import Document
from evalpipe.validation import first_problem

EVENTS_VERSION: Final = 1


class StageEvent(Document):
    v: Literal[1] = EVENTS_VERSION
    event: Literal["stage"] = "stage"
    stage: str  # tasks, engine, engine_ready, task, teacher, teacher_done, server, warning
    message: str = ""
    task: str | None = None


class ProgressEvent(Document):
    v: Literal[1] = EVENTS_VERSION
    event: Literal["progress"] = "progress"
    task: str
    phase: str  # generate, loglikelihood, teacher, ...
    done: int
    total: int


class TaskDoneEvent(Document):
    v: Literal[1] = EVENTS_VERSION
    event: Literal["task_done"] = "task_done"
    task: str
    metrics: dict[str, Any] = {}
    seconds: float = 0.0
    n: int = 0


class ErrorEvent(Document):
    v: Literal[1] = EVENTS_VERSION
    event: Literal["error"] = "error"
    kind: Literal["user", "engine", "run"] = "run"  # user: the input's fault (exit 2); else the run's
    message: str


class DoneEvent(Document):
    v: Literal[1] = EVENTS_VERSION
    event: Literal["done"] = "done"
    seconds: float = 0.0


WorkerEvent = Annotated[Union[StageEvent, ProgressEvent, TaskDoneEvent, ErrorEvent, DoneEvent], Field(discriminator="event")]
_EVENT: TypeAdapter[WorkerEvent] = TypeAdapter(WorkerEvent)


def event_line(event: WorkerEvent) -> str:
    """The one line the worker writes for ``event`` (None fields left out)."""
    return event.model_dump_json(exclude_none=True) + "\n"


def make_event(event: str, /, **fields: Any) -> WorkerEvent:
    """The worker's ``event`` with ``fields``; a field the event does not have is a bug of
    the worker, raised here rather than sent."""
    return _EVENT.validate_python({"event": event, **fields})


def read_event(line: str) -> WorkerEvent | None:
    """The event on ``line``; None for a line that is not a JSON object (a stray print)."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    raw.setdefault("v", EVENTS_VERSION)  # a worker of before the typed stream: the same fields
    try:
        return _EVENT.validate_python(raw)
    except ValidationError as err:
        where, what = first_problem(err)
        return ErrorEvent(kind="run", message=f"the worker sent an event this evalpipe does not read ({where}: {what}): "
                                                f"{line.strip()[:200]}; run the variant with the same evalpipe as the parent")
