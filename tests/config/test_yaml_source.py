"""The YAML evalpipe reads from users: duplicate keys and alias bombs refused, the rest as PyYAML reads it."""

from __future__ import annotations

import pytest
import yaml

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import load_gates
from evalpipe.config.yaml_source import MAX_EXPANDED_NODES, YamlRefused, load_yaml_text


def test_a_key_given_twice_names_both_lines():
    with pytest.raises(YamlRefused, match=r"key `engine` appears twice in one mapping \(lines 1 and 3\)"):
        load_yaml_text("engine: {a: 1}\nmodel: x\nengine: {b: 2}\n", "c.yaml")


def test_a_key_given_twice_deeper_or_in_flow_style_is_refused_too():
    with pytest.raises(YamlRefused, match="key `FOO` appears twice"):
        load_yaml_text("variants:\n  a:\n    env: {FOO: 1, FOO: 2}\n", "c.yaml")
    with pytest.raises(YamlRefused, match="key `b` appears twice"):
        load_yaml_text("variants:\n  b: {}\n  c: {}\n  b: {}\n", "c.yaml")


def test_the_same_key_in_sibling_mappings_and_merge_keys_are_fine():
    text = "base: &base {dtype: float32, x: 1}\na: {x: 1}\nb: {x: 1}\nc:\n  <<: *base\n  x: 2\n"
    assert load_yaml_text(text, "c.yaml") == yaml.safe_load(text)
    assert load_yaml_text(text, "c.yaml")["c"] == {"dtype": "float32", "x": 2}


def test_an_alias_bomb_is_refused_before_it_expands():
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]  # 10^6 leaves
    with pytest.raises(YamlRefused, match=f"expand to more than {MAX_EXPANDED_NODES} nodes"):
        load_yaml_text("\n".join(lines), "bomb.yaml")


def test_modest_reuse_of_anchors_is_fine():
    text = "v: &v {env: {A: 1}, engine: {max_model_len: 64}}\nvariants: {a: *v, b: *v, c: *v}\n"
    assert load_yaml_text(text, "c.yaml")["variants"]["c"] == {"env": {"A": 1}, "engine": {"max_model_len": 64}}


def test_an_alias_inside_its_own_anchor_is_refused():
    with pytest.raises(YamlRefused, match="refers to the block that contains it"):
        load_yaml_text("a: &a [1, *a]\n", "c.yaml")


def test_a_gates_file_is_read_the_same_way(tmp_path):
    path = tmp_path / "gates.yaml"
    path.write_text("scores: {margin: 0.02}\nscores: {margin: 0.5}\n")
    with pytest.raises(ConfigError, match="key `scores` appears twice"):
        load_gates(path)
