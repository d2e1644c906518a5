"""evalpipe's changes inside vLLM's processes (evalpipe/engine_patches): the switches, the
CPU expert-parallel workarounds on real gloo collectives, the SP-MoE fix against the
installed vLLM's source. The tests that name the installed vLLM fail when an upgrade
breaks a patch or makes it unnecessary: then re-check docs/sp-moe.md."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from evalpipe.engine_patches import checks, cpu_collectives, cpu_experts, sp_moe
from evalpipe.engine_patches.switches import CPU_EP_ENV, SP_MOE_ENV, requested


def test_switches_default_to_nothing_and_refuse_unknown_values():
    assert not requested({}).anything
    assert requested({CPU_EP_ENV: "1", SP_MOE_ENV: "Replicated"}) == requested({CPU_EP_ENV: "on", SP_MOE_ENV: "replicated"})
    with pytest.raises(ValueError, match=r"EVALPIPE_SP_MOE='sp' is not a layout; valid values: vllm, replicated, fixed"):
        requested({SP_MOE_ENV: "sp"})
    with pytest.raises(ValueError, match=r"EVALPIPE_CPU_EP='yes please' is not a switch value"):
        requested({CPU_EP_ENV: "yes please"})


def test_the_layout_models_switches_are_checked_with_the_zoos_own_names():
    from evalpipe.engine_patches.switches import LAYOUT_FAULT_NAMES, check_env
    from evalpipe.lab.layout.faults import FAULTS

    assert LAYOUT_FAULT_NAMES == tuple(FAULTS)  # the planner's list is the zoo's
    check_env({"EVALPIPE_LAYOUT": "sp", "EVALPIPE_LAYOUT_FAULT": "none, shard_offset"})
    with pytest.raises(ValueError, match=r"EVALPIPE_LAYOUT='SP' is not a layout; valid values: legacy, sp"):
        check_env({"EVALPIPE_LAYOUT": "SP"})
    for slip in ("", " sp", "sp "):  # set, but to no layout as written (the input fuzzer found "")
        with pytest.raises(ValueError, match="is not a layout"):
            check_env({"EVALPIPE_LAYOUT": slip})
    check_env({})  # unset: the default layout
    with pytest.raises(ValueError, match=r"unknown fault 'shard_ofset'"):
        check_env({"EVALPIPE_LAYOUT_FAULT": "shard_ofset"})


# ----------------------------------------------------------------------------- collectives on gloo


def _rank_main(rank: int, world: int, port: int, results) -> None:  # noqa: ANN001
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    comm = SimpleNamespace(world_size=world, rank_in_group=rank, device_group=dist.group.WORLD)
    sizes = [3, 1, 0, 2][:world]
    mine = torch.arange(sizes[rank] * 4, dtype=torch.float32).reshape(sizes[rank], 4) + 100 * rank
    gathered = cpu_collectives.all_gatherv(comm, [mine, mine[:, :1].to(torch.int64)], dim=0, sizes=sizes)
    full = torch.arange(sum(sizes) * 2, dtype=torch.float64).reshape(2, sum(sizes)) * (rank + 1)
    scattered = cpu_collectives.reduce_scatterv(comm, full, dim=1, sizes=sizes)
    even = cpu_collectives.all_gatherv(comm, mine[:1] if sizes[rank] else torch.zeros(1, 4), dim=0)
    results[rank] = (gathered[0], gathered[1], scattered, even)
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uneven_all_gather_and_reduce_scatter_on_real_gloo_ranks():
    world, sizes = 4, [3, 1, 0, 2]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(world, _free_port(), results), nprocs=world, join=True)
        results = dict(results)
    pieces = [torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + 100 * r for r, n in enumerate(sizes)]
    whole = torch.cat(pieces)
    total = torch.arange(sum(sizes) * 2, dtype=torch.float64).reshape(2, sum(sizes)) * sum(range(1, world + 1))
    starts = [sum(sizes[:r]) for r in range(world)]
    for rank in range(world):
        gathered, ids, scattered, even = results[rank]
        assert torch.equal(gathered, whole)  # every rank: every rank's rows, in rank order, no padding
        assert ids.dtype == torch.int64 and torch.equal(ids, whole[:, :1].to(torch.int64))
        assert torch.equal(scattered, total[:, starts[rank]:starts[rank] + sizes[rank]])  # sum kept along dim 1
        assert even.shape == (world, 4)


def test_collectives_refuse_sizes_that_do_not_fit():
    comm = SimpleNamespace(world_size=2, rank_in_group=0, device_group=None)
    with pytest.raises(ValueError, match="this rank holds 2 rows, sizes say 1"):
        cpu_collectives.all_gatherv(comm, torch.zeros(2, 3), sizes=[1, 1])
    with pytest.raises(ValueError, match="sizes sum to 3, the tensor has 4 rows"):
        cpu_collectives.reduce_scatterv(comm, torch.zeros(4, 3), dim=0, sizes=[1, 2])


def test_routing_to_other_ranks_experts_weighs_nothing():
    expert_map = torch.tensor([-1, -1, 0, 1, -1, -1, -1, -1], dtype=torch.int32)  # this rank: experts 2, 3
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3]])
    ids = torch.tensor([[3, 5], [0, 2]], dtype=torch.int32)
    local_weights, local_ids = cpu_experts.localize_routing(weights, ids, expert_map)
    assert local_ids.dtype == ids.dtype
    assert local_ids.tolist() == [[1, 0], [0, 0]]
    assert torch.equal(local_weights, torch.tensor([[0.6, 0.0], [0.0, 0.3]]))


# ----------------------------------------------------------------------------- the installed vLLM


@pytest.mark.parametrize("check", [checks.plugin_registered, checks.vllm_version, checks.cpu_collectives_gap,
                                   checks.cpu_experts_gap, checks.sp_moe_fix_applies])
def test_each_patch_still_fits_the_installed_vllm(check):
    """An upgrade fails here first (evalpipe doctor says the same for a variant's own
    interpreter): a patch that no longer applies, a gap upstream has closed, another
    version than the patches were written for. Then re-check docs/sp-moe.md."""
    name, ok, detail = check()
    assert ok, f"{name}: {detail}"


def test_a_check_fails_when_its_gap_is_closed(monkeypatch):
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    monkeypatch.setattr(CpuCommunicator, "all_gatherv", cpu_collectives.all_gatherv, raising=False)
    name, ok, detail = checks.cpu_collectives_gap()
    assert not ok and "unnecessary" in detail


def test_the_sp_moe_fix_still_applies_to_vllms_source():
    from vllm.model_executor.models import deepseek_v2

    for qualname, edits in sp_moe.EDITS.items():
        source = textwrap.dedent(inspect.getsource(getattr(deepseek_v2, qualname.split(".")[0]).forward))
        fixed = sp_moe.edited_source(qualname, source)
        for _old, new in edits:
            assert new in fixed
        compile(fixed, qualname, "exec")
    with pytest.raises(sp_moe.SourceChanged, match="no longer contains"):
        sp_moe.edited_source("DeepseekV2DecoderLayer.forward", "def forward(self):\n    return 1\n")


def _config(layer_sp: bool, pp: int = 1):
    hf = SimpleNamespace(n_routed_experts=8, first_k_dense_replace=1, moe_layer_freq=1)
    parallel = SimpleNamespace(use_sequence_parallel_moe=layer_sp, pipeline_parallel_size=pp)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf), parallel_config=parallel)


def test_a_layers_input_is_a_shard_exactly_after_an_sp_moe_layer():
    on = _config(True)
    assert [sp_moe.input_is_sequence_parallel(on, i) for i in range(4)] == [False, False, True, True]
    assert not any(sp_moe.input_is_sequence_parallel(_config(False), i) for i in range(4))
    assert not any(sp_moe.input_is_sequence_parallel(_config(True, pp=2), i) for i in range(4))


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
    assert out.stdout.strip().splitlines()[-1] == expected
    assert ("engine patches active" in out.stderr) == bool(env)


def _rotary(heads: int, key_heads: int, flat: bool) -> tuple[float, float]:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=4096, is_neox_style=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(6)
    q = torch.randn(6, heads, 64, generator=generator)
    k = torch.randn(6, key_heads, 64, generator=generator)
    q_native, k_native = rope.forward_native(positions, q.clone(), k.clone())
    q_in, k_in = (q.reshape(6, -1).clone(), k.reshape(6, -1).clone()) if flat else (q.clone(), k.clone())
    q_op, k_op = rope.forward_cpu(positions, q_in, k_in)
    return (float((q_op.reshape(q.shape) - q_native).abs().max()), float((k_op.reshape(k.shape) - k_native).abs().max()))


def test_the_cpu_rotary_op_mis_rotates_a_3d_multi_head_query():
    """What configs/rotary_control.yaml shows on the model: MLA hands vLLM's CPU rotary op its
    query as [tokens, heads, 64]; with more than one head the op rotates it wrongly (the same
    values as [tokens, heads x 64] come out right). When an upgrade fixes the op, this fails:
    the control's expected verdict changes (docs/sp-moe.md)."""
    assert _rotary(1, 1, flat=False) == (0.0, 0.0)
    assert _rotary(2, 1, flat=True) == (0.0, 0.0)
    q_error, k_error = _rotary(2, 1, flat=False)
    assert q_error > 0.5 and k_error == 0.0, (q_error, k_error)
