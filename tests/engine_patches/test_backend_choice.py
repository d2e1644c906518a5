"""The attention backend vLLM's CPU build picks follows the processor: the shipped
DeepSeek-family configs pin the one they mean, on every x86 kind.

vLLM's own selection code is run here for both kinds of processor, the one this machine is
and the other, by answering its AMX question both ways (the AMD EPYC kind has no AMX tiles,
the Intel Xeon kind has them): the pinned configs get CPU_MLA on both, an unpinned float32
MLA config gets AMX_MLA, which cannot load it, wherever AMX exists. docs/sp-moe.md has the
upstream behaviour and a reproduction."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpipe.config.loading import load_config
from evalpipe.engine_patches import backend_choice
from evalpipe.install import default_config
from evalpipe.models.builtin import ensure_builtin
from evalpipe.pipeline.plan import make_plan
from evalpipe.probing import backends

CONFIGS = sorted(default_config().parent.glob("*.yaml"))
KINDS = {"AMD EPYC kind (no AMX)": False, "Intel Xeon kind (AMX tiles)": True}


@pytest.fixture(params=list(KINDS), ids=list(KINDS))
def processor(request, monkeypatch) -> bool:
    import torch

    amx = KINDS[request.param]
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    return amx


def _mla_variants() -> list[tuple[str, str]]:
    """(config, variant) for every shipped CPU config whose model vLLM serves with MLA."""
    found = []
    for path in CONFIGS:
        config = load_config(path)
        if config.model.path == "builtin:tiny-moe":
            found += [(path.name, name) for name in config.variants]
    return found


def _plan_variant(config_name: str, variant: str, tmp_path: Path):
    plan = make_plan(load_config(default_config().with_name(config_name)), config_name, "gsm8k", run_id="r",
                     output=str(tmp_path), noise_floor=False)
    return next(v for v in plan.variants if v.name == variant)


def test_the_deepseek_configs_are_the_ones_found():
    found = {name for name, _ in _mla_variants()}
    assert found == {"sp_moe.yaml", "rotary_control.yaml"}, found  # a new MLA config is held to the rule below


@pytest.mark.parametrize(("config_name", "variant"), _mla_variants())
def test_every_mla_variant_gets_the_backend_it_pins_and_expects_on_both_kinds(config_name, variant, processor, tmp_path):
    v = _plan_variant(config_name, variant, tmp_path)
    assert v.engine_args["attention_backend"] == "CPU_MLA"
    expected = backends.expected_backends(v.expect.switches)
    assert expected == ["CPU_MLA"]  # the probes hold every worker to it: another backend is INCONCLUSIVE
    choice = backends.BackendChoice(**backend_choice.choose(backends.request(ensure_builtin("tiny-moe").path, v.engine_args)))
    assert (choice.backend, choice.use_mla, choice.dtype, choice.amx_tile) == ("CPU_MLA", True, "float32", processor)
    ok, detail = backends.judge(choice, expected)
    assert ok, detail


def test_unpinned_the_same_model_gets_amx_mla_where_amx_exists_and_cannot_load(processor, tmp_path):
    v = _plan_variant("rotary_control.yaml", "native", tmp_path)
    args = {**v.engine_args, "attention_backend": None}
    choice = backends.BackendChoice(**backend_choice.choose(backends.request(ensure_builtin("tiny-moe").path, args)))
    ok, detail = backends.judge(choice, None)
    if processor:
        assert choice.backend == "AMX_MLA" and choice.supported_dtypes == ["bfloat16"]
        assert not ok and "takes bfloat16 weights, not float32" in detail and "attention_backend: CPU_MLA" in detail, detail
    else:
        assert choice.backend == "CPU_MLA" and ok, detail
    # bfloat16 loads on either, on another kernel per kind: only an expectation catches that
    bf16 = backends.BackendChoice(**backend_choice.choose(backends.request(ensure_builtin("tiny-moe").path, {**args, "dtype": "bfloat16"})))
    assert bf16.backend == ("AMX_MLA" if processor else "CPU_MLA")
    ok, detail = backends.judge(bf16, ["CPU_MLA"])
    assert ok is (not processor), detail


def _choice(**kw) -> backends.BackendChoice:
    base = {"use_mla": True, "dtype": "float32", "backend": "CPU_MLA", "supported_dtypes": ["float16", "bfloat16", "float32"],
            "amx_tile": False, "avx512_bf16": False}
    return backends.BackendChoice(**{**base, **kw})


def test_judge_refuses_a_dtype_the_backend_cannot_load():
    ok, detail = backends.judge(_choice(backend="AMX_MLA", supported_dtypes=["bfloat16"], amx_tile=True), None)
    assert not ok
    assert detail.startswith("vLLM's CPU platform builds AMX_MLA for this MLA model (this processor has AMX tiles)"), detail
    assert "set engine `attention_backend: CPU_MLA`" in detail and "`model.dtype: bfloat16`" in detail


def test_judge_refuses_a_backend_other_than_the_expected_one():
    ok, detail = backends.judge(_choice(), ["AMX_MLA"])
    assert not ok and "INCONCLUSIVE" in detail and "attention_backend: AMX_MLA" in detail, detail
    assert backends.judge(_choice(), ["CPU_MLA"]) == (True, "vLLM's CPU platform builds CPU_MLA for this MLA model "
                                                      "(this processor has neither AMX tiles nor AVX-512 bf16), float32, as expected")
    assert backends.judge(_choice(use_mla=False, backend="CPU_ATTN"), None)[0]


def test_expected_backends_reads_the_switch_as_configs_write_it():
    assert backends.expected_backends({}) is None
    assert backends.expected_backends({"attention_backends": "CPU_MLA"}) == ["CPU_MLA"]
    assert backends.expected_backends({"attention_backends": ["CPU_MLA"], "dtype": "float32"}) == ["CPU_MLA"]


def test_the_probes_name_the_kernels_the_processor_chose():
    """What the what-ran table's cpu_kernels row shows: the attention ISA vLLM's CPU build set
    on each layer, and the op each linear layer's GEMM lambda calls."""
    import torch

    from evalpipe.probes.engine_hooks import cpu_kernels

    class Ops:
        @staticmethod
        def onednn_mm(handler, x, bias):
            return x

    ops = Ops()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.ReLU())
    model[0].isa = "amx"
    model[0].cpu_linear = lambda x, weight, bias: ops.onednn_mm(None, x, bias)
    model[1].cpu_linear = torch.nn.functional.linear
    assert cpu_kernels(model) == {"attention_isa": ["amx"], "linear": ["linear", "onednn_mm"]}
    assert cpu_kernels(torch.nn.Sequential(torch.nn.ReLU())) == {}  # another platform: nothing to show
