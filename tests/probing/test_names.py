"""evalpipe.probing.names: probed names looked up in a variant's own interpreter (a small
package in tmp_path stands in for the engine's), the lookup's cache, and the one-sentence
refusals of a variant whose expectations name something its interpreter lacks."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import evalpipe
from evalpipe.config.deployment import Deployment
from evalpipe.config.errors import ConfigError
from evalpipe.config.expectations import Expectations
from evalpipe.probing import names as P
from evalpipe.probing.names import ResolvedName, VariantNames, check_variant, checks_lines, probed_names, resolve

PROJECT = Path(evalpipe.__file__).resolve().parent.parent
PYTHON = str(PROJECT / ".venv" / "bin" / "python")

FILES = {
    "pnpkg/__init__.py": "from pnpkg.impl import f  # a re-export\n",
    "pnpkg/impl.py": """
        import json

        CONST = 3


        def f(x):
            return x


        def enabled():
            return True


        class K:
            def m(self):
                return 1

            @staticmethod
            def s():
                return 2

            @classmethod
            def c(cls):
                return 3

            @property
            def p(self):
                return 4


        class Sub(K):
            pass
    """,
    "pnpkg/broken.py": "import not_installed_dep_of_pnpkg\n\ndef f():\n    pass\n",
    # an extension package whose module needs a dependency that is not installed
    "torch_npu_ext/__init__.py": "",
    "torch_npu_ext/ops.py": "import torch_npu\n\ndef f():\n    pass\n",
    "vllm/__init__.py": "",
    "vllm/config.py": """
        from __future__ import annotations

        from dataclasses import dataclass, field


        @dataclass
        class ParallelConfig:
            tensor_parallel_size: int = 1

            @property
            def use_sequence_parallel_moe(self) -> bool:
                return False


        @dataclass
        class VllmConfig:
            parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
            additional_config: dict = field(default_factory=dict)
    """,
}

GOOD = ["pnpkg.impl.f", "pnpkg.f", "pnpkg.impl.K.m", "pnpkg.impl.Sub.m", "pnpkg.impl.K.s", "pnpkg.impl.K.c",
        "pnpkg.impl.K", "pnpkg.impl.enabled()", "parallel_config.tensor_parallel_size",
        "parallel_config.use_sequence_parallel_moe", "additional_config.enable_x"]
BAD = ["pnpkg.impl.K.p", "pnpkg.impl.CONST", "pnpkg.impl.missing", "pnpkg.impl.K.missing", "nopkg.mod.f",
       "pnpkg.broken.f", "parallel_config.nope", "speculative_config.num_tokens", "pnpkg.impl", "pnpkg.impl.json"]


@pytest.fixture
def world(tmp_path, monkeypatch):
    root = tmp_path / "src"
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path / "cache"))  # never the user's cache
    env = {k: v for k, v in os.environ.items() if k != "EVALPIPE_PROBES"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(PROJECT)])
    asked: list[list[str]] = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        asked.append(list(cmd))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    return SimpleNamespace(root=root, env=env, asked=asked, cache=tmp_path / "cache", monkeypatch=monkeypatch)


def _forbid_subprocesses(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("no lookup subprocess expected: the answer is cached")

    monkeypatch.setattr(subprocess, "run", fail)


def test_resolve_names_in_the_variants_interpreter(world):
    said: list[str] = []
    found = resolve(PYTHON, world.env, GOOD + BAD, say=said.append)
    assert world.asked == [[PYTHON, "-m", "evalpipe.probes.resolve"]]
    assert said == [f"looking up {len(GOOD + BAD)} probed names in {PYTHON} (cached until their modules change)"]
    assert found["pnpkg.impl.f"] == ResolvedName("pnpkg.impl.f", "function", "pnpkg.impl.f", "pnpkg.impl", "f")
    # a re-export is counted where it is defined
    assert found["pnpkg.f"] == ResolvedName("pnpkg.f", "function", "pnpkg.impl.f", "pnpkg.impl", "f")
    assert found["pnpkg.impl.K.m"] == ResolvedName("pnpkg.impl.K.m", "function", "pnpkg.impl.K.m", "pnpkg.impl", "K.m")
    # an inherited method is watched on the class the config names
    assert found["pnpkg.impl.Sub.m"].canonical == "pnpkg.impl.Sub.m" and found["pnpkg.impl.Sub.m"].attr == "Sub.m"
    assert found["pnpkg.impl.K.s"].found and found["pnpkg.impl.K.c"].attr == "K.c"
    assert found["pnpkg.impl.K"] == ResolvedName("pnpkg.impl.K", "class", "pnpkg.impl.K", "pnpkg.impl", "K")
    assert found["pnpkg.impl.enabled()"] == ResolvedName("pnpkg.impl.enabled()", "predicate", "pnpkg.impl.enabled()",
                                                         "pnpkg.impl", "enabled")
    for name in ("parallel_config.tensor_parallel_size", "parallel_config.use_sequence_parallel_moe",
                 "additional_config.enable_x"):
        assert found[name] == ResolvedName(name, "config", name), name

    errors = {name: found[name].error for name in BAD}
    assert not any(found[name].found for name in BAD)
    assert errors["pnpkg.impl.K.p"] == "is a property, not a function or method"
    assert errors["pnpkg.impl.CONST"] == "is a int, not a function or method"
    assert errors["pnpkg.impl.missing"] == "does not exist: pnpkg.impl has no attribute `missing`"
    # a module (a package's, or one a module imported) is said to be one, not "does not exist"
    assert errors["pnpkg.impl"] == "is a module, not a function (name one of its functions, e.g. pnpkg.impl.<function>)"
    assert errors["pnpkg.impl.json"] == ("is a module, not a function (name one of its functions, e.g. "
                                         "pnpkg.impl.json.<function>)")
    assert errors["pnpkg.impl.K.missing"] == "does not exist: pnpkg.impl.K has no attribute `missing`"
    assert errors["nopkg.mod.f"].startswith("cannot be imported: ModuleNotFoundError: no module of nopkg.mod.f can be imported")
    # a module that exists but imports something missing says what is missing
    assert errors["pnpkg.broken.f"] == ("cannot be imported: ModuleNotFoundError: No module named "
                                        "'not_installed_dep_of_pnpkg'")
    assert errors["parallel_config.nope"] == "does not exist: ParallelConfig has no field or property `nope`"
    assert errors["speculative_config.num_tokens"] == "does not exist: VllmConfig has no field `speculative_config`"

    # an answer with a missing name is not cached: the next lookup asks again
    _forbid_subprocesses(world.monkeypatch)
    with pytest.raises(AssertionError, match="no lookup subprocess expected"):
        resolve(PYTHON, world.env, GOOD + BAD)


def test_the_lookup_is_cached_until_a_source_file_changes(world):
    first = resolve(PYTHON, world.env, GOOD)
    assert len(world.asked) == 1
    assert list((world.cache / "probe-names").glob("*.json")), "cached under EVALPIPE_CACHE"
    _forbid_subprocesses(world.monkeypatch)
    said: list[str] = []
    assert resolve(PYTHON, world.env, GOOD, say=said.append) == first
    assert said == [], "a cached answer is not announced"
    assert resolve(PYTHON, world.env, []) == {}
    # another set of names is another lookup
    with pytest.raises(AssertionError):
        resolve(PYTHON, world.env, GOOD[:3])
    # a touched source file invalidates the answer
    impl = world.root / "pnpkg" / "impl.py"
    stat = impl.stat()
    os.utime(impl, (stat.st_atime + 10, stat.st_mtime + 10))
    with pytest.raises(AssertionError, match="no lookup subprocess expected"):
        resolve(PYTHON, world.env, GOOD)


def test_vllm_config_file_is_among_the_cached_answers_sources(world):
    resolve(PYTHON, world.env, ["parallel_config.tensor_parallel_size"])
    _forbid_subprocesses(world.monkeypatch)
    resolve(PYTHON, world.env, ["parallel_config.tensor_parallel_size"])  # cached
    config = world.root / "vllm" / "config.py"
    os.utime(config, (config.stat().st_atime, config.stat().st_mtime + 10))
    with pytest.raises(AssertionError):
        resolve(PYTHON, world.env, ["parallel_config.tensor_parallel_size"])


def test_an_interpreter_that_cannot_look_up_is_one_sentence(world):
    with pytest.raises(ConfigError, match="could not look up the probed names under /nonexistent/python"):
        resolve("/nonexistent/python", world.env, ["pnpkg.impl.f"])
    with pytest.raises(ConfigError) as err:
        resolve("/bin/false", world.env, ["pnpkg.impl.f"])
    assert str(err.value) == ("/bin/false could not look up the probed names (no output); check that it runs and "
                              "imports evalpipe.")


# ----------------------------------------------------------------------------- check_variant


FOUND = {
    "pkg.m.f": ResolvedName("pkg.m.f", "function", "pkg.m.f", "pkg.m", "f"),
    "pkg.m.Model": ResolvedName("pkg.m.Model", "class", "pkg.m.Model", "pkg.m", "Model"),
    "pkg.m.Layer": ResolvedName("pkg.m.Layer", "class", "pkg.m.Layer", "pkg.m", "Layer"),
    "pkg.m.gone": ResolvedName("pkg.m.gone", "function", error="does not exist: pkg.m has no attribute `gone`"),
    "pkg.m.on()": ResolvedName("pkg.m.on()", "predicate", "pkg.m.on()", "pkg.m", "on"),
    "pkg.mod": ResolvedName("pkg.mod", "function", error="is a module, not a function (name one of its functions, e.g. "
                                                         "pkg.mod.<function>)"),
}


def test_check_variant_accepts_what_exists_and_ignores_names_it_was_not_given():
    check_variant("b", "/py", Expectations(model="pkg.m.Model", layers=["pkg.m.Layer"], called=["pkg.m.f"],
                                           not_called=["other.pkg.f"], per_forward={"pkg.m.f": 1, "all_gather": 2},
                                           switches={"pkg.m.on()": True, "tensor_parallel_size": 2}), FOUND)


@pytest.mark.parametrize("expect, message", [
    ({"called": ["pkg.m.gone"]},
     "variant `b`: `expect.called` names `pkg.m.gone`, which does not exist: pkg.m has no attribute `gone` under /py; "
     "fix the name (module.Class.method, as that environment spells it) or remove it."),
    ({"not_called": ["pkg.m.gone"]}, "`expect.not_called` names `pkg.m.gone`, which does not exist"),
    ({"model": "pkg.m.f"}, "variant `b`: `expect.model` names `pkg.m.f`, which is not a class under /py;"),
    ({"layers": ["pkg.m.Layer", "pkg.m.f"]}, "`expect.layers` names `pkg.m.f`, which is not a class under /py"),
    ({"called": ["pkg.m.Model"]},
     "`expect.called` names `pkg.m.Model`, which is a class, not a function (name one of its methods, e.g. Class.forward) "
     "under /py"),
    ({"per_forward": {"pkg.m.Model": 1}}, "`expect.per_forward` names `pkg.m.Model`, which is a class"),
    ({"switches": {"pkg.m.gone": 1}}, "`expect.switches` names `pkg.m.gone`, which does not exist"),
    ({"called": ["pkg.mod"]}, "`expect.called` names `pkg.mod`, which is a module, not a function (name one of its "
                              "functions, e.g. pkg.mod.<function>) under /py"),
    ({"model": "pkg.mod"}, "`expect.model` names `pkg.mod`, which is a module, not a class (name the class defined in it"),
])
def test_check_variant_refuses_in_one_sentence(expect, message):
    with pytest.raises(ConfigError) as err:
        check_variant("b", "/py", Expectations.model_validate(expect), FOUND)
    text = str(err.value)
    assert message in text
    assert "\n" not in text and text.startswith("variant `b`: ") and text.endswith("or remove it.")


def test_probed_names_and_variant_names():
    names = probed_names([Expectations(called=["b.c.d", "a.b.c"], switches={"tensor_parallel_size": 2}),
                          Expectations(model="a.b.C", per_forward={"all_gather": 1, "x.y.z": 2}, switches={"p.q.r()": 1})])
    assert names == ["a.b.C", "a.b.c", "b.c.d", "p.q.r()", "x.y.z"], "standard switches and collectives need no lookup"
    vn = VariantNames({"pkg.f": ResolvedName("pkg.f", "function", "pkg.impl.f")})
    assert vn.canonical("pkg.f") == "pkg.impl.f" and vn.canonical("pkg.other") == "pkg.other"
    assert ResolvedName("a.b", "function", error="x").spec_entry() == {"name": "a.b", "module": "", "attr": "", "canonical": "a.b"}


def test_resolve_plan_looks_up_once_per_interpreter_and_skips_endpoints(monkeypatch):
    lookups: list[tuple[str, list[str]]] = []

    def fake_resolve(python, env, names, say=None):
        lookups.append((python, names))
        return dict(FOUND)

    monkeypatch.setattr(P, "resolve", fake_resolve)

    def planned(name, python, mode="offline", **expect):
        return SimpleNamespace(name=name, python=python, expect=Expectations(**expect), launch=SimpleNamespace(mode=mode),
                               process_env=lambda: {})

    out = P.resolve_plan([planned("a", "/py1", called=["pkg.m.f"]), planned("b", "/py1", model="pkg.m.Model"),
                          planned("c", "/py2"), planned("d", "/py3", mode="endpoint", called=["pkg.m.gone"])])
    assert [p for p, _ in lookups] == ["/py1", "/py2"]
    assert lookups[0][1] == ["pkg.m.Model", "pkg.m.f", "pkg.m.gone"], "every variant's names, in every interpreter"
    assert out["d"].names == {} and out["a"].names["pkg.m.f"].found
    with pytest.raises(ConfigError, match="variant `b`: `expect.called` names `pkg.m.gone`"):
        P.resolve_plan([planned("a", "/py1"), planned("b", "/py1", called=["pkg.m.gone"])])


def test_checks_lines():
    def variant(mode="offline", launched=None, **expect):
        return SimpleNamespace(expect=Expectations.model_validate(expect), server_of=None,
                               launch=SimpleNamespace(mode=mode, deployment=launched))

    lines = checks_lines(variant(model="pkg.m.Model", layers=["pkg.m.A", "pkg.m.B"], called=["pkg.m.f"], not_called=["pkg.m.g"],
                                 per_forward={"all_gather": 2, "pkg.m.f": {"min": 1, "max": 3}},
                                 forward_tokens={"1": {"min": 1}, "64": {"max": 0}},
                                 switches={"tensor_parallel_size": 2}, same_path=True))
    assert lines == [
        "model class pkg.m.Model",
        "decoder layers pkg.m.A or pkg.m.B",
        "called at least once: pkg.m.f",
        "never called: pkg.m.g",
        "in every forward pass: 2 x all_gather",
        "in every forward pass: 1..3 x pkg.m.f",
        "forward passes of 1 token: >= 1",
        "forward passes of 64-127 tokens: <= 0",
        "switch as the engine resolved it: tensor_parallel_size = 2",
        "meant to run the reference's code (an A/A pair)",
    ]
    assert checks_lines(variant())[0].startswith("no expectations: passes only if")
    # a deployment's nodes are checked whatever the expectations say, and its shape as stated
    deployed = checks_lines(variant("serve", Deployment(nodes=2), called=["pkg.m.f"],
                                    deployment={"nodes": 2, "ranks_per_node": 1, "data_parallel_size": 2}))
    assert deployed[-2:] == ["every one of its 2 nodes built the model and called pkg.m.f",
                             "deployment as its processes show it: 2 nodes, data-parallel ranks per node 1, "
                             "data_parallel_size 2 in every process"]
    assert checks_lines(variant("endpoint", model="pkg.m.Model")) == [
        "path not verifiable in endpoint mode: the server runs outside evalpipe, its code cannot be probed "
        "(the verdict is INCONCLUSIVE)"]


def test_the_cache_is_per_environment_not_only_per_interpreter(world, tmp_path):
    # BUG (evalpipe/probing/names.py, resolve): the cache key is (interpreter, names, lookup
    # rules), not the environment the lookup ran in. A variant that runs the same python with
    # its own PYTHONPATH (another build's checkout, as evalpipe/execution/guard.py allows) gets the
    # answer looked up under another variant's PYTHONPATH: here `pnpkg.impl.f` exists only in
    # the first tree, yet the second environment is told it exists (and check_variant lets
    # the variant start). Suggested fix: put the lookup environment's PYTHONPATH (or the
    # sys.path the lookup printed) in the cache key, and see resolve_plan below.
    other = tmp_path / "other-build"
    (other / "pnpkg").mkdir(parents=True)
    (other / "pnpkg" / "__init__.py").write_text("", encoding="utf-8")
    (other / "pnpkg" / "impl.py").write_text("def g():\n    pass\n", encoding="utf-8")
    other_env = {**world.env, "PYTHONPATH": os.pathsep.join([str(other), str(PROJECT)])}
    assert resolve(PYTHON, world.env, ["pnpkg.impl.f"])["pnpkg.impl.f"].found
    found = resolve(PYTHON, other_env, ["pnpkg.impl.f"])["pnpkg.impl.f"]
    assert not found.found, "answered from the cache of another environment"
    assert found.error == "does not exist: pnpkg.impl has no attribute `f`"


def test_resolve_plan_looks_up_each_environment(monkeypatch):
    # BUG (evalpipe/probing/names.py, resolve_plan): variants are grouped by `python` alone, so
    # two variants on one interpreter whose process_env() differ in PYTHONPATH share the
    # first one's lookup. Suggested fix: group by (python, env["PYTHONPATH"]) (and key the
    # cache the same way).
    lookups: list[str] = []

    def fake_resolve(python, env, names, say=None):
        lookups.append(env["PYTHONPATH"])
        return dict(FOUND)

    monkeypatch.setattr(P, "resolve", fake_resolve)

    def planned(name, pythonpath):
        return SimpleNamespace(name=name, python="/py", expect=Expectations(called=["pkg.m.f"]),
                               launch=SimpleNamespace(mode="offline"), process_env=lambda: {"PYTHONPATH": pythonpath})

    P.resolve_plan([planned("base", "/work/main"), planned("pr", "/checkouts/pr:/work/main")])
    assert lookups == ["/work/main", "/checkouts/pr:/work/main"]


def test_a_missing_dependency_whose_name_prefixes_the_module_is_said(world):
    # BUG (evalpipe/probes/resolve.py, _import_prefix): whether a ModuleNotFoundError is about
    # the looked-up module itself is tested with a string prefix, `name.startswith(err.name)`,
    # so `torch_npu_ext.ops` failing on its missing dependency `torch_npu` is taken for
    # "torch_npu_ext.ops does not exist", the lookup falls back to the package and says
    # "does not exist: torch_npu_ext has no attribute `ops`", hiding the missing dependency.
    # Suggested fix: `err.name == name or name.startswith(err.name + ".")` (a dotted prefix).
    found = resolve(PYTHON, world.env, ["torch_npu_ext.ops.f"])["torch_npu_ext.ops.f"]
    assert found.error == "cannot be imported: ModuleNotFoundError: No module named 'torch_npu'", found.error
