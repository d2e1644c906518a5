"""Run configuration: pydantic models (unknown keys are errors) and YAML loading.

A config names a model, the vLLM engine arguments (vLLM's own names, passed through
unchanged), the variants to compare (each may add env vars, override engine args —
merged deeply, so nested dicts such as `additional_config` merge — or run under a
different Python interpreter), the tasks, what to capture, and where to write.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from evalpipe.config.cluster import ClusterSettings, check_variant_resources
from evalpipe.config.engine_args import dtype_problem
from evalpipe.config.errors import ConfigError
from evalpipe.config.yaml_source import read_yaml_file
from evalpipe.data.longctx import LongCtxSpec
from evalpipe.engine_patches.switches import check_env
from evalpipe.gates import registry
from evalpipe.install import default_config
from evalpipe.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX
from evalpipe.paths import PLAIN_NAME_RULE, is_plain_name
from evalpipe.probes.collectives import COLLECTIVE_KINDS, collective_problem, looks_collective
from evalpipe.probes.engine_hooks import MODEL_SWITCHES, RANKS, STANDARD_SWITCHES
from evalpipe.validation import first_problem


def _wants_a_number(annotation: Any) -> bool:
    """A field of numbers (int, float, or either with None or a word) that takes no bool."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    return bool(set(args) & {int, float}) and bool not in args


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # before every field's own check (a subclass's validators run first and may say it more precisely)
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true for 1 and false for 0, so `samples: true` or `margin: yes` would
        # be read as a number nobody wrote; YAML makes a bool of more words than `true`
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _wants_a_number(field.annotation):
            raise ValueError(f"got {str(value).lower()} where a number is wanted; give a number")
        return value


class ModelSpec(_Strict):
    path: str = Field(description="Local model directory, hub-style id already in the local cache, or builtin:NAME.")
    tokenizer: str | None = Field(default=None, description="Tokenizer path if it differs from the model's.")
    dtype: str = Field(default="auto", description="vLLM dtype; a variant may override it through its engine args.")

    @field_validator("path")
    @classmethod
    def _builtin_name_known(cls, value: str) -> str:
        # the one check of the model that needs nothing of this machine: a dry run for a cluster makes it too
        if value.startswith(BUILTIN_PREFIX) and value[len(BUILTIN_PREFIX):] not in BUILTIN_MODELS:
            known = ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_MODELS)
            raise ValueError(f"{value!r} names no built-in model; known: {known}")
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype_vllm_knows(cls, value: str) -> str:
        if problem := dtype_problem(value):
            raise ValueError(f"the dtype {problem}")
        return value


def _env_values_as_strings(value: Any) -> Any:
    # YAML turns `VLLM_X: 1` into an int and `true` into a bool; an environment holds strings.
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not k or "=" in k or "\0" in k:
                # the OS cannot hold such a name: the process would fail to start, after the plan passed
                raise ValueError(f"{k!r} is not an environment variable name (a non-empty string without `=`); fix the key")
            if isinstance(v, str) and "\0" in v:
                raise ValueError(f"the value of `{k}` holds a NUL character, which no environment variable can; remove it")
            if isinstance(v, (list, dict)):
                raise ValueError(f"`{k}` is a {type(v).__name__}; an environment variable holds one string (quote it, e.g. \"a,b\")")
        return {
            str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in value.items()
        }
    return value


