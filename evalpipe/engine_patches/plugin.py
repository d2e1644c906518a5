"""vLLM general plugin (entry point ``vllm.general_plugins`` -> ``evalpipe_engine_patches``).

vLLM calls :func:`register` in every process it starts: the API server, each engine core
and each worker. Every patch is applied in all of them or in none, so the processes of
one engine agree. Nothing happens unless a switch asks for it, with one exception: on the
CPU platform seeded sampling is fixed to survive a split prefill (cpu_seeded_rewind.py),
where vLLM 0.32.0 fails instead. A switch that asks for a CPU workaround on another
platform is refused, since the workarounds were written for the CPU build's classes only.
"""

from __future__ import annotations

import os
import sys

from evalpipe.engine_patches import cpu_collectives, cpu_experts, cpu_seeded_rewind, sp_moe
from evalpipe.engine_patches.switches import CPU_EP_ENV, PATCHES, requested
from evalpipe.errors import UserError

# What register() changed in this process, for the path probes: a variant's config expects
# `evalpipe.engine_patches.plugin.installed()` to name its patches in every process that
# builds the model, so a switch that reached no engine (the plugin not installed in that
# interpreter, a typo in the variable's name) cannot pass as the path it claims.
_INSTALLED: list[str] = []


def _fix_seeded_sampling_on_cpu() -> None:
    """The one change made without a switch: without it the CPU build fails every seeded
    request whose prefill is split (cpu_seeded_rewind.py), so a sampled comparison could not
    run; where the build does not fail it changes nothing. Other platforms are left alone."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # not inside a vLLM process
        return
    if current_platform.is_cpu():
        cpu_seeded_rewind.install()


def installed() -> list[str]:
    """The names of the patches (switches.PATCHES) active in this process, sorted."""
    return sorted(_INSTALLED)


def register() -> None:
    _fix_seeded_sampling_on_cpu()
    wanted = requested(os.environ)
    if not wanted.anything:
        return
    if wanted.cpu_ep:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            raise UserError(f"{CPU_EP_ENV}=1 asks for vLLM CPU-build workarounds on a "
                            f"{type(current_platform).__name__}; remove it from this variant's env.")
        cpu_collectives.install()
        cpu_experts.install()
        _INSTALLED.extend(p.name for p in PATCHES if p.switch == f"{CPU_EP_ENV}=1")
    if wanted.sp_moe != "vllm":
        if wanted.sp_moe == "replicated":
            sp_moe.install_replicated()
        else:
            sp_moe.install_fixed()
        _INSTALLED.append(f"sp_moe_{wanted.sp_moe}")
    sys.stderr.write(f"evalpipe engine patches active in process {os.getpid()}: "
                     f"cpu_ep={int(wanted.cpu_ep)} sp_moe={wanted.sp_moe}\n")
