"""The run config's models (evalpipe/config/run_config.py): a single task becomes a list,
environment values become strings, noise_floor and localize take their short words,
names that would name another directory are refused, the A/A run's name cannot collide
with a variant, and a variant's launch merges over the shared one."""

import pytest
from run_configs import MINIMAL

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import parse_config
from evalpipe.config.run_config import aa_variant_name


def test_single_task_becomes_a_list_and_env_values_become_strings():
    cfg = parse_config(MINIMAL)
    assert [t.task for t in cfg.tasks["gsm8k"]] == ["gsm8k_synth_4shot"]
    assert cfg.variants["b"].env == {"X": "1"}
    assert cfg.capture.topk == 5
    assert cfg.reference_name == "a"


def test_bool_env_values_are_lowercase_strings():
    cfg = parse_config({**MINIMAL, "env": {"FLAG": True, "EMPTY": None}})
    assert cfg.env == {"FLAG": "true", "EMPTY": ""}


def test_noise_floor_accepts_true_false_or_a_mapping():
    assert parse_config(MINIMAL).noise_floor is None
    assert parse_config({**MINIMAL, "noise_floor": False}).noise_floor is None
    on = parse_config({**MINIMAL, "noise_floor": True}).noise_floor
    assert on.enabled and on.reverse_order and on.engine == {}
    custom = parse_config({**MINIMAL, "noise_floor": {"engine": {"max_num_seqs": 3}}}).noise_floor
    assert custom.engine == {"max_num_seqs": 3}


def _config(**changes):
    return parse_config({**MINIMAL, **changes}, "my.yaml")


@pytest.mark.parametrize("changes, fragment", [
    ({"variants": {"../up": {}, "b": {}}}, "variant name '../up' is not a plain directory name"),
    ({"variants": {1: {}, "b": {}}}, "variant name 1 is read as a int; quote it (\"1\")"),
    ({"tasks": {"my group": {"task": "gsm8k_synth_4shot"}}}, "task group name 'my group' is not a plain directory name"),
    ({"tasks": {"gsm8k": []}}, "task group `gsm8k` is empty"),
    ({"tasks": {}}, "no task groups; add one"),
    ({"variants": {"a": {}, "a-aa": {}}, "noise_floor": True}, "variant `a-aa` collides with the name of the A/A noise-floor run"),
])
def test_names_and_groups_a_run_cannot_use_are_refused(changes, fragment):
    with pytest.raises(ConfigError) as err:
        _config(**changes)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_a_a_run_is_named_after_the_reference():
    cfg = _config(reference="b", noise_floor=True)
    assert cfg.reference_name == "b" and cfg.aa_name == "b-aa" == aa_variant_name("b")
    assert _config(variants={"a": {}, "a-aa": {}}).aa_name == "a-aa", "no A/A run: no collision"


def test_localize_takes_its_words_and_yaml_s_booleans():
    assert _config(localize="auto").localize.when == "auto"
    assert _config(localize=False).localize.when == "off" and _config(localize=True).localize.when == "auto"
    assert _config(localize={"positions": 16}).localize.positions == 16


def test_a_variant_s_launch_merges_over_the_shared_one_and_is_checked_whole():
    cfg = _config(launch={"mode": "serve", "port": 8000}, variants={"a": {}, "b": {"launch": {"port": 9000}}})
    assert cfg.variant_launch("a").port == 8000 and cfg.variant_launch("b").port == 9000
    assert cfg.variant_launch("b").mode == "serve"
    with pytest.raises(ConfigError, match="variant `b`: launch: .*mode `endpoint` needs `url`"):
        _config(variants={"a": {}, "b": {"launch": {"mode": "endpoint"}}})
    with pytest.raises(ConfigError, match="variant `b`: unknown key `launch.prot`"):
        _config(variants={"a": {}, "b": {"launch": {"prot": 1}}})


def test_on_cluster_changes_only_the_address():
    cfg = _config(cluster={"concurrency": 2})
    there = cfg.on_cluster("auto")
    assert there.cluster.address == "auto" and there.cluster.concurrency == 2 and there.variants == cfg.variants
    assert cfg.cluster.address is None and there.on_cluster(None).cluster.enabled is False
