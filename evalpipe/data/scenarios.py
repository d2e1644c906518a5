"""Engine-path scenarios: request sets built from the model's own tokenizer that drive one
scheduler path each, shipped as lm-eval tasks (``tasks/scenarios/``) like the long-context
probes, and scored the same way (a value retrieved from the prompt, exact match).

* ``scenario_prefix_cache``  one document of ``prefix_tokens`` tokens with ``prefix_questions``
  keys hidden in it, asked one per request: every request shares the document (several KV
  blocks) and differs only after it. Sent first-alone-then-together (schedule
  ``prime_first``), all but the first find the document in the prefix cache.
* ``scenario_chunked_prefill`` one pass key per prompt, each prompt ``chunk_tokens`` plus an
  offset long (default offsets: one token over, and one under, at and over the tensor-parallel
  shard edges of 4 and 16 ranks and a 128-token KV block), so the prefill is cut into chunks
  whose last one ends at those edges. Sent one at a time, each prompt is prefilled in chunks of
  ``chunk_tokens`` (the engine's max_num_batched_tokens).
* ``scenario_near_limit``    pass keys in prompts that fill the context window up to the room
  the answer needs (``window_tokens`` less the task's max_gen_toks, and a token less).
* ``scenario_speculative``   ``speculative_requests`` pass keys in prompts of ``speculative_tokens``,
  answered at length, for an engine with speculative decoding (``speculative_config``; the
  CPU build runs vLLM's n-gram proposer, which needs no draft model): drafted tokens verified
  in multi-token passes.
* ``scenario_preemption``    ``preempt_requests`` pass keys, each prompt ``preempt_tokens`` long
  (a whole number of KV blocks), sent at once: under a KV cache that holds fewer of them (the
  engine's num_gpu_blocks_override), the admitted requests fill it, the first decode step of
  each needs a new block, and the scheduler preempts requests and computes them again.

Every prompt length is exact under the tokenizer (evalpipe.data.longctx does the fitting).
``chunk_tokens`` and ``window_tokens`` default to the run's engine arguments
(max_num_batched_tokens, max_model_len), resolved once for the run so that every variant gets
the same prompts (:meth:`ScenarioSpec.resolved`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalpipe import atomic_files
from evalpipe.data import longctx
from evalpipe.errors import UserError

GENERATOR_VERSION = 1
DATA_DIR_NAME = "scenarios"
ScenarioName = Literal["scenario_prefix_cache", "scenario_chunked_prefill", "scenario_near_limit", "scenario_preemption",
                       "scenario_speculative"]
MAX_GEN_TOKS = 16  # the scenario YAMLs' max_gen_toks (a five-digit value and the stop)
TEST_SEED = 6_000_101


class ScenarioSpec(BaseModel):
    """Sizes of the scenarios' prompts (in the tokenizer's tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix_tokens: int = Field(default=1024, ge=longctx.MIN_LENGTH, strict=True,
                               description="scenario_prefix_cache: length of each prompt; the shared document is all of "
                                           "it but the last question (make it several KV blocks: vLLM caches whole blocks).")
    prefix_questions: int = Field(default=16, ge=2, le=len(longctx.KEY_WORDS), strict=True,
                                  description="scenario_prefix_cache: requests sharing the document (the first primes the cache).")
    chunk_tokens: int | None = Field(default=None, ge=longctx.MIN_LENGTH, strict=True,
                                     description="scenario_chunked_prefill: the prefill chunk its prompts exceed; default the "
                                                 "engine's max_num_batched_tokens.")
    chunk_offsets: tuple[int, ...] = Field(default=(1, 3, 4, 5, 15, 16, 17, 127, 128, 129), min_length=1,
                                           description="scenario_chunked_prefill: tokens past one chunk, one prompt each.")
    window_tokens: int | None = Field(default=None, ge=longctx.MIN_LENGTH + MAX_GEN_TOKS + 1, strict=True,
                                      description="scenario_near_limit: the context window its prompts fill; default the "
                                                  "engine's max_model_len.")
    preempt_tokens: int = Field(default=256, ge=longctx.MIN_LENGTH, strict=True,
                                description="scenario_preemption: length of each prompt; a whole number of KV blocks, so "
                                            "that its first decode step needs a new block.")
    preempt_requests: int = Field(default=24, ge=2, strict=True,
                                  description="scenario_preemption: requests sent at once (more than the KV cache holds).")
    speculative_tokens: int = Field(default=512, ge=longctx.MIN_LENGTH, strict=True,
                                    description="scenario_speculative: length of each prompt.")
    speculative_requests: int = Field(default=8, ge=1, strict=True,
                                      description="scenario_speculative: requests, each answered at length (the drafts' "
                                                  "chance to be accepted).")
    value_digits: int = Field(default=5, ge=1, le=9, strict=True, description="Digits of every value asked for.")
    seed: int = Field(default=TEST_SEED, ge=0, strict=True)

    @model_validator(mode="after")
    def _check(self) -> ScenarioSpec:
        if any(isinstance(o, bool) or o < 1 for o in self.chunk_offsets):
            raise ValueError(f"chunk_offsets {list(self.chunk_offsets)} must be whole numbers of 1 or more "
                             "(tokens past the chunk: 0 would not cut the prefill).")
        return self

    def resolved(self, engine_args: dict[str, Any]) -> ScenarioSpec:
        """This spec with the sizes it leaves to the engine taken from the run's engine arguments
        (a value that is no whole number is left to the engine arguments' own check, which
        refuses it in its words)."""
        update: dict[str, Any] = {}
        for field, arg in (("chunk_tokens", "max_num_batched_tokens"), ("window_tokens", "max_model_len")):
            value = engine_args.get(arg)
            if getattr(self, field) is None and isinstance(value, int) and not isinstance(value, bool):
                update[field] = value
        return self.model_copy(update=update)

    def lengths(self, name: str) -> list[tuple[int, list[str]]]:
        """(prompt length, tags) of one scenario's prompts (a resolved spec)."""
        if name == "scenario_prefix_cache":
            return [(self.prefix_tokens, ["shared-prefix"])]
        if name == "scenario_chunked_prefill":
            chunk = self._needed("chunk_tokens", "max_num_batched_tokens", name)
            return [(chunk + o, [f"chunk+{o}"]) for o in sorted(set(self.chunk_offsets))]
        if name == "scenario_preemption":
            return [(self.preempt_tokens, ["preempt"])]
        if name == "scenario_speculative":
            return [(self.speculative_tokens, ["speculative"])]
        if name != "scenario_near_limit":
            raise UserError(f"`{name}` has no generated prompts; those are {', '.join(GENERATED_SCENARIOS)}.")
        window = self._needed("window_tokens", "max_model_len", name)
        return [(window - MAX_GEN_TOKS - 1, ["window-1"]), (window - MAX_GEN_TOKS, ["window"])]

    def requests(self, name: str) -> int:
        """How many requests one generated scenario sends (a resolved spec)."""
        per_length = {"scenario_prefix_cache": self.prefix_questions, "scenario_preemption": self.preempt_requests,
                      "scenario_speculative": self.speculative_requests}.get(name, 1)
        return len(self.lengths(name)) * per_length

    def _needed(self, field: str, engine_arg: str, name: str) -> int:
        value = getattr(self, field)
        if value is None:
            raise UserError(f"`{name}` sizes its prompts by the engine's {engine_arg}, which the config leaves to vLLM; "
                            f"set engine.{engine_arg} or scenarios.{field}.")
        return int(value)


