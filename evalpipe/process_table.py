"""The machine's live processes, read from Linux /proc: what stopping a process group and
finding a run's or a cluster's processes by their environment both scan. A zombie is not
live: it has ended and waits only for its parent (or init) to reap it, which on a busy
machine can take seconds (docs/measured.md). The stand-alone scripts (execution/guard.py,
execution/reaper.py, execution/forkserver.py) run without evalpipe and scan on their own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

# In the environment of every process a run starts, on every node: how its leftovers are
# found (the guard, the reaper and the fork server repeat the name: they run without evalpipe).
RUN_ID_ENV = "EVALPIPE_RUN_ID"


@dataclass(frozen=True)
class LiveProcess:
    pid: int
    pgid: int

    def environ(self) -> bytes | None:
        """Its environment as /proc shows it (``NAME=value`` entries, each ending in a NUL
        byte), None when it is gone or not ours to read."""
        try:
            with open(f"/proc/{self.pid}/environ", "rb") as fh:
                return fh.read() + b"\0"
        except OSError:
            return None


def live_processes() -> Iterator[LiveProcess]:
    """Every process that has not ended, this one included."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and ")"
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            yield LiveProcess(int(name), int(fields[2]))


def group_alive(pgid: int) -> bool:
    """Whether a process of the group runs. Not ``killpg(pgid, 0)``: that counts zombies."""
    return any(p.pgid == pgid for p in live_processes())


def carrying(entry: str) -> list[int]:
    """The live processes, this one excepted, whose environment has ``entry`` (``NAME=value``)."""
    needle = entry.encode() + b"\0"
    return [p.pid for p in live_processes() if p.pid != os.getpid() and needle in (p.environ() or b"")]
