"""evalpipe.compare.code_paths: a variant's probe records against its expectations, what
code it ran, and both sides of a comparison judged; Verdict.with_paths applying it.

Records are built in code (:func:`proc`, :func:`side`); one is a real record the engine
wrote for the reference layout model's sequence-parallel variant (:data:`REAL_RECORD`)."""

from __future__ import annotations

import copy

import pytest

from evalpipe.compare.code_paths import (
    FAILED,
    NOT_RECORDED,
    NOT_VERIFIABLE_ENDPOINT,
    SAME_CODE,
    VERIFIED,
    ModelProbe,
    PathSide,
    ProcessProbe,
    VariantProbes,
    check_side,
    judge_paths,
    per_forward_counts,
    profile,
    profile_names,
    same_value,
    short,
    summarize,
)
from evalpipe.compare.gates import GateResult
from evalpipe.compare.verdict import Verdict
from evalpipe.config.expectations import Expectations
from evalpipe.documents.comparison import Status

MODEL = "pkg.models.NewModel"
LAYER = "pkg.layers.NewLayer"
OLD_LAYER = "pkg.layers.OldLayer"
FN = "pkg.ops.Attention.forward_sp"
OLD_FN = "pkg.ops.Attention.forward_legacy"
NBSP = "\u202f"


def model(cls: str = MODEL, layers: dict[str, int] | None = None, forwards: int = 4,
          per_forward: dict[str, dict[str, int]] | None = None, tokens_per_forward: dict[str, int] | None = None) -> ModelProbe:
    return ModelProbe(model_class=cls, layers={LAYER: 2} if layers is None else layers, attention_backends=["CPU_ATTN"],
                      forwards=forwards, forward_tokens=[], per_forward=per_forward or {},
                      tokens_per_forward=tokens_per_forward or {})


def proc(*models: ModelProbe, pid: int = 1, role: str = "worker", calls: dict[str, int] | None = None,
         switches: dict | None = None, switch_errors: dict[str, str] | None = None) -> ProcessProbe:
    return ProcessProbe(variant="v", pid=pid, ppid=0, process_name="VllmWorker-0", role=role, argv=[],
                        started_at=float(pid), updated_at=float(pid), models=list(models), switches=switches or {},
                        switch_errors=switch_errors or {}, calls=calls or {}, collectives={}, shapes={}, absent={},
                        errors=[])


def side(*processes: ProcessProbe, names: dict[str, str | None] | None = None, verifiable: bool = True,
         mode: str = "offline", unreadable: tuple[str, ...] = ()) -> VariantProbes:
    return VariantProbes(variant="v", mode=mode, verifiable=verifiable, names=names or {}, unreadable=list(unreadable),
                         processes=list(processes))


def check(expect: dict, probes: VariantProbes):
    return check_side("v", Expectations.model_validate(expect), probes)


# ----------------------------------------------------------------------------- a real record

# written by the probes in the evalpipe worker running the layout model's `sp` variant
REAL_RECORD = {
    "absent": {},
    "argv": ["/work/main/evalpipe/worker/main.py", "/tmp/r2/a/sp/job.json"],
    "calls": {"evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention": 144, "virtual:all_to_all": 144,
              "virtual:reduce_scatter": 144},
    "collectives": {"all_to_all@virtual": 144, "reduce_scatter@virtual": 144},
    "errors": [],
    "models": [{
        "attention_backends": ["CPU_ATTN"],
        "forward_tokens": [1221, 4, 4, 4, 4, 4, 4, 4],
        "forwards": 48,
        "layers": {"evalpipe.lab.layout.model.LayoutDecoderLayer": 3},
        "model_class": "evalpipe.lab.layout.model.LayoutForCausalLM",
        "per_forward": {"all_to_all": {"3": 48}, "all_to_all@virtual": {"3": 48},
                        "evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention": {"3": 48},
                        "reduce_scatter": {"3": 48}, "reduce_scatter@virtual": {"3": 48},
                        "virtual:all_to_all": {"3": 48}, "virtual:reduce_scatter": {"3": 48}},
    }],
    "pid": 5947,
    "ppid": 5945,
    "process_name": "MainProcess",
    "role": "evalpipe_worker",
    "schema_version": 1,
    "shapes": {
        "evalpipe.lab.layout.model.LayoutDecoderLayer._sp_attention": [[[1221], [1221, 192]]] * 3,
        "virtual:all_to_all": [[[306, 192]] * 4] * 3,
        "virtual:reduce_scatter": [[[1224, 192]] * 4] * 3,
    },
    "started_at": 1796222980.5117016,
    "switch_errors": {},
    "switches": {
        "additional_config": {}, "all2all_backend": "allgather_reducescatter",
        "architectures": ["EvalpipeLayoutForCausalLM"], "attention_backends": ["CPU_ATTN"], "compilation_mode": 0,
        "cudagraph_mode": "NONE", "data_parallel_size": 1, "distributed_executor_backend": "uni", "dp_rank": 0,
        "dtype": "float32", "enable_chunked_prefill": True, "enable_expert_parallel": False,
        "enable_prefix_caching": True, "enforce_eager": True, "max_num_batched_tokens": 8192, "max_num_seqs": 64,
        "pipeline_parallel_size": 1, "pp_rank": 0, "quantization": None, "tensor_parallel_size": 1, "tp_rank": 0,
        "use_sequence_parallel_moe": False, "world_rank": 0,
    },
    "updated_at": 1796223006.8384457,
    "variant": "sp",
}
LAYOUT = "evalpipe.lab.layout.model"
SP, LEGACY = f"{LAYOUT}.LayoutDecoderLayer._sp_attention", f"{LAYOUT}.LayoutDecoderLayer._legacy_attention"
REAL_NAMES = {n: n for n in (f"{LAYOUT}.LayoutDecoderLayer", LEGACY, SP, f"{LAYOUT}.LayoutForCausalLM")}


