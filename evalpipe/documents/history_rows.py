"""The history database's rows, typed: what evalpipe.history.records reads from a run
directory and evalpipe.history.store writes, and what the store's queries return to the
night's judgement (evalpipe.nightly.judging), the dashboard's data and `evalpipe history`.

The database's schema carries the version (evalpipe.history.store.MIGRATIONS); these
models are its rows as of the current one. A column a database opened to read does not
have yet reads as its default.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict

from evalpipe.documents.base import Document
from evalpipe.documents.comparison import GateStatus, PathStatus, Status
from evalpipe.documents.manifest import ProbeSummary
from evalpipe.documents.nightly_doc import NightlyDocument, NightStatus
from evalpipe.documents.run_doc import RunStatus

Role = Literal["reference", "aa", "variant"]  # a variant's part in its run
TokenSource = Literal["free", "teacher"]


class RecordedRun(Document):
    """One run (or night) as the history keeps it: the runs table's row."""

    run_id: str
    kind: str  # run | nightly
    started_at: float
    recorded_at: float | None = None  # set by the store when it writes the row
    config_path: str | None = None
    config_hash: str | None = None
    code_version: str | None = None
    model: str | None = None
    model_fingerprint: str | None = None
    task_selector: str | None = None
    status: RunStatus | None = None
    verdict: Status | None = None
    reference: str | None = None
    aa_variant: str | None = None
    hardware: dict[str, Any] | None = None
    run_dir: str
    # set by `nightly` after judging
    nightly_status: NightStatus | None = None
    baseline_run_id: str | None = None
    judgement: NightlyDocument | None = None

    @property
    def passed_as_baseline(self) -> bool:
        """The next night may be judged against this one: it passed, or it was INCONCLUSIVE
        for the one reason that it had nothing to compare (the first night of a one-variant
        series proves nothing, but showed no fault either)."""
        if self.nightly_status is NightStatus.PASS:
            return True
        j = self.judgement
        return (self.nightly_status is NightStatus.INCONCLUSIVE and j is not None and not j.compared
                and len(j.reasons) == 1)


class RecordedVariant(Document):
    """One variant of a recorded run: the variants table's row."""

    name: str
    role: Role
    status: Status | None = None  # its comparison with the reference (None: the reference)
    exit_code: int | None = None
    components: dict[str, str] = {}
    settings: dict[str, Any] = {}
    probes: ProbeSummary | None = None  # what ran (None: a run from before the path probes)
    path_status: PathStatus | None = None


class RecordedTokens(Document):
    """One task's token summary of a variant's comparison (free-running or teacher-forced):
    the figures of TOKEN_MEASURES, each a column of the history's token table."""

    task: str
    source: TokenSource
    kl_p99: float | None = None
    kl_max: float | None = None
    n_hard_divergences: float | None = None
    n_near_tie_divergences: float | None = None
    n_divergent: float | None = None
    n_samples: int | None = None

    def measure(self, name: str) -> float | None:
        """One of TOKEN_MEASURES by name."""
        value = getattr(self, name)
        return None if value is None else float(value)


# the token figures the history keeps per variant and task: the measures of RecordedTokens, in its order
TOKEN_MEASURES: tuple[str, ...] = tuple(n for n in RecordedTokens.model_fields if n not in ("task", "source", "n_samples"))


class RecordedGate(Document):
    """One gate's result in a variant's comparison."""

    gate: str
    task: str | None = None
    metric: str | None = None
    status: GateStatus
    measured: float | None = None
    threshold: float | None = None


class RecordedTaskVerdict(Document):
    """One task's own verdict in a variant's comparison (a scenario's series of verdicts)."""

    task: str
    status: Status
    outputs_status: Status | None = None  # INCONCLUSIVE: what the task's outputs alone said


class TaskVerdictPoint(RecordedTaskVerdict):
    """A task verdict with the run and variant it belongs to."""

    run_id: str
    started_at: float
    variant: str
    role: Role


class ScorePoint(Document):
    """A run x variant x task x metric as the history's queries return it: the run, the
    variant's role, the mean with its standard error, and (asked for) the per-item values."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    run_id: str
    started_at: float
    variant: str
    role: Role
    task: str
    metric: str
    mean: float | None
    se: float | None
    n: int
    item_set_pk: int
    values: np.ndarray | None = None  # float64 in the item set's order, NaN where missing

    @property
    def items(self) -> np.ndarray:
        """The per-item values (a query that asked for them: ``with_items=True``)."""
        if self.values is None:
            raise ValueError(f"the score of {self.run_id}/{self.variant} {self.task} {self.metric} was read without its items")
        return self.values


class TokenPoint(RecordedTokens):
    """A run x variant's token summary of one task, as the history's queries return it."""

    run_id: str
    started_at: float
    variant: str
    role: Role


class GatePoint(RecordedGate):
    """A gate result with the run and variant it belongs to."""

    run_id: str
    variant: str
