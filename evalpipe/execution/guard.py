"""Run a command so that it cannot outlive evalpipe.

    python -I guard.py GRACE_S -- COMMAND [ARGS...]

evalpipe starts every worker and server through this guard, as the leader of a new
session and process group, with a pipe on the guard's stdin whose other end only evalpipe
holds. The command (and whatever it spawns: vLLM's engine core, a resource tracker) runs in
the guard's group, a fork server's children in groups of their own in the guard's session.
When evalpipe dies, even by SIGKILL, the kernel closes the pipe; the guard reads
end-of-file and takes the session down (SIGTERM, GRACE_S seconds, SIGKILL),
so nothing is left holding the devices. Otherwise it waits for the command and exits
with its code (128 + N for a command killed by signal N).

The watching is done by a forked watcher, not by the guard itself: whoever kills the
guard's parent may kill the guard first. A Ray worker does exactly that on its way out
(it SIGKILLs its direct children, not their children: Ray's "user-spawned processes"
guide), which would orphan the command. The watcher is a grandchild, so it survives,
and it also takes the session down when the guard itself dies.

Started as a script with -I (stdlib only, no evalpipe import): a variant's environment
may point PYTHONPATH at another build, which must not change how the guard runs.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time


def _others_in_session(sid: int) -> list[int]:
    """Live processes of the session, the caller excepted (Linux /proc). The session, not only
    the group: a fork server's children run in groups of their own (evalpipe/execution/forkserver.py)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[3]) == sid:
            found.append(int(name))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def take_down_session(grace_s: float) -> None:
    sid = os.getsid(0)
    _signal_all(_others_in_session(sid), signal.SIGTERM)  # the guard's own handler ignores it
    deadline = time.monotonic() + grace_s
    while (left := _others_in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + grace_s
    while (left := _others_in_session(sid)) and time.monotonic() < deadline:
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    os._exit(0)  # its work is done


def watch(guard: int, grace_s: float) -> None:
    """The watcher: wait until evalpipe's pipe closes or the guard is gone, then take the
    session down if anything of it is left. Never returns."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the command's stdout may be evalpipe's pipe: it must see EOF when the command ends
    reason = ""
    while not reason:
        if os.getppid() != guard:
            reason = "its guard is gone"
        elif select.select([0], [], [], 0.2)[0] and not _read_some():
            reason = "evalpipe is gone"
    if _others_in_session(os.getsid(0)):
        print(f"guard: {reason}; stopping session {os.getsid(0)}", file=sys.stderr, flush=True)
        take_down_session(grace_s)
    os._exit(0)


def _read_some() -> bytes:
    try:
        return os.read(0, 4096)  # the raw fd: nothing buffered
    except OSError:
        return b""


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: guard.py GRACE_S -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    grace_s = float(argv[0])
    # A handler, not SIG_IGN: an ignored signal would stay ignored in the command after exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    guard = os.getpid()
    if os.fork() == 0:  # before any thread or child exists: a clean fork
        watch(guard, grace_s)
    try:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL)
    except OSError as err:
        print(f"cannot start {argv[2]}: {err}", file=sys.stderr)
        return 127
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)
