"""`launch.deployment:` one engine spread over several nodes, as vLLM's multi-node data
parallelism runs it: node 0, the head, runs the API server with its local data-parallel
ranks; every other node runs ranks only (`--headless --data-parallel-start-rank K`), all
meeting at the head's `--data-parallel-address` and `--data-parallel-rpc-port`.

The config says how many nodes and how the data-parallel ranks split over them; the
engine arguments keep saying the sizes (`data_parallel_size`, `tensor_parallel_size` per
rank). Everything a node's command line adds to them is derived here (:func:`node_layout`),
so no engine argument may say it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from evalpipe.config.strict import Strict

# What a node's command line says and the deployment derives: a config that sets one
# of these under `engine:` would contradict the node it runs on.
DERIVED_ARGS = ("data_parallel_size_local", "data_parallel_start_rank", "data_parallel_address",
                "data_parallel_rpc_port", "headless", "api_server_count", "data_parallel_rank")

HEADLESS_MODULE = "evalpipe.worker.headless"


class Deployment(Strict):
    """One variant's engine over `nodes` nodes (see the module's docstring)."""

    nodes: int = Field(ge=1, description="Nodes the engine spans: node 0 serves HTTP (the head), the others run "
                                         "data-parallel ranks only (headless).")
    ranks_per_node: int | list[int] | None = Field(
        default=None,
        description="Data-parallel ranks on each node: one number for every node, or a list (one entry per node, "
                    "the head's first); default: data_parallel_size split evenly.")
    address: str | None = Field(
        default=None, min_length=1,
        description="The head's address as every node reaches it (vLLM's --data-parallel-address); default: "
                    "launch.host, or on a Ray cluster the head node's address.")
    rpc_port: int | None = Field(default=None, ge=1, le=65535,
                                 description="vLLM's --data-parallel-rpc-port on the head; default: a free port.")
    launchers: list[list[str]] | None = Field(
        default=None,
        description="Without Ray: the command prefix that runs a process on each node, one per node, the head's first "
                    "([] runs it here), e.g. [kubectl, exec, POD, --], [srun, -N1, -w, NODE], [ssh, NODE]. The config's "
                    "environment travels on the command line (`env K=V ...`). Absent: every node here, or placed by Ray "
                    "when the run is on a cluster.")
    remote_shell: bool | None = Field(
        default=None,
        description="Whether the launchers hand the command to a shell on the node, which splits and reads it again "
                    "(ssh does; kubectl exec and srun pass the words as they are): then each word is quoted for that "
                    "shell. Default: true for a launcher whose command is ssh.")
    headless_command: list[str] | None = Field(
        default=None, min_length=1,
        description=f"The headless nodes' command the engine args follow; default [<variant python>, -m, {HEADLESS_MODULE}] "
                    "(`vllm serve --headless` where the vllm console command works: [vllm, serve]).")

    @field_validator("ranks_per_node")
    @classmethod
    def _positive_ranks(cls, value: int | list[int] | None) -> int | list[int] | None:
        counts = value if isinstance(value, list) else [] if value is None else [value]
        if any(isinstance(n, bool) or n < 1 for n in counts):
            raise ValueError(f"{value!r}: every node runs at least one data-parallel rank; give positive numbers")
        if isinstance(value, list) and not value:
            raise ValueError("an empty list; give one number per node, or one number for every node")
        return value

    @field_validator("launchers")
    @classmethod
    def _launchers_are_commands(cls, value: list[list[str]] | None) -> list[list[str]] | None:
        for i, prefix in enumerate(value or []):
            if any(not isinstance(word, str) or not word for word in prefix):
                raise ValueError(f"node {i}'s launcher {prefix!r} has an empty word; give the command as a list of words")
        return value

    @model_validator(mode="after")
    def _shapes_agree(self) -> "Deployment":
        if isinstance(self.ranks_per_node, list) and len(self.ranks_per_node) != self.nodes:
            raise ValueError(f"`ranks_per_node` lists {len(self.ranks_per_node)} node(s) for `nodes: {self.nodes}`; "
                             "give one number per node (the head's first), or one number for all")
        if self.launchers is not None and len(self.launchers) != self.nodes:
            raise ValueError(f"`launchers` has {len(self.launchers)} prefix(es) for `nodes: {self.nodes}`; give one per "
                             "node, the head's first ([] runs a node here)")
        return self


SHELL_LAUNCHERS = ("ssh",)  # launchers that join their words into one line for the node's shell


def hands_to_shell(deployment: Deployment, launcher: tuple[str, ...] | list[str]) -> bool:
    """Whether the command after ``launcher`` is read again by a shell on the node."""
    if not launcher:
        return False
    if deployment.remote_shell is not None:
        return deployment.remote_shell
    return launcher[0].rsplit("/", 1)[-1] in SHELL_LAUNCHERS


@dataclass(frozen=True)
class NodeRole:
    """One node of a deployment as its command line says it."""

    index: int
    start_rank: int
    local_ranks: int
    launcher: tuple[str, ...]

    @property
    def head(self) -> bool:
        return self.index == 0

    @property
    def label(self) -> str:
        return f"node {self.index}" + (" (head)" if self.head else "")

    @property
    def ranks(self) -> range:
        return range(self.start_rank, self.start_rank + self.local_ranks)

    def describe_ranks(self) -> str:
        ranks = list(self.ranks)
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def data_parallel_size(engine_args: dict[str, Any]) -> int:
    size = engine_args.get("data_parallel_size", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) else 1


def deployment_problem(deployment: Deployment, engine_args: dict[str, Any]) -> str | None:
    """Why ``deployment`` cannot run these engine arguments (one sentence), or None."""
    derived = next((k for k in DERIVED_ARGS if k in engine_args), None)
    if derived is not None:
        return (f"engine argument `{derived}` is what `launch.deployment` derives for each node; remove it from "
                "`engine:` (the deployment says it on every node's command line)")
    if engine_args.get("data_parallel_backend", "mp") != "mp":
        return (f"`data_parallel_backend: {engine_args['data_parallel_backend']}` places the ranks itself; a deployment "
                "starts them on its nodes (the `mp` backend): remove one of the two")
    dp = data_parallel_size(engine_args)
    counts = ranks_per_node(deployment, dp)
    if counts is None:
        return (f"data_parallel_size {dp} does not split evenly over {deployment.nodes} nodes; set "
                f"`launch.deployment.ranks_per_node` (one number per node) or another data_parallel_size")
    if sum(counts) != dp:
        return (f"`launch.deployment.ranks_per_node` {counts} adds up to {sum(counts)} ranks, and data_parallel_size "
                f"is {dp}; make them agree")
    return None


def ranks_per_node(deployment: Deployment, dp: int) -> list[int] | None:
    """The ranks of each node (None: the default even split does not exist)."""
    given = deployment.ranks_per_node
    if isinstance(given, list):
        return list(given)
    if isinstance(given, int):
        return [given] * deployment.nodes
    if dp % deployment.nodes:
        return None
    return [dp // deployment.nodes] * deployment.nodes


def node_layout(deployment: Deployment, engine_args: dict[str, Any]) -> list[NodeRole]:
    """Every node's place in the deployment, the head's first (after
    :func:`deployment_problem` found nothing wrong)."""
    counts = ranks_per_node(deployment, data_parallel_size(engine_args))
    assert counts is not None, "deployment_problem() first"
    launchers = deployment.launchers or [[] for _ in counts]
    roles, start = [], 0
    for index, (count, prefix) in enumerate(zip(counts, launchers)):
        roles.append(NodeRole(index=index, start_rank=start, local_ranks=count, launcher=tuple(prefix)))
        start += count
    return roles


def node_flags(role: NodeRole, dp: int, address: str, rpc_port: int) -> dict[str, Any]:
    """What a node's command line says beyond the shared engine arguments, in vLLM's
    flag names.

    The head says no start rank: 0 is the default, and vLLM 0.32 takes any
    `--data-parallel-start-rank` on a node that is not headless for hybrid load balancing
    (vllm/engine/arg_utils.py), which with one local rank turns into external load
    balancing and refuses the headless ranks ("Remote engine 1 must not use --headless in
    external or hybrid dp lb mode"). The GLM-5 nightly's head passes `0`, which the vLLM it
    pins reads as no start rank at all."""
    flags: dict[str, Any] = {
        "data-parallel-size": dp,
        "data-parallel-size-local": role.local_ranks,
    }
    if not role.head:
        flags["data-parallel-start-rank"] = role.start_rank
    flags["data-parallel-address"] = address
    flags["data-parallel-rpc-port"] = rpc_port
    if not role.head:
        flags["headless"] = True
    return flags
