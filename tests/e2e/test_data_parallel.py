"""Data parallel 1 vs 2 behind vLLM's real server (configs/data_parallel.yaml): the
configuration vLLM's offline engine refuses, run end to end on this CPU machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from processes import wait_gone

from evalpipe.install import default_config

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 1.5  # alone on the 2-core machine: the longest modules start first (tests/conftest.py)


def test_dp1_vs_dp2_runs_and_passes(tmp_path):
    config = default_config().parent / "data_parallel.yaml"
    proc = subprocess.run([sys.executable, "-m", "evalpipe", "run", "gsm8k", "-c", str(config), "--limit", "8",
                           "--no-noise-floor", "--output", str(tmp_path), "--run-id", "dp"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "dp"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["verdict"] in ("IDENTICAL", "EQUIVALENT")
    # two engine cores really served dp2, one served dp1
    assert "EngineCore_DP1" in (run_dir / "dp2" / "engine.log").read_text()
    assert "EngineCore_DP1" not in (run_dir / "dp1" / "engine.log").read_text()
    args = (run_dir / "dp2" / "server-args.yaml").read_text()
    assert "data-parallel-size: 2" in args
    # the path probes saw every engine core: one for dp1, two for dp2 (DP indexes 0 and 1),
    # each building the layout model and running the legacy path
    for variant, indexes in (("dp1", [0]), ("dp2", [0, 1])):
        processes = json.loads((run_dir / variant / "probes.json").read_text())["processes"]
        cores = [p for p in processes if p["role"] == "engine_core"]
        assert sorted(p["switches"]["data_parallel_index"] for p in cores) == indexes, processes
        assert all(p["models"][0]["model_class"] == "evalpipe.lab.layout.model.LayoutForCausalLM" for p in cores)
        assert all(p["models"][0]["forwards"] > 0 for p in cores)
    dp2 = json.loads((run_dir / "compare.json").read_text())["comparisons"][0]
    assert dp2["paths"]["status"] == "verified", dp2["paths"]
    assert "model built in 2 processes" in " ".join(dp2["paths"]["reasons"])
    assert wait_gone("dp", 10) == [], "a finished run left processes behind"
