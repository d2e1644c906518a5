"""evalpipe/cluster/loopback.py: which cluster addresses are this machine's loopback (the
nodes the tests and `python -m evalpipe.cluster.local` start), and the pin that makes this
process's Ray take 127.0.0.1 as its node address."""

from __future__ import annotations

import pytest

from evalpipe.cluster.loopback import LOOPBACK, is_loopback, pin_to_loopback


@pytest.mark.parametrize("address, loop", [
    ("127.0.0.1:6379", True), ("localhost:1", True), ("ray://127.0.0.1:10001", True), ("[::1]:6379", True),
    ("10.0.0.5:6379", False), ("auto", False), ("head.example:6379", False),
])
def test_loopback_addresses(address, loop):
    assert is_loopback(address) is loop


def test_the_pin_makes_ray_see_the_loopback_as_this_node():
    import ray._private.services as services

    before = (services.resolve_ip_for_localhost, services.get_node_ip_address)
    try:
        pin_to_loopback()
        assert services.get_node_ip_address() == LOOPBACK
        assert services.resolve_ip_for_localhost("localhost") == "localhost"  # not resolved to another interface
    finally:
        services.resolve_ip_for_localhost, services.get_node_ip_address = before