class LaunchFields(_Strict):
    """How a variant's engine comes up and how evalpipe talks to it.

    offline   vllm.LLM inside the variant's worker process (one process, no HTTP).
    serve     evalpipe starts vLLM's OpenAI server for the variant (engine args in a
              YAML file passed with --config), waits for /health, talks HTTP, stops it.
    endpoint  a server someone else started (e.g. a multi-node deployment): evalpipe
              only talks to it and never stops it; engine args are not applied.
    """

    mode: Literal["offline", "serve", "endpoint"] = "offline"
    command: list[str] | None = Field(
        default=None,
        description="serve: the server command the engine args follow; default [<variant python>, -m, vllm.entrypoints.openai.api_server] "
        "(the server `vllm serve` runs; `[vllm, serve]` works where the vllm console command does).",
    )
    launcher: list[str] = Field(
        default_factory=list,
        description="serve: command prefix, e.g. [docker, exec, ctr-a] or [srun, -N1] or [ssh, node1] (then set `host` to an address this machine reaches).",
    )
    host: str = Field(default="127.0.0.1", description="serve: address the server binds and evalpipe connects to.")
    port: int | None = Field(default=None, ge=1, le=65535, description="serve: server port; default a free port.")
    ready_timeout_s: float = Field(default=900, gt=0, description="serve/endpoint: how long to wait for /health (large models start for many minutes).")
    stop_grace_s: float = Field(default=30, ge=0, description="serve: seconds between SIGTERM and SIGKILL of the server's process group.")
    url: str | None = Field(default=None, description="endpoint: base URL of the running server, e.g. http://head-node:8000.")
    served_model_name: str | None = Field(default=None, description="endpoint: model name to request; default the server's only model.")
    api_key_env: str | None = Field(default=None, description="serve/endpoint: environment variable holding the API key (the key itself is never written anywhere).")
    concurrency: int = Field(default=64, ge=1, description="serve/endpoint: requests in flight at once.")
    request_timeout_s: float = Field(default=3600, gt=0, description="serve/endpoint: time limit of one HTTP request.")
    stall_timeout_s: float | None = Field(
        default=1800, gt=0,
        description="The watchdog: once the engine is up, a variant with no finished request for this many seconds "
                    "is stopped and fails (a hung collective produces no error, only silence); null: no limit. "
                    "`--stall-timeout` overrides it for every variant.",
    )
    retries: int = Field(default=3, ge=0, description="serve/endpoint: retries (with backoff) of a request that met a transport error; any other failure fails the variant.")



class Launch(LaunchFields):
    """One variant's resolved launch (the top level's with its overrides): the fields
    that go with a mode are checked here, since a variant may supply them."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "Launch":
        if self.mode == "endpoint" and not self.url:
            raise ValueError("mode `endpoint` needs `url` (the running server's base URL, e.g. http://127.0.0.1:8000).")
        if self.mode != "endpoint" and self.url:
            raise ValueError(f"`url` is for mode `endpoint` (attach to a running server); mode `{self.mode}` starts its own engine. Remove `url` or set mode: endpoint.")
        if self.mode == "endpoint" and self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"`url: {self.url}` must start with http:// or https://.")
        return self


def whole_count(value: Any, what: str) -> int:
    """A count as a config writes it: a whole number, 0 or more. YAML's `true` is refused
    (pydantic would read it as 1), as are 2.0 and "2"."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number, 0 or more; got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be 0 or more; got {value}")
    return value


class CountRange(_Strict):
    """Calls per forward pass between ``min`` and ``max`` (either may be left out, not both)."""

    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @field_validator("min", "max", mode="before")
    @classmethod
    def _whole(cls, value: Any, info: Any) -> Any:
        return None if value is None else whole_count(value, f"`{info.field_name}`")

    @model_validator(mode="after")
    def _bounded(self) -> "CountRange":
        if not self.min and self.max is None:
            raise ValueError("a range needs a `max`, or a `min` above 0 (without either every count holds)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"the range's min {self.min} is above its max {self.max} (no count holds); swap them")
        return self

    def holds(self, n: int) -> bool:
        return (self.min is None or n >= self.min) and (self.max is None or n <= self.max)

    def describe(self) -> str:
        if self.min is not None and self.max is not None:
            return f"{self.min}..{self.max}" if self.min != self.max else str(self.min)
        return f">= {self.min}" if self.min is not None else f"<= {self.max}"


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


class Expectations(_Strict):
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
                    or self.per_forward or self.switches)

    def claims(self) -> dict[str, Any]:
        """What these expectations say about the path (same_path aside): equal claims on
        both sides of a comparison cannot tell their paths apart."""
        return self.model_dump(mode="json", exclude={"same_path"})


def _engine_switches_valid(value: dict[str, str]) -> dict[str, str]:
    # evalpipe's own engine switches are refused here, before any engine starts, rather than
    # inside the engine processes after a minute of start-up
    check_env(value)
    return value


