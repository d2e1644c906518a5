"""`evalpipe bisect`'s journal (bisect.json in the bisect's directory): the candidate builds
in order, every run made of them with its step verdict and evidence, and the answer. It is
rewritten (atomically) after every run, so a bisect that is killed continues from it."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from evalpipe.atomic_files import write_text
from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.documents.comparison import Status

BISECT_SCHEMA_VERSION: Final = 1
BISECT_JSON: Final = "bisect.json"


class StepVerdict(str, Enum):
    """One build against the good one: the same outputs within the good build's own noise,
    different beyond it, not enough evidence either way, or not testable (it failed to
    start, or stayed UNKNOWN through every escalation)."""

    SAME = "SAME"
    DIFFERENT = "DIFFERENT"
    UNKNOWN = "UNKNOWN"
    SKIP = "SKIP"

    def __str__(self) -> str:
        return self.value


STEP_OF_STATUS: Final = {Status.IDENTICAL: StepVerdict.SAME, Status.EQUIVALENT: StepVerdict.SAME,
                         Status.DIVERGENT: StepVerdict.DIFFERENT, Status.INCONCLUSIVE: StepVerdict.UNKNOWN}


def short(key: str) -> str:
    """A commit as people read it (its first 12 hex digits); a listed build's name whole."""
    return key[:12] if len(key) == 40 and all(c in "0123456789abcdef" for c in key) else key


class Evidence(Document):
    """What the comparison with the good build showed, for the report's row."""

    first_divergence: int | None = Field(default=None, description="Median first divergent token position, free-running.")
    kl_p99: float | None = Field(default=None, description="Teacher-forced KL p99 (nats), the worst task.")
    flipped: int = Field(default=0, ge=0, description="Items whose score changed.")
    failed_gates: list[str] = Field(default_factory=list)


class Attempt(Document):
    """One run of a build: its directory, the items it ran, and what it showed."""

    run_dir: str
    limit: int | None
    samples: int | None = Field(default=None, description="Samples per item when an escalation asked for more than the config's (None: the config's).")
    status: Status | None = Field(description="The comparison with the good build; None when the build did not run.")
    verdict: StepVerdict
    reason: str
    evidence: Evidence | None = None
    repeat_of: str | None = Field(default=None, description="A confirmation: the run this one repeats.")


class Candidate(Document):
    commit: str  # the commit's sha, or a listed build's name
    subject: str
    files: list[str] = Field(default_factory=list, description="Files the commit changed against its first parent.")


class Step(Document):
    """Everything run of one candidate, and the verdict they add up to."""

    commit: str
    attempts: list[Attempt]
    verdict: StepVerdict
    reason: str
    endpoint: bool = False


class Answer(Document):
    kind: Literal["found", "ambiguous", "bad_is_same", "bad_not_different"]
    sentence: str
    first_different: str | None = None
    could_be: list[str] = Field(default_factory=list, description="Skipped commits that may hold the change, with the first DIFFERENT one.")
    localize_dir: str | None = None
    localized: str | None = Field(default=None, description="`evalpipe localize`'s sentence: where in the model the build first parts from its parent.")


class BisectJournal(Document):
    schema_version: Literal[1] = BISECT_SCHEMA_VERSION
    config: str
    repo: str | None  # None: the config's explicit list of builds
    variant: str
    good: str
    bad: str
    candidates: list[Candidate]
    good_run: str | None = None
    steps: list[Step] = Field(default_factory=list)
    answer: Answer | None = None
    seconds: float = 0.0

    def step(self, commit: str) -> Step | None:
        return next((s for s in self.steps if s.commit == commit), None)

    def with_step(self, step: Step) -> BisectJournal:
        kept = [s for s in self.steps if s.commit != step.commit]
        return self.model_copy(update={"steps": [*kept, step]})

    def verdicts(self) -> dict[int, StepVerdict]:
        """Each decided candidate's verdict by its index in ``candidates``."""
        index = {c.commit: i for i, c in enumerate(self.candidates)}
        return {index[s.commit]: s.verdict for s in self.steps if s.verdict is not StepVerdict.UNKNOWN}

    def runs(self) -> int:
        return sum(len(s.attempts) for s in self.steps)


def write_journal(path: Path, journal: BisectJournal) -> None:
    write_text(path, journal.model_dump_json(indent=2) + "\n")


def read_journal(path: Path) -> BisectJournal:
    remedy = f"restore it from a copy, or move {path.parent} aside to start the bisect again"
    return validated(BisectJournal, read_json_object(path, remedy), str(path), remedy)
