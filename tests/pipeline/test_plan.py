import sys

import pytest
from checkout import ROOT

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import parse_config
from evalpipe.documents.run_doc import NoiseFloorEntry
from evalpipe.install import worker_import_dir
from evalpipe.pipeline.plan import DEFAULT_ENV, make_plan, run_info, select_tasks

CONFIG = {
    "model": {"path": "builtin:tiny-gsm", "dtype": "float32"},
    "engine": {"max_model_len": 4096, "additional_config": {"enable_dsa_cp": True, "keep": 1}},
    "env": {"SHARED": "1"},
    "variants": {
        "legacy": {"env": {"LAYOUT": "legacy"}},
        "sp": {"env": {"LAYOUT": "sp", "SHARED": "2"}, "engine": {"additional_config": {"enable_dsa_cp": False}}},
    },
    "reference": "legacy",
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}], "longctx": [{"task": "niah_single_1"}]},
}


def plan(**kwargs):
    return make_plan(parse_config(CONFIG), "cfg.yaml", kwargs.pop("tasks", "gsm8k"), **kwargs)


def test_variants_get_merged_engine_args_env_and_interpreter(tmp_path):
    p = plan(output=str(tmp_path))
    assert [v.name for v in p.variants] == ["legacy", "sp"]
    sp = p.variant("sp")
    assert sp.engine_args["additional_config"] == {"enable_dsa_cp": False, "keep": 1}
    assert sp.engine_args["dtype"] == "float32" and sp.engine_args["max_model_len"] == 4096
    assert sp.env_overrides == {"SHARED": "2", "LAYOUT": "sp"}
    assert sp.python == sys.executable
    env = sp.process_env()
    assert env["LAYOUT"] == "sp" and env["SHARED"] == "2"
    assert env["PYTHONPATH"].split(":")[0] == str(worker_import_dir()) == str(ROOT), "workers import this checkout"
    assert p.run_dir.parent == tmp_path


def test_config_env_wins_over_default_offline_env(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = dict(CONFIG, env={"HF_HUB_OFFLINE": "0"})
    p = make_plan(parse_config(cfg), "cfg.yaml", "gsm8k")
    assert p.variants[0].process_env()["HF_HUB_OFFLINE"] == "0"
    p2 = plan()
    assert p2.variants[0].process_env()["HF_HUB_OFFLINE"] == DEFAULT_ENV["HF_HUB_OFFLINE"]


def test_reference_runs_first_and_variant_selection():
    p = plan(variants="sp,legacy")
    assert [v.name for v in p.variants] == ["legacy", "sp"]
    only_sp = plan(variants="sp")
    assert only_sp.reference == "sp" and only_sp.notes
    with pytest.raises(ConfigError, match="variant `nope` is not defined in cfg.yaml; known variants: legacy, sp"):
        plan(variants="legacy,nope")


def test_task_selection_groups_all_and_raw_names_with_limit():
    cfg = parse_config(CONFIG)
    assert [t.spec.task for t in select_tasks(cfg, "gsm8k", None)] == ["gsm8k_synth_4shot"]
    assert [t.spec.task for t in select_tasks(cfg, "all", None)] == ["gsm8k_synth_4shot", "niah_single_1"]
    raw = select_tasks(cfg, "hellaswag", 5)
    assert raw[0].group == "hellaswag" and raw[0].spec.limit == 5 and raw[0].spec.num_fewshot is None
    assert len(select_tasks(cfg, "gsm8k,all", None)) == 2, "a task is run once"
    with pytest.raises(ConfigError, match="--limit"):
        select_tasks(cfg, "gsm8k", 0)


def test_each_task_carries_its_sampling_with_the_seed_resolved():
    cfg = parse_config({**CONFIG, "seed": 99, "sampling": {"temperature": 0.6, "samples": 4},
                        "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "sampling": {"temperature": 1.0, "seed": 5}}],
                                  "longctx": [{"task": "niah_single_1"}]}})
    own, inherited = (t.spec.sampling for t in select_tasks(cfg, "all", None))
    assert (own.temperature, own.samples, own.seed) == (1.0, 1, 5)  # a task's own replaces the run's whole
    assert (inherited.temperature, inherited.samples, inherited.seed) == (0.6, 4, 99)  # the run's, with the run's seed
    assert select_tasks(parse_config(CONFIG), "gsm8k", None)[0].spec.sampling is None  # greedy by default


