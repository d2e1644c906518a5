"""evalpipe/pipeline/runner.py: execute() returns what the run ended as (its directory, its
run.json as saved, its exit code), and raises for a run that failed. The fake engine does
the work (the real one: tests/e2e/test_run.py)."""

from __future__ import annotations

import io

from plans import fake_plan
from rich.console import Console

from evalpipe.documents.run_doc import read_run_document
from evalpipe.errors import ExitCode
from evalpipe.pipeline.runner import execute
from evalpipe.process_table import RUN_ID_ENV
from evalpipe.reporting import TerminalReporter
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


def test_a_compared_run_returns_its_verdict_its_document_and_its_exit_code(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {"env": {FAKE_ENGINE_ENV: "diverge=2"}}}, "ab")
    result = execute(plan, TerminalReporter(Console(file=io.StringIO())), record=False)
    assert result.run_dir == plan.run_dir and result.exit_code == ExitCode.DIVERGENT
    assert result.document.verdict == "DIVERGENT" and result.document.status == "ok"
    assert result.document == read_run_document(plan.run_dir), "the document returned is the one saved"


def test_a_run_that_compared_nothing_returns_inconclusive(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}}, "alone")
    out = io.StringIO()
    result = execute(plan, TerminalReporter(Console(file=out, width=200)), record=False)
    assert result.exit_code == ExitCode.INCONCLUSIVE and result.document.verdict is None
    assert "nothing was compared" in out.getvalue()


def test_a_run_compared_elsewhere_says_nothing_of_its_own_and_ends_ok(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}}, "step")
    out = io.StringIO()
    reporter = TerminalReporter(Console(file=out, width=200))
    result = execute(plan, reporter, record=False, compared_elsewhere=True)
    assert result.exit_code == ExitCode.OK and result.document.status == "ok"
    assert "nothing was compared" not in out.getvalue() and not reporter.ended, "bisect compares it and tells the verdict"


def test_a_cluster_that_cannot_be_reached_leaves_no_run_and_no_history_behind(tmp_path):
    import socket

    import pytest

    from evalpipe.cluster.session import ClusterUnavailable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    plan = fake_plan(tmp_path, {"a": {}, "b": {}}, "unreachable", cluster={"address": f"127.0.0.1:{port}"})
    with pytest.raises(ClusterUnavailable, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        execute(plan, TerminalReporter(Console(file=io.StringIO())))
    assert list(tmp_path.rglob("*")) == [], "no run directory, no history"


class _Recording:
    """A starter that keeps the commands as they are and remembers who asked."""

    def __init__(self) -> None:
        self.marks: list[str] = []
        self.closed = False

    def command(self, python: str, command: list[str], env: dict[str, str]) -> list[str]:
        self.marks.append(env[RUN_ID_ENV])
        return command

    def close(self) -> None:
        self.closed = True


def test_a_starter_kept_by_the_caller_starts_every_worker_and_outlives_the_run(tmp_path):
    from evalpipe.pipeline.plan import make_plan

    plan = fake_plan(tmp_path, {"a": {}, "b": {}}, "kept")
    plan = make_plan(plan.config, "cfg.yaml", "gsm8k", limit=4, output=str(tmp_path / "runs"), run_id="kept",
                     process_mark="bisect-x")
    starter = _Recording()
    execute(plan, TerminalReporter(Console(file=io.StringIO())), record=False, starter=starter)  # type: ignore[arg-type]
    assert starter.marks == ["bisect-x", "bisect-x"] and not starter.closed
