"""nightly.json: a night's judgement (evalpipe.nightly.judging.judge), kept in its run
directory so that importing the directory into a history rebuilds the night's status.

Written by evalpipe.nightly.night.write_night, read by evalpipe.history.store when it records a run
directory. Version 1 is the first typed version; the version-less nightly.json before
it had the same fields and is read as version 1. Its parts are typed too: each variant
against the baseline night (:class:`BaselineComparison`) and each change the detector
found in a series (:class:`SeriesChange`); the history stores the judgement, the
dashboard and the night's summaries read these fields.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.atomic_files import write_json
from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.documents.comparison import PathStatus, ScoreRow, Status
from evalpipe.errors import UserError

NIGHTLY_JSON = "nightly.json"  # in the night's run directory
NIGHTLY_VERSION: Final = 1

# A night's statuses, least severe first: a finding (REGRESSION) outranks a night that
# proved nothing about its paths, and a run that did not finish outranks both.
class NightStatus(str, Enum):
    PASS = "PASS"
    INCONCLUSIVE = "INCONCLUSIVE"
    REGRESSION = "REGRESSION"
    FAILED = "FAILED"

    @property
    def severity(self) -> int:
        return NIGHT_STATUSES.index(self)

    def __str__(self) -> str:  # plain "PASS" in f-strings
        return self.value


NIGHT_STATUSES: tuple[NightStatus, ...] = tuple(NightStatus)


class PathsBrief(Document):
    """A comparison's path verdict without its evidence: the status and why."""

    status: PathStatus
    reasons: list[str] = []


class TokenBrief(Document):
    """The token measures a night keeps of one task's comparison with the baseline night."""

    task: str
    n_samples: int
    n_divergent: int
    n_hard_divergences: int
    n_near_tie_divergences: int
    kl_p99: float | None = None
    kl_max: float | None = None
    identical: bool


class BaselineComparison(Document):
    """One variant tonight against itself on the baseline night (evalpipe.nightly.judging.vs_baseline):
    compare.json's comparison entry in brief, or why the two could not be compared."""

    variant: str
    baseline: str | None = None  # the night it was judged against
    error: str | None = None  # set: the two could not be compared, and nothing below is
    status: Status | None = None
    teacher_forced: bool = False  # the same forced tokens on both nights (else free-running only)
    reasons: list[str] = []
    outputs_status: Status | None = None
    paths: PathsBrief | None = None
    scores: list[ScoreRow] = []
    tokens: list[TokenBrief] = []
    teacher: list[TokenBrief] = []

    @property
    def first_path_reason(self) -> str:
        """The first reason its paths give, else its verdict's first reason."""
        reasons = (self.paths.reasons if self.paths else []) or self.reasons
        return str(reasons[0]) if reasons else "no reason was recorded"


class FlippedNightItem(Document):
    """An item whose score changed between the last good night and the first bad one."""

    doc_id: int
    repeat: int
    before: float
    after: float
    prompt: str | None = None  # the end of its prompt, when the first bad night's samples are still there


class ComponentChange(Document):
    """One component or setting that differs between the last good night and the first bad one."""

    component: str
    before: str | None
    after: str | None


ChangeState = Literal["flagged", "pending", "not significant"]


class SeriesChange(Document):
    """A change the detector found in a series (evalpipe.compare.changepoint): a score of a
    task x metric x variant, or a token measure; with the bisect hint."""

    kind: Literal["score", "token"]
    task: str
    metric: str  # a score's metric, or a token series' name (free_kl_p99, ...)
    variant: str
    run_id: str  # the first night of the new level
    night: str  # its date and time (UTC, ISO 8601)
    direction: Literal["up", "down"]
    before: float
    after: float
    delta: float
    p_value: float | None
    nights_after: int
    open: bool  # the new level lasts until the latest night
    state: ChangeState
    regression: bool  # a score going down, a token measure going up
    summary: str
    flipped: list[FlippedNightItem] = []
    bisect: list[ComponentChange] = []
    last_good: str
    first_bad: str
    report: str | None = None  # the first bad night's report, relative to the dashboard


class NightlyDocument(Document):
    version: Literal[1] = NIGHTLY_VERSION
    run_id: str
    status: NightStatus = NightStatus.PASS
    verdict: Status | None = None  # tonight's own comparison (compare.json's status)
    baseline: str | None = None  # the night the variants were judged against
    reasons: list[str] = []
    vs_baseline: list[BaselineComparison] = []  # per variant, tonight against the baseline night
    changes: list[SeriesChange] = []  # the history's detected changes, as the database and the dashboard hold them
    paths: str | None = None  # why tonight's own comparison proves nothing about the paths
    compared: bool = True  # False: the night had nothing to compare (INCONCLUSIVE)

    def judgement(self) -> dict[str, Any]:
        """The judgement as the history stores it in its JSON column (without the file's version)."""
        return self.model_dump(mode="json", exclude={"version"})

    @classmethod
    def from_judgement(cls, stored: dict[str, Any]) -> NightlyDocument:
        """The document back from the history's JSON column (see :meth:`judgement`)."""
        return cls.model_validate({**stored, "version": NIGHTLY_VERSION})


# the judgement is derived from the run directory: judged again, it is written again (never deleted to get on)
NIGHTLY_REMEDY = "restore it from a copy, or move it out of the run directory and judge the night again with `evalpipe nightly --from-run RUN_DIR`"


def write_nightly_document(path: Path, doc: NightlyDocument) -> None:
    write_json(path, doc.model_dump(mode="json"))


def read_nightly_document(path: Path) -> NightlyDocument | None:
    """nightly.json at ``path``, None when there is none; anything unreadable or of another
    version is one sentence naming the file."""
    if not path.is_file():
        return None
    raw = read_json_object(path, NIGHTLY_REMEDY)
    # version-less: written before nightly.json had a version, with the same fields
    version = raw.setdefault("version", NIGHTLY_VERSION)
    if version != NIGHTLY_VERSION:
        raise UserError(f"{path} is a nightly.json of version {version!r}; this evalpipe reads version {NIGHTLY_VERSION}: "
                        "judge the night again with this evalpipe.")
    return validated(NightlyDocument, raw, str(path), NIGHTLY_REMEDY)
