"""`expect:` in a run config: Expectations' validation messages and the top-level
expectations merged under each variant's."""

from __future__ import annotations

import copy

import pytest

from evalpipe.config.errors import ConfigError
from evalpipe.config.expectations import STANDARD_SWITCH_NAMES, CountRange, Expectations, collective_key, merged_expectations
from evalpipe.config.loading import parse_config

MINIMAL = {
    "model": {"path": "builtin:tiny-gsm"},
    "variants": {"a": {}, "b": {}},
    "tasks": {"gsm8k": {"task": "gsm8k_synth_4shot", "num_fewshot": 4}},
}


def config(expect_b: dict | None = None, shared: dict | None = None):
    data = copy.deepcopy(MINIMAL)
    if expect_b is not None:
        data["variants"]["b"]["expect"] = expect_b
    if shared is not None:
        data["expect"] = shared
    return parse_config(data, "my.yaml")


def error_of(expect_b: dict | None = None, shared: dict | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        config(expect_b, shared)
    text = str(err.value)
    assert "\n" not in text, "one sentence"
    return text


def test_unknown_key_names_the_keys():
    keys = ", ".join(Expectations.model_fields)
    assert error_of({"calld": ["pkg.m.f"]}) == f"my.yaml: variant `b`: unknown key `expect.calld`; the keys are {keys}."
    assert {"same_path", "model", "layers", "called", "not_called", "per_forward", "switches"} <= set(Expectations.model_fields)
    # a typo in the shared expectations is reported as the top-level `expect:`'s, not as the first variant's
    assert error_of(shared={"modle": "pkg.m.M"}).startswith("my.yaml: unknown key `expect.modle`;")
    assert error_of(shared={"per_forward": {"all_gather": -1}}) == (
        "my.yaml: `expect.per_forward`: the count of `all_gather` must be 0 or more; got -1.")


def test_a_dotted_per_forward_key_is_a_function():
    assert error_of({"per_forward": {"pkg.m.f()": 1}}) == (
        "my.yaml: variant `b`: `expect.per_forward`: `pkg.m.f()` is neither a collective kind (all_reduce, all_gather, "
        "reduce_scatter, all_to_all, gather, dispatch, combine, optionally `@group`) nor a dotted function name.")


@pytest.mark.parametrize("key, meant", [
    ("allgather", "all_gather"), ("all gather", "all_gather"), ("all_gather@t-p", "all_gather@tp"),
    ("all_gather@TP", "all_gather@tp"), ("all_to_all@tp", "all_to_all"), ("gather@virtual", "all_gather@virtual"),
    ("all_gather@", "all_gather"), ("reduce_scater@tp", "reduce_scatter@tp"),
])
def test_a_collective_the_probes_never_record_is_refused_with_the_closest_name(key, meant):
    # a count of 0 of a name no record holds would hold whatever the engine did
    text = error_of({"per_forward": {key: 0}})
    assert text.startswith(f"my.yaml: variant `b`: `expect.per_forward`: the probes never record `{key}`: "), text
    assert text.endswith(f"; did you mean `{meant}`?"), text


def test_the_vocabulary_is_what_the_recorder_records():
    from evalpipe.probes import collectives, engine_hooks

    # one list: the hooks count with the tables the check reads
    assert engine_hooks.TORCH_COLLECTIVES is collectives.TORCH_COLLECTIVES
    assert engine_hooks.GROUP_COLLECTIVES is collectives.GROUP_COLLECTIVES
    names = collectives.recorded_names()
    assert "all_gather@tp" in names and "all_to_all@torch" in names and "all_to_all@virtual" in names
    assert "all_to_all@tp" not in names and "gather@torch" not in names and "gather@virtual" not in names
    assert engine_hooks._torch_collective("all_reduce", ()) in names
    for name in names:  # every name the recorder can write is one an expectation may name
        assert config({"per_forward": {name: 1}}).variant_expect("b").per_forward[name] == 1


def test_the_layout_models_collectives_are_in_the_vocabulary():
    # what evalpipe/lab/layout/model.py reports, read from its source (importing it needs vLLM)
    import re
    from pathlib import Path

    import evalpipe
    from evalpipe.probes.collectives import VIRTUAL_GROUP, is_recorded
    from evalpipe.probes.record import ProcessRecord

    source = (Path(evalpipe.__file__).parent / "lab" / "layout" / "model.py").read_text(encoding="utf-8")
    kinds = set(re.findall(r'probes\.collective\("(\w+)", VIRTUAL_GROUP', source))
    assert kinds == {"all_gather", "reduce_scatter", "all_to_all", "all_reduce"}, kinds
    assert all(is_recorded(f"{k}@{VIRTUAL_GROUP}") for k in kinds)
    with pytest.raises(ValueError, match="not in the probes' vocabulary"):
        ProcessRecord("/nonexistent", "v").note("gather", VIRTUAL_GROUP, ())


@pytest.mark.parametrize("count, said", [
    (-1, "the count of `all_gather` must be 0 or more; got -1"),
    (True, "the count of `all_gather` must be a whole number, 0 or more; got True"),
    (False, "the count of `all_gather` must be a whole number, 0 or more; got False"),
    (2.5, "the count of `all_gather` must be a whole number, 0 or more; got 2.5"),
    ("2", "the count of `all_gather` must be a whole number, 0 or more; got '2'"),
    ({"min": 3, "max": 1}, "the range's min 3 is above its max 1 (no count holds); swap them"),
    ({"min": -1}, "`min` must be 0 or more; got -1"),
    ({"max": True}, "`max` must be a whole number, 0 or more; got True"),
    ({}, "a range needs a `max`, or a `min` above 0 (without either every count holds)"),
    ({"min": 0}, "a range needs a `max`, or a `min` above 0 (without either every count holds)"),
])
def test_a_count_is_a_whole_number_and_a_range_is_ordered(count, said):
    text = error_of({"per_forward": {"all_gather": count}})
    assert text.startswith("my.yaml: variant `b`: `expect.per_forward"), text
    assert said in text, text


@pytest.mark.parametrize("value", [True, False, 0, -2, 1.5, "2"])
def test_engine_processes_is_a_positive_whole_number(value):
    assert error_of({"engine_processes": value}) == (
        f"my.yaml: variant `b`: `expect.engine_processes`: must be a whole number of processes, 1 or more; got {value!r}.")
    assert config({"engine_processes": 2}).variant_expect("b").engine_processes == 2


def test_forward_tokens_are_keyed_by_power_of_two_bins():
    assert config({"forward_tokens": {1: {"min": 1}, "8192": {"min": 2}}}).variant_expect("b").forward_tokens == {
        "1": CountRange(min=1), "8192": CountRange(min=2)}, "a YAML number is the same bin as its text"
    for key in ("3", "0", "one", True):
        text = error_of({"forward_tokens": {key: {"min": 1}}})
        assert text.startswith("my.yaml: variant `b`: `expect.forward_tokens`:") and "powers of two" in text, text
    assert "a range needs a `max`" in error_of({"forward_tokens": {"1": {}}})
    assert "give a range of forward passes, {min: 1}" in error_of({"forward_tokens": {"1": 3}})


@pytest.mark.parametrize("key", ["all_gather", "all_gather@tp", "all_to_all@virtual", "combine", "pkg.m.Class.forward"])
def test_per_forward_keys_accepted(key):
    assert config({"per_forward": {key: {"min": 1}}}).variant_expect("b").per_forward[key] == CountRange(min=1)


def test_collective_key():
    assert collective_key("all_gather") and collective_key("reduce_scatter@ep")
    assert not collective_key("allgather") and not collective_key("all_gather@t p") and not collective_key("pkg.m.f")


def test_a_collective_with_an_empty_group_is_refused():
    assert not collective_key("all_gather@")
    assert "nothing follows `@`" in error_of({"per_forward": {"all_gather@": 1}})


def test_unknown_short_switch_name():
    text = error_of({"switches": {"tp_size": 2}})
    assert text.startswith("my.yaml: variant `b`: `expect.switches`: `tp_size` is not a switch the probes read: use a "
                           "standard name (tensor_parallel_size, ")
    assert text.endswith("a vllm_config path (parallel_config.all2all_backend) or a predicate (package.module.function()).")
    for name in ("tensor_parallel_size", "attention_backends", "tp_rank", "ep_size", "additional_config"):
        assert name in STANDARD_SWITCH_NAMES and f"{name}" in text


@pytest.mark.parametrize("name", ["tensor_parallel_size", "tp_rank", "attention_backends", "parallel_config.all2all_backend",
                                  "vllm_ascend.ascend_config.enable_dsa_cp()", "additional_config.enable_x"])
def test_switch_names_accepted(name):
    assert name in config({"switches": {name: True}}).variant_expect("b").switches


@pytest.mark.parametrize("key, value, name", [
    ("called", ["forward"], "forward"),
    ("called", "forward", "forward"),  # one name is a list of one
    ("not_called", ["pkg..f"], "pkg..f"),
    ("layers", ["pkg.m.1Layer"], "pkg.m.1Layer"),
    ("model", "Model", "Model"),
    ("model", "pkg.m.make()", "pkg.m.make()"),
    ("called", ["pkg.m.on()"], "pkg.m.on()"),
])
def test_names_must_be_dotted(key, value, name):
    assert error_of({key: value}) == (
        f"my.yaml: variant `b`: `expect.{key}`: `{name}` is not a dotted name such as package.module.Class.method.")


def test_a_single_name_becomes_a_list():
    expect = config({"called": "pkg.m.f", "not_called": "pkg.m.g", "layers": "pkg.m.L"}).variant_expect("b")
    assert (expect.called, expect.not_called, expect.layers) == (["pkg.m.f"], ["pkg.m.g"], ["pkg.m.L"])


def test_per_forward_counts():
    expect = config({"per_forward": {"all_gather": 2, "all_to_all": {"min": 1, "max": 3}, "gather": {"max": 0}}}).variant_expect("b")
    assert expect.per_forward == {"all_gather": 2, "all_to_all": CountRange(min=1, max=3), "gather": CountRange(max=0)}
    assert CountRange(min=1, max=3).holds(3) and not CountRange(min=1, max=3).holds(0)
    assert CountRange(min=2, max=2).describe() == "2" and CountRange(max=0).describe() == "<= 0"
    assert "expect.per_forward" in error_of({"per_forward": {"all_gather": "two"}})


def test_a_bad_count_range_says_what_is_wrong():
    # BUG (evalpipe/config/expectations.py, merged_expectations): a per_forward value is `int | CountRange`;
    # pydantic reports one error per union member and merged_expectations shows the first,
    # whose location ends in the member's type name: "`expect.per_forward.all_gather.int`:
    # Input should be a valid integer." for {min: -1} or a misspelt key, which names neither
    # the real problem nor a key the user wrote. Suggested fix: in merged_expectations (as
    # config._union_error does for the rest of the config) drop union-member parts from the
    # location and prefer the CountRange member's error when the input is a mapping, e.g.
    # "`expect.per_forward.all_gather.min`: Input should be greater than or equal to 0."
    negative = error_of({"per_forward": {"all_gather": {"min": -1}}})
    misspelt = error_of({"per_forward": {"all_gather": {"mn": 1}}})
    for text in (negative, misspelt):
        assert "`expect.per_forward.all_gather" in text
        assert ".int`" not in text and "valid integer" not in text, text
    assert "min" in negative and "mn" in misspelt


# ----------------------------------------------------------------------------- merging


SHARED = {
    "model": "pkg.m.Model",
    "called": ["pkg.m.shared_fn"],
    "per_forward": {"all_gather": 2},
    "switches": {"tensor_parallel_size": 2, "additional_config": {"a": 1, "deep": {"x": 1}}},
}


def test_top_level_expect_is_merged_under_the_variants():
    cfg = config({"called": ["pkg.m.own_fn"], "per_forward": {"all_to_all": 1},
                  "switches": {"dtype": "bfloat16", "additional_config": {"b": 2, "deep": {"y": 2}}}}, SHARED)
    own = cfg.variant_expect("b")
    assert own.model == "pkg.m.Model", "kept from the top level"
    assert own.called == ["pkg.m.own_fn"], "lists are replaced"
    assert own.per_forward == {"all_gather": 2, "all_to_all": 1}, "mappings merge key by key"
    assert own.switches == {"tensor_parallel_size": 2, "dtype": "bfloat16",
                            "additional_config": {"a": 1, "b": 2, "deep": {"x": 1, "y": 2}}}
    # a variant without expectations has the shared ones; the shared mapping is not changed by merging
    assert cfg.variant_expect("a") == Expectations.model_validate(SHARED)
    assert cfg.expect == SHARED


def test_a_variant_can_replace_a_shared_value():
    cfg = config({"model": "pkg.m.Other", "per_forward": {"all_gather": {"min": 1}}, "same_path": True}, SHARED)
    own = cfg.variant_expect("b")
    assert own.model == "pkg.m.Other" and own.per_forward == {"all_gather": CountRange(min=1)} and own.same_path
    assert not cfg.variant_expect("a").same_path


def test_merged_expectations_directly():
    assert merged_expectations({}, {}) == Expectations()
    with pytest.raises(ValueError, match=r"^where: unknown key `expect.x`"):
        merged_expectations({"x": 1}, {}, "where: ")


def test_expectations_names_and_claims():
    e = Expectations(model="pkg.m.M", layers=["pkg.m.L"], called=["pkg.m.f"], not_called=["pkg.m.g", "pkg.m.f"],
                     per_forward={"all_gather": 1, "pkg.m.h": 2}, switches={"tensor_parallel_size": 2, "pkg.m.on()": True,
                                                                          "parallel_config.x": 1})
    assert e.names() == ["pkg.m.M", "pkg.m.L", "pkg.m.f", "pkg.m.g", "pkg.m.h", "pkg.m.on()", "parallel_config.x"]
    assert e.probed_names() == ["pkg.m.f", "pkg.m.g", "pkg.m.h", "pkg.m.on()", "parallel_config.x"]
    assert e.declares() and not Expectations().declares() and not Expectations(same_path=True).declares()
    assert "same_path" not in e.claims() and e.claims()["per_forward"] == {"all_gather": 1, "pkg.m.h": 2}
    assert Expectations(per_forward={"all_gather": 2}).claims() != Expectations(per_forward={"all_gather": {"min": 2, "max": 2}}).claims()


def test_a_top_level_key_every_variant_replaces_is_refused():
    """Lists and values replace, mappings merge key by key: a shared entry no variant keeps checks nothing."""
    def both(shared: dict, a: dict, b: dict) -> str:
        data = copy.deepcopy(MINIMAL)
        data["expect"], data["variants"]["a"]["expect"], data["variants"]["b"]["expect"] = shared, a, b
        with pytest.raises(ConfigError) as err:
            parse_config(data, "my.yaml")
        return str(err.value)

    called = {"called": ["nosuch.module.fn"]}
    said = both(called, {"called": ["m.f"]}, {"called": ["m.g"]})
    assert "the top-level `expect.called` is replaced by every variant's own, so it is never checked" in said, said
    said = both({"switches": {"dtype": "float32", "tensor_parallel_size": 2}}, {"switches": {"dtype": "bfloat16"}},
                {"switches": {"dtype": "float16", "data_parallel_size": 2}})
    assert "`expect.switches.dtype` is replaced" in said, said
    # kept by one variant, or merged with other keys: checked, so accepted
    assert config({"called": ["m.g"]}, called).variant_expect("a").called == ["nosuch.module.fn"]
    kept = config({"switches": {"data_parallel_size": 2}}, {"switches": {"dtype": "float32"}})
    assert kept.variant_expect("b").switches == {"dtype": "float32", "data_parallel_size": 2}
