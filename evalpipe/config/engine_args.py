"""Check a run's vLLM engine arguments against the vLLM each variant will run, before
any engine starts.

vLLM's argument names pass through evalpipe unchanged, so a misspelt one used to surface
only after an engine start, as lm-eval's or vLLM's ``unexpected keyword argument``. The
valid names come from the variant interpreter's own vLLM (another build may know other
arguments), read once per interpreter and vLLM install and cached under the cache dir.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
from typing import Callable, Iterable

from evalpipe.atomic_files import write_json
from evalpipe.errors import UserError
from evalpipe.paths import cache_dir

# offline: what vllm.LLM(**kwargs) accepts (every EngineArgs field plus LLM's own
# parameters); serve: the destinations of the server's command-line flags (the module
# moved between vLLM versions). One marked JSON line, after whatever vLLM logs on import.
_NAMES_SCRIPT = r"""
import dataclasses, inspect, json
from vllm.engine.arg_utils import EngineArgs
offline = {f.name for f in dataclasses.fields(EngineArgs)}
from vllm.entrypoints.llm import LLM
offline |= {p for p, v in inspect.signature(LLM.__init__).parameters.items()
            if p != "self" and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
serve = {a.dest for a in make_arg_parser(FlexibleArgumentParser())._actions if a.dest != "help"}
print("EVALPIPE_ENGINE_ARGS " + json.dumps({"offline": sorted(offline), "serve": sorted(serve)}))
"""

# Cheap (no vLLM import): which vLLM this interpreter would load, as the cache key.
_STAMP_SCRIPT = r"""
import importlib.util, json, os
spec = importlib.util.find_spec("vllm")
origin = spec.origin if spec else None
print(json.dumps([origin, os.path.getmtime(origin) if origin else None]))
"""
_MARK = "EVALPIPE_ENGINE_ARGS "


class EngineArgError(UserError):
    """A variant's engine argument its vLLM does not know, or no vLLM to ask."""


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a typo most likely meant (None when nothing is close)."""
    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None


# Sizes that vLLM takes as positive integers; a wrong one otherwise surfaces only after an
# engine has started (or deep inside it).
POSITIVE_INT_ARGS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "pipeline_parallel_size", "data_parallel_size", "block_size", "max_logprobs")


# vLLM's ModelDType (vllm/config/model.py) as a config spells it; vLLM refuses anything else
# only once the engine reads the model
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def dtype_problem(value: object) -> str | None:
    """Why vLLM would refuse ``value`` as its dtype (None when it takes it)."""
    if value in DTYPES:
        return None
    return f"is {value!r}; vLLM takes one of {', '.join(DTYPES)}"


def check_values(variant: str, engine_args: dict) -> None:
    """One sentence for the first size argument that is not a positive integer, or a dtype vLLM does not know."""
    if "dtype" in engine_args and (problem := dtype_problem(engine_args["dtype"])):
        raise EngineArgError(f"variant `{variant}`: engine argument `dtype` {problem} (fix it in `model.dtype` or under `engine:`).")
    for key in POSITIVE_INT_ARGS:
        value = engine_args.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "max_logprobs" else 1):
            raise EngineArgError(
                f"variant `{variant}`: engine argument `{key}` is {value!r}; it must be a "
                f"{'non-negative' if key == 'max_logprobs' else 'positive'} integer (fix it under `engine:` in the config)."
            )


def check_engine_args(variant: str, python: str, engine_args: dict, known: set[str]) -> None:
    """Raise one sentence for the first argument ``known`` lacks, or a size that is not a positive integer."""
    check_values(variant, engine_args)
    for key in sorted(engine_args):
        if key in known:
            continue
        hint = closest(key, known)
        did_you_mean = f"did you mean `{hint}`?" if hint else "see `vllm serve --help` for the names"
        raise EngineArgError(
            f"variant `{variant}`: `{key}` is not an engine argument of the vLLM under {python} "
            f"({did_you_mean}); fix it under `engine:` in the config (top level or the variant's)."
        )


def check_plan(variants: Iterable, say: Callable[[str], None] | None = None) -> None:
    """Check every planned variant's engine arguments (``PlannedVariant``: name, python,
    engine_args, launch, process_env) against its interpreter's vLLM: vllm.LLM's
    arguments offline, the server's flags in serve mode (endpoint mode applies none:
    the server is already running). One sentence on the first unknown one.
    Interpreters shared by several variants are asked once."""
    variants = list(variants)
    for v in variants:  # values first: no interpreter needs asking for them
        if v.launch.mode != "endpoint":
            check_values(v.name, v.engine_args)
    known: dict[str, dict[str, set[str]]] = {}
    for v in variants:
        mode = v.launch.mode
        if mode == "endpoint":
            continue
        if v.python not in known:
            known[v.python] = known_engine_args(v.python, env=v.process_env(), say=say)
        check_engine_args(v.name, v.python, v.engine_args, known[v.python][mode])


def known_engine_args(python: str, env: dict[str, str] | None = None, timeout_s: float = 300,
                      say: Callable[[str], None] | None = None) -> dict[str, set[str]]:
    """The argument names under ``python``'s vLLM, per mode (``offline``: vllm.LLM's,
    ``serve``: the server's flags), cached per vLLM install."""
    env = dict(os.environ if env is None else env)
    stamp = _run(python, _STAMP_SCRIPT, env, timeout_s=60).strip().splitlines()[-1]
    origin, _mtime = json.loads(stamp)
    if origin is None:
        raise EngineArgError(f"{python} cannot import vllm; install vLLM into that environment "
                             "or point the variant's `python:` at one that has it.")
    key = hashlib.sha256(f"{os.path.realpath(python)}\0{stamp}".encode()).hexdigest()[:16]
    cached = cache_dir() / "engine-args" / f"{key}.json"
    if cached.is_file():
        names = json.loads(cached.read_text(encoding="utf-8"))["names"]
        if isinstance(names, dict):  # caches written before serve mode hold a list
            return {mode: set(n) for mode, n in names.items()}
    if say:
        say(f"reading the engine arguments of the vLLM under {python} (once per vLLM install)")
    out = _run(python, _NAMES_SCRIPT, env, timeout_s=timeout_s)
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(_MARK)), None)
    if line is None:
        raise EngineArgError(f"could not read vLLM's engine arguments under {python}")
    names = json.loads(line[len(_MARK):])
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_json(cached, {"python": python, "vllm": origin, "names": names})
    return {mode: set(n) for mode, n in names.items()}


def _run(python: str, script: str, env: dict[str, str], timeout_s: float) -> str:
    try:
        proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                              env={**env, "VLLM_LOGGING_LEVEL": "ERROR"})
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineArgError(f"could not ask {python} for vLLM's engine arguments: {err}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineArgError(f"{python} could not load vLLM to check the engine arguments: {last}")
    return proc.stdout
