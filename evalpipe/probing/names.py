"""The names a run's expectations probe, looked up in each variant's own interpreter before
any engine starts.

A name that does not exist where the variant runs (a misspelt method, a class the base
build does not have) would otherwise be counted zero times and read as "not called":
an expectation that can never fail, or fail for the wrong reason. So every name of a
variant's own expectations must resolve in that variant's interpreter, or the run stops
in one sentence. Names that only other variants declare are probed where they exist and
recorded as absent elsewhere (the PR's class in the base build).

The lookup imports the modules that hold the names (:mod:`evalpipe.probes.resolve`,
seconds for vLLM's), so its answer is cached per interpreter and names, valid while the
source files it came from are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from evalpipe.config.errors import ConfigError
from evalpipe.config.expectations import Expectations
from evalpipe.config.path_requirements import counter_words
from evalpipe.paths import cache_dir
from evalpipe.probes import resolve as lookup
from evalpipe.probes.record import bin_size
from evalpipe.probes.resolve import MARK
from evalpipe.rundir.artifacts import write_json


@dataclass(frozen=True)
class ResolvedName:
    name: str  # as the config writes it
    kind: str  # function | predicate | config
    canonical: str | None = None  # where it is defined (what the records count it as)
    module: str | None = None
    attr: str | None = None
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.error is None

    def spec_entry(self) -> dict[str, str]:
        return {"name": self.name, "module": self.module or "", "attr": self.attr or "", "canonical": self.canonical or self.name}


@dataclass
class VariantNames:
    """Every probed name as this variant's interpreter knows it."""

    names: dict[str, ResolvedName] = field(default_factory=dict)

    def canonical(self, name: str) -> str:
        found = self.names.get(name)
        return found.canonical if found is not None and found.canonical else name


def probed_names(expectations: Iterable[Expectations]) -> list[str]:
    """Every name any variant's expectations need looked up, in a stable order."""
    out: list[str] = []
    for expect in expectations:
        out += expect.names()
    return sorted(set(out))


def resolve(python: str, env: dict[str, str], names: list[str], *, say: Callable[[str], None] | None = None,
            timeout_s: float = 300) -> dict[str, ResolvedName]:
    """``names`` looked up under ``python`` (cached while their source files are unchanged)."""
    if not names:
        return {}
    rules = hashlib.sha256(Path(lookup.__file__).read_bytes()).hexdigest()  # another evalpipe looks up otherwise
    # the same interpreter finds other modules on another PYTHONPATH (another build's checkout)
    key = hashlib.sha256(json.dumps([os.path.realpath(python), env.get("PYTHONPATH", ""), names, rules]).encode()).hexdigest()[:16]
    cached = cache_dir() / "probe-names" / f"{key}.json"
    answer = _cached(cached)
    if answer is None:
        if say:
            say(f"looking up {len(names)} probed names in {python} (cached until their modules change)")
        answer = _ask(python, env, names, timeout_s)
        if all("error" not in entry for entry in answer["names"].values()):
            cached.parent.mkdir(parents=True, exist_ok=True)
            write_json(cached, answer)
    return {name: ResolvedName(**entry) for name, entry in answer["names"].items()}


def _cached(path: Any) -> dict[str, Any] | None:
    try:
        answer = json.loads(path.read_text(encoding="utf-8"))
        if all(os.path.getmtime(f) == mtime for f, mtime in answer["files"].items()):
            return answer
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def _ask(python: str, env: dict[str, str], names: list[str], timeout_s: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([python, "-m", "evalpipe.probes.resolve"], input=json.dumps(names), capture_output=True,
                              text=True, timeout=timeout_s, env={**env, "VLLM_LOGGING_LEVEL": "ERROR"})
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"could not look up the probed names under {python}: {err}") from None
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(MARK)), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"{python} could not look up the probed names ({last}); check that it runs and imports evalpipe.")
    return json.loads(line[len(MARK):])


