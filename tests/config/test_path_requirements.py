"""`requires:` of a task: which counters, which buckets, and what is refused."""

import pytest
from pydantic import ValidationError

from evalpipe.config.path_requirements import STEP_BUCKETS, PathRequirements, bucket_span, counter_words, step_bucket_of
from evalpipe.documents.manifest import EngineCounters


def test_counted_lists_the_counters_then_the_step_buckets_smallest_first():
    req = PathRequirements.model_validate({"steps_by_tokens": {"512": {"min": 2}, 1: {"min": 1}},
                                           "preemptions": {"max": 0}, "prefix_cache_hits": {"min": 1}})
    assert [name for name, _ in req.counted()] == ["prefix_cache_hits", "preemptions", "steps_by_tokens.1",
                                                   "steps_by_tokens.512"]


def test_every_counter_a_requirement_names_is_one_the_manifest_keeps():
    fields = set(EngineCounters.model_fields)
    assert {n for n in PathRequirements.model_fields if n != "steps_by_tokens"} <= fields
    assert "steps_by_tokens" in fields


@pytest.mark.parametrize("doc, says", [
    ({}, "requires no counter"),
    ({"steps_by_tokens": {}}, "requires no counter"),
    ({"steps_by_tokens": {"3": {"min": 1}}}, "not one of vLLM's buckets"),
    ({"steps_by_tokens": {True: {"min": 1}}}, "not one of vLLM's buckets"),
    ({"prefix_cache_hits": 1}, "valid dictionary"),
    ({"prefix_cache_hits": {}}, "a range needs"),
    ({"prefix_cache_hits": {"min": True}}, "whole number"),
    ({"prefix_cache_hit": {"min": 1}}, "Extra inputs"),
])
def test_what_requires_nothing_or_names_nothing_is_refused(doc, says):
    with pytest.raises(ValidationError, match=says):
        PathRequirements.model_validate(doc)


def test_the_bucket_that_shows_a_chunked_prefill_holds_only_steps_over_the_budget():
    from evalpipe.config.path_requirements import chunked_bucket

    assert chunked_bucket(512, 513) == "1024" and chunked_bucket(8192, 8193) == "16384"
    assert chunked_bucket(512, 1100) == "2048"
    assert chunked_bucket(600, 601) is None, "1024's steps of 513-600 tokens fit the budget: no count tells"
    assert chunked_bucket(16384, 16385) is None, "past vLLM's last bound"


def test_buckets_and_their_words():
    assert step_bucket_of(1) == "1" and step_bucket_of(2) == "8" and step_bucket_of(512) == "512"
    assert step_bucket_of(513) == "1024" and step_bucket_of(10**6) == "+Inf"
    assert bucket_span("1").startswith("1 token") and bucket_span("512") == "257-512 tokens"
    assert counter_words("steps_by_tokens.8") == "engine steps of 2-8 tokens"
    assert counter_words("prefix_cache_hits") == "prefix-cache hit tokens"
    assert STEP_BUCKETS[0] == "1"
