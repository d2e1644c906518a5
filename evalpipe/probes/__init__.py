"""Path probes: evidence, from inside every engine process, of which code a variant ran.

An equivalence proof is void when the variant never took the path it claims (a
plugin left out of the config, a switch that reaches no code, a new layer that falls
back to the old one when one of its conditions fails). The probes record, per process
and rank, what the engine really built and called:

- the model class vLLM instantiated and the class of each decoder layer;
- the switches as the engine resolved them (parallel sizes and ranks, the all2all
  backend, ``use_sequence_parallel_moe``, the attention backends, ``additional_config``,
  configured ``vllm_config`` fields and zero-argument predicates such as vllm-ascend's
  ``enable_dsa_cp()``), read inside the engine, never from evalpipe's config;
- call counts of configured functions and methods and of the collectives (torch.distributed,
  vLLM's group coordinator and ``tensor_model_parallel_*`` wrappers, the reference layout
  model's virtual ones), in total and per forward pass, with the first few shapes.

How they get in: the variant's processes start with :data:`SITE_DIR` first on
``PYTHONPATH`` and :data:`SPEC_ENV` naming a spec file. The ``sitecustomize`` there runs
at every interpreter start (vLLM's API server, each engine core, each worker inherit the
environment), loads :mod:`evalpipe.probes.runtime` and chains to any ``sitecustomize``
it shadows. Nothing is installed into the variant's environment.

Everything in this package is standard library only: it runs inside another build's
interpreter. The parent reads what it writes through typed models
(:mod:`evalpipe.compare.code_paths`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

SPEC_ENV = "EVALPIPE_PROBES"
NODE_ENV = "EVALPIPE_NODE"  # a process's node in a deployment of several (its index), recorded with it
SPEC_FILE = "spec.json"
SCHEMA_VERSION: Final = 1  # Final: the parent's models type it as Literal[1]
SITE_DIR = Path(__file__).resolve().with_name("site")
