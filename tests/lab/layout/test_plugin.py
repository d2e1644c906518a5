"""evalpipe/lab/layout/plugin.py: vLLM's plugin entry point of the layout model stays light to import (no torch, no vLLM) — every vLLM process loads it; registering in a spawned engine is tests/lab/layout/test_model.py (the real engine, slow)."""

from __future__ import annotations


def test_importing_the_plugin_stays_light():
    import subprocess
    import sys

    code = "import sys, evalpipe.lab.layout.plugin, evalpipe.lab.layout.settings; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
