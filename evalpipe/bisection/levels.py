"""How hard a bisect step looks at a build: the run's own level (--limit, the config's
samples per item), then each escalation of `bisect.escalate` in turn, what an escalation
leaves out carried over from the level before it. Pure: the checks return a sentence."""

from __future__ import annotations

from dataclasses import dataclass

from evalpipe.config.bisect import Escalation
from evalpipe.config.sampling import Sampling


@dataclass(frozen=True)
class Level:
    """Items per task (None: all) and samples per item (None: the config's own)."""

    limit: int | None
    samples: int | None = None

    def label(self) -> str:
        return f"{self.limit or 'all'} items" + (f", {self.samples} samples per item" if self.samples else "")


def levels(limit: int | None, escalate: list[Escalation]) -> list[Level]:
    """The run's own level first, then one per escalation."""
    out = [Level(limit)]
    for e in escalate:
        before = out[-1]
        out.append(Level(before.limit if e.limit is None else e.limit, before.samples if e.samples is None else e.samples))
    return out


def escalation_problem(limit: int | None, escalate: list[Escalation], samplings: list[Sampling | None]) -> str | None:
    """Why the escalations cannot look harder than the run's own level (``samplings``: the
    sampling of each task the bisect runs, None for a greedy one), or None."""
    limits = [e.limit for e in escalate if e.limit is not None]
    if limits and limit is None:
        return (f"asks for item limits {limits}, but the bisect runs every item (no --limit): give --limit below "
                "them, or escalate by samples alone")
    if limits and limit is not None and limits[0] <= limit:
        return f"asks for item limits {limits}, which must be larger than --limit {limit}: an escalation runs more items than the step before it"
    more = [e.samples for e in escalate if e.samples is not None]
    if not more:
        return None
    if any(s is None for s in samplings):
        return (f"asks for {more[0]} samples per item, but a task of the bisect decodes greedily, where more samples "
                "repeat the same tokens; set `sampling:` for the run, or escalate by limit")
    own = max(s.samples for s in samplings if s is not None)
    if more[0] <= own:
        return f"asks for {more[0]} samples per item, which must be more than the config's {own}"
    return None
