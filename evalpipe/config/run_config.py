"""Run configuration: pydantic models (unknown keys are errors) and YAML loading.

A config names a model, the vLLM engine arguments (vLLM's own names, passed through
unchanged), the variants to compare (each may add env vars, override engine args —
merged deeply, so nested dicts such as `additional_config` merge — or run under a
different Python interpreter), the tasks, what to capture, and where to write.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import Field, ValidationError, field_validator, model_validator

from evalpipe.config.bisect import BisectSpec
from evalpipe.config.cluster import ClusterSettings, check_variant_resources
from evalpipe.config.deployment import Deployment
from evalpipe.config.engine_args import dtype_problem
from evalpipe.config.expectations import Expectations, merged_expectations, shadowed_keys
from evalpipe.config.gate_settings import Gates
from evalpipe.config.merge import deep_merge
from evalpipe.config.path_requirements import PathRequirements
from evalpipe.config.sampling import Sampling
from evalpipe.config.strict import Strict
from evalpipe.data.longctx import LongCtxSpec
from evalpipe.data.scenarios import SCENARIOS, ScenarioSpec
from evalpipe.engine_patches.switches import check_env
from evalpipe.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX
from evalpipe.paths import PLAIN_NAME_RULE, is_plain_name
from evalpipe.validation import first_problem

# How a variant's engine runs (see LaunchSettings): one definition for the config, the job,
# the manifest, the probes' records and localize.json.
LaunchMode = Literal["offline", "serve", "endpoint"]

class ModelSpec(Strict):
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


class LaunchFields(Strict):
    """How a variant's engine comes up and how evalpipe talks to it.

    offline   vllm.LLM inside the variant's worker process (one process, no HTTP).
    serve     evalpipe starts vLLM's OpenAI server for the variant (engine args in a
              YAML file passed with --config), waits for /health, talks HTTP, stops it.
    endpoint  a server someone else started (e.g. a multi-node deployment): evalpipe
              only talks to it and never stops it; engine args are not applied.
    """

    mode: LaunchMode = "offline"
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
    deployment: Deployment | None = Field(
        default=None,
        description="serve: the engine over several nodes (a head serving HTTP, headless data-parallel ranks on the others), "
                    "started, watched and stopped as one; docs/deployments.md.")


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
        if self.deployment is not None and self.mode != "serve":
            raise ValueError(f"`deployment` starts an engine over several nodes, which needs mode `serve` (not `{self.mode}`); "
                             "set mode: serve, or remove `deployment` (an endpoint is started by others).")
        if self.deployment is not None and self.deployment.launchers and self.deployment.launchers[0] and \
                (self.port is None or self.deployment.rpc_port is None):
            raise ValueError("a head started through a launcher needs its ports fixed: set `port` and `deployment.rpc_port` "
                             "(a free port chosen here says nothing of the head's node).")
        if self.deployment is not None and self.launcher:
            raise ValueError("`launcher` runs the one server of a variant; a deployment runs a process per node: "
                             "give each node its prefix in `deployment.launchers` and remove `launcher`.")
        return self


def _engine_switches_valid(value: dict[str, str]) -> dict[str, str]:
    # evalpipe's own engine switches are refused here, before any engine starts, rather than
    # inside the engine processes after a minute of start-up
    check_env(value)
    return value


class Variant(Strict):
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


# How a task's requests reach the engine (the scheduler paths they drive):
#   together       all at once, as lm-eval hands them over: the engine batches them freely
#   one_at_a_time  each alone, the next once it finished: every decode step is one request's
#   prime_first    the first alone, then the rest together: what the first leaves in the
#                  prefix cache is there for the others (prefix-cache hits on a shared prefix)
RequestSchedule = Literal["together", "one_at_a_time", "prime_first"]


class TaskSpec(Strict):
    task: str = Field(description="lm-eval task name (from tasks/ or lm-eval's own registry).")
    num_fewshot: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N documents.")
    max_gen_toks: int | None = Field(default=None, gt=0)
    data_files: dict[str, str | list[str]] | None = Field(
        default=None,
        description="Local data files per split (parquet/jsonl/json/csv) instead of the task's hub data set; relative paths resolve against the data directory.",
    )
    sampling: Sampling | None = Field(
        default=None,
        description="Sample this task's generations (common random numbers: every sample seeded alike in every variant); "
        "default: the run's `sampling:`, else greedy.",
    )
    schedule: RequestSchedule | None = Field(
        default=None,
        description="How the task's requests (generations and likelihoods alike) reach the engine: `together` (all at once, the default), "
        "`one_at_a_time` (each alone: every decode step is a single request's), `prime_first` (the first alone, then "
        "the rest together: a shared prefix the first cached is hit by the others). Default: a scenario task's own, "
        "else `together`.",
    )
    requires: PathRequirements | None = Field(
        default=None,
        description="What vLLM's own counters must show the engine did over this task (e.g. `prefix_cache_hits: {min: 1}`); "
        "a variant whose counters fall short makes its comparison INCONCLUSIVE. A scenario task's default is its own.",
    )


    @property
    def sends(self) -> RequestSchedule:
        """How the requests reach the engine: the entry's `schedule:`, else a scenario task's own,
        else together (resolved where it is read, so a config dumped and read back keeps it)."""
        if self.schedule is not None:
            return self.schedule
        scenario = SCENARIOS.get(self.task)
        return cast(RequestSchedule, scenario.schedule) if scenario is not None else "together"


class PromptPositions(Strict):
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


class Capture(Strict):
    topk: int = Field(default=5, ge=1, le=20, description="Top-k logprobs recorded per generated token (vLLM caps at max_logprobs, 20).")
    teacher_forcing: bool = Field(
        default=True,
        description="Every variant also scores the reference's exact sequences (prompt + continuation) -> teacher.parquet.",
    )
    prompt_positions: PromptPositions = PromptPositions()


class NoiseFloor(Strict):
    """A/A run: the reference variant again, with another batch arrangement."""

    enabled: bool = True
    reverse_order: bool = Field(default=True, description="Send each call's requests to the engine in reverse order.")
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine-arg overrides for the A/A run; default: max_num_seqs halved (from the reference's value, else 256).",
    )
    launch: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the A/A run's launch, merged over the reference's: e.g. nodes of its own for a "
        "deployment (`deployment: {launchers: [...]}`) or another port, so it can run beside the reference.",
    )
    reuse_server: bool = Field(
        default=False,
        description="serve/endpoint modes: the A/A run sends its requests to the reference's server (reversed, with half the "
        "concurrency) instead of starting a second engine; saves one engine start (many minutes for a large model).",
    )


class Localize(Strict):
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


class Nightly(Strict):
    """`evalpipe nightly`: what runs every night and how the history judges it."""

    tasks: str = Field(default="gsm8k", description="Task selector run each night (as `evalpipe run TASKS`): a group of `tasks:`, `all`, or a comma-separated list.")
    variants: list[str] | None = Field(default=None, description="Variants run each night (default: all).")
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N documents of every task each night.")
    history: str | None = Field(default=None, description="SQLAlchemy URL of the history database (default: sqlite file history.sqlite under the output root); e.g. postgresql+psycopg://user@host/db.")
    dashboard: str | None = Field(default=None, description="Where the dashboard is written (default: reports/nightly/index.html).")
    alpha: float = Field(default=1e-3, gt=0, lt=0.5, description="Level of the paired test that confirms a change in a score series.")
    min_nights: int = Field(default=2, ge=1, description="Nights a new level must last before the series flags it (a shorter one is pending, or a transient when it went away).")


class RunConfig(Strict):
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
    scenarios: ScenarioSpec = Field(
        default_factory=ScenarioSpec,
        description="Sizes of the engine-path scenarios' prompts (tasks/scenarios, docs/scenarios.md).",
    )
    gates: Gates = Gates()
    noise_floor: NoiseFloor | None = Field(default=None, description="true (defaults) or a mapping; runs the reference a second time as `<reference>-aa`.")
    localize: Localize = Field(default_factory=Localize, description="`auto` or `off` (default), or a mapping: when and how `evalpipe localize` runs.")
    output: str = Field(default="reports/runs", min_length=1, description="Output root of the run directories (`~` expands).")
    seed: int = Field(default=1234, ge=0, lt=2**32,
                      description="The engines' seed and the base of every sample's seed (0 to 2^32-1: the engine seeds "
                                  "numpy's generator with it, which takes no other).")
    sampling: Sampling | None = Field(
        default=None,
        description="Sampled decoding for every task without its own `sampling:` (default: greedy); docs/sampling.md.",
    )
    nightly: Nightly = Field(default_factory=Nightly, description="`evalpipe nightly`: task selector, history database, dashboard, change detection.")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings,
                                     description="Run the variants at once on a Ray cluster (`address:`); absent: here, one after another.")
    bisect: BisectSpec | None = Field(default=None, description="`evalpipe bisect`: the git repository of the candidate builds and how each step escalates (docs/bisect.md).")

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
        if self.bisect is not None and self.bisect.variant is not None and self.bisect.variant not in self.variants:
            raise ValueError(f"`bisect.variant: {self.bisect.variant}` is not a variant; choose one of: {', '.join(self.variants)}.")
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

    def task_sampling(self, spec: TaskSpec) -> Sampling | None:
        """How ``spec``'s generations are sampled, with the seed every sample derives from
        (its own, else the run's); None: greedy."""
        chosen = spec.sampling or self.sampling
        if chosen is None:
            return None
        return chosen.model_copy(update={"seed": self.seed if chosen.seed is None else chosen.seed})

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


AA_SUFFIX = "-aa"


def aa_variant_name(reference: str) -> str:
    """Directory / variant name of the A/A noise-floor run of ``reference``."""
    return reference + AA_SUFFIX
