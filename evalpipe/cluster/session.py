"""Connecting this process (the driver) to the Ray cluster a config names, and describing
what the cluster has, in the words a failure sentence needs."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from evalpipe.cluster.loopback import LOOPBACK, is_loopback, pin_to_loopback
from evalpipe.config.cluster import CLIENT_PORT, GCS_PORT
from evalpipe.errors import UserError

# The namespace of evalpipe's actors: `ray list actors` tells them from others'.
NAMESPACE = "evalpipe"
# Resources that say nothing about a node's capacity for a variant.
_BOOKKEEPING = ("memory", "object_store_memory")
# How long the head's port may take to accept a connection: Ray's own attempt at a dead
# address retries for minutes before it gives up.
REACH_TIMEOUT_S = 5.0


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
    unreachable = _port_problem(address)
    if unreachable is not None:
        why, listens = unreachable
        raise ClusterUnavailable(_not_a_cluster(address, why) if listens else _cannot_reach(address, why))
    kwargs: dict[str, Any] = {}
    if is_loopback(address) and not address.startswith("ray://"):
        pin_to_loopback()
        kwargs["_node_ip_address"] = LOOPBACK
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR,
                 configure_logging=False, **kwargs)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, its own auth errors ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterUnavailable(_cannot_reach(address, first)) from None
    return ray


def _cannot_reach(address: str, why: str) -> str:
    return (f"cannot reach the Ray cluster at {address} ({why}); start it (`ray start --head` on its head node) "
            "or give its address with `cluster.address` / --cluster (HOST:PORT of the head, ray://HOST:PORT or auto).")


def _not_a_cluster(address: str, why: str) -> str:
    return f"no Ray cluster answers at {address}: {why}; give the head's address with `cluster.address` / --cluster."


def head_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) the address connects to first: the GCS of HOST:PORT, the Ray Client
    server of ray://HOST:PORT, for `auto` the cluster RAY_ADDRESS or the last `ray start`
    on this machine names; None when that is not known here."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or ""
        if not address or address == "auto":
            try:
                from ray._private.utils import read_ray_address  # where `ray start` recorded its head

                address = read_ray_address() or ""
            except Exception:  # noqa: BLE001 - a private API: without it, Ray looks for itself
                return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


# What a gRPC server (Ray's GCS and its Ray Client server are) answers to the HTTP/2
# client preface and an empty SETTINGS frame: a SETTINGS frame of its own (type 4).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS_FRAME_TYPE = 4


def _port_problem(address: str, timeout_s: float | None = None) -> tuple[str, bool] | None:
    """Why the address's head port is not Ray's, and whether something listens there (None:
    a gRPC server answers there, or the port is not known here and Ray finds it itself).
    Ray's own attempt at a dead address, or at a port where something else listens, retries
    for minutes before it gives up."""
    endpoint = head_endpoint(address)
    if endpoint is None:
        return None
    host, port = endpoint
    timeout_s = REACH_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(_HTTP2_PREFACE)
            answer = _first_bytes(conn, 9)
    except OSError as err:
        return f"nothing answers on {host}:{port}: {err.strerror or type(err).__name__}", False
    other = _not_ray(answer, host, port, timeout_s)
    return None if other is None else (other, True)


def _first_bytes(conn: socket.socket, count: int) -> bytes | None:
    """Up to ``count`` bytes of the server's answer; None: it said nothing in the socket's timeout."""
    got = b""
    try:
        while len(got) < count:
            chunk = conn.recv(count - len(got))
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        return got or None
    except OSError:
        pass
    return got


def _not_ray(answer: bytes | None, host: str, port: int, timeout_s: float) -> str | None:
    if answer is not None and len(answer) == 9 and answer[3] == _SETTINGS_FRAME_TYPE:
        return None
    where = f"{host}:{port}"
    hint = (f"the GCS listens on the port `ray start --head --port` gave ({GCS_PORT} by default), the Ray Client "
            f"server on {CLIENT_PORT}; the dashboard's port (8265) is not one to connect to")
    if answer is None:
        return f"something on {where} accepts connections but says nothing in {timeout_s:g} s, where Ray answers at once; {hint}"
    if answer.startswith(b"HTTP/") or answer.lstrip().lower().startswith((b"<!doctype", b"<html")):  # a status line, or HTTP/0.9's page
        return f"an HTTP server answers on {where}, not Ray's GCS (a gRPC server); {hint}"
    if not answer:
        return f"something on {where} closes the connection without a word, where Ray's GCS answers; {hint}"
    return f"something on {where} answers, but not as Ray's GCS (a gRPC server) does; {hint}"


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
    return describe_nodes(live, free_by_node or None)


def describe_nodes(live: list[NodeCapacity], free_by_node: dict[str, dict[str, float]] | None = None) -> str:
    """The nodes and what each has (of its total; free now too when ``free_by_node`` is known)."""
    described = [n.describe(free_by_node.get(n.node_id)) if free_by_node is not None else n.describe() for n in live]
    return f"{len(live)} node{'s' if len(live) != 1 else ''}: " + "; ".join(described)


def describe_resources(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_amount(v)}" for k, v in sorted(resources.items())) + "}"


def _amount(value: float) -> str:
    return f"{value:g}"