def test_missing_model_path_and_unknown_builtin():
    cfg = dict(CONFIG, model={"path": "/does/not/exist"})
    with pytest.raises(ConfigError, match="model path `/does/not/exist` does not exist"):
        make_plan(parse_config(cfg), "cfg.yaml", "gsm8k")
    cfg = dict(CONFIG, model={"path": "builtin:nope"})
    with pytest.raises(ConfigError, match="names no built-in model; known: builtin:tiny-gsm"):
        make_plan(parse_config(cfg), "cfg.yaml", "gsm8k")


def test_missing_variant_interpreter():
    cfg = dict(CONFIG, reference=None, variants={"a": {}, "b": {"python": "/opt/nowhere/bin/python"}})
    with pytest.raises(ConfigError, match="variant `b`: python interpreter `/opt/nowhere/bin/python` was not found"):
        make_plan(parse_config(cfg), "cfg.yaml", "gsm8k")


def test_run_info_records_what_distinguishes_variants():
    info = run_info(plan())
    assert info.reference == "legacy" and info.variants == ["legacy", "sp"]
    assert info.variant_settings["sp"].env == {"LAYOUT": "sp", "SHARED": "2"}
    assert info.tasks[0]["task"] == "gsm8k_synth_4shot"
    assert len(info.fingerprints.config_sha256 or "") == 64


def test_noise_floor_repeats_the_reference_right_after_it(tmp_path):
    p = plan(output=str(tmp_path), noise_floor=True)
    assert [v.name for v in p.variants] == ["legacy", "legacy-aa", "sp"]
    ref, aa = p.variants[0], p.variants[1]
    assert aa.aa_of == "legacy" and aa.reverse_order and not ref.reverse_order
    assert aa.env_overrides == ref.env_overrides and aa.python == ref.python
    # another batch arrangement, same numerics: only max_num_seqs differs (vLLM's 256 halved)
    assert {k: v for k, v in aa.engine_args.items() if ref.engine_args.get(k) != v} == {"max_num_seqs": 128}
    info = run_info(p)
    assert info.noise_floor == NoiseFloorEntry(variant="legacy-aa", of="legacy", reverse_order=True)
    assert info.variant_settings["legacy-aa"].engine == {"max_num_seqs": 128}
    assert info.variant_settings["legacy-aa"].env == {"LAYOUT": "legacy"}


def test_noise_floor_from_config_with_own_overrides_and_cli_switch_off(tmp_path):
    cfg = parse_config({**CONFIG, "noise_floor": {"reverse_order": False, "engine": {"max_num_batched_tokens": 64}}})
    p = make_plan(cfg, "cfg.yaml", "gsm8k", output=str(tmp_path))
    aa = p.variant("legacy-aa")
    assert not aa.reverse_order and aa.engine_args["max_num_batched_tokens"] == 64
    assert "max_num_seqs" not in aa.engine_args
    off = make_plan(cfg, "cfg.yaml", "gsm8k", output=str(tmp_path), noise_floor=False)
    assert [v.name for v in off.variants] == ["legacy", "sp"]
    assert run_info(off).noise_floor is None