def real_side(record: dict | None = None) -> VariantProbes:
    return VariantProbes.model_validate({
        "schema_version": 1, "variant": "sp", "mode": "offline", "verifiable": True, "names": REAL_NAMES,
        "server_of": None, "exposed": {}, "unreadable": [], "processes": [record or REAL_RECORD],
    })


def test_a_real_record_reads_and_meets_its_variants_expectations():
    probes = real_side()
    p = probes.processes[0]
    assert p.label == "evalpipe_worker pid 5947 DP0 TP0"
    assert probes.builders == [p] and probes.total_calls(SP) == 144 and probes.total_calls(LEGACY) == 0
    result = check_side("sp", Expectations(
        model=f"{LAYOUT}.LayoutForCausalLM", layers=[f"{LAYOUT}.LayoutDecoderLayer"], called=[SP], not_called=[LEGACY],
        per_forward={"all_to_all": 3, "reduce_scatter@virtual": {"min": 1, "max": 3}, SP: 3},
        switches={"tensor_parallel_size": 1, "dtype": "torch.float32", "attention_backends": ["cpu_attn"],
                  "additional_config": {}, "enforce_eager": True},
    ), probes)
    assert result.ok, result.failures
    assert result.evidence == (
        "model `LayoutForCausalLM` in 1 process",
        "3 `LayoutDecoderLayer` layers",
        "called `LayoutDecoderLayer._sp_attention` 144 times",
        "never called `LayoutDecoderLayer._legacy_attention`",
        "3 all_to_all in each of 48 forward passes",
        "1..3 reduce_scatter@virtual in each of 48 forward passes",
        "3 LayoutDecoderLayer._sp_attention in each of 48 forward passes",
        "tensor_parallel_size = 1",
        "dtype = 'torch.float32'",
        "attention_backends = ['cpu_attn']",
        "additional_config = {}",
        "enforce_eager = True",
    )


def test_a_real_record_fails_the_legacy_variants_expectations():
    result = check_side("sp", Expectations(called=[LEGACY], not_called=[SP], per_forward={"all_gather": 3}), real_side())
    assert not result.ok and result.verifiable
    assert result.failures == (
        f"variant `sp` never called `{LEGACY}` (0 calls in 1 process)",
        f"variant `sp` called `{SP}` 144 times; it was expected not to",
        "variant `sp` was expected to make 3 all_gather call(s) in every forward pass; seen 0 in 48 of 48 forward passes",
    )


def test_a_record_of_another_schema_is_refused():
    with pytest.raises(ValueError):
        real_side({**REAL_RECORD, "schema_version": 2})
    with pytest.raises(ValueError):
        real_side({**REAL_RECORD, "surprise": 1})


# ----------------------------------------------------------------------------- check_side, each kind


def test_model_class():
    probes = side(proc(model()), proc(model(), pid=2))
    assert check({"model": MODEL}, probes).evidence == ("model `NewModel` in 2 processes",)
    bad = check({"model": "pkg.models.Other"}, probes)
    assert bad.failures == ("variant `v` was expected to build `pkg.models.Other`; vLLM instantiated `pkg.models.NewModel` "
                            "(2 processes)",)
    mixed = side(proc(model()), proc(model("pkg.models.Fallback"), pid=2))
    assert check({"model": MODEL}, mixed).failures == (
        "variant `v` was expected to build `pkg.models.NewModel`; vLLM instantiated `pkg.models.Fallback`, "
        "`pkg.models.NewModel` (2 processes)",), "every builder must have built it"
    # only each process's main model counts (a drafter's is the second)
    drafted = side(proc(model(), model("pkg.models.Drafter")))
    assert check({"model": MODEL}, drafted).ok


def test_layers():
    probes = side(proc(model(layers={LAYER: 2})), proc(model(layers={LAYER: 2}), pid=2))
    assert check({"layers": [LAYER]}, probes).evidence == ("4 `NewLayer` layers",)
    assert check({"layers": [LAYER, OLD_LAYER]}, probes).ok
    mixed = side(proc(model(layers={LAYER: 1, OLD_LAYER: 2})))
    assert check({"layers": [LAYER]}, mixed).failures == (
        f"variant `v`'s decoder layers were expected to be `{LAYER}`; found 2 `{OLD_LAYER}`",)
    none = side(proc(model(layers={})))
    assert check({"layers": [LAYER, OLD_LAYER]}, none).failures == (
        f"variant `v`'s decoder layers were expected to be `{LAYER}` or `{OLD_LAYER}`; found no decoder layers",)


