"""The scenarios' prompts: exact lengths under the model's tokenizer, one shared document for
the prefix-cache scenario, chunked prompts at the layout edges, and what is refused."""

import json
import os

import pytest
from pydantic import ValidationError

from evalpipe.data import scenarios
from evalpipe.errors import UserError

ENGINE = {"max_num_batched_tokens": 512, "max_model_len": 2048}


@pytest.fixture(scope="module")
def tok(builtin_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(builtin_model_dir))


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_the_prefix_scenario_shares_one_document_of_several_blocks(tok):
    spec = scenarios.ScenarioSpec(prefix_tokens=1024, prefix_questions=8, value_digits=2).resolved(ENGINE)
    items = scenarios.generate("scenario_prefix_cache", tok, spec)
    assert len(items) == 8 and {len(ids(tok, it["prompt"])) for it in items} == {1024}
    shared = os.path.commonprefix([ids(tok, it["prompt"]) for it in items])
    assert len(shared) >= 6 * 128, "the document spans several 128-token KV blocks"
    assert len({it["answer"] for it in items}) == 8, "each request asks another key"
    assert all(it["answer"] in it["prompt"] for it in items)


def test_the_chunked_scenario_overshoots_the_chunk_by_each_offset(tok):
    spec = scenarios.ScenarioSpec(chunk_offsets=(1, 4, 128)).resolved(ENGINE)
    items = scenarios.generate("scenario_chunked_prefill", tok, spec)
    assert [len(ids(tok, it["prompt"])) for it in items] == [513, 516, 640]
    assert [it["length_tags"] for it in items] == [["chunk+1"], ["chunk+4"], ["chunk+128"]]


def test_the_near_limit_scenario_fills_the_window_up_to_the_answer(tok):
    spec = scenarios.ScenarioSpec(value_digits=2).resolved(ENGINE)
    items = scenarios.generate("scenario_near_limit", tok, spec)
    assert [len(ids(tok, it["prompt"])) for it in items] == [2048 - 17, 2048 - 16]


def test_the_spec_takes_the_engines_sizes_unless_it_states_its_own():
    assert scenarios.ScenarioSpec().resolved(ENGINE).chunk_tokens == 512
    assert scenarios.ScenarioSpec(chunk_tokens=100).resolved(ENGINE).chunk_tokens == 100
    with pytest.raises(UserError, match="set engine.max_num_batched_tokens or scenarios.chunk_tokens"):
        scenarios.ScenarioSpec().lengths("scenario_chunked_prefill")


@pytest.mark.parametrize("doc", [{"chunk_offsets": [0]}, {"chunk_offsets": []}, {"prefix_questions": 1},
                                 {"prefix_tokens": True}, {"prefix_tokens": 10}, {"window_tokens": 80}, {"extra": 1}])
def test_bad_sizes_are_refused(doc):
    with pytest.raises(ValidationError):
        scenarios.ScenarioSpec.model_validate(doc)


def test_the_data_file_is_written_once_per_fingerprint_and_resolves_its_placeholder(tok, tmp_path):
    spec = scenarios.ScenarioSpec(value_digits=2).resolved(ENGINE)
    rel = "scenarios/scenario_near_limit-{fingerprint}/test.jsonl"
    assert scenarios.is_placeholder(rel) and not scenarios.is_placeholder("longctx/passkey-{fingerprint}/test.jsonl")
    path = scenarios.resolve_data_file(rel, tok, spec, tmp_path)
    assert path is not None and path.is_file()
    stamp = path.stat().st_mtime_ns
    assert scenarios.resolve_data_file(rel, tok, spec, tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert json.loads((path.parent / "meta.json").read_text())["scenario"] == "scenario_near_limit"
    other = scenarios.resolve_data_file(rel, tok, spec.model_copy(update={"window_tokens": 1024}), tmp_path)
    assert other != path
    assert scenarios.resolve_data_file("gsm8k_synth/test.jsonl", tok, spec, tmp_path) is None


def test_every_scenario_has_a_task_file():
    from evalpipe.install import shipped_dir

    for name in scenarios.SCENARIOS:
        assert (shipped_dir("tasks") / "scenarios" / f"{name}.yaml").is_file()


def test_the_preemption_scenario_is_many_prompts_of_whole_blocks_each_with_a_pass_key_of_its_own(tok):
    spec = scenarios.ScenarioSpec(preempt_tokens=256, preempt_requests=6, value_digits=2).resolved(ENGINE)
    items = scenarios.generate("scenario_preemption", tok, spec)
    assert [len(ids(tok, it["prompt"])) for it in items] == [256] * 6
    assert len({it["haystack_id"] for it in items}) == 6, "no shared document: no prefix-cache hits to soften the pressure"
    with pytest.raises(UserError, match="no scenario evalpipe generates"):
        scenarios.generate("gsm8k_synth_4shot", tok, spec)


def test_each_scenario_tasks_yaml_generates_what_the_registry_says():
    import yaml

    from evalpipe.install import shipped_dir

    for name, scenario in scenarios.SCENARIOS.items():
        cfg = yaml.safe_load((shipped_dir("tasks") / "scenarios" / f"{name}.yaml").read_text())
        assert cfg["task"] == name and cfg["generation_kwargs"]["max_gen_toks"] == scenario.max_gen_toks, name
        assert cfg["dataset_kwargs"]["data_files"]["test"] == f"scenarios/{name}-{{fingerprint}}/test.jsonl"


def test_the_speculative_scenario_is_its_requests_prompts_each_of_its_length(tok):
    spec = scenarios.ScenarioSpec(speculative_tokens=200, speculative_requests=3, value_digits=2).resolved(ENGINE)
    items = scenarios.generate("scenario_speculative", tok, spec)
    assert [len(ids(tok, it["prompt"])) for it in items] == [200] * 3 and spec.requests("scenario_speculative") == 3
    assert scenarios.SCENARIOS["scenario_speculative"].needs_engine == "speculative_config"


def test_an_engine_size_that_is_no_whole_number_is_left_to_the_engine_arguments_check():
    # `max_model_len: [2048]` is refused by the engine arguments' own check, in its words, not here
    spec = scenarios.ScenarioSpec().resolved({"max_model_len": [2048], "max_num_batched_tokens": True})
    assert spec.window_tokens is None and spec.chunk_tokens is None
