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


def describe(pids: list[int]) -> str:
    """What each leftover process is (its command line and its parent's), for a failing
    assertion to say which of a run's processes outlived it."""
    lines = []
    for pid in pids:
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (Path("/proc") / str(pid) / "status").read_text()
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            parent = (Path("/proc") / str(ppid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line.split(None, 1)[1] for line in status.splitlines() if line.startswith("State:"))
            lines.append(f"{pid} [{state}] {cmd[:300]} (parent {ppid}: {parent[:200]})")
        except OSError:
            lines.append(f"{pid} (gone)")
    return "; ".join(lines)
