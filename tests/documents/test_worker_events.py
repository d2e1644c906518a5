"""The worker's events (evalpipe/documents/worker_events.py): one line per event, read back
as the same typed event; a line of before the typed stream reads as version 1, an event
this evalpipe does not read becomes an error event that says so, a stray print is ignored,
and the worker cannot send a field an event lacks."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError


def test_worker_events_round_trip_as_one_line_each():
    from evalpipe.documents.worker_events import ErrorEvent, ProgressEvent, event_line, make_event, read_event

    progress = make_event("progress", task="gsm8k", phase="generate", done=3, total=8)
    line = event_line(progress)
    assert line.endswith("\n") and line.count("\n") == 1 and json.loads(line)["v"] == 1
    assert read_event(line) == progress and isinstance(progress, ProgressEvent)
    error = make_event("error", kind="user", message="bad task")
    assert read_event(event_line(error)) == ErrorEvent(kind="user", message="bad task")


def test_a_worker_event_of_before_the_typed_stream_is_read_as_version_1():
    from evalpipe.documents.worker_events import StageEvent, read_event

    assert read_event('{"event": "stage", "stage": "engine_ready", "message": "ready"}') == StageEvent(stage="engine_ready", message="ready")


def test_an_event_this_evalpipe_does_not_read_is_said_and_a_stray_print_ignored():
    from evalpipe.documents.worker_events import ErrorEvent, read_event

    assert read_event("loading weights 50%") is None and read_event("[1, 2]") is None
    odd = read_event('{"v": 2, "event": "progress", "task": "t", "phase": "p", "done": 1, "total": 2}')
    assert isinstance(odd, ErrorEvent) and "does not read" in odd.message and "same evalpipe" in odd.message
    unknown = read_event('{"event": "celebrate"}')
    assert isinstance(unknown, ErrorEvent) and "celebrate" in unknown.message


def test_the_worker_cannot_send_a_field_the_event_lacks():
    from evalpipe.documents.worker_events import make_event

    with pytest.raises(ValidationError):
        make_event("done", seconds=1.0, extra="x")