class Variant(_Strict):
    description: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict, description="Overrides merged deeply into the top-level engine args.")
    python: str | None = Field(default=None, description="Interpreter of another environment (a different build); default: this one.")
    launch: dict[str, Any] = Field(default_factory=dict, description="Overrides of the top-level `launch:` for this variant (e.g. another mode, url or launcher).")
    expect: dict[str, Any] = Field(
        default_factory=dict,
        description="What the path probes must find in this variant's engine (Expectations), merged over the top-level `expect:`.",
    )
    resources: dict[str, float] | None = Field(
        default=None, description="On a cluster: what this variant asks for instead of `cluster.resources` (Ray resources).")

    _env_strings = field_validator("env", mode="before")(_env_values_as_strings)
    _env_switches = field_validator("env")(_engine_switches_valid)
    _resources = field_validator("resources", mode="before")(check_variant_resources)


class TaskSpec(_Strict):
    task: str = Field(description="lm-eval task name (from tasks/ or lm-eval's own registry).")
    num_fewshot: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N documents.")
    max_gen_toks: int | None = Field(default=None, gt=0)
    data_files: dict[str, str | list[str]] | None = Field(
        default=None,
        description="Local data files per split (parquet/jsonl/json/csv) instead of the task's hub data set; relative paths resolve against the data directory.",
    )


