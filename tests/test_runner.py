"""evalpipe/pipeline/runner.py: execute() returns what the run ended as (its directory, its
run.json as saved, its exit code), and raises for a run that failed. The fake engine does
the work (the real one: tests/test_e2e_run.py)."""

from __future__ import annotations

import io

from rich.console import Console

from evalpipe.config.loading import parse_config
from evalpipe.documents.run_doc import read_run_document
from evalpipe.errors import ExitCode
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.reporting import TerminalReporter
from evalpipe.worker.fake_engine import FAKE_ENGINE_ENV


def _plan(tmp_path, variants: dict, run_id: str):
    cfg = parse_config({"model": {"path": "builtin:tiny-gsm"}, "engine": {"max_model_len": 4096, "seed": 0},
                        "env": {FAKE_ENGINE_ENV: "1"}, "noise_floor": False, "variants": variants,
                        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]}})
    return make_plan(cfg, "cfg.yaml", "gsm8k", limit=4, output=str(tmp_path / "runs"), run_id=run_id)


def test_a_compared_run_returns_its_verdict_its_document_and_its_exit_code(tmp_path):
    plan = _plan(tmp_path, {"a": {}, "b": {"env": {FAKE_ENGINE_ENV: "diverge=2"}}}, "ab")
    result = execute(plan, TerminalReporter(Console(file=io.StringIO())), record=False)
    assert result.run_dir == plan.run_dir and result.exit_code == ExitCode.DIVERGENT
    assert result.document.verdict == "DIVERGENT" and result.document.status == "ok"
    assert result.document == read_run_document(plan.run_dir), "the document returned is the one saved"


def test_a_run_that_compared_nothing_returns_inconclusive(tmp_path):
    plan = _plan(tmp_path, {"a": {}}, "alone")
    out = io.StringIO()
    result = execute(plan, TerminalReporter(Console(file=out, width=200)), record=False)
    assert result.exit_code == ExitCode.INCONCLUSIVE and result.document.verdict is None
    assert "nothing was compared" in out.getvalue()
