"""calibration.json: what `evalpipe calibrate` made of each zoo entry, beside the zoo run's
compare.json. The rows are built by :mod:`evalpipe.compare.calibration` as these models and
rendered from them (the terminal table, calibration.md); the file holds the same objects.
Read back by :func:`read_calibration` (the tests, and anyone scripting over a calibration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal

from pydantic import AliasChoices, Field

from evalpipe.atomic_files import write_json
from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.errors import UserError

CALIBRATION_JSON = "calibration.json"
CALIBRATION_VERSION: Final = 1
_REMEDY = "run `evalpipe calibrate --from-run <its run directory>` to write it again"

# What an entry is expected to do: harmful (must be DIVERGENT), graded (DIVERGENT above the
# detection limit), fallback (left its declared path: must be INCONCLUSIVE), benign (must pass).
Expected = Literal["benign", "harmful", "graded", "fallback"]
# An entry's verdict: a comparison's status, or FAILED when its engine never ran.
EntryStatus = Literal["IDENTICAL", "EQUIVALENT", "INCONCLUSIVE", "DIVERGENT", "FAILED"]
# Against the expectation; a graded fault below the detection limit is "not caught", which
# counts neither as a miss nor as clean.
Outcome = Literal["caught", "missed", "clean", "false alarm", "not caught"]


class SampledVerdict(Document):
    """An entry's verdict when the zoo runs again with sampled decoding (common random numbers)."""

    temperature: float
    samples: int
    status: EntryStatus
    outcome: Outcome
    detectors: tuple[str, ...]
    failed_gates: tuple[str, ...]


class CalibrationRow(Document):
    variant: str
    expected: Expected
    status: EntryStatus
    outcome: Outcome
    detectors: tuple[str, ...]  # families with a failing gate
    failed_gates: tuple[str, ...]
    task: str | None  # the task of the score figures below (the first one)
    metric: str | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    mcnemar_p: float | None
    n_items: int
    detection_cost: int | None  # None: never DIVERGENT on any prefix (or not computed)
    doc: str = ""
    # `evalpipe localize`: the first module above its floor ("layer 1 attn.out", "none"), and
    # where the entry's known place is ("none" for a benign one); None: not localized
    localized: str | None = None
    expected_place: str | None = None
    # the same entry in the zoo's sampled run (`calibrate --temperature`); None: not run sampled
    sampled: SampledVerdict | None = None
    # each task's own verdict (compare.task_verdicts): which task, a scenario, caught the entry
    by_task: dict[str, str] = {}

    @property
    def placed(self) -> bool | None:
        """Whether localize named the entry's known place (None: not localized, or no known place)."""
        if self.localized is None or self.expected_place is None:
            return None
        return self.localized == self.expected_place


class SensitivityPoint(Document):
    """What the gates make of one graded fault on the first ``n_items`` items.

    ``ratios``: per token / distributional gate, measured / threshold (> 1 fails a
    token gate; a distributional gate also needs its p-value below alpha, in
    ``significant``; a ratio past every threshold is inf here and null in the file)."""

    variant: str
    magnitude: float
    n_items: int
    status: EntryStatus
    families: tuple[str, ...]
    failed_gates: tuple[str, ...]
    ratios: dict[str, float | None]
    significant: dict[str, bool]


class OutcomeCounts(Document):
    """How many entries (graded faults aside) came out each way."""

    caught: int = 0
    missed: int = 0
    clean: int = 0
    false_alarm: int = Field(0, validation_alias=AliasChoices("false alarm", "false_alarm"), serialization_alias="false alarm")

    @property
    def all_as_expected(self) -> bool:
        return self.missed == 0 and self.false_alarm == 0


class CalibrationFile(Document):
    version: Literal[1] = CALIBRATION_VERSION
    rows: list[CalibrationRow]
    summary: OutcomeCounts
    sampled_summary: OutcomeCounts | None = None  # None: the zoo did not run sampled
    sensitivity: list[SensitivityPoint] = []
    # per group of comparisons ("aa_pairs", "benign"), per gate: [failed in, evaluated in]
    gate_firing: dict[str, dict[str, tuple[int, int]]] = {}


def write_calibration(run_dir: Path, doc: CalibrationFile) -> Path:
    path = run_dir / CALIBRATION_JSON
    # pydantic's JSON has null where a ratio is infinite (JSON has no infinity), as every document here
    write_json(path, json.loads(doc.model_dump_json(by_alias=True)))
    return path


def read_calibration(run_dir: Path) -> CalibrationFile:
    """The calibration of a run directory; a UserError naming the file and the key when it
    is missing, of another version, or not what this evalpipe writes."""
    path = run_dir / CALIBRATION_JSON
    if not path.is_file():
        raise UserError(f"{path} does not exist: {run_dir} holds no calibration; {_REMEDY}.")
    raw = read_json_object(path, _REMEDY)
    if raw.get("version") != CALIBRATION_VERSION:
        raise UserError(f"{path} is a calibration of version {raw.get('version')!r}; this evalpipe reads version "
                        f"{CALIBRATION_VERSION}: {_REMEDY}.")
    return validated(CalibrationFile, raw, str(path), _REMEDY)
