"""A deployment's node on a Ray node (evalpipe/pipeline/deployment_nodes.py): the NodeActor's
work as plain calls (the probes' spec written where the node's processes look for it, the
process started with the environment the deployment adds, its log and this node's records
packed, nothing else), and RayNode's answers when the actor is gone. The same on a real
cluster: tests/cluster/test_cluster_runs.py (a deployment placed by Ray, a node that dies)."""

from __future__ import annotations

import io
import sys
import tarfile
from types import SimpleNamespace

from evalpipe.config.deployment import NodeRole
from evalpipe.execution.deployment import NodeCommand
from evalpipe.pipeline.deployment_nodes import LOST, NodeActor, RayNode
from evalpipe.probes import SPEC_ENV


def test_the_node_actor_runs_its_process_with_the_spec_and_packs_only_its_node_s_files(tmp_path):
    vdir = tmp_path / "run" / "spread"
    spec = vdir / "probes" / "spec.json"
    (vdir / "probes").mkdir(parents=True)
    (vdir / "probes" / "node0-11.json").write_text("{}")  # the head's: not this node's to send
    (vdir / "probes" / "node1-22.json").write_text("{}")
    actor = NodeActor(driver_omp_threads="1")
    script = "import os, pathlib; print(os.environ['MARK'], pathlib.Path(os.environ['EVALPIPE_PROBES']).read_text())"
    command = NodeCommand(NodeRole(1, 1, 1, ()), [sys.executable, "-c", script], vdir / "node-1.log")
    actor.start(command, {"MARK": "node-one", SPEC_ENV: str(spec)}, 5, {str(spec): b"the spec"})
    assert actor.wait() == 0 and not actor.running()
    log = (vdir / "node-1.log").read_text()
    assert "node-one the spec" in log, log
    with tarfile.open(fileobj=io.BytesIO(actor.collect(str(vdir), 1)), mode="r") as tar:
        assert sorted(tar.getnames()) == ["node-1.log", "probes/node1-22.json"]


def test_the_spec_is_replaced_whole_so_a_process_reading_it_on_another_node_never_sees_it_half_written(tmp_path):
    """Nodes of one machine (or of a shared filesystem) share the spec's path: the head's
    process may be reading it while node 1's actor writes it. Written in place, a reader
    that opened it just before saw it truncated (no probes on that node, the run
    INCONCLUSIVE); replaced by a rename, the reader keeps the whole file it opened."""
    vdir = tmp_path / "spread"
    spec = vdir / "probes" / "spec.json"
    spec.parent.mkdir(parents=True)
    spec.write_bytes(b'{"attempt": 1}')  # an earlier attempt's (a resumed run)
    actor = NodeActor(driver_omp_threads=None)
    command = NodeCommand(NodeRole(1, 1, 1, ()), [sys.executable, "-c", "pass"], vdir / "node-1.log")
    with open(spec, "rb") as reading:  # a process on another node, opening the spec as the actor writes
        actor.start(command, {SPEC_ENV: str(spec)}, 5, {str(spec): b'{"attempt": 2, "longer": true}'})
        assert reading.read() == b'{"attempt": 1}', "the file being read was rewritten in place"
    assert actor.wait() == 0
    assert spec.read_bytes() == b'{"attempt": 2, "longer": true}'
    assert sorted(p.name for p in spec.parent.iterdir()) == ["spec.json"], "nothing but the spec is left beside it"


class _Gone(Exception):
    pass


def _ray(get):
    return SimpleNamespace(get=get, exceptions=SimpleNamespace(RayError=_Gone))


def test_a_node_whose_actor_is_gone_reads_as_lost_and_says_how(tmp_path):
    def gone(*_args, **_kwargs):
        raise _Gone("The actor died unexpectedly before finishing this task.")

    runner = RayNode.__new__(RayNode)
    runner.ray, runner.index, runner.lost = _ray(gone), 1, None
    runner.actor = SimpleNamespace(wait=SimpleNamespace(remote=lambda: None), running=SimpleNamespace(remote=lambda: None),
                                   stop=SimpleNamespace(remote=lambda _g: None))
    assert runner.wait() == LOST
    assert runner.ended_how(LOST) == ("was lost with its Ray actor, its node gone or unreachable (_Gone: The actor "
                                      "died unexpectedly before finishing this task.)")
    assert runner.running() is False
    runner.stop(1)  # a gone actor's stop is no error: its guard took the process down


def test_a_node_s_files_come_back_into_the_head_s_variant_directory(tmp_path):
    node_dir = tmp_path / "node"
    (node_dir / "probes").mkdir(parents=True)
    (node_dir / "node-1.log").write_text("joined\n")
    (node_dir / "probes" / "node1-5.json").write_text("{}")
    packed = NodeActor(None).collect(str(node_dir), 1)
    runner = RayNode.__new__(RayNode)
    runner.ray, runner.index, runner.lost = _ray(lambda value, timeout=None: value), 1, None
    runner.actor = SimpleNamespace(collect=SimpleNamespace(remote=lambda _v, _i: packed))
    head = tmp_path / "head"
    (head / "probes").mkdir(parents=True)
    (head / "probes" / "node0-4.json").write_text("{}")
    runner.bring_back(head)
    assert sorted(str(p.relative_to(head)) for p in head.rglob("*") if p.is_file()) == [
        "node-1.log", "probes/node0-4.json", "probes/node1-5.json"]
    calls: list = []
    runner.actor = SimpleNamespace(start=SimpleNamespace(remote=lambda *a: calls.append(a)))
    command = NodeCommand(NodeRole(1, 1, 1, ()), ["x"], head / "node-1.log")
    spec = head / "probes" / "spec.json"
    spec.write_text('{"spec": 1}')
    runner.start(command, {SPEC_ENV: str(spec)}, {"A": "1"}, 5)
    (sent, forwarded, grace, files), = calls
    # the spec travels with the start, to be written at the same path on the node
    assert files == {str(spec): b'{"spec": 1}'} and forwarded == {"A": "1", SPEC_ENV: str(spec)}
    assert sent.argv == ["x"] and sent.log_path == head / "node-1.log" and grace == 5
