"""`evalpipe compare`: the comparison and the reports again from stored artifacts, no engine
— of one run directory (its own reference, or another; new gates) or of one variant of
each of two runs (the same items, B against A)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from evalpipe.commands.run import write_results_json
from evalpipe.config.gate_settings import Gates
from evalpipe.config.loading import load_gates
from evalpipe.documents.run_doc import RunDocument
from evalpipe.errors import UserError
from evalpipe.pipeline.comparing import compare_across_runs, print_written, read_run_info, report_run, write_outputs
from evalpipe.pipeline.plan import split_csv
from evalpipe.report.terminal import print_summary
from evalpipe.reporting import Reporter
from evalpipe.rundir.artifacts import COMPARE_JSON, MANIFEST_JSON, RUN_JSON, SAMPLES_PARQUET
from evalpipe.rundir.lock import holding_run_dir


def compare_command(targets: list[Path], reporter: Reporter, *, reference: str | None = None, variants: str | None = None,
                    output: Path | None = None, gates: Path | None = None, margin: float | None = None,
                    unverified: bool = False, results_json: Path | None = None) -> int:
    """The verdict's exit code; bad arguments are one sentence (UserError). ``unverified``
    (--unverified): a variant without manifest.json is compared as it is, and its verdict is
    INCONCLUSIVE (exit 4) naming it, instead of being refused."""
    chosen_gates = load_gates(gates, margin, base=_run_gates(targets[0]) if targets else None)
    if output is not None and output.exists() and not output.is_dir():
        raise UserError(f"--output {output} is a file, not a directory; pass a directory for compare.json and the reports.")
    if len(targets) == 1:
        run_dir = targets[0]
        if not (run_dir / RUN_JSON).is_file():
            raise UserError(f"{run_dir} is not a run directory (no run.json); pass reports/runs/<run_id>.")
        chosen = split_csv(variants, "--variants") or None
        # it rewrites run.json and the reports there: not while a run or another compare writes them
        with holding_run_dir(run_dir, elsewhere="or write the reports elsewhere with --output") if output is None else nullcontext():
            code, info = report_run(run_dir, reporter, reference=reference, variants=chosen, output=output,
                                    gates=chosen_gates, unverified=unverified)
        write_results_json(results_json, (output or run_dir) / COMPARE_JSON, code, reporter)
        reporter.verdict(info.verdict, code, output or run_dir)
        return code
    if len(targets) == 2:
        if reference or variants:
            raise UserError("--reference and --variants apply to one run directory; across runs the first argument is the reference.")
        if targets[0].resolve() == targets[1].resolve():
            raise UserError(f"both arguments name {targets[0]}: a variant against its own files compares nothing; "
                            "pass the variant directories of two runs.")
        for t in targets:
            # --unverified: a variant directory is known by its samples when its manifest is gone
            if not ((t / MANIFEST_JSON).is_file() or (unverified and (t / SAMPLES_PARQUET).is_file())):
                raise UserError(f"{t} is not a variant directory (no manifest.json); pass reports/runs/<run_id>/<variant>.")
        return compare_two_runs(targets[0], targets[1], reporter, output=output, gates=chosen_gates, unverified=unverified,
                                results_json=results_json)
    raise UserError("compare takes RUN_DIR, or exactly two variant directories RUN_A/VARIANT RUN_B/VARIANT.")


def compare_two_runs(a: Path, b: Path, reporter: Reporter, output: Path | None = None, gates: Gates | None = None,
                     unverified: bool = False, results_json: Path | None = None) -> int:
    """`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`: the same items, from two runs."""
    comparison = compare_across_runs(a, b, gates=gates, unverified=unverified)
    name = f"{Path(a).parent.name}.{Path(a).name}-vs-{Path(b).parent.name}.{Path(b).name}"
    out_dir = Path(output) if output is not None else Path.cwd() / "reports" / "compare" / name
    info = RunDocument(run_id=comparison.doc.run_id, reference=comparison.doc.reference,
                       variants=[comparison.doc.reference, *comparison.doc.variants])
    written = write_outputs(out_dir, comparison, info)
    print_summary(comparison.doc, reporter.console)
    print_written(written, reporter)
    code = comparison.status.exit_code
    write_results_json(results_json, out_dir / COMPARE_JSON, code, reporter)
    reporter.verdict(comparison.status.value, code, out_dir)
    return code


def _run_gates(target: Path) -> Gates | None:
    """The gates a run was made with (so --margin alone changes only the margin)."""
    run_dir = target if (target / RUN_JSON).is_file() else target.parent
    try:
        return read_run_info(run_dir).gates_of(str(run_dir / RUN_JSON))
    except UserError:
        return None
