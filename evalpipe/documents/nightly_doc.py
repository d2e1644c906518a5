"""nightly.json: a night's judgement (evalpipe.nightly.judging.judge), kept in its run
directory so that importing the directory into a history rebuilds the night's status.

Written by evalpipe.nightly.night.write_night, read by evalpipe.history.store when it records a run
directory. Version 1 is the first typed version; the version-less nightly.json before
it had the same fields and is read as version 1.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.atomic_files import write_json
from evalpipe.documents.base import Document, read_json_object, validated
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


class NightlyDocument(Document):
    version: Literal[1] = NIGHTLY_VERSION
    run_id: str
    status: NightStatus = NightStatus.PASS
    verdict: str | None = None  # tonight's own comparison (compare.json's status)
    baseline: str | None = None  # the night the variants were judged against
    reasons: list[str] = []
    # Per variant, tonight against the baseline night: a digest of compare.json's
    # comparison entry (evalpipe.nightly.judging.vs_baseline), whose shape compare.json owns.
    vs_baseline: list[dict[str, Any]] = []
    # The history's detected changes (evalpipe.nightly.judging._change_dict), stored as the
    # history's database and the dashboard hold them.
    changes: list[dict[str, Any]] = []
    paths: str | None = None  # why tonight's own comparison proves nothing about the paths
    compared: bool = True  # False: the night had nothing to compare (INCONCLUSIVE)

    def judgement(self) -> dict[str, Any]:
        """The judgement as the history stores it (without the file's version)."""
        return self.model_dump(exclude={"version"})


# the judgement is derived from the run directory: judged again, it is written again (never deleted to get on)
NIGHTLY_REMEDY = "restore it from a copy, or move it out of the run directory and judge the night again with `evalpipe nightly --from-run RUN_DIR`"


def write_nightly_document(path: Path, doc: NightlyDocument) -> None:
    write_json(path, doc.model_dump())


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
