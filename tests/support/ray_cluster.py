"""A real Ray cluster of several nodes on 127.0.0.1 for the tests (evalpipe.cluster.local),
what is left on it afterwards (actors, placement groups), asked from a fresh process, and
the fake-engine config the cluster tests run on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from evalpipe.cluster.local import LocalCluster, marked_pids, start
from evalpipe.worker.fakes.engine import FAKE_ENGINE_ENV

TASK = "gsm8k_synth_4shot"

# three nodes, each with one CPU and a resource of its own (a variant can be pinned to one)
NODES = [{"CPU": 1.0, "node_a": 1.0}, {"CPU": 1.0, "node_b": 1.0}, {"CPU": 1.0, "node_c": 1.0}]


@contextmanager
def local_cluster(nodes: list[dict[str, float]] = NODES) -> Iterator[LocalCluster]:
    """The cluster, up for the block; the driver environment (RAY_AUTH_MODE) set for it."""
    root = Path(tempfile.mkdtemp(prefix="evp-ray-", dir="/tmp"))  # short: Ray's sockets live in it
    cluster = start(nodes, root)
    saved = {k: os.environ.get(k) for k in cluster.env()}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cluster.stop()
        assert marked_pids(root) == [], "the local cluster's processes outlived it"


_STATE = """
import json, ray
from evalpipe.cluster.loopback import pin_to_loopback
pin_to_loopback()
ray.init(address=ADDRESS, _node_ip_address="127.0.0.1", logging_level="ERROR", log_to_driver=False)
from ray._private.state import actors
alive = [a.get("Name") or a["ActorID"] for a in actors().values() if a["State"] != "DEAD"]
groups = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
print(json.dumps({"actors": alive, "groups": groups, "nodes": sum(1 for n in ray.nodes() if n["Alive"])}))
"""


def leftovers(cluster: LocalCluster) -> dict:
    """Live actors (names) and placement groups not removed, and the live node count."""
    code = _STATE.replace("ADDRESS", repr(cluster.address))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **cluster.env()})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_config(tmp: Path, name: str, variants: dict, cluster: dict | None, **overrides) -> Path:
    """A config of the built-in model and the fake engine (``overrides`` replace its keys)."""
    cfg = {
        "model": {"path": "builtin:tiny-gsm"},
        "engine": {"max_model_len": 4096, "seed": 0},
        "output": str(tmp / "runs"),
        "noise_floor": False,
        # on a cluster the driver's environment stays here: the config's reaches every node
        "env": {FAKE_ENGINE_ENV: "1"},
        "capture": {"topk": 5, "teacher_forcing": True, "prompt_positions": {"min_prompt_tokens": 1 << 16}},
        "reference": next(iter(variants)),
        "variants": variants,
        "tasks": {"gsm8k": [{"task": TASK, "num_fewshot": 4}]},
        **({"cluster": cluster} if cluster is not None else {}),
        **overrides,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
