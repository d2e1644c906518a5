"""Start one worker process per variant and follow it.

Each worker runs under the variant's interpreter and environment, in its own
process group (vLLM spawns an engine-core child; stopping the group stops both).
stdout carries JSON-line events; stderr is the variant's engine.log, or worker.log
when a server (serve mode) writes engine.log.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from evalpipe.documents.worker_events import ErrorEvent, WorkerEvent, read_event
from evalpipe.documents.worker_job import JOB_JSON, WorkerJob, write_job
from evalpipe.errors import ExitCode
from evalpipe.execution.watchdog import Watchdog
from evalpipe.process_table import group_alive
from evalpipe.rundir import artifacts

EventHandler = Callable[[WorkerEvent], None]

# Between SIGTERM and SIGKILL for a worker's group (its engine shuts down in seconds).
WORKER_GRACE_S = 15.0

# Signals the user sent to stop the run (SIGINT, SIGTERM), recorded by the handler that
# raises KeyboardInterrupt. A KeyboardInterrupt raised where Python swallows exceptions
# (a finalizer, a callback) is lost; the run loops check this list too, so a Ctrl-C
# stops the run even then.
interrupts: list[int] = []


class Launchable(Protocol):
    """What launching a variant's worker needs of it (the plan's PlannedVariant is one):
    its name, its interpreter and its process environment."""

    name: str
    python: str

    def process_env(self) -> dict[str, str]: ...


class Starter(Protocol):
    """Turns a worker's command line into the one that starts it (evalpipe/execution/preimport.py)."""

    def command(self, python: str, command: list[str], env: dict[str, str]) -> list[str]: ...


def stop_if_interrupted() -> None:
    if interrupts:
        raise KeyboardInterrupt


@dataclass
class VariantOutcome:
    name: str
    exit_code: int
    seconds: float
    error: str | None = None
    stalled: bool = False  # stopped by the no-progress watchdog

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# Process groups started by this run and not yet stopped: a second Ctrl-C kills them at
# once instead of waiting out their grace periods.
live_groups: set[int] = set()

GUARD_SCRIPT = Path(__file__).with_name("guard.py")


def guarded_popen(command: list[str], grace_s: float, **kwargs: Any) -> subprocess.Popen:
    """Start ``command`` in a new process group under the guard (evalpipe/execution/guard.py): when
    this process dies, even by SIGKILL, the guard's stdin pipe closes and it stops the
    group. The pipe's write end stays open here, unused, for the child's whole life.
    A command that cannot be found raises FileNotFoundError here, as Popen would."""
    env = kwargs.get("env")
    if shutil.which(command[0], path=(env if env is not None else os.environ).get("PATH")) is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (or not executable)", command[0])
    proc = subprocess.Popen(
        [sys.executable, "-I", str(GUARD_SCRIPT), f"{grace_s:g}", "--", *command],
        stdin=subprocess.PIPE, start_new_session=True, **kwargs,
    )
    live_groups.add(proc.pid)
    return proc


def kill_live_groups() -> None:
    """The second Ctrl-C: SIGKILL everything this run started, now."""
    for pgid in list(live_groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process's whole group (vLLM's engine-core child may outlive its
    parent), wait up to ``grace_s``, then SIGKILL what is left. A second Ctrl-C while
    waiting (more than one interrupt recorded) cuts the wait short."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        _forget(proc)
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and len(interrupts) < 2:
        if not group_alive(proc.pid):
            break
        if proc.poll() is None:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait()
    _forget(proc)


def _forget(proc: subprocess.Popen) -> None:
    live_groups.discard(proc.pid)
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _read_lines(stream, lines: queue.Queue) -> None:
    """Reader thread: the worker's events, so the loop below can wake up on its own
    (a hung worker writes nothing, and a blocking read would wait with it)."""
    try:
        for line in stream:
            lines.put(line)
    finally:
        lines.put(None)


