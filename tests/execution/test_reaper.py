"""The reaper (evalpipe/execution/reaper.py), run on a node through its launcher when a
deployment stops: it ends the processes marked with its deployment and node, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from evalpipe.execution import reaper

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _sleeping(**env: str) -> subprocess.Popen:
    """A process marked as a deployment's node's would be (its environment), doing nothing."""
    return subprocess.Popen(SLEEP, env={**os.environ, **env})


def test_the_reaper_ends_the_processes_of_its_run_and_node_only(tmp_path):
    mine = _sleeping(EVALPIPE_DEPLOYMENT="reap", EVALPIPE_NODE="1")
    other_node = _sleeping(EVALPIPE_DEPLOYMENT="reap", EVALPIPE_NODE="2")
    other_run = _sleeping(EVALPIPE_DEPLOYMENT="reap2", EVALPIPE_NODE="1")
    try:
        out = subprocess.run([sys.executable, "-I", reaper.__file__, "reap", "1", "5"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "ended 1 process(es) of deployment reap on node 1" in out.stdout, out
        assert mine.wait(timeout=30) == -signal.SIGTERM
        assert other_node.poll() is None and other_run.poll() is None
    finally:
        for p in (mine, other_node, other_run):
            p.kill()
            p.wait()


def test_by_run_it_ends_what_any_deployment_of_the_run_left_on_the_node(tmp_path):
    """An earlier attempt killed with SIGKILL ran no reaper; before a node starts again, the
    run's leftovers there go, whatever their deployment's token. The run's worker (no
    deployment) and other nodes stay."""
    left = _sleeping(EVALPIPE_RUN_ID="again", EVALPIPE_DEPLOYMENT="old-token", EVALPIPE_NODE="1")
    worker = _sleeping(EVALPIPE_RUN_ID="again")  # the run's own worker: in no deployment
    other_node = _sleeping(EVALPIPE_RUN_ID="again", EVALPIPE_DEPLOYMENT="old-token", EVALPIPE_NODE="2")
    try:
        out = subprocess.run([sys.executable, "-I", reaper.__file__, "--run", "again", "1", "5"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "ended 1 process(es) of run again on node 1" in out.stdout, out
        assert left.wait(timeout=30) == -signal.SIGTERM
        assert worker.poll() is None and other_node.poll() is None
    finally:
        for p in (left, worker, other_node):
            p.kill()
            p.wait()
