"""vLLM's own counters of the scheduler paths a task drove the engine through: prefix-cache
hits, preemptions, engine steps, speculative tokens.

vLLM keeps them as Prometheus metrics in every engine, offline (its in-process registry,
with stat logging on) and served (``GET /metrics``); both are read here as the same metric
families (prometheus_client's), so an offline and a served variant count alike. A task's
counters are the difference of two readings, one before the task and one after it: a
served engine's counters are its lifetime's, and one server may serve several runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from evalpipe.documents.manifest import EngineCounters

# EngineCounters field -> (vLLM's metric family, the sample that holds it): a counter's total,
# or a histogram's count (one observation per engine step)
COUNTERS: Mapping[str, tuple[str, str]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "_total"),
    "preemptions": ("vllm:num_preemptions", "_total"),
    "prompt_tokens": ("vllm:prompt_tokens", "_total"),
    "generation_tokens": ("vllm:generation_tokens", "_total"),
    "engine_steps": ("vllm:iteration_tokens_total", "_count"),
    "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "_total"),
    "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "_total"),
}


# the histogram of tokens per engine step, read by bucket: its first bucket (1 token) holds the
# steps in which a single request decoded alone
STEP_TOKENS = "vllm:iteration_tokens_total"
STEP_BUCKET = "steps_by_tokens:"  # a reading's key of one bucket: this prefix and the bucket's bound


def reading(families: Iterable[Any]) -> dict[str, float]:
    """The counters found among prometheus_client metric families, each summed over its label
    sets (a data-parallel server keeps one per engine); a counter the engine does not
    expose is left out. The steps' histogram adds its cumulative buckets, keyed by
    :data:`STEP_BUCKET` and the bucket's upper bound."""
    wanted = {family: (field, suffix) for field, (family, suffix) in COUNTERS.items()}
    out: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for family in families:
        entry = wanted.get(family.name)
        if entry is None:
            continue
        field, suffix = entry
        for sample in family.samples:
            if sample.name == family.name + suffix:
                add(field, float(sample.value))
            elif family.name == STEP_TOKENS and sample.name == family.name + "_bucket":
                add(STEP_BUCKET + _bound(sample.labels["le"]), float(sample.value))
    return out


def _bound(le: str) -> str:
    """A bucket's upper bound as text: "1" for the registry's "1.0" and the exposition's "1"."""
    value = float(le)
    if value == float("inf"):
        return "+Inf"
    return str(int(value)) if value.is_integer() else str(value)


def _step_buckets(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int] | None:
    """The steps between two readings by their tokens, each bucket's own count (the
    histogram's are cumulative) keyed by its upper bound, empty buckets left out."""
    bounds = sorted((key.removeprefix(STEP_BUCKET) for key in after if key.startswith(STEP_BUCKET) and key in before),
                    key=float)
    if not bounds:
        return None
    out, below = {}, 0
    for bound in bounds:
        key = STEP_BUCKET + bound
        cumulative = int(round(after[key] - before[key]))
        if cumulative > below:
            out[bound] = cumulative - below
        below = cumulative
    return out


def parse_exposition(text: str) -> dict[str, float]:
    """The counters of a server's ``/metrics`` answer (Prometheus' text format)."""
    return reading(text_string_to_metric_families(text))


def in_process() -> dict[str, float]:
    """The counters of the engine in this process (vLLM registers its metrics in
    prometheus_client's default registry when stat logging is on)."""
    return reading(REGISTRY.collect())


def between(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> EngineCounters | None:
    """What the engine counted between two readings (None: either reading failed); a counter
    only one reading has is not known for the span, and stays None."""
    if before is None or after is None:
        return None
    counted = {field: int(round(after[field] - before[field])) for field in COUNTERS if field in before and field in after}
    return EngineCounters(**counted, steps_by_tokens=_step_buckets(before, after))