class PromptPositions(_Strict):
    """Which prompt positions teacher forcing keeps besides the whole continuation.

    A long prompt is where a layout change bites (its prefill is what gets sharded),
    but keeping every position of a 128k prompt would store 128k x top-k rows per
    sample; a bounded, layout-aware subset is kept instead."""

    min_prompt_tokens: int = Field(default=1024, ge=1, description="Prompts shorter than this keep no prompt positions (GSM8K-sized prompts: the continuation only).")
    last: int = Field(default=256, ge=0, description="The last N prompt positions (where the answer is prepared).")
    every: int = Field(default=512, ge=0, description="Every Nth prompt position (0: none).")
    tp_sizes: list[int] = Field(default_factory=lambda: [4, 16], description="Tensor-parallel sizes whose shard boundaries are always kept (the prompt split into T contiguous padded shards).")
    block_sizes: list[int] = Field(default_factory=lambda: [2048], description="Block sizes (e.g. sparse attention's KV block) whose boundaries are always kept.")
    around: int = Field(default=1, ge=0, description="Positions kept on each side of a boundary.")

    @field_validator("tp_sizes", "block_sizes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError("sizes must be positive integers")
        return sorted(set(v))


class Capture(_Strict):
    topk: int = Field(default=5, ge=1, le=20, description="Top-k logprobs recorded per generated token (vLLM caps at max_logprobs, 20).")
    teacher_forcing: bool = Field(
        default=True,
        description="Every variant also scores the reference's exact sequences (prompt + continuation) -> teacher.parquet.",
    )
    prompt_positions: PromptPositions = PromptPositions()


AUTO: Final = "auto"

# The distributional gates' sign-flip test draws this many random flips beyond 16 samples
# (evalpipe.compare.distribution), so its p-value is never below 1 / (1 + this): an alpha at
# or under that leaves those gates unable to fail.
SIGN_FLIP_RESAMPLES: Final = 9999
SMALLEST_SIGN_FLIP_P: Final = 1 / (1 + SIGN_FLIP_RESAMPLES)


def margin_problem(margin: float) -> str | None:
    """Why a TOST margin leaves the score equivalence gate unable to fail, or None. The
    margin is on the metric's scale; the scores compared are 0/1 per item (exact_match,
    accuracy), whose paired difference never exceeds 1."""
    if not math.isfinite(margin) or margin <= 0:
        return f"must be positive and finite (a score difference on the metric's scale, e.g. 0.01); got {margin}"
    if margin >= 1:
        return (f"must be below 1: no paired difference of a 0/1 metric (exact_match, accuracy) exceeds 1, so a margin "
                f"of {margin:g} leaves the equivalence gate unable to fail; use e.g. 0.01 (1 point)")
    return None


def _bound(value: Any, what: str) -> Any:
    """A gate's floor or multiple: finite and >= 0 (a bound of infinity, or NaN, is never exceeded)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0{what}; got {value} (the gate could never fail)")
    return value


class Tolerance(_Strict):
    """A gate on one token metric: fail when measured > max(abs, rel_aa x the A/A value).

    ``abs: auto`` (the default) takes the floor for the reference's precision from
    :data:`evalpipe.compare.numerics.FLOORS`; a number overrides it. Without an A/A run
    (``noise_floor: false``) the bound is the floor alone.
    """

    abs: float | Literal["auto"] = Field(
        default=AUTO, description="Absolute floor; the gate never fails at or below it. `auto`: the floor for the reference's precision (docs/numerics.md)."
    )
    rel_aa: float | None = Field(default=3.0, ge=0, description="Multiple of the same metric in the A/A noise-floor run; null ignores the A/A run.")

    @field_validator("abs")
    @classmethod
    def _finite_floor(cls, v: float | str) -> float | str:
        return _bound(v, " or `auto`")

    @field_validator("rel_aa")
    @classmethod
    def _finite_multiple(cls, v: float | None) -> float | None:
        return _bound(v, " or null")

    def floor(self, auto_floor: float) -> float:
        return auto_floor if self.abs == AUTO else float(self.abs)

    def bound(self, aa_value: float | None, auto_floor: float = 0.0) -> float:
        floor = self.floor(auto_floor)
        if self.rel_aa is None or aa_value is None:
            return floor
        return max(floor, self.rel_aa * aa_value)


class ScoreGates(_Strict):
    margin: float = Field(default=0.01, description="TOST equivalence margin on the metric's scale (0.01 = 1 point of accuracy); below 1.")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="Level of McNemar's test and of TOST (TOST uses the 1 - 2 alpha interval).")
    require_equivalence: bool = Field(default=True, description=registry.gate("score_equivalence").sentence)
    fail_on_significant: bool = Field(default=True, description=registry.gate("score_mcnemar").sentence)

    @field_validator("margin")
    @classmethod
    def _margin_can_fail(cls, v: float) -> float:
        if problem := margin_problem(v):
            raise ValueError(problem)
        return v


def _described(name: str) -> Any:
    """A token gate's setting, described by the gate itself (evalpipe/gates/registry.py)."""
    return Field(default=Tolerance(), description=registry.gate(name).sentence)


class TokenGates(_Strict):
    free_hard_divergences: Tolerance = _described("free_hard_divergences")
    free_kl_max: Tolerance = _described("free_kl_max")
    teacher_kl_p99: Tolerance = _described("teacher_kl_p99")
    teacher_kl_max: Tolerance = _described("teacher_kl_max")
    teacher_hard_top1_flips: Tolerance = _described("teacher_hard_top1_flips")

    def tolerance(self, gate: registry.Gate) -> Tolerance:
        value = getattr(self, gate.field_name) if gate.group == "tokens" else None
        if not isinstance(value, Tolerance):
            raise KeyError(f"{gate.name} is not a token gate (its setting is {gate.setting})")
        return value


class DistributionGates(_Strict):
    """Tests of the A/B distribution against the A/A one over all teacher-forced positions
    (:mod:`evalpipe.compare.distribution`): a gate fails when the difference is
    significant (p < alpha) and larger than its floor. They need an A/A run."""

    enabled: bool = True
    alpha: float = Field(default=1e-3, lt=0.5, description=f"Level of the sign-flip permutation tests (per task and test); above {SMALLEST_SIGN_FLIP_P:g}, their smallest p-value.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Confidence of the reported effect interval.")
    dlogprob_shift: float | Literal["auto"] = Field(
        default=AUTO, description="Floor on |mean signed shift| of the forced token's logprob, nats; `auto`: by precision (docs/numerics.md)."
    )
    kl_shift: float | Literal["auto"] = Field(
        default=AUTO, description="Floor on the mean per-position KL above A/A, nats; `auto`: by precision (docs/numerics.md)."
    )

    @field_validator("alpha")
    @classmethod
    def _alpha_above_the_smallest_p(cls, v: float) -> float:
        if not v > SMALLEST_SIGN_FLIP_P:
            raise ValueError(f"must be above {SMALLEST_SIGN_FLIP_P:g}, the smallest p-value the sign-flip test gives with "
                             f"{SIGN_FLIP_RESAMPLES} random flips (at or below it the gates could never fail); got {v}")
        return v

    @field_validator("dlogprob_shift", "kl_shift")
    @classmethod
    def _finite_floor(cls, v: float | str) -> float | str:
        return _bound(v, " or `auto`")

    def setting(self, gate: registry.Gate) -> float | Literal["auto"]:
        """The floor the config sets for a distributional gate (``auto``: by precision)."""
        if gate.family != "distributional" or gate.group != "distribution":
            raise KeyError(f"{gate.name} is not a distributional gate (its setting is {gate.setting})")
        value: float | Literal["auto"] = getattr(self, gate.field_name)
        return value


class Gates(_Strict):
    """When a non-identical comparison still counts as EQUIVALENT. Any failing gate makes it DIVERGENT."""

    scores: ScoreGates = ScoreGates()
    tokens: TokenGates = TokenGates()
    distribution: DistributionGates = DistributionGates()


class NoiseFloor(_Strict):
    """A/A run: the reference variant again, with another batch arrangement."""

    enabled: bool = True
    reverse_order: bool = Field(default=True, description="Send each call's requests to the engine in reverse order.")
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine-arg overrides for the A/A run; default: max_num_seqs halved (from the reference's value, else 256).",
    )
    reuse_server: bool = Field(
        default=False,
        description="serve/endpoint modes: the A/A run sends its requests to the reference's server (reversed, with half the "
        "concurrency) instead of starting a second engine; saves one engine start (many minutes for a large model).",
    )


class Localize(_Strict):
    """`evalpipe localize`: where in the model a divergence starts (docs/localize.md)."""

    when: Literal["off", "auto"] = Field(
        default="off", description="auto: localize every DIVERGENT variant right after `evalpipe run` compared it.")
    samples: int = Field(default=4, ge=1, le=64, description="Sequences re-run: those with the largest teacher-forced divergence.")
    positions: int = Field(default=8, ge=1, le=256, description="Worst teacher-forced positions kept per sequence (besides the shard, block and last-token rows).")
    rel_aa: float = Field(default=3.0, gt=0, allow_inf_nan=False, description="A module is above its floor when its difference exceeds max(numerics floor, rel_aa x the A/A's).")
    decode_steps: int = Field(
        default=0, ge=0, le=64,
        description="0: prefill each sequence whole (teacher forced). N > 0: prefill its prompt, then decode N tokens one "
        "forward pass each, and keep those rows too: for a fault that only one-token forward passes show (docs/localize.md).")


class Nightly(_Strict):
    """`evalpipe nightly`: what runs every night and how the history judges it."""

    tasks: str = Field(default="gsm8k", description="Task selector run each night (as `evalpipe run TASKS`): a group of `tasks:`, `all`, or a comma-separated list.")
    variants: list[str] | None = Field(default=None, description="Variants run each night (default: all).")
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N documents of every task each night.")
    history: str | None = Field(default=None, description="SQLAlchemy URL of the history database (default: sqlite file history.sqlite under the output root); e.g. postgresql+psycopg://user@host/db.")
    dashboard: str | None = Field(default=None, description="Where the dashboard is written (default: reports/nightly/index.html).")
    alpha: float = Field(default=1e-3, gt=0, lt=0.5, description="Level of the paired test that confirms a change in a score series.")
    min_nights: int = Field(default=2, ge=1, description="Nights a new level must last before the series flags it (a shorter one is pending, or a transient when it went away).")


class RunConfig(_Strict):
    model: ModelSpec
    engine: dict[str, Any] = Field(default_factory=dict)
    device: Literal["auto", "cpu", "npu", "cuda"] = Field(
        default="auto",
        description="What the engines run on; `npu` makes `evalpipe doctor` check vllm_ascend, torch_npu, CANN and the visible NPUs.",
    )
    launch: LaunchFields = Field(default_factory=LaunchFields, description="offline (default), serve or endpoint; a variant may override any field.")
    expect: dict[str, Any] = Field(
        default_factory=dict,
        description="Expectations every variant shares (e.g. the model class); a variant's own `expect:` merges over it.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment shared by all variants.")
    variants: dict[str, Variant]
    reference: str | None = None
    tasks: dict[str, list[TaskSpec]]
    capture: Capture = Capture()
    longctx: LongCtxSpec = Field(
        default_factory=LongCtxSpec,
        description="Lengths, layout edge cases and items of the generated long-context probes (tasks/longctx).",
    )
    gates: Gates = Gates()
    noise_floor: NoiseFloor | None = Field(default=None, description="true (defaults) or a mapping; runs the reference a second time as `<reference>-aa`.")
    localize: Localize = Field(default_factory=Localize, description="`auto` or `off` (default), or a mapping: when and how `evalpipe localize` runs.")
    output: str = Field(default="reports/runs", min_length=1, description="Output root of the run directories (`~` expands).")
    seed: int = 1234
    nightly: Nightly = Field(default_factory=Nightly, description="`evalpipe nightly`: task selector, history database, dashboard, change detection.")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings,
                                     description="Run the variants at once on a Ray cluster (`address:`); absent: here, one after another.")

    _env_strings = field_validator("env", mode="before")(_env_values_as_strings)
    _env_switches = field_validator("env")(_engine_switches_valid)

    @field_validator("variants", mode="before")
    @classmethod
    def _variant_names_are_plain(cls, value: Any) -> Any:
        return _plain_names(value, "variant name", "it names the variant's directory in the run")

    @field_validator("tasks", mode="before")
    @classmethod
    def _single_task_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, dict):
            if not value:
                raise ValueError("no task groups; add one, e.g. `gsm8k: [{task: gsm8k_synth_4shot, num_fewshot: 4}]`")
            _plain_names(value, "task group name", "it is chosen on the command line and names files of the run")
            empty = [k for k, v in value.items() if v is None or v == []]
            if empty:
                raise ValueError(f"task group `{empty[0]}` is empty; list at least one task under it or remove the group")
            return {k: (v if isinstance(v, list) else [v]) for k, v in value.items()}
        return value

    @field_validator("localize", mode="before")
    @classmethod
    def _localize_word(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` / `on` as a boolean
        if isinstance(value, bool):
            return {"when": "auto" if value else "off"}
        return {"when": value} if isinstance(value, str) else value

    @field_validator("noise_floor", mode="before")
    @classmethod
    def _noise_floor_flag(cls, value: Any) -> Any:
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @model_validator(mode="after")
    def _check_references(self) -> "RunConfig":
        if not self.variants:
            raise ValueError("`variants` is empty; define at least one variant (two to compare).")
        if self.reference is not None and self.reference not in self.variants:
            raise ValueError(
                f"`reference: {self.reference}` is not a variant; choose one of: {', '.join(self.variants)}."
            )
        if "all" in self.tasks:
            raise ValueError("`all` is reserved as a task group name (it means every group); rename that group.")
        if self.noise_floor is not None and self.noise_floor.enabled and self.aa_name in self.variants:
            raise ValueError(
                f"variant `{self.aa_name}` collides with the name of the A/A noise-floor run; rename it or set noise_floor: false."
            )
        # the shared `expect:` on its own first: its error is its own, not the first variant's
        merged_expectations(self.expect, {})
        shadowed = shadowed_keys(self.expect, [v.expect for v in self.variants.values()])
        if shadowed:
            raise ValueError(f"the top-level `expect.{shadowed[0]}` is replaced by every variant's own, so it is never checked; "
                             "move what it says into the variants' `expect:` or remove it.")
        for name, variant in self.variants.items():
            if "model" in variant.engine:
                raise ValueError(f"variant `{name}` sets engine.model; set the model once under `model:`.")
            self.variant_launch(name)
            self.variant_expect(name)
        return self

    def variant_expect(self, name: str) -> Expectations:
        """The top-level `expect:` with the variant's merged in (mappings key by key, lists replaced)."""
        return merged_expectations(self.expect, self.variants[name].expect, f"variant `{name}`: ")

    def variant_launch(self, name: str) -> Launch:
        """The top-level `launch:` with the variant's overrides merged in."""
        merged = deep_merge(self.launch.model_dump(exclude_unset=True), self.variants[name].launch)
        try:
            return Launch.model_validate(merged)
        except ValidationError as err:
            where, what = first_problem(err)
            if err.errors()[0]["type"] == "extra_forbidden":
                raise ValueError(f"variant `{name}`: unknown key `launch.{where}`; remove it or fix its spelling.") from None
            raise ValueError(f"variant `{name}`: launch{'.' + where if where else ''}: {what}") from None

    def on_cluster(self, address: str | None) -> "RunConfig":
        """This config with its variants run on the Ray cluster at ``address`` (None: here)."""
        return self.model_copy(update={"cluster": self.cluster.model_copy(update={"address": address})})

    @property
    def reference_name(self) -> str:
        return self.reference or next(iter(self.variants))

    @property
    def aa_name(self) -> str:
        return aa_variant_name(self.reference_name)


def _plain_names(value: Any, what: str, why: str) -> Any:
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str):  # YAML reads `1:` or `on:` as a number or a boolean
                raise ValueError(f"{what} {name!r} is read as a {type(name).__name__}; quote it (\"{name}\")")
            if not is_plain_name(name):
                raise ValueError(f"{what} {name!r} is not a plain directory name ({why}); use {PLAIN_NAME_RULE}")
    return value


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


AA_SUFFIX = "-aa"


def aa_variant_name(reference: str) -> str:
    """Directory / variant name of the A/A noise-floor run of ``reference``."""
    return reference + AA_SUFFIX


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge `override` into a copy of `base`; nested dicts merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    errors = err.errors()
    # an unknown key is said before a missing one: `Model:` is why `model` is missing
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = _union_error(errors) or (unknown or errors)[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        key = str(first["loc"][-1])
        meant = _meant_key(key, _known_keys(model or RunConfig, first["loc"][:-1]))
        if meant is None:
            return f"{source}: unknown key `{where}`; remove it or fix its spelling (see configs/default.yaml for the known keys)."
        why = " (keys are case-sensitive)" if meant.lower() == key.lower() else ""
        return f"{source}: unknown key `{where}`; did you mean `{meant}`{why}?"
    if first["type"] == "missing":
        return f"{source}: required key `{where}` is missing; add it."
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] != "value_error" and not isinstance(first.get("input"), (dict, list)):
        msg = f"{msg}, got {first.get('input')!r}; fix it"  # pydantic says what is wanted, not what was found
    elif first["type"] != "value_error":
        msg = f"{msg}; fix it"
    msg = msg if msg.endswith((".", "?")) else msg + "."
    return f"{source}: `{where}`: {msg}" if where != "(top level)" else f"{source}: {msg}"


def _known_keys(model: type[BaseModel], parents: Sequence[Any]) -> list[str]:
    """The keys a mapping at ``parents`` (a location in ``model``'s data) may hold: a
    model's fields, through nested models and mappings of models (`variants.<name>`)."""
    current: Any = model
    for part in parents:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return []
        # `X | None` -> X
        members = [a for a in typing.get_args(current) if a is not type(None)] if typing.get_origin(current) in (typing.Union, types.UnionType) else [current]
        current = members[0] if len(members) == 1 else None
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _meant_key(key: str, known: list[str]) -> str | None:
    """The known key an unknown one was meant to be: another case of it, or a near spelling."""
    same = [k for k in known if k.lower() == key.lower()]
    if same:
        return same[0]
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.8)
    return close[0] if close else None


# pydantic's names of union members in an error's location (`float`, `literal['auto']`,
# a model's class name); the config's own keys are lower-case words
_UNION_MEMBER = re.compile(r"float|int|str|bool|none|[a-z-]+\[.*\]|[A-Z]\w*")


def _union_error(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A value that fits no member of a union (``abs: float | "auto"``): pydantic reports one
    error per member, each under the key plus the member's name (`abs.float`); one error
    under the key itself, naming every accepted form, says it better."""
    first = errors[0]
    members = [e for e in errors if e["loc"][:-1] == first["loc"][:-1] and len(e["loc"]) == len(first["loc"])]
    if (len(first["loc"]) < 2 or len(members) < 2 or any(e.get("input") != first.get("input") for e in members)
            or not all(_UNION_MEMBER.fullmatch(str(e["loc"][-1])) for e in members)):
        return None
    wanted = " or ".join(e["msg"].removeprefix("Input should be ").split(",")[0] for e in members)
    return {**first, "loc": first["loc"][:-1], "msg": f"Input should be {wanted}"}


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with model, engine, variants, tasks ...; got {type(data).__name__}.")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_config(path: str | Path | None = None) -> RunConfig:
    path = Path(path) if path is not None else default_config()
    return parse_config(_load_mapping(path, []), str(path))


def _load_mapping(path: Path, chain: list[Path]) -> Any:
    """The YAML at ``path`` with its ``extends:`` chain resolved: the named config
    (relative to this file) is the base, this file's keys merge into it (mappings key by
    key, anything else replaces; a key set to null removes the base's, e.g. a variant)."""
    if chain:  # named by an `extends:`: the fix is in the extending file, not on the command line
        where, fix = f" (named by `extends:` in {chain[-1]})", f"fix `extends:` in {chain[-1]} to name a YAML file"
    else:
        where, fix = "", "pass a YAML file with -c/--config"
    if path.is_dir():
        raise ConfigError(f"config {path}{where} is a directory; {fix} (e.g. {path / 'default.yaml'}).")
    if not path.is_file():
        raise ConfigError(f"config file {path}{where} does not exist; {fix}.")
    data = read_yaml_file(path, f"config file {path}{where}", fix)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base_name = data.pop("extends")
    if not isinstance(base_name, str) or not base_name.strip():
        raise ConfigError(f"{path}: `extends` must be the path of another config file; got {base_name!r}.")
    base_path = (path.parent / base_name).resolve()
    if base_path in chain or base_path == path.resolve():
        raise ConfigError(f"{path}: `extends: {base_name}` makes a cycle; a config cannot extend itself.")
    base = _load_mapping(base_path, [*chain, path.resolve()])
    if not isinstance(base, dict):
        raise ConfigError(f"{base_path} (extended by {path}): the top level must be a mapping.")
    return _drop_nulls(deep_merge(base, data), data)


def _drop_nulls(merged: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Remove the keys ``override`` sets to null (at any depth) from ``merged``."""
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            _drop_nulls(merged[key], value)
    return merged


def load_gates(path: str | Path | None = None, margin: float | None = None, base: Gates | None = None) -> Gates | None:
    """Gates for `evalpipe compare`: from a YAML file (a run config with a `gates:` key,
    or the gates mapping itself) and/or a score margin; None when neither is given
    (then the run's own gates apply)."""
    if path is None and margin is None:
        return None
    gates = base or Gates()
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"gates file {path} is a directory; pass a YAML file with a `gates:` mapping to --gates.")
        if not path.is_file():
            raise ConfigError(f"gates file {path} does not exist; pass a YAML file with a `gates:` mapping.")
        data = read_yaml_file(path, f"gates file {path}", "pass a YAML file to --gates")
        data = data.get("gates", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            found = "an empty file" if data is None else f"a {type(data).__name__}"
            raise ConfigError(f"{path}: expected a mapping with `scores:` and/or `tokens:` (or a `gates:` key), found {found}; fix the file.")
        try:
            gates = Gates.model_validate(data)
        except ValidationError as err:
            raise ConfigError(_format_validation_error(err, str(path), Gates).replace("see configs/default.yaml", "see the gates section of configs/default.yaml")) from None
    if margin is not None:
        if problem := margin_problem(margin):  # the rule of `gates.scores.margin` itself
            raise ConfigError(f"--margin {problem}.")
        gates = gates.model_copy(update={"scores": gates.scores.model_copy(update={"margin": margin})})
    return gates
