"""Reading a run config (evalpipe/config/loading.py): the shipped configs parse, a bad config is one
sentence naming the file and the key, a missing file or bad YAML is said as such."""

from pathlib import Path

import pytest
from run_configs import MINIMAL

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import load_config, parse_config
from evalpipe.install import default_config


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