def test_model_and_layer_classes_map_through_names():
    # a class the config names by a re-export is compared under the name it is defined as
    names = {"pkg.Model": MODEL, "pkg.Layer": LAYER}
    probes = side(proc(model()), names=names)
    assert check({"model": "pkg.Model", "layers": ["pkg.Layer"]}, probes).ok
    assert check({"model": "pkg.Other", "layers": ["pkg.OtherLayer"]}, probes).failures == (
        f"variant `v` was expected to build `pkg.Other`; vLLM instantiated `{MODEL}` (1 process)",
        f"variant `v`'s decoder layers were expected to be `pkg.OtherLayer`; found 2 `{LAYER}`",
    )


def test_called_sums_every_process_and_maps_re_exports():
    export = "vllm.distributed.tensor_model_parallel_all_gather"
    home = "vllm.distributed.communication_op.tensor_model_parallel_all_gather"
    probes = side(proc(model(), calls={FN: 1000, home: 1}), proc(role="api_server", pid=2, calls={FN: 234}),
                  names={export: home, "pkg.gone.f": None})
    result = check({"called": [FN, export]}, probes)
    assert result.ok
    assert result.evidence == (f"called `Attention.forward_sp` 1{NBSP}234 times",
                               "called `tensor_model_parallel_all_gather` 1 time")
    assert check({"called": [OLD_FN]}, probes).failures == (
        f"variant `v` never called `{OLD_FN}` (0 calls in 2 processes)",)
    assert check({"called": ["pkg.gone.f"]}, probes).failures == (
        "variant `v` cannot have called `pkg.gone.f`: it does not exist in that variant's interpreter",)


def test_not_called():
    probes = side(proc(model(), calls={OLD_FN: 3, FN: 0}), names={"pkg.gone.f": None})
    assert check({"not_called": [OLD_FN]}, probes).failures == (
        f"variant `v` called `{OLD_FN}` 3 times; it was expected not to",)
    result = check({"not_called": [FN, "pkg.gone.f"]}, probes)
    assert result.ok, "zero calls, or a name absent from that interpreter, is never called"
    assert result.evidence == ("never called `Attention.forward_sp`", "never called `f`")


def test_per_forward_exact():
    probes = side(proc(model(forwards=4, per_forward={"all_to_all": {"3": 4}, FN: {"2": 4}})),
                  proc(model(forwards=2, per_forward={"all_to_all": {"3": 2}, FN: {"2": 2}}), pid=2))
    result = check({"per_forward": {"all_to_all": 3, FN: 2}}, probes)
    assert result.evidence == ("3 all_to_all in each of 6 forward passes", "2 Attention.forward_sp in each of 6 forward passes")
    assert check({"per_forward": {"all_to_all": 2}}, probes).failures == (
        "variant `v` was expected to make 2 all_to_all call(s) in every forward pass; seen 3 in 6 of 6 forward passes",)
    assert check({"per_forward": {FN: 3}}, probes).failures == (
        f"variant `v` was expected to make 3 `{FN}` call(s) in every forward pass; seen 2 in 6 of 6 forward passes",)


def test_a_batch_shape_that_did_not_run_fails_its_expectation():
    """A layout bug in one-token passes is only tested where a request decoded alone: an engine
    that never ran that shape cannot vouch for it, however equal its outputs."""
    probes = side(proc(model(tokens_per_forward={"2": 40, "256": 8}), pid=1),
                  proc(model(tokens_per_forward={"1": 3, "2": 37}), pid=2))
    assert check({"forward_tokens": {"1": {"min": 1}}}, probes).evidence == ("3 forward passes of 1 token (a single request decoding alone)",)
    assert check({"forward_tokens": {"256": {"min": 10}}}, probes).failures == (
        "variant `v` was expected to run >= 10 forward passes of 256-511 tokens; it ran 8 (88 passes in all): "
        "the batch shape under test did not run as declared",)
    assert check({"forward_tokens": {"4": {"max": 0}}}, probes).ok


def test_per_forward_partial_fallback_shows_the_zeros():
    # the new path in 3 of 4 forward passes of one process, none in the other's 2
    probes = side(proc(model(forwards=4, per_forward={"dispatch@ep": {"3": 3}})),
                  proc(model(forwards=2, per_forward={}), pid=2))
    assert per_forward_counts(probes, "dispatch@ep") == ({"3": 3, "0": 3}, 6)
    assert check({"per_forward": {"dispatch@ep": 3}}, probes).failures == (
        "variant `v` was expected to make 3 dispatch@ep call(s) in every forward pass; "
        "seen 3 in 3 of 6, 0 in 3 of 6 forward passes",)
    assert not check({"per_forward": {"dispatch@ep": {"min": 1}}}, probes).ok
    assert check({"per_forward": {"dispatch@ep": {"max": 3}}}, probes).ok


