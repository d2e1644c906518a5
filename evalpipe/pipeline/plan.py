"""Config + command-line choices -> a RunPlan: which variants run in which order, with
which environment, interpreter and engine args, over which tasks.

Pure: reads the config and the file system, starts nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalpipe.config.deployment import deployment_problem
from evalpipe.config.engine_args import check_values
from evalpipe.config.errors import ConfigError
from evalpipe.config.expectations import Expectations
from evalpipe.config.merge import deep_merge
from evalpipe.config.option_bounds import check_option
from evalpipe.config.path_requirements import PathRequirements, chunked_bucket
from evalpipe.config.ray_engine import held_devices_problem
from evalpipe.config.run_config import Launch, NoiseFloor, RunConfig, TaskSpec, aa_variant_name
from evalpipe.data.longctx import MAX_GEN_TOKS, TASK_PROBE, target_lengths
from evalpipe.data.scenarios import GENERATED_SCENARIOS, SCENARIOS
from evalpipe.documents.run_doc import RUN_VERSION, RunDocument
from evalpipe.errors import UserError
from evalpipe.install import code_version, worker_import_dir
from evalpipe.models.builtin import BUILTIN_MODELS
from evalpipe.paths import PLAIN_NAME_RULE, is_plain_name
from evalpipe.process_table import RUN_ID_ENV
from evalpipe.redact import api_key_names, redact
from evalpipe.tasks.families import RULER_MAX_GEN_TOKS, is_generated_ruler
from evalpipe.validation import first_problem

BUILTIN_PREFIX = "builtin:"

# Engines must never wait on a model hub here; a config or the caller's environment
# may still turn these off explicitly.
DEFAULT_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class PlannedTask:
    group: str
    spec: TaskSpec

    def to_job(self) -> dict[str, Any]:
        return {"group": self.group, **self.spec.model_dump()}


@dataclass
class PlannedVariant:
    name: str
    description: str
    python: str
    env_overrides: dict[str, str]  # what the config adds to the caller's environment
    engine_args: dict[str, Any]
    launch: Launch = field(default_factory=Launch)
    expect: Expectations = field(default_factory=Expectations)  # what the path probes must find
    reverse_order: bool = False  # the A/A run sends requests in reverse order
    aa_of: str | None = None  # set on the A/A noise-floor run: the variant it repeats
    server_of: str | None = None  # serve mode: runs against this variant's server (the A/A reusing it)
    run_id: str = ""  # the mark in every process's environment (RUN_ID_ENV): the run's id, or the bisect's it is a step of

    def process_env(self) -> dict[str, str]:
        env = {**DEFAULT_ENV, **os.environ, **self.env_overrides}
        # Marks every process started for this run (inherited by servers' and engines'
        # children), so what a run leaves behind can be found.
        env[RUN_ID_ENV] = self.run_id
        # The worker imports this evalpipe (checkout or built install), whatever interpreter runs it.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(worker_import_dir()), env.get("PYTHONPATH", "")) if p)
        return env


@dataclass
class RunPlan:
    run_id: str
    run_dir: Path
    config: RunConfig
    config_path: str
    config_sha256: str
    task_selector: str
    tasks: list[PlannedTask]
    variants: list[PlannedVariant]  # reference first
    reference: str
    model: str  # as written in the config (a path or builtin:NAME)
    notes: list[str] = field(default_factory=list)
    # nightly: the baseline night's reference directory, whose sequences every variant
    # also teacher-forces (teacher_baseline.parquet)
    teacher_baseline_dir: Path | None = None

    @property
    def builtin_model(self) -> str | None:
        return self.model[len(BUILTIN_PREFIX) :] if self.model.startswith(BUILTIN_PREFIX) else None

    def variant(self, name: str) -> PlannedVariant:
        return next(v for v in self.variants if v.name == name)


def split_csv(csv: str | None, option: str, plain_names: bool = True) -> list[str]:
    """A command-line list: "a, b" -> ["a", "b"]; None (the option not given) -> [].
    With ``plain_names`` every item must be a name a config can define (variants, faults).
    An empty list or item is refused rather than read as "all" (`--variants "$UNSET"` in a
    CI script must not run every variant), and so is a name given twice."""
    if csv is None:
        return []
    names = [p.strip() for p in csv.split(",")]
    if not csv.strip():
        raise ConfigError(f"{option} is empty; name at least one, comma-separated (e.g. a,b), or leave {option} out.")
    if not all(names):
        raise ConfigError(f"{option} {csv!r} has an empty item; separate the names with single commas (e.g. a,b).")
    odd = next((n for n in names if not is_plain_name(n)), None) if plain_names else None
    if odd is not None:  # variant and fault names: what a config could not have defined
        shown = odd if len(odd) <= 40 else odd[:40] + "..."
        raise ConfigError(f"{option} item {shown!r} is not a name; names use {PLAIN_NAME_RULE}.")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ConfigError(f"{option} names `{twice}` twice; list each once.")
    return names


def select_tasks(config: RunConfig, selector: str, limit: int | None) -> list[PlannedTask]:
    """`gsm8k` -> that group of the config; `all` -> every group; any other name -> that
    lm-eval task with its own defaults. Comma-separated selectors combine."""
    if not selector.strip():
        raise ConfigError("no task given; name a task group of the config (e.g. gsm8k), `all`, or an lm-eval task.")
    names = split_csv(selector, "the task list", plain_names=False)  # lm-eval's task names have their own rules
    chosen: list[PlannedTask] = []
    for name in names:
        if name == "all":
            chosen += [PlannedTask(g, s) for g, specs in config.tasks.items() for s in specs]
        elif name in config.tasks:
            chosen += [PlannedTask(name, s) for s in config.tasks[name]]
        else:
            chosen.append(PlannedTask(name, TaskSpec(task=name)))
    if limit is not None:
        check_option("--limit", limit, TaskSpec, "limit", "tasks.<group>.<n>.limit")
        chosen = [PlannedTask(t.group, t.spec.model_copy(update={"limit": limit})) for t in chosen]
    # each task carries its sampling as it runs (the run's, with the seed resolved): the job is all a worker reads
    chosen = [PlannedTask(t.group, t.spec.model_copy(update={"sampling": config.task_sampling(t.spec)})) for t in chosen]
    chosen = [PlannedTask(t.group, with_scenario_defaults(t.spec, config)) for t in chosen]
    seen: set[str] = set()
    unique = []
    for t in chosen:
        if t.spec.task not in seen:
            seen.add(t.spec.task)
            unique.append(t)
    return unique


def with_scenario_defaults(spec: TaskSpec, config: RunConfig) -> TaskSpec:
    """A scenario task (evalpipe.data.scenarios) with its own `requires:` where its entry leaves
    it out: the evidence that its path ran (its schedule: TaskSpec.sends)."""
    scenario = SCENARIOS.get(spec.task)
    if scenario is None:
        return spec
    update: dict[str, Any] = {}
    requires = scenario.requires or _sized_evidence(spec, config)
    if spec.requires is None and requires:
        update["requires"] = PathRequirements.model_validate(requires)
    return spec.model_copy(update=update) if update else spec


def _sized_evidence(spec: TaskSpec, config: RunConfig) -> dict[str, Any]:
    """The evidence of the scenarios whose counts follow from the run's sizes. Chunked prefill:
    a step vLLM counted with more tokens than the budget allows one step, which only a prefill
    run in chunks gives (vLLM records it as one step of the whole prompt); none when that
    bucket also holds steps within the budget. A full window: every prompt token taken in."""
    resolved = config.scenarios.resolved(config.engine)
    if spec.task == "scenario_chunked_prefill" and resolved.chunk_tokens is not None:
        bucket = chunked_bucket(resolved.chunk_tokens, resolved.chunk_tokens + min(resolved.chunk_offsets))
        return {} if bucket is None else {"steps_by_tokens": {bucket: {"min": 1}}}
    if spec.task == "scenario_near_limit" and resolved.window_tokens is not None and spec.limit is None:
        return {"prompt_tokens": {"min": sum(n for n, _ in resolved.lengths(spec.task))}}
    return {}


def task_requirements(tasks: list[PlannedTask]) -> dict[str, PathRequirements]:
    """task -> what vLLM's counters must show over it (the tasks that require anything)."""
    return {t.spec.task: t.spec.requires for t in tasks if t.spec.requires is not None}


