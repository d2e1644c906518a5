"""evalpipe/cluster/placement.py, against a stand-in for Ray's API (placement itself on a
real cluster is tests/cluster/test_cluster_runs.py): a unit that cannot be placed fails in
one sentence naming what it asks for and what the cluster has, and its group is removed;
the wait goes on while the run's own variants hold what it needs; a stopping run ends the
wait; and a spread over distinct nodes says what each unit asks for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evalpipe.cluster import placement
from evalpipe.cluster.placement import PlacementFailed, asked_spread, wait_ready


class NeverReady:
    """Ray with one live node whose placement group never becomes ready."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self, refs, timeout):
        self.waits += 1
        return [], refs

    def nodes(self):
        return [{"NodeID": "n1", "NodeManagerAddress": "127.0.0.1", "NodeManagerHostname": "node-a",
                 "Resources": {"CPU": 1.0, "memory": 1e9}, "Alive": True}]


def _group():
    return SimpleNamespace(ready=lambda: "ready-ref")


def test_a_unit_that_cannot_be_placed_fails_naming_what_it_asks_and_what_there_is(monkeypatch):
    released = []
    monkeypatch.setattr(placement, "release", lambda ray, group: released.append(group))
    group = _group()
    with pytest.raises(PlacementFailed) as failed:
        wait_ready(NeverReady(), group, what="variant sp", asked="{CPU: 4}", address="127.0.0.1:6379", timeout_s=0.0,
                   say=lambda line: None, cancelled=lambda: False)
    sentence = str(failed.value)
    assert sentence.startswith("variant sp could not be placed on the Ray cluster at 127.0.0.1:6379 within 0s")
    assert "{CPU: 4}" in sentence and "node-a (CPU 1" in sentence and "placement_timeout_s" in sentence
    assert released == [group]


def test_the_wait_goes_on_while_the_run_s_own_variants_hold_the_room(monkeypatch):
    ray = NeverReady()
    holding = iter([True, True, True, False])  # the others end after three checks
    monkeypatch.setattr(placement, "release", lambda ray, group: None)
    with pytest.raises(PlacementFailed):
        wait_ready(ray, _group(), what="v", asked="{CPU: 1}", address="a:1", timeout_s=0.0,
                   say=lambda line: None, cancelled=lambda: False, busy=lambda: next(holding, False))
    assert ray.waits >= 4


def test_a_stopping_run_ends_the_wait():
    with pytest.raises(PlacementFailed, match="the run is stopping"):
        wait_ready(NeverReady(), _group(), what="variant b", asked="{CPU: 1}", address="a:1", timeout_s=3600,
                   say=lambda line: None, cancelled=lambda: True)


def test_a_spread_says_what_each_unit_asks_for():
    assert asked_spread([{"CPU": 1, "node_a": 1}, {"CPU": 2.5}]) == "2 distinct nodes, with {CPU: 1, node_a: 1}; {CPU: 2.5}"
