"""vLLM general plugin (entry point ``vllm.general_plugins`` -> ``evalpipe_layout``).

vLLM calls ``register`` in every process it starts, the spawned engine core included.
The model is registered by name only, so this stays cheap: the module holding the model
(and its torch imports) loads when an engine actually asks for the architecture.
"""

from __future__ import annotations

ARCHITECTURE = "EvalpipeLayoutForCausalLM"
MODEL_CLASS = "evalpipe.lab.layout.model:LayoutForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
