"""`evalpipe doctor`, --dry-run on the Ascend profiles, and the pieces serve mode is
made of that need no engine (the server's --config file, the HTTP client's parsing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from in_process import evalpipe
from plans import fake_plan

from evalpipe.commands import doctor
from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import load_config
from evalpipe.config.run_config import Launch
from evalpipe.execution import serve
from evalpipe.install import default_config

PROFILES = default_config().parent / "ascend"


def test_doctor_passes_on_the_default_config(tmp_path):
    proc = evalpipe("doctor", "gsm8k", "--output", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert all(l.startswith("PASS") for l in lines[:-1]) and "checks passed" in lines[-1]
    for needed in ("interpreter", "vllm 0.", "torch", "model", "task gsm8k_synth_4shot", "disk"):
        assert any(needed in l for l in lines), needed
    assert not (tmp_path / "runs").exists()  # starts nothing, writes no run


def test_doctor_checks_the_engine_patches_a_variant_asks_for(tmp_path):
    """configs/sp_moe.yaml asks for evalpipe's CPU workarounds and SP-MoE switch: doctor checks
    in the variant's interpreter that vLLM will load the plugin and that every patch still
    fits the installed vLLM (once per interpreter, a line per variant)."""
    config = default_config().with_name("sp_moe.yaml")
    proc = evalpipe("doctor", "gsm8k", "-c", str(config), "--output", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    for variant in ("replicated", "sp", "sp_fixed"):
        for patch in ("plugin evalpipe_engine_patches -> evalpipe.engine_patches.plugin:register",
                      "cpu_all_gatherv CpuCommunicator still lacks", "cpu_experts_expert_map", "sp_moe_fixed"):
            assert any(line.startswith(f"PASS {variant} engine patch: {patch}") for line in lines), (variant, patch, lines)
        # vLLM's own CPU platform, asked in the variant's interpreter, builds the backend the config pins
        assert any(line.startswith(f"PASS {variant} attention backend vLLM's CPU platform builds CPU_MLA for this MLA model")
                   and line.endswith("float32, as expected") for line in lines), (variant, lines)
    assert not (tmp_path / "runs").exists()


def test_doctor_fails_a_variant_whose_expected_attention_backend_this_processor_will_not_build(tmp_path):
    """The same on every processor kind: CPU_MLA pinned, AMX_MLA expected."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"extends": str(default_config().with_name("rotary_control.yaml")),
                                      "variants": {"custom_op": {"expect": {"switches": {"attention_backends": ["AMX_MLA"]}}}}}))
    proc = evalpipe("doctor", "gsm8k", "-c", str(config), "--output", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL custom_op attention backend vLLM's CPU platform builds CPU_MLA"), failed
    assert "says ['AMX_MLA']: the run would be INCONCLUSIVE" in failed[0], failed
    assert any(line.startswith("PASS native attention backend") for line in lines)


def test_doctor_on_the_ascend_profile_says_what_is_missing(tmp_path):
    proc = evalpipe("doctor", "-c", str(PROFILES / "glm5-dsa-a3.yaml"), "--output", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert "FAIL run model model directory /models/GLM-5.2-w4a8c8 does not exist on this machine" in out
    assert "data file /data/gsm8k/train.parquet does not exist" in out
    assert "no CANN toolkit found" in out
    assert "FAIL legacy interpreter /opt/venvs/vllm-ascend-base/bin/python did not run" in out
    assert "FAIL sp interpreter /opt/venvs/vllm-ascend-pr18671/bin/python did not run" in out
    assert "is not on this machine" in out and "Traceback" not in proc.stderr

    proc = evalpipe("doctor", "gsm8k", "-c", str(PROFILES / "glm5-dsa-two-nodes.yaml"), "--output", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert "FAIL legacy endpoint http://node0-legacy:8000 is not reachable" in " ".join(proc.stdout.split())


def test_dry_run_of_the_ascend_profile_prints_each_variants_commands(tmp_path):
    proc = evalpipe("run", "gsm8k", "-c", str(PROFILES / "glm5-dsa-a3.yaml"), "--dry-run", "--output", str(tmp_path), cwd=tmp_path)
    out = proc.stdout
    assert "/opt/venvs/vllm-ascend-base/bin/python -m vllm.entrypoints.openai.api_server --config" in out
    assert "/opt/venvs/vllm-ascend-pr18671/bin/python -m vllm.entrypoints.openai.api_server --config" in out
    assert "data-parallel-size: 2" in out and "tensor-parallel-size: 8" in out and "enable_dsa_cp: true" in out
    assert "max-num-seqs: 6" in out  # the A/A run: max_num_seqs halved
    # then the plan is checked against this machine: one sentence, exit 2, nothing written
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_profiles_load_and_two_nodes_extends_one_node():
    one = load_config(PROFILES / "glm5-dsa-a3.yaml")
    two = load_config(PROFILES / "glm5-dsa-two-nodes.yaml")
    assert one.engine["data_parallel_size"] == 2 and one.engine["additional_config"]["enable_dsa_cp"] is True
    assert one.variant_launch("sp").mode == "serve" and two.variant_launch("sp").mode == "endpoint"
    assert two.variant_launch("legacy").url == "http://node0-legacy:8000" and two.engine == one.engine
    assert one.gates.scores.margin == 0.015 and max(one.longctx.lengths) == 131072


def test_the_cluster_profile_places_each_ascend_engine_on_an_a3_node_of_its_own(tmp_path):
    one = load_config(PROFILES / "glm5-dsa-a3.yaml")
    cluster = load_config(PROFILES / "glm5-dsa-cluster.yaml")
    assert cluster.engine == one.engine and cluster.variants == one.variants, "the same A/B, placed"
    assert cluster.cluster.enabled and cluster.cluster.distinct_nodes and cluster.cluster.resources["NPU"] == 16
    proc = evalpipe("run", "gsm8k", "-c", str(PROFILES / "glm5-dsa-cluster.yaml"), "--dry-run", "--output", str(tmp_path),
                    cwd=tmp_path)
    out = " ".join(proc.stdout.split())
    assert "cluster auto: 3 unit(s) all at once, each on a node of its own" in out
    for name in ("legacy", "legacy-aa", "sp"):
        assert f"{name} asks for {{CPU: 8, NPU: 16}}" in out
    assert proc.returncode == 2 and "does not exist" in proc.stderr and list(tmp_path.iterdir()) == []


def test_vllms_own_ray_backend_leaves_the_npus_to_its_placement_and_a_unit_that_holds_them_is_refused(tmp_path):
    """The A/B with vLLM's Ray data-parallel backend (what glm5-dsa-cluster-ray.yaml was before
    deployments; it is one now: tests/commands/test_ascend_deployments.py)."""
    ray_backend = tmp_path / "ray-backend.yaml"
    ray_backend.write_text(f"extends: {PROFILES / 'glm5-dsa-a3.yaml'}\n"
                           "engine: {tensor_parallel_size: 16, data_parallel_size: 2, data_parallel_backend: ray}\n"
                           "expect: {switches: {tensor_parallel_size: 16}}\n"
                           "cluster: {address: auto, resources: {CPU: 8}, concurrency: 3}\n")
    proc = evalpipe("run", "gsm8k", "-c", str(ray_backend), "--dry-run", "--output", str(tmp_path / "runs"), cwd=tmp_path)
    out = " ".join(proc.stdout.split())
    for name in ("legacy", "legacy-aa", "sp"):
        assert f"{name} asks for {{CPU: 8}} and its engine places its 32 rank(s) itself through Ray (data_parallel_backend: ray)" in out
    assert proc.returncode == 2 and "does not exist" in proc.stderr  # the model: on the A3 nodes, not here
    holding = tmp_path / "holding.yaml"
    holding.write_text(f"extends: {ray_backend}\ncluster: {{resources: {{NPU: 16, CPU: 8}}}}\n")
    refused = evalpipe("run", "gsm8k", "-c", str(holding), "--dry-run", "--output", str(tmp_path / "runs"), cwd=tmp_path)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "variant `legacy`: its engine places its 32 rank(s) itself through Ray" in said
    assert "also hold {NPU: 16}" in said and "leave the devices to vLLM" in said
    assert not (tmp_path / "runs").exists()


def test_extends_cycle_and_missing_base_are_one_sentence(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    a, b = (tmp_path / "a.yaml").resolve(), (tmp_path / "b.yaml").resolve()
    with pytest.raises(ConfigError) as cycle:
        load_config(tmp_path / "a.yaml")
    assert f"`extends: a.yaml` closes a cycle ({a} extends {b} extends {a}); remove `extends:` from one of them" in str(cycle.value)
    (tmp_path / "self.yaml").write_text("extends: self.yaml\n")
    with pytest.raises(ConfigError, match=r"closes a cycle \(.*self.yaml extends .*self.yaml\)"):
        load_config(tmp_path / "self.yaml")
    with pytest.raises(ConfigError, match=r"config file /dev/null is not a regular file \(a device, a pipe or a socket\)"):
        load_config("/dev/null")
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match=r"dangling.yaml is a link to .*gone.yaml, which does not exist"):
        load_config(tmp_path / "dangling.yaml")
    with pytest.raises(ConfigError, match=r"is a directory; pass a YAML file with -c/--config \(e.g. .*a.yaml, .*b.yaml"):
        load_config(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty is a directory; pass a YAML file with -c/--config\.$"):
        load_config(tmp_path / "empty")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml \(named by `extends:` in .*c.yaml\) does not exist; fix `extends:` in .*c.yaml"):
        load_config(tmp_path / "c.yaml")


def test_extends_merges_mappings_and_null_removes_a_key(tmp_path):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({
        "extends": str(default_config()), "engine": {"max_num_seqs": 2},
        "variants": {"sp": None, "new": {"env": {"EVALPIPE_LAYOUT": "sp"}}},
    }))
    cfg = load_config(tmp_path / "x.yaml")
    base = load_config(default_config())
    assert list(cfg.variants) == ["legacy", "new"] and cfg.engine["max_num_seqs"] == 2
    assert cfg.engine["hf_overrides"] == base.engine["hf_overrides"]  # the rest of the mapping is kept
    assert list(load_config(default_config().parent / "data_parallel.yaml").variants) == ["dp1", "dp2"]


def test_variant_launch_errors_name_the_variant(tmp_path):
    cfg = {"extends": str(default_config()), "variants": {"sp": {"launch": {"mode": "endpoint"}}}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="variant `sp`: launch: mode `endpoint` needs `url`"):
        load_config(tmp_path / "x.yaml")
    cfg["variants"]["sp"]["launch"] = {"urll": "http://x"}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="variant `sp`: unknown key `launch.urll`"):
        load_config(tmp_path / "x.yaml")


def test_model_dir_checks(tmp_path):
    assert doctor.model_dir_problems(tmp_path / "none", {}) == [f"{tmp_path / 'none'} is not a directory"]
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    problems = doctor.model_dir_problems(tmp_path, {"additional_config": {"enable_dsa_cp": True}})
    assert any("no weights" in p for p in problems) and any("no tokenizer" in p for p in problems)
    assert any("no index_topk" in p for p in problems)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({"index_topk": 2048}))
    assert doctor.model_dir_problems(tmp_path, {"additional_config": {"enable_dsa_cp": True}}) == []


def test_devices_needed():
    assert doctor.devices_needed({}) == 1
    assert doctor.devices_needed({"data_parallel_size": 2, "tensor_parallel_size": 8}) == 16
    assert doctor.devices_needed({"data_parallel_size": 2, "data_parallel_size_local": 1, "tensor_parallel_size": 16}) == 16


def test_the_server_config_file_is_what_vllms_own_parser_reads(tmp_path):
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    engine = {"model": "/m", "max_num_seqs": 3, "enforce_eager": True, "enable_prefix_caching": False,
              "hf_overrides": {"architectures": ["X"], "layout_tp": 4}, "additional_config": {"enable_dsa_cp": True}}
    path = tmp_path / serve.SERVER_ARGS_FILE
    serve.write_server_args(path, serve.server_args(engine, Launch(mode="serve"), 8123))
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(path)])
    assert (ns.model, ns.max_num_seqs, ns.enforce_eager, ns.enable_prefix_caching) == ("/m", 3, True, False)
    assert ns.hf_overrides == {"architectures": ["X"], "layout_tp": 4}
    assert ns.additional_config == {"enable_dsa_cp": True}
    assert (ns.host, ns.port) == ("127.0.0.1", 8123)


