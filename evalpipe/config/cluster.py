"""`cluster:` of a run config: run the variants on a Ray cluster instead of one after another here.

Absent (or `address: null`), a run is local and sequential, as it always was. With an
address, every variant (with the A/A run that reuses its server, if any) is one unit
placed by Ray in a placement group of its own resources; the units run at once up to
`concurrency`, and with `distinct_nodes` every unit lands on a node of its own (one
STRICT_SPREAD placement group for the run). evalpipe schedules nothing itself.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# What each variant asks of its node when the config names nothing: one CPU for the
# worker that drives the engine (the engine's own devices are the variant's `resources`).
DEFAULT_RESOURCES: dict[str, float] = {"CPU": 1.0}


def _check_resources(value: Any) -> Any:
    if value is None:
        return value
    if not isinstance(value, dict) or not value:
        raise ValueError("give a mapping of Ray resource names to amounts, e.g. {NPU: 16} or {CPU: 1, node_a: 1}")
    for name, amount in value.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"resource name {name!r} is not a name; use Ray's resource names (CPU, NPU, GPU or a custom one)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise ValueError(f"resource `{name}`: {amount!r} is not an amount; give a number >= 0")
    return {str(k): float(v) for k, v in value.items()}


class ClusterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = Field(
        default=None,
        description="Ray cluster to run the variants on: `auto` (the cluster this node belongs to), HOST:PORT of its head "
                    "(GCS), or ray://HOST:PORT (Ray Client). null: run here, one variant after another (the default).")
    resources: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_RESOURCES),
        description="What each variant's engine asks of the cluster (Ray resources, e.g. {NPU: 32}); a variant may "
                    "ask for other amounts with its own `resources:`.")
    concurrency: int | None = Field(default=None, ge=1, description="Variants running at once (default: all of them).")
    distinct_nodes: bool = Field(default=False, description="Every variant on a node of its own (all placed at once).")
    shared_filesystem: bool = Field(
        default=False,
        description="The nodes see the run directory at the driver's path (NFS, a shared volume): workers write there. "
                    "false: they write under `scratch` on their node and the artifacts come back to the driver through Ray.")
    scratch: str = Field(default="/tmp/evalpipe-cluster", min_length=1,
                         description="Node-local directory of the variants' run directories when the filesystem is not shared.")
    placement_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False,
                                       description="How long a variant waits for the cluster to place it before it fails.")

    _resources = field_validator("resources", mode="before")(_check_resources)

    @model_validator(mode="after")
    def _spread_places_all_at_once(self) -> "ClusterSettings":
        if self.distinct_nodes and self.concurrency is not None:
            raise ValueError("`distinct_nodes` places every variant at once, each on a node of its own, so "
                             "`concurrency` cannot limit them; remove one of the two.")
        return self

    @property
    def enabled(self) -> bool:
        return self.address is not None


def check_variant_resources(value: Any) -> Any:
    """A variant's own `resources:` (validator shared with the Variant model)."""
    return _check_resources(value)
