"""Reading a run config from YAML: the `extends:` chain, null removing a key, pydantic's
complaint as one sentence (an unknown key with the key it was meant to be); --gates files."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from evalpipe.config.errors import ConfigError
from evalpipe.config.gate_settings import Gates, margin_problem
from evalpipe.config.merge import deep_merge
from evalpipe.config.run_config import RunConfig
from evalpipe.config.yaml_source import read_yaml_file
from evalpipe.install import default_config
from evalpipe.paths import file_problem


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
    null_sampling = _null_task_sampling(data)
    if null_sampling is not None:
        raise ConfigError(f"{source}: `{null_sampling}: null` is not a setting: leave the key out (the task takes the run's "
                          "`sampling:`, else decodes greedily) or give the task's own sampling settings.")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def _null_task_sampling(data: dict[str, Any]) -> str | None:
    """Where a task says `sampling: null`, which reads as "greedy here" but would take the
    run's sampling (an absent setting and a null one are the same to the model)."""
    groups = data.get("tasks")
    for group, specs in groups.items() if isinstance(groups, dict) else ():
        for i, spec in enumerate(specs if isinstance(specs, list) else [specs]):
            if isinstance(spec, dict) and "sampling" in spec and spec["sampling"] is None:
                return f"tasks.{group}.{i}.sampling"
    return None


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
    problem = file_problem(path)
    if problem is not None:
        inside = sorted(path.glob("*.yaml"))[:3] if path.is_dir() else []
        example = f" (e.g. {', '.join(str(p) for p in inside)})" if inside else ""
        raise ConfigError(f"config file {path}{where} {problem}; {fix}{example}.")
    data = read_yaml_file(path, f"config file {path}{where}", fix)
    if not isinstance(data, dict) or "extends" not in data:
        return data
    base_name = data.pop("extends")
    if not isinstance(base_name, str) or not base_name.strip():
        raise ConfigError(f"{path}: `extends` must be the path of another config file; got {base_name!r}.")
    base_path = (path.parent / base_name).resolve()
    if base_path in chain or base_path == path.resolve():
        loop = [*(chain[chain.index(base_path):] if base_path in chain else []), path.resolve(), base_path]
        raise ConfigError(f"{path}: `extends: {base_name}` closes a cycle ({' extends '.join(str(p) for p in loop)}); "
                          "remove `extends:` from one of them.")
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
        problem = file_problem(path)
        if problem is not None:
            raise ConfigError(f"gates file {path} {problem}; pass a YAML file with a `gates:` mapping to --gates.")
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
