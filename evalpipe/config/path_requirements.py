"""`requires:` of a task: what vLLM's own counters must show the engine did over that task
(the scheduler path a scenario drives), or the comparison proves nothing about that path.

The counters are the engine's (evalpipe.worker.engine_counters reads them, offline and
served alike, into each variant's manifest per task); a requirement names one of them and a
range. A task whose engine ran no prefix-cache hit cannot vouch for the prefix-cache path,
whatever its outputs were.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from evalpipe.config.counts import CountRange
from evalpipe.config.strict import Strict

# vLLM's buckets of tokens per engine step (vllm/v1/metrics/buckets.py ITERATION_TOKENS_BUCKETS):
# the bins a `steps_by_tokens` requirement may name, each by its upper bound
STEP_BUCKETS = ("1", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096", "8192", "16384")


def step_bucket_of(tokens: int) -> str:
    """The bucket an engine step of ``tokens`` tokens falls in (its least upper bound)."""
    return next((b for b in STEP_BUCKETS if tokens <= int(b)), "+Inf")


def chunked_bucket(budget: int, shortest: int) -> str | None:
    """The bucket that shows prompts of ``shortest`` tokens or more were prefilled in chunks of
    ``budget``: vLLM records a chunked prefill as one step of the whole prompt, so a step counted
    in a bucket whose every step holds more than ``budget`` tokens was one. None when the
    shortest prompt's bucket also holds steps of ``budget`` tokens or fewer (no count can tell)."""
    bucket = step_bucket_of(shortest)
    i = STEP_BUCKETS.index(bucket) if bucket in STEP_BUCKETS else 0
    return bucket if i > 0 and int(STEP_BUCKETS[i - 1]) >= budget else None


def bucket_span(bound: str) -> str:
    """The tokens of the steps one bucket holds, as words."""
    if bound == "1":
        return "1 token (a single request decoding alone)"
    i = STEP_BUCKETS.index(bound)
    return f"{int(STEP_BUCKETS[i - 1]) + 1}-{bound} tokens"


class PathRequirements(Strict):
    """Counts vLLM must report over one task, each a range ({min, max}); absent: not required."""

    prefix_cache_hits: CountRange | None = Field(
        default=None, description="Prompt tokens found in the prefix cache instead of computed again.")
    preemptions: CountRange | None = Field(
        default=None, description="Requests preempted for KV-cache room (recomputed later).")
    prompt_tokens: CountRange | None = Field(
        default=None, description="Prompt tokens the engine took in (a window filled: its prompts counted whole).")
    spec_decode_accepted_tokens: CountRange | None = Field(
        default=None, description="Draft tokens the target model accepted (speculative decoding).")
    steps_by_tokens: dict[str, CountRange] = Field(
        default_factory=dict,
        description="Engine steps whose token count falls in one of vLLM's buckets, keyed by the bucket's upper bound "
                    f"({', '.join(STEP_BUCKETS)}): \"1\" holds the steps in which one request decoded alone; with "
                    "one request at a time, the bucket holding max_num_batched_tokens holds the full prefill chunks.")

    @field_validator("steps_by_tokens", mode="before")
    @classmethod
    def _known_buckets(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for key in value:
            if isinstance(key, bool) or str(key) not in STEP_BUCKETS:
                raise ValueError(f"{key!r} is not one of vLLM's buckets of tokens per engine step; "
                                 f"use an upper bound of {', '.join(STEP_BUCKETS)}")
        return {str(k): v for k, v in value.items()}

    @model_validator(mode="after")
    def _requires_something(self) -> "PathRequirements":
        if not self.counted():
            raise ValueError("requires no counter, so no path would be checked; name one (e.g. `prefix_cache_hits: {min: 1}`), "
                             "or remove `requires:` (a scenario task then keeps its own)")
        return self

    def counted(self) -> list[tuple[str, CountRange]]:
        """(counter name as the manifest keys it, range): the requirements, in a fixed order."""
        out = [(name, getattr(self, name)) for name in ("prefix_cache_hits", "preemptions", "prompt_tokens",
                                                        "spec_decode_accepted_tokens") if getattr(self, name) is not None]
        return out + [(f"steps_by_tokens.{k}", r) for k, r in sorted(self.steps_by_tokens.items(), key=lambda kv: int(kv[0]))]


COUNTER_WORDS = {
    "prefix_cache_hits": "prefix-cache hit tokens",
    "preemptions": "preemptions",
    "prompt_tokens": "prompt tokens",
    "spec_decode_accepted_tokens": "accepted draft tokens",
}


def counter_words(name: str) -> str:
    """A requirement's counter as a report says it."""
    if name.startswith("steps_by_tokens."):
        return f"engine steps of {bucket_span(name.removeprefix('steps_by_tokens.'))}"
    return COUNTER_WORDS[name]
