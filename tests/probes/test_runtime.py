"""The path probes inside a process, without vLLM: fake ``vllm``/``torch`` packages just
deep enough for the hooks, one script run in fresh interpreters (the probes patch the
import system, so they are never activated in the pytest process), and the records it
leaves read back through the parent's typed models.

The pure pieces are exercised in-process in their own files (tests/probes/test_record.py,
tests/probes/test_patching.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import evalpipe
from evalpipe.compare.code_paths import VariantProbes, check_side, per_forward_counts
from evalpipe.config.expectations import Expectations
from evalpipe.probes import SITE_DIR, SPEC_ENV
from evalpipe.probing.names import ResolvedName, VariantNames
from evalpipe.probing.records import read_records, records_dir, write_spec

PROJECT = Path(evalpipe.__file__).resolve().parent.parent
RESULT = "RESULT "


FILES = {
    "chain/sitecustomize.py": """
        # the sitecustomize the probes' own one shadows: it must still run, after the probes
        import builtins, sys
        builtins._chained_site = {"after_probes": "evalpipe.probes.runtime" in sys.modules}
    """,
    "pkgs/torch/__init__.py": """
        class compiler:
            on = False

            @staticmethod
            def is_compiling():
                return compiler.on
    """,
    "pkgs/torch/distributed/__init__.py": """
        def all_reduce(tensor, group=None):
            return tensor

        def all_gather_into_tensor(out, tensor, group=None):
            return out
    """,
    "pkgs/vllm/__init__.py": "",
    "pkgs/vllm/model_executor/__init__.py": "",
    "pkgs/vllm/model_executor/model_loader/__init__.py": "",
    "pkgs/vllm/model_executor/model_loader/utils.py": """
        def initialize_model(vllm_config, *, prefix=""):
            from fakeeng.model import FakeModel

            # a multimodal model builds its language model through the same function: part of its parent
            inner = initialize_model(vllm_config=vllm_config, prefix="language_model") if not prefix else None
            return FakeModel(vllm_config, inner)
    """,
    "pkgs/vllm/distributed/__init__.py": "",
    "pkgs/vllm/distributed/parallel_state.py": """
        import torch.distributed as dist


        class GroupCoordinator:
            def __init__(self, world_size, unique_name, rank_in_group=0):
                self.world_size = world_size
                self.unique_name = unique_name
                self.rank_in_group = rank_in_group

            def all_reduce(self, x):
                if self.world_size == 1:
                    return x
                dist.all_reduce(x)  # a collective inside a collective: one all_reduce
                return x

            def all_gather(self, x, dim=-1):
                if self.world_size == 1:
                    return x
                return dist.all_gather_into_tensor(x, x)


        _TP = None


        def init(tp_size):
            global _TP
            _TP = GroupCoordinator(tp_size, "tp:0", rank_in_group=1)


        def get_tp_group():
            return _TP
    """,
    "pkgs/vllm/distributed/communication_op.py": """
        from vllm.distributed.parallel_state import get_tp_group


        def tensor_model_parallel_all_reduce(x):
            return get_tp_group().all_reduce(x)


        def tensor_model_parallel_all_gather(x, dim=-1):
            return get_tp_group().all_gather(x, dim)
    """,
    "pkgs/fakeeng/__init__.py": "",
    "pkgs/fakeeng/layers.py": """
        CONSTANT = 3


        def helper(x, other=None):
            return x


        def enabled():
            return True


        def broken():
            raise RuntimeError("broken")


        class Base:
            def inherited(self, x):
                return ("base", x)


        class Layer(Base):
            def __init__(self, i):
                self.i = i

            def attend(self, x):
                return x

            @staticmethod
            def smeth(a, b=1):
                return a + b

            @classmethod
            def cmeth(cls, v):
                return (cls.__name__, v)


        class SubLayer(Layer):
            pass
    """,
    "pkgs/fakeeng/child.py": """
        from fakeeng.layers import helper


        class Shaped:
            shape = (8,)


        def work():
            # ends at once, long before the record's writer thread wakes: only the exit can write it
            helper(Shaped())
            helper(Shaped())
            helper(Shaped())
    """,
    "pkgs/fakeeng/user.py": """
        # loaded after fakeeng.layers: binds whatever `helper` is at that moment
        from fakeeng.layers import helper


        def call_helper(x):
            return helper(x)
    """,
    "pkgs/fakeeng/flaky.py": """
        import os

        _mark = os.environ["FLAKY_MARK"]
        if not os.path.exists(_mark):
            open(_mark, "w").close()
            raise RuntimeError("the first import of fakeeng.flaky fails")


        def work():
            return "ok"
    """,
    "pkgs/fakeeng/model.py": """
        from fakeeng.layers import Layer, SubLayer
        from vllm.distributed.communication_op import tensor_model_parallel_all_reduce


        class ModuleList(list):
            pass


        class Sequential(list):
            pass


        class PPMissingLayer:
            pass


        class Backend:
            @staticmethod
            def get_name():
                return "FAKE_ATTN"


        class Attention:
            def __init__(self):
                self.attn_backend = Backend


        class FakeModel:
            def __init__(self, vllm_config, inner=None):
                self.inner = inner
                self.vision_layers = Sequential([Layer(9)])  # named `layers` too, but not a ModuleList
                self.layers = ModuleList([Layer(0), Layer(1), SubLayer(2), PPMissingLayer()])
                self.attn = [Attention(), Attention()]

            def named_modules(self):
                yield "", self
                if self.inner is not None:
                    yield "language_model", self.inner
                yield "vision.layers", self.vision_layers
                yield "model.layers", self.layers
                for i, layer in enumerate(self.layers):
                    yield f"model.layers.{i}", layer
                for i, attn in enumerate(self.attn):
                    yield f"model.attn.{i}", attn

            def modules(self):
                return [m for _, m in self.named_modules()]

            def forward(self, input_ids, positions, active=None, nested=False):
                if nested:  # a forward inside a forward (a drafter's, a sub-model's) is part of the outer one
                    self.forward(input_ids, positions, active=active)
                x = input_ids
                for i, layer in enumerate(self.layers[:3]):
                    if active is not None and i not in active:
                        continue
                    x = layer.attend(x)
                    x = tensor_model_parallel_all_reduce(x)
                return x
    """,
    "run.py": """
        import builtins, enum, inspect, json, os, sys

        MARK = "__evalpipe_probe__"
        out = {
            "chained": getattr(builtins, "_chained_site", None),
            "hooks_installed": any(type(f).__name__ == "PostImportHooks" for f in sys.meta_path),
            "runtime_loaded": "evalpipe.probes.runtime" in sys.modules,
            "pid": os.getpid(),
        }


        def marked(fn):
            return bool(getattr(fn, MARK, False))


        class S:
            def __init__(self, *shape):
                self.shape = shape


        class Mode(enum.Enum):
            ON = 1


        class dtype:
            def __str__(self):
                return "torch.bfloat16"


        class NS:
            def __init__(self, **kw):
                self.__dict__.update(kw)


        import torch
        import torch.distributed as dist
        import vllm
        from vllm.distributed import parallel_state
        from vllm.model_executor.model_loader import utils as loader_utils
        from fakeeng import layers
        from fakeeng.layers import Base, Layer, SubLayer, helper
        import fakeeng.user

        cfg = NS(
            parallel_config=NS(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1,
                               enable_expert_parallel=False, all2all_backend="naive", use_sequence_parallel_moe=True,
                               distributed_executor_backend="mp", custom_mode=Mode.ON),
            model_config=NS(dtype=dtype(), hf_config=NS(architectures=["FakeForCausalLM"]), quantization=None,
                            enforce_eager=True),
            additional_config={"enable_x": True, "nested": {"k": [1, 2]}},
        )
        parallel_state.init(2)
        model = loader_utils.initialize_model(vllm_config=cfg)
        out["model_has_inner"] = model.inner is not None

        # configured functions: shapes of the first three calls, a later importer sees the wrapper
        helper(S(1, 2))
        helper(S(3), other=S(4, 5))
        helper([S(2), S(4)])
        fakeeng.user.call_helper(S(9, 9))
        helper(7)
        torch.compiler.on = True  # a graph compiler tracing through a wrapper: not counted
        helper(S(1))
        torch.compiler.on = False

        out["smeth"] = [Layer.smeth(2, b=3), Layer(0).smeth(1)]
        out["cmeth"] = [Layer.cmeth(1), SubLayer.cmeth(2), Layer(0).cmeth(3)]
        out["inherited"] = [SubLayer(2).inherited(1), Base().inherited(2), Layer(0).inherited(3)]
        out["kinds"] = [type(inspect.getattr_static(Layer, "smeth")).__name__,
                        type(inspect.getattr_static(Layer, "cmeth")).__name__]
        out["marked"] = {
            "helper": marked(helper),
            "helper_is_module_attr": helper is layers.helper,
            "user_helper": marked(fakeeng.user.helper),
            "attend": marked(Layer.attend),
            "smeth": marked(Layer.smeth),
            "cmeth": marked(Layer.cmeth.__func__),
            "base_inherited": marked(Base.__dict__["inherited"]),
            "sub_inherited_own": marked(SubLayer.__dict__.get("inherited")),
            "initialize_model": marked(loader_utils.initialize_model),
            "group_all_reduce": marked(parallel_state.GroupCoordinator.all_reduce),
            "dist_all_reduce": marked(dist.all_reduce),
            "forward_is_bound_method": hasattr(model.forward, "__self__"),
        }

        try:
            import fakeeng.flaky
            out["flaky_first_failed"] = False
        except RuntimeError:
            out["flaky_first_failed"] = True
        import fakeeng.flaky
        out["flaky"] = [fakeeng.flaky.work(), fakeeng.flaky.work()]
        out["flaky_marked"] = marked(fakeeng.flaky.work)

        # collectives outside any forward pass
        single = parallel_state.GroupCoordinator(1, "tp:1")  # one rank: communicates nothing
        single.all_gather(S(2))
        single.all_gather(S(2))
        dist.all_reduce(S(4))

        # forward passes: three full ones, one with one layer, one (with a nested forward) with none
        for n in (3, 4, 5):
            model.forward(S(n), S(n))
        model.forward(S(6), S(6), active={0})
        model.forward(S(7), S(7), active=set(), nested=True)

        from evalpipe.probes import runtime
        import threading
        out["active"] = runtime.active()
        out["flusher"] = any(t.name == "evalpipe-probes" for t in threading.enumerate())
        runtime.collective("all_to_all", "virtual", S(2, 3))
        runtime.flush()

        if sys.argv[1] == "fork":
            child = os.fork()
            if child == 0:
                import multiprocessing
                multiprocessing.current_process().name = "EngineCore_DP0"
                helper(S(8))
                helper(S(8))
                runtime.flush()
                os._exit(0)
            _, status = os.waitpid(child, 0)
            out["child"] = child
            out["child_status"] = status
            quiet = os.fork()  # a helper process: vLLM loaded, no model, no known role
            if quiet == 0:
                helper(S(8))
                runtime.flush()
                os._exit(0)
            _, status = os.waitpid(quiet, 0)
            out["quiet_child"] = quiet
            out["quiet_status"] = status
            # an engine core as vLLM starts one: a multiprocessing child, which leaves through
            # os._exit (no atexit handler runs) and never flushes on its own
            import multiprocessing
            import fakeeng.child
            core = multiprocessing.get_context("fork").Process(target=fakeeng.child.work, name="EngineCore_DP1")
            core.start()
            core.join()
            out["mp_child"] = core.pid
            out["mp_child_exitcode"] = core.exitcode
            runtime.flush()
        print("RESULT " + json.dumps(out))
    """,
}

# what the spec names, as probing.names would have resolved it in the variant's interpreter
NAMES = [
    ResolvedName("fakeeng.layers.helper", "function", "fakeeng.layers.helper", "fakeeng.layers", "helper"),
    ResolvedName("fakeeng.layers.Layer.attend", "function", "fakeeng.layers.Layer.attend", "fakeeng.layers", "Layer.attend"),
    ResolvedName("fakeeng.layers.Layer.smeth", "function", "fakeeng.layers.Layer.smeth", "fakeeng.layers", "Layer.smeth"),
    ResolvedName("fakeeng.layers.Layer.cmeth", "function", "fakeeng.layers.Layer.cmeth", "fakeeng.layers", "Layer.cmeth"),
    ResolvedName("fakeeng.layers.SubLayer.inherited", "function", "fakeeng.layers.SubLayer.inherited", "fakeeng.layers",
                 "SubLayer.inherited"),
    ResolvedName("fakeeng.flaky.work", "function", "fakeeng.flaky.work", "fakeeng.flaky", "work"),
    ResolvedName("fakeeng.layers.missing_fn", "function", "fakeeng.layers.missing_fn", "fakeeng.layers", "missing_fn"),
    ResolvedName("fakeeng.layers.CONSTANT", "function", "fakeeng.layers.CONSTANT", "fakeeng.layers", "CONSTANT"),
    ResolvedName("fakeeng.layers.enabled()", "predicate", "fakeeng.layers.enabled()", "fakeeng.layers", "enabled"),
    ResolvedName("fakeeng.layers.broken()", "predicate", "fakeeng.layers.broken()", "fakeeng.layers", "broken"),
    ResolvedName("parallel_config.custom_mode", "config", "parallel_config.custom_mode"),
    ResolvedName("parallel_config.nope", "config", "parallel_config.nope"),
    ResolvedName("additional_config.enable_x", "config", "additional_config.enable_x"),
    ResolvedName("fakeeng.model.FakeModel", "class", "fakeeng.model.FakeModel", "fakeeng.model", "FakeModel"),
    ResolvedName("fakeeng.gone.Thing.run", "function", error="cannot be imported: ModuleNotFoundError: no fakeeng.gone"),
]

GROUP = "vllm.distributed.parallel_state.GroupCoordinator"
TP_ALL_REDUCE = "vllm.distributed.communication_op.tensor_model_parallel_all_reduce"
TORCH_ALL_REDUCE = "torch.distributed.distributed_c10d.all_reduce"


def _write_tree(root: Path) -> None:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def _run(root: Path, mode: str, spec: Path | None) -> tuple[dict, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k not in (SPEC_ENV, "PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), str(root / "chain"), str(root / "pkgs"), str(PROJECT)])
    env["FLAKY_MARK"] = str(root / f"flaky-{mode}.mark")
    if spec is not None:
        env[SPEC_ENV] = str(spec)
    proc = subprocess.run([sys.executable, str(root / "run.py"), mode], capture_output=True, text=True, env=env,
                          cwd=root, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)), None)
    assert line is not None, (proc.stdout, proc.stderr)
    return json.loads(line[len(RESULT):]), proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script three times: probes on (with a fork), probes off, a spec it cannot read."""
    root = tmp_path_factory.mktemp("probes")
    _write_tree(root)
    vdir = root / "variant"
    spec = write_spec(vdir, "v", VariantNames({n.name: n for n in NAMES}))
    bad = root / "bad-spec.json"
    bad.write_text(json.dumps({"schema_version": 99, "out_dir": str(root / "bad-out")}), encoding="utf-8")
    off_vdir_before = sorted(p.name for p in records_dir(vdir).iterdir())
    off, off_proc = _run(root, "plain", None)
    off_vdir_after = sorted(p.name for p in records_dir(vdir).iterdir())
    on, on_proc = _run(root, "fork", spec)
    broken, broken_proc = _run(root, "plain", bad)
    files = {p.name: json.loads(p.read_text()) for p in records_dir(vdir).glob("*.json") if p.name != "spec.json"}
    return {
        "root": root, "vdir": vdir, "spec": json.loads(spec.read_text()),
        "on": on, "on_proc": on_proc, "files": files,
        "off": off, "off_files": (off_vdir_before, off_vdir_after),
        "broken": broken, "broken_proc": broken_proc,
    }


