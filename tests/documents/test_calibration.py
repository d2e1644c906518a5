"""evalpipe/documents/calibration.py: calibration.json holds the rows calibrate built, and reads
back as the same objects; a file of another version or with a value no calibration writes is
refused in one sentence naming the file and the key."""

from __future__ import annotations

import json

import pytest

from evalpipe.documents.calibration import (
    CALIBRATION_JSON,
    CalibrationFile,
    CalibrationRow,
    OutcomeCounts,
    SampledVerdict,
    SensitivityPoint,
    read_calibration,
    write_calibration,
)
from evalpipe.errors import UserError


def _file() -> CalibrationFile:
    sampled = SampledVerdict(temperature=0.6, samples=2, status="DIVERGENT", outcome="caught",
                             detectors=("sampled",), failed_gates=("sampled_hard_divergences",))
    rows = [
        CalibrationRow(variant="fault-heads_permuted", expected="harmful", status="DIVERGENT", outcome="caught",
                       detectors=("teacher-forced",), failed_gates=("teacher_kl_max",), task="gsm8k_synth_4shot",
                       metric="exact_match,strict-match", delta=-0.25, ci_low=-0.6, ci_high=0.1, mcnemar_p=0.5, n_items=4,
                       detection_cost=1, doc="hands each rank another's heads", localized="layer 0 attn.heads",
                       expected_place="layer 0 attn.heads", sampled=sampled),
        CalibrationRow(variant="fault-shard_offset_checked", expected="harmful", status="FAILED", outcome="caught",
                       detectors=("engine failure",), failed_gates=(), task=None, metric=None, delta=None, ci_low=None,
                       ci_high=None, mcnemar_p=None, n_items=0, detection_cost=None),
    ]
    point = SensitivityPoint(variant="fault-attn_out_error_1e-3", magnitude=1e-3, n_items=4, status="DIVERGENT",
                             families=("teacher-forced",), failed_gates=("teacher_kl_max",),
                             ratios={"teacher_kl_max": 12.5, "teacher_kl_p99": float("inf")}, significant={"teacher_kl_shift": True})
    return CalibrationFile(rows=rows, summary=OutcomeCounts(caught=2), sampled_summary=OutcomeCounts(caught=1, false_alarm=1),
                           sensitivity=[point], gate_firing={"benign": {"teacher_kl_max": (0, 3)}})


def test_the_file_reads_back_as_what_was_written(tmp_path):
    doc = _file()
    path = write_calibration(tmp_path, doc)
    assert path == tmp_path / CALIBRATION_JSON
    back = read_calibration(tmp_path)
    assert back.rows == doc.rows and back.summary == doc.summary and back.gate_firing == doc.gate_firing
    assert back.rows[0].placed is True and back.rows[1].placed is None
    # JSON has no infinity: a ratio past every threshold is written as null, and read as None
    assert back.sensitivity[0].ratios == {"teacher_kl_max": 12.5, "teacher_kl_p99": None}


def test_the_counts_are_written_under_the_words_the_table_uses(tmp_path):
    write_calibration(tmp_path, _file())
    raw = json.loads((tmp_path / CALIBRATION_JSON).read_text())
    assert raw["version"] == 1
    assert raw["summary"] == {"caught": 2, "missed": 0, "clean": 0, "false alarm": 0}
    assert raw["sampled_summary"]["false alarm"] == 1
    assert OutcomeCounts(caught=1).all_as_expected and not OutcomeCounts(missed=1).all_as_expected


@pytest.mark.parametrize(("change", "says"), [
    (lambda raw: raw.update(version=2), "is a calibration of version 2; this evalpipe reads version 1"),
    (lambda raw: raw["rows"][0].update(outcome="cought"), "rows.0.outcome"),
    (lambda raw: raw["rows"][1].update(expected="harmless"), "rows.1.expected"),
    (lambda raw: raw["summary"].update(extra=1), "summary.extra"),
])
def test_a_file_no_calibration_writes_is_refused_naming_the_key(tmp_path, change, says):
    write_calibration(tmp_path, _file())
    path = tmp_path / CALIBRATION_JSON
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError) as err:
        read_calibration(tmp_path)
    message = str(err.value)
    assert str(path) in message and says in message and "evalpipe calibrate --from-run" in message, message
    assert message.count("\n") == 0


def test_a_run_directory_without_a_calibration_says_so(tmp_path):
    with pytest.raises(UserError, match="holds no calibration"):
        read_calibration(tmp_path)
