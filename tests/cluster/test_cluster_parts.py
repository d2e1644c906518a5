"""The pure parts of running on a Ray cluster, without Ray: the `cluster:` settings, the
watchdog while a variant waits for the reference, the worker's wait for the reference's sequences; and the evidence that vLLM's
CPU build cannot run an engine over Ray nodes (what tests/e2e/test_run.py cannot show)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalpipe.config.errors import ConfigError
from evalpipe.config.loading import parse_config
from evalpipe.documents.worker_events import read_event
from evalpipe.errors import UserError
from evalpipe.execution.watchdog import Watchdog

BASE = {
    "model": {"path": "builtin:tiny-gsm"},
    "variants": {"a": {}, "b": {"resources": {"NPU": 16, "pair_b": 1}}},
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot"}]},
}


def config(**more):
    return parse_config({**BASE, **more})


def test_a_config_without_cluster_runs_here():
    assert not config().cluster.enabled
    assert config(cluster={"address": "auto"}).cluster.enabled


@pytest.mark.parametrize("resources, said", [
    ({}, "mapping of Ray resource names"),
    ({"NPU": -1}, "not an amount"),
    ({"NPU": True}, "not an amount"),
    ({"NPU": float("nan")}, "not an amount"),
    ({"": 1}, "not a name"),
])
def test_bad_resources_are_refused_in_one_sentence(resources, said):
    with pytest.raises(ConfigError, match=said):
        config(cluster={"address": "auto", "resources": resources})
    with pytest.raises(ConfigError, match=said):
        parse_config({**BASE, "variants": {"a": {"resources": resources}}})


def test_the_watchdog_rests_while_a_variant_waits_for_the_reference():
    dog = Watchdog(10)
    dog.see(read_event(json.dumps({"event": "stage", "stage": "engine_ready", "message": "up"})), 0)
    dog.see(read_event(json.dumps({"event": "stage", "stage": "waiting", "message": "waiting"})), 5)
    assert not dog.stalled(500), "waiting for another variant is not a hang"
    dog.see(read_event(json.dumps({"event": "stage", "stage": "teacher", "message": "teacher"})), 500)
    assert not dog.stalled(509) and dog.stalled(511)


class _Events:
    def __init__(self):
        self.seen = []

    def emit(self, event, **fields):
        self.seen.append((event, fields))


def _manifest(path: Path, **fields) -> None:
    from evalpipe.documents.manifest import VariantManifest, write_manifest

    base = {"variant": "ref", "status": "running", "started_at": 0.0}
    write_manifest(path / "manifest.json", VariantManifest.model_validate({**base, **fields}))


def test_the_worker_waits_for_the_reference_to_end(tmp_path):
    from evalpipe.worker.main import wait_for_reference

    ref = tmp_path / "ref"
    ref.mkdir()
    _manifest(ref, status="failed", error="its engine died")
    events = _Events()
    with pytest.raises(UserError, match="the reference failed .its engine died"):
        wait_for_reference(ref, events, poll_s=0.01)
    assert events.seen == []  # it had ended: nothing to wait for
    _manifest(ref, status="ok", artifacts={})
    wait_for_reference(ref, events, poll_s=0.01)


def test_vllms_cpu_build_cannot_run_an_engine_over_ray_nodes():
    """vLLM's Ray executor and Ray data parallelism place one rank per `ray_device_key`
    resource; its CPU platform has none ("current platform cpu does not support ray",
    vllm/v1/executor/ray_utils.py). When this fails, vLLM's CPU build has learned it:
    add the multi-node engine to tests/e2e/test_run.py."""
    from vllm.platforms.cpu import CpuPlatform

    assert CpuPlatform.ray_device_key == ""


def _node(i: int, **total: float):
    from evalpipe.cluster.session import NodeCapacity

    return NodeCapacity(node_id=f"n{i}" * 8, ip="10.0.0.%d" % i, hostname=f"h{i}", total=total, alive=True)


def test_placeable_is_a_matching_of_units_to_nodes():
    from evalpipe.cluster.checks import unplaceable

    nodes = [_node(1, NPU=16, a=1), _node(2, NPU=16), _node(3, NPU=8)]
    three = [("x", {"NPU": 16.0}), ("y", {"NPU": 8.0}), ("z", {"NPU": 16.0, "a": 1.0})]
    assert unplaceable(three, nodes, distinct=True) == [], "z on n1, x on n2, y on n3"
    crowded = [("x", {"NPU": 16.0}), ("y", {"NPU": 16.0}), ("z", {"NPU": 16.0})]
    assert unplaceable(crowded, nodes, distinct=False) == []
    assert "cannot each have a node of their own among 3" in unplaceable(crowded, nodes, distinct=True)[0]
    assert unplaceable([("w", {"NPU": 32.0})], nodes, distinct=False) == \
        ["w asks for {NPU: 32}, which no live node has in all"]


def test_every_node_that_differs_from_the_driver_is_named():
    from evalpipe.cluster.checks import NodeFacts, version_problems

    driver = NodeFacts("d", "drv", "2.60.0", "0.9", "3.11", {})
    same = NodeFacts("a" * 16, "h1", "2.60.0", "0.9", "3.11", {})
    old = NodeFacts("b" * 16, "h2", "2.59.0", None, "3.11", {})
    assert version_problems(driver, [same]) == []
    assert version_problems(driver, [same, old]) == [
        "node h2 (bbbbbbbbbbbb) has Ray 2.59.0, the driver 2.60.0",
        "node h2 (bbbbbbbbbbbb) has evalpipe not installed, the driver 0.9"]


def test_a_ray_placed_engine_needs_its_ranks_of_one_device_in_the_whole_cluster():
    from evalpipe.cluster.checks import devices_short

    two_a3 = [_node(i, CPU=192.0, NPU=16.0) for i in range(2)]
    assert devices_short(32, two_a3) is None and devices_short(16, two_a3) is None
    assert devices_short(33, two_a3) == "the live nodes hold {NPU: 32} in all"
    assert devices_short(1, [_node(0, CPU=2.0, node_a=1.0)]) == "no live node has a device resource"
