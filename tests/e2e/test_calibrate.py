"""`evalpipe calibrate` end to end on the real engine, on a small slice of the zoo:
one harmful fault, the benign `sp` layout, one fault whose input check stops the engine
(the run goes on without it, and the table still says what happened), the engine
controls (A/A2, two threads), and one graded systematic error on each side of the
default gates' detection limit (1e-3 in one layer: caught; 1e-5: below the fp32 floors).
The zoo runs a second time sampled (temperature 0.6, two samples per item, common random
numbers): the same entries caught and kept clean there, in the table's last column.
The silent fallback to the legacy path (INCONCLUSIVE by the path probes alone) is the real
engine's in tests/e2e/test_run.py; the zoo's judgement of a fallback row is unit-tested
(tests/compare/test_calibration.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from evalpipe.documents.calibration import CalibrationRow, OutcomeCounts, read_calibration
from evalpipe.install import default_config
from evalpipe.rundir import artifacts

pytestmark = pytest.mark.slow
RUNS_FOR_MINUTES = 9.3  # beside another module on the 2-core machine: the longest modules start first (tests/conftest.py)

LIMIT = 4
FAULTS = ["heads_permuted", "shard_offset_checked", "attn_out_error_1e-3", "attn_out_error_1e-5"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibrate")
    cfg = yaml.safe_load(default_config().read_text())
    ref = cfg["reference"]
    # The reference, `sp` (benign, and the path the faults declare) and the faults: every
    # engine start costs half a minute here.
    cfg["variants"] = {ref: cfg["variants"][ref], "sp": cfg["variants"]["sp"]}
    cfg["noise_floor"] = False
    cfg["tasks"] = {"gsm8k": cfg["tasks"]["gsm8k"]}
    path = tmp / "cal.yaml"
    path.write_text(yaml.safe_dump(cfg))
    table = tmp / "calibration.md"
    proc = subprocess.run(
        [sys.executable, "-m", "evalpipe", "calibrate", "-c", str(path), "--limit", str(LIMIT),
         "--faults", ",".join(FAULTS), "--table", str(table), "--output", str(tmp / "runs"), "--run-id", "cal",
         "--temperature", "0.6", "--samples", "2"],
        cwd=tmp, capture_output=True, text=True, timeout=1800,
    )
    return {"proc": proc, "table": table, "dir": tmp / "runs" / "cal", "ref": ref}


def rows(calibrated) -> dict[str, CalibrationRow]:
    return {r.variant: r for r in read_calibration(calibrated["dir"]).rows}


def test_calibrate_succeeds_with_every_entry_as_expected(calibrated):
    proc = calibrated["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    summary = read_calibration(calibrated["dir"]).summary
    # harmful: heads_permuted + the engine stop; benign: sp + the two engine controls
    assert summary == OutcomeCounts(caught=2, missed=0, clean=3, false_alarm=0)


def test_harmful_fault_is_divergent_with_cost_and_detectors(calibrated):
    r = rows(calibrated)["fault-heads_permuted"]
    assert (r.expected, r.status, r.outcome) == ("harmful", "DIVERGENT", "caught")
    assert r.n_items == LIMIT and r.delta is not None
    assert 1 <= r.detection_cost <= LIMIT
    assert "teacher-forced" in r.detectors and "teacher_kl_max" in r.failed_gates


def test_benign_layout_stays_clean(calibrated):
    r = rows(calibrated)["sp"]
    assert (r.expected, r.outcome) == ("benign", "clean")
    assert r.status in ("IDENTICAL", "EQUIVALENT") and r.detection_cost is None and not r.detectors


def test_a_variant_that_stops_the_engine_fails_alone(calibrated):
    r = rows(calibrated)["fault-shard_offset_checked"]
    assert (r.status, r.outcome, r.detectors) == ("FAILED", "caught", ("engine failure",))
    assert "shard" in r.doc
    info = artifacts.read_json(calibrated["dir"] / "run.json")
    assert info["status"] == "failed" and info["failed_variants"] == ["fault-shard_offset_checked"]
    assert "fault-shard_offset_checked" in info["error"]
    # the variants that did run were compared and reported all the same
    compared = json.loads((calibrated["dir"] / "compare.json").read_text())
    assert {c["variant"] for c in compared["comparisons"]} == {
        "sp", "fault-heads_permuted", "fault-attn_out_error_1e-3", "fault-attn_out_error_1e-5",
        f"{calibrated['ref']}-aa2", f"{calibrated['ref']}-threads2",
    }


def test_engine_controls_stay_clean(calibrated):
    for name in (f"{calibrated['ref']}-aa2", f"{calibrated['ref']}-threads2"):
        r = rows(calibrated)[name]
        assert (r.expected, r.outcome) == ("benign", "clean"), r


def test_graded_errors_on_each_side_of_the_detection_limit(calibrated):
    above, below = rows(calibrated)["fault-attn_out_error_1e-3"], rows(calibrated)["fault-attn_out_error_1e-5"]
    assert (above.expected, above.status, above.outcome) == ("graded", "DIVERGENT", "caught")
    assert "teacher-forced" in above.detectors and above.delta == 0, "no score moves: the logits show it"
    assert (below.expected, below.status, below.outcome) == ("graded", "EQUIVALENT", "not caught")
    points = {p.magnitude: p for p in read_calibration(calibrated["dir"]).sensitivity}
    assert set(points) == {1e-3, 1e-5} and {p.n_items for p in points.values()} == {LIMIT}
    # the same gate measures ~100x less for a 100x smaller error (KL grows with the square)
    assert points[1e-3].ratios["teacher_kl_max"] > 1 > points[1e-5].ratios["teacher_kl_max"]
    assert points[1e-3].ratios["teacher_kl_max"] > 1000 * points[1e-5].ratios["teacher_kl_max"]
    text = calibrated["table"].read_text()
    assert "## Sensitivity: graded systematic errors" in text and "## False alarms, measured" in text
    assert (calibrated["table"].parent / "calibration-sensitivity.png").read_bytes().startswith(b"\x89PNG")


def test_table_states_the_command_and_every_entry(calibrated):
    text = calibrated["table"].read_text()
    assert f"--limit {LIMIT}" in text and "--faults heads_permuted,shard_offset_checked" in text
    assert "**Harmful caught: 2/2. Benign kept clean: 3/3.**" in text
    for name in FAULTS:
        assert f"fault-{name.replace('_', chr(92) + '_')}" in text, name


def test_every_compared_entry_is_localized_at_its_known_place(calibrated):
    """`evalpipe localize` per entry (the reference started once for all): the harmful fault
    and the graded error above the detection limit at their known layer and module, every
    benign entry and the engine controls at "none"."""
    r = rows(calibrated)
    assert (r["fault-heads_permuted"].localized, r["fault-heads_permuted"].expected_place) == (
        "layer 0 attn.heads", "layer 0 attn.heads")
    assert (r["fault-attn_out_error_1e-3"].localized, r["fault-attn_out_error_1e-3"].expected_place) == (
        "layer 1 attn.out", "layer 1 attn.out")
    for name in ("sp", f"{calibrated['ref']}-aa2", f"{calibrated['ref']}-threads2"):
        assert (r[name].localized, r[name].expected_place) == ("none", "none"), (name, r[name])
    assert r["fault-shard_offset_checked"].localized is None  # its engine never ran
    text = calibrated["table"].read_text()
    assert "localized first (known place)" in text and "| layer 0 attn.heads (layer 0 attn.heads) ✓ |" in text
    docs = json.loads((calibrated["dir"] / "localize.json").read_text())["localizations"]
    assert {d["variant"] for d in docs} == set(r) - {"fault-shard_offset_checked"}


def test_the_sampled_zoo_catches_what_the_greedy_one_catches(calibrated):
    by_name = rows(calibrated)
    sampled = {name: r.sampled for name, r in by_name.items()}
    assert all(v is not None and v.temperature == 0.6 and v.samples == 2 for v in sampled.values()), sampled
    assert sampled["fault-heads_permuted"].status == "DIVERGENT" and sampled["fault-heads_permuted"].outcome == "caught"
    assert sampled["fault-shard_offset_checked"].status == "FAILED"
    assert sampled["fault-attn_out_error_1e-3"].status == "DIVERGENT"
    for benign in ("sp", f"{calibrated['ref']}-aa2", f"{calibrated['ref']}-threads2"):
        assert sampled[benign].outcome == "clean", (benign, sampled[benign])
    text = calibrated["table"].read_text()
    assert "**Sampled at temperature 0.6 (2 per item" in text and "harmful caught: 2/2" in text
    assert "--temperature 0.6 --samples 2" in text
    # the sampled run is a run of its own beside the greedy one
    assert (calibrated["dir"].parent / "cal-sampled" / "compare.json").exists()