def run_worker(
    variant: Launchable,
    job: WorkerJob,
    variant_dir: Path,
    on_event: EventHandler,
    timeout_s: float | None = None,
    log_path: Path | None = None,
    stopped: Callable[[], str | None] | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    stall_timeout_s: float | None = None,
    stall_log: Path | None = None,
    env: dict[str, str] | None = None,
    starter: Starter | None = None,
) -> VariantOutcome:
    """Run the variant's worker to its end. ``log_path``: where its stderr goes (default
    engine.log). ``stopped``: asked when the worker ends; a message means something
    outside it (its server died) ended it, and becomes the variant's error.
    ``stall_timeout_s``: the watchdog's limit on time without a finished request once the
    engine is up (evalpipe/execution/watchdog.py); the variant then fails with its last progress
    and the tail of ``stall_log`` (default its own log; a server's log in serve mode).
    ``env``: the worker's environment (default the variant's process environment).
    ``starter``: what the worker's command line becomes (a pre-imported interpreter's client,
    evalpipe/execution/preimport.py); default the command as it is."""
    vdir = artifacts.VariantDir(variant_dir)
    vdir.root.mkdir(parents=True, exist_ok=True)
    job_path = vdir.root / JOB_JSON
    write_job(job_path, job)  # the real endpoint URL and engine args: the owner's eyes only
    started = time.time()
    outcome = VariantOutcome(name=variant.name, exit_code=-1, seconds=0.0)
    watchdog = Watchdog(stall_timeout_s)
    failure: str | None = None
    worker_env = env or variant.process_env()
    command = [variant.python, "-m", "evalpipe.worker.main", str(job_path)]
    if starter is not None:
        command = starter.command(variant.python, command, worker_env)
    with open(log_path or vdir.engine_log, "ab") as log:
        proc = guarded_popen(command, WORKER_GRACE_S, stdout=subprocess.PIPE, stderr=log, env=worker_env, text=True, bufsize=1)
        try:
            if on_start is not None:
                on_start(proc)
            assert proc.stdout is not None
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                event = read_event(line) if line else None
                if event is not None:
                    if isinstance(event, ErrorEvent):
                        outcome.error = event.message
                    watchdog.see(event, time.monotonic())
                    on_event(event)
                stop_if_interrupted()
                if timeout_s is not None and time.time() - started > timeout_s:
                    failure = f"variant `{variant.name}` exceeded its time limit of {timeout_s:g}s and was stopped"
                    break
                if watchdog.stalled(time.monotonic()):
                    outcome.stalled = True
                    log_file = stall_log or log_path or vdir.engine_log
                    failure = (f"variant `{variant.name}` made no progress for {stall_timeout_s:g}s (the stall "
                               f"limit; {watchdog.describe(time.monotonic())}) and was stopped.\n"
                               f"last lines of {log_file}:\n{log_tail(log_file)}")
                    break
            if failure is None:
                proc.wait()
        finally:
            stop_group(proc)
    outcome.exit_code = ExitCode.FAILED if failure else proc.returncode
    if failure:
        outcome.error = failure
    cause = stopped() if stopped is not None else None
    if cause:
        outcome.exit_code, outcome.error = 3, cause
    if outcome.exit_code != 0 and outcome.error is None:
        outcome.error = silent_exit_message(variant.name, proc.returncode, log_path or vdir.engine_log)
    outcome.seconds = time.time() - started
    return outcome


def silent_exit_message(name: str, code: int, log: Path) -> str:
    """The cause of a worker's end when it could not say it itself (killed, or died in
    native code): the signal by name, what usually sends it, and the log's last lines."""
    number = -code if code < 0 else code - 128 if code > 128 else None
    try:
        how = f"was killed by {signal.Signals(number).name}" if number else f"exited with code {code}"
    except ValueError:
        how = f"exited with code {code}"
    causes: dict[int | None, str] = {  # Signals are ints: looked up by the number
        signal.SIGKILL: " (the kernel's out-of-memory killer sends it when memory runs out: see `dmesg`)",
        signal.SIGSEGV: " (a crash in native code: vLLM, torch or a device library)",
        signal.SIGABRT: " (an abort in native code: vLLM, torch or a device library)",
    }
    why = causes.get(number, "")
    return f"the worker of variant `{name}` {how}{why} without saying why.\nlast lines of {log}:\n{log_tail(log)}"