def _parent(runs) -> dict:
    return runs["files"][f"{runs['on']['pid']}.json"]


def test_spec_carries_what_write_spec_resolved(runs):
    spec = runs["spec"]
    assert spec["schema_version"] == 1 and spec["variant"] == "v"
    assert spec["out_dir"] == str(records_dir(runs["vdir"]))
    assert [f["canonical"] for f in spec["functions"]][:2] == ["fakeeng.layers.helper", "fakeeng.layers.Layer.attend"]
    assert "fakeeng.model.FakeModel" not in json.dumps(spec["functions"]), "classes are compared, never wrapped"
    assert [p["canonical"] for p in spec["predicates"]] == ["fakeeng.layers.enabled()", "fakeeng.layers.broken()"]
    assert spec["config_paths"] == ["parallel_config.custom_mode", "parallel_config.nope", "additional_config.enable_x"]
    assert spec["absent"] == [{"name": "fakeeng.gone.Thing.run", "why": "cannot be imported: ModuleNotFoundError: no fakeeng.gone"}]


def test_probes_load_at_start_and_chain_to_the_shadowed_sitecustomize(runs):
    on = runs["on"]
    assert on["hooks_installed"] and on["runtime_loaded"] and on["active"]
    assert on["flusher"], "a process that loaded vLLM keeps its record fresh from a thread"
    assert on["chained"] == {"after_probes": True}, "the sitecustomize further down sys.path must still run, after the probes"


