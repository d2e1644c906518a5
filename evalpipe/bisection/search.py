"""Where a bisect looks next, and what it found: pure functions of the candidates' verdicts.

Candidates are indexed oldest first; the good build sits before index 0 and the bad one is
the last candidate. A SAME verdict moves the low end up, a DIFFERENT one the high end
down; SKIP leaves both where they are and the next look goes to the untested candidate
nearest the middle instead (as `git bisect skip` does), so a broken build costs one run,
not the search. When nothing untested is left between the ends, the first DIFFERENT build
is the high end, or one of the skipped builds just before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, log2

from evalpipe.documents.bisect import StepVerdict


@dataclass(frozen=True)
class Bounds:
    last_same: int  # -1: the good build
    first_different: int


def bounds(verdicts: dict[int, StepVerdict], count: int) -> Bounds:
    """The newest SAME and the oldest DIFFERENT after it. The bad end (``count - 1``) is
    DIFFERENT by the time this is asked; a SAME after a DIFFERENT build does not move the
    low end past it (the change came and went: the first DIFFERENT is still the answer)."""
    different = sorted(i for i, v in verdicts.items() if v is StepVerdict.DIFFERENT)
    first_different = different[0] if different else count - 1
    same = [i for i, v in verdicts.items() if v is StepVerdict.SAME and i < first_different]
    return Bounds(max(same, default=-1), first_different)


def next_candidate(verdicts: dict[int, StepVerdict], count: int) -> int | None:
    """The candidate to test next, None when the search is over."""
    b = bounds(verdicts, count)
    open_ = [i for i in range(b.last_same + 1, b.first_different) if i not in verdicts]
    if not open_:
        return None
    middle = (b.last_same + b.first_different) / 2
    return min(open_, key=lambda i: (abs(i - middle), i))


def suspects(verdicts: dict[int, StepVerdict], count: int) -> list[int]:
    """When the search is over: the builds that may be the first DIFFERENT one, oldest
    first; one index when the answer is exact, more when skipped builds sit just before it."""
    b = bounds(verdicts, count)
    between = [i for i in range(b.last_same + 1, b.first_different) if verdicts.get(i) is StepVerdict.SKIP]
    return [*between, b.first_different]


def expected_steps(count: int) -> int:
    """Runs of a bisect over ``count`` candidates without skips or escalations: the two ends
    (the good build's reference, the bad build) and ceil(log2(count)) looks between them."""
    return 2 + (ceil(log2(count)) if count > 1 else 0)
