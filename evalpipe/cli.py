"""Command line: parse, dispatch, map errors to exit codes. No logic of its own.

Exit codes (evalpipe.errors.ExitCode): 0 identical or equivalent (or ok), 1 divergent,
2 user error (config, arguments, missing data), 3 a run or engine failed, or a bug,
4 inconclusive. Errors become exit codes in one place, :class:`_OneErrorModel`.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import rich.markup
import typer
from rich.console import Console
from typer.core import TyperGroup
from typer.exceptions import TyperException

from evalpipe import __version__
from evalpipe.errors import EvalpipeError, ExitCode, UserError, for_git_bisect
from evalpipe.reporting import REPORTERS, JsonLinesReporter, Reporter

# Logs (CI, files) get a fixed, wide width so tables do not fold at 80 columns.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
# Where the pipeline's progress goes: chosen by --progress (evalpipe.reporting.REPORTERS), before any command runs.
reporter: Reporter = REPORTERS["terminal"](console)


class _OneErrorModel(TyperGroup):
    """Where errors become exit codes, for every command: a user error (what to fix) is
    its sentence and 2, a failed run its sentence and 3; anything else is a bug in
    evalpipe, shown with its traceback, and 3 -- never 2, which would send the user
    looking for a mistake of theirs."""

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        """``--progress jsonl`` is a contract for every command, its usage errors and help
        included: stdout carries only the events, one JSON object a line, and the last is
        the command's one verdict. Everything else a command prints goes to stderr."""
        global reporter
        argv = list(sys.argv[1:] if args is None else args)
        if _progress_asked(argv) != "jsonl":
            return super().main(argv, *rest, **kwargs)
        events = sys.stdout
        reporter = JsonLinesReporter(console, stream=events)
        sys.stdout = sys.stderr  # the tables, help and usage of every command: stderr
        try:
            return super().main(argv, *rest, **kwargs)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else ExitCode.USER_ERROR)
            if not reporter.ended:
                status = ExitCode(code).name if code in ExitCode._value2member_map_ else f"EXIT_{code}"
                reporter.verdict(status, code)
            raise
        finally:
            sys.stdout = events

    # ctx: click's Context (the group's context_class), not typer's; newer typer vendors click under a private
    # module and older typer uses click itself, so no one import names it for every supported typer
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # the command line's own: usage errors, exits
            raise
        except EvalpipeError as err:  # its class says whose it is: the user's (2) or the run's (3)
            _fail(str(err), err.exit_code)
        except Exception as err:  # noqa: BLE001 - the one place a bug is reported
            traceback.print_exc()
            _fail(f"evalpipe hit a bug ({type(err).__name__}: {err}); the traceback is above. Please report it with the "
                  "command you ran.", ExitCode.FAILED)