def test_one_record_per_process_and_the_parent_record_reads_as_a_process_probe(runs):
    on = runs["on"]
    assert on["child_status"] == 0 and on["quiet_status"] == 0
    # the quiet child (vLLM loaded, no model built, no known role) writes nothing
    assert sorted(runs["files"]) == sorted([f"{on['pid']}.json", f"{on['child']}.json", f"{on['mp_child']}.json"])
    assert not list(records_dir(runs["vdir"]).glob("*.tmp")), "records are written atomically"
    records, unreadable = read_records(records_dir(runs["vdir"]))
    assert unreadable == [] and {r.pid for r in records} == {on["pid"], on["child"], on["mp_child"]}
    parent = _parent(runs)
    assert parent["variant"] == "v" and parent["role"] == "other" and parent["process_name"] == "MainProcess"
    assert parent["errors"] == []


def test_the_model_built_through_initialize_model_is_recorded_once(runs):
    parent = _parent(runs)
    assert runs["on"]["model_has_inner"], "the fake built its sub-model through the wrapped function"
    assert len(parent["models"]) == 1, "a sub-model built inside initialize_model is part of its parent"
    model = parent["models"][0]
    assert model["model_class"] == "fakeeng.model.FakeModel"
    # the first ModuleList named `layers`; a Sequential named layers and pipeline placeholders left out
    assert model["layers"] == {"fakeeng.layers.Layer": 2, "fakeeng.layers.SubLayer": 1}
    assert model["attention_backends"] == ["FAKE_ATTN"]
    assert runs["on"]["marked"]["initialize_model"]
    assert not runs["on"]["marked"]["forward_is_bound_method"], "forward is replaced on the instance"


