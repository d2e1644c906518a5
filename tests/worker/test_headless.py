"""The headless entry (evalpipe/worker/headless.py) parses vLLM's own serve flags and runs
only headless nodes; a head's flags are refused before any engine starts. The node it
runs joining a real head is tests/e2e/test_deployment.py."""

from __future__ import annotations

import subprocess
import sys


def test_a_node_without_headless_is_refused_in_vllm_s_parser_s_words():
    out = subprocess.run([sys.executable, "-m", "evalpipe.worker.headless", "--model", "m", "--data-parallel-size", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "this entry runs headless nodes only; add --headless" in out.stderr


def test_an_api_server_count_is_refused_with_headless():
    out = subprocess.run([sys.executable, "-m", "evalpipe.worker.headless", "--model", "m", "--headless",
                          "--api-server-count", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "cannot be used with --headless" in out.stderr, out.stderr[-2000:]
