"""Turn worker events into what a person watching the terminal (or a CI log) sees."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from evalpipe.documents.worker_events import DoneEvent, ErrorEvent, ProgressEvent, StageEvent, TaskDoneEvent, WorkerEvent


class ProgressView:
    def __init__(self, console: Console, lines: bool = False):
        """``lines``: one line per event, each naming its variant (variants running at once,
        on a cluster: no redrawn bars)."""
        self.console = console
        self.lines = lines
        self._progress: Progress | None = None
        self._bars: dict[tuple[str, str, str], TaskID] = {}
        self._logged_pct: dict[tuple[str, str, str], int] = {}

    def _bar(self, key: tuple[str, str, str], total: int) -> TaskID:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=self.console, transient=False,
            )
            self._progress.start()
        if key not in self._bars:
            self._bars[key] = self._progress.add_task(" · ".join(key), total=total)
        return self._bars[key]

    def handle(self, variant: str) -> Callable[[WorkerEvent], None]:
        def on_event(event: WorkerEvent) -> None:
            who = f"{variant}: " if self.lines else ""
            if isinstance(event, StageEvent) and event.stage != "task":
                self.console.print(f"  {who}{event.message}", markup=False)
            elif isinstance(event, ProgressEvent):
                key = (variant, event.task, event.phase)
                total, done = event.total, event.done
                if self.console.is_terminal and not self.lines:
                    self._progress_update(key, done, total)
                else:
                    # Plain logs (CI): one line per 25% instead of a redrawn bar.
                    pct = int(100 * done / total) if total else 100
                    step = pct // 25 * 25
                    if step > self._logged_pct.get(key, -1):
                        self._logged_pct[key] = step
                        self.console.print(f"  {' · '.join(key)}: {done}/{total}")
            elif isinstance(event, TaskDoneEvent):
                metrics = event.metrics
                shown = ", ".join(
                    f"{k} {v:.4f}" for k, v in sorted(metrics.items()) if "_stderr" not in k and isinstance(v, float)
                )
                self.close()
                self.console.print(f"  {who}{event.task}: {shown} ({event.seconds:.1f}s)", markup=False)
            elif isinstance(event, ErrorEvent):
                self.close()
                self.console.print(f"  {who}[red]{event.kind} error:[/] {escape(event.message)}")
            elif isinstance(event, DoneEvent):
                self.close()
                self.console.print(f"  {who}done in {event.seconds:.1f}s", markup=False)

        return on_event

    def _progress_update(self, key: tuple[str, str, str], done: int, total: int) -> None:
        bar = self._bar(key, total)
        assert self._progress is not None
        self._progress.update(bar, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._bars.clear()
