"""`evalpipe run`: a plan from the config and the arguments, then either the run itself or,
with --dry-run, the plan, the commands each variant will run and every check that can be
made before anything starts."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from evalpipe.cluster.session import describe_resources
from evalpipe.commands.localize import localize_after_run
from evalpipe.commands.sampling_plan import plan_lines
from evalpipe.commands.scenario_plan import path_lines
from evalpipe.config.cluster import ClusterSettings, address_problem
from evalpipe.config.loading import load_config
from evalpipe.config.option_bounds import check_option
from evalpipe.config.ray_engine import ray_placed_engine
from evalpipe.config.run_config import LaunchFields, RunConfig
from evalpipe.config.sampling import Sampling
from evalpipe.documents.comparison import read_comparison
from evalpipe.documents.pass_fail import pass_fail_result, write_pass_fail
from evalpipe.errors import ExitCode, UserError
from evalpipe.execution.deployment import planned_node_lines
from evalpipe.execution.serve import planned_commands
from evalpipe.install import config_label
from evalpipe.models.builtin import shipped_path
from evalpipe.pipeline.on_cluster import demand_of, nodes_of, units_of
from evalpipe.pipeline.plan import RunPlan, make_plan, verify_here
from evalpipe.pipeline.preflight import preflight
from evalpipe.pipeline.runner import execute
from evalpipe.probing.names import checks_lines
from evalpipe.redact import api_key_names, redact, redact_env
from evalpipe.reporting import Reporter
from evalpipe.rundir.artifacts import COMPARE_JSON, RUN_JSON
from evalpipe.validation import first_problem


def run_command(tasks: str, reporter: Reporter, *, config: Path | None = None, limit: int | None = None, variants: str | None = None,
                output: Path | None = None, run_id: str | None = None, timeout: float | None = None,
                stall_timeout: float | None = None, noise_floor: bool | None = None, dry_run: bool = False,
                resume: Path | None = None, cluster: str | None = None, concurrency: int | None = None,
                distinct_nodes: bool | None = None, results_json: Path | None = None) -> int:
    """The run's exit code (the verdict's, or a failure's); bad arguments are one sentence.
    ``cluster``: --cluster, over the config's cluster.address (`off`: run here); ``concurrency``
    and ``distinct_nodes``: over the config's cluster settings."""
    if resume is not None:
        _check_resume(resume, run_id, output)
        output, run_id = resume.parent, resume.name
    plan = make_plan(
        with_cluster(load_config(config), cluster, concurrency=concurrency, distinct_nodes=distinct_nodes),
        config_label(config),
        tasks,
        limit=limit,
        variants=variants,
        output=str(output) if output else None,
        run_id=run_id,
        noise_floor=noise_floor,
        strict=not dry_run,
    )
    check_time_limits(timeout, stall_timeout)
    if not dry_run:
        code = execute(plan, reporter, timeout_s=timeout, stall_timeout_s=stall_timeout).exit_code
        write_results_json(results_json, plan.run_dir / COMPARE_JSON, code, reporter)
        if code == ExitCode.DIVERGENT and plan.config.localize.when == "auto":
            localize_after_run(plan.run_dir, reporter)
        return code
    _print_plan(plan, reporter)  # first: a profile for another machine still shows its commands and checks
    _print_path_checks(plan, reporter)
    verify_here(plan)
    names = preflight(plan, reporter)  # every probed name looked up in its variant's interpreter
    absent = {v: [n for n, e in found.names.items() if not e.found] for v, found in names.items()}
    for variant, missing in absent.items():
        if missing:
            reporter.note(f"note: {variant}'s interpreter lacks {', '.join(missing)} (other variants' names: "
                          "counted as never called there)", plain=True)
    reporter.info("every probed name exists where its variant runs")
    return ExitCode.OK


def write_results_json(path: Path | None, compare_json: Path, code: int, reporter: Reporter) -> None:
    """--results-json: the verdict in the shape other bisect tools read (documents.pass_fail);
    a run that compared nothing writes none (its exit code says so)."""
    if path is None or not compare_json.is_file():
        return
    write_pass_fail(path, pass_fail_result(read_comparison(compare_json), code))
    reporter.info(f"results: {escape(str(path))}")


