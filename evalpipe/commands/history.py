"""`evalpipe history`: which history the options name (opened read-only by the commands that
only read), what `list` and `show` print, and the run directories `import` reads first."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evalpipe.config.loading import load_config
from evalpipe.errors import UserError
from evalpipe.history import HistoryError
from evalpipe.history.records import RunRecord, describe_what_ran, read_run
from evalpipe.history.store import Access, History, open_history

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


def list_runs(hist: History, console: Console, *, kind: str | None, last: int) -> None:
    """Recorded runs and nights, oldest first."""
    rows = hist.runs(kind=kind)[-last:]
    table = Table("run id", "kind", "started (UTC)", "status", "verdict", "nightly", "baseline", "config", title=f"history {hist.where}")
    for r in rows:
        table.add_row(r.run_id, r.kind, time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started_at)), str(r.status),
                      str(r.verdict or "-"), str(r.nightly_status or "-"), str(r.baseline_run_id or "-"), str(r.config_hash or "-")[:12])
    console.print(table)
    if not rows:
        console.print("no runs recorded yet: `evalpipe run` and `evalpipe nightly` record theirs; `evalpipe history import RUN_DIR...` adds existing ones.")


def show_run(hist: History, run_id: str, console: Console) -> None:
    """One run: its variants, components, what ran, scores and, for a night, its judgement."""
    run = hist.run(run_id)
    console.print(f"[bold]{run.run_id}[/] ({run.kind}) status {run.status}, verdict {run.verdict}, nightly {run.nightly_status or '-'}"
                  f", baseline {run.baseline_run_id or '-'}\nrun directory {run.run_dir}", soft_wrap=True)
    for v in hist.variants_of(run_id):
        comps = ", ".join(f"{k} {val}" for k, val in sorted(v.components.items()))
        console.print(f"  {v.name} ({v.role}) {v.status or ''}  {comps}", soft_wrap=True, markup=False)
        paths = f"; paths {v.path_status}" if v.path_status else ""
        console.print(f"    ran: {describe_what_ran(v.probes)}{paths}", soft_wrap=True, markup=False)
    for s in hist.score_rows([run_id]):
        se = f" ± {s.se:.4f}" if s.se is not None else ""
        mean = "—" if s.mean is None else f"{s.mean:.4f}"
        console.print(f"    {s.variant:<20} {s.task} {s.metric}: {mean}{se} (n {s.n})", markup=False)
    for reason in run.judgement.reasons if run.judgement else []:
        console.print(f"  - {reason}", soft_wrap=True, markup=False)
