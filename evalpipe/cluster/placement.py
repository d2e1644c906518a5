"""Placement groups: how a variant asks Ray for its node's resources.

Each unit (a variant, with the A/A run that reuses its server) gets one bundle of its
resources. Without `distinct_nodes` every unit has a placement group of its own (PACK),
created when a concurrency slot frees; with it, one STRICT_SPREAD placement group holds a
bundle per unit, so Ray itself puts every unit on a different node. A placement group not
ready in time is removed and the unit fails in one sentence: what it asked for and what
the cluster has.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from evalpipe.cluster.session import describe_cluster, describe_resources
from evalpipe.errors import UserError

# How often a waiting unit says so.
WAIT_LINE_EVERY_S = 30.0


class PlacementFailed(UserError):
    """The cluster could not give a unit what it asked for in time."""


@dataclass
class Slot:
    """One unit's bundle: its placement group and index (the actor runs in it)."""

    group: Any  # ray.util.placement_group.PlacementGroup
    index: int
    resources: dict[str, float]


def wait_ready(ray: Any, group: Any, *, what: str, asked: str, address: str, timeout_s: float,
               say: Callable[[str], None], cancelled: Callable[[], bool],
               busy: Callable[[], bool] = lambda: False) -> None:
    """Block until ``group`` is placed; PlacementFailed (after removing it) once ``timeout_s``
    has passed without ``busy()`` (the run's own other variants holding what it waits for:
    it then waits for them, however long they run). ``cancelled`` ends the wait early (the
    run is stopping)."""
    started = time.monotonic()
    next_line = started + 5.0  # a placement that takes a moment says nothing
    ready = group.ready()
    while True:
        done, _ = ray.wait([ready], timeout=1.0)
        if done:
            ray.get(ready)
            return
        now = time.monotonic()
        if busy():
            started = now
        if cancelled():
            raise PlacementFailed(f"{what} was not placed: the run is stopping")
        if now - started > timeout_s:
            have = describe_cluster(ray)
            release(ray, group)
            raise PlacementFailed(
                f"{what} could not be placed on the Ray cluster at {address} within {timeout_s:g}s: it asks for "
                f"{asked}, and the cluster has {have}; lower `resources:` (cluster.resources or the variant's), "
                "free or add nodes, or raise cluster.placement_timeout_s.")
        if now >= next_line:
            waits = "until the run's other variants end" if busy() else f"{now - started:.0f}s of {timeout_s:g}s"
            say(f"{what} waits to be placed ({asked}; {waits}); the cluster has {describe_cluster(ray)}")
            next_line = now + WAIT_LINE_EVERY_S


def one_group(ray: Any, resources: dict[str, float], name: str) -> Slot:
    from ray.util.placement_group import placement_group

    return Slot(placement_group([dict(resources)], strategy="PACK", name=name), 0, dict(resources))


def spread_group(ray: Any, demands: list[dict[str, float]], name: str) -> list[Slot]:
    """One bundle per demand, each on a node of its own."""
    from ray.util.placement_group import placement_group

    group = placement_group([dict(d) for d in demands], strategy="STRICT_SPREAD", name=name)
    return [Slot(group, i, dict(d)) for i, d in enumerate(demands)]


def asked_spread(demands: list[dict[str, float]]) -> str:
    return f"{len(demands)} distinct nodes, with " + "; ".join(describe_resources(d) for d in demands)


def release(ray: Any, group: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - already removed, or the cluster is gone: nothing is left to free
        pass
