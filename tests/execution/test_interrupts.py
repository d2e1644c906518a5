"""A Ctrl-C is remembered, not only raised: the run loops stop on it even when the
KeyboardInterrupt itself was raised where Python swallows exceptions (a finalizer)."""

import signal

import pytest

from evalpipe import cli
from evalpipe.execution import launch


def test_the_handlers_record_the_signal_and_raise(monkeypatch):
    monkeypatch.setattr(launch, "interrupts", [])
    monkeypatch.setattr(cli, "_terminated", [])
    launch.stop_if_interrupted()  # nothing requested: nothing happens
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
    assert launch.interrupts == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        cli._terminate_as_interrupt(signal.SIGTERM, None)
    assert launch.interrupts == [signal.SIGINT, signal.SIGTERM] and cli._terminated == [signal.SIGTERM]


def test_a_swallowed_interrupt_still_stops_the_next_check(monkeypatch):
    monkeypatch.setattr(launch, "interrupts", [])

    class Finalizer:
        def __del__(self):
            cli._interrupt(signal.SIGINT, None)  # Python prints "Exception ignored" and goes on

    Finalizer()
    with pytest.raises(KeyboardInterrupt):
        launch.stop_if_interrupted()


def test_an_interrupted_run_says_so_in_run_json(tmp_path, monkeypatch):
    import json
    import signal

    from evalpipe.execution import launch
    from evalpipe.pipeline.bookkeeping import mark_interrupted
    from evalpipe.rundir import artifacts

    run_json = tmp_path / "run.json"
    artifacts.write_json(run_json, {"status": "running", "variant_status": {"a": {"exit_code": 0}, "b": {"exit_code": 3}}})
    monkeypatch.setattr(launch, "interrupts", [signal.SIGTERM])
    mark_interrupted(tmp_path)
    info = json.loads(run_json.read_text())
    assert info["status"] == "interrupted" and info["interrupted_by"] == "SIGTERM" and info["finished_variants"] == ["a"]
    artifacts.write_json(run_json, {"status": "failed"})
    mark_interrupted(tmp_path)  # a run that had already ended keeps its status
    assert json.loads(run_json.read_text())["status"] == "failed"
