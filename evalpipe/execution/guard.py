"""Run a command so that it cannot outlive evalpipe.

    python -I guard.py GRACE_S -- COMMAND [ARGS...]

evalpipe starts every worker and server through this guard, as the leader of a new
process group, with a pipe on the guard's stdin whose other end only evalpipe holds.
The command (and whatever it spawns: vLLM's engine core, a resource tracker) runs in
the guard's group. When evalpipe dies, even by SIGKILL, the kernel closes the pipe; the
guard reads end-of-file and takes the group down (SIGTERM, GRACE_S seconds, SIGKILL),
so nothing is left holding the devices. Otherwise it waits for the command and exits
with its code (128 + N for a command killed by signal N).

Started as a script with -I (stdlib only, no evalpipe import): a variant's environment
may point PYTHONPATH at another build, which must not change how the guard runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def _others_in_group(pgid: int) -> list[int]:
    """Live processes of the group, the guard excepted (Linux /proc)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def take_down_group(grace_s: float) -> None:
    pgid = os.getpgrp()
    os.killpg(pgid, signal.SIGTERM)  # the guard's own handler ignores it
    deadline = time.monotonic() + grace_s
    while _others_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)  # the guard included: its work is done


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: guard.py GRACE_S -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    grace_s = float(argv[0])
    # A handler, not SIG_IGN: an ignored signal would stay ignored in the command after exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL)
    except OSError as err:
        print(f"cannot start {argv[2]}: {err}", file=sys.stderr)
        return 127

    def parent_gone() -> None:
        try:
            while os.read(0, 4096):  # the raw fd: a buffered reader's lock would block exit
                pass
        except OSError:
            pass
        if child.poll() is None:
            print(f"guard: evalpipe is gone; stopping process group {os.getpgrp()}", file=sys.stderr, flush=True)
            take_down_group(grace_s)

    threading.Thread(target=parent_gone, daemon=True).start()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown while the watching thread still reads
