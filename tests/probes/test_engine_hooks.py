"""evalpipe/probes/engine_hooks.py, its pieces in this process (the hooks inside a fresh
interpreter are tests/probes/test_runtime.py): config paths read through objects and dicts,
a collective named by its group (none when the group has one rank: vLLM sends nothing),
the tokens of a forward pass, the decoder layers by class, and the processor-chosen CPU
kernels of a model."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from evalpipe.probes.engine_hooks import _group_collective, _tokens, attribute_path, cpu_kernels, decoder_layers


def test_a_config_path_reads_through_objects_and_dicts():
    config = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=2), additional_config={"layout": {"sp": True}})
    assert attribute_path(config, "parallel_config.tensor_parallel_size") == 2
    assert attribute_path(config, "additional_config.layout.sp") is True


def test_a_collective_is_named_by_its_group_and_a_one_rank_group_sends_nothing():
    assert _group_collective("all_reduce", (SimpleNamespace(world_size=2, unique_name="tp:0"),)) == "all_reduce@tp"
    assert _group_collective("all_gather", (SimpleNamespace(world_size=1, unique_name="tp:0"),)) is None


def test_the_tokens_of_a_pass_are_the_fewest_its_inputs_hold():
    assert _tokens((torch.zeros(5), torch.zeros(5)), {}) == 5
    assert _tokens((), {"input_ids": torch.zeros(5), "positions": torch.zeros(0)}) == 0
    assert _tokens((None, None, None, torch.zeros(3, 8)), {}) == 3
    assert _tokens((), {}) is None


class PPMissingLayer(torch.nn.Module):
    """What vLLM puts where another pipeline stage holds the layer."""


def test_decoder_layers_by_class_without_pipeline_placeholders_and_the_cpu_kernels():
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), PPMissingLayer()])
    assert decoder_layers(model) == {"torch.nn.modules.linear.Linear": 2}
    attention = torch.nn.Module()
    attention.isa = "amx"
    linear = torch.nn.Linear(2, 2)
    linear.cpu_linear = lambda x: ops.onednn_mm(x)  # noqa: F821 - never called: vLLM binds each GEMM so
    model.attn, model.proj = attention, linear
    assert cpu_kernels(model) == {"attention_isa": ["amx"], "linear": ["onednn_mm"]}
    assert cpu_kernels(torch.nn.Linear(2, 2)) == {}
