"""Nothing evalpipe starts outlives it: the guard (evalpipe/execution/guard.py) takes a worker's or
server's whole process group down when evalpipe dies, even by SIGKILL, and a second
Ctrl-C kills what the first one is still stopping politely. Real processes, no engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import processes_of, wait_gone

from evalpipe.execution import launch
from evalpipe.pipeline.plan import RUN_ID_ENV

# A command with a child and a grandchild, as a worker has an engine core and a resource tracker.
TREE = ["bash", "-c", "sleep 600 & bash -c 'sleep 600' & wait"]
STUBBORN = ["bash", "-c", "trap '' TERM; sleep 600 & wait"]  # ignores SIGTERM, as a hung engine does


def test_the_group_dies_with_evalpipe_even_by_sigkill(tmp_path):
    run_id = "guard-kill9"
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys, time\nfrom evalpipe.execution.launch import guarded_popen\n"
        f"guarded_popen({TREE!r}, 2.0)\nguarded_popen({STUBBORN!r}, 2.0)\n"
        "print('started', flush=True)\ntime.sleep(600)\n"
    )
    env = {**os.environ, RUN_ID_ENV: run_id, "PYTHONPATH": str(Path(launch.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "started"
        deadline = time.time() + 10
        while len(processes_of(run_id)) < 8 and time.time() < deadline:  # parent, 2 guards, 5 below them
            time.sleep(0.1)
        assert len(processes_of(run_id)) >= 8
        proc.kill()  # kill -9: no handler, no cleanup of its own
        proc.wait()
        # the stubborn group needs the guard's grace (2 s) and then SIGKILL
        assert wait_gone(run_id, 10) == [], "processes outlived evalpipe's SIGKILL"
    finally:
        for pid in processes_of(run_id):
            os.kill(pid, signal.SIGKILL)


def test_exit_codes_pass_through_the_guard():
    assert launch.guarded_popen(["bash", "-c", "exit 7"], 1.0).wait() == 7
    killed = launch.guarded_popen(["bash", "-c", "kill -TERM $$"], 1.0)
    assert killed.wait() == 128 + signal.SIGTERM
    for proc in (killed,):
        launch.stop_group(proc, 1.0)


def test_a_missing_command_is_refused_before_anything_starts():
    with pytest.raises(FileNotFoundError, match="no-such-command-xyz"):
        launch.guarded_popen(["no-such-command-xyz"], 1.0)


def test_a_second_interrupt_cuts_the_grace_period_short(monkeypatch):
    proc = launch.guarded_popen(STUBBORN, 60.0)
    time.sleep(0.5)  # let bash install its trap
    monkeypatch.setattr(launch, "interrupts", [signal.SIGINT, signal.SIGINT])
    started = time.monotonic()
    launch.stop_group(proc, grace_s=60.0)
    assert time.monotonic() - started < 5, "with two interrupts recorded, stop_group must not wait out the grace"
    assert proc.pid not in launch.live_groups


def test_the_second_ctrl_c_kills_every_live_group(monkeypatch):
    from evalpipe import cli

    monkeypatch.setattr(launch, "interrupts", [])
    proc = launch.guarded_popen(STUBBORN, 60.0)
    time.sleep(0.5)
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
    assert proc.poll() is None, "the first Ctrl-C only asks"
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    launch.stop_group(proc, 1.0)
