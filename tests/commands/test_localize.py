"""evalpipe/commands/localize.py: `evalpipe localize`'s options checked as the config's
`localize:` section is, a path that is no run directory refused before anything is locked
or written, and `localize: auto` after a run that left nothing to localize doing nothing."""

from __future__ import annotations

import io

import pytest
from plans import fake_plan
from rich.console import Console

from evalpipe.commands.localize import localize_after_run, localize_command
from evalpipe.errors import UserError
from evalpipe.pipeline.runner import execute
from evalpipe.reporting import TerminalReporter


def _reporter() -> TerminalReporter:
    return TerminalReporter(Console(file=io.StringIO(), width=200))


def test_options_are_checked_as_the_config_checks_them(tmp_path):
    with pytest.raises(UserError, match="--samples"):
        localize_command(tmp_path, _reporter(), samples=0)
    with pytest.raises(UserError, match="--decode-steps"):
        localize_command(tmp_path, _reporter(), decode_steps=-1)


def test_a_path_that_is_no_run_directory_is_refused_and_left_alone(tmp_path):
    with pytest.raises(UserError, match="is not a run directory \\(no run.json\\)"):
        localize_command(tmp_path, _reporter())
    assert list(tmp_path.iterdir()) == []


def test_auto_after_a_run_without_a_divergent_variant_does_nothing(tmp_path):
    localize_after_run(tmp_path, _reporter())  # not compared: no compare.json, nothing to do
    plan = fake_plan(tmp_path, {"a": {}, "b": {}}, "same")
    assert execute(plan, _reporter(), record=False).document.verdict != "DIVERGENT"
    assert (plan.run_dir / "compare.json").is_file()
    out = io.StringIO()
    localize_after_run(plan.run_dir, TerminalReporter(Console(file=out, width=200)))
    assert not (plan.run_dir / "localize.json").exists() and out.getvalue() == ""
