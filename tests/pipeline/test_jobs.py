"""evalpipe/pipeline/jobs.py: the worker's job.json built from a plan -- the resolved model in
the engine arguments, the reference generating and every later variant teacher-forcing
its sequences from the reference's directory, no server offline, the server's own URL
in serve mode and the configured one in endpoint mode, with its tokenizer and its key's
variable named (never the key)."""

from __future__ import annotations

from plans import fake_plan

from evalpipe.documents.run_doc import RunModel
from evalpipe.pipeline.jobs import server_job, worker_job

MODEL = RunModel(path="/models/tiny")


def test_an_offline_variant_gets_the_model_and_the_reference_s_sequences(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {"engine": {"max_num_seqs": 1}}}, "r1")
    ref = worker_job(plan, "a", MODEL, plan.run_dir / "a")
    job = worker_job(plan, "b", MODEL, plan.run_dir / "b")
    assert (job.variant, job.run_id, job.output_dir) == ("b", "r1", str(plan.run_dir / "b"))
    assert job.engine_kind == "offline" and job.launch_mode == "offline" and job.server is None
    assert job.engine_args["model"] == "/models/tiny" and job.engine_args["max_num_seqs"] == 1
    assert ref.engine_args.get("max_num_seqs") != 1, "each variant its own engine arguments"
    assert [t.task for t in job.tasks] == ["gsm8k_synth_4shot"] and job.seed == plan.config.seed
    assert ref.teacher.reference_dir is None, "the reference scores its own sequences"
    assert job.teacher.reference_dir == str(plan.run_dir / "a")
    assert job.teacher.wait_for_reference is False and job.teacher.baseline_dir is None
    assert job.secret_env == []


def test_a_nightly_baseline_is_teacher_forced_by_every_variant_but_an_aa_run(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {}}, "night", noise_floor=True)
    plan.teacher_baseline_dir = tmp_path / "baseline" / "a"
    aa = next(v.name for v in plan.variants if v.aa_of)
    assert worker_job(plan, "b", MODEL, plan.run_dir / "b").teacher.baseline_dir == str(tmp_path / "baseline" / "a")
    assert worker_job(plan, aa, MODEL, plan.run_dir / aa).teacher.baseline_dir is None


def test_an_endpoint_variant_reaches_the_configured_server_and_names_its_key_variable(tmp_path):
    endpoint = {"mode": "endpoint", "url": "http://head:8000", "api_key_env": "EP_KEY", "served_model_name": "m",
                "concurrency": 3}
    plan = fake_plan(tmp_path, {"a": {}, "b": {"launch": endpoint, "engine": {"tokenizer": "/tok"}}}, "ep")
    job = worker_job(plan, "b", MODEL, plan.run_dir / "b", server_url="http://ignored:1")
    assert job.engine_kind == "http" and job.launch_mode == "endpoint"
    server = job.server
    assert (server.url, server.model, server.concurrency, server.api_key_env) == ("http://head:8000", "m", 3, "EP_KEY")
    assert server.tokenizer == "/tok"
    assert job.secret_env == ["EP_KEY"]
    assert worker_job(plan, "a", MODEL, plan.run_dir / "a").secret_env == ["EP_KEY"], "every variant hides every key"


def test_a_served_variant_reaches_the_server_started_for_it(tmp_path):
    plan = fake_plan(tmp_path, {"a": {"launch": {"mode": "serve"}}}, "serve")
    variant = plan.variant("a")
    server = server_job(variant, "http://127.0.0.1:4321", "/models/tiny")
    assert server.url == "http://127.0.0.1:4321"
    assert server.tokenizer == "/models/tiny", "without a tokenizer of its own, the model's"
    assert server_job(fake_plan(tmp_path, {"a": {}}, "off").variant("a"), "http://x:1", "/m") is None
