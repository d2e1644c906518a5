"""evalpipe/cluster/local.py without starting Ray (a real local cluster is what the session
`cluster` fixture starts for tests/cluster/): a node's resources from the command line, the
`ray start` arguments that pin a node to the loopback, and the mark by which every process
of a local cluster is found and stopped, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from evalpipe.cluster.local import MARK_ENV, _node_args, _parse_node, marked_pids, stop_marked


def test_a_node_s_resources_from_the_command_line_become_ray_start_arguments():
    resources = _parse_node("CPU=2, node_a=1,NPU=0.5")
    assert resources == {"CPU": 2.0, "node_a": 1.0, "NPU": 0.5}
    args = _node_args(resources)
    assert args[args.index("--num-cpus") + 1] == "2" and args[args.index("--node-ip-address") + 1] == "127.0.0.1"
    assert json.loads(args[args.index("--resources") + 1]) == {"node_a": 1.0, "NPU": 0.5}
    assert "--resources" not in _node_args({"CPU": 1})


def test_the_processes_of_a_cluster_are_found_by_its_mark_and_stopped(tmp_path):
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, MARK_ENV: str(tmp_path)})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, MARK_ENV: str(tmp_path / "another")})
    try:
        assert marked_pids(tmp_path) == [mine.pid]
        stop_marked(tmp_path, grace_s=5.0)
        assert mine.wait(timeout=10) != 0 and marked_pids(tmp_path) == []
        assert other.poll() is None, "another cluster's process is left alone"
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
