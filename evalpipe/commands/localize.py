"""`evalpipe localize RUN_DIR`: where in the model a DIVERGENT variant first parts from the
reference (:mod:`evalpipe.pipeline.localizing`); and the same after `evalpipe run` when the
config says `localize: auto`."""

from __future__ import annotations

from pathlib import Path

from evalpipe.config.option_bounds import check_option
from evalpipe.config.run_config import Localize
from evalpipe.documents.comparison import Status, read_comparison
from evalpipe.errors import EvalpipeError, ExitCode, UserError
from evalpipe.pipeline.launching import Limits
from evalpipe.pipeline.localizing import Request, localize_run
from evalpipe.pipeline.plan import split_csv
from evalpipe.reporting import Reporter
from evalpipe.rundir.artifacts import RUN_JSON, RunDir
from evalpipe.rundir.lock import holding_run_dir


def localize_command(run_dir: Path, reporter: Reporter, *, variant: str | None = None, samples: int | None = None,
                     positions: int | None = None, decode_steps: int | None = None, timeout: float | None = None) -> int:
    for option, value, field in (("--samples", samples, "samples"), ("--positions", positions, "positions"),
                                 ("--decode-steps", decode_steps, "decode_steps")):
        check_option(option, value, Localize, field, f"localize.{field}")
    if not (run_dir / RUN_JSON).is_file():
        raise UserError(f"{run_dir} is not a run directory (no run.json); pass reports/runs/<run_id>.")
    with holding_run_dir(run_dir, elsewhere=None):  # it rewrites the reports: not while a run or a compare writes them
        localize_run(run_dir, reporter, Request(tuple(split_csv(variant, "--variant")), samples, positions, decode_steps), Limits(timeout_s=timeout))
    return ExitCode.OK


def localize_after_run(run_dir: Path, reporter: Reporter) -> None:
    """`localize: auto`: every DIVERGENT variant of the run just compared. A failure here
    costs a warning, never the finished run's verdict."""
    rd = RunDir(run_dir)
    if not rd.compare_json.is_file():
        return
    divergent = tuple(c.variant for c in read_comparison(rd.compare_json).comparisons if c.status is Status.DIVERGENT)
    if not divergent:
        return
    try:
        with holding_run_dir(run_dir, elsewhere=None):
            localize_run(run_dir, reporter, Request(divergent))
    except EvalpipeError as err:
        reporter.warning(f"[yellow]warning:[/] localize ({', '.join(divergent)}) failed: {err}")
