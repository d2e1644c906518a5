"""evalpipe/cluster/ray_cli.py: Ray's own `ray` command, with this node's address pinned
to the loopback, as `python -m evalpipe.cluster.local` starts the nodes of a cluster on one
machine. Pinned: it is Ray's CLI (its commands and help), run through evalpipe's module."""

from __future__ import annotations

import subprocess
import sys


def test_it_is_ray_s_own_command_line():
    out = subprocess.run([sys.executable, "-m", "evalpipe.cluster.ray_cli", "start", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--head" in out.stdout and "--num-cpus" in out.stdout and "--node-ip-address" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "evalpipe.cluster.ray_cli", "no-such-command"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no-such-command" in bad.stderr
