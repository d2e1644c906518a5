"""Each task's counters against what it requires (compare.task_paths)."""

from evalpipe.compare.task_paths import check_tasks, counter_value
from evalpipe.config.path_requirements import PathRequirements
from evalpipe.documents.manifest import EngineCounters

HITS = {"scenario_prefix_cache": PathRequirements.model_validate({"prefix_cache_hits": {"min": 1}})}
ALONE = {"gsm8k": PathRequirements.model_validate({"steps_by_tokens": {"1": {"min": 1}}})}


def test_a_met_requirement_is_evidence_naming_the_task():
    failures, evidence = check_tasks("variant `sp`", HITS, {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=896)})
    assert failures == [] and evidence == ["task `scenario_prefix_cache`: 896 prefix-cache hit tokens"]


def test_a_prefix_cache_scenario_with_no_hit_fails_naming_the_task_and_the_counter():
    counted = {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=0, prefix_cache_queries=16384)}
    failures, evidence = check_tasks("variant `sp`", HITS, counted)
    assert evidence == [] and len(failures) == 1
    assert "`scenario_prefix_cache`" in failures[0] and "prefix-cache hit tokens" in failures[0]
    assert "counted 0 of 16384 prompt tokens looked up" in failures[0]


def test_no_counters_for_the_task_or_a_counter_not_exposed_fail():
    assert "reported no counters" in check_tasks("v", HITS, None)[0][0]
    assert "reported no counters" in check_tasks("v", HITS, {"other": EngineCounters(prefix_cache_hits=5)})[0][0]
    assert "does not count them" in check_tasks("v", HITS, {"scenario_prefix_cache": EngineCounters()})[0][0]


def test_step_buckets_read_the_histogram_and_an_empty_bucket_is_zero():
    assert counter_value(EngineCounters(steps_by_tokens={"1": 7}), "steps_by_tokens.1") == 7
    assert counter_value(EngineCounters(steps_by_tokens={"8": 7}), "steps_by_tokens.1") == 0
    assert counter_value(EngineCounters(), "steps_by_tokens.1") is None
    failures, _ = check_tasks("v", ALONE, {"gsm8k": EngineCounters(steps_by_tokens={"512": 4}, engine_steps=4)})
    assert "counted 0 of 4 engine steps" in failures[0] and "1 token (a single request decoding alone)" in failures[0]
