"""`evalpipe nightly -c A -c B` on a real Ray cluster of three nodes on 127.0.0.1: the two
configs' nights run at once, each recorded in the shared history as a single night is,
and nothing is left on the cluster. The exit code is the most serious night's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ray_cluster import leftovers, write_config

from evalpipe.errors import ExitCode
from evalpipe.history.store import open_history
from evalpipe.nightly.several import labels_of, worst
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV


def test_the_most_serious_night_decides_the_exit_code():
    assert worst([0, 4, 1]) == ExitCode.DIVERGENT and worst([0, 3, 2]) == ExitCode.USER_ERROR
    assert worst([0, 0]) == 0 and worst([0, 130, 3]) == 130 and worst([4, 0]) == ExitCode.INCONCLUSIVE
    assert labels_of([Path("a/x.yaml"), Path("b/y.yaml")]) == ["x", "y"]
    assert labels_of([Path("a/x.yaml"), Path("b/x.yaml")]) == ["x-1", "x-2"]


def nightly_config(tmp: Path, name: str, address: str) -> Path:
    return write_config(tmp, name, {"ref": {}, "same": {"expect": {"same_path": True}}}, {"address": address},
                        env={FAKE_ENGINE_ENV: "delay=0.2"}, nightly={"dashboard": str(tmp / "dashboard" / "index.html")})


def test_two_configs_nights_run_at_once_and_are_both_recorded(cluster, tmp_path):
    a, b = nightly_config(tmp_path, "a", cluster.address), nightly_config(tmp_path, "b", cluster.address)
    done = subprocess.run([sys.executable, "-m", "evalpipe", "nightly", "-c", str(a), "-c", str(b), "--limit", "4",
                           "--run-id", "night"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert "2 configs at once" in done.stdout and "[a] " in done.stdout and "[b] " in done.stdout
    spans = {}
    for label in ("a", "b"):
        info = json.loads((tmp_path / "runs" / f"night-{label}" / "run.json").read_text())
        assert info["kind"] == "nightly" and info["status"] == "ok" and set(info["placements"]) == {"ref", "same"}
        spans[label] = (info["started_at"], info["started_at"] + info["timings"]["total_s"])
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], f"the nights did not overlap: {spans}"
    recorded = {r.run_id for r in open_history(None, tmp_path / "runs", access="read").runs()}
    assert {"night-a", "night-b"} <= recorded
    left = leftovers(cluster)
    assert left["actors"] == [] and left["groups"] == []
