"""Check, in the variant's own interpreter, that every name a config probes exists there.

    python -m evalpipe.probes.resolve < names.json     (a JSON list of names)

prints one JSON line, ``EVALPIPE_PROBE_NAMES {...}``: per name where it is defined (the
module to watch and the attribute path in it), its canonical name (re-exports resolved:
``vllm.distributed.tensor_model_parallel_all_gather`` is counted where it is defined,
in ``vllm.distributed.communication_op``) or why it cannot be found. Three forms:

- ``package.module.function`` or ``package.module.Class.method``: a function to count;
- ``package.module.predicate()``: a zero-argument callable whose result is recorded;
- ``parallel_config.use_sequence_parallel_moe``: a field of vLLM's ``VllmConfig``
  (the first part names one of its sub-configs), read from the engine's resolved config.

Standard library only (it runs in another build's interpreter); importing the modules it
checks is its whole cost, so the parent caches its answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from typing import Any

MARK = "EVALPIPE_PROBE_NAMES "


def kind_of(name: str) -> str:
    if name.endswith("()"):
        return "predicate"
    first = name.split(".", 1)[0]
    return "config" if first.endswith("_config") or first == "additional_config" else "function"


def _import_prefix(parts: list[str]) -> tuple[Any, int]:
    """The longest importable module prefix of ``parts`` and its length."""
    last_error: Exception | None = None
    for n in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:n])
        try:
            return importlib.import_module(name), n
        except ModuleNotFoundError as err:
            if err.name and err.name != name and not name.startswith(err.name + "."):
                raise  # the module exists but imports something missing
            last_error = err
    raise ModuleNotFoundError(f"no module of {'.'.join(parts)} can be imported ({last_error})")


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package (found without importing it)."""
    try:
        return importlib.util.find_spec(dotted) is not None
    except Exception:  # noqa: BLE001 - a parent that is no package, or does not import: not a module here
        return False


def resolve_callable(name: str) -> dict[str, Any]:
    dotted = name[:-2] if name.endswith("()") else name
    parts = dotted.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return {"error": "is not a dotted name such as package.module.Class.method"}
    if _is_module(dotted):
        return {"error": f"is a module, not a function (name one of its functions, e.g. {dotted}.<function>)"}
    try:
        module, n = _import_prefix(parts)
    except Exception as err:  # noqa: BLE001 - any import failure is this name's answer
        return {"error": f"cannot be imported: {type(err).__name__}: {err}"}
    owner: Any = module
    for i, part in enumerate(parts[n:], start=n):
        try:
            value = inspect.getattr_static(owner, part)
        except AttributeError:
            where = ".".join(parts[:i])
            return {"error": f"does not exist: {where} has no attribute `{part}`"}
        if i < len(parts) - 1:
            owner = getattr(owner, part)
    raw = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if inspect.ismodule(raw):
        return {"error": f"is a module, not a function (name one of its functions, e.g. {dotted}.<function>)"}
    if isinstance(raw, property) or not callable(raw):
        return {"error": f"is a {type(raw).__name__}, not a function or method"}
    attr_path = parts[n:]
    if isinstance(owner, type):
        # count a method where its class is defined: module.Class.method
        module_name, attr = owner.__module__, f"{owner.__qualname__}.{attr_path[-1]}"
    else:
        defined_in = getattr(raw, "__module__", None)
        qual = getattr(raw, "__qualname__", None)
        home = sys.modules.get(defined_in or "")
        if isinstance(defined_in, str) and home is not None and qual and "<" not in qual and getattr(home, qual.split(".")[0], None) is not None:
            module_name, attr = defined_in, qual
        else:
            module_name, attr = module.__name__, ".".join(attr_path)
    canonical = f"{module_name}.{attr}" + ("()" if name.endswith("()") else "")
    found = {"module": module_name, "attr": attr, "canonical": canonical}
    return {**found, "kind": "class"} if isinstance(raw, type) and not name.endswith("()") else found


def resolve_config_path(name: str) -> dict[str, Any]:
    """``parallel_config.use_sequence_parallel_moe``: the sub-config is a field of VllmConfig
    and has that attribute (deeper parts are read as they are found in the engine)."""
    try:
        # what it looks up, not what it needs: imported by name like every other checked module
        VllmConfig = importlib.import_module("vllm.config").VllmConfig
    except Exception as err:  # noqa: BLE001
        return {"error": f"cannot be checked: vllm.config does not import ({type(err).__name__}: {err})"}
    parts = name.split(".")
    fields = getattr(VllmConfig, "__dataclass_fields__", {}) or getattr(VllmConfig, "model_fields", {})
    if parts[0] not in fields:
        return {"error": f"does not exist: VllmConfig has no field `{parts[0]}`"}
    if len(parts) > 1 and parts[0] != "additional_config":
        import typing

        try:
            sub = typing.get_type_hints(VllmConfig).get(parts[0])
        except Exception:  # noqa: BLE001 - unresolvable annotations: checked in the engine instead
            sub = None
        sub_fields = getattr(sub, "__dataclass_fields__", None) or getattr(sub, "model_fields", None)
        if isinstance(sub, type) and sub_fields is not None and parts[1] not in sub_fields and not hasattr(sub, parts[1]):
            return {"error": f"does not exist: {sub.__name__} has no field or property `{parts[1]}`"}
    return {"canonical": name}


def resolve_names(names: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in names:
        kind = kind_of(name)
        found = resolve_config_path(name) if kind == "config" else resolve_callable(name)
        out[name] = {"name": name, "kind": kind, **found}  # a class keeps kind "class": compared, never wrapped
    return out


def source_files(resolved: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Files (with their mtimes) whose change could change these answers: the modules the
    names were found in, vLLM's config module for config paths. The parent's cache of this
    answer is valid while none of them changed."""
    import os

    modules = {entry["module"] for entry in resolved.values() if entry.get("module")}
    if any(entry["kind"] == "config" for entry in resolved.values()):
        modules.add("vllm.config")
    files = {os.path.abspath(__file__): os.path.getmtime(__file__)}  # this lookup's own rules
    for name in sorted(modules):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and os.path.isfile(path):
            files[path] = os.path.getmtime(path)
    return files


def main() -> int:
    names = json.loads(sys.stdin.read() or "[]")
    resolved = resolve_names(names)
    sys.stdout.write(MARK + json.dumps({"names": resolved, "files": source_files(resolved)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