@dataclass(frozen=True)
class Scenario:
    """A scenario task: its generator probe (None: the task's own data), how its requests reach
    the engine, and what vLLM's counters must show over it (`requires:` defaults, as run-config mappings)."""

    probe: str | None
    schedule: str
    requires: dict[str, Any]
    what: str
    max_gen_toks: int = MAX_GEN_TOKS  # its task YAML's (tests check they agree)
    needs_engine: str | None = None  # the engine argument without which its path cannot run


SCENARIOS: dict[str, Scenario] = {
    "scenario_prefix_cache": Scenario("multikey", "prime_first", {"prefix_cache_hits": {"min": 1}},
                                      "prefix-cache hits on a shared document"),
    "scenario_chunked_prefill": Scenario("passkey", "one_at_a_time", {}, "prefills cut into chunks at layout edges"),
    "scenario_near_limit": Scenario("passkey", "together", {}, "prompts that fill the context window"),
    "scenario_preemption": Scenario("passkey", "together", {"preemptions": {"min": 1}},
                                    "more requests at once than the KV cache holds: preemption and recompute",
                                    max_gen_toks=128),
    "scenario_speculative": Scenario("passkey", "together", {"spec_decode_accepted_tokens": {"min": 1}},
                                     "speculative decoding: drafts verified in multi-token passes, answered at length",
                                     max_gen_toks=128, needs_engine="speculative_config"),
}
GENERATED_SCENARIOS = tuple(name for name, s in SCENARIOS.items() if s.probe is not None)