def test_server_command_takes_the_launcher_and_command():
    launch = Launch(mode="serve", launcher=["ssh", "node1"], command=["vllm", "serve"])
    assert serve.server_command("/py", launch, Path("/r/a.yaml")) == ["ssh", "node1", "vllm", "serve", "--config", "/r/a.yaml"]
    assert serve.server_command("/py", Launch(mode="serve"), Path("/a.yaml"))[:3] == ["/py", "-m", serve.SERVER_MODULE]
    port = serve.free_port("127.0.0.1")
    assert serve.port_is_free("127.0.0.1", port)


def test_a_missing_launcher_fails_the_variant_in_one_sentence(tmp_path):
    cfg = {"extends": str(default_config()), "output": str(tmp_path / "runs"), "noise_floor": False,
           "variants": {"sp": {"launch": {"mode": "serve", "launcher": ["no-such-launcher-xyz"]}}}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(cfg))
    proc = evalpipe("run", "gsm8k", "-c", str(tmp_path / "x.yaml"), "--variants", "sp", "--run-id", "l", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    flat = " ".join(proc.stderr.split())
    assert "variant `sp`: could not start its server `no-such-launcher-xyz" in flat and "launch.launcher" in flat
    assert "Traceback" not in proc.stderr


def test_variants_on_one_interpreter_and_import_path_look_their_probe_names_up_once(tmp_path, monkeypatch):
    """An A/A pair (and any variants that differ only in settings read at run time) share
    the interpreter and import path: one process importing vLLM answers for all of them, as
    the run's own lookup does (evalpipe.probing.names.resolve_plan); another path asks again."""
    asked: list[tuple[str, str]] = []

    def resolve(python, env, names, say=None):
        asked.append((python, env["PYTHONPATH"]))
        return {}

    monkeypatch.setattr(doctor, "resolve", resolve)
    plan = fake_plan(tmp_path, {"ref": {}, "ref-aa": {}, "other": {"env": {"EVALPIPE_LAYOUT": "sp"}},
                                "elsewhere": {"env": {"PYTHONPATH": str(tmp_path)}}}, "lookups")
    looked_up: dict = {}
    for variant in plan.variants:
        ok, detail = doctor.check_probe_names(variant, plan, looked_up)
        assert ok, detail
    assert len(asked) == 2 and asked[0][1] != asked[1][1], asked


def test_scenario_tasks_are_sized_by_the_configs_engine(tmp_path):
    """The chunked-prefill scenario sizes its prompts by the engine's max_num_batched_tokens:
    doctor builds its items from the config's engine as the run does (it once built them
    from no engine and stopped at that task on the default config)."""
    plan = fake_plan(tmp_path, {"ref": {}}, "sized", tasks={"gsm8k": [{"task": "scenario_chunked_prefill"}]},
                     engine={"max_model_len": 4096, "seed": 0, "max_num_batched_tokens": 512})
    checks: list[doctor.Check] = []
    add = lambda scope, name, ok, detail: checks.append(doctor.Check(scope, name, ok, detail))  # noqa: E731
    doctor._check_tasks(plan, doctor._model_path(plan, add), add)
    assert [(c.name, c.ok) for c in checks if c.name.startswith("task ")] == [("task scenario_chunked_prefill", True)], checks


def test_each_interpreter_and_import_path_is_asked_everything_in_one_process(tmp_path, monkeypatch):
    """Each process importing vLLM costs seconds: the packages, the engine patches' checks and
    the attention backend of every distinct request on one interpreter and import path are
    one question, whose answers every variant there reads."""
    asked: list[tuple[str, str, dict]] = []

    def ask(v, script, mark, timeout_s=300, stdin=None):
        question = json.loads(stdin)
        asked.append((v.name, v.process_env()["PYTHONPATH"], question))
        packages = {"python": "3", **{m: {"path": "/x", "version": "1"} for m in ("vllm", "torch")}}
        patches = [["plugin", True, "stub"]] if question["patches"] else None
        return {**packages, "patches": patches, "backends": {r: {"platform": "stub"} for r in question["backends"]}}, ""

    monkeypatch.setattr(doctor, "ask_interpreter", ask)
    monkeypatch.setattr(doctor, "check_probe_names", lambda v, plan, looked_up=None: (True, "stubbed"))
    plan = fake_plan(tmp_path, {"ref": {}, "ref-aa": {}, "bf16": {"engine": {"dtype": "bfloat16"}},
                                "patched": {"env": {"EVALPIPE_CPU_EP": "1"}},
                                "elsewhere": {"env": {"PYTHONPATH": str(tmp_path)}}}, "one-ask")
    checks = doctor.run_checks(plan)
    assert [name for name, _, _ in asked] == ["ref", "elsewhere"], asked
    first = asked[0][2]
    assert first["patches"] and len(first["backends"]) == 2, "two dtypes, one request each; `patched` asks for patches"
    assert not asked[1][2]["patches"] and len(asked[1][2]["backends"]) == 1
    assert [c.scope for c in checks if c.name == "engine patch: plugin"] == ["patched"]
    assert [(c.scope, c.ok) for c in checks if c.name == "interpreter"] == [(v.name, True) for v in plan.variants]
