"""Sampled decoding with common random numbers: the `sampling:` settings and the seed of
every sample.

Greedy decoding (no `sampling:`) compares one answer per prompt. With `sampling:` each
item is answered ``samples`` times at the given temperature (and top-p / top-k / min-p),
and every (item, sample) gets its own engine seed, derived from the run's seed and the
sample's identity only. The reference, each variant and the A/A run therefore draw the
same random numbers for the same sample, offline or served, whatever the batch it lands
in: two engines whose distributions agree pick the same tokens, and a divergence can only
come from a difference of the distributions (docs/sampling.md).
"""

from __future__ import annotations

import hashlib

from pydantic import Field, field_validator

from evalpipe.config.strict import Strict

# Seeds fit in 31 bits: the OpenAI API's `seed` is an integer every client sends as one,
# and torch's generators take any non-negative one.
SEED_BITS = 31
# vLLM decodes greedily below this temperature (vllm/sampling_params.py, _SAMPLING_EPS):
# a lower one would be called sampled and decoded greedily.
GREEDY_BELOW = 1e-5


class Sampler(Strict):
    """The sampler, defined once: the temperature and the cuts applied after it, each off at its
    default (top_p 1, top_k null, min_p 0). A task's `sampling:` is one (with its samples and
    seed); compare reads one back from each sampled task's rows, and the reports describe it."""

    temperature: float = Field(ge=GREEDY_BELOW, le=10, allow_inf_nan=False,
                               description=f"Sampling temperature, {GREEDY_BELOW:g} to 10 (vLLM decodes greedily below "
                                           f"{GREEDY_BELOW:g}; greedy decoding is no `sampling:` at all).")
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False, description="Nucleus sampling: the smallest set of tokens whose probability reaches top_p (1: off).")
    top_k: int | None = Field(default=None, ge=1, description="Sample among the k most likely tokens only (null: off).")
    min_p: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False, description="Drop tokens less likely than min_p x the most likely one's probability (0: off).")

    @field_validator("temperature", mode="before")
    @classmethod
    def _not_greedy(cls, value: object) -> object:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < GREEDY_BELOW:
            raise ValueError(f"{value:g} is below {GREEDY_BELOW:g}, where vLLM decodes greedily; leave `sampling:` out "
                             f"for greedy decoding, or give a temperature of {GREEDY_BELOW:g} to 10")
        return value

    @classmethod
    def recorded(cls, temperature: float, top_p: float, top_k: int | None, min_p: float) -> Sampler:
        """The sampler as a sample's row or a comparison records it, where top_k 0 is off (vLLM's word for it)."""
        return cls(temperature=temperature, top_p=top_p, top_k=top_k or None, min_p=min_p)

    @property
    def vllm_top_k(self) -> int:
        """top_k as vLLM takes it and the rows record it: 0 is off."""
        return self.top_k or 0

    def describe(self) -> str:
        """"temperature 0.6, top_p 0.95": the temperature and the cuts that are on."""
        cuts = [f"top_p {self.top_p:g}" if self.top_p < 1 else "", f"top_k {self.top_k}" if self.top_k else "",
                f"min_p {self.min_p:g}" if self.min_p else ""]
        return f"temperature {self.temperature:g}" + "".join(f", {c}" for c in cuts if c)


class Sampling(Sampler):
    """How a task's generations are sampled (absent: greedy, one answer per item)."""

    samples: int = Field(default=1, ge=1, le=1024, description="Samples per item (n of avg@n and pass@k); each has its own seed.")
    seed: int | None = Field(default=None, ge=0, description="Base of every sample's seed (default: the run's `seed`).")


def sample_seed(base: int, task: str, doc_id: int, request: int, sample: int) -> int:
    """The engine seed of one sample: a hash of the base seed and the sample's identity
    (task, document, request index within the document, sample index), so it is the same in
    every variant and run that asks for the same sample, and never depends on the order or
    batch the request is sent in."""
    text = f"{int(base)}:{task}:{int(doc_id)}:{int(request)}:{int(sample)}"
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << SEED_BITS) - 1)