def with_cluster(config: RunConfig, cluster: str | None, *, concurrency: int | None = None,
                 distinct_nodes: bool | None = None) -> RunConfig:
    """The config with --cluster, --concurrency and --distinct-nodes applied (None: not given)."""
    if cluster is not None:
        problem = None if cluster == "off" else address_problem(cluster)
        if problem is not None:
            raise UserError(f"--cluster {cluster!r} {problem}; `--cluster off` runs here.")
        config = config.on_cluster(None if cluster == "off" else cluster)
    if concurrency is None and distinct_nodes is None:
        return config
    if not config.cluster.enabled:
        given = "--concurrency" if concurrency is not None else "--distinct-nodes"
        raise UserError(f"{given} applies to a run on a Ray cluster, and this one runs here; give --cluster ADDRESS "
                        "(or `cluster.address` in the config), or leave it out.")
    if concurrency is not None and concurrency < 1:
        raise UserError(f"--concurrency {concurrency} is out of range: give 1 or more variants at once.")
    settings = config.cluster.model_dump()
    # an option that would silently drop a config setting it cannot coexist with is refused, naming both
    if concurrency is not None and distinct_nodes is None and config.cluster.distinct_nodes:
        raise UserError(f"--concurrency {concurrency} cannot limit a run whose config places every variant at once "
                        "(`cluster.distinct_nodes: true`); add --any-nodes to lift that setting, or leave "
                        "--concurrency out.")
    if distinct_nodes and concurrency is None and config.cluster.concurrency is not None:
        raise UserError(f"--distinct-nodes places every variant at once, and the config limits them to "
                        f"`cluster.concurrency: {config.cluster.concurrency}`; drop one of the two (remove the setting, "
                        "or leave --distinct-nodes out).")
    if concurrency is not None:
        settings["concurrency"] = concurrency
    if distinct_nodes is not None:
        settings["distinct_nodes"] = distinct_nodes
    try:
        checked = ClusterSettings.model_validate(settings)
    except ValidationError as err:
        raise UserError(f"--concurrency and --distinct-nodes: {first_problem(err)[1]}") from None
    return config.model_copy(update={"cluster": checked})


def check_time_limits(timeout: float | None, stall_timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:  # no config key sets it
        raise UserError(f"--timeout {timeout:g} is out of range: give a positive number of seconds.")
    check_option("--stall-timeout", stall_timeout, LaunchFields, "stall_timeout_s", "launch.stall_timeout_s")


def _check_resume(run_dir: Path, run_id: str | None, output: Path | None) -> None:
    if not (run_dir / RUN_JSON).is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no run.json there); give the directory of the interrupted run.")
    if run_id is not None and run_id != run_dir.name:
        raise UserError(f"--resume {run_dir} and --run-id {run_id} name different runs; give one of them.")
    if output is not None and output.resolve() != run_dir.parent.resolve():
        raise UserError(f"--resume {run_dir} lies outside --output {output}; give one of them.")


