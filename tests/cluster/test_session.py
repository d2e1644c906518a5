"""evalpipe/cluster/session.py without a cluster: where an address connects first, that an
address nothing answers on fails at once in one sentence with what to do, and how the
cluster's nodes and their free resources are described in evalpipe's messages."""

from __future__ import annotations

import socket

import pytest
from listeners import http_answer, listening, silent_answer

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


def _settings_frame(conn: socket.socket) -> None:
    conn.recv(64)
    conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # what a gRPC server answers to the HTTP/2 preface


def _hangs_up(conn: socket.socket) -> None:
    conn.recv(64)


@pytest.mark.parametrize("answer, says", [
    (http_answer, "an HTTP server answers on 127.0.0.1:{port}, not Ray's GCS"),
    (silent_answer, "something on 127.0.0.1:{port} accepts connections but says nothing in 0.5 s"),
    (_hangs_up, "something on 127.0.0.1:{port} closes the connection without a word"),
])
def test_an_address_where_something_else_listens_fails_at_once_saying_what_listens(answer, says):
    with listening(answer) as port:
        problem = session._port_problem(f"127.0.0.1:{port}", timeout_s=0.5)
    assert problem is not None and problem[1], "something listens there"
    assert problem[0].startswith(says.format(port=port)) and "8265" in problem[0], problem


def test_a_grpc_server_passes_the_check_and_its_sentence_names_the_address(monkeypatch):
    with listening(_settings_frame) as port:
        assert session._port_problem(f"127.0.0.1:{port}", timeout_s=120) is None
    monkeypatch.setattr(session, "import_ray", lambda: type("Ray", (), {"is_initialized": staticmethod(lambda: False)}))
    with listening(http_answer) as port, pytest.raises(ClusterUnavailable) as failed:
        session.connect(f"127.0.0.1:{port}")
    assert str(failed.value).startswith(f"no Ray cluster answers at 127.0.0.1:{port}: an HTTP server answers")


def test_nodes_and_resources_are_described_without_ray_s_bookkeeping():
    node = NodeCapacity("n1", "10.0.0.7", "", {"CPU": 2.0, "NPU": 16.0, "memory": 8e9, "node:10.0.0.7": 1.0}, True)
    assert node.describe() == "10.0.0.7 (CPU 2, NPU 16)"
    assert node.describe({"CPU": 1.0}) == "10.0.0.7 (CPU 1/2 free, NPU 0/16 free)"
    assert "10.0.0.7" in describe_nodes([node]) and describe_resources({"NPU": 16, "CPU": 0.5}) == "{CPU: 0.5, NPU: 16}"
