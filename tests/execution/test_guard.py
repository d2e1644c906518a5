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
STUBBORN = ["bash", "-c", "trap '' TERM; echo trapped; sleep 600 & wait"]  # ignores SIGTERM, as a hung engine does


# How a parent dies: kill -9 alone, or as a Ray worker leaves (it SIGKILLs its direct
# children, the guards, before it exits; their children are not its business).
KILL_ITSELF = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
KILL_GUARDS_FIRST = (
    "import os, signal\n"
    "for guard in guards:\n    os.kill(guard.pid, signal.SIGKILL)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


@pytest.mark.parametrize("death", [KILL_ITSELF, KILL_GUARDS_FIRST], ids=["parent-sigkill", "guards-killed-first"])
def test_the_group_dies_with_evalpipe_even_by_sigkill(tmp_path, death):
    run_id = f"guard-kill9-{len(death)}"
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys, time\nfrom evalpipe.execution.launch import guarded_popen\n"
        f"guards = [guarded_popen({TREE!r}, 2.0), guarded_popen({STUBBORN!r}, 2.0)]\n"
        "print('started', flush=True)\nsys.stdin.readline()\n" + death
    )
    env = {**os.environ, RUN_ID_ENV: run_id, "PYTHONPATH": str(Path(launch.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "started"
        deadline = time.time() + 10
        # parent, 2 guards, their 2 watchers, 5 below them
        while len(processes_of(run_id)) < 10 and time.time() < deadline:
            time.sleep(0.1)
        assert len(processes_of(run_id)) >= 10
        proc.stdin.write("die\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == -signal.SIGKILL  # no handler, no cleanup of its own
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
    proc = launch.guarded_popen(STUBBORN, 600.0, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "trapped"  # bash ignores SIGTERM from here on
    monkeypatch.setattr(launch, "interrupts", [signal.SIGINT, signal.SIGINT])
    started = time.monotonic()
    launch.stop_group(proc, grace_s=600.0)
    # half the grace: a margin no busy machine eats, and no run of stop_group that waits out the grace meets
    assert time.monotonic() - started < 300, "with two interrupts recorded, stop_group must not wait out the grace"
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
