"""What `evalpipe doctor` checks of a Ray cluster: facts gathered on every live node by a
small Ray task, and judgements over them that are plain functions (tested without Ray).

- versions: every node's Ray, evalpipe and Python (major.minor) are the driver's;
- placeable: each unit's demand fits some live node's total resources, and with
  `distinct_nodes` all units fit on nodes of their own at once (a matching, not a schedule:
  Ray places the run);
- engine ranks: an engine that places its own ranks through Ray finds that many devices
  in the cluster (in all: vLLM's placement group spreads them as it likes);
- present: on every node that could run a variant, its interpreter and the model directory.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from typing import Any

from evalpipe.cluster.session import NodeCapacity, describe_resources
from evalpipe.config.ray_engine import DEVICE_RESOURCES

# What a node holds that says nothing about whether a variant fits it.
_IGNORED = ("memory", "object_store_memory")


@dataclass(frozen=True)
class NodeFacts:
    node_id: str
    hostname: str
    ray: str
    evalpipe: str | None  # None: not installed there
    python: str  # major.minor
    present: dict[str, bool]  # path -> an executable file or a directory is there


def node_facts(paths: list[str]) -> dict[str, Any]:
    """Run on a node (a Ray task pinned to it): its versions and which paths exist. Standard
    library and Ray only, so a node without this evalpipe still answers."""
    import ray

    try:
        from importlib.metadata import version

        evalpipe = version("evalpipe")
    except Exception:  # noqa: BLE001 - not installed (or broken): said as such
        evalpipe = None
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "ray": ray.__version__,
        "evalpipe": evalpipe,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "present": {p: (os.path.isdir(p) or (os.path.isfile(p) and os.access(p, os.X_OK))) for p in paths},
    }


def gather(ray: Any, live: list[NodeCapacity], paths: list[str], timeout_s: float = 120.0) -> list[NodeFacts]:
    """node_facts on every live node (a task of no resources, so a busy node answers too)."""
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import evalpipe.cluster.checks as this

    ray.cloudpickle.register_pickle_by_value(this)  # the node need not import this evalpipe
    task = ray.remote(num_cpus=0)(node_facts)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote(paths)
            for n in live]
    return [NodeFacts(**answer) for answer in ray.get(refs, timeout=timeout_s)]


def version_problems(driver: NodeFacts, facts: list[NodeFacts]) -> list[str]:
    problems = []
    for node in facts:
        for what, mine, theirs in (("Ray", driver.ray, node.ray), ("evalpipe", driver.evalpipe, node.evalpipe),
                                   ("Python", driver.python, node.python)):
            if mine != theirs:
                problems.append(f"node {node.hostname} ({node.node_id[:12]}) has {what} {theirs or 'not installed'}, "
                                f"the driver {mine}")
    return problems


def fits(demand: dict[str, float], total: dict[str, float]) -> bool:
    return all(total.get(name, 0.0) >= amount for name, amount in demand.items() if name not in _IGNORED)


def unplaceable(demands: list[tuple[str, dict[str, float]]], live: list[NodeCapacity], distinct: bool) -> list[str]:
    """Sentences for the units no node can ever hold (each alone), and with ``distinct`` for
    a set of units that cannot all have a node of their own."""
    problems = [f"{name} asks for {describe_resources(demand)}, which no live node has in all"
                for name, demand in demands if not any(fits(demand, n.total) for n in live)]
    if distinct and not problems and _matching(demands, live) is None:
        problems.append(f"{len(demands)} variants ({', '.join(n for n, _ in demands)}) cannot each have a node of their "
                        f"own among {len(live)} live node(s)")
    return problems


def deployment_short(name: str, demand: dict[str, float], nodes: int, live: list[NodeCapacity]) -> str | None:
    """A deployment of ``nodes`` nodes, each a bundle of ``demand`` on a node of its own: None
    when that many live nodes could each hold one, else the sentence saying how many can."""
    holding = [n for n in live if fits(demand, n.total)]
    if len(holding) >= nodes:
        return None
    return (f"{name} is a deployment over {nodes} nodes, each asking for {describe_resources(demand)} on a node of its "
            f"own, and {len(holding)} of the {len(live)} live node(s) can hold one; add nodes, or lower `resources:` "
            "or `launch.deployment.nodes`")


def devices_short(ranks: int, live: list[NodeCapacity]) -> str | None:
    """For an engine that places ``ranks`` one-device ranks itself through Ray: None when the
    live nodes hold that many of some device in all, else what they hold."""
    totals = {key: sum(n.total.get(key, 0.0) for n in live) for key in DEVICE_RESOURCES}
    if any(amount >= ranks for amount in totals.values()):
        return None
    held = {key: amount for key, amount in totals.items() if amount}
    return f"the live nodes hold {describe_resources(held)} in all" if held else "no live node has a device resource"


def _matching(demands: list[tuple[str, dict[str, float]]], live: list[NodeCapacity]) -> dict[str, str] | None:
    """Unit -> node, every unit on a node of its own that holds it (None: there is none)."""
    taken: dict[str, str] = {}  # node id -> unit

    def place(i: int) -> bool:
        if i == len(demands):
            return True
        name, demand = demands[i]
        for node in live:
            if node.node_id not in taken and fits(demand, node.total):
                taken[node.node_id] = name
                if place(i + 1):
                    return True
                del taken[node.node_id]
        return False

    return {unit: node for node, unit in taken.items()} if place(0) else None
