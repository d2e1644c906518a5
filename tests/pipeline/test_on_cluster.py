"""evalpipe/pipeline/on_cluster.py, its plan without Ray (the runs themselves are tests/cluster/test_cluster_runs.py): how variants group into units (an offline A/A run a unit of its own, a served one in its variant's unit), what each unit asks the cluster for, and a resumed run's units without what it kept."""

from __future__ import annotations

from evalpipe.pipeline.on_cluster import demand_of, units_of
from evalpipe.pipeline.plan import make_plan
from tests.cluster.test_cluster_parts import config


def test_units_and_what_each_asks_for(tmp_path):
    cfg = config(cluster={"address": "auto", "resources": {"NPU": 32}}, noise_floor=True, output=str(tmp_path))
    plan = make_plan(cfg, "cfg.yaml", "gsm8k", strict=False)
    units = units_of(plan, kept=[])
    assert [[v.name for v in u] for u in units] == [["a"], ["a-aa"], ["b"]], "offline: the A/A run is a unit of its own"
    assert [demand_of(plan, u) for u in units] == [{"NPU": 32.0}, {"NPU": 32.0}, {"NPU": 16.0, "pair_b": 1.0}]
    assert [[v.name for v in u] for u in units_of(plan, kept=["a"])] == [["a-aa"], ["b"]]


def test_an_aa_run_that_reuses_the_servers_runs_in_its_unit(tmp_path):
    cfg = config(cluster={"address": "auto"}, launch={"mode": "serve"}, noise_floor={"reuse_server": True},
                 output=str(tmp_path))
    plan = make_plan(cfg, "cfg.yaml", "gsm8k", strict=False)
    assert [[v.name for v in u] for u in units_of(plan, kept=[])] == [["a", "a-aa"], ["b"]]