def test_switches_read_from_the_vllm_config_ranks_and_predicates(runs):
    parent = _parent(runs)
    sw, errors = parent["switches"], parent["switch_errors"]
    assert sw["tensor_parallel_size"] == 2 and sw["use_sequence_parallel_moe"] is True
    assert sw["all2all_backend"] == "naive" and sw["distributed_executor_backend"] == "mp"
    assert sw["dtype"] == "bfloat16", "a dtype is recorded without its torch. prefix"
    assert sw["architectures"] == ["FakeForCausalLM"] and sw["quantization"] is None
    assert sw["additional_config"] == {"enable_x": True, "nested": {"k": [1, 2]}}
    assert sw["attention_backends"] == ["FAKE_ATTN"]
    assert sw["tp_rank"] == 1, "ranks come from vLLM's parallel state"
    assert sw["parallel_config.custom_mode"] == "ON", "an enum is recorded by its member name"
    assert sw["additional_config.enable_x"] is True
    assert sw["fakeeng.layers.enabled()"] is True
    assert errors["fakeeng.layers.broken()"] == "RuntimeError: broken"
    assert errors["parallel_config.nope"].startswith("AttributeError")
    assert errors["max_num_seqs"].startswith("AttributeError"), "a field this config lacks is said, not guessed"
    assert "max_num_seqs" not in sw
    assert "pp_rank" not in sw and "pp_rank" not in errors, "a group this deployment lacks is left out"


