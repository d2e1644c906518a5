"""The calibration run's plan and its table (the run itself is an end-to-end matter)."""

from pathlib import Path

import pytest

from evalpipe.calibrate import calibration_config, zoo
from evalpipe.compare.calibration import CalibrationRow
from evalpipe.config import ConfigError, parse_config
from evalpipe.layout.faults import FAULT_ENV, FAULTS
from evalpipe.report.calibration import render_calibration

BASE = {
    "model": {"path": "builtin:tiny-gsm"},
    "engine": {"hf_overrides": {"architectures": ["EvalpipeLayoutForCausalLM"], "layout_tp": 4}},
    "variants": {"legacy": {"env": {"EVALPIPE_LAYOUT": "legacy"}}, "sp": {"env": {"EVALPIPE_LAYOUT": "sp"}}},
    "reference": "legacy",
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
}


def test_every_runnable_fault_becomes_a_variant_with_its_expectation():
    faults = zoo()
    assert faults and all(not f.raises for f in faults)
    assert {f.name for f in faults} == {n for n, f in FAULTS.items() if not f.raises}
    config, expected = calibration_config(parse_config(BASE), faults)
    assert list(config.variants)[:2] == ["legacy", "sp"]
    assert expected["sp"][0] == "benign" and "legacy" not in expected
    for f in faults:
        v = config.variants[f"fault-{f.name}"]
        assert v.env == {"EVALPIPE_LAYOUT": f.layout, FAULT_ENV: f.name}
        assert expected[f"fault-{f.name}"] == ("harmful" if f.harmful else "benign", f.doc)
        scale = (v.engine.get("hf_overrides") or {}).get("layout_out_scale")
        assert scale == (f.out_scale if f.needs_scale else None)
        assert not f.needs_scale or scale > 1
    assert any(f.harmful for f in faults) and any(not f.harmful for f in faults)


def test_unknown_fault_and_name_collision_are_config_errors():
    with pytest.raises(ConfigError, match="unknown fault `nope`; known: "):
        zoo(["nope"])
    name = next(iter(zoo())).name
    clash = {**BASE, "variants": {**BASE["variants"], f"fault-{name}": {}}}
    with pytest.raises(ConfigError, match=f"already has a variant `fault-{name}`"):
        calibration_config(parse_config(clash), zoo([name]))


def test_table_states_command_machine_and_outcomes():
    rows = [
        CalibrationRow("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "exact_match,strict-match", 0.0, 0.0, 0.0, 1.0, 100, None, "pass-through"),
        CalibrationRow("fault-x", "harmful", "DIVERGENT", "caught", ("teacher-forced",), ("teacher_kl_max",), "t",
                       "exact_match,strict-match", -0.02, -0.05, 0.01, 0.3, 100, 3, "a <bad> | bug"),
    ]
    info = {"run_id": "cal", "hardware": {"cpus": 2, "machine": "x86_64", "system": "Linux"}, "versions": {"vllm": "0.32.0"}}
    text = render_calibration(rows, info, command="evalpipe calibrate --limit 100", seconds=600, run_dir=Path("x"))
    assert "`evalpipe calibrate --limit 100` (10 min" in text and "2 CPUs, x86_64" in text and "vllm 0.32.0" in text
    assert "**Harmful caught: 1/1. Benign kept clean: 1/1.**" in text
    assert "| fault-x | harmful | DIVERGENT | caught | \u22120.020 [\u22120.050, +0.010] | 0.3 | teacher-forced (teacher\\_kl\\_max) | 3 |" in text
    assert "a &lt;bad&gt; \\| bug" in text, "docs are escaped"