def test_per_forward_ranges_and_other():
    probes = side(proc(model(forwards=4, per_forward={"all_gather": {"1": 2, "3": 2}})))
    assert check({"per_forward": {"all_gather": {"min": 1, "max": 3}}}, probes).evidence == (
        "1..3 all_gather in each of 4 forward passes",)
    assert check({"per_forward": {"all_gather": {"min": 1}}}, probes).evidence == (">= 1 all_gather in each of 4 forward passes",)
    assert check({"per_forward": {"all_gather": {"max": 2}}}, probes).failures == (
        "variant `v` was expected to make <= 2 all_gather call(s) in every forward pass; seen 1 in 2 of 4, 3 in 2 of 4 "
        "forward passes",)
    # more distinct counts than a record keeps: "other" never matches
    many = side(proc(model(forwards=4, per_forward={"all_gather": {"2": 2, "other": 2}})))
    assert not check({"per_forward": {"all_gather": {"min": 0, "max": 9}}}, many).ok
    # more than four distinct counts are cut short
    spread = side(proc(model(forwards=5, per_forward={"all_gather": {str(i): 1 for i in range(1, 6)}})))
    assert check({"per_forward": {"all_gather": 1}}, spread).failures[0].endswith(
        "seen 1 in 1 of 5, 2 in 1 of 5, 3 in 1 of 5, 4 in 1 of 5, \u2026 forward passes")


def test_per_forward_without_forward_passes_cannot_be_checked():
    probes = side(proc(model(forwards=0)))
    assert check({"per_forward": {"all_reduce": 0}}, probes).failures == (
        "variant `v`: no forward pass was recorded, so all_reduce per forward pass (0) cannot be checked",)


def test_per_forward_function_names_map_through_names():
    probes = side(proc(model(forwards=2, per_forward={"pkg.impl.f": {"4": 2}})), names={"pkg.api.f": "pkg.impl.f"})
    assert check({"per_forward": {"pkg.api.f": 4}}, probes).ok
    assert per_forward_counts(probes, "pkg.api.f") == ({"4": 2}, 2)


def test_switches():
    pred, impl = "pkg.flags.enable_dsa_cp()", "pkg.impl.flags.enable_dsa_cp()"
    switches = {"tensor_parallel_size": 2, "dtype": "bfloat16", "tp_rank": 0, "additional_config": {"enable_dsa_cp": True, "x": 1},
                impl: True, "parallel_config.all2all_backend": "naive"}
    probes = side(proc(model(), switches=switches),
                  proc(model(), pid=2, switches={**switches, "tp_rank": 1, "dp_rank": 0},
                       switch_errors={"max_num_seqs": "AttributeError: no scheduler_config"}),
                  names={pred: impl, "parallel_config.all2all_backend": "parallel_config.all2all_backend"})
    ok = check({"switches": {"tensor_parallel_size": 2, "dtype": "torch.BFloat16", pred: True,
                             "parallel_config.all2all_backend": "NAIVE", "additional_config": {"enable_dsa_cp": True}}}, probes)
    assert ok.ok, ok.failures
    assert ok.evidence[0] == "tensor_parallel_size = 2" and ok.evidence[2] == f"{pred} = True"
    assert check({"switches": {"tp_rank": 0}}, probes).failures == (
        "variant `v`: the engine resolved `tp_rank` to 1 in worker pid 2 DP0 TP1; expected 0",), "every builder is checked"
    assert check({"switches": {"additional_config": {"enable_dsa_cp": False}}}, probes).failures == (
        "variant `v`: the engine resolved `additional_config` to {'enable_dsa_cp': True, 'x': 1} in worker pid 1 TP0; "
        "expected {'enable_dsa_cp': False}",)
    assert check({"switches": {"max_num_seqs": 8}}, probes).failures == (
        "variant `v`: the engine resolved `max_num_seqs` to not read (not recorded) in worker pid 1 TP0; expected 8",)
    only_second = side(proc(model(), pid=2, switches={"tp_rank": 1}, switch_errors={"max_num_seqs": "AttributeError: x"}))
    assert check({"switches": {"max_num_seqs": 8}}, only_second).failures == (
        "variant `v`: the engine resolved `max_num_seqs` to not read (AttributeError: x) in worker pid 2 TP1; expected 8",)
    assert not check({"switches": {pred: False}}, probes).ok
    # a predicate looked up under its canonical name, not the one the config writes
    unmapped = side(proc(model(), switches={pred: False, impl: True}), names={pred: impl})
    assert check({"switches": {pred: True}}, unmapped).ok


