"""evalpipe/execution/launch.py, its parts outside a whole run (the worker's lifecycle is
tests/execution/test_watchdog.py and tests/execution/test_guard.py): a process group started
guarded and stopped as a group, a worker's silent end said with its signal, what usually
sends it and its log's last lines, and a log's tail read from its end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from evalpipe.execution import launch
from evalpipe.execution.launch import log_tail, silent_exit_message


def test_a_log_s_tail_is_its_last_lines_and_a_missing_log_is_empty(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert log_tail(log, 3) == "line 99997\nline 99998\nline 99999"
    assert log_tail(tmp_path / "missing.log") == ""


def test_a_silent_end_is_said_with_its_signal_its_usual_cause_and_the_log(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("loading weights\nKilled\n")
    killed = silent_exit_message("sp", -signal.SIGKILL, log)
    assert killed.startswith("the worker of variant `sp` was killed by SIGKILL (the kernel's out-of-memory killer")
    assert killed.endswith("loading weights\nKilled")
    assert "was killed by SIGSEGV (a crash in native code" in silent_exit_message("sp", 128 + signal.SIGSEGV, log)
    assert "exited with code 3 without saying why" in silent_exit_message("sp", 3, log)


def test_a_guarded_process_group_is_stopped_whole(tmp_path):
    # the child starts a grandchild in its group: stopping the group takes both
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); print('up', flush=True); time.sleep(600)"
    proc = launch.guarded_popen([sys.executable, "-c", script], grace_s=2.0, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        started = time.monotonic()
        launch.stop_group(proc, grace_s=2.0)
        assert proc.poll() is not None and time.monotonic() - started < 300, "stopped, not ended by itself (it sleeps 600 s)"
        # the signal reached every member; the kernel ends them (and init reaps the orphaned
        # grandchild) a moment after the group's leader is gone
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode == 1, "nothing of the group is left"
    finally:
        if proc.poll() is None:
            proc.kill()
