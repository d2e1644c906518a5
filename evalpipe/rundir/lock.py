"""One writer per run directory: an flock on ``<run_dir>/.lock``.

`evalpipe run` takes it as soon as it has created the run directory and keeps it until
it returns; `evalpipe compare`, `localize`, `nightly --from-run` and `calibrate --from-run` take it
while they write into a run directory (and a resumed run takes it before writing
again). A second process is refused in one sentence instead of both writing, and so is a
directory that cannot be written (:func:`check_writable`). The
kernel drops an flock when the holder's file descriptor closes, so a process killed
with SIGKILL leaves no stale lock; the file itself stays (deleting it would race with
a process that has just opened it).

Within one process the lock is re-entrant, counted per directory: a run compares and
reports its own directory while holding it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Iterator

from evalpipe.config.errors import ConfigError

LOCK_FILE = ".lock"
_held: dict[str, list[int]] = {}  # real path -> [fd, holds]
ELSEWHERE = "or write elsewhere (another --run-id or --output)"  # the way out for `run`


class RunDirBusy(ConfigError):
    """Another process holds the run directory (a user error, exit code 2)."""


class RunDirReadOnly(ConfigError):
    """The run directory a command would write into cannot be written (a user error, exit code 2)."""


def lock_run_dir(run_dir: Path, elsewhere: str | None = ELSEWHERE) -> None:
    """Take (or take again, in this process) the lock of ``run_dir``; RunDirBusy if another process holds it.
    ``elsewhere``: the refusal's other way out (None: a command that can only write there)."""
    key = os.path.realpath(run_dir)
    if key in _held:
        _held[key][1] += 1
        return
    check_writable(run_dir, elsewhere)
    try:
        # O_CLOEXEC: workers and servers this process starts must not inherit (and so keep) the lock
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return  # the directory is writable but not the lock file (another user's): the lock is a safety net, not a reason to fail
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f"evalpipe process {pid}" if pid.isdigit() else "another evalpipe process"
        raise RunDirBusy(
            f"run directory {run_dir} is being written by {who}; wait until it has finished"
            + (f", {elsewhere}." if elsewhere else ".")
        ) from None
    except OSError:
        os.close(fd)
        return  # a file system without flock (some network mounts): the lock is a safety net, not a reason to fail the run
    except BaseException:
        os.close(fd)
        raise
    # the holder's pid, for the message another process gets (written only once locked)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = [fd, 1]


def check_writable(run_dir: Path, elsewhere: str | None = ELSEWHERE) -> None:
    """Whoever takes the lock writes into the directory next: a directory that cannot be
    written (permissions, a read-only mount) is refused here, in one sentence, before the
    command prints a plan or starts anything, not by the first write half-way through. A
    file is created and removed at once (its name never appears: O_TMPFILE where the file
    system has it), which, unlike os.access, also holds for root and read-only mounts."""
    try:
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise RunDirReadOnly(
            f"run directory {run_dir} cannot be written ({err.strerror or err}); make it writable"
            + (f", {elsewhere}." if elsewhere else ".")
        ) from None


def unlock_run_dir(run_dir: Path) -> None:
    """Give back one hold; the lock is released with the last. Nothing when this process holds none."""
    key = os.path.realpath(run_dir)
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _held[key]
        os.close(entry[0])


@contextlib.contextmanager
def holding_run_dir(run_dir: Path, elsewhere: str | None = ELSEWHERE) -> Iterator[None]:
    lock_run_dir(run_dir, elsewhere)
    try:
        yield
    finally:
        unlock_run_dir(run_dir)