@pytest.mark.parametrize("expected, actual, same", [
    ("bfloat16", "torch.bfloat16", True),
    ("torch.BFloat16", "bfloat16", True),
    ("float16", "bfloat16", False),
    ({"a": True}, {"a": True, "b": 2}, True),
    ({"a": {"b": [1, "X"]}}, {"a": {"b": [1, "x"], "c": 0}}, True),
    ({"a": True}, {"b": True}, False),
    ({"a": True}, "a", False),
    ({}, {"anything": 1}, True),
    (["A", "b"], ["a", "B"], True),
    (["a"], ["a", "b"], False),
    (["a"], "a", False),
    (True, 1, False),
    (1, True, False),
    (False, False, True),
    (2, 2.0, True),
    (None, None, True),
    (None, "None", False),
])
def test_same_value(expected, actual, same):
    assert same_value(expected, actual) is same


def test_short():
    assert short("pkg.mod.Class.method") == "Class.method"
    assert short("pkg.mod.Class") == "Class"
    assert short("pkg.mod.function") == "function"
    assert short("pkg.mod.enable_x()") == "enable_x()"


# ----------------------------------------------------------------------------- nothing to check


def test_endpoint_cannot_be_verified():
    result = check({"model": MODEL}, side(proc(model()), mode="endpoint", verifiable=False))
    assert not result.ok and not result.verifiable
    assert result.failures == (f"variant `v`: {NOT_VERIFIABLE_ENDPOINT} (say so, or start it with evalpipe's probes)",)
    assert not check({}, side(mode="endpoint", verifiable=False)).ok, "without expectations too"


def test_no_records_is_not_ok():
    result = check({}, side(unreadable=("123.json: Expecting value",)))
    assert not result.ok and not result.verifiable
    assert result.failures[0].startswith("variant `v`: the path probes recorded no engine process")
    assert result.failures[0].endswith("; unreadable: 123.json: Expecting value")
    assert "unreadable" not in check({}, side()).failures[0]


def test_no_builder_is_not_ok():
    result = check({}, side(proc(role="api_server"), proc(role="other", pid=2)))
    assert not result.ok and not result.verifiable
    assert result.failures == ("variant `v`: none of its 2 recorded processes (api_server, other) built a model the probes saw",)


def test_side_check_to_dict():
    d = check({"model": "pkg.Other"}, side(proc(model()))).model_dump(mode="json")
    assert d["variant"] == "v" and d["ok"] is False and d["verifiable"] is True and len(d["failures"]) == 1


# ----------------------------------------------------------------------------- profile and summary


def test_profile():
    a = side(proc(model(per_forward={"all_to_all": {"3": 4}, "all_to_all@ep": {"3": 4}, FN: {"1": 4}}), calls={FN: 4, OLD_FN: 0}))
    p = profile(a)
    assert p.model_classes == {MODEL} and p.layer_classes == {LAYER}
    assert p.called == {FN}, "a name with zero calls was not called"
    assert p.collectives == {("all_to_all", ("3",)), ("all_to_all@ep", ("3",))}
    # a different count per forward is a different profile
    b = side(proc(model(per_forward={"all_to_all": {"2": 4}, "all_to_all@ep": {"2": 4}, FN: {"1": 4}}), calls={FN: 4}))
    assert profile(a) != profile(b)
    assert profile(a) == profile(side(proc(model(per_forward={"all_to_all": {"3": 4}, "all_to_all@ep": {"3": 4}}),
                                           calls={FN: 4})))
    assert p.to_dict()["collectives"] == {"all_to_all": ["3"], "all_to_all@ep": ["3"]}


def test_summarize():
    probes = side(
        proc(model(forwards=4, per_forward={"all_gather": {"2": 4}, "all_gather@tp": {"2": 4}}), pid=1,
             switches={"tensor_parallel_size": 2, "tp_rank": 0}, calls={FN: 3}),
        proc(model(forwards=4, per_forward={"all_gather": {"2": 3}}), pid=2,
             switches={"tensor_parallel_size": 2, "tp_rank": 1}, calls={FN: 1}),
        proc(role="api_server", pid=3),
        names={"pkg.gone.f": None},
    )
    summary = summarize(probes, [FN, "pkg.gone.f"])
    assert summary is not None
    s = summary.model_dump()
    assert s["processes"] == {"worker": 2, "api_server": 1}
    assert s["models"] == [MODEL] and s["layers"] == {LAYER: 4}
    assert s["switches"] == {"tensor_parallel_size": 2, "tp_rank": {"per_process": [0, 1]}}
    assert s["calls"] == {FN: 4, "pkg.gone.f": 0} and s["absent"] == ["pkg.gone.f"]
    assert s["collectives_per_forward"] == {"all_gather": {"counts": {"2": 7, "0": 1}, "forwards": 8}}
    assert s["forwards"] == 8 and s["mode"] == "offline" and s["verifiable"] is True
    assert s["tokens_per_forward"] == {}, "records of older evalpipe have no bins"
    assert summarize(None) is None


def test_summarize_sums_each_process_s_passes_by_tokens_smallest_bin_first():
    probes = side(proc(model(tokens_per_forward={"64": 2, "1": 5, "other": 1}), pid=1),
                  proc(model(tokens_per_forward={"2": 4, "1": 1}), pid=2))
    summary = summarize(probes)
    assert summary is not None
    assert list(summary.tokens_per_forward.items()) == [("1", 6), ("2", 4), ("64", 2), ("other", 1)]


