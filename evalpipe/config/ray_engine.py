"""A variant whose vLLM engine places its own ranks through Ray, on a cluster.

With `distributed_executor_backend: ray` (or `data_parallel_backend: ray`) vLLM asks Ray
for one bundle per rank, `{NPU: 1}` each, and creates its own placement group for them
when the process that builds the engine is not a Ray actor inside one (vLLM's
`initialize_ray_cluster` and its data-parallel actor manager). evalpipe's worker and
`vllm serve` are such processes: they run under the unit's actor, not as it. So the
unit must hold only what that process needs (its CPUs); a unit that also held the
devices would leave vLLM's placement group waiting for them for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAY_BACKEND_ARGS = ("distributed_executor_backend", "data_parallel_backend")
# Ray's names for the devices vLLM's platforms ask for (their `ray_device_key`).
DEVICE_RESOURCES = ("NPU", "GPU", "HPU", "TPU")


@dataclass(frozen=True)
class RayPlacedEngine:
    """What such an engine will ask Ray for on its own."""

    backend_args: tuple[str, ...]  # the engine arguments that chose Ray
    ranks: int  # tensor x pipeline x data parallel: one device bundle each, wherever the backend splits them

    def describe(self) -> str:
        chosen = ", ".join(f"{arg}: ray" for arg in self.backend_args)
        return f"its engine places its {self.ranks} rank(s) itself through Ray ({chosen}), one device bundle each"


def _size(engine_args: Mapping[str, Any], name: str) -> int:
    value = engine_args.get(name)  # vLLM's engine arguments: an open mapping, absent means 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def ray_placed_engine(engine_args: Mapping[str, Any]) -> RayPlacedEngine | None:
    chosen = tuple(arg for arg in RAY_BACKEND_ARGS if engine_args.get(arg) == "ray")
    if not chosen:
        return None
    ranks = 1
    for size in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        ranks *= _size(engine_args, size)
    return RayPlacedEngine(backend_args=chosen, ranks=ranks)


def held_devices_problem(variant: str, engine_args: Mapping[str, Any], demand: Mapping[str, float]) -> str | None:
    """One sentence when ``variant``'s unit would hold devices its Ray-placed engine needs."""
    engine = ray_placed_engine(engine_args)
    held = {name: amount for name, amount in demand.items() if name in DEVICE_RESOURCES and amount > 0}
    if engine is None or not held:
        return None
    shown = ", ".join(f"{name}: {amount:g}" for name, amount in held.items())
    return (f"variant `{variant}`: {engine.describe()}, but its unit's resources also hold {{{shown}}}, which vLLM's "
            f"placement group would then wait for for ever; give the variant `resources:` without devices "
            f"(such as {{CPU: 8}}, what its worker or API server needs) and leave the devices to vLLM.")
