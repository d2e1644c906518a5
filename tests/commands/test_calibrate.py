"""The calibration run's plan and its table (the run itself is an end-to-end matter)."""

from pathlib import Path

import pytest

from evalpipe.commands.calibrate import calibration_config, control_variants, zoo
from evalpipe.compare.calibration import CalibrationRow, SensitivityPoint
from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import parse_config
from evalpipe.documents.run_doc import RunDocument
from evalpipe.lab.layout.faults import FAULT_ENV, FAULTS
from evalpipe.report.calibration import render_calibration, sensitivity_plot

BASE = {
    "model": {"path": "builtin:tiny-gsm"},
    "engine": {"hf_overrides": {"architectures": ["EvalpipeLayoutForCausalLM"], "layout_tp": 4}},
    "variants": {
        "legacy": {"env": {"EVALPIPE_LAYOUT": "legacy"},
                   "expect": {"called": ["evalpipe.lab.layout.model.LayoutDecoderLayer._legacy_attention"]}},
        "sp": {"env": {"EVALPIPE_LAYOUT": "sp"}, "expect": {"called": ["evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention"]}},
    },
    "reference": "legacy",
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
}


def test_every_runnable_fault_becomes_a_variant_with_its_expectation():
    faults = zoo()
    assert faults and all(not f.raises for f in faults)
    assert {f.name for f in faults} == {n for n, f in FAULTS.items() if not (f.raises or f.hangs)}
    config, expected = calibration_config(parse_config(BASE), faults)
    assert list(config.variants)[:4] == ["legacy", "sp", "legacy-aa2", "legacy-threads2"]
    assert expected["sp"][0] == "benign" and "legacy" not in expected
    for f in faults:
        v = config.variants[f"fault-{f.name}"]
        assert v.env == {"EVALPIPE_LAYOUT": "sp" if f.layout == "any" else f.layout, FAULT_ENV: f.name}
        kind = "fallback" if f.falls_back else "graded" if f.magnitude is not None else "harmful" if f.harmful else "benign"
        assert expected[f"fault-{f.name}"] == (kind, f.doc)
        # a fault is a bug on its layout's path: it declares that path's expectations
        assert v.expect == config.variants[v.env["EVALPIPE_LAYOUT"]].expect
        scale = (v.engine.get("hf_overrides") or {}).get("layout_out_scale")
        assert scale == (f.out_scale if f.needs_scale else None)
        assert not f.needs_scale or scale > 1
    assert any(f.harmful for f in faults) and any(not f.harmful for f in faults)
    assert "fault-sp_fallback" in config.variants, "the silent fallback is part of the zoo"
    # the engine controls repeat the reference's path: A/A pairs by declaration
    for control in ("legacy-aa2", "legacy-threads2"):
        assert config.variant_expect(control) == config.variant_expect("legacy").model_copy(update={"same_path": True})


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
    info = RunDocument(run_id="cal", hardware={"cpus": 2, "machine": "x86_64", "system": "Linux"}, versions={"vllm": "0.32.0"})
    text = render_calibration(rows, info, command="evalpipe calibrate --limit 100", seconds=600, run_dir=Path("x"))
    assert "`evalpipe calibrate --limit 100` (10 min" in text and "2 CPUs, x86_64" in text and "vllm 0.32.0" in text
    assert "**Harmful caught: 1/1. Benign kept clean: 1/1.**" in text
    assert "| fault-x | harmful | DIVERGENT | caught | \u22120.020 [\u22120.050, +0.010] | 0.3 | teacher-forced (teacher\\_kl\\_max) | 3 |" in text
    assert "a &lt;bad&gt; \\| bug" in text, "docs are escaped"


def test_engine_controls_are_the_reference_with_another_batch_arrangement_and_two_threads():
    cfg = parse_config({**BASE, "engine": {**BASE["engine"], "max_num_seqs": 64}})
    controls = control_variants(cfg)
    aa2, threads = (controls[n][0] for n in ("legacy-aa2", "legacy-threads2"))
    assert aa2.env == {"EVALPIPE_LAYOUT": "legacy"} and aa2.engine == {"max_num_seqs": 16}
    assert threads.env == {"EVALPIPE_LAYOUT": "legacy", "OMP_NUM_THREADS": "2"} and threads.engine == {}
    _, expected = calibration_config(cfg, [])
    assert expected["legacy-aa2"][0] == expected["legacy-threads2"][0] == "benign"
    clash = {**BASE, "variants": {**BASE["variants"], "legacy-aa2": {}}}
    with pytest.raises(ConfigError, match="already has a variant `legacy-aa2`"):
        calibration_config(parse_config(clash), [])


def _point(m, n, families, status="DIVERGENT", ratio=2.0, significant=True):
    return SensitivityPoint(f"fault-attn_out_error_{m:g}", m, n, status, families, (),
                            {"teacher_kl_max": ratio, "teacher_kl_shift": ratio / 2}, {"teacher_kl_shift": significant})


def test_sensitivity_and_false_alarm_sections_and_the_plot():
    rows = [CalibrationRow("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 100, None, "")]
    points = [
        _point(1e-2, 100, ("teacher-forced", "distributional")), _point(1e-2, 600, ("teacher-forced", "distributional")),
        _point(1e-3, 100, (), "EQUIVALENT", 0.5, False), _point(1e-3, 600, ("teacher-forced",)),
        _point(1e-4, 100, (), "EQUIVALENT", 0.01, False), _point(1e-4, 600, (), "EQUIVALENT", 0.05, False),
    ]
    firing = {"aa_pairs": {"teacher_kl_max": (0, 2)}, "benign": {"teacher_kl_max": (1, 5), "free_kl_max": (0, 0)}}
    text = render_calibration(rows, RunDocument(run_id="c"), command="evalpipe calibrate", seconds=60, run_dir=Path("x"),
                              sensitivity=points, firing=firing, plot="calibration-sensitivity.png")
    assert "| 1e-3 | EQUIVALENT | — | DIVERGENT | teacher-forced |" in text
    assert "| teacher-forced | 1e-2 | 1e-3 |" in text and "| distributional | 1e-2 | 1e-2 |" in text
    assert "| scores | — | — |" in text
    assert "| teacher\\_kl\\_max | 0/2 | 1/5 |" in text and "| free\\_kl\\_max | — | — |" in text
    assert "![measured / threshold per gate against \u03b5](calibration-sensitivity.png)" in text
    png = sensitivity_plot(points)
    assert png.startswith(b"\x89PNG") and png == sensitivity_plot(points), "same points, same bytes"