def _resolve_python(python: str | None, variant: str, strict: bool = True) -> str:
    if python is None:
        return sys.executable
    path = Path(python).expanduser()
    found = str(path) if path.is_file() else shutil.which(python)
    if not found or not os.access(found, os.X_OK):
        if not strict:  # --dry-run and doctor describe a plan for another machine
            return python
        raise ConfigError(
            f"variant `{variant}`: python interpreter `{python}` was not found or is not executable; "
            "give the full path of the other environment's python (e.g. /opt/venvs/pr/bin/python)."
        )
    return str(Path(found).absolute())


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def model_file_problems(path: Path) -> list[str]:
    """What a local model directory lacks of config.json and weights (doctor adds more)."""
    problems = []
    if not (path / "config.json").is_file():
        problems.append("config.json is missing")
    if not any(next(path.glob(p), None) for p in WEIGHT_PATTERNS):
        problems.append("no weights (" + ", ".join(WEIGHT_PATTERNS) + ")")
    return problems


def check_model_files(path: Path, config_path: str) -> None:
    """A local model directory needs its config.json and weights (vLLM would otherwise
    fail minutes later, inside the engine, in its own words)."""
    problems = model_file_problems(path)
    if problems:
        raise ConfigError(f"{config_path}: model directory `{path}` is not a complete model: {' and '.join(problems)}; "
                          "point `model.path` at the directory holding the model's config.json and weights.")


