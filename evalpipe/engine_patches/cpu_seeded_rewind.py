"""Seeded sampling through a split prefill on vLLM's CPU build.

Every step vLLM samples a token for each scheduled request, also for one whose prompt is
only partly prefilled (its prefill split across steps: chunked prefill, or the last
request of a step's token budget); that token is discarded, and a seeded request's
generator is rewound so that its first real draw is the one its seed starts with:
``gen.set_offset(gen.get_offset() - 4)`` in ``GPUModelRunner._bookkeeping_sync``
(vllm/v1/worker/gpu_model_runner.py), an offset into Philox's stream, which CUDA
generators have. A CPU generator (mt19937) has no offset: ``get_offset`` raises "CPU
Generator does not use offset", so vLLM 0.32.0's CPU build fails the engine at the first
step that splits a seeded request's prompt. Measured: 60 GSM8K items x 2 samples with the
default config's 8192-token steps fail at once; 12 short prompts do not.

The patch rewinds a CPU generator the one way it can be: ``_sample`` keeps every CPU
generator's state before the step's draw, and ``_bookkeeping_sync`` puts it back for the
requests whose token is discarded and hides those from vLLM's own loop for the call. A
seeded request's draws are then its seed's stream from its first real token on, whatever
the step its prefill was split at: the common random numbers of a sampled comparison
(docs/sampling.md). Greedy requests have no generator and meet none of this.

Installed in every process of a CPU engine by the plugin (plugin.py), since without it
the CPU build cannot serve a seeded request longer than what is left of a step.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

MARK = "_evalpipe_rewinds_cpu_generators"
STATES = "_evalpipe_generator_states"


def rewinding(sample: Callable[..., Any], bookkeeping: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The runner's ``_sample`` and ``_bookkeeping_sync`` wrapped: the first keeps every CPU
    generator's state before the step's draw, the second restores it for the discarded
    requests and hides them from the original for the call."""

    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        setattr(self, STATES, {i: g.get_state() for i, g in generators.items() if g.device.type == "cpu"})
        return sample(self, *args, **kwargs)

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        states = getattr(self, STATES, {})
        generators = self.input_batch.generators
        discarded = np.nonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])[0]
        rewound = {}
        for i in (int(i) for i in discarded):
            if i in states and i in generators:
                generators[i].set_state(states[i])
                rewound[i] = generators.pop(i)
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(rewound)

    return _sample, _bookkeeping_sync


def install() -> None:
    """Wrap GPUModelRunner's _sample and _bookkeeping_sync (the CPU runner inherits both); once."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, MARK, False):
        return
    sample, bookkeeping = rewinding(GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync)
    GPUModelRunner._sample = sample  # type: ignore[method-assign]
    GPUModelRunner._bookkeeping_sync = bookkeeping  # type: ignore[method-assign]
    setattr(GPUModelRunner, MARK, True)
