"""`evalpipe history`: which history the options name (opened read-only by the commands that
only read), what `list` and `show` print, and the run directories `import` reads first."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from evalpipe.config.loading import load_config
from evalpipe.errors import UserError
from evalpipe.history import HistoryError
from evalpipe.history.records import RunRecord, describe_what_ran, read_run
from evalpipe.history.store import Access, History, open_history
from evalpipe.reporting import Reporter

KINDS = ("run", "nightly")


def open_history_for(history: str | None, config: Path | None, output: Path | None, *, access: Access) -> History:
    """The history the options name: --history, else the config's nightly.history, else
    history.sqlite under the output root (--output, else the config's `output`); opened for
    ``access`` (a command that only reads never creates or changes it)."""
    cfg = load_config(config) if (config or history is None) else None
    url = history or (cfg.nightly.history if cfg else None)
    root = Path(output) if output else Path(cfg.output if cfg else "reports/runs")
    return open_history(url, root, access=access)


def check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise HistoryError(f"--kind {kind!r} is not one of {', '.join(KINDS)}; pass --kind run or --kind nightly.")


def read_runs(run_dirs: list[Path], kind: str | None) -> list[RunRecord]:
    """Every run directory to import, read and verified before the history is opened:
    one that is not a run refuses the import before anything is written."""
    check_kind(kind)
    out = []
    for d in run_dirs:
        try:
            out.append(read_run(d, kind=kind))
        except OSError as err:
            raise UserError(f"cannot record {d}: {err.strerror or err}; pass a readable run directory.") from None
    return out


def list_runs(hist: History, reporter: Reporter, *, kind: str | None, last: int) -> None:
    """Recorded runs and nights, oldest first: a table, and a record per run."""
    runs = hist.runs(kind=kind)[-last:]
    if not runs:
        # the answer itself (quiet shows it too); no record has a run_id
        reporter.record("no runs recorded yet: `evalpipe run` and `evalpipe nightly` record theirs; "
                        "`evalpipe history import RUN_DIR...` adds existing ones.", plain=True, history=hist.where)
        return
    table = Table("run id", "kind", "started (UTC)", "status", "verdict", "nightly", "baseline", "config", title=f"history {hist.where}")
    rows = []
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at))
        table.add_row(*(Text(cell) for cell in (r.run_id, r.kind, started, str(r.status), str(r.verdict or "-"),
                                                 str(r.nightly_status or "-"), str(r.baseline_run_id or "-"),
                                                 str(r.config_hash or "-")[:12])))
        rows.append({"run_id": r.run_id, "kind": r.kind, "started_at": r.started_at, "status": r.status, "verdict": r.verdict,
                     "nightly": r.nightly_status, "baseline": r.baseline_run_id, "config_hash": r.config_hash})
    reporter.table(table, rows)


def show_run(hist: History, run_id: str, reporter: Reporter) -> None:
    """One run: its variants, components, what ran, scores and, for a night, its judgement."""
    run = hist.run(run_id)
    reporter.record(f"[bold]{escape(run.run_id)}[/] ({run.kind}) status {run.status}, verdict {run.verdict}, "
                    f"nightly {run.nightly_status or '-'}, baseline {escape(run.baseline_run_id or '-')}\n"
                    f"run directory {escape(str(run.run_dir))}", run_id=run.run_id, kind=run.kind, status=run.status,
                    verdict=run.verdict, nightly=run.nightly_status, baseline=run.baseline_run_id, run_dir=run.run_dir)
    for v in hist.variants_of(run_id):
        comps = ", ".join(f"{k} {val}" for k, val in sorted(v.components.items()))
        paths = f"; paths {v.path_status}" if v.path_status else ""
        reporter.record(f"  {v.name} ({v.role}) {v.status or ''}  {comps}\n    ran: {describe_what_ran(v.probes)}{paths}",
                        plain=True, variant=v.name, role=v.role, status=v.status, components=v.components,
                        paths=v.path_status)
    for s in hist.score_rows([run_id]):
        se = f" ± {s.se:.4f}" if s.se is not None else ""
        mean = "—" if s.mean is None else f"{s.mean:.4f}"
        reporter.record(f"    {s.variant:<20} {s.task} {s.metric}: {mean}{se} (n {s.n})", plain=True, variant=s.variant,
                        task=s.task, metric=s.metric, mean=s.mean, se=s.se, n=s.n)
    for reason in run.judgement.reasons if run.judgement else []:
        reporter.record(f"  - {reason}", plain=True, reason=reason)