def check_model(model: str, config_path: str) -> None:
    if model.startswith(BUILTIN_PREFIX):
        name = model[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_MODELS:
            raise ConfigError(
                f"{config_path}: `model.path: {model}` names no built-in model; known: "
                + ", ".join(f"builtin:{n}" for n in sorted(BUILTIN_MODELS))
                + "."
            )
        return
    path = Path(model).expanduser()
    if path.is_dir():
        check_model_files(path, config_path)
        return
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", model)
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    if hub_id and (hf_home / "hub" / f"models--{model.replace('/', '--')}").is_dir():
        return
    raise ConfigError(
        f"{config_path}: model path `{model}` does not exist; set `model.path` to a local model directory "
        "(config.json + weights) or to builtin:tiny-gsm."
    )


def check_run_id(run_id: str) -> None:
    """A run id names one directory under the output root (evalpipe.paths.is_plain_name)."""
    if not is_plain_name(run_id):
        raise ConfigError(f"--run-id {run_id!r} is not a plain directory name; use {PLAIN_NAME_RULE}.")


def check_output_root(root: Path, what: str) -> None:
    """The output root must be (or become) a writable directory."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{what} {root} is a file, not a directory; pass a directory for the run directories.")
    parent = root
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {root} cannot be written ({parent} is not a writable directory); pass another --output.")


def _resources_unused_here(config: RunConfig, names: list[str]) -> list[str]:
    """A note for each `resources:` a run here does not use (a config written for a cluster,
    run with --cluster off, keeps them for its cluster runs)."""
    if config.cluster.enabled:
        return []
    holders = (["`cluster.resources`"] if "resources" in config.cluster.model_fields_set else []) + \
        [f"variant `{n}`'s `resources:`" for n in names if config.variants[n].resources is not None]
    if not holders:
        return []
    return [f"{', '.join(holders)} apply on a Ray cluster only, and this run is here (no `cluster.address`, or "
            "--cluster off): they are not used."]


def make_plan(
    config: RunConfig,
    config_path: str,
    task_selector: str,
    limit: int | None = None,
    variants: str | None = None,
    output: str | None = None,
    run_id: str | None = None,
    noise_floor: bool | None = None,
    strict: bool = True,
    process_mark: str | None = None,
) -> RunPlan:
    """``noise_floor`` (from the command line) overrides the config's ``noise_floor``.
    ``process_mark``: what marks the run's processes, when not the run's id (a bisect's runs
    share one, and so their pre-imported interpreters).
    ``strict=False`` plans without requiring the model and interpreters to exist here
    (--dry-run, doctor: a profile for a cluster); `verify_here` checks them after."""
    if strict:
        check_model(config.model.path, config_path)
    tasks = select_tasks(config, task_selector, limit)

    names = split_csv(variants, "--variants") or list(config.variants)
    unknown = [n for n in names if n not in config.variants]
    if unknown:
        raise ConfigError(
            f"variant `{unknown[0]}` is not defined in {config_path}; known variants: {', '.join(config.variants)}."
        )
    notes = []
    reference = config.reference_name
    if reference not in names:
        notes.append(f"reference `{reference}` is not among the chosen variants; `{names[0]}` serves as reference.")
        reference = names[0]
    ordered = [reference] + [n for n in names if n != reference]
    notes += _resources_unused_here(config, names)

    base_args = {"model": config.model.path, "dtype": config.model.dtype}
    if config.model.tokenizer:
        base_args["tokenizer"] = config.model.tokenizer
    base_args = deep_merge(base_args, config.engine)
    planned = []
    for name in ordered:
        v = config.variants[name]
        planned.append(
            PlannedVariant(
                name=name,
                description=v.description,
                python=_resolve_python(v.python, name, strict),
                env_overrides={**config.env, **v.env},
                engine_args=deep_merge(base_args, v.engine),
                launch=config.variant_launch(name),
                expect=_with_tasks(config.variant_expect(name), tasks),
            )
        )

    for pv in planned:  # sizes and dtype first: the checks below compute with them
        if pv.launch.mode != "endpoint":
            check_values(pv.name, pv.engine_args)
    _check_longctx(config, tasks, planned)
    _check_scenarios(config, tasks, planned)
    for pv in planned:
        if pv.launch.mode != "endpoint" and (problem := kv_budget_problem(pv.engine_args)):
            raise ConfigError(f"variant `{pv.name}`: {problem}")
    _check_units_leave_ray_engines_their_devices(config, planned)
    nf = config.noise_floor if noise_floor is None else (NoiseFloor() if noise_floor else None)
    if nf is not None and nf.enabled:
        planned.insert(1, _aa_variant(planned[0], nf))
        if planned[1].name in config.variants:
            raise ConfigError(
                f"variant `{planned[1].name}` collides with the name of the A/A noise-floor run; rename it or run with --no-noise-floor."
            )
    for pv in planned:  # the A/A run's too: noise_floor.launch may give it nodes of its own
        if pv.launch.deployment is not None and (problem := deployment_problem(pv.launch.deployment, pv.engine_args)):
            raise ConfigError(f"{config_path}: variant `{pv.name}`: {problem}.")
        if pv.launch.deployment is not None and (problem := _deployment_on_cluster_problem(config, pv)):
            raise ConfigError(f"{config_path}: variant `{pv.name}`: {problem}.")

    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    if run_id is not None:
        check_run_id(run_id)
    run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{task_selector.replace(',', '+').replace('/', '_')[:24]}-{digest[:6]}"
    for pv in planned:
        pv.run_id = process_mark or run_id
    root = Path(output or config.output).expanduser()
    if not root.is_absolute():
        root = Path.cwd() / root
    check_output_root(root, "--output" if output else f"`output` of {config_path}")
    return RunPlan(
        run_id=run_id,
        run_dir=root / run_id,
        config=config,
        config_path=config_path,
        config_sha256=digest,
        task_selector=task_selector,
        tasks=tasks,
        variants=planned,
        reference=reference,
        model=config.model.path,
        notes=notes,
    )


def verify_here(plan: RunPlan) -> None:
    """What make_plan(strict=False) let pass: the model and every interpreter exist on
    this machine (ConfigError otherwise)."""
    check_model(plan.config.model.path, plan.config_path)
    for v in plan.variants:
        _resolve_python(v.python, v.name)


def _check_longctx(config: RunConfig, tasks: list, planned: list[PlannedVariant]) -> None:
    """The long-context probes promise exact prompt lengths: refuse, before any engine
    starts, what would break them (shots, or a context window the engine would cut).
    lm-eval's RULER tasks run at longctx.lengths too: same refusals, with each task's
    own max_gen_toks (a RULER prompt takes up to its length; the LM keeps max_gen_toks free)."""
    for spec in (t.spec for t in tasks if is_generated_ruler(t.spec.task)):
        if spec.num_fewshot:
            raise ConfigError(
                f"task `{spec.task}` (RULER) is zero-shot: its items fill longctx.lengths, so shots would not fit; "
                "remove num_fewshot from its entry."
            )
        if spec.data_files:
            raise ConfigError(
                f"task `{spec.task}` (RULER) generates its items from the model's tokenizer; remove data_files from its entry."
            )
        _check_window(f"`{spec.task}` (RULER)", "up to ", max(config.longctx.lengths),
                      spec.max_gen_toks or RULER_MAX_GEN_TOKS[spec.task], planned)

    probes = [t.spec for t in tasks if t.spec.task in TASK_PROBE]
    if not probes:
        return
    longest = max(n for n, _, _ in target_lengths(config.longctx))
    for spec in probes:
        if spec.num_fewshot:
            raise ConfigError(
                f"task `{spec.task}` is zero-shot by construction (its prompts have exact token lengths); "
                "remove num_fewshot from its entry."
            )
        _check_window(f"`{spec.task}`", "", longest, spec.max_gen_toks or MAX_GEN_TOKS[TASK_PROBE[spec.task]], planned)


def _with_tasks(expect: Expectations, tasks: list[PlannedTask]) -> Expectations:
    """A variant's expectations with what each selected task requires of vLLM's counters."""
    required = task_requirements(tasks)
    return expect.model_copy(update={"tasks": {**required, **expect.tasks}}) if required else expect


def kv_budget_problem(engine_args: dict[str, Any]) -> str | None:
    """A KV cache set too small to hold one request of the context window (vLLM refuses it only
    once the engine is up); known when the config fixes both the blocks and their size."""
    blocks, size, window = (engine_args.get(k) for k in ("num_gpu_blocks_override", "block_size", "max_model_len"))
    if blocks is None or size is None or window is None or int(blocks) * int(size) >= int(window):
        return None
    return (f"num_gpu_blocks_override {blocks} blocks of block_size {size} hold {int(blocks) * int(size)} tokens, fewer than "
            f"one request of max_model_len {window}, so the engine could serve no long request; give at least "
            f"{-(-int(window) // int(size))} blocks or lower max_model_len.")


def _check_scenarios(config: RunConfig, tasks: list[PlannedTask], planned: list[PlannedVariant]) -> None:
    """The scenarios' prompts must drive their paths in every variant's engine: refuse, before
    any engine starts, a prompt that does not fit the window or a chunked prompt no chunk cuts."""
    chosen = [t.spec for t in tasks if t.spec.task in GENERATED_SCENARIOS]
    if not chosen:
        return
    spec = config.scenarios.resolved(config.engine)
    for task in chosen:
        if task.num_fewshot:
            raise ConfigError(f"task `{task.task}` is zero-shot by construction (its prompts have exact token lengths); "
                              "remove num_fewshot from its entry.")
        try:
            lengths = [n for n, _ in spec.lengths(task.task)]
        except UserError as err:
            raise ConfigError(str(err)) from None
        generated = task.max_gen_toks or SCENARIOS[task.task].max_gen_toks
        source = {"scenario_prefix_cache": "scenarios.prefix_tokens", "scenario_chunked_prefill":
                  "scenarios.chunk_tokens + scenarios.chunk_offsets", "scenario_near_limit": "scenarios.window_tokens",
                  "scenario_preemption": "scenarios.preempt_tokens", "scenario_speculative": "scenarios.speculative_tokens"}[task.task]
        needed = SCENARIOS[task.task].needs_engine
        for v in planned:
            if needed is not None and v.launch.mode != "endpoint" and not v.engine_args.get(needed):
                raise ConfigError(
                    f"`{task.task}` drives {SCENARIOS[task.task].what.split(':')[0]}, which variant `{v.name}`'s engine does "
                    f"not run (no engine.{needed}); add it (configs/speculative.yaml: {{method: ngram, "
                    "num_speculative_tokens: 3, prompt_lookup_max: 4}) or drop the task.")
            window = v.engine_args.get("max_model_len")
            if window is not None and max(lengths) + generated > int(window):
                raise ConfigError(
                    f"`{task.task}` needs prompts of up to {max(lengths)} tokens ({source}) plus {generated} generated, more "
                    f"than max_model_len {window} of variant `{v.name}`; raise engine.max_model_len to at least "
                    f"{max(lengths) + generated} or lower {source}.")
            blocks, size = v.engine_args.get("num_gpu_blocks_override"), v.engine_args.get("block_size")
            burst = spec.preempt_requests * (max(lengths) + generated)
            if task.task == "scenario_preemption" and blocks is not None and size is not None and int(blocks) * int(size) >= burst:
                raise ConfigError(
                    f"`{task.task}` sends {spec.preempt_requests} requests of up to {max(lengths) + generated} tokens at once "
                    f"({burst} tokens), which the {blocks} KV blocks of {size} tokens of variant `{v.name}` hold, so nothing "
                    "would be preempted; lower engine.num_gpu_blocks_override or raise scenarios.preempt_requests.")
            chunk = v.engine_args.get("max_num_batched_tokens")
            if task.task == "scenario_chunked_prefill" and chunk is not None and int(chunk) >= min(lengths):
                raise ConfigError(
                    f"`{task.task}` cuts prompts of {min(lengths)} tokens into chunks, but variant `{v.name}` prefills "
                    f"{chunk} tokens per step (max_num_batched_tokens), so no chunk would cut them; set scenarios.chunk_tokens "
                    f"to that variant's max_num_batched_tokens or lower max_num_batched_tokens below {min(lengths)}.")


def _deployment_on_cluster_problem(config: RunConfig, variant: PlannedVariant) -> str | None:
    """On a Ray cluster Ray places a deployment's nodes, in a placement group of its own."""
    deployment = variant.launch.deployment
    if not config.cluster.enabled or deployment is None:
        return None
    if deployment.launchers:
        return ("on a Ray cluster Ray places a deployment's nodes, so `launch.deployment.launchers` would be a second way "
                "to put them somewhere; remove the launchers, or run without `cluster:` (--cluster off)")
    if config.cluster.distinct_nodes and deployment.nodes > 1:
        return ("a deployment spreads its own nodes (a placement group of its own, a bundle per node), which "
                "`cluster.distinct_nodes` cannot place beside the other variants; remove distinct_nodes (every unit then "
                "has a group of its own)")
    return None


def _check_units_leave_ray_engines_their_devices(config: RunConfig, planned: list[PlannedVariant]) -> None:
    if not config.cluster.enabled:
        return
    for v in planned:
        if v.launch.mode == "endpoint" or v.launch.deployment is not None:  # a deployment: evalpipe places its nodes
            continue
        demand = config.variants[v.name].resources or config.cluster.resources
        problem = held_devices_problem(v.name, v.engine_args, demand)
        if problem is not None:
            raise ConfigError(problem)


def _check_window(what: str, up_to: str, longest: int, generated: int, planned: list[PlannedVariant]) -> None:
    """Refuse a variant whose context window would cut the longest prompt: the LM keeps
    room for the generated tokens and cuts the prompt's start, losing the exact length."""
    for v in planned:
        window = v.engine_args.get("max_model_len")
        if window is not None and longest + generated > int(window):
            raise ConfigError(
                f"{what} needs prompts of {up_to}{longest} tokens plus {generated} generated, more than "
                f"max_model_len {window} of variant `{v.name}`; raise engine.max_model_len to at least "
                f"{longest + generated} or drop the longer lengths from longctx.lengths."
            )


# vLLM's max_num_seqs when a config leaves it unset (LLM class default).
VLLM_DEFAULT_MAX_NUM_SEQS = 256


def _aa_variant(reference: PlannedVariant, nf: NoiseFloor) -> PlannedVariant:
    """The reference once more, with another batch arrangement: the A/A noise floor.

    Same interpreter, environment and numerics; only the order of requests and the
    batch limits differ, so whatever the comparison sees here is run-to-run noise of
    this engine, not a change."""
    parts = ["requests in reverse order"] if nf.reverse_order else []
    # An endpoint cannot be restarted with other settings: its A/A run always reuses it.
    if nf.reuse_server or reference.launch.mode == "endpoint":
        if reference.launch.mode == "offline":
            raise ConfigError(
                "noise_floor.reuse_server needs a server: set launch.mode to serve or endpoint for the reference, "
                "or drop reuse_server (offline, the A/A run starts an engine of its own)."
            )
        if nf.engine or nf.launch:
            which = "engine" if nf.engine else "launch"
            raise ConfigError(f"noise_floor.{which} cannot apply with reuse_server (the reference's server is already running); "
                              "drop one of them.")
        # The batch arrangement changes through the client: half the requests in flight.
        launch = reference.launch.model_copy(update={"concurrency": max(1, reference.launch.concurrency // 2)})
        parts.append(f"the reference's server, concurrency {launch.concurrency}")
        return PlannedVariant(
            name=aa_variant_name(reference.name),
            description=f"A/A noise floor: {reference.name} again ({', '.join(parts)})",
            python=reference.python,
            env_overrides=dict(reference.env_overrides),
            engine_args=dict(reference.engine_args),
            launch=launch,
            expect=_same_path(reference.expect),
            reverse_order=nf.reverse_order,
            aa_of=reference.name,
            server_of=reference.name if reference.launch.mode == "serve" else None,
        )
    overrides = nf.engine or {
        "max_num_seqs": max(1, int(reference.engine_args.get("max_num_seqs") or VLLM_DEFAULT_MAX_NUM_SEQS) // 2)
    }
    parts += [f"{k}={v}" for k, v in sorted(overrides.items())]
    launch = reference.launch
    if nf.launch:
        try:
            launch = Launch.model_validate(deep_merge(reference.launch.model_dump(exclude_unset=True), nf.launch))
        except ValidationError as err:
            where, what = first_problem(err)
            raise ConfigError(f"noise_floor.launch{'.' + where if where else ''}: {what}") from None
        parts.append("its own launch")
    return PlannedVariant(
        name=aa_variant_name(reference.name),
        description=f"A/A noise floor: {reference.name} again ({', '.join(parts) or 'same settings'})",
        python=reference.python,
        env_overrides=dict(reference.env_overrides),
        engine_args=deep_merge(reference.engine_args, overrides),
        launch=launch,
        expect=_same_path(reference.expect),
        reverse_order=nf.reverse_order,
        aa_of=reference.name,
    )


def _same_path(expect: Expectations) -> Expectations:
    """The A/A run claims the reference's path, and is meant to run the same code."""
    return expect.model_copy(update={"same_path": True})


def _settings(plan: RunPlan, v: PlannedVariant) -> dict[str, Any]:
    source = plan.config.variants[v.aa_of or v.name]
    engine = source.engine if v.aa_of is None else {
        k: val for k, val in v.engine_args.items() if plan.variant(v.aa_of).engine_args.get(k) != val
    }
    return {"description": v.description, "python": v.python, "env": source.env, "engine": engine,
            "launch": v.launch.model_dump(exclude_defaults=True) or {"mode": "offline"},
            # the variant's effective expectations: what `evalpipe compare` judges its probe records by
            "expect": v.expect.model_dump(mode="json", exclude_defaults=True)}


def run_info(plan: RunPlan, **more: Any) -> RunDocument:
    """The resolved, reproducible description of a run (the static part of run.json),
    credentials redacted (env values, URL passwords, the api_key_env variables): run.json
    feeds the reports and the history. ``more``: further fields (nightly: its kind and components)."""
    keys = api_key_names([plan.config.launch, *(v.launch for v in plan.config.variants.values()),
                          *(v.launch for v in plan.variants)])
    return RunDocument.model_validate(redact({
        "version": RUN_VERSION,
        "run_id": plan.run_id,
        "config_path": plan.config_path,
        "config": plan.config.model_dump(mode="json"),
        "fingerprints": {"config_sha256": plan.config_sha256, "code": code_version()},
        "task_selector": plan.task_selector,
        "tasks": [t.to_job() for t in plan.tasks],
        "reference": plan.reference,
        "variants": [v.name for v in plan.variants],
        "variant_settings": {v.name: _settings(plan, v) for v in plan.variants},
        "noise_floor": next(
            ({"variant": v.name, "of": v.aa_of, "reverse_order": v.reverse_order} for v in plan.variants if v.aa_of),
            None,
        ),
        "model": {"path": plan.model},
        "notes": plan.notes,
        **more,
    }, keys))