def _longctx_spec(spec: ScenarioSpec, name: str) -> longctx.LongCtxSpec:
    lengths = tuple(n for n, _ in spec.lengths(name))
    base = longctx.LongCtxSpec(lengths=lengths, value_digits=spec.value_digits, seed=spec.seed, items_per_length=1)
    if name == "scenario_prefix_cache":  # one document, every key asked once
        n = spec.prefix_questions
        return base.model_copy(update={"items_per_length": n, "questions_per_haystack": n, "n_keys": max(n, 4),
                                       "n_chains": max(n, 3)})
    if name in ("scenario_preemption", "scenario_speculative"):  # a haystack of its own each
        return base.model_copy(update={"items_per_length": spec.requests(name)})
    return base


def generate(name: str, tokenizer: Any, spec: ScenarioSpec) -> list[dict]:
    """The items of one generated scenario (a resolved spec): longctx items with the scenario named."""
    probe = SCENARIOS[name].probe if name in SCENARIOS else None
    if probe is None:
        raise UserError(f"`{name}` is no scenario evalpipe generates; those are {', '.join(GENERATED_SCENARIOS)}.")
    items = longctx.generate_at(probe, tokenizer, _longctx_spec(spec, name), spec.lengths(name))
    return [{**item, "scenario": name, "id": f"{name}-{i}"} for i, item in enumerate(items)]


def fingerprint(name: str, spec: ScenarioSpec, tokenizer: Any) -> str:
    payload = {"generator_version": GENERATOR_VERSION, "longctx_version": longctx.GENERATOR_VERSION, "scenario": name,
               "lengths": spec.lengths(name), "spec": spec.model_dump(mode="json"),
               "tokenizer": longctx.tokenizer_digest(tokenizer)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def write_scenario(name: str, tokenizer: Any, spec: ScenarioSpec, out_root: Path) -> Path:
    """``<out_root>/scenarios/<name>-<fp[:12]>/test.jsonl`` (and meta.json, written last);
    an intact copy with the same fingerprint is left alone."""
    fp = fingerprint(name, spec, tokenizer)
    directory = Path(out_root) / DATA_DIR_NAME / f"{name}-{fp[:12]}"
    data, meta = directory / "test.jsonl", directory / "meta.json"
    try:
        if json.loads(meta.read_text(encoding="utf-8"))["data_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest():
            return data
    except (OSError, ValueError, KeyError):
        pass
    text = "".join(json.dumps(it, sort_keys=True, ensure_ascii=False) + "\n" for it in generate(name, tokenizer, spec))
    atomic_files.write_text(data, text)
    atomic_files.write_json(meta, {"scenario": name, "fingerprint": fp, "spec": spec.model_dump(mode="json"),
                                   "data_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
    return data


_PLACEHOLDER_RE = re.compile(r"^scenarios/(?P<name>[a-z_]+)-\{fingerprint\}/test\.jsonl$")


def is_placeholder(relative: str | Path) -> bool:
    return _PLACEHOLDER_RE.match(Path(relative).as_posix()) is not None


def resolve_data_file(relative: str | Path, tokenizer: Any, spec: ScenarioSpec, data_dir: Path) -> Path | None:
    """For a task's ``scenarios/<name>-{fingerprint}/test.jsonl``: that scenario's set for this
    tokenizer and spec; None for any other path."""
    m = _PLACEHOLDER_RE.match(Path(relative).as_posix())
    return None if m is None else write_scenario(m["name"], tokenizer, spec, data_dir)
