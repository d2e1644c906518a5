"""The default A/B on the real engine (vLLM's CPU build), on a real three-node Ray cluster on
127.0.0.1: `legacy`, its A/A run and `sp` at once, each on a node of its own, give the
local sequential run's verdict, byte-identical tables and the same path evidence (every
engine process's probe records came back from its node into probes.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from processes import wait_gone
from ray_cluster import leftovers, local_cluster

from evalpipe.install import default_config
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import sha256_of, verify_variant

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 4  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 8
TABLES = (artifacts.SAMPLES_PARQUET, artifacts.TOKENS_PARQUET, artifacts.TEACHER_PARQUET)


def evalpipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalpipe", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("e2e-cluster")
    with local_cluster() as cluster:
        cfg = {"extends": str(default_config()), "output": str(tmp / "runs"), "noise_floor": True,
               "cluster": {"address": cluster.address, "distinct_nodes": True, "scratch": str(tmp / "scratch")}}
        path = tmp / "ab.yaml"
        path.write_text(yaml.safe_dump(cfg))
        there = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "there", cwd=tmp)
        left = leftovers(cluster)
        gone = wait_gone("there", 30)
    here = evalpipe("run", "gsm8k", "-c", str(path), "--limit", str(LIMIT), "--run-id", "here", "--cluster", "off", cwd=tmp)
    return {"here": here, "there": there, "dir": tmp / "runs", "left": left, "gone": gone}


def comparisons(run_dir: Path) -> dict:
    return {c["variant"]: c for c in json.loads((run_dir / "compare.json").read_text())["comparisons"]}


def test_the_cluster_run_has_the_local_verdict_and_bytes(runs):
    here, there = runs["here"], runs["there"]
    assert here.returncode == 0, here.stdout[-3000:] + here.stderr[-3000:]
    assert there.returncode == 0, there.stdout[-3000:] + there.stderr[-3000:]
    local, remote = comparisons(runs["dir"] / "here"), comparisons(runs["dir"] / "there")
    assert {n: c["status"] for n, c in remote.items()} == {n: c["status"] for n, c in local.items()}
    info = json.loads((runs["dir"] / "there" / "run.json").read_text())
    assert info["verdict"] == json.loads((runs["dir"] / "here" / "run.json").read_text())["verdict"]
    assert len({p["node_id"] for p in info["placements"].values()}) == 3
    for variant in ("legacy", "legacy-aa", "sp"):
        verify_variant(artifacts.VariantDir(runs["dir"] / "there" / variant))
        for table in TABLES:
            assert sha256_of(runs["dir"] / "there" / variant / table) == sha256_of(runs["dir"] / "here" / variant / table), \
                f"{variant}/{table}"


def test_every_engine_process_on_every_node_reported_its_path(runs):
    local, remote = comparisons(runs["dir"] / "here"), comparisons(runs["dir"] / "there")
    for name, c in remote.items():
        assert c["paths"]["status"] == "verified", (name, c["paths"])
        assert c["paths"]["what_ran"] == local[name]["paths"]["what_ran"], name
    for variant in ("legacy", "legacy-aa", "sp"):
        probes = json.loads((runs["dir"] / "there" / variant / artifacts.PROBES_JSON).read_text())
        assert probes["processes"] and probes["unreadable"] == [], f"{variant}: its processes' probe records did not come back"


def test_nothing_is_left_on_the_cluster(runs):
    assert runs["left"]["actors"] == [] and runs["left"]["groups"] == [], runs["left"]
    assert runs["gone"] == []
