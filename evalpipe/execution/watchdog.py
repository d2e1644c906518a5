"""The no-progress watchdog of one variant: pure bookkeeping over the worker's events.

A hung collective (an HCCL time-out that never fires) produces no error, only silence:
the engine is up and no request finishes. The watchdog is armed once the engine is
ready (a slow start is the start-up limits' business, not this one's) and measures the
time since the last finished request; a new task or phase counts as progress too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalpipe.documents.worker_events import ProgressEvent, StageEvent, WorkerEvent

# Stages that mean the engine is up and requests are being (or about to be) sent.
ARMING_STAGES = frozenset({"engine_ready", "task", "teacher"})
# The variant waits for another (on a cluster, the reference it teacher-forces), or its engine
# is still starting (a server that became ready loads its tokenizer, lm-eval builds the
# requests): that silence is not a hang; the next arming stage, or the count that opens the
# next engine call (its requests handed over), arms it again.
DISARMING_STAGES = frozenset({"waiting", "engine"})


@dataclass
class Watchdog:
    limit_s: float | None
    last_at: float | None = None  # when progress was last seen; None: not armed yet
    last: str | None = None  # the last progress (a request count or a stage), for the message
    _position: tuple[tuple[Any, ...], int] | None = None  # ((task, phase, total), done)

    def see(self, event: WorkerEvent, now: float) -> None:
        if isinstance(event, StageEvent) and event.stage in DISARMING_STAGES:
            self.last_at, self._position, self.last = None, None, None
        elif isinstance(event, StageEvent) and (event.stage in ARMING_STAGES or self.last_at is not None):
            self.last_at, self._position = now, None
            self.last = f"the stage `{event.message or event.stage}`"
        elif isinstance(event, ProgressEvent):
            key, done = (event.task, event.phase, event.total), event.done
            if self._position is None or self._position[0] != key or done > self._position[1]:
                self.last_at, self._position = now, (key, done)
                self.last = f"{event.task or 'task'} {event.phase} {done}/{event.total} requests"

    def stalled(self, now: float) -> bool:
        return self.limit_s is not None and self.last_at is not None and now - self.last_at > self.limit_s

    def describe(self, now: float) -> str:
        """The last progress, for the variant's error."""
        if self.last is None:
            return "it was never seen to start"
        return f"its last progress: {self.last}"
