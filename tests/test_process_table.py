"""The machine's live processes (evalpipe/process_table.py): zombies are not live, and a
process is found by an entry of its environment."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from evalpipe.process_table import RUN_ID_ENV, carrying, group_alive


def _state(pid: int) -> bytes:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]


def test_a_group_of_zombies_is_not_alive_though_killpg_still_finds_it():
    """The guard's watcher stays a zombie until init reaps it (seconds on some machines):
    stopping a worker must not wait for that."""
    done = subprocess.Popen(["true"], start_new_session=True)  # a zombie until this test waits for it
    running = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        while _state(done.pid) != b"Z":
            time.sleep(0.01)
        os.killpg(done.pid, 0)  # no ProcessLookupError: the kernel still counts the zombie
        assert not group_alive(done.pid)
        assert group_alive(running.pid)
    finally:
        running.kill()
        running.wait()
        done.wait()
    assert not group_alive(running.pid)


def test_a_process_is_found_by_an_entry_of_its_environment_and_a_zombie_is_not(tmp_path):
    mark = f"EVALPIPE_TEST_MARK={tmp_path}"
    env = {**os.environ, "EVALPIPE_TEST_MARK": str(tmp_path)}
    running = subprocess.Popen(["sleep", "60"], env=env)
    done = subprocess.Popen(["true"], env=env)
    longer = subprocess.Popen(["sleep", "60"], env={**env, "EVALPIPE_TEST_MARK": f"{tmp_path}-other"})
    try:
        while _state(done.pid) != b"Z":
            time.sleep(0.01)
        # the value whole: a mark that only begins with it is another's
        assert carrying(mark) == [running.pid]
    finally:
        for proc in (running, longer):
            proc.kill()
            proc.wait()
        done.wait()
    assert carrying(mark) == []


def test_the_scripts_that_run_without_evalpipe_look_for_the_same_run_mark():
    from evalpipe.execution import forkserver, reaper

    assert forkserver.RUN_MARK == RUN_ID_ENV
    assert reaper.RUN_ENV == f"{RUN_ID_ENV}=".encode()
