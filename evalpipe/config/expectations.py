"""`expect:` of a run config and of a variant: what the path probes must (and must not)
find in a variant's engine processes, merged top level then variant."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, ValidationError, field_validator

from evalpipe.config.counts import CountRange, whole_count
from evalpipe.config.merge import deep_merge
from evalpipe.config.path_requirements import PathRequirements
from evalpipe.config.strict import Strict
from evalpipe.probes.collectives import COLLECTIVE_KINDS, collective_problem, looks_collective
from evalpipe.probes.engine_hooks import MODEL_SWITCHES, RANKS, STANDARD_SWITCHES

# Switch names every probe record holds (besides vllm_config paths and predicates).
STANDARD_SWITCH_NAMES = (*STANDARD_SWITCHES, *MODEL_SWITCHES, *RANKS)


def _dotted(name: str) -> bool:
    parts = name.removesuffix("()").split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


def collective_key(name: str) -> bool:
    """``all_gather`` or ``all_gather@tp``: a collective kind, optionally on one group (a
    record's key; an expectation's is also checked against the probes' vocabulary)."""
    kind, at, group = name.partition("@")
    return kind in COLLECTIVE_KINDS and (not at or group.isidentifier())


class DeploymentShape(Strict):
    """An engine over several nodes as its processes must show it (`expect.deployment`)."""

    nodes: int | None = Field(default=None, ge=1, strict=True,
                              description="Nodes whose processes built the model (recorded with their node by the probes).")
    ranks_per_node: int | list[int] | None = Field(
        default=None, description="Data-parallel ranks whose processes built the model on each node (one number for all, "
                                  "or a list, node 0 first).")
    data_parallel_size: int | None = Field(default=None, ge=1, strict=True,
                                           description="The data-parallel size as every process that built the model resolved it.")

    @field_validator("ranks_per_node")
    @classmethod
    def _whole_ranks(cls, value: Any) -> Any:
        for n in value if isinstance(value, list) else [] if value is None else [value]:
            if whole_count(n, "a node's ranks") < 1:
                raise ValueError("a node runs at least one data-parallel rank; give numbers of 1 or more")
        return value

    def ranks_of(self, node: int) -> int | None:
        if isinstance(self.ranks_per_node, list):
            return self.ranks_per_node[node] if node < len(self.ranks_per_node) else None
        return self.ranks_per_node


class Expectations(Strict):
    """What the path probes must (and must not) find in a variant's engine processes.

    A failed expectation makes the variant's comparison INCONCLUSIVE: the outputs were
    compared, but not of the path the variant declares. Function and class names are
    dotted paths in the variant's interpreter (``module.Class.method``); a name that does
    not exist there stops the run before any engine starts.
    """

    same_path: bool = Field(
        default=False, strict=True,
        description="The variant is meant to run the reference's code (an A/A pair): identical outputs with the same "
        "probe profile then pass instead of being INCONCLUSIVE.",
    )
    model: str | None = Field(default=None, description="Class vLLM must instantiate in every process that builds a model (module.Class).")
    engine_processes: int | None = Field(
        default=None, ge=1, strict=True,
        description="How many processes build the model: one per engine (data-parallel rank) times its tensor- and "
        "pipeline-parallel workers.",
    )
    layers: list[str] = Field(default_factory=list, description="Every decoder layer is one of these classes (module.Class).")
    called: list[str] = Field(default_factory=list, description="Functions or methods called at least once (all processes together).")
    not_called: list[str] = Field(default_factory=list, description="Functions or methods never called in any process.")
    per_forward: dict[str, int | CountRange] = Field(
        default_factory=dict,
        description="Calls in every forward pass of every process: a collective kind (all_gather, reduce_scatter, "
        "all_to_all, all_reduce, gather, dispatch, combine; `kind@group` for one group: tp, dp, ep, virtual ...) or "
        "a function name, with an exact count or {min, max}.",
    )
    forward_tokens: dict[str, CountRange] = Field(
        default_factory=dict,
        description="Batch shapes the engine must have run: forward passes (all processes that build the model "
        "together) whose token count falls in a power-of-two bin, keyed by the bin's least count (\"1\": a single "
        "request decoding alone, \"2\": 2-3 tokens, \"4\": 4-7 ...), with {min, max}. A layout bug that lives in one "
        "batch shape is only tested where that shape ran.",
    )
    deployment: DeploymentShape | None = Field(
        default=None,
        description="An engine over several nodes: how many nodes, data-parallel ranks per node and data-parallel size "
                    "its processes show (`launch.deployment` starts it).")
    tasks: dict[str, PathRequirements] = Field(
        default_factory=dict,
        description="Per task, what vLLM's own counters must show the engine did over it (prefix-cache hits, "
                    "preemptions, engine steps by tokens ...): the path a scenario drives. Filled from each task's "
                    "`requires:` (and a scenario task's defaults); a task whose counters fall short makes the "
                    "comparison INCONCLUSIVE, naming the task and the counter.",
    )
    switches: dict[str, Any] = Field(
        default_factory=dict,
        description="Values the engine resolved, read in every process that builds a model: a standard name "
        "(tensor_parallel_size, use_sequence_parallel_moe, dtype, attention_backends ...), a vllm_config path "
        "(parallel_config.all2all_backend) or a zero-argument predicate (vllm_ascend.ascend_config.enable_dsa_cp()).",
    )

    @field_validator("layers", "called", "not_called", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("model", "layers", "called", "not_called")
    @classmethod
    def _dotted_names(cls, value: Any) -> Any:
        for name in [value] if isinstance(value, str) else value or ():
            if not _dotted(name) or name.endswith("()"):
                raise ValueError(f"`{name}` is not a dotted name such as package.module.Class.method")
        return value

    @field_validator("engine_processes", mode="before")
    @classmethod
    def _processes_counted(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a whole number of processes, 1 or more; got {value!r}")
        return value

    @field_validator("per_forward", mode="before")
    @classmethod
    def _counted_names(cls, value: Any) -> Any:
        for name, count in value.items() if isinstance(value, dict) else ():
            if not isinstance(name, str):
                raise ValueError(f"{name!r} is read as a {type(name).__name__}; name a collective or a function")
            if looks_collective(name):
                if problem := collective_problem(name):
                    raise ValueError(problem)
            elif not _dotted(name) or name.endswith("()"):
                raise ValueError(f"`{name}` is neither a collective kind ({', '.join(COLLECTIVE_KINDS)}, optionally `@group`) "
                                 "nor a dotted function name")
            if not isinstance(count, dict):
                whole_count(count, f"the count of `{name}`")
        return value

    @field_validator("forward_tokens", mode="before")
    @classmethod
    def _token_bins(cls, value: Any) -> Any:
        for key, passes in value.items() if isinstance(value, dict) else ():
            bound = int(key) if isinstance(key, (int, str)) and not isinstance(key, bool) and str(key).isdigit() else 0
            if bound < 1 or bound & (bound - 1):
                raise ValueError(f"{key!r} is not a bin of tokens per forward pass: bins are powers of two "
                                 "(\"1\", \"2\", \"4\", ... \"8192\"), each the least count it holds")
            if not isinstance(passes, dict):
                raise ValueError(f"the passes of bin {key!r} are {passes!r}; give a range of forward passes, "
                                 "{min: 1} (at least one) or {min, max}")
        return {str(int(k)): v for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("switches")
    @classmethod
    def _switch_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name not in STANDARD_SWITCH_NAMES and not _dotted(name):
                raise ValueError(
                    f"`{name}` is not a switch the probes read: use a standard name ({', '.join(STANDARD_SWITCH_NAMES)}), "
                    "a vllm_config path (parallel_config.all2all_backend) or a predicate (package.module.function())"
                )
        return value

    def names(self) -> list[str]:
        """Every name the probes must resolve in a variant's interpreter for these expectations."""
        out = [*([self.model] if self.model else []), *self.layers, *self.called, *self.not_called]
        out += [n for n in self.per_forward if not collective_key(n)]
        out += [n for n in self.switches if n not in STANDARD_SWITCH_NAMES]
        return list(dict.fromkeys(out))

    def probed_names(self) -> list[str]:
        """The names the probes count or read (classes are compared, not counted)."""
        classes = {self.model, *self.layers}
        return [n for n in self.names() if n not in classes]

    def declares(self) -> bool:
        return bool(self.model or self.engine_processes or self.layers or self.called or self.not_called
                    or self.per_forward or self.forward_tokens or self.switches or self.deployment
                    or self.tasks)

    def claims(self) -> dict[str, Any]:
        """What these expectations say about the path (same_path aside): equal claims on
        both sides of a comparison cannot tell their paths apart."""
        return self.model_dump(mode="json", exclude={"same_path"})


def shadowed_keys(shared: dict[str, Any], owns: Sequence[dict[str, Any]], prefix: str = "") -> list[str]:
    """Dotted keys of ``shared`` that every one of ``owns`` replaces (deep_merge: mappings
    merge key by key, anything else replaces), so that no merged result holds them."""
    found = []
    for key, value in shared.items():
        if not owns or not all(key in own for own in owns):
            continue
        if isinstance(value, dict) and all(isinstance(own[key], dict) for own in owns):
            found += shadowed_keys(value, [own[key] for own in owns], f"{prefix}{key}.")
        else:
            found.append(f"{prefix}{key}")
    return found


def merged_expectations(shared: dict[str, Any], own: dict[str, Any], where: str = "") -> Expectations:
    try:
        return Expectations.model_validate(deep_merge(shared, own))
    except ValidationError as err:
        errors = err.errors()
        # a per_forward count is `int | CountRange`: a mapping is meant as a range, so its own
        # error says what is wrong, not "should be a valid integer"
        ranged = [e for e in errors if any("CountRange" in str(p) for p in e["loc"])]
        first = ranged[0] if ranged else errors[0]
        key = ".".join(str(p) for p in first["loc"] if p != "int" and "CountRange" not in str(p))
        if first["type"] == "extra_forbidden":
            raise ValueError(f"{where}unknown key `expect.{key}`; the keys are {', '.join(Expectations.model_fields)}.") from None
        what = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}`expect.{key}`: {what}{'' if what.endswith(('.', '?')) else '.'}") from None
