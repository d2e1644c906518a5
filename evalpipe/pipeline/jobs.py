"""The worker's job for one variant of a plan: job.json's document, built from the plan, the
model and (serve and endpoint mode) the server to reach."""

from __future__ import annotations

from pathlib import Path

from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.documents.run_doc import RunModel
from evalpipe.documents.worker_job import ServerJob, TeacherJob, WorkerJob
from evalpipe.paths import data_dir
from evalpipe.pipeline.plan import PlannedVariant, RunPlan


def server_job(variant: PlannedVariant, url: str | None, model_path: str) -> ServerJob | None:
    """What the worker's HTTP engine needs (the HTTP engine takes it as it is); None offline."""
    launch = variant.launch
    if launch.mode == "offline":
        return None
    args = variant.engine_args
    return ServerJob(
        tokenizer=str(args.get("tokenizer") or model_path),
        tokenizer_args={k: args.get(k) for k in ("tokenizer_mode", "trust_remote_code", "tokenizer_revision")},
        url=str(url if launch.mode == "serve" else launch.url),
        model=launch.served_model_name,
        api_key_env=launch.api_key_env,
        concurrency=launch.concurrency,
        request_timeout_s=launch.request_timeout_s,
        retries=launch.retries,
        ready_timeout_s=launch.ready_timeout_s,
    )


def worker_job(plan: RunPlan, variant_name: str, model: RunModel, variant_dir: Path, server_url: str | None = None) -> WorkerJob:
    variant = plan.variant(variant_name)
    engine_args = dict(variant.engine_args)
    engine_args["model"] = model.directory
    reference = plan.variants[0]
    teacher = TeacherJob(
        enabled=plan.config.capture.teacher_forcing,
        # The reference scores the sequences it has just generated; every later
        # variant reads them from the reference's directory.
        reference_dir=None if variant is reference else str(variant_dir.parent / reference.name),
        prompt_positions=plan.config.capture.prompt_positions.model_dump(),
        baseline_dir=None if plan.teacher_baseline_dir is None or variant.aa_of else str(plan.teacher_baseline_dir),
        wait_for_reference=plan.config.cluster.enabled and variant is not reference,
    )
    return WorkerJob(
        variant=variant_name,
        run_id=plan.run_id,
        output_dir=str(variant_dir),
        engine_kind="offline" if variant.launch.mode == "offline" else "http",
        journal=JOURNAL_FILE,  # a file of the variant directory
        launch_mode=variant.launch.mode,
        # every variant's manifest hides the keys any variant reads (they share one environment)
        secret_env=sorted({v.launch.api_key_env for v in plan.variants if v.launch.api_key_env}),
        server=server_job(variant, server_url, model.directory),
        engine_args=engine_args,
        tasks=[t.spec for t in plan.tasks],
        topk=plan.config.capture.topk,
        seed=plan.config.seed,
        data_dir=str(data_dir()),
        reverse_order=variant.reverse_order,
        longctx=plan.config.longctx.model_dump(mode="json"),
        scenarios=plan.config.scenarios.resolved(plan.config.engine),
        teacher=teacher,
    )
