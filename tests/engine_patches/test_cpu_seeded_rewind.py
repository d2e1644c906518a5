"""evalpipe/engine_patches/cpu_seeded_rewind.py: a seeded request whose sampled token is
discarded (its prefill split across steps) draws next what its seed starts with, on CPU
generators, which have no offset to rewind. The runner here is a stand-in with vLLM's
fields and vLLM's own rewinding loop (``gen.set_offset(gen.get_offset() - 4)``), which
fails on a CPU generator as vLLM 0.32.0's CPU build fails; the real engine's evidence is
tests/e2e/test_sampling.py (the A/A run repeating every sample with prefills split at
other places)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from evalpipe.engine_patches.cpu_seeded_rewind import rewinding

VOCAB = 50


class Runner:
    """What the wrapped methods read: the input batch's generators, its size, the discard mask."""

    def __init__(self, seeds: list[int], discard: list[bool]):
        self.input_batch = types.SimpleNamespace(
            generators={i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}, num_reqs=len(seeds))
        self.discard_request_mask = types.SimpleNamespace(np=np.array(discard))
        self.drawn: list[torch.Tensor] = []


def vllm_sample(self: Runner) -> None:
    q = torch.empty(len(self.input_batch.generators), VOCAB)
    for i, g in self.input_batch.generators.items():
        q[i].exponential_(generator=g)
    self.drawn.append(q)


def vllm_bookkeeping(self: Runner) -> None:
    for i in np.nonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])[0]:
        gen = self.input_batch.generators.get(int(i))
        if gen is not None:
            gen.set_offset(gen.get_offset() - 4)


def first_draw(seed: int) -> torch.Tensor:
    return torch.empty(VOCAB).exponential_(generator=torch.Generator().manual_seed(seed))


def test_vllm_s_own_rewind_fails_on_a_cpu_generator():
    runner = Runner([1, 2], [True, False])
    vllm_sample(runner)
    with pytest.raises(RuntimeError, match="does not use offset"):
        vllm_bookkeeping(runner)


def test_a_discarded_draw_is_taken_back_and_a_kept_one_is_not():
    sample, bookkeeping = rewinding(vllm_sample, vllm_bookkeeping)
    runner = Runner([11, 12, 13], [True, False, True])
    for _ in range(3):  # a prefill split over three steps for requests 0 and 2
        sample(runner)
        bookkeeping(runner)
    runner.discard_request_mask.np[:] = False
    sample(runner)
    last = runner.drawn[-1]
    assert torch.equal(last[0], first_draw(11)) and torch.equal(last[2], first_draw(13))
    # request 1 kept every token: its fourth draw follows its third
    g = torch.Generator().manual_seed(12)
    for _ in range(4):
        expected = torch.empty(VOCAB).exponential_(generator=g)
    assert torch.equal(last[1], expected)
    assert set(runner.input_batch.generators) == {0, 1, 2}, "every generator is back in the batch"


def test_a_greedy_batch_has_no_generator_and_nothing_changes():
    sample, bookkeeping = rewinding(vllm_sample, vllm_bookkeeping)
    runner = Runner([], [])
    sample(runner)
    bookkeeping(runner)
    assert runner.input_batch.generators == {}