def test_profile_names_leaves_out_classes_predicates_and_config_paths():
    sides = [PathSide("a", Expectations(model=MODEL, called=[FN], switches={"pkg.f.on()": True,
                                                                             "parallel_config.x": 1}), None),
             PathSide("b", Expectations(not_called=[FN, OLD_FN], per_forward={"all_gather": 1, "pkg.m.g": 2}), None),
             PathSide("c", None, None)]
    assert profile_names(sides) == [FN, OLD_FN, "pkg.m.g"]


# ----------------------------------------------------------------------------- judge_paths


def new_side() -> VariantProbes:
    return side(proc(model(per_forward={"all_to_all": {"3": 4}}), calls={FN: 12}))


def old_side() -> VariantProbes:
    return side(proc(model(layers={OLD_LAYER: 2}), calls={OLD_FN: 8}))


def test_verified_when_each_side_shows_its_path():
    ref = PathSide("base", Expectations(called=[OLD_FN], not_called=[FN]), old_side())
    var = PathSide("pr", Expectations(called=[FN], per_forward={"all_to_all": 3}), new_side())
    judged = judge_paths(ref, var, outputs_identical=True)
    assert judged.status == VERIFIED and not judged.inconclusive
    assert judged.reasons == (
        "base: called `Attention.forward_legacy` 8 times; never called `Attention.forward_sp`",
        "pr: called `Attention.forward_sp` 12 times; 3 all_to_all in each of 4 forward passes",
    )
    assert judged.same_profile is False
    assert [c.ok for c in judged.checks] == [True, True]
    assert judged.status == "verified"


@pytest.mark.parametrize("failing", ["reference", "variant"])
def test_failed_when_either_side_fails(failing):
    ref = PathSide("base", Expectations(called=[FN] if failing == "reference" else [OLD_FN]), old_side())
    var = PathSide("pr", Expectations(called=[OLD_FN] if failing == "variant" else [FN]), new_side())
    judged = judge_paths(ref, var, outputs_identical=False)
    assert judged.status == FAILED and judged.inconclusive
    who = "base" if failing == "reference" else "pr"
    missing = FN if failing == "reference" else OLD_FN
    assert judged.reasons == (f"variant `{who}` never called `{missing}` (0 calls in 1 process)",)


def test_failed_when_a_side_cannot_be_verified():
    ref = PathSide("base", None, old_side())
    var = PathSide("pr", None, side(mode="endpoint", verifiable=False))
    judged = judge_paths(ref, var, outputs_identical=False)
    assert judged.status == FAILED and judged.inconclusive
    assert NOT_VERIFIABLE_ENDPOINT in judged.reasons[0]


def test_same_code_when_nothing_tells_the_sides_apart():
    ref = PathSide("base", Expectations(model=MODEL), new_side())
    var = PathSide("pr", Expectations(model=MODEL), new_side())
    judged = judge_paths(ref, var, outputs_identical=True)
    assert judged.status == SAME_CODE and judged.inconclusive and judged.same_profile is True
    assert len(judged.reasons) == 1
    assert judged.reasons[0].startswith("the variants ran the same code: nothing was compared")
    assert "`base` and `pr` apart" in judged.reasons[0] and "same_path: true" in judged.reasons[0]
    # no expectations at all: the same
    assert judge_paths(PathSide("base", None, new_side()), PathSide("pr", None, new_side()), True).status == SAME_CODE


def test_same_profile_but_different_outputs_compared_something():
    judged = judge_paths(PathSide("base", None, new_side()), PathSide("pr", None, new_side()), outputs_identical=False)
    assert judged.status == VERIFIED and not judged.inconclusive and judged.same_profile is True


def test_different_profiles_with_identical_outputs_are_verified():
    judged = judge_paths(PathSide("base", None, old_side()), PathSide("pr", None, new_side()), outputs_identical=True)
    assert judged.status == VERIFIED and judged.same_profile is False
    assert judged.reasons == (), "no expectations: no evidence sentences"


def test_different_claims_tell_the_sides_apart():
    ref = PathSide("base", Expectations(model=MODEL), new_side())
    var = PathSide("pr", Expectations(model=MODEL, called=[FN]), new_side())
    assert judge_paths(ref, var, outputs_identical=True).status == VERIFIED


def test_same_path_declares_an_a_a_pair():
    ref = PathSide("base", Expectations(model=MODEL), new_side())
    var = PathSide("base-aa", Expectations(model=MODEL, same_path=True), new_side())
    assert Expectations(model=MODEL).claims() == Expectations(model=MODEL, same_path=True).claims()
    judged = judge_paths(ref, var, outputs_identical=True)
    assert judged.status == VERIFIED and not judged.inconclusive