def test_call_counts_and_a_nested_collective_counts_once_as_a_kind(runs):
    calls = _parent(runs)["calls"]
    assert calls["fakeeng.layers.helper"] == 5, "the compiled-mode call is not counted"
    assert calls["fakeeng.layers.Layer.attend"] == 10  # 3 x 3 + 1
    # tensor_model_parallel_all_reduce -> GroupCoordinator.all_reduce -> torch all_reduce: each function counted ...
    assert calls[TP_ALL_REDUCE] == 10
    assert calls[f"{GROUP}.all_reduce"] == 10
    assert calls[TORCH_ALL_REDUCE] == 11  # and one direct call
    # ... but one all_reduce per chain; the direct torch call is its own outermost collective
    assert _parent(runs)["collectives"] == {"all_reduce@tp": 10, "all_reduce@torch": 1, "all_to_all@virtual": 1}
    assert calls["virtual:all_to_all"] == 1
    # a group of one rank: its calls are counted, never as a collective
    assert calls[f"{GROUP}.all_gather"] == 2
    assert "vllm.distributed.communication_op.tensor_model_parallel_all_gather" not in calls
    assert "torch.distributed.distributed_c10d.all_gather_into_tensor" not in calls


def test_per_forward_histograms(runs):
    model = _parent(runs)["models"][0]
    assert model["forwards"] == 5, "a forward inside a forward counts once"
    assert model["forward_tokens"] == [3, 4, 5, 6, 7]
    per = model["per_forward"]
    for key in ("fakeeng.layers.Layer.attend", "all_reduce", "all_reduce@tp", TP_ALL_REDUCE, f"{GROUP}.all_reduce",
                TORCH_ALL_REDUCE):
        assert per[key] == {"3": 3, "1": 1}, key
    assert "all_reduce@torch" not in per, "the nested torch call is not a collective of its own"
    assert set(per) == {"fakeeng.layers.Layer.attend", "all_reduce", "all_reduce@tp", TP_ALL_REDUCE,
                        f"{GROUP}.all_reduce", TORCH_ALL_REDUCE}, "calls outside forward passes are not per-forward"
    # the forward without any call is implied: forwards - sum
    probes = _variant_probes(runs)
    assert per_forward_counts(probes, "all_reduce") == ({"3": 3, "1": 1, "0": 1}, 5)
    assert per_forward_counts(probes, "fakeeng.layers.Layer.attend") == ({"3": 3, "1": 1, "0": 1}, 5)
    assert per_forward_counts(probes, "all_gather") == ({"0": 5}, 5)


