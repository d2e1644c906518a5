"""evalpipe/commands/run.py: `evalpipe run`'s cluster options over the config (--cluster ADDRESS|off, --concurrency, --distinct-nodes / --any-nodes), a bad address refused in one sentence."""

from __future__ import annotations

import pytest

from evalpipe.commands.run import with_cluster
from evalpipe.config.errors import ConfigError
from evalpipe.errors import UserError
from tests.cluster.test_cluster_parts import config


def test_cluster_option_overrides_the_config():
    cfg = config(cluster={"address": "10.0.0.1:6379", "distinct_nodes": True})
    assert with_cluster(cfg, None) is cfg
    assert with_cluster(cfg, "off").cluster.address is None
    moved = with_cluster(cfg, "ray://head:10001")
    assert moved.cluster.address == "ray://head:10001" and moved.cluster.distinct_nodes
    for bad in ("", " ", "a b"):
        with pytest.raises(UserError, match="not a cluster address"):
            with_cluster(cfg, bad)


def test_concurrency_and_distinct_nodes_on_the_command_line():
    cfg = config(cluster={"address": "auto", "distinct_nodes": True})
    assert with_cluster(cfg, None, concurrency=2).cluster.concurrency == 2
    assert not with_cluster(cfg, None, concurrency=2).cluster.distinct_nodes, "--concurrency alone lifts the spread"
    spread = with_cluster(config(cluster={"address": "auto", "concurrency": 2}), None, distinct_nodes=True)
    assert spread.cluster.distinct_nodes and spread.cluster.concurrency is None
    with pytest.raises(UserError, match="remove one of the two"):
        with_cluster(cfg, None, concurrency=2, distinct_nodes=True)
    with pytest.raises(UserError, match="out of range"):
        with_cluster(cfg, None, concurrency=0)
    with pytest.raises(UserError, match="applies to a run on a Ray cluster"):
        with_cluster(config(), None, distinct_nodes=True)
    with pytest.raises(ConfigError, match="remove one of the two"):
        config(cluster={"address": "auto", "distinct_nodes": True, "concurrency": 3})


def test_the_plan_says_how_each_task_decodes():
    from evalpipe.commands.run import describe_sampling
    from evalpipe.config.sampling import Sampling

    assert describe_sampling(None) == "greedy"
    assert describe_sampling(Sampling(temperature=0.6, samples=4, seed=1234)) == \
        "sampled: temperature 0.6; 4 per item, seeds from 1234"
    assert describe_sampling(Sampling(temperature=1, top_p=0.95, top_k=40, min_p=0.05, seed=7)) == \
        "sampled: temperature 1, top_p 0.95, top_k 40, min_p 0.05; 1 per item, seeds from 7"