def test_same_path_fails_when_the_variant_ran_other_code():
    ref = PathSide("base", Expectations(called=[FN]), side(proc(model(), calls={FN: 3}), names={FN: FN}))
    other = side(proc(model(layers={OLD_LAYER: 2}), calls={FN: 3}), names={FN: FN})
    judged = judge_paths(ref, PathSide("base-aa", Expectations(called=[FN], same_path=True), other), outputs_identical=True)
    assert judged.status == FAILED and judged.inconclusive
    assert judged.reasons == (
        "variant `base-aa` was declared to run the reference's code (same_path) but ran other code than `base`: "
        f"decoder layer classes `{OLD_LAYER}` (the reference: `{LAYER}`)",)
    # a configured function the reference called and the A/A run never did is other code too
    plain = PathSide("base", Expectations(), side(proc(model(), calls={FN: 3}), names={FN: FN}))
    silent = side(proc(model(), calls={}), names={FN: FN})
    assert judge_paths(plain, PathSide("base-aa", Expectations(same_path=True), silent), True).status == FAILED
    # a side with claims of its own is held to those (a night whose variant holds another build's path)
    own = PathSide("base-aa", Expectations(layers=[OLD_LAYER], same_path=True), other)
    assert judge_paths(ref, own, outputs_identical=True).status == VERIFIED
    # counts per forward pass depend on the batches, which an A/A run rearranges: not a difference
    rearranged = side(proc(model(per_forward={"all_gather": {"2": 3, "0": 1}}), calls={FN: 3}), names={FN: FN})
    assert judge_paths(ref, PathSide("base-aa", Expectations(same_path=True), rearranged), True).status == VERIFIED


def test_different_resolved_settings_are_a_comparison():
    # an A/B of engine settings alone (max_num_seqs 64 against 7), no expectations, IDENTICAL outputs
    a = side(proc(model(), switches={"max_num_seqs": 64, "dtype": "float32"}))
    b = side(proc(model(), switches={"max_num_seqs": 7, "dtype": "float32"}))
    judged = judge_paths(PathSide("big", None, a), PathSide("small", None, b), outputs_identical=True)
    assert judged.status == VERIFIED and not judged.inconclusive and judged.same_profile is True
    assert judged.reasons == ("the engines resolved different settings: max_num_seqs 64 \u2192 7",)
    # the same code with the same resolved settings proves nothing
    same = side(proc(model(), switches={"max_num_seqs": 64, "dtype": "float32"}))
    assert judge_paths(PathSide("big", None, a), PathSide("again", None, same), True).status == SAME_CODE


@pytest.mark.parametrize("missing", ["reference", "variant", "both"])
def test_not_recorded_when_a_side_predates_the_probes(missing):
    ref = PathSide("base", Expectations(called=[FN]), None if missing in ("reference", "both") else old_side())
    var = PathSide("pr", Expectations(called=[FN]), None if missing in ("variant", "both") else new_side())
    judged = judge_paths(ref, var, outputs_identical=True)
    assert judged.status == NOT_RECORDED and not judged.inconclusive and judged.checks == ()
    names = {"reference": "`base`", "variant": "`pr`", "both": "`base`, `pr`"}[missing]
    assert judged.reasons == (f"path not verified: {names} ran before evalpipe recorded path probes",)


def test_real_records_on_both_sides_with_identical_outputs_are_same_code():
    twin = copy.deepcopy(REAL_RECORD)
    twin["pid"] = 6000
    judged = judge_paths(PathSide("sp", None, real_side()), PathSide("sp2", None, real_side(twin)), outputs_identical=True)
    assert judged.status == SAME_CODE


# ----------------------------------------------------------------------------- the verdict


GATE = GateResult(gate="tokens", task="gsm8k", metric=None, status="pass", measured=0.0, threshold=0.0, aa_value=None,
                  detail="every token equal")


@pytest.mark.parametrize("status", [Status.IDENTICAL, Status.EQUIVALENT, Status.DIVERGENT])
def test_with_paths_makes_the_verdict_inconclusive_and_keeps_the_gates(status):
    verdict = Verdict(status, ("first reason", "second reason"), (GATE,))
    out = verdict.with_paths(True, ("path failed: x", "path failed: y"))
    assert out.status is Status.INCONCLUSIVE and out.status.exit_code == 4 and not out.status.passed
    assert out.reasons == ("path failed: x", "path failed: y", f"the outputs alone would be {status.value}: first reason",
                           "second reason")
    assert out.gates == (GATE,)
    assert out.outputs is status
    assert out.outputs.value == status.value and out.status.value == "INCONCLUSIVE"


def test_with_paths_without_reasons_and_when_the_paths_hold():
    verdict = Verdict(Status.IDENTICAL, (), (GATE,))
    assert verdict.with_paths(True, ("r",)).reasons == ("r", "the outputs alone would be IDENTICAL")
    assert verdict.with_paths(False, ("r",)) is verdict
    assert verdict.outputs is None


