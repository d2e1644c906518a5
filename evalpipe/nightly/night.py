"""`evalpipe nightly`: run tonight's matrix, record it, and judge three things.

1. Tonight's variants against each other: the run's own verdict.
2. Tonight against the baseline night, per variant, on the same items: the paired
   comparison of `evalpipe compare` (flips, McNemar, TOST at the margin, token drift),
   with tonight's A/A run as the noise floor of the token gates.
3. The series: every task x metric x variant over the nightly history
   (:mod:`evalpipe.compare.changepoint`), and the token measures of every variant.

The night is a REGRESSION when (1) fails, when a variant drifted from its baseline
(2), or when a series has a flagged change that lasts until tonight (a score going
down, a token measure going up). It is INCONCLUSIVE when nothing else failed but (1) or
a variant's (2) proves nothing about the code paths (a variant did not run the path its
config declares, or cannot be verified): a night that silently ran another path must
not pass; and when it compared nothing at all (one variant, no baseline night yet). Such
a night, with no other reason, may still be the baseline of the next. Its evidence goes to nightly.json / nightly.md /
nightly-junit.xml in the run directory, the history database and the dashboard; a
flagged change names the components that changed between the last good night and
the first bad one (the bisect hint).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from evalpipe.config.loading import load_config
from evalpipe.documents.nightly_doc import NIGHTLY_JSON, NightlyDocument, NightStatus, write_nightly_document
from evalpipe.errors import ExitCode, RunFailed, UserError
from evalpipe.history import HistoryError
from evalpipe.history.store import History, open_history
from evalpipe.install import config_label
from evalpipe.nightly.dashboard_data import build_dashboard
from evalpipe.nightly.judging import baseline_of, judge
from evalpipe.pipeline.plan import make_plan
from evalpipe.pipeline.runner import execute
from evalpipe.report.nightly import render_night_junit, render_night_summary
from evalpipe.reporting import Reporter
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RUN_JSON

NIGHTLY_MD = "nightly.md"
NIGHTLY_JUNIT = "nightly-junit.xml"
# keyed by the one night status type (documents/nightly_doc.py): a key that is no night status fails type checking
EXIT_CODES: dict[NightStatus, ExitCode] = {NightStatus.PASS: ExitCode.OK, NightStatus.REGRESSION: ExitCode.DIVERGENT, NightStatus.FAILED: ExitCode.FAILED,
                                           NightStatus.INCONCLUSIVE: ExitCode.INCONCLUSIVE}
NIGHT_COLOURS: dict[NightStatus, str] = {NightStatus.PASS: "green", NightStatus.INCONCLUSIVE: "yellow",
                                         NightStatus.REGRESSION: "red", NightStatus.FAILED: "red"}
# ---------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------


def write_night(run_dir: Path, night: NightlyDocument, dashboard: Path | None = None) -> dict[str, Path]:
    paths = {"json": run_dir / NIGHTLY_JSON, "markdown": run_dir / NIGHTLY_MD, "junit": run_dir / NIGHTLY_JUNIT}
    write_nightly_document(paths["json"], night)  # first: the judgement outlives a failed rendering
    artifacts.write_text(paths["markdown"], render_night_summary(night, dashboard))
    artifacts.write_text(paths["junit"], render_night_junit(night))
    return paths


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


def parse_components(pairs: list[str] | None) -> dict[str, str]:
    """``--component vllm_ascend=1a2b3c`` (repeatable) as a mapping; ValueError in one sentence."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UserError(f"--component {pair!r} is not NAME=VERSION; pass e.g. --component vllm_ascend=1a2b3c4.")
        out[name.strip()] = value.strip()
    return out


@dataclass
class NightResult:
    run_dir: Path
    judgement: NightlyDocument
    outputs: dict[str, Path]
    dashboard: Path

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.judgement.status]


def record_and_judge(history: History, run_dir: Path, *, labels: dict[str, str], alpha: float, min_nights: int,
                     dashboard: Path, title: str) -> NightResult:
    """Record a finished (or failed) night, judge it, write its outputs and the dashboard."""
    run_id = history.record(run_dir, kind="nightly", labels=labels)
    j = judge(history, run_id, alpha=alpha, min_nights=min_nights)
    outputs = write_night(run_dir, j, dashboard)
    build_dashboard(history, history.run(run_id).config_hash, title, dashboard)
    return NightResult(run_dir, j, outputs, dashboard)


