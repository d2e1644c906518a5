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


def reading(families: Iterable[Any]) -> dict[str, float]:
    """The counters found among prometheus_client metric families, each summed over its label
    sets (a data-parallel server keeps one per engine); a counter the engine does not
    expose is left out."""
    wanted = {family: (field, suffix) for field, (family, suffix) in COUNTERS.items()}
    out: dict[str, float] = {}
    for family in families:
        entry = wanted.get(family.name)
        if entry is None:
            continue
        field, suffix = entry
        for sample in family.samples:
            if sample.name == family.name + suffix:
                out[field] = out.get(field, 0.0) + float(sample.value)
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
    return EngineCounters(**{field: int(round(after[field] - before[field]))
                             for field in COUNTERS if field in before and field in after})
