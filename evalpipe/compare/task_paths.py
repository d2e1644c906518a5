"""Each task's path evidence: vLLM's own counters over the task (the variant's manifest keeps
them) against what the task requires (`requires:`, a scenario's defaults). A scenario whose
path did not run proves nothing about that path, whatever the outputs say."""

from __future__ import annotations

from collections.abc import Mapping

from evalpipe.config.path_requirements import PathRequirements, counter_words
from evalpipe.documents.manifest import EngineCounters


def counter_value(counters: EngineCounters, name: str) -> int | None:
    """One counter of a task's reading, by the name a requirement uses (None: not exposed)."""
    if name.startswith("steps_by_tokens."):
        if counters.steps_by_tokens is None:
            return None
        return counters.steps_by_tokens.get(name.removeprefix("steps_by_tokens."), 0)
    value: int | None = getattr(counters, name)
    return value


def check_tasks(who: str, required: Mapping[str, PathRequirements],
                counters: Mapping[str, EngineCounters] | None) -> tuple[list[str], list[str]]:
    """(failures, evidence): each sentence names the task and the counter."""
    failures: list[str] = []
    evidence: list[str] = []
    for task, requirements in required.items():
        wanted = requirements.counted()
        if not wanted:
            continue
        reading = None if counters is None else counters.get(task)
        if reading is None:
            failures.append(f"{who}: task `{task}` must show {_wants(wanted)}, but its engine reported no counters over "
                            "it (a fake engine, or a server without /metrics), so nothing shows that its path ran")
            continue
        seen = []
        for name, expected in wanted:
            value = counter_value(reading, name)
            if value is None:
                failures.append(f"{who}: task `{task}` must show {expected.describe()} {counter_words(name)}; its "
                                "engine does not count them, so nothing shows that its path ran")
            elif not expected.holds(value):
                failures.append(f"{who}: task `{task}` was to drive {expected.describe()} {counter_words(name)}; vLLM "
                                f"counted {value}{_context(reading, name)}: the path it tests did not run as required")
            else:
                seen.append(f"{value} {counter_words(name)}")
        if seen:
            evidence.append(f"task `{task}`: {', '.join(seen)}")
    return failures, evidence


def _wants(wanted: list) -> str:
    return ", ".join(f"{r.describe()} {counter_words(n)}" for n, r in wanted)


def _context(reading: EngineCounters, name: str) -> str:
    if name == "prefix_cache_hits" and reading.prefix_cache_queries is not None:
        return f" of {reading.prefix_cache_queries} prompt tokens looked up"
    if name.startswith("steps_by_tokens.") and reading.engine_steps is not None:
        return f" of {reading.engine_steps} engine steps"
    return ""
