"""evalpipe/pipeline/localizing.py, what it checks before any engine starts, on a run made on
the fake engine (a localization itself, on the fake engine, is in
tests/pipeline/test_runs_on_the_fake_engine.py; on vLLM, tests/e2e/test_localize.py): a
directory that is no run, a variant that was not compared (the reference among them), and
an endpoint-mode variant whose server evalpipe cannot put capture points into, each refused
in one sentence naming what to give instead."""

from __future__ import annotations

import io

import pytest
from plans import fake_plan
from rich.console import Console

from evalpipe.errors import UserError
from evalpipe.pipeline.localizing import Request, localize_run
from evalpipe.pipeline.runner import execute
from evalpipe.reporting import TerminalReporter
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


def _reporter() -> TerminalReporter:
    return TerminalReporter(Console(file=io.StringIO(), width=200))


@pytest.fixture(scope="module")
def divergent_run(tmp_path_factory):
    plan = fake_plan(tmp_path_factory.mktemp("localizing"), {"a": {}, "b": {"env": {FAKE_ENGINE_ENV: "diverge=2"}}}, "ab")
    assert execute(plan, _reporter(), record=False).document.verdict == "DIVERGENT"
    return plan.run_dir


def test_a_directory_that_is_no_run_is_refused(tmp_path):
    with pytest.raises(UserError, match="is not a run directory"):
        localize_run(tmp_path, _reporter())


@pytest.mark.parametrize("variant", ["zzz", "a"])
def test_only_a_compared_variant_can_be_localized(divergent_run, variant):
    with pytest.raises(UserError, match=rf"--variant {variant}: not a variant compared in .* choose one of: b\."):
        localize_run(divergent_run, _reporter(), Request((variant,)))
    assert not (divergent_run / "localize.json").exists()
