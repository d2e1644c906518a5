"""evalpipe/cluster/session.py without a cluster: where an address connects first, that an
address nothing answers on fails at once in one sentence with what to do, and how the
cluster's nodes and their free resources are described in evalpipe's messages."""

from __future__ import annotations

import socket

import pytest

from evalpipe.cluster import session
from evalpipe.cluster.session import ClusterUnavailable, NodeCapacity, describe_nodes, describe_resources, head_endpoint


@pytest.mark.parametrize("address, endpoint", [
    ("10.0.0.5:6379", ("10.0.0.5", 6379)), ("ray://head:10001", ("head", 10001)), ("[::1]:6379", ("::1", 6379)),
    ("head-without-port", None),
])
def test_where_an_address_connects_first(address, endpoint):
    assert head_endpoint(address) == endpoint


def test_auto_takes_the_address_ray_address_names(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    assert head_endpoint("auto") == ("127.0.0.1", 6390)


def test_an_address_nothing_answers_on_fails_at_once_saying_what_to_do(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    monkeypatch.setattr(session, "import_ray", lambda: type("Ray", (), {"is_initialized": staticmethod(lambda: False)}))
    with pytest.raises(ClusterUnavailable) as failed:
        session.connect(f"127.0.0.1:{port}")
    sentence = str(failed.value)
    assert sentence.startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port} (nothing answers on 127.0.0.1:{port}")
    assert "`ray start --head`" in sentence and "--cluster" in sentence


def test_nodes_and_resources_are_described_without_ray_s_bookkeeping():
    node = NodeCapacity("n1", "10.0.0.7", "", {"CPU": 2.0, "NPU": 16.0, "memory": 8e9, "node:10.0.0.7": 1.0}, True)
    assert node.describe() == "10.0.0.7 (CPU 2, NPU 16)"
    assert node.describe({"CPU": 1.0}) == "10.0.0.7 (CPU 1/2 free, NPU 0/16 free)"
    assert "10.0.0.7" in describe_nodes([node]) and describe_resources({"NPU": 16, "CPU": 0.5}) == "{CPU: 0.5, NPU: 16}"