def test_first_three_shapes_are_kept(runs):
    shapes = _parent(runs)["shapes"]
    assert shapes["fakeeng.layers.helper"] == [[[1, 2]], [[3], [4, 5]], [[[2], [4]]]]
    assert shapes["fakeeng.layers.Layer.attend"] == [[[3]], [[3]], [[3]]]
    assert shapes["virtual:all_to_all"] == [[[2, 3]]]


def test_wrapped_methods_keep_their_kind_and_results(runs):
    on = runs["on"]
    assert on["smeth"] == [5, 2]
    assert on["cmeth"] == [["Layer", 1], ["SubLayer", 2], ["Layer", 3]]
    assert on["kinds"] == ["staticmethod", "classmethod"]
    assert on["marked"]["smeth"] and on["marked"]["cmeth"] and on["marked"]["attend"]
    calls = _parent(runs)["calls"]
    assert calls["fakeeng.layers.Layer.smeth"] == 2 and calls["fakeeng.layers.Layer.cmeth"] == 3


def test_an_inherited_method_is_wrapped_on_the_named_class_only(runs):
    on = runs["on"]
    assert on["inherited"] == [["base", 1], ["base", 2], ["base", 3]]
    assert on["marked"]["sub_inherited_own"] and not on["marked"]["base_inherited"]
    assert _parent(runs)["calls"]["fakeeng.layers.SubLayer.inherited"] == 1, "calls through the base do not count"