def check_variant(variant: str, python: str, expect: Expectations, found: dict[str, ResolvedName]) -> None:
    """One sentence for the first name of the variant's own expectations its interpreter lacks."""
    for key, names in (("model", [expect.model] if expect.model else []), ("layers", expect.layers),
                       ("called", expect.called), ("not_called", expect.not_called),
                       ("per_forward", list(expect.per_forward)), ("switches", list(expect.switches))):
        for name in names:
            entry = found.get(name)
            if entry is None:
                continue
            problem = entry.error
            if problem is not None and key in ("model", "layers") and problem.startswith("is a module"):
                problem = "is a module, not a class (name the class defined in it, module.Class)"
            elif problem is None and key in ("model", "layers") and entry.kind != "class":
                problem = "is not a class"
            elif problem is None and key not in ("model", "layers") and entry.kind == "class":
                problem = "is a class, not a function (name one of its methods, e.g. Class.forward)"
            if problem:
                raise ConfigError(
                    f"variant `{variant}`: `expect.{key}` names `{name}`, which {problem} under {python}; "
                    "fix the name (module.Class.method, as that environment spells it) or remove it."
                )


def lookup_place(python: str, env: dict[str, str]) -> tuple[str, str]:
    """Where a name lookup is made, and what variants on it share: the interpreter and the
    import path (one interpreter sees other modules on another path)."""
    return python, env.get("PYTHONPATH", "")


def resolve_plan(variants: Iterable[Any], say: Callable[[str], None] | None = None) -> dict[str, VariantNames]:
    """Look every probed name up in each planned variant's interpreter (one lookup per
    interpreter) and refuse a variant whose own expectations name something missing there.
    ``variants``: PlannedVariant (name, python, expect, launch, process_env)."""
    variants = list(variants)
    names = probed_names(v.expect for v in variants)
    by_environment: dict[tuple[str, str], dict[str, ResolvedName]] = {}
    out: dict[str, VariantNames] = {}
    for v in variants:
        if v.launch.mode == "endpoint":
            out[v.name] = VariantNames()  # its server runs elsewhere: nothing here to look in
            continue
        env = v.process_env()
        where = lookup_place(v.python, env)
        if where not in by_environment:
            by_environment[where] = resolve(v.python, env, names, say=say)
        check_variant(v.name, v.python, v.expect, by_environment[where])
        out[v.name] = VariantNames(by_environment[where])
    return out



def checks_lines(variant: Any) -> list[str]:
    """What the path probes will check of ``variant`` (a PlannedVariant), for --dry-run and doctor."""
    expect: Expectations = variant.expect
    if variant.launch.mode == "endpoint":
        return ["path not verifiable in endpoint mode: the server runs outside evalpipe, its code cannot be probed "
                "(the verdict is INCONCLUSIVE)"]
    lines = []
    if expect.model:
        lines.append(f"model class {expect.model}")
    if expect.engine_processes is not None:
        lines.append(f"the model built in {expect.engine_processes} engine process(es)")
    if expect.layers:
        lines.append(f"decoder layers {' or '.join(expect.layers)}")
    for key, label in (("called", "called at least once"), ("not_called", "never called")):
        for name in getattr(expect, key):
            lines.append(f"{label}: {name}")
    for key, count in expect.per_forward.items():
        lines.append(f"in every forward pass: {count if isinstance(count, int) else count.describe()} x {key}")
    for key, passes in expect.forward_tokens.items():
        lines.append(f"forward passes of {bin_size(key)}: {passes.describe()}")
    for key, value in expect.switches.items():
        lines.append(f"switch as the engine resolved it: {key} = {value!r}")
    for task, requirements in expect.tasks.items():
        lines += [f"task {task}, vLLM's counters: {wanted.describe()} {counter_words(name)}"
                  for name, wanted in requirements.counted()]
    deployment = variant.launch.deployment
    if deployment is not None and not variant.server_of:
        lines.append(f"every one of its {deployment.nodes} nodes built the model" +
                     (" and called " + ", ".join(expect.called) if expect.called else ""))
    if expect.deployment is not None:
        shape = expect.deployment
        parts = [f"{shape.nodes} nodes" if shape.nodes is not None else "",
                 f"data-parallel ranks per node {shape.ranks_per_node}" if shape.ranks_per_node is not None else "",
                 f"data_parallel_size {shape.data_parallel_size} in every process" if shape.data_parallel_size else ""]
        lines.append("deployment as its processes show it: " + ", ".join(p for p in parts if p))
    if expect.same_path:
        lines.append("meant to run the reference's code (an A/A pair)")
    if not expect.declares() and deployment is None:
        lines.append("no expectations: passes only if its probe profile differs from the reference's or its outputs "
                     "are not identical (else INCONCLUSIVE)")
    return lines