def test_noise_floor_reusing_the_references_server(tmp_path):
    serve = {**CONFIG, "launch": {"mode": "serve", "concurrency": 10}, "noise_floor": {"reuse_server": True}}
    p = make_plan(parse_config(serve), "cfg.yaml", "gsm8k", output=str(tmp_path))
    ref, aa = p.variants[0], p.variants[1]
    # no second engine: same engine args, the reference's server, half the requests in flight
    assert aa.server_of == "legacy" and aa.engine_args == ref.engine_args and aa.reverse_order
    assert (aa.launch.mode, aa.launch.concurrency, ref.launch.concurrency) == ("serve", 5, 10)
    assert p.variant("sp").server_of is None
    with pytest.raises(ConfigError, match="reuse_server needs a server"):
        make_plan(parse_config({**CONFIG, "noise_floor": {"reuse_server": True}}), "cfg.yaml", "gsm8k", output=str(tmp_path))
    # an endpoint cannot restart with other settings: its A/A run always reuses it
    endpoint = {**CONFIG, "launch": {"mode": "endpoint", "url": "http://h:1"}, "noise_floor": True}
    aa = make_plan(parse_config(endpoint), "cfg.yaml", "gsm8k", output=str(tmp_path)).variant("legacy-aa")
    assert aa.launch.url == "http://h:1" and aa.launch.concurrency == 32 and aa.server_of is None


def test_noise_floor_name_collision_is_a_config_error():
    with pytest.raises(ConfigError, match="collides with the name of the A/A noise-floor run"):
        parse_config({**CONFIG, "variants": {**CONFIG["variants"], "legacy-aa": {}}, "noise_floor": True})
    cfg = parse_config({**CONFIG, "variants": {**CONFIG["variants"], "legacy-aa": {}}})
    with pytest.raises(ConfigError, match="--no-noise-floor"):
        make_plan(cfg, "cfg.yaml", "gsm8k", noise_floor=True)


def longctx_plan(tmp_path, task=None, **longctx):
    cfg = {**CONFIG, "tasks": {"longctx": [task or {"task": "longctx_passkey"}]}, "longctx": longctx}
    return make_plan(parse_config(cfg), "cfg.yaml", "longctx", output=str(tmp_path))


def test_longctx_lengths_must_fit_the_context_window(tmp_path):
    assert longctx_plan(tmp_path, lengths=[1024, 2048], sparse_block=2048, tp_sizes=[4, 16]).tasks
    with pytest.raises(ConfigError, match=r"`longctx_passkey` needs prompts of 4096 tokens plus 16 generated, more than "
                                          r"max_model_len 4096 of variant `legacy`; raise engine.max_model_len to at least 4112"):
        longctx_plan(tmp_path, lengths=[4096])


def test_longctx_tasks_refuse_shots(tmp_path):
    with pytest.raises(ConfigError, match="zero-shot by construction .* remove num_fewshot"):
        longctx_plan(tmp_path, task={"task": "longctx_vartrack", "num_fewshot": 2}, lengths=[1024], sparse_block=1024)


def test_longctx_spec_in_the_config_is_strict():
    with pytest.raises(ConfigError, match="lenghts"):
        parse_config({**CONFIG, "longctx": {"lenghts": [1024]}})


def test_ruler_lengths_plus_generation_must_fit_the_context_window(tmp_path):
    ok = longctx_plan(tmp_path, task={"task": "niah_single_1"}, lengths=[2048, 3968])
    assert [t.spec.task for t in ok.tasks] == ["niah_single_1"]
    with pytest.raises(ConfigError, match=r"^`niah_single_1` \(RULER\) needs prompts of up to 4096 tokens plus 128 generated, "
                                          r"more than max_model_len 4096 of variant `legacy`; raise engine.max_model_len to at "
                                          r"least 4224 or drop the longer lengths from longctx.lengths\.$"):
        longctx_plan(tmp_path, task={"task": "niah_single_1"}, lengths=[2048, 4096])
    # each task's own max_gen_toks, or the entry's override
    assert longctx_plan(tmp_path, task={"task": "ruler_vt"}, lengths=[4066]).tasks
    with pytest.raises(ConfigError, match="4067 tokens plus 30 generated"):
        longctx_plan(tmp_path, task={"task": "ruler_vt"}, lengths=[4067])
    assert longctx_plan(tmp_path, task={"task": "niah_single_1", "max_gen_toks": 16}, lengths=[4080]).tasks


