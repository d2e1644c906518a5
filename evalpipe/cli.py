"""Command line: parse, dispatch, map errors to exit codes. No logic of its own.

Exit codes everywhere: 0 identical or equivalent (or ok), 1 divergent, 2 user error
(config, arguments, missing data), 3 a run or engine failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from evalpipe import __version__

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Prove that an engine change preserves model outputs: run variants, diff them, report a verdict.",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(no_args_is_help=True, help="Generated data sets (synthetic GSM8K-format set, ...).")
app.add_typer(data_app, name="data")

# Logs (CI, files) get a fixed, wide width so tables do not fold at 80 columns.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

EXIT_USER, EXIT_FAILED = 2, 3


def _fail(message: str, code: int) -> None:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def run(
    tasks: str = typer.Argument(..., help="Task group of the config (gsm8k, ...), `all`, or an lm-eval task name; comma-separated for several."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="Run config YAML (default: configs/default.yaml)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents of every task."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to run (default: all of the config)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Output root (default: the config's `output`, reports/runs)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory (default: time-task-confighash)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Stop a variant that runs longer than this many seconds."),
    noise_floor: Optional[bool] = typer.Option(
        None, "--noise-floor/--no-noise-floor",
        help="Run the reference a second time with another batch arrangement (A/A) to measure the engine's own noise (default: the config's `noise_floor`).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved plan, check task names and engine arguments, and exit without starting anything."),
) -> None:
    """Run TASKS on every variant, compare them with the reference, write the report."""
    from evalpipe.config import ConfigError, load_config
    from evalpipe.plan import make_plan

    try:
        cfg = load_config(config)
        plan = make_plan(
            cfg,
            str(config or "configs/default.yaml"),
            tasks,
            limit=limit,
            variants=variants,
            output=str(output) if output else None,
            run_id=run_id,
            noise_floor=noise_floor,
            strict=not dry_run,
        )
    except ConfigError as err:
        _fail(str(err), EXIT_USER)
        return
    from evalpipe.runner import execute, preflight

    if dry_run:
        from evalpipe.plan import verify_here

        _print_plan(plan)  # first: a profile for another machine still shows its commands
        _exit_with(lambda: (verify_here(plan), preflight(plan, console))[1])
        return

    _exit_with(lambda: execute(plan, console, timeout_s=timeout))


def _exit_with(job) -> None:
    """Run ``job`` (returns an exit code); a config problem or a failed run ends in one sentence."""
    from evalpipe.config import ConfigError
    from evalpipe.runner import RunFailed

    try:
        code = job()
    except ConfigError as err:
        _fail(str(err), EXIT_USER)
        return
    except RunFailed as err:
        _fail(str(err), err.exit_code)
        return
    raise typer.Exit(code)


def _print_plan(plan) -> None:
    from rich.table import Table

    console.print(f"[bold]run[/] {plan.run_id} -> {plan.run_dir}")
    console.print(f"[bold]model[/] {plan.model}")
    table = Table("variant", "python", "env", "engine args")
    for v in plan.variants:
        marker = " (reference)" if v.name == plan.reference else " (A/A, requests reversed)" if v.reverse_order else ""
        env = " ".join(f"{k}={val}" for k, val in sorted(v.env_overrides.items()))
        args = " ".join(f"{k}={val}" for k, val in sorted(v.engine_args.items()))
        table.add_row(v.name + marker, v.python, env, args)
    console.print(table)
    from evalpipe.serve import planned_commands

    model_path = plan.model
    if plan.builtin_model:
        from evalpipe.models.builtin import shipped_path

        model_path = str(shipped_path(plan.builtin_model))
    for v in plan.variants:
        console.print(f"[bold]{v.name}[/] ({v.launch.mode}) runs:")
        for line in planned_commands(v, model_path, plan.run_dir / v.name):
            console.print(f"  {line}", soft_wrap=True)
    tasks = Table("group", "task", "num_fewshot", "limit")
    for t in plan.tasks:
        tasks.add_row(t.group, t.spec.task, str(t.spec.num_fewshot), str(t.spec.limit))
    console.print(tasks)
    for note in plan.notes:
        console.print(f"note: {note}")


@app.command()
def compare(
    targets: list[Path] = typer.Argument(..., help="RUN_DIR, or RUN_A/VARIANT RUN_B/VARIANT to compare variants of two runs (B against A)."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Variant to compare against (default: the run's reference)."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to compare (default: all of the run)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Where to write compare.json, report.md/.html and junit.xml (default: the run directory; across runs: reports/compare/A-vs-B)."),
    gates: Optional[Path] = typer.Option(None, "--gates", help="YAML with the gates to apply (a run config's `gates:` or the mapping itself); default: the run's own."),
    margin: Optional[float] = typer.Option(None, "--margin", help="TOST equivalence margin for the scores, on the metric's scale (0.01 = 1 point)."),
) -> None:
    """Re-run the comparison and the report from stored artifacts (no engine)."""
    from evalpipe.config import ConfigError, load_gates
    from evalpipe.plan import split_csv
    from evalpipe.runner import compare_and_report, compare_two_runs

    try:
        chosen_gates = load_gates(gates, margin, base=_run_gates(targets[0]) if targets else None)
    except ConfigError as err:
        _fail(str(err), EXIT_USER)
        return
    try:
        if len(targets) == 1:
            run_dir = targets[0]
            if not (run_dir / "run.json").is_file():
                _fail(f"{run_dir} is not a run directory (no run.json); pass reports/runs/<run_id>.", EXIT_USER)
            chosen = split_csv(variants) or None
            code = compare_and_report(run_dir, console, reference=reference, variants=chosen, output=output, gates=chosen_gates)
        elif len(targets) == 2:
            if reference or variants:
                _fail("--reference and --variants apply to one run directory; across runs the first argument is the reference.", EXIT_USER)
            for t in targets:
                if not (t / "manifest.json").is_file():
                    _fail(f"{t} is not a variant directory (no manifest.json); pass reports/runs/<run_id>/<variant>.", EXIT_USER)
            code = compare_two_runs(targets[0], targets[1], console, output=output, gates=chosen_gates)
        else:
            _fail("compare takes RUN_DIR, or exactly two variant directories RUN_A/VARIANT RUN_B/VARIANT.", EXIT_USER)
            return
    except ValueError as err:
        _fail(str(err), EXIT_USER)
        return
    raise typer.Exit(code)


@app.command()
def calibrate(
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="Layout-model config with the reference `legacy` (default: configs/default.yaml)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents per variant."),
    faults: Optional[str] = typer.Option(None, "--faults", help="Comma-separated zoo entries (default: all)."),
    table: Path = typer.Option(Path("docs/calibration.md"), "--table", help="Where to write the calibration table."),
    output: Optional[Path] = typer.Option(None, "--output", help="Output root of the run (default: the config's `output`)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory."),
    from_run: Optional[Path] = typer.Option(
        None, "--from-run", help="Judge a finished calibration run (same -c and --faults) again without starting engines."
    ),
) -> None:
    """Run every fault of the layout model's zoo against `legacy` and write the calibration table."""
    from evalpipe.calibrate import run_calibration
    from evalpipe.plan import split_csv

    names = split_csv(faults) or None
    _exit_with(lambda: run_calibration(config, limit, names, table, console, run_id=run_id, output=output, from_run=from_run))