def print_night(result: NightResult, reporter: Reporter) -> None:
    """The night's judgement, its reasons and open changes, its files; then its verdict."""
    j = result.judgement
    colour = NIGHT_COLOURS[j.status]
    reporter.info(f"[bold]nightly {j.run_id}[/]: [bold {colour}]{j.status}[/]"
                  + (f" (baseline {j.baseline})" if j.baseline else " (no baseline yet)"))
    for reason in j.reasons:
        reporter.info(f"  - {reason}", plain=True)
    for c in j.changes:
        if c.state in ("flagged", "pending") and c.open:
            reporter.info(f"  {c.state}: {c.summary}", plain=True)
    reporter.info(f"summary: {result.outputs['markdown']}  junit: {result.outputs['junit']}  dashboard: {result.dashboard}")
    reporter.verdict(j.status, result.exit_code, result.run_dir)  # its line: the first above


DEFAULT_DASHBOARD = Path("reports/nightly/index.html")


def run_night(config_path: Path | None, reporter: Reporter, *, limit: int | None = None, variants: str | None = None,
              output: Path | None = None, history_url: str | None = None, dashboard: Path | None = None,
              labels: dict[str, str] | None = None, run_id: str | None = None, timeout_s: float | None = None,
              stall_timeout_s: float | None = None,
              from_run: Path | None = None, cluster: str | None = None) -> NightResult:
    """`evalpipe nightly`: run the config's nightly matrix (or take a finished run with
    ``from_run``), record it, judge it, write its summary and the dashboard. ``cluster``:
    --cluster, over the config's cluster.address (`off`: here)."""
    cfg = load_config(config_path)
    if cluster is not None:
        cfg = cfg.on_cluster(None if cluster == "off" else cluster)
    spec = cfg.nightly
    labels = labels or {}
    if from_run is not None:
        run_dir = Path(from_run)
        if not (run_dir / RUN_JSON).is_file():
            raise HistoryError(f"--from-run {run_dir} is not a run directory (no run.json); pass reports/runs/<run_id>.")
        output_root = run_dir.parent
    else:
        chosen = variants or (",".join(spec.variants) if spec.variants else None)
        plan = make_plan(cfg, config_label(config_path), spec.tasks, limit=limit or spec.limit,
                         variants=chosen, output=str(output) if output else None,
                         run_id=run_id or time.strftime("nightly-%Y%m%d-%H%M%S", time.gmtime()))
        run_dir, output_root = plan.run_dir, plan.run_dir.parent
        history = open_history(history_url or spec.history, output_root)  # fail before hours of work, not after
        plan.teacher_baseline_dir = baseline_reference_dir(history, plan.config_sha256, plan.reference)
        if plan.teacher_baseline_dir is not None:
            reporter.info(f"[dim]baseline night: {plan.teacher_baseline_dir.parent.name} (its sequences are teacher-forced too)[/]")
        try:
            execute(plan, reporter, timeout_s, extra_info={"kind": "nightly", "components": labels}, record=False,
                    stall_timeout_s=stall_timeout_s)
        except RunFailed as err:
            reporter.failure(f"[bold red]tonight's run failed:[/] {err}")
            if not (run_dir / RUN_JSON).is_file():
                raise
    history = open_history(history_url or spec.history, output_root)
    title = f"evalpipe nightly: {config_label(config_path)}"
    result = record_and_judge(history, run_dir, labels=labels, alpha=spec.alpha, min_nights=spec.min_nights,
                              dashboard=Path(dashboard or spec.dashboard or DEFAULT_DASHBOARD), title=title)
    _append_ci_summary(result)
    return result


def baseline_reference_dir(history: History, config_hash: str | None, reference: str) -> Path | None:
    """The reference directory of the night tonight will be judged against, when its
    artifacts are still there (pinned, else the last passing night of this config)."""
    base = baseline_of(history, reference, history.runs(kind="nightly", config_hash=config_hash))
    if base is None:
        return None
    ref_dir = Path(history.run(base).run_dir) / reference
    vd = artifacts.VariantDir(ref_dir)
    return ref_dir if vd.samples.is_file() and vd.tokens.is_file() else None


def _append_ci_summary(result: NightResult) -> None:
    """CI systems that show a Markdown step summary name its file in $GITHUB_STEP_SUMMARY."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(result.outputs["markdown"].read_text(encoding="utf-8"))