def test_ruler_refuses_shots_and_data_files(tmp_path):
    with pytest.raises(ConfigError, match=r"`ruler_cwe` \(RULER\) is zero-shot"):
        longctx_plan(tmp_path, task={"task": "ruler_cwe", "num_fewshot": 1}, lengths=[1024])
    with pytest.raises(ConfigError, match="remove data_files"):
        longctx_plan(tmp_path, task={"task": "niah_multikey_3", "data_files": {"test": "x.jsonl"}}, lengths=[1024])


def test_ruler_items_per_length_is_part_of_the_longctx_spec():
    assert parse_config({**CONFIG, "longctx": {"ruler_items_per_length": 2}}).longctx.ruler_items_per_length == 2
    with pytest.raises(ConfigError, match="ruler_items_per_length is 0"):
        parse_config({**CONFIG, "longctx": {"ruler_items_per_length": 0}})


DEPLOYED = {"mode": "serve", "deployment": {"nodes": 2}}


def _deployed_config(**top) -> dict:
    cfg = {**CONFIG, "engine": {**CONFIG.get("engine", {}), "data_parallel_size": 2}, "launch": DEPLOYED, **top}
    return cfg


def test_a_deployment_s_shape_is_checked_against_its_engine_arguments_for_the_a_a_run_too(tmp_path):
    ok = make_plan(parse_config(_deployed_config(noise_floor={"launch": {"deployment": {"rpc_port": 13390}}})),
                   "cfg.yaml", "gsm8k", output=str(tmp_path))
    aa = ok.variant(ok.variants[1].name)
    assert aa.aa_of and aa.launch.deployment is not None and aa.launch.deployment.rpc_port == 13390
    assert ok.variants[0].launch.deployment.rpc_port is None, "the override is the A/A run's alone"
    odd = _deployed_config(noise_floor={"launch": {"deployment": {"nodes": 3}}})
    with pytest.raises(ConfigError, match=r"variant `\w+-aa`: data_parallel_size 2 does not split evenly over 3 nodes"):
        make_plan(parse_config(odd), "cfg.yaml", "gsm8k", output=str(tmp_path))
    with pytest.raises(ConfigError, match="noise_floor.launch cannot apply with reuse_server"):
        make_plan(parse_config(_deployed_config(noise_floor={"reuse_server": True, "launch": {"port": 1}})),
                  "cfg.yaml", "gsm8k", output=str(tmp_path))


def test_on_a_ray_cluster_ray_places_a_deployment_s_nodes(tmp_path):
    launched = _deployed_config(launch={**DEPLOYED, "deployment": {"nodes": 2, "launchers": [[], ["ssh", "b"]]}},
                                cluster={"address": "127.0.0.1:6379"})
    with pytest.raises(ConfigError, match="Ray places a deployment's nodes, so `launch.deployment.launchers` would be"):
        make_plan(parse_config(launched), "cfg.yaml", "gsm8k", output=str(tmp_path))
    spread = _deployed_config(cluster={"address": "127.0.0.1:6379", "distinct_nodes": True})
    with pytest.raises(ConfigError, match="remove distinct_nodes"):
        make_plan(parse_config(spread), "cfg.yaml", "gsm8k", output=str(tmp_path))
    plain = make_plan(parse_config(_deployed_config(cluster={"address": "127.0.0.1:6379"})), "cfg.yaml", "gsm8k",
                      output=str(tmp_path))
    assert all(v.launch.deployment is not None for v in plain.variants)


def test_resources_a_run_here_does_not_use_are_named_in_a_note():
    assert not [n for n in plan().notes if "resources" in n]
    variants = {**CONFIG["variants"], "sp": {**CONFIG["variants"]["sp"], "resources": {"NPU": 16}}}
    here = make_plan(parse_config(dict(CONFIG, variants=variants, cluster={"resources": {"NPU": 8}})), "cfg.yaml", "gsm8k")
    (note,) = [n for n in here.notes if "resources" in n]
    assert note.startswith("`cluster.resources`, variant `sp`'s `resources:` apply on a Ray cluster only") and "not used" in note
    there = make_plan(parse_config(dict(CONFIG, variants=variants, cluster={"address": "auto"})), "cfg.yaml", "gsm8k")
    assert not [n for n in there.notes if "resources" in n]


