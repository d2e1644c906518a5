"""Connecting this process (the driver) to the Ray cluster a config names, and describing
what the cluster has, in the words a failure sentence needs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from evalpipe.cluster.loopback import LOOPBACK, is_loopback, pin_to_loopback
from evalpipe.errors import UserError

# The namespace of evalpipe's actors: `ray list actors` tells them from others'.
NAMESPACE = "evalpipe"
# Resources that say nothing about a node's capacity for a variant.
_BOOKKEEPING = ("memory", "object_store_memory")


class ClusterUnavailable(UserError):
    """Ray is missing, or the cluster cannot be reached (exit code 2: the config or the command's fault)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable(
            "the run is to use a Ray cluster (`cluster.address` or --cluster) but Ray is not installed in this "
            "environment; install it with `pip install 'evalpipe[cluster]'` (the nodes need the same Ray version).") from None
    return ray


def connect(address: str) -> Any:
    """ray, initialised as a driver of the cluster at ``address`` (its output kept off this
    terminal: evalpipe reports what its variants do)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {}
    if is_loopback(address) and not address.startswith("ray://"):
        pin_to_loopback()
        kwargs["_node_ip_address"] = LOOPBACK
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR,
                 configure_logging=False, **kwargs)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, its own auth errors ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterUnavailable(
            f"cannot reach the Ray cluster at {address} ({first}); start it (`ray start --head` on its head node) "
            "or give its address with `cluster.address` / --cluster (HOST:PORT of the head, ray://HOST:PORT or auto).") from None
    return ray


def disconnect() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


@dataclass(frozen=True)
class NodeCapacity:
    node_id: str
    ip: str
    hostname: str
    total: dict[str, float]
    alive: bool

    def describe(self, free: dict[str, float] | None = None) -> str:
        shown = {k: v for k, v in self.total.items() if k not in _BOOKKEEPING and not k.startswith("node:")}
        parts = [f"{k} {_amount(free.get(k, 0.0))}/{_amount(v)} free" if free is not None else f"{k} {_amount(v)}"
                 for k, v in sorted(shown.items())]
        return f"{self.hostname or self.ip} ({', '.join(parts) or 'no resources'})"


def nodes(ray: Any) -> list[NodeCapacity]:
    return [NodeCapacity(node_id=n["NodeID"], ip=n["NodeManagerAddress"], hostname=n.get("NodeManagerHostname", ""),
                         total=dict(n.get("Resources") or {}), alive=bool(n.get("Alive")))
            for n in ray.nodes()]


def describe_cluster(ray: Any) -> str:
    """Every live node and what it has (free now, of its total)."""
    live = [n for n in nodes(ray) if n.alive]
    free_by_node: dict[str, dict[str, float]] = {}
    try:
        from ray._private.state import available_resources_per_node

        free_by_node = {node_id: dict(res) for node_id, res in available_resources_per_node().items()}
    except Exception:  # noqa: BLE001 - a private API: without it, totals only
        free_by_node = {}
    described = [n.describe(free_by_node.get(n.node_id)) if free_by_node else n.describe() for n in live]
    return f"{len(live)} node{'s' if len(live) != 1 else ''}: " + "; ".join(described)


def describe_resources(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_amount(v)}" for k, v in sorted(resources.items())) + "}"


def _amount(value: float) -> str:
    return f"{value:g}"