def test_a_judgement_applied_to_a_verdict():
    judged = judge_paths(PathSide("base", None, new_side()), PathSide("pr", None, new_side()), outputs_identical=True)
    out = Verdict(Status.IDENTICAL, ("all equal",)).with_paths(judged.inconclusive, judged.reasons)
    assert out.status is Status.INCONCLUSIVE and out.reasons[-1] == "the outputs alone would be IDENTICAL: all equal"
    recorded = judge_paths(PathSide("base", None, None), PathSide("pr", None, new_side()), outputs_identical=True)
    assert Verdict(Status.IDENTICAL, ()).with_paths(recorded.inconclusive, recorded.reasons).status is Status.IDENTICAL


# ---- a deployment over several nodes --------------------------------------------------------


def node_proc(node: str | None, dp: int, pid: int, calls: dict[str, int] | None = None, dp_size: int = 2) -> ProcessProbe:
    return proc(model(), pid=pid, role="engine_core", calls=calls,
                switches={"data_parallel_index": dp, "data_parallel_size": dp_size}).model_copy(update={"node": node})


def deployed(*processes: ProcessProbe, nodes: int | None = 2) -> VariantProbes:
    return side(*processes, names={FN: FN}).model_copy(update={"deployment_nodes": nodes})


def test_every_node_of_a_deployment_must_show_its_model_built():
    both = deployed(node_proc("0", 0, 1, {FN: 3}), node_proc("1", 1, 2, {FN: 2}))
    check = check_side("sp", Expectations(called=[FN]), both)
    assert check.ok, check.failures
    assert "model built on 2 nodes" in check.evidence and f"called `{short(FN)}` 5 times, on all 2 nodes" in check.evidence
    silent = deployed(node_proc("0", 0, 1, {FN: 3}), proc(pid=2, role="other").model_copy(update={"node": "1"}))
    check = check_side("sp", Expectations(), silent)
    assert check.failures == ("variant `sp`: node 1 of its 2-node deployment shows no model built there (its processes "
                              "(other) built none), so nothing shows which code ran on that node",)
    gone = check_side("sp", Expectations(), deployed(node_proc("0", 0, 1)))
    assert "node 1 of its 2-node deployment shows no model built there (no process of it wrote a record)" in gone.failures[0]


def test_a_node_that_did_not_run_the_path_under_test_is_named():
    one_sided = deployed(node_proc("0", 0, 1, {FN: 3}), node_proc("1", 1, 2, {OLD_FN: 3}))
    check = check_side("sp", Expectations(called=[FN]), one_sided)
    assert not check.ok
    assert check.failures == (f"variant `sp` never called `{FN}` on node 1 (3 calls on the other nodes); node 1's "
                              "processes did not run the path under test",)


def test_the_deployment_s_shape_is_checked_as_each_rank_resolved_it():
    shape = {"nodes": 2, "ranks_per_node": 1, "data_parallel_size": 2}
    good = deployed(node_proc("0", 0, 1), node_proc("0", 0, 2), node_proc("1", 1, 3), node_proc("1", 1, 4))
    check = check_side("sp", Expectations(deployment=shape), good)
    assert check.ok and "nodes × data-parallel ranks: node 0: 0; node 1: 1" in check.evidence, check
    summary = summarize(good)
    assert summary is not None and summary.nodes == {"0": [0], "1": [1]}
    crowded = deployed(node_proc("0", 0, 1), node_proc("0", 1, 2, dp_size=1), nodes=None)
    failures = check_side("sp", Expectations(deployment=shape), crowded).failures
    assert failures[0] == "variant `sp` was expected to build its model on 2 nodes; its processes did on 1 (node 0)"
    assert failures[1] == "variant `sp`: node 0 was expected to run 1 data-parallel rank; its processes served 2 (0, 1)"
    assert failures[2].startswith("variant `sp`: node 0 engine_core pid 2 DP1 resolved data_parallel_size to 1; expected 2")
    with pytest.raises(ValueError, match="a node runs at least one data-parallel rank"):
        Expectations(deployment={"ranks_per_node": [1, 0]})


def test_a_task_whose_counters_fall_short_fails_its_side_and_the_paths():
    from evalpipe.compare.code_paths import PathSide, judge_paths
    from evalpipe.documents.comparison import PathStatus
    from evalpipe.documents.manifest import EngineCounters

    expect = Expectations.model_validate({"model": MODEL, "tasks": {"scenario_prefix_cache": {"prefix_cache_hits": {"min": 1}}}})
    records = side(proc(model()))
    hit = {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=896, prefix_cache_queries=1024)}
    missed = {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=0, prefix_cache_queries=1024)}
    ok = check_side("v", expect, records, hit)
    assert ok.ok and "task `scenario_prefix_cache`: 896 prefix-cache hit tokens" in ok.evidence
    bad = check_side("v", expect, records, missed)
    assert not bad.ok and any("scenario_prefix_cache" in f and "prefix-cache hit tokens" in f for f in bad.failures)
    judged = judge_paths(PathSide("a", expect, records, hit), PathSide("b", expect, records, missed), outputs_identical=False)
    assert judged.status is PathStatus.FAILED and judged.inconclusive
    assert any(r.startswith("variant `b`: task `scenario_prefix_cache`") for r in judged.reasons)
