"""Merging config mappings (evalpipe/config/merge.py): nested mappings merge key by key,
anything else is replaced, and neither input is changed."""

from evalpipe.config.merge import deep_merge


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


def test_a_mapping_and_a_value_replace_each_other_whole():
    base = {"engine": {"tp": 2}, "launch": "offline"}
    assert deep_merge(base, {"engine": None}) == {"engine": None, "launch": "offline"}
    assert deep_merge(base, {"launch": {"mode": "serve"}}) == {"engine": {"tp": 2}, "launch": {"mode": "serve"}}
    over = {"extra": {"a": [1]}}
    merged = deep_merge({}, over)
    merged["extra"]["a"].append(2)
    assert over == {"extra": {"a": [1]}}, "the result shares nothing with the override"
