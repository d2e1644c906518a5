"""`evalpipe run`: execute a RunPlan — model, variants in order, comparison, report.

Every step leaves its result on disk before the next starts (run.json is rewritten
after each), so a failure late in the run never loses what finished earlier.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rich.markup import escape

from evalpipe.cluster.session import connect
from evalpipe.documents.comparison import Status
from evalpipe.documents.run_doc import RunDocument, RunModel, VariantPlacement, VariantStatus, write_run_document
from evalpipe.errors import EvalpipeError, ExitCode, RunFailed, RunFailedOnUserInput, failure
from evalpipe.execution.launch import VariantOutcome, stop_if_interrupted
from evalpipe.execution.preimport import Preimport
from evalpipe.history import HistoryError
from evalpipe.history.store import open_history
from evalpipe.models.builtin import ShippedModelError, ensure_builtin
from evalpipe.pipeline.bookkeeping import mark_interrupted, open_run_dir, record_environment
from evalpipe.pipeline.comparing import report_run
from evalpipe.pipeline.launching import Limits, run_and_close, stop_unneeded
from evalpipe.pipeline.on_cluster import run_on_cluster
from evalpipe.pipeline.plan import PlannedVariant, RunPlan, run_info
from evalpipe.pipeline.preflight import preflight
from evalpipe.probing.names import VariantNames
from evalpipe.report.progress import ProgressView
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts
from evalpipe.rundir.lock import unlock_run_dir
from evalpipe.rundir.resume import ResumeRefused

COMPARE_TRACEBACK = "compare-error.txt"  # a comparison that hit a bug: its traceback, beside the artifacts



def ensure_model(plan: RunPlan, reporter: Reporter) -> RunModel:
    """Resolve the model to a local directory; a built-in one is the package's shipped,
    verified files (no training at run time, the same weights on every machine)."""
    name = plan.builtin_model
    if name is None:
        return RunModel(path=str(Path(plan.model).expanduser()), fingerprint=None, builtin=False)
    try:
        model = ensure_builtin(name)
    except ShippedModelError as err:
        raise RunFailedOnUserInput(str(err)) from None
    reporter.step(f"[bold]model[/] builtin:{name} (shipped, fingerprint {model.fingerprint[:12]})")
    return RunModel(path=str(model.path), fingerprint=model.fingerprint, builtin=True, name=f"builtin:{name}")


@dataclass(frozen=True)
class RunResult:
    """A run that ended with a verdict (or with nothing to compare): its directory, its
    run.json as saved last, and the exit code it earns. A run that failed raises instead."""

    run_dir: Path
    document: RunDocument
    exit_code: int


def execute(plan: RunPlan, reporter: Reporter, timeout_s: float | None = None, *,
            extra_info: dict[str, Any] | None = None, record: bool = True, stall_timeout_s: float | None = None,
            compared_elsewhere: bool = False, starter: Preimport | None = None) -> RunResult:
    """Run the plan; the run (finished or failed) is then recorded in the history
    database unless ``record`` is false (`nightly` records and judges it itself).
    ``extra_info``: more run.json fields (nightly: its kind and the components CI named).
    ``stall_timeout_s``: the watchdog's limit for every variant (default: each variant's
    launch.stall_timeout_s). What it does goes to ``reporter``, ending in the verdict.
    ``compared_elsewhere``: the run's variants are compared with another run's (bisect's
    steps against the good build): a run of one variant then says nothing of its own.
    ``starter``: the pre-imported interpreters its local workers fork from, when the caller
    keeps them across runs (a bisect's; their processes' mark is then the caller's too);
    default: the run's own, stopped with it."""
    names = preflight(plan, reporter)
    limits = Limits(timeout_s, stall_timeout_s)
    if plan.config.cluster.enabled:
        # before the run directory exists: a cluster that cannot be reached leaves no run behind
        connect(str(plan.config.cluster.address))
    try:
        result = _execute(plan, reporter, limits, extra_info, names, compared_elsewhere, starter)
    except KeyboardInterrupt:
        mark_interrupted(plan.run_dir)
        raise
    finally:
        if record and plan.run_dir.is_dir() and (plan.run_dir / artifacts.RUN_JSON).is_file():
            record_in_history(plan, reporter)
        unlock_run_dir(plan.run_dir)  # taken by _execute once it had created the directory
    if compared_elsewhere:
        return result
    # the last event: its line (the summary, or the sentence of a run that compared nothing) is above
    reporter.verdict(str(result.document.verdict or Status.INCONCLUSIVE), result.exit_code, result.run_dir)
    return result


def history_url(plan: RunPlan) -> str | None:
    return plan.config.nightly.history


def record_in_history(plan: RunPlan, reporter: Reporter) -> None:
    """Best effort: a history that cannot be written costs a warning, never the run."""
    try:
        hist = open_history(history_url(plan), plan.run_dir.parent)
        hist.record(plan.run_dir)
        reporter.info(f"[dim]recorded in the history {hist.where}[/]")
    except (HistoryError, OSError) as err:
        reporter.warning(f"[yellow]warning:[/] the run was not recorded in the history: {err}")
    except Exception as err:  # noqa: BLE001 - a bug in the bookkeeping must not cost the finished run
        reporter.warning(f"warning: the run was not recorded in the history because of a bug in evalpipe "
                         f"({type(err).__name__}: {err}):\n{traceback.format_exc()}", plain=True)


def _execute(plan: RunPlan, reporter: Reporter, limits: Limits, extra_info: dict[str, Any] | None,
             names: dict[str, VariantNames], compared_elsewhere: bool = False,
             starter: Preimport | None = None) -> RunResult:

    rd = artifacts.RunDir(plan.run_dir)
    info, kept = open_run_dir(rd, run_info(plan, **(extra_info or {})))
    write_run_document(rd.run_json, info)
    for note in plan.notes:
        reporter.note(f"[yellow]note:[/] {note}")
    reporter.step(f"[bold]run[/] {plan.run_id} -> {rd.root}", run_id=plan.run_id, run_dir=str(rd.root))
    if kept:
        reporter.step(f"[bold]continuing[/] the interrupted run; kept (finished, artifacts verified): {', '.join(kept)}")
    elif info.attempts:
        reporter.step("[bold]continuing[/] the interrupted run; no variant had finished: all run again")

    def save(**updates: Any) -> None:
        nonlocal info
        info = info.updated(**updates)
        write_run_document(rd.run_json, info)  # redacted: errors quote server commands, log tails and messages

    t0 = time.time()
    try:
        model = ensure_model(plan, reporter)
    except RunFailed as err:
        save(status="failed", error=str(err))
        raise
    previous = info.model.fingerprint
    if previous and model.fingerprint and previous != model.fingerprint:
        raise ResumeRefused(f"cannot continue {rd.root}: its model's files changed since it started "
                            f"(fingerprint {previous[:12]}, now {model.fingerprint[:12]}); choose another --run-id.")
    save(model=info.model.model_copy(update=model.model_dump(exclude_unset=True)),
         timings=info.timings.model_copy(update={"model_s": time.time() - t0}))


    view = ProgressView(reporter.console)
    # Without the reference (or its A/A twin) nothing can be compared, so their failure
    # ends the run; any other variant's failure is recorded and the rest still run and
    # are compared, so one broken build does not throw away an hour of the others.
    essential = {v.name for v in plan.variants[:1]} | {v.name for v in plan.variants if v.aa_of}
    failures: dict[str, tuple[str, int]] = {}

    def record(variant: PlannedVariant, outcome: VariantOutcome, placement: VariantPlacement | None = None) -> None:
        """A variant's end in run.json; an essential variant's failure ends the run (raised)."""
        nonlocal info
        vdir = rd.root / variant.name
        status = VariantStatus(exit_code=outcome.exit_code, seconds=round(outcome.seconds, 3), error=outcome.error,
                               **({"stalled": True} if outcome.stalled else {}))
        info = record_environment(info, variant.name, vdir, header=variant is plan.variants[0])
        more = {"placements": {**info.placements, variant.name: placement}} if placement is not None else {}
        save(variant_status={**info.variant_status, variant.name: status}, **more)
        if not outcome.ok:
            error = outcome.error or f"variant {variant.name} failed"
            failed = failure(error, outcome.exit_code)
            if variant.name in essential:
                save(status="failed", error=error)
                raise failed
            failures[variant.name] = (error, failed.exit_code)
            reporter.failure(f"[bold red]variant {variant.name} failed[/]; continuing with the other variants.",
                             variant=variant.name)

    for name in kept:
        reporter.step(f"[bold cyan]variant {name}[/] kept from before the interruption", variant=name)
        info = record_environment(info, name, rd.root / name, header=name == plan.variants[0].name)
    if plan.config.cluster.enabled:
        run_on_cluster(plan, model, rd, names, limits, reporter, kept, record)
    else:
        _run_here(plan, model, rd, names, limits, reporter, view, kept, record, starter)

    info = info.updated(timings=info.timings.model_copy(update={"total_s": time.time() - t0}))
    compared = [v.name for v in plan.variants if v.name not in failures]
    if len(compared) - len(essential & set(compared)) < 1:
        if failures:
            _fail_run(info, failures, save)
        save(status="ok", verdict=None)
        aa = next((v.name for v in plan.variants if v.aa_of), None)
        if compared_elsewhere:
            return RunResult(rd.root, info, ExitCode.OK)
        reporter.info(f"[bold yellow]INCONCLUSIVE[/] {escape(nothing_compared(plan.variants[0].name, aa))}")
        return RunResult(rd.root, info, ExitCode.INCONCLUSIVE)
    try:
        verdict_code, info = report_run(rd.root, reporter, info, variants=compared if failures else None)
    except Exception as err:  # any kind: the variants' hours of work are on disk, say so
        # evalpipe's own error is its sentence; anything else is a bug, its traceback kept beside the artifacts
        if isinstance(err, EvalpipeError):
            reason = str(err).rstrip(".")
        else:
            log = rd.root / COMPARE_TRACEBACK
            artifacts.write_text(log, traceback.format_exc())
            reason = f"a bug in evalpipe: {type(err).__name__}: {err}; traceback in {log}"
        also = f" ({', '.join(failures)} failed)" if failures else ""
        message = (f"variants {', '.join(compared)} finished{also} and their artifacts are kept in {rd.root}, but comparing "
                   f"them failed ({reason}); once that is fixed, retry with `evalpipe compare {rd.root}`.")
        save(status="failed", verdict=None, error=message, **({"failed_variants": list(failures)} if failures else {}))
        raise RunFailed(message) from None  # a run that ended without its verdict: exit 3
    if failures:
        _fail_run(info, failures, save)
    return RunResult(rd.root, info, verdict_code)


def nothing_compared(reference: str, aa: str | None) -> str:
    """The sentence of a run that had no second variant to compare (exit 4: it proves nothing)."""
    also = f" (with its A/A run `{aa}`)" if aa else ""
    return (f"only the reference `{reference}` ran{also}: nothing was compared, so nothing is proven; run at least one "
            "variant besides the reference (--variants), or compare this run's variant with another run's: "
            "`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`")


def _run_here(plan: RunPlan, model: RunModel, rd: artifacts.RunDir, names: dict[str, VariantNames], limits: Limits,
              reporter: Reporter, view: ProgressView, kept: list[str], record, shared: Preimport | None) -> None:
    """The variants one after another in this machine's processes (the default), their workers
    forked from pre-imported interpreters (evalpipe/execution/preimport.py): ``shared``'s,
    else the run's own."""
    servers: dict[str, Any] = {}
    starter = shared or Preimport()
    try:
        for i, variant in enumerate(plan.variants):
            if variant.name in kept:
                continue
            reporter.step(f"[bold cyan]variant {variant.name}[/] {escape(variant.description)}".rstrip(), variant=variant.name)
            try:
                outcome = run_and_close(plan, variant, model, rd.root / variant.name, view.handle(variant.name), limits,
                                        servers, names[variant.name], starter=starter)
            finally:
                view.close()
                stop_unneeded(servers, plan.variants[i + 1:])
            record(variant, outcome)
            stop_if_interrupted()
    finally:
        stop_unneeded(servers, [])
        if shared is None:
            starter.close()


def _fail_run(info: RunDocument, failures: dict[str, tuple[str, int]], save: Callable[..., None]) -> NoReturn:
    """Mark the run failed (after whatever could be compared was written) and raise."""
    names = ", ".join(failures)
    first_error, _ = next(iter(failures.values()))
    # an error's first line is its sentence; what follows (a log's tail) goes after ours
    sentence, _, details = first_error.partition("\n")
    message = f"variant{'s' if len(failures) > 1 else ''} {names} failed ({sentence.rstrip('.')})"
    if info.verdict:
        message += f"; the other variants were compared: {info.verdict}"
    if details:
        message += f"\n{details}"
    save(status="failed", error=message, failed_variants=list(failures))
    codes = {code for _, code in failures.values()}
    raise failure(message, ExitCode.USER_ERROR if codes == {ExitCode.USER_ERROR} else ExitCode.FAILED)