app = typer.Typer(
    cls=_OneErrorModel,
    add_completion=False,
    no_args_is_help=True,
    help="Prove that an engine change preserves model outputs: run variants, diff them, report a verdict.",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(no_args_is_help=True, help="Generated data sets (synthetic GSM8K-format set, ...).")
app.add_typer(data_app, name="data")
history_app = typer.Typer(no_args_is_help=True, help="The history database of runs and nights: list, show, export, import, simulate.")
app.add_typer(history_app, name="history")
baseline_app = typer.Typer(no_args_is_help=True, help="The baseline night tonight is compared with (default: the last passing night).")
app.add_typer(baseline_app, name="baseline")


@app.callback()
def _options(
    progress: str = typer.Option(
        "terminal", "--progress", metavar="|".join(REPORTERS),
        help="How progress is shown: terminal (lines and bars), quiet (failures and the verdict only), "
             "jsonl (one JSON object per event on stdout, for CI; the tables go to stderr).",
    ),
) -> None:
    """Prove that an engine change preserves model outputs: run variants, diff them, report a verdict."""
    global reporter
    if progress not in REPORTERS:
        raise UserError(f"--progress {progress!r} is not one of {', '.join(REPORTERS)}.")
    if progress != "jsonl":  # the JSON lines reporter is the command group's (_OneErrorModel.main)
        reporter = REPORTERS[progress](console)


def _progress_asked(argv: list[str]) -> str | None:
    """--progress as the command line gives it (before the command's own options; the
    option parser says what is wrong with it)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--progress" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--progress="):
            return arg.split("=", 1)[1]
        if not arg.startswith("-"):  # the command's name: what follows is its own
            break
    return None



_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's limits for one name and a whole path


def _path(option: str):
    """How every path on the command line is read: `~` expanded (as a shell would, also
    when the path is quoted or comes from a variable), an empty one refused -- Path("")
    is the current directory, so `--output "$UNSET"` would write there."""

    given = _given(option, "a path")

    def parse(value: Any) -> Path:
        if isinstance(value, Path):  # a default
            return value
        path = Path(given(value)).expanduser()
        # the OS refuses a longer name with ENAMETOOLONG wherever evalpipe first touches it
        if len(os.fsencode(path)) > _PATH_MAX or any(len(os.fsencode(part)) > _NAME_MAX for part in path.parts):
            raise UserError(f"{option} is longer than a path can be (a name above {_NAME_MAX} bytes, or above {_PATH_MAX} "
                            "in all); give a shorter path.")
        return path

    return parse


def _given(option: str, what: str = "a value"):
    """A text option given empty (`--history "$UNSET"`) is refused, not read as its default."""

    def parse(value: Any) -> str:
        text = str(value)
        if not text.strip():
            raise UserError(f"{option} is empty; give {what}, or leave {option} out for its default.")
        return text

    return parse


def _one_line(message: str) -> str:
    """The error sentence on one line with every character shown: a newline or control
    character in a value it quotes (a path from an environment variable) appears escaped,
    where a terminal would break the line or drop it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def _fail(message: str, code: int) -> None:
    err_console.print(f"[bold red]error:[/] {rich.markup.escape(_one_line(message))}", soft_wrap=True)
    # the reporter's last event (CI reading JSON lines learns the end too); the terminal's line is the one above
    reporter.verdict(ExitCode(code).name, code, markup="")
    raise typer.Exit(code)


_TIMEOUT_OPT = typer.Option(None, "--timeout", help="Stop a variant that runs longer than this many seconds.")
_CLUSTER_OPT = typer.Option(
    None, "--cluster", parser=_given("--cluster"),
    help="Run the variants at once on this Ray cluster (HOST:PORT of its head, ray://HOST:PORT or auto; `off`: here, "
         "one after another); default: the config's cluster.address.",
)
_STALL_OPT = typer.Option(
    None, "--stall-timeout",
    help="Stop a variant whose engine, once up, finishes no request for this many seconds (a hang); "
         "default: the config's launch.stall_timeout_s (1800).",
)


_RESULTS_OPT = typer.Option(
    None, "--results-json", parser=_path("--results-json"),
    help="Also write the verdict as a results file with a top-level `pass_fail` (pass, fail or inconclusive) and one "
         "entry per variant and task: the file vllm-ascend's tools/bisect reads (docs/bisect.md).")
_GIT_BISECT_OPT = typer.Option(
    False, "--git-bisect",
    help="Exit as `git bisect run` reads it: 0 for IDENTICAL or EQUIVALENT, 1 for DIVERGENT, 125 (skip) for a run that "
         "failed or proved nothing, 128 (stop the bisect) for a usage or config error (docs/bisect.md).")


@app.command()
def run(
    tasks: str = typer.Argument(..., help="Task group of the config (gsm8k, ...), `all`, or an lm-eval task name; comma-separated for several."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Run config YAML (default: the shipped configs/default.yaml)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents of every task."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to run (default: all of the config)."),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Output root (default: the config's `output`, reports/runs)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory (default: time-task-confighash)."),
    timeout: Optional[float] = _TIMEOUT_OPT,
    stall_timeout: Optional[float] = _STALL_OPT,
    noise_floor: Optional[bool] = typer.Option(
        None, "--noise-floor/--no-noise-floor",
        help="Run the reference a second time with another batch arrangement (A/A) to measure the engine's own noise (default: the config's `noise_floor`).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved plan, check task names and engine arguments, and exit without starting anything."),
    resume: Optional[Path] = typer.Option(
        None, "--resume",
        parser=_path("--resume"), help="Continue the interrupted run in this run directory (the same as giving its --run-id again): "
             "finished variants are kept after their artifacts are verified, the others run again.",
    ),
    cluster: Optional[str] = _CLUSTER_OPT,
    concurrency: Optional[int] = typer.Option(
        None, "--concurrency", help="On a cluster: variants running at once (default: the config's cluster.concurrency, else all)."),
    distinct_nodes: Optional[bool] = typer.Option(
        None, "--distinct-nodes/--any-nodes",
        help="On a cluster: every variant on a node of its own, all placed at once (default: the config's cluster.distinct_nodes)."),
    results_json: Optional[Path] = _RESULTS_OPT,
    git_bisect: bool = _GIT_BISECT_OPT,
) -> None:
    """Run TASKS on every variant, compare them with the reference, write the report."""
    from evalpipe.commands.run import run_command

    raise typer.Exit(run_command(tasks, reporter, config=config, limit=limit, variants=variants, output=output, run_id=run_id,
                                 timeout=timeout, stall_timeout=stall_timeout, noise_floor=noise_floor, dry_run=dry_run,
                                 resume=resume, cluster=cluster, concurrency=concurrency, distinct_nodes=distinct_nodes,
                                 results_json=results_json))


@app.command()
def compare(
    targets: list[Path] = typer.Argument(..., parser=_path("RUN_DIR"), help="RUN_DIR, or RUN_A/VARIANT RUN_B/VARIANT to compare variants of two runs (B against A)."),
    reference: Optional[str] = typer.Option(None, "--reference", parser=_given("--reference"), help="Variant to compare against (default: the run's reference)."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to compare (default: all of the run)."),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Where to write compare.json, report.md/.html and junit.xml (default: the run directory; across runs: reports/compare/A-vs-B)."),
    gates: Optional[Path] = typer.Option(None, "--gates", parser=_path("--gates"), help="YAML with the gates to apply (a run config's `gates:` or the mapping itself); default: the run's own."),
    margin: Optional[float] = typer.Option(None, "--margin", help="TOST equivalence margin for the scores, on the metric's scale (0.01 = 1 point)."),
    unverified: bool = typer.Option(
        False, "--unverified",
        help="Compare a variant whose manifest.json is missing (its files are then checked against nothing); "
             "the reports name it and the verdict is INCONCLUSIVE (exit 4). Without it such a variant is refused.",
    ),
    results_json: Optional[Path] = _RESULTS_OPT,
    git_bisect: bool = _GIT_BISECT_OPT,
) -> None:
    """Re-run the comparison and the report from stored artifacts (no engine)."""
    from evalpipe.commands.compare import compare_command

    raise typer.Exit(compare_command(targets, reporter, reference=reference, variants=variants, output=output, gates=gates, margin=margin,
                                     unverified=unverified, results_json=results_json))


@app.command()
def localize(
    run_dir: Path = typer.Argument(..., parser=_path("RUN_DIR"), help="The run directory of a DIVERGENT run (reports/runs/<run_id>)."),
    variant: Optional[str] = typer.Option(None, "--variant", help="Variant(s) to localize, comma-separated (default: the first DIVERGENT one)."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Sequences to re-run, the most divergent teacher-forced ones (default: the config's localize.samples, 4)."),
    positions: Optional[int] = typer.Option(None, "--positions", help="Worst teacher-forced positions kept per sequence, besides shard, block and last-token rows (default 8)."),
    decode_steps: Optional[int] = typer.Option(None, "--decode-steps", help="Prefill each prompt, then decode N tokens one forward pass each and compare those too (default: the config's localize.decode_steps, 0: prefill only)."),
    timeout: Optional[float] = _TIMEOUT_OPT,
) -> None:
    """Say where in the model a variant first parts from the reference: layer and module, against the A/A floor."""
    from evalpipe.commands.localize import localize_command

    raise typer.Exit(localize_command(run_dir, reporter, variant=variant, samples=samples, positions=positions,
                                      decode_steps=decode_steps, timeout=timeout))


@app.command()
def calibrate(
    config: Optional[Path] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Layout-model config with the reference `legacy` (default: the shipped configs/default.yaml)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents per variant."),
    faults: Optional[str] = typer.Option(None, "--faults", help="Comma-separated zoo entries (default: all)."),
    table: Optional[Path] = typer.Option(
        None, "--table", parser=_path("--table"),
        help="Where to write the calibration table (default: docs/calibration.md of the source checkout evalpipe runs from; "
             "installed from a wheel, calibration.md in the current directory).",
    ),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Output root of the run (default: the config's `output`)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory."),
    from_run: Optional[Path] = typer.Option(
        None, "--from-run", parser=_path("--from-run"), help="Judge a finished calibration run (same -c and --faults) again without starting engines."
    ),
    localize: bool = typer.Option(
        True, "--localize/--no-localize",
        help="Localize every entry (`evalpipe localize`; one engine start per entry) for the table's last column; "
             "with --from-run, the run's localize.json is read instead.",
    ),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", help="Run the zoo a second time with sampled decoding at this temperature (1e-05 to 10; common "
        "random numbers, docs/sampling.md); the table gets those verdicts beside the greedy ones."),
    samples: Optional[int] = typer.Option(None, "--samples", help="With --temperature: samples per item (1 to 1024; default 1)."),
    tasks: Optional[str] = typer.Option(
        None, "--tasks", help="The config's task group the zoo runs (default: its first); with several tasks the table "
                              "says which task caught which entry (e.g. `scenarios` of configs/scenarios.yaml)."),
) -> None:
    """Run every fault of the layout model's zoo against `legacy` and write the calibration table."""
    from evalpipe.commands.calibrate import run_calibration
    from evalpipe.pipeline.plan import split_csv

    names = split_csv(faults, "--faults") or None

    with _writing_into(from_run):
        code = run_calibration(config, limit, names, table, reporter, run_id=run_id, output=output, from_run=from_run,
                               localize=localize, temperature=temperature, samples=samples, task_group=tasks)
    raise typer.Exit(code)


@app.command()
def bisect(
    good: str = typer.Option(..., "--good", parser=_given("--good"), help="A commit of the config's bisect.repo whose build is good."),
    bad: str = typer.Option(..., "--bad", parser=_given("--bad"), help="A later commit whose build changed the outputs."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Run config YAML with a `bisect:` section (docs/bisect.md)."),
    tasks: str = typer.Option("gsm8k", "--tasks", help="Task group of the config each step runs (as `evalpipe run TASKS`)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents of every task at each step (bisect.escalate: the larger limits of an UNKNOWN step's reruns)."),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Where the bisect's runs, journal and report go (default: reports/bisect beside the config's `output`)."),
    timeout: Optional[float] = _TIMEOUT_OPT,
) -> None:
    """Find the first build between --good and --bad whose outputs differ from the good build's."""
    from evalpipe.commands.bisect import BisectRequest, bisect_command

    raise typer.Exit(bisect_command(BisectRequest(config, good, bad, tasks, limit, output, timeout), reporter))


def _writing_into(from_run: Optional[Path]):
    """--from-run rewrites files of a finished run (nightly.*, compare.json, the reports):
    like `evalpipe compare`, not while another process writes that run."""
    from contextlib import nullcontext

    from evalpipe.rundir.artifacts import RUN_JSON
    from evalpipe.rundir.lock import holding_run_dir

    if from_run is None or not (from_run / RUN_JSON).is_file():
        return nullcontext()  # no run there to protect (and no .lock to leave in a stray directory): the command says what is wrong
    return holding_run_dir(from_run, elsewhere=None)  # the run is given: waiting is the only way out


@data_app.command("build")
def data_build(
    names: Optional[list[str]] = typer.Argument(None, help="Data sets to generate (default: all)."),
) -> None:
    """Generate evalpipe's own data sets into the data directory ($EVALPIPE_DATA_DIR)."""
    from evalpipe.data.registry import build_all
    from evalpipe.paths import data_dir

    for path in build_all(data_dir(), names or None):
        reporter.record(f"wrote {path}", plain=True, path=path)


@app.command()
def doctor(
    tasks: str = typer.Argument("all", help="Task groups or tasks whose data to check (default: every group of the config)."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Run config YAML (default: the shipped configs/default.yaml)."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants to check (default: all of the config)."),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Output root whose free disk is checked (default: the config's `output`)."),
    cluster: Optional[str] = _CLUSTER_OPT,
) -> None:
    """Check, without starting any engine, what a run needs: interpreters, vLLM (and the
    NPU stack), devices, model files, task data, ports, endpoints, disk, and on a Ray
    cluster the cluster (reachable, versions, placement, what each node has). Exit 0 when
    everything passes, 2 otherwise."""
    from evalpipe.commands.doctor import run_checks
    from evalpipe.commands.run import with_cluster
    from evalpipe.config.loading import load_config
    from evalpipe.install import config_label
    from evalpipe.pipeline.plan import make_plan

    plan = make_plan(with_cluster(load_config(config), cluster), config_label(config), tasks, variants=variants,
                     output=str(output) if output else None, strict=False)

    def say(check) -> None:
        mark = "[green]PASS[/]" if check.ok else "[bold red]FAIL[/]"
        reporter.record(f"{mark} {rich.markup.escape(f'{check.scope:<12} {check.name:<24} {check.detail}')}", scope=check.scope,
                        check=check.name, ok=check.ok, detail=check.detail)

    checks = run_checks(plan, say)
    failed = [c for c in checks if not c.ok]
    reporter.info(f"{len(checks) - len(failed)}/{len(checks)} checks passed" + (f"; {len(failed)} failed" if failed else ""),
                  plain=True, passed=len(checks) - len(failed), failed=len(failed))
    raise typer.Exit(ExitCode.USER_ERROR if failed else ExitCode.OK)


@app.command()
def nightly(
    config: Optional[list[Path]] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Run config YAML with a `nightly:` section (default: the shipped configs/default.yaml); repeat for several configs' nights (at once when they run on a Ray cluster)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Evaluate only the first N documents of every task (default: the config's nightly.limit)."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants (default: the config's nightly.variants, else all)."),
    output: Optional[Path] = typer.Option(None, "--output", parser=_path("--output"), help="Output root of tonight's run (default: the config's `output`)."),
    history: Optional[str] = typer.Option(None, "--history", parser=_given("--history"), help="SQLAlchemy URL of the history (default: the config's nightly.history, else history.sqlite under the output root)."),
    dashboard: Optional[Path] = typer.Option(None, "--dashboard", parser=_path("--dashboard"), help="Where to write the dashboard (default: the config's nightly.dashboard, else reports/nightly/index.html)."),
    component: Optional[list[str]] = typer.Option(None, "--component", help="NAME=VERSION of a component tonight's build used (repeatable), e.g. vllm_ascend=<commit>; named in the bisect hint."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of tonight's run directory (default: nightly-<UTC time>)."),
    timeout: Optional[float] = _TIMEOUT_OPT,
    stall_timeout: Optional[float] = _STALL_OPT,
    from_run: Optional[Path] = typer.Option(None, "--from-run", parser=_path("--from-run"), help="Judge a finished run directory as tonight's night instead of running one."),
    cluster: Optional[str] = _CLUSTER_OPT,
) -> None:
    """Run tonight's matrix, record it, judge it against the variants, the baseline night and
    the history; write nightly.md / nightly-junit.xml and the dashboard. Exit 1 on a regression, 3 when
    tonight's run failed, 4 when it proves nothing about the code paths (INCONCLUSIVE)."""
    from evalpipe.commands.run import check_time_limits, with_cluster
    from evalpipe.config.loading import load_config
    from evalpipe.install import default_config as default_config_path
    from evalpipe.nightly.night import parse_components, print_night, run_night

    labels = parse_components(component)
    check_time_limits(timeout, stall_timeout)
    configs: list[Path] = config or []
    for one in configs or [default_config_path()]:
        with_cluster(load_config(one), cluster)  # every config and --cluster checked before any night starts
    if len(configs) > 1:
        from evalpipe.nightly.several import run_several

        if from_run is not None:
            raise UserError("--from-run judges one finished run: give one -c with it.")
        rest = [arg for name, value in (("--limit", limit), ("--variants", variants), ("--output", output),
                                        ("--history", history), ("--dashboard", dashboard), ("--timeout", timeout),
                                        ("--stall-timeout", stall_timeout)) if value is not None
                for arg in (name, str(value))]
        rest += [arg for c in component or [] for arg in ("--component", c)]
        raise typer.Exit(run_several(configs, rest, reporter, cluster=cluster, run_id=run_id))
    with _writing_into(from_run):
        result = run_night(configs[0] if configs else None, reporter, limit=limit, variants=variants, output=output,
                           history_url=history, dashboard=dashboard, labels=labels, run_id=run_id, timeout_s=timeout,
                           stall_timeout_s=stall_timeout, from_run=from_run, cluster=cluster)
    print_night(result, reporter)
    raise typer.Exit(result.exit_code)


_HISTORY_OPT = typer.Option(None, "--history", parser=_given("--history"), help="SQLAlchemy URL (default: the config's nightly.history, else history.sqlite under the output root).")
_CONFIG_OPT = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Config whose nightly.history / output to use (default: the shipped configs/default.yaml).")
_OUTPUT_OPT = typer.Option(None, "--output", parser=_path("--output"), help="Output root holding history.sqlite (default: the config's `output`).")


@history_app.command("list")
def history_list(
    kind: Optional[str] = typer.Option(None, "--kind", help="Only `run` or `nightly` entries."),
    last: int = typer.Option(30, "-n", "--last", min=1, help="Show the last N entries."),
    history: Optional[str] = _HISTORY_OPT, config: Optional[Path] = _CONFIG_OPT, output: Optional[Path] = _OUTPUT_OPT,
) -> None:
    """Recorded runs and nights, oldest first (reads the history, never creates it)."""
    from evalpipe.commands.history import check_kind, list_runs, open_history_for

    check_kind(kind)
    list_runs(open_history_for(history, config, output, access="read"), reporter, kind=kind, last=last)


@history_app.command("show")
def history_show(
    run_id: str = typer.Argument(..., help="A recorded run id (see `evalpipe history list`)."),
    history: Optional[str] = _HISTORY_OPT, config: Optional[Path] = _CONFIG_OPT, output: Optional[Path] = _OUTPUT_OPT,
) -> None:
    """One run: its variants, components, what ran, scores and, for a night, its judgement."""
    from evalpipe.commands.history import open_history_for, show_run

    show_run(open_history_for(history, config, output, access="read"), run_id, reporter)


@history_app.command("export")
def history_export(
    path: Path = typer.Option(..., "-o", "--out", parser=_path("--out"), help="File to write."),
    fmt: str = typer.Option("csv", "--format", help="csv or parquet."),
    history: Optional[str] = _HISTORY_OPT, config: Optional[Path] = _CONFIG_OPT, output: Optional[Path] = _OUTPUT_OPT,
) -> None:
    """One row per run x variant x task x metric (mean, SE, n, verdicts, components) for other tools."""
    from evalpipe.commands.history import open_history_for
    from evalpipe.history.store import check_export_format, export

    check_export_format(fmt)
    hist = open_history_for(history, config, output, access="read")
    try:
        n = export(hist, path, fmt)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}; choose a writable path for -o/--out.") from None
    reporter.record(f"wrote {n} rows to {path}", plain=True, rows=n, path=path)


@history_app.command("import")
def history_import(
    run_dirs: list[Path] = typer.Argument(..., parser=_path("RUN_DIR"), help="Run directories to (re)record; the database is rebuilt from them."),
    kind: Optional[str] = typer.Option(None, "--kind", help="Record them as `run` or `nightly` (default: what their run.json says)."),
    history: Optional[str] = _HISTORY_OPT, config: Optional[Path] = _CONFIG_OPT, output: Optional[Path] = _OUTPUT_OPT,
) -> None:
    """Record run directories in the history (again): the run directories are the source of truth.
    Every one is read and verified before the history is opened (or created)."""
    from evalpipe.commands.history import open_history_for, read_runs

    records = read_runs(run_dirs, kind)
    hist = open_history_for(history, config, output, access="create")
    for d, rec in zip(run_dirs, records):
        hist.write(rec)
        reporter.record(f"recorded {rec.run.run_id} ({d})", plain=True, run_id=rec.run.run_id, run_dir=d)


@history_app.command("simulate")
def history_simulate(
    nights: int = typer.Option(36, "--nights", min=4, help="Simulated nights in all."),
    fault_night: int = typer.Option(30, "--fault-night", help="First night with the fault (0-based; the nights before it are A/A nights)."),
    fix_night: int = typer.Option(33, "--fix-night", help="First night after the fix."),
    limit: int = typer.Option(40, "--limit", help="Items per night (two real runs of this size are made)."),
    output: Path = typer.Option(Path("reports/simulated"), "--output", parser=_path("--output"), help="Where the nights, their history and dashboard go."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", parser=_path("--config"), help="Config of the real runs (default: the shipped configs/default.yaml)."),
) -> None:
    """A documented demo: nights in which nothing changes, a layout fault switching on
    (recorded as a new vllm_ascend build), then the fix; prints what the detector flagged."""
    from evalpipe.nightly.simulate import simulate

    summary = simulate(reporter, nights=nights, fault_night=fault_night, fix_night=fix_night, limit=limit, output=output, config=config)
    raise typer.Exit(0 if summary.as_expected else 1)


@baseline_app.command("set")
def baseline_set(
    run_id: str = typer.Argument(..., help="The night to compare later nights with."),
    variant: Optional[str] = typer.Option(None, "--variant", help="Only for this variant (default: every variant)."),
    history: Optional[str] = _HISTORY_OPT, config: Optional[Path] = _CONFIG_OPT, output: Optional[Path] = _OUTPUT_OPT,
) -> None:
    """Pin a baseline night (instead of the last passing one)."""
    from evalpipe.commands.history import open_history_for

    hist = open_history_for(history, config, output, access="update")
    hist.pin_baseline(run_id, variant)
    reporter.record(f"baseline for {variant or 'every variant'}: {run_id}", plain=True, run_id=run_id, variant=variant)


@app.command()
def version() -> None:
    """Print evalpipe's version."""
    reporter.record(__version__, plain=True, version=__version__)


_terminated: list[int] = []


def _terminate_as_interrupt(signum: int, _frame) -> None:
    """SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C, so every worker and server
    this process started is stopped on the way out instead of being orphaned. (Noted
    aside: libraries on the way may re-raise a KeyboardInterrupt of their own.)"""
    _terminated.append(signum)
    _record_interrupt(signum)


def _interrupt(signum: int, _frame) -> None:
    """Ctrl-C: Python's own behaviour (KeyboardInterrupt), remembered so that the run
    loops stop even when the exception is raised where Python swallows it."""
    _record_interrupt(signum)


def _record_interrupt(signum: int) -> None:
    """The first interrupt stops the run in order (SIGTERM, grace, SIGKILL for every
    worker and server); a second one kills them all at once."""
    from evalpipe.execution.launch import interrupts, kill_live_groups

    interrupts.append(signum)
    if len(interrupts) > 1:
        kill_live_groups()
    raise KeyboardInterrupt


def _git_bisect_asked(argv: list[str]) -> bool:
    """--git-bisect given to `run` or `compare` (before a `--` that ends the options)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--git-bisect" in options and bool({"run", "compare"} & set(options))


def main() -> None:
    import signal

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        app()
    except SystemExit as done:
        if _terminated:  # click turned the interrupt into its own exit (130)
            err_console.print("terminated; the workers and servers of this run were stopped")
            sys.exit(ExitCode.TERMINATED)
        if _git_bisect_asked(sys.argv[1:]):
            sys.exit(for_git_bisect(done.code if isinstance(done.code, int) else (0 if done.code is None else ExitCode.USER_ERROR)))
        raise
    except KeyboardInterrupt:
        if _terminated:
            err_console.print("terminated; the workers and servers of this run were stopped")
            sys.exit(ExitCode.TERMINATED)
        err_console.print("interrupted; the workers and servers of this run were stopped")
        sys.exit(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    main()
