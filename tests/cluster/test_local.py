"""evalpipe/cluster/local.py without starting Ray (a real local cluster is what the session
`cluster` fixture starts for tests/cluster/): a node's resources from the command line, the
`ray start` arguments that pin a node to the loopback, and the mark by which every process
of a local cluster is found and stopped, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from evalpipe.cluster.local import MARK_ENV, _node_args, _parse_node, main, marked_pids, stop_marked


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


@pytest.mark.parametrize("node, says", [
    ("CPU=1,x", "'x' in 'CPU=1,x' is not NAME=AMOUNT"),
    ("=1", "'=1' in '=1' is not NAME=AMOUNT"),
    ("CPU=two", "CPU='two' in 'CPU=two' is not a number"),
    ("CPU=1,CPU=2", "CPU is given twice"),
    ("CPU=-1", "resource `CPU`: -1.0 is not an amount"),
    ("CPU=0,a=0", "every amount is 0"),
    ("CPU=1.5", "`ray start` takes a whole number of CPUs"),
    ("CPU=nan", "not an amount"),
])
def test_a_malformed_node_is_refused_in_one_sentence_before_anything_starts(node, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["up", "--node", "CPU=1", "--node", node, "--dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "error: argument --node: " in err and says in err, err
    assert "Traceback" not in err and not (tmp_path / "c").exists(), "nothing started, nothing made"


def test_a_dir_that_is_a_file_is_refused_and_down_says_when_there_is_nothing_to_stop(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for verb in (["up", "--node", "CPU=1"], ["down"]):
        with pytest.raises(SystemExit) as refused:
            main([*verb, "--dir", str(tmp_path / "f")])
        assert refused.value.code == 2 and "exists and is not a directory" in capsys.readouterr().err
    assert main(["down", "--dir", str(tmp_path / "none")]) == 0
    assert "no local cluster runs under" in capsys.readouterr().err


def test_down_says_what_it_stopped(tmp_path, capsys):
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, MARK_ENV: str(tmp_path)})
    try:
        assert main(["down", "--dir", str(tmp_path)]) == 0
        assert mine.wait(timeout=60) != 0
        assert f"stopped the local cluster under {tmp_path} (1 process)" in capsys.readouterr().err
    finally:
        mine.kill()
        mine.wait()