def test_a_name_imported_after_the_hook_is_the_wrapper(runs):
    marked = runs["on"]["marked"]
    assert marked["helper"] and marked["helper_is_module_attr"] and marked["user_helper"]
    assert marked["group_all_reduce"] and marked["dist_all_reduce"]


def test_a_module_whose_first_import_failed_is_hooked_on_the_next(runs):
    on = runs["on"]
    assert on["flaky_first_failed"], "the fake's first import must fail for this test to mean anything"
    assert on["flaky"] == ["ok", "ok"] and on["flaky_marked"]
    assert _parent(runs)["calls"]["fakeeng.flaky.work"] == 2


def test_names_that_cannot_be_wrapped_are_recorded_absent(runs):
    absent = _parent(runs)["absent"]
    assert absent["fakeeng.gone.Thing.run"] == "cannot be imported: ModuleNotFoundError: no fakeeng.gone"
    assert absent["fakeeng.layers.CONSTANT"] == "CONSTANT is a int, not a function or method"
    assert set(absent) == {"fakeeng.gone.Thing.run", "fakeeng.layers.missing_fn", "fakeeng.layers.CONSTANT"}
    assert "fakeeng.layers.missing_fn" not in _parent(runs)["calls"]


def test_a_missing_module_attribute_is_recorded_with_its_module(runs):
    # BUG (evalpipe/probes/engine_hooks.py, EngineHooks._hook_function): for a name with no
    # class part (`module.function`), patching.resolve() looks nothing up, so the
    # AttributeError comes from wrap()'s inspect.getattr_static and _counted() records
    # str(err), which is the bare attribute name ("missing_fn"), instead of the sentence
    # _hook_function means to write: "fakeeng.layers has no missing_fn (...)".
    absent = _parent(runs)["absent"]
    assert absent["fakeeng.layers.missing_fn"].startswith("fakeeng.layers has no missing_fn"), absent


def test_a_forked_child_writes_its_own_record_from_zero(runs):
    on = runs["on"]
    child = runs["files"][f"{on['child']}.json"]
    assert child["pid"] == on["child"] and child["ppid"] == on["pid"]
    assert child["role"] == "engine_core"
    assert child["calls"] == {"fakeeng.layers.helper": 2}, "a child counts from zero"
    assert child["collectives"] == {} and child["models"] == []
    assert child["shapes"] == {"fakeeng.layers.helper": [[[8]], [[8]]]}
    assert _parent(runs)["calls"]["fakeeng.layers.helper"] == 5, "the child's calls are not the parent's"


def test_a_multiprocessing_child_writes_its_record_when_it_ends(runs):
    """vLLM's engine cores are multiprocessing children: they end through os._exit, which
    runs no atexit handler, so without a finalizer of their own the last passes were lost."""
    on = runs["on"]
    assert on["mp_child_exitcode"] == 0
    child = runs["files"][f"{on['mp_child']}.json"]
    assert child["role"] == "engine_core" and child["process_name"] == "EngineCore_DP1"
    assert child["calls"] == {"fakeeng.layers.helper": 3}


def _variant_probes(runs) -> VariantProbes:
    records, _ = read_records(records_dir(runs["vdir"]))
    names = {n.name: (n.canonical if n.found else None) for n in NAMES}
    return VariantProbes(variant="v", mode="offline", verifiable=True, names=names, processes=records)


