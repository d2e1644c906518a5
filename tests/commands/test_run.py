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
    for bad, what in [("", "is empty"), (" ", "is empty"), ("a b", "holds a space"), ("local", "would start a private one-node"),
                      ("http://head:8265", "has the scheme http://"), ("ray://head", "names no port; give HOST:PORT, e.g. head:10001"),
                      ("head", "names no port; give HOST:PORT, e.g. head:6379"), ("head:x", "has the port 'x', which is not a number"),
                      ("head:70000", "has the port 70000, out of range"), ("head:6379/x", "holds a path")]:
        with pytest.raises(UserError, match=f"^--cluster '{bad}' {what}".replace("(", r"\(")):
            with_cluster(cfg, bad)


def test_concurrency_and_distinct_nodes_on_the_command_line():
    cfg = config(cluster={"address": "auto", "distinct_nodes": True})
    # an option never drops a config setting it cannot coexist with: it is refused, naming the setting
    with pytest.raises(UserError, match=r"--concurrency 2 cannot limit .* \(`cluster.distinct_nodes: true`\); add --any-nodes"):
        with_cluster(cfg, None, concurrency=2)
    lifted = with_cluster(cfg, None, concurrency=2, distinct_nodes=False)
    assert lifted.cluster.concurrency == 2 and not lifted.cluster.distinct_nodes
    limited = config(cluster={"address": "auto", "concurrency": 2})
    with pytest.raises(UserError, match="the config limits them to `cluster.concurrency: 2`"):
        with_cluster(limited, None, distinct_nodes=True)
    assert with_cluster(limited, None, concurrency=3).cluster.concurrency == 3
    assert not with_cluster(limited, None, distinct_nodes=False).cluster.distinct_nodes
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
