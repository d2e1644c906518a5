"""The calibration run's plan (its table: tests/report/test_calibration.py; the run itself is an
end-to-end matter)."""


import pytest

from evalpipe.commands.calibrate import calibration_config, control_variants, zoo
from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import parse_config
from evalpipe.lab.layout.faults import FAULT_ENV, FAULTS

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


def test_a_sampled_zoo_run_is_asked_for_on_the_command_line_of_a_greedy_config(tmp_path):
    import io

    import yaml
    from rich.console import Console

    from evalpipe.commands.calibrate import run_calibration
    from evalpipe.reporting import QuietReporter

    greedy, sampled = tmp_path / "greedy.yaml", tmp_path / "sampled.yaml"
    greedy.write_text(yaml.safe_dump(BASE))
    sampled.write_text(yaml.safe_dump({**BASE, "sampling": {"temperature": 0.6}}))
    reporter = QuietReporter(Console(file=io.StringIO()))
    with pytest.raises(ConfigError, match="samples already; calibrate a greedy config"):
        run_calibration(sampled, 2, None, tmp_path / "t.md", reporter)
    for temperature, samples, says in [(0.0, None, "--temperature 0: 0 is below 1e-05, where vLLM decodes greedily"),
                                       (11.0, None, "--temperature 11: Input should be less than or equal to 10"),
                                       (0.6, 0, "--samples 0: Input should be greater than or equal to 1"),
                                       (None, 4, "--samples 4 applies to the sampled run, which --temperature asks for")]:
        with pytest.raises(ConfigError, match=says):
            run_calibration(greedy, 2, None, tmp_path / "t.md", reporter, temperature=temperature, samples=samples)
    assert not (tmp_path / "t.md").exists()


def test_a_task_group_the_config_lacks_is_refused_naming_its_groups(tmp_path):
    import io

    import yaml
    from rich.console import Console

    from evalpipe.commands.calibrate import run_calibration
    from evalpipe.reporting import QuietReporter

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError, match=r"--tasks scenarios: .* has no such task group; its groups are gsm8k\."):
        run_calibration(path, 2, None, tmp_path / "t.md", QuietReporter(Console(file=io.StringIO())), task_group="scenarios")
    assert not (tmp_path / "t.md").exists()


def test_the_zoo_run_its_localization_and_its_sampled_run_fork_from_one_starter_with_the_zoo_run_s_mark(tmp_path, monkeypatch):
    """A server forks only for processes of its own mark: every phase's processes carry the zoo
    run's, so torch and its kin are imported once per calibration, not once per phase."""
    import io
    from pathlib import Path

    from rich.console import Console

    from evalpipe.commands import calibrate as command
    from evalpipe.documents.run_doc import RunDocument
    from evalpipe.execution.preimport import Preimport
    from evalpipe.process_table import RUN_ID_ENV
    from evalpipe.reporting import QuietReporter

    config, expected = calibration_config(parse_config(BASE), zoo(["double_reduce"]))
    reporter = QuietReporter(Console(file=io.StringIO()))
    started, localized = [], []

    class Ran:
        document = RunDocument()

    monkeypatch.setattr(command, "execute", lambda plan, rep, **kw: started.append((plan, kw["starter"])) or Ran())
    monkeypatch.setattr(command, "localize_run", lambda run_dir, rep, request, **kw: localized.append(kw["starter"]) or [])
    with Preimport() as shared:
        run_dir, _, _ = command._zoo_run(config, Path("cfg.yaml"), "gsm8k", 2, tmp_path, "zoo", None, reporter, shared)
        command._localized([], run_dir, {}, reporter, again=True, starter=shared)
        sampled = config.model_copy(update={"sampling": command._sampled_settings(0.6, 2)})
        command._sampled_run(sampled, Path("cfg.yaml"), "gsm8k", 2, tmp_path, "zoo-sampled", expected, reporter, shared,
                             mark=run_dir.name)
    assert [plan.run_id for plan, _ in started] == ["zoo", "zoo-sampled"] and run_dir.name == "zoo"
    assert all(starter is shared for _, starter in started) and localized == [shared]
    marks = {v.process_env()[RUN_ID_ENV] for plan, _ in started for v in plan.variants}
    assert marks == {"zoo"}, "the sampled run's own mark would start a second server"
