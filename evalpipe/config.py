"""Run configuration: pydantic models (unknown keys are errors) and YAML loading.

A config names a model, the vLLM engine arguments (vLLM's own names, passed through
unchanged), the variants to compare (each may add env vars, override engine args —
merged deeply, so nested dicts such as `additional_config` merge — or run under a
different Python interpreter), the tasks, what to capture, and where to write.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evalpipe.paths import PROJECT_ROOT

DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"


class ConfigError(ValueError):
    """A problem the user fixes in their config or arguments (exit code 2)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    path: str = Field(description="Local model directory, hub-style id already in the local cache, or builtin:NAME.")
    tokenizer: str | None = Field(default=None, description="Tokenizer path if it differs from the model's.")
    dtype: str = Field(default="auto", description="vLLM dtype; a variant may override it through its engine args.")


def _env_values_as_strings(value: Any) -> Any:
    # YAML turns `VLLM_X: 1` into an int and `true` into a bool; an environment holds strings.
    if isinstance(value, dict):
        return {
            str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in value.items()
        }
    return value


class Variant(_Strict):
    description: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict, description="Overrides merged deeply into the top-level engine args.")
    python: str | None = Field(default=None, description="Interpreter of another environment (a different build); default: this one.")

    _env_strings = field_validator("env", mode="before")(_env_values_as_strings)


class TaskSpec(_Strict):
    task: str = Field(description="lm-eval task name (from tasks/ or lm-eval's own registry).")
    num_fewshot: int | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N documents.")
    max_gen_toks: int | None = Field(default=None, gt=0)
    data_files: dict[str, str | list[str]] | None = Field(
        default=None,
        description="Local data files per split (parquet/jsonl/json/csv) instead of the task's hub data set; relative paths resolve against the data directory.",
    )


class Capture(_Strict):
    topk: int = Field(default=5, ge=1, le=20, description="Top-k logprobs recorded per generated token (vLLM caps at max_logprobs, 20).")


class RunConfig(_Strict):
    model: ModelSpec
    engine: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict, description="Environment shared by all variants.")
    variants: dict[str, Variant]
    reference: str | None = None
    tasks: dict[str, list[TaskSpec]]
    capture: Capture = Capture()
    output: str = "reports/runs"
    seed: int = 1234

    _env_strings = field_validator("env", mode="before")(_env_values_as_strings)

    @field_validator("tasks", mode="before")
    @classmethod
    def _single_task_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: (v if isinstance(v, list) else [v]) for k, v in value.items()}
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
        for name, variant in self.variants.items():
            if "model" in variant.engine:
                raise ValueError(f"variant `{name}` sets engine.model; set the model once under `model:`.")
        return self

    @property
    def reference_name(self) -> str:
        return self.reference or next(iter(self.variants))


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge `override` into a copy of `base`; nested dicts merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key `{where}`; remove it or fix its spelling (see configs/default.yaml for the known keys)."
    if first["type"] == "missing":
        return f"{source}: required key `{where}` is missing; add it."
    msg = first["msg"].removeprefix("Value error, ")
    return f"{source}: `{where}`: {msg}" if where != "(top level)" else f"{source}: {msg}"


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with model, engine, variants, tasks ...; got {type(data).__name__}.")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_config(path: str | Path | None = None) -> RunConfig:
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing YAML file with -c/--config.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {getattr(err, 'problem', err)}; fix the syntax.") from None
    return parse_config(data, str(path))
