"""evalpipe/engine_patches/plugin.py: vLLM's plugin entry point changes only what the switches ask for, in a fresh interpreter as vLLM's processes load it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evalpipe.engine_patches.switches import CPU_EP_ENV, SP_MOE_ENV

_REGISTER = """
import os, sys
from evalpipe.engine_patches import plugin
plugin.register()
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
from vllm.config.parallel import ParallelConfig
from vllm.model_executor.models import deepseek_v2
print(CpuCommunicator.all_gatherv.__module__, getattr(CPUUnquantizedExperts.apply, "__evalpipe_patch__", False),
      getattr(ParallelConfig.use_sequence_parallel_moe.fget, "__evalpipe_patch__", False),
      getattr(deepseek_v2.DeepseekV2DecoderLayer.forward, "__evalpipe_patch__", False),
      getattr(deepseek_v2.DeepseekV2Model.forward, "__evalpipe_patch__", False))
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
print("seeded rewind", getattr(GPUModelRunner, "_evalpipe_rewinds_cpu_generators", False))
"""


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "vllm.distributed.device_communicators.base_device_communicator False False False False"),
    ({SP_MOE_ENV: "replicated"}, "vllm.distributed.device_communicators.base_device_communicator False True False False"),
    ({CPU_EP_ENV: "1", SP_MOE_ENV: "fixed"}, "evalpipe.engine_patches.cpu_collectives True False True True"),
])
def test_the_plugin_changes_only_what_the_switches_ask_for(env, expected, tmp_path):
    import os

    clean = {k: v for k, v in os.environ.items() if k not in (CPU_EP_ENV, SP_MOE_ENV)}
    out = subprocess.run([sys.executable, "-c", _REGISTER], env={**clean, **env}, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    *_, switched, rewind = out.stdout.strip().splitlines()
    assert switched == expected
    assert rewind == "seeded rewind True", "on the CPU platform seeded sampling is always fixed (cpu_seeded_rewind)"
    assert ("engine patches active" in out.stderr) == bool(env)
