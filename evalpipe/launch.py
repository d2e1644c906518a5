"""Start one worker process per variant and follow it.

Each worker runs under the variant's interpreter and environment, in its own
process group (vLLM spawns an engine-core child; stopping the group stops both).
stdout carries JSON-line events; stderr is the variant's engine.log, or worker.log
when a server (serve mode) writes engine.log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evalpipe import artifacts
from evalpipe.plan import PlannedVariant

EventHandler = Callable[[dict[str, Any]], None]

# Signals the user sent to stop the run (SIGINT, SIGTERM), recorded by the handler that
# raises KeyboardInterrupt. A KeyboardInterrupt raised where Python swallows exceptions
# (a finalizer, a callback) is lost; the run loops check this list too, so a Ctrl-C
# stops the run even then.
interrupts: list[int] = []


def stop_if_interrupted() -> None:
    if interrupts:
        raise KeyboardInterrupt


@dataclass
class VariantOutcome:
    name: str
    exit_code: int
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process's whole group (vLLM's engine-core child may outlive its
    parent), wait up to ``grace_s``, then SIGKILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if proc.poll() is None:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.2)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait()


def run_worker(
    variant: PlannedVariant,
    job: dict[str, Any],
    variant_dir: Path,
    on_event: EventHandler,
    timeout_s: float | None = None,
    log_path: Path | None = None,
    stopped: Callable[[], str | None] | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> VariantOutcome:
    """Run the variant's worker to its end. ``log_path``: where its stderr goes (default
    engine.log). ``stopped``: asked when the worker ends; a message means something
    outside it (its server died) ended it, and becomes the variant's error."""
    vdir = artifacts.VariantDir(variant_dir)
    vdir.root.mkdir(parents=True, exist_ok=True)
    job_path = vdir.root / "job.json"
    artifacts.write_json(job_path, job)
    started = time.time()
    outcome = VariantOutcome(name=variant.name, exit_code=-1, seconds=0.0)
    timed_out = False
    with open(log_path or vdir.engine_log, "ab") as log:
        proc = subprocess.Popen(
            [variant.python, "-m", "evalpipe.worker.main", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=variant.process_env(),
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        try:
            if on_start is not None:
                on_start(proc)
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a stray print that escaped the redirection; engine.log has the rest
                if event.get("event") == "error":
                    outcome.error = event.get("message")
                on_event(event)
                stop_if_interrupted()
                if timeout_s is not None and time.time() - started > timeout_s:
                    raise TimeoutError
            proc.wait(timeout=timeout_s and max(timeout_s - (time.time() - started), 1))
        except (TimeoutError, subprocess.TimeoutExpired):
            timed_out = True
            outcome.error = f"variant `{variant.name}` exceeded its time limit of {timeout_s:.0f}s and was stopped"
        finally:
            stop_group(proc)
    outcome.exit_code = 3 if timed_out else proc.returncode
    cause = stopped() if stopped is not None else None
    if cause:
        outcome.exit_code, outcome.error = 3, cause
    if outcome.exit_code != 0 and outcome.error is None:
        outcome.error = f"worker of variant `{variant.name}` exited with code {proc.returncode}; see {log_path or vdir.engine_log}"
    outcome.seconds = time.time() - started
    return outcome