SCENARIO_CONFIG = {**CONFIG, "engine": {"max_model_len": 2048, "max_num_batched_tokens": 512},
                   "tasks": {"scenarios": [{"task": "scenario_prefix_cache"}, {"task": "scenario_chunked_prefill"},
                                           {"task": "gsm8k_synth_4shot", "schedule": "one_at_a_time",
                                            "requires": {"steps_by_tokens": {"1": {"min": 1}}}}]}}


def test_a_scenario_task_takes_its_own_schedule_and_requirements_into_every_variants_expectations(tmp_path):
    p = make_plan(parse_config(SCENARIO_CONFIG), "cfg.yaml", "scenarios", output=str(tmp_path))
    schedules = {t.spec.task: t.spec.sends for t in p.tasks}
    assert schedules == {"scenario_prefix_cache": "prime_first", "scenario_chunked_prefill": "one_at_a_time",
                         "gsm8k_synth_4shot": "one_at_a_time"}
    for v in p.variants:  # the A/A run too: it is held to the same paths
        assert set(v.expect.tasks) == {"scenario_prefix_cache", "scenario_chunked_prefill", "gsm8k_synth_4shot"}, v.name
        assert v.expect.tasks["scenario_prefix_cache"].prefix_cache_hits.min == 1
        # a prompt over the 512-token budget counted as one step of 513-1024 tokens: it ran in chunks
        assert v.expect.tasks["scenario_chunked_prefill"].steps_by_tokens["1024"].min == 1


def test_a_scenarios_schedule_survives_a_config_dumped_and_read_back(tmp_path):
    # calibrate rebuilds the run config from its dump: every field is then "set", and a default
    # filled in as a value would have turned the scenario's own schedule into `together`
    config = parse_config(SCENARIO_CONFIG)
    again = type(config).model_validate(config.model_dump(mode="json"))
    p = make_plan(again, "cfg.yaml", "scenarios", output=str(tmp_path))
    assert [t.spec.sends for t in p.tasks] == ["prime_first", "one_at_a_time", "one_at_a_time"]


def test_a_scenario_entry_keeps_what_it_states(tmp_path):
    cfg = {**SCENARIO_CONFIG, "tasks": {"scenarios": [
        {"task": "scenario_prefix_cache", "schedule": "together", "requires": {"prefix_cache_hits": {"min": 5000}}}]}}
    p = make_plan(parse_config(cfg), "cfg.yaml", "scenarios", output=str(tmp_path))
    assert p.tasks[0].spec.sends == "together"
    assert p.variant("sp").expect.tasks["scenario_prefix_cache"].prefix_cache_hits.min == 5000


@pytest.mark.parametrize("change, says", [
    ({"scenarios": {"prefix_tokens": 4096}}, "more than max_model_len 2048 of variant `legacy`"),
    ({"scenarios": {"chunk_tokens": 256}}, "prompts of 257 tokens into chunks, but variant `legacy` prefills 512"),
    ({"engine": {"max_model_len": 2048}}, "set engine.max_num_batched_tokens or scenarios.chunk_tokens"),
    ({"variants": {"legacy": {}, "sp": {"engine": {"max_num_batched_tokens": 2048}}}}, "variant `sp` prefills 2048"),
])
def test_a_scenario_that_cannot_drive_its_path_is_refused_before_any_engine_starts(tmp_path, change, says):
    with pytest.raises(ConfigError, match=says):
        make_plan(parse_config({**SCENARIO_CONFIG, **change}), "cfg.yaml", "scenarios", output=str(tmp_path))


def test_requires_that_names_nothing_is_refused():
    cfg = {**SCENARIO_CONFIG, "tasks": {"scenarios": [{"task": "scenario_prefix_cache", "requires": {}}]}}
    with pytest.raises(ConfigError, match="requires no counter"):
        parse_config(cfg)


