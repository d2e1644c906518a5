"""Finding the processes a run started (by the run-id marker each of them inherits)."""

from __future__ import annotations

import time
from pathlib import Path

from evalpipe.pipeline.plan import RUN_ID_ENV


def processes_of(run_id: str) -> list[int]:
    """PIDs whose environment carries the run's marker (every worker, server and engine
    process a run starts inherits it)."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_gone(run_id: str, seconds: float = 30) -> list[int]:
    deadline = time.time() + seconds
    while (left := processes_of(run_id)) and time.time() < deadline:
        time.sleep(0.5)
    return left
