"""Keep a Ray cluster on the loopback on the loopback.

Ray rewrites 127.0.0.1 to the machine's outward address wherever it meets it (`ray start
--node-ip-address 127.0.0.1`, `ray.init(address="127.0.0.1:PORT")`): its nodes then
advertise, and its driver looks for, an address the cluster on the loopback never
listens on. A cluster started on this machine for tests or a laptop must stay on
127.0.0.1 (nothing listens on the network), so both the nodes evalpipe starts
(:mod:`evalpipe.cluster.ray_cli`) and a driver whose cluster address is a loopback one
pin Ray's two address look-ups to the loopback before Ray starts anything.
"""

from __future__ import annotations

import ipaddress

LOOPBACK = "127.0.0.1"


def is_loopback(address: str) -> bool:
    """HOST:PORT (or ray://HOST:PORT) whose host is this machine's loopback."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pin_to_loopback() -> None:
    """Make this process's Ray take 127.0.0.1 as this node's address (call before ray.init)."""
    import ray._private.services as services

    services.resolve_ip_for_localhost = lambda host: host
    services.get_node_ip_address = lambda address=None: LOOPBACK
