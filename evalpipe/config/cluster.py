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

from pydantic import Field, field_validator, model_validator

from evalpipe.config.strict import Strict

# The ports Ray listens on by default, named where an address leaves its port out.
GCS_PORT = 6379
CLIENT_PORT = 10001
CLIENT_SCHEME = "ray://"
ADDRESS_FORMS = "HOST:PORT of the Ray head's GCS, ray://HOST:PORT of its Ray Client server, or auto"


def address_problem(address: str) -> str | None:
    """What is wrong with a Ray cluster address as written (None: its form is right; whether
    a cluster answers there is the driver's to find out, :mod:`evalpipe.cluster.session`)."""
    if not address.strip():
        return f"is empty; give {ADDRESS_FORMS}"
    if any(c.isspace() or not c.isprintable() for c in address):
        return f"holds a space or a control character; give {ADDRESS_FORMS}"
    if address == "auto":
        return None
    if address == "local":
        # ray.init("local") starts a private one-node cluster inside the driver: not a cluster run
        return ("would start a private one-node Ray cluster inside evalpipe, not run on a cluster; give "
                f"{ADDRESS_FORMS} (`python -m evalpipe.cluster.local up` starts a cluster of several nodes on this machine)")
    rest = address.removeprefix(CLIENT_SCHEME)
    if "://" in rest:
        scheme = rest.split("://", 1)[0]
        return f"has the scheme {scheme}://, which Ray does not connect to; give {ADDRESS_FORMS}"
    default = CLIENT_PORT if address.startswith(CLIENT_SCHEME) else GCS_PORT
    if "/" in rest:
        return f"holds a path ({rest[rest.index('/'):]}); give {ADDRESS_FORMS}"
    host, colon, port = rest.rpartition(":")
    if not colon or not host.strip("[]"):
        return f"names no port; give HOST:PORT, e.g. {rest or 'HOST'}:{default} (Ray's default there)"
    if not port.isdigit() or not port.isascii():
        return f"has the port {port!r}, which is not a number; give HOST:PORT, e.g. {host}:{default}"
    if not 1 <= int(port) <= 65535:
        return f"has the port {port}, out of range; a port is 1 to 65535 ({default} is Ray's default there)"
    return None


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
    if not any(value.values()):
        # Ray refuses a placement group bundle that asks for nothing
        raise ValueError("every amount is 0, and Ray places no bundle that asks for nothing; give at least one amount > 0")
    return {str(k): float(v) for k, v in value.items()}


class ClusterSettings(Strict):

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

    @field_validator("address")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        problem = None if value is None else address_problem(value)
        if problem is not None:
            raise ValueError(f"the address {value!r} {problem}")
        return value

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