def test_the_record_judged_against_expectations(runs):
    probes = _variant_probes(runs)
    good = Expectations(
        model="fakeeng.model.FakeModel", layers=["fakeeng.layers.Layer", "fakeeng.layers.SubLayer"],
        called=["fakeeng.layers.Layer.attend", "fakeeng.flaky.work"],
        not_called=["fakeeng.gone.Thing.run", "vllm.distributed.communication_op.tensor_model_parallel_all_gather"],
        per_forward={"all_reduce@tp": {"min": 0, "max": 3}},
        switches={"tensor_parallel_size": 2, "dtype": "torch.BFloat16", "fakeeng.layers.enabled()": True,
                  "parallel_config.custom_mode": "on", "additional_config": {"enable_x": True}},
    )
    check = check_side("v", good, probes)
    assert check.ok, check.failures
    # the partial fallback: one forward with one layer's all_reduce, one with none
    bad = check_side("v", Expectations(per_forward={"all_reduce": 3}), probes)
    assert not bad.ok
    assert bad.failures == ("variant `v` was expected to make 3 all_reduce call(s) in every forward pass; "
                            "seen 3 in 3 of 5, 1 in 1 of 5, 0 in 1 of 5 forward passes (the first such passes held 6, 7 tokens)",)


def test_without_the_spec_nothing_is_patched_and_nothing_written(runs):
    off = runs["off"]
    assert not off["hooks_installed"] and not off["runtime_loaded"]
    assert off["chained"] == {"after_probes": False}, "the shadowed sitecustomize runs without the probes too"
    assert {k: v for k, v in off["marked"].items() if k != "helper_is_module_attr"} == {
        "helper": False, "user_helper": False, "attend": False, "smeth": False, "cmeth": False,
        "base_inherited": False, "sub_inherited_own": False, "initialize_model": False, "group_all_reduce": False,
        "dist_all_reduce": False, "forward_is_bound_method": True,
    }
    assert off["active"] is False and not off["flusher"]
    assert off["flaky"] == ["ok", "ok"]
    before, after = runs["off_files"]
    assert before == after == ["spec.json"], "no record without EVALPIPE_PROBES"


def test_a_spec_that_cannot_be_read_leaves_the_process_alone(runs):
    broken, proc = runs["broken"], runs["broken_proc"]
    assert f"evalpipe probes: not active in process {broken['pid']} (ValueError:" in proc.stderr
    assert "probe spec version 99" in proc.stderr
    assert not broken["hooks_installed"] and broken["active"] is False
    assert not broken["marked"]["initialize_model"]
    assert broken["chained"] is not None, "the shadowed sitecustomize still runs"
    assert not (runs["root"] / "bad-out").exists()


def test_a_spec_given_inline_reads_as_the_file_would(tmp_path):
    """A deployment's node behind a launcher gets the spec itself in EVALPIPE_PROBES (the file
    is on another machine); a spec of another version is refused either way."""
    from evalpipe.probes import SCHEMA_VERSION
    from evalpipe.probes.runtime import read_spec

    spec = {"schema_version": SCHEMA_VERSION, "variant": "v", "out_dir": str(tmp_path)}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert read_spec(json.dumps(spec)) == read_spec(str(path)) == spec
    with pytest.raises(ValueError, match="the inline spec: probe spec version 99"):
        read_spec(json.dumps({**spec, "schema_version": 99}))


def test_a_write_that_fails_is_said_in_the_record_and_the_next_one_still_writes(tmp_path, monkeypatch):
    """The writer thread flushes every half second for the life of the engine: one failed
    write (not the run directory gone) must not end it, and the record says it happened."""
    from evalpipe.probes import runtime
    from evalpipe.probes.record import ModelRecord, ProcessRecord

    rec = ProcessRecord(str(tmp_path), "v")
    rec.models.append(ModelRecord("pkg.Model", {}, []))
    monkeypatch.setattr(runtime, "_record", rec)
    real_write = ProcessRecord.write
    monkeypatch.setattr(ProcessRecord, "write", lambda self: (_ for _ in ()).throw(RuntimeError("dict changed size")))
    runtime.flush()
    monkeypatch.setattr(ProcessRecord, "write", real_write)
    runtime.flush()
    (written,) = tmp_path.glob("*.json")
    assert json.loads(written.read_text())["errors"] == ["writing this record failed once: RuntimeError('dict changed size')"]
