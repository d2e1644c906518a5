"""What a plan can be checked for before any engine starts: task names, the data files a
config names, every variant's engine arguments against its own vLLM, every probed name in
its own interpreter. The first problem is one sentence (ConfigError)."""

from __future__ import annotations

from evalpipe.config.engine_args import EngineArgError, check_plan
from evalpipe.config.errors import ConfigError
from evalpipe.errors import UserError
from evalpipe.execution.serve import port_is_free
from evalpipe.paths import data_dir
from evalpipe.pipeline.plan import RunPlan
from evalpipe.probing.names import VariantNames, resolve_plan
from evalpipe.reporting import Reporter
from evalpipe.tasks.configure import task_config
from evalpipe.tasks.index import TaskNotFound, check_task_names


def check_user_data(plan: RunPlan) -> None:
    """The data files a config names (`data_files:` of a task entry), read here before any
    engine starts: a broken line or a missing column is one sentence, not lm-eval's
    words minutes later."""
    for t in plan.tasks:
        if not t.spec.data_files:
            continue
        try:
            task_config(t.spec, data_dir())
        except (UserError, FileNotFoundError) as err:
            raise ConfigError(str(err)) from None


def check_head_ports(plan: RunPlan) -> None:
    """A deployment whose head runs here and whose config fixes its ports: those ports are
    free now (a taken one would fail the head minutes into its start, in vLLM's words)."""
    for v in plan.variants:
        deployment = v.launch.deployment
        if deployment is None or v.server_of or (deployment.launchers and deployment.launchers[0]):
            continue
        for what, port in (("launch.port", v.launch.port), ("launch.deployment.rpc_port", deployment.rpc_port)):
            if port is not None and not port_is_free(v.launch.host, port):
                raise ConfigError(f"variant `{v.name}`: {what} {port} on {v.launch.host} is already in use here, where its "
                                  f"head node runs; stop what listens there, or choose another port (or none: a free one).")


def preflight(plan: RunPlan, reporter: Reporter) -> dict[str, VariantNames]:
    """What can be checked before anything starts (task names, every variant's engine
    arguments against its own vLLM, every probed name in its own interpreter); ConfigError
    on the first problem, else the probed names as each variant's interpreter knows them."""
    try:
        check_task_names([t.spec.task for t in plan.tasks])
    except TaskNotFound as err:
        raise ConfigError(str(err)) from None
    check_user_data(plan)
    check_head_ports(plan)
    say = lambda msg: reporter.info(f"[dim]{msg}[/]")  # noqa: E731
    try:
        check_plan(plan.variants, say=say)
    except EngineArgError as err:
        raise ConfigError(str(err)) from None
    return resolve_plan(plan.variants, say=say)
