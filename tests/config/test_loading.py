from pathlib import Path

import pytest

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import load_config, parse_config
from evalpipe.config.merge import deep_merge
from evalpipe.install import default_config

MINIMAL = {
    "model": {"path": "builtin:tiny-gsm"},
    "variants": {"a": {}, "b": {"env": {"X": 1}}},
    "tasks": {"gsm8k": {"task": "gsm8k_synth_4shot", "num_fewshot": 4}},
}


def test_shipped_configs_parse():
    for path in sorted((default_config().parent).glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.variants, path


def test_default_config_is_the_embedded_cpu_default():
    cfg = load_config()
    assert cfg.model.path == "builtin:tiny-gsm"
    assert cfg.reference_name in cfg.variants
    assert len(cfg.variants) == 2
    assert cfg.noise_floor is not None and cfg.noise_floor.enabled, "the default measures its own noise floor"
    assert cfg.tasks["gsm8k"][0].num_fewshot == 4


def test_single_task_becomes_a_list_and_env_values_become_strings():
    cfg = parse_config(MINIMAL)
    assert [t.task for t in cfg.tasks["gsm8k"]] == ["gsm8k_synth_4shot"]
    assert cfg.variants["b"].env == {"X": "1"}
    assert cfg.capture.topk == 5
    assert cfg.reference_name == "a"


def test_bool_env_values_are_lowercase_strings():
    cfg = parse_config({**MINIMAL, "env": {"FLAG": True, "EMPTY": None}})
    assert cfg.env == {"FLAG": "true", "EMPTY": ""}


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda d: d.update(modle={}), "unknown key `modle`"),
        (lambda d: d["variants"]["a"].update(enviroment={}), "unknown key `variants.a.enviroment`"),
        (lambda d: d.pop("model"), "required key `model` is missing"),
        (lambda d: d.update(reference="c"), "`reference: c` is not a variant"),
        (lambda d: d.update(capture={"topk": 0}), "capture.topk"),
        (lambda d: d["variants"]["b"].update(engine={"model": "x"}), "sets engine.model"),
        (lambda d: d["tasks"].update(all={"task": "x"}), "`all` is reserved"),
        # evalpipe's own engine switches are checked when the config is read, not in the engine
        (lambda d: d["variants"]["b"].update(env={"EVALPIPE_SP_MOE": "sp"}),
         "`variants.b.env`: EVALPIPE_SP_MOE='sp' is not a layout; valid values: vllm, replicated, fixed"),
    ],
)
def test_bad_configs_name_the_problem(mutate, fragment):
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in MINIMAL.items()}
    data["variants"] = {k: dict(v) for k, v in MINIMAL["variants"].items()}
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_config(data, "my.yaml")
    message = str(err.value)
    assert fragment in message
    assert message.startswith("my.yaml")
    assert "\n" not in message


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(scalar)


def test_deep_merge_merges_nested_dicts_and_replaces_the_rest():
    base = {"additional_config": {"enable_dsa_cp": True, "x": {"y": 1}}, "tp": 8, "list": [1, 2]}
    over = {"additional_config": {"x": {"z": 2}, "new": 1}, "tp": 16, "list": [3]}
    merged = deep_merge(base, over)
    assert merged == {
        "additional_config": {"enable_dsa_cp": True, "x": {"y": 1, "z": 2}, "new": 1},
        "tp": 16,
        "list": [3],
    }
    assert base["additional_config"]["x"] == {"y": 1}, "inputs are not modified"


def test_gates_have_documented_defaults_and_reject_unknown_keys():
    cfg = parse_config(MINIMAL)
    assert cfg.gates.scores.margin == 0.01 and cfg.gates.scores.alpha == 0.05
    kl = cfg.gates.tokens.teacher_kl_p99
    assert kl.abs == "auto", "the floor follows the reference's precision by default"
    assert kl.bound(None, 1e-3) == 1e-3, "without an A/A run the floor applies"
    assert kl.bound(1e-4, 1e-3) == 1e-3 and kl.bound(0.01, 1e-3) == pytest.approx(0.03), "max(floor, 3 x A/A)"
    fixed = parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_p99": {"abs": 2e-3}}}}).gates.tokens.teacher_kl_p99
    assert fixed.bound(None, 1e-8) == 2e-3, "a number in the config overrides the table"
    with pytest.raises(ConfigError, match="gates.tokens.teacher_kl_p99.abs"):
        parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_p99": {"abs": -1}}}})
    with pytest.raises(ConfigError, match="unknown key `gates.tokens.kl`"):
        parse_config({**MINIMAL, "gates": {"tokens": {"kl": {"abs": 1}}}})
    strict = parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_max": {"abs": 0.5, "rel_aa": None}}}})
    assert strict.gates.tokens.teacher_kl_max.bound(10.0) == 0.5


def test_noise_floor_accepts_true_false_or_a_mapping():
    assert parse_config(MINIMAL).noise_floor is None
    assert parse_config({**MINIMAL, "noise_floor": False}).noise_floor is None
    on = parse_config({**MINIMAL, "noise_floor": True}).noise_floor
    assert on.enabled and on.reverse_order and on.engine == {}
    custom = parse_config({**MINIMAL, "noise_floor": {"engine": {"max_num_seqs": 3}}}).noise_floor
    assert custom.engine == {"max_num_seqs": 3}


def test_default_config_spells_out_the_code_defaults_of_the_gates():
    # configs/default.yaml documents the gates; it must not drift from the code.
    from evalpipe.config.gate_settings import Gates

    assert load_config().gates == Gates()
