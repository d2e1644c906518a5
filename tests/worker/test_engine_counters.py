"""evalpipe/worker/engine_counters.py: vLLM's counters of the scheduler's paths, read from a
server's /metrics text and from this process's registry alike, summed over a data-parallel
server's engines, and differenced over a task. The real engine's counters are read in
tests/e2e/test_serve.py (offline and served, the same prompts: the same counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from evalpipe.documents.manifest import EngineCounters
from evalpipe.worker import engine_counters

# what a data-parallel vLLM server answers on /metrics (two engines), trimmed
EXPOSITION = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 606.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1024.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 256.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 0.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 5.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 9.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 1300.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 7.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 7.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 700.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def test_a_server_s_counters_are_summed_over_its_engines_and_unexposed_ones_left_out():
    assert engine_counters.parse_exposition(EXPOSITION) == {
        "prefix_cache_queries": 1806.0, "prefix_cache_hits": 1280.0, "preemptions": 3.0, "engine_steps": 16.0,
        "steps_by_tokens:1": 7.0, "steps_by_tokens:+Inf": 16.0,
    }


def test_the_registry_and_its_text_read_the_same():
    """Offline, vLLM's metrics are in prometheus_client's registry; served, the same registry
    as text: both readings must count alike (the registry here stands in for vLLM's)."""
    registry = CollectorRegistry()
    hits = Counter("vllm:prefix_cache_hits", "hits", ["engine"], registry=registry)
    steps = Histogram("vllm:iteration_tokens_total", "steps", ["engine"], buckets=[1, 8], registry=registry)
    hits.labels(engine="0").inc(256)
    for tokens in (1, 1, 300):
        steps.labels(engine="0").observe(tokens)
    from_registry = engine_counters.reading(registry.collect())
    assert from_registry == {"prefix_cache_hits": 256.0, "engine_steps": 3.0, "steps_by_tokens:1": 2.0,
                             "steps_by_tokens:8": 2.0, "steps_by_tokens:+Inf": 3.0}
    assert engine_counters.parse_exposition(generate_latest(registry).decode()) == from_registry


def test_a_task_s_counters_are_the_difference_of_two_readings():
    before = {"prefix_cache_hits": 100.0, "engine_steps": 10.0, "preemptions": 0.0}
    after = {"prefix_cache_hits": 356.0, "engine_steps": 26.0, "prompt_tokens": 50.0}
    assert engine_counters.between(before, after) == EngineCounters(prefix_cache_hits=256, engine_steps=16)
    assert engine_counters.between(None, after) is None and engine_counters.between(before, None) is None


def test_a_task_s_steps_by_tokens_are_each_bucket_s_own_count_over_the_task():
    """The histogram's buckets are cumulative and count the engine's lifetime: over a task,
    5 one-token steps, none of 2-8 tokens and 2 of 9-1024 (bucket bounds sorted as numbers)."""
    def buckets(one: float, eight: float, many: float, inf: float) -> dict[str, float]:
        return {"steps_by_tokens:1": one, "steps_by_tokens:8": eight, "steps_by_tokens:1024": many,
                "steps_by_tokens:+Inf": inf, "engine_steps": inf}
    counted = engine_counters.between(buckets(10, 12, 20, 20), buckets(15, 17, 27, 27))
    assert counted == EngineCounters(engine_steps=7, steps_by_tokens={"1": 5, "1024": 2})
    assert engine_counters.between({}, {}) == EngineCounters(), "an engine that exposes nothing: nothing known"
