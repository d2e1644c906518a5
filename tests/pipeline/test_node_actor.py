"""evalpipe/pipeline/node_actor.py without a cluster (the actor on one: tests/cluster/): the plan
as a node sees it (its own run directory, a nightly's baseline moved there, no baseline
invented), and the actor's own bookkeeping -- the driver's thread count restored, the
engine pointed at the actor's cluster, an earlier attempt's scratch copy removed, directories
packed on one node and unpacked on another, events polled from where the driver left
off, stop() stopping the unit as Ctrl-C does. Only Ray's runtime context is stood in for."""

from __future__ import annotations

import filecmp
import os
import signal
from types import SimpleNamespace

import pytest
import ray
from fakes import make_samples, write_run
from plans import fake_plan

from evalpipe.documents.run_doc import RunModel
from evalpipe.documents.worker_events import StageEvent
from evalpipe.execution import launch
from evalpipe.pipeline.launching import Limits
from evalpipe.pipeline.node_actor import UnitActor, UnitJob, for_node


def test_the_plan_as_a_node_sees_it(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {}}, "r1")
    node = for_node(plan, tmp_path / "node" / "r1", tmp_path / "node" / "baseline")
    assert node.run_dir == tmp_path / "node" / "r1" and node.teacher_baseline_dir is None, "no baseline, none invented"
    assert (node.run_id, [v.name for v in node.variants]) == ("r1", ["a", "b"])
    assert plan.run_dir == tmp_path / "runs" / "r1", "the driver's plan is left as it was"
    plan.teacher_baseline_dir = tmp_path / "history" / "night-03" / "a"
    assert for_node(plan, tmp_path / "node" / "r1", tmp_path / "node" / "baseline").teacher_baseline_dir == tmp_path / "node" / "baseline"


@pytest.fixture
def actor_of(tmp_path, monkeypatch):
    """UnitActor as Ray would construct it on a node of the cluster at 10.0.0.1:6379."""
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address="10.0.0.1:6379"))
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # what Ray sets in an actor; restored after the test
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def make(run_dir, *, scratch=False, omp=None):
        plan = for_node(fake_plan(tmp_path, {"a": {}, "b": {}}, "r1"), run_dir, None)
        return UnitActor(UnitJob(plan=plan, variants=["a", "b"], model=RunModel(path="/m"), names={}, limits=Limits(),
                                 driver_omp_threads=omp, scratch=scratch))

    return make


def test_the_actor_takes_the_driver_s_thread_count_and_the_cluster_s_address(tmp_path, actor_of):
    actor_of(tmp_path / "shared" / "r1", omp="4")
    assert os.environ["OMP_NUM_THREADS"] == "4" and os.environ["RAY_ADDRESS"] == "10.0.0.1:6379"
    actor_of(tmp_path / "shared" / "r1")
    assert "OMP_NUM_THREADS" not in os.environ, "none set by hand: none for the engine either"


def test_an_earlier_attempt_s_scratch_copy_is_removed_and_a_shared_directory_kept(tmp_path, actor_of):
    for where in ("scratch", "shared"):
        (tmp_path / where / "r1" / "a").mkdir(parents=True)
    actor_of(tmp_path / "scratch" / "r1", scratch=True)
    actor_of(tmp_path / "shared" / "r1", scratch=False)
    assert not (tmp_path / "scratch").exists() and (tmp_path / "shared" / "r1" / "a").is_dir()


def test_a_variant_packed_on_one_node_is_unpacked_on_another(tmp_path, actor_of):
    run = write_run(tmp_path / "one" / "r1", {"a": make_samples(3)})
    packed = actor_of(run).pack("a")
    other = actor_of(tmp_path / "two" / "r1")
    other.put_dir("a", packed)
    other.put_dir(str(tmp_path / "baseline" / "a"), packed)  # an absolute path: a nightly's baseline
    for target in (tmp_path / "two" / "r1" / "a", tmp_path / "baseline" / "a"):
        assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in (run / "a").iterdir())
        assert filecmp.cmp(target / "samples.parquet", run / "a" / "samples.parquet", shallow=False)
    other.clear_scratch()
    assert not (tmp_path / "two").exists()


def test_events_are_polled_from_where_the_driver_left_off_and_stop_stops_as_ctrl_c_does(tmp_path, actor_of, monkeypatch):
    actor = actor_of(tmp_path / "shared" / "r1")
    for i in range(3):
        actor._emit("a", StageEvent(stage="node", message=f"step {i}"))
    events, done, outcomes, failure = actor.poll(1)
    assert [(v, StageEvent.model_validate_json(e).message) for v, e in events] == [("a", "step 1"), ("a", "step 2")]
    assert (done, outcomes, failure) == (False, {}, None)
    monkeypatch.setattr(launch, "interrupts", [])
    actor.stop()
    assert launch.interrupts == [signal.SIGTERM]
