"""Changes evalpipe makes inside vLLM's own processes, each asked for by an environment
switch of the variant that needs it (see :mod:`evalpipe.engine_patches.switches`).

vLLM loads :func:`evalpipe.engine_patches.plugin.register` in every process it starts
(entry point ``vllm.general_plugins``). With no switch set it does nothing. Each patch
names the vLLM version it was written for and the upstream issue it works around
(:data:`evalpipe.engine_patches.switches.PATCHES`); tests/engine_patches/test_engine_patches.py fails
when an upgrade breaks one or makes it unnecessary.
"""