def _print_plan(plan: RunPlan, reporter: Reporter) -> None:
    # every value here comes from the user's config (an env value `[/]` is text, not markup)
    reporter.record(f"[bold]run[/] {escape(plan.run_id)} -> {escape(str(plan.run_dir))}", run_id=plan.run_id,
                    run_dir=plan.run_dir)
    reporter.record(f"[bold]model[/] {escape(plan.model)}", model=plan.model)
    keys = api_key_names(v.launch for v in plan.variants)
    table = Table("variant", "python", "env", "engine args")
    variants = []
    for v in plan.variants:
        marker = " (reference)" if v.name == plan.reference else " (A/A, requests reversed)" if v.reverse_order else ""
        # CI logs keep what a dry run prints: credentials redacted as in run.json
        env = redact_env(v.env_overrides, keys)
        args = redact(v.engine_args)
        table.add_row(*(Text(cell) for cell in (v.name + marker, v.python, " ".join(f"{k}={val}" for k, val in env.items()),
                                                 " ".join(f"{k}={val}" for k, val in sorted(args.items())))))
        variants.append({"variant": v.name, "reference": v.name == plan.reference, "aa": v.reverse_order,
                         "python": v.python, "env": env, "engine_args": args})
    reporter.table(table, variants)
    model_path = plan.model
    if plan.builtin_model:
        model_path = str(shipped_path(plan.builtin_model))
    for v in plan.variants:
        if v.launch.deployment is not None and not v.server_of:
            lines = planned_node_lines(v, model_path, plan.run_dir / v.name, placed_by_ray=plan.config.cluster.enabled)
        else:
            lines = planned_commands(v, model_path, plan.run_dir / v.name)
        reporter.record(f"[bold]{escape(v.name)}[/] ({v.launch.mode}) runs:" + "".join(f"\n  {escape(line)}" for line in lines),
                        variant=v.name, mode=v.launch.mode, commands=lines)
    tasks = Table("group", "task", "num_fewshot", "limit", "decoding", "requests")
    rows = []
    for t in plan.tasks:
        decoding = describe_sampling(t.spec.sampling)
        schedule = t.spec.sends.replace("_", " ")
        tasks.add_row(*(Text(cell) for cell in (t.group, t.spec.task, str(t.spec.num_fewshot), str(t.spec.limit), decoding,
                                                schedule)))
        rows.append({"group": t.group, "task": t.spec.task, "num_fewshot": t.spec.num_fewshot, "limit": t.spec.limit,
                     "decoding": decoding, "schedule": t.spec.sends})
    reporter.table(tasks, rows)
    sized = [line for t in plan.tasks for line in plan_lines(t.spec)]
    if sized:
        reporter.record("[bold]sampled tasks[/] (common random numbers; what the samples can see, and what a smaller "
                        "effect needs):" + "".join(f"\n  {escape(line)}" for line in sized), sampled_plan=sized)
    scenarios = plan.config.scenarios.resolved(plan.config.engine)
    paths = [line for t in plan.tasks for line in path_lines(t.spec, scenarios)]
    if paths:
        reporter.record("[bold]engine-path tasks[/] (what their requests can see, and what a smaller share needs):"
                        + "".join(f"\n  {escape(line)}" for line in paths), path_plan=paths)
    for note in plan.notes:
        reporter.note(f"note: {note}", plain=True)
    _print_cluster_plan(plan, reporter)


def describe_sampling(sampling: Sampling | None) -> str:
    """How a task decodes, in the plan's words: "greedy", or the sampler, samples per item and base seed."""
    if sampling is None:
        return "greedy"
    return f"sampled: {sampling.describe()}; {sampling.samples} per item, seeds from {sampling.seed}"


def _print_cluster_plan(plan: RunPlan, reporter: Reporter) -> None:
    cluster = plan.config.cluster
    if not cluster.enabled:
        return
    units = units_of(plan, kept=[])
    how = ("all at once, each on a node of its own" if cluster.distinct_nodes
           else f"up to {cluster.concurrency or len(units)} at once")
    where = ("the shared run directory" if cluster.shared_filesystem
             else f"scratch {cluster.scratch} on each node, brought back through Ray")
    reporter.record(f"cluster {cluster.address}: {len(units)} unit(s) {how}, writing to {where}", plain=True,
                    cluster=cluster.address, units=len(units))
    for unit in units:
        nodes = nodes_of(unit)
        asks = describe_resources(demand_of(plan, unit))
        asks = f"{nodes} distinct nodes (its deployment's), each with {asks}" if nodes > 1 else asks
        engine = ray_placed_engine(unit[0].engine_args)
        reporter.record(f"  {' + '.join(v.name for v in unit)} asks for {asks}"
                        + (f"\n    and {engine.describe()}" if engine is not None else ""), plain=True,
                        unit=[v.name for v in unit], asks=asks, nodes=nodes)


def _print_path_checks(plan: RunPlan, reporter: Reporter) -> None:
    reporter.record("[bold]what the path probes will check[/] (a failed check makes the comparison INCONCLUSIVE):")
    for v in plan.variants:
        lines = checks_lines(v)
        reporter.record(f"  [bold]{escape(v.name)}[/]" + "".join(f"\n    {escape(line)}" for line in lines),
                        variant=v.name, checks=lines)