def _run_gates(target: Path):
    """The gates a run was made with (so --margin alone changes only the margin)."""
    from evalpipe.rundirs import gates_from_info, read_run_info

    run_dir = target if (target / "run.json").is_file() else target.parent
    try:
        return gates_from_info(read_run_info(run_dir), str(run_dir / "run.json"))
    except ValueError:
        return None


@data_app.command("build")
def data_build(
    names: Optional[list[str]] = typer.Argument(None, help="Data sets to generate (default: all)."),
) -> None:
    """Generate evalpipe's own data sets into the data directory ($EVALPIPE_DATA_DIR)."""
    from evalpipe.data.registry import build_all
    from evalpipe.paths import data_dir

    try:
        for path in build_all(data_dir(), names or None):
            console.print(f"wrote {path}")
    except ValueError as err:
        _fail(str(err), EXIT_USER)


@app.command()
def doctor(
    tasks: str = typer.Argument("all", help="Task groups or tasks whose data to check (default: every group of the config)."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="Run config YAML (default: configs/default.yaml)."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to check (default: all of the config)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Output root whose free disk is checked (default: the config's `output`)."),
) -> None:
    """Check, without starting any engine, what a run needs: interpreters, vLLM (and the
    NPU stack), devices, model files, task data, ports, endpoints, disk. Exit 0 when
    everything passes, 2 otherwise."""
    from evalpipe.config import ConfigError, load_config
    from evalpipe.doctor import run_checks
    from evalpipe.plan import make_plan

    try:
        plan = make_plan(load_config(config), str(config or "configs/default.yaml"), tasks, variants=variants,
                         output=str(output) if output else None, strict=False)
    except ConfigError as err:
        _fail(str(err), EXIT_USER)
        return

    def say(check) -> None:
        mark = "[green]PASS[/]" if check.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {check.scope:<12} {check.name:<24} {check.detail}", soft_wrap=True)

    checks = run_checks(plan, say)
    failed = [c for c in checks if not c.ok]
    console.print(f"{len(checks) - len(failed)}/{len(checks)} checks passed" + (f"; {len(failed)} failed" if failed else ""))
    raise typer.Exit(EXIT_USER if failed else 0)


@app.command()
def version() -> None:
    """Print evalpipe's version."""
    console.print(__version__)


_terminated: list[int] = []


def _terminate_as_interrupt(signum: int, _frame) -> None:
    """SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C, so every worker and server
    this process started is stopped on the way out instead of being orphaned. (Noted
    aside: libraries on the way may re-raise a KeyboardInterrupt of their own.)"""
    from evalpipe.launch import interrupts

    _terminated.append(signum)
    interrupts.append(signum)
    raise KeyboardInterrupt


def _interrupt(signum: int, _frame) -> None:
    """Ctrl-C: Python's own behaviour (KeyboardInterrupt), remembered so that the run
    loops stop even when the exception is raised where Python swallows it."""
    from evalpipe.launch import interrupts

    interrupts.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    import signal

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        app()
    except SystemExit:
        if _terminated:  # click turned the interrupt into its own exit (130)
            err_console.print("terminated; the workers and servers of this run were stopped")
            sys.exit(143)
        raise
    except KeyboardInterrupt:
        if _terminated:
            err_console.print("terminated; the workers and servers of this run were stopped")
            sys.exit(143)
        err_console.print("interrupted; the workers and servers of this run were stopped")
        sys.exit(130)


if __name__ == "__main__":
    main()
