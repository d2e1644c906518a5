"""A run plan of the built-in model on the fake engine (no engine starts while planning):
the plan the tests of evalpipe/pipeline/ hand to the module under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalpipe.config.loading import parse_config
from evalpipe.pipeline.plan import RunPlan, make_plan
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


def fake_plan(tmp_path: Path, variants: dict, run_id: str, **config: Any) -> RunPlan:
    """gsm8k_synth_4shot (--limit 4) with ``variants``, the first the reference, in
    tmp_path/runs/``run_id``; ``config``: further top-level keys of the config."""
    cfg = parse_config({"model": {"path": "builtin:tiny-gsm"}, "engine": {"max_model_len": 4096, "seed": 0},
                        "env": {FAKE_ENGINE_ENV: "1"}, "noise_floor": False, "variants": variants,
                        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]}, **config})
    return make_plan(cfg, "cfg.yaml", "gsm8k", limit=4, output=str(tmp_path / "runs"), run_id=run_id)
