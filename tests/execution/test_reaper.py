"""The reaper (evalpipe/execution/reaper.py), run on a node through its launcher when a
deployment stops: it ends the processes marked with its deployment and node, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from evalpipe.execution import reaper


def test_the_reaper_ends_the_processes_of_its_run_and_node_only(tmp_path):
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    mine = subprocess.Popen(sleep, env={**os.environ, "EVALPIPE_DEPLOYMENT": "reap", "EVALPIPE_NODE": "1"})
    other_node = subprocess.Popen(sleep, env={**os.environ, "EVALPIPE_DEPLOYMENT": "reap", "EVALPIPE_NODE": "2"})
    other_run = subprocess.Popen(sleep, env={**os.environ, "EVALPIPE_DEPLOYMENT": "reap2", "EVALPIPE_NODE": "1"})
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
