"""One variant's processes: its worker and, in serve mode, the server around it (started,
or the running one an A/A run reuses). `evalpipe run` runs every variant of a plan through
here, `evalpipe localize` the configurations it captures."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalpipe.documents.manifest import read_manifest
from evalpipe.documents.run_doc import RunModel
from evalpipe.documents.worker_events import StageEvent
from evalpipe.documents.worker_job import WorkerJob
from evalpipe.execution import serve
from evalpipe.execution.deployment import DeploymentProcess, NodePlaces, deployment_of
from evalpipe.execution.launch import Starter, VariantOutcome, run_worker
from evalpipe.pipeline.bookkeeping import close_manifest
from evalpipe.pipeline.jobs import worker_job
from evalpipe.pipeline.plan import PlannedVariant, RunPlan
from evalpipe.probing import records as probe_records
from evalpipe.probing.names import VariantNames
from evalpipe.probing.records import probe_env, write_spec
from evalpipe.rundir import artifacts


@dataclass(frozen=True)
class Limits:
    """The CLI's time limits of one variant: overall (--timeout) and without progress
    (--stall-timeout; None: the variant's launch.stall_timeout_s)."""

    timeout_s: float | None = None
    stall_timeout_s: float | None = None

    def stall_of(self, variant: PlannedVariant) -> float | None:
        return self.stall_timeout_s if self.stall_timeout_s is not None else variant.launch.stall_timeout_s


def run_variant(plan: RunPlan, variant: PlannedVariant, model: RunModel, vdir: Path, on_event, limits: Limits,
                servers: dict[str, Any], *, spec: Path, job: WorkerJob | None = None,
                places: NodePlaces | None = None, starter: Starter | None = None) -> VariantOutcome:
    """One variant's worker, and in serve mode its server around it: started first (the
    worker resolves its tasks while the engine loads) or, for an A/A run that reuses
    the reference's, the running one. A server that dies stops the worker and fails the
    variant with its log's tail. ``servers``: the started ones, by variant; the caller
    stops them (`stop_unneeded`). ``spec``: the probe spec every process of the variant reads
    (:func:`evalpipe.probing.records.write_spec`); ``job``: the worker's job when it is not
    the plan's (localize), its server URL filled in here. ``places``: where a deployment's nodes
    run when Ray placed them (None: through their launchers, here). ``starter``: how the worker
    starts (pre-imported interpreters, evalpipe/execution/preimport.py; None: a new interpreter)."""
    # every process the variant starts (worker, server, engine cores, workers) records what it ran
    env = probe_env(variant.process_env(), spec)

    def job_for(url: str | None) -> WorkerJob:
        planned = worker_job(plan, variant.name, model, vdir, url)
        return planned if job is None else job.model_copy(update={"server": planned.server})

    if variant.launch.mode != "serve":
        return run_worker(variant, job_for(None), vdir, on_event, limits.timeout_s,
                          stall_timeout_s=limits.stall_of(variant), env=env, starter=starter)

    vdir.mkdir(parents=True, exist_ok=True)
    vd = artifacts.VariantDir(vdir)
    launch = variant.launch
    server: serve.ServerProcess | DeploymentProcess
    if variant.server_of:
        server = servers[variant.server_of]
        on_event(StageEvent(stage="server", message=f"reusing {variant.server_of}'s server at {server.url}"))
    else:
        port = launch.port or serve.free_port(launch.host)
        if launch.deployment is not None:
            server = deployment_of(variant.python, launch, {**variant.engine_args, "model": model.directory}, port, vdir, env,
                                   places)
        else:
            args_file = vdir / serve.SERVER_ARGS_FILE
            serve.write_server_args(args_file, serve.server_args({**variant.engine_args, "model": model.directory}, launch, port))
            server = serve.ServerProcess(
                command=serve.server_command(variant.python, launch, args_file),
                url=serve.url_of(launch, port), log_path=vd.engine_log, grace_s=launch.stop_grace_s, starter=starter,
            )
        server_env = dict(env)
        if launch.api_key_env and server_env.get(launch.api_key_env):
            server_env["VLLM_API_KEY"] = server_env[launch.api_key_env]
        try:
            server.start(server_env)
        except OSError as err:  # the launcher or server command itself is missing

            fix = "launch.deployment's launchers and headless_command" if launch.deployment else "launch.command / launch.launcher"
            return VariantOutcome(variant.name, 3, 0.0, f"variant `{variant.name}`: could not start its server "
                                  f"`{' '.join(server.command)}`: {err}; fix {fix}")
        servers[variant.name] = server
        on_event(StageEvent(stage="server", message=f"server starting at {server.url} (log: {vd.engine_log})"))
    try:
        outcome = run_worker(
            variant, job_for(server.url), vdir, on_event, limits.timeout_s,
            log_path=vd.worker_log, stopped=lambda: server.death_message() if server.died else None, on_start=server.use,
            stall_timeout_s=limits.stall_of(variant), stall_log=server.log_path, env=env, starter=starter,
        )
    finally:
        server.client = None
    if outcome.stalled:  # the hang is the server's: no later variant may use it
        for name in [n for n, s in servers.items() if s is server]:
            servers.pop(name).stop()
    return outcome


def stop_unneeded(servers: dict[str, Any], later: list[PlannedVariant]) -> None:
    """Stop every started server no later variant runs against."""
    needed = {v.server_of for v in later if v.server_of}
    for name in [n for n in servers if n not in needed]:
        servers.pop(name).stop()


def run_and_close(plan: RunPlan, variant: PlannedVariant, model: RunModel, vdir: Path, on_event, limits: Limits,
                  servers: dict[str, Any], names: VariantNames, places: NodePlaces | None = None,
                  starter: Starter | None = None) -> VariantOutcome:
    """One variant from start to its closed directory: its processes run, its manifest says
    how they ended, its processes' probe records gathered into probes.json. The same steps
    here (a local run) and on a cluster node (:mod:`evalpipe.pipeline.node_actor`)."""
    outcome = run_variant(plan, variant, model, vdir, on_event, limits, servers,
                          spec=write_spec(vdir, variant.name, names), places=places, starter=starter)
    close_manifest(vdir, outcome)
    gather_probes(variant, vdir, names, servers)
    return outcome


def gather_probes(variant: PlannedVariant, vdir: Path, names: VariantNames, servers: dict[str, Any]) -> None:
    """probes.json: the variant's processes' records, once they are done writing (an A/A run
    that reused a server reads that server's records; a server still needed is live)."""
    exposed = None
    if variant.launch.mode == "endpoint":
        path = artifacts.VariantDir(vdir).manifest
        engine = read_manifest(path).engine if path.is_file() else None
        exposed = engine.model_dump(mode="json") if engine is not None else {}
    server = variant.server_of or variant.name
    live = server in servers
    if live and variant.launch.deployment is not None:  # records of other nodes: flushed there, then fetched
        time.sleep(2 * probe_records.FLUSH_S)
        servers[server].bring_back()
        live = False
    probe_records.gather(
        vdir, variant.name, variant.launch.mode, names,
        source=probe_records.records_dir(vdir.parent / variant.server_of) if variant.server_of else None,
        server_of=variant.server_of, live=live, exposed=exposed,
        deployment_nodes=variant.launch.deployment.nodes if variant.launch.deployment is not None else None,
    )