def test_a_kv_cache_too_small_for_one_request_of_the_window_is_refused(tmp_path):
    small = {**SCENARIO_CONFIG, "engine": {**SCENARIO_CONFIG["engine"], "block_size": 128, "num_gpu_blocks_override": 15}}
    with pytest.raises(ConfigError, match=r"variant `legacy`: num_gpu_blocks_override 15 blocks of block_size 128 hold 1920 "
                                          r"tokens, fewer than one request of max_model_len 2048.*at least 16 blocks"):
        make_plan(parse_config(small), "cfg.yaml", "gsm8k", output=str(tmp_path))
    enough = {**small, "engine": {**small["engine"], "num_gpu_blocks_override": 16}}
    assert make_plan(parse_config(enough), "cfg.yaml", "gsm8k", output=str(tmp_path))


def test_the_preemption_scenario_runs_its_task_at_once_and_requires_a_preemption(tmp_path):
    cfg = {**SCENARIO_CONFIG, "tasks": {"scenarios": [{"task": "scenario_preemption"}]}}
    p = make_plan(parse_config(cfg), "cfg.yaml", "scenarios", output=str(tmp_path))
    assert p.tasks[0].spec.sends == "together"
    assert p.variant("sp").expect.tasks["scenario_preemption"].preemptions.min == 1
    # a KV cache that holds the whole burst would preempt nothing: refused
    roomy = {**cfg, "engine": {**cfg["engine"], "block_size": 128, "num_gpu_blocks_override": 100}}
    with pytest.raises(ConfigError, match=r"sends 24 requests of up to 384 tokens at once \(9216 tokens\), which the 100 KV "
                                          r"blocks of 128 tokens of variant `legacy` hold, so nothing would be preempted"):
        make_plan(parse_config(roomy), "cfg.yaml", "scenarios", output=str(tmp_path))


def test_the_glm5_scenarios_profile_plans_with_sizes_for_the_real_model(tmp_path):
    from evalpipe.config.loading import load_config

    path = ROOT / "configs" / "ascend" / "glm5-dsa-a3-scenarios.yaml"
    p = make_plan(load_config(path), str(path), "scenarios", output=str(tmp_path), strict=False)
    assert [t.spec.task for t in p.tasks] == ["scenario_prefix_cache", "scenario_chunked_prefill", "scenario_near_limit",
                                              "scenario_preemption", "gsm8k_4shot"]
    spec = p.config.scenarios.resolved(p.config.engine)
    assert spec.lengths("scenario_prefix_cache") == [(32768, ["shared-prefix"])]
    assert min(n for n, _ in spec.lengths("scenario_chunked_prefill")) == 8193  # the nightly's 8192-token chunk, cut
    assert spec.lengths("scenario_near_limit")[-1][0] == 135000 - 16
    assert set(p.variant("sp").expect.tasks) == {"scenario_prefix_cache", "scenario_chunked_prefill", "scenario_near_limit",
                                                 "scenario_preemption", "gsm8k_4shot"}
    assert p.variant("sp").expect.tasks["scenario_near_limit"].prompt_tokens.min == 2 * 135000 - 33  # both prompts, whole
    assert set(p.variant("sp").expect.tasks["scenario_chunked_prefill"].steps_by_tokens) == {"16384"}


def test_the_speculative_scenario_needs_an_engine_that_drafts(tmp_path):
    cfg = {**SCENARIO_CONFIG, "tasks": {"speculative": [{"task": "scenario_speculative"}]}}
    with pytest.raises(ConfigError, match=r"`scenario_speculative` drives speculative decoding, which variant `legacy`'s engine "
                                          r"does not run \(no engine.speculative_config\)"):
        make_plan(parse_config(cfg), "cfg.yaml", "speculative", output=str(tmp_path))
    drafting = {**cfg, "engine": {**cfg["engine"], "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}}
    p = make_plan(parse_config(drafting), "cfg.yaml", "speculative", output=str(tmp_path))
    assert p.variant("sp").expect.tasks["scenario_speculative"].spec_decode_accepted_tokens.min == 1
