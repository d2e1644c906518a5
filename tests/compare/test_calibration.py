"""Calibration figures from known-benign and known-harmful fake variants."""

import pytest
from fakes import METRIC, make_samples, mutate, set_token, tables

from evalpipe.compare.calibration import (
    CAUGHT,
    CLEAN,
    FALSE_ALARM,
    MISSED,
    calibration_row,
    detection_cost,
    failed_row,
    gate_firing,
    item_order,
    outcome,
    summarize,
)
from evalpipe.compare.run import VariantArtifacts, compare_artifacts
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.calibration import CalibrationRow, OutcomeCounts


def side(name, samples):
    s, t = tables(samples)
    return VariantArtifacts(name, s, t, None)


def test_outcome_against_expectation():
    assert outcome("harmful", "DIVERGENT") == CAUGHT and outcome("harmful", "EQUIVALENT") == MISSED
    assert outcome("benign", "IDENTICAL") == CLEAN and outcome("benign", "DIVERGENT") == FALSE_ALARM
    assert outcome("graded", "DIVERGENT") == CAUGHT and outcome("graded", "EQUIVALENT") == "not caught"
    # a silent fallback is caught only by the path probes: INCONCLUSIVE, never a pass
    assert outcome("fallback", "INCONCLUSIVE") == CAUGHT
    assert outcome("fallback", "IDENTICAL") == MISSED and outcome("fallback", "EQUIVALENT") == MISSED
    # a benign entry that proves nothing is no clean pass
    assert outcome("benign", "INCONCLUSIVE") == FALSE_ALARM


def test_graded_rows_are_not_counted_as_misses_and_gates_firing_is_counted_per_comparison():
    def row(expected, out):
        return CalibrationRow(variant="v", expected=expected, status="EQUIVALENT", outcome=out, detectors=(), failed_gates=(),
                              task=None, metric=None, delta=None, ci_low=None, ci_high=None, mcnemar_p=None, n_items=0,
                              detection_cost=None)

    assert summarize([row("graded", "not caught"), row("harmful", CAUGHT), row("benign", CLEAN)]) == OutcomeCounts(
        caught=1, missed=0, clean=1, false_alarm=0)
    a = make_samples(6)
    b = mutate(a, 2, set_token(1, 7))
    sa, ta = tables(a)
    sb, tb = tables(b)
    same = compare_artifacts(VariantArtifacts("a", sa, ta, None), VariantArtifacts("b", sa, ta, None), worst_k=0, gates=Gates())
    moved = compare_artifacts(VariantArtifacts("a", sa, ta, None), VariantArtifacts("b", sb, tb, None), worst_k=0, gates=Gates())
    firing = gate_firing([same, moved])
    assert firing["free_hard_divergences"] == (1, 2)
    assert firing["score_equivalence"][1] == 2
    assert firing["teacher_kl_max"] == (0, 0), "skipped gates are not evaluated"


def test_detection_cost_is_the_first_prefix_that_diverges():
    ref = make_samples(12)
    bad = mutate(mutate(ref, 5, set_token(2, 7)), 9, set_token(0, 7))  # hard divergences at docs 5 and 9
    cost = detection_cost(side("legacy", ref), side("bad", bad), Gates())
    assert cost == 6, "items 0..5 in doc order are needed to see doc 5"
    assert detection_cost(side("legacy", ref), side("same", ref), Gates()) is None
    assert detection_cost(side("legacy", ref), side("bad", bad), Gates(), max_items=5) is None


def test_detection_cost_orders_items_by_task_then_doc():
    ref = make_samples(4, task="b") + make_samples(3, task="a")
    assert item_order(side("x", ref).samples)[:4] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    bad = mutate(ref, 0, set_token(1, 7), task="b")
    assert detection_cost(side("legacy", ref), side("bad", bad), Gates()) == 4


def test_relative_gates_use_the_aa_run_cut_to_the_same_items():
    ref = make_samples(8)
    noisy = mutate(ref, 1, set_token(2, 7))  # one hard divergence in the A/A run
    bad = mutate(ref, 3, set_token(2, 7))
    # with the A/A run showing one hard divergence among its first 2+ items, 3 x 1 = 3 are tolerated
    assert detection_cost(side("legacy", ref), side("bad", bad), Gates(), aa=side("aa", noisy)) is None
    assert detection_cost(side("legacy", ref), side("bad", bad), Gates()) == 4


def test_calibration_row_reports_score_figures_and_detectors():
    ref = make_samples(10)  # scores doc_id % 2
    flipped = [s.copy(scores={METRIC: 0.0}) if s.doc_id in (1, 3, 5) else s.copy() for s in ref]
    bad = mutate(flipped, 7, set_token(0, 7))
    cmp = compare_artifacts(side("legacy", ref), side("bad", bad), worst_k=0, gates=Gates())
    row = calibration_row(cmp, "harmful", cost=2, doc="stands for a bug")
    assert row.status == "DIVERGENT" and row.outcome == CAUGHT
    assert set(row.detectors) == {"free-running", "scores"}
    assert "free_hard_divergences" in row.failed_gates and "score_equivalence" in row.failed_gates
    assert row.delta == pytest.approx(-0.3) and row.n_items == 10
    assert row.ci_low < -0.3 < row.ci_high
    assert row.mcnemar_p == pytest.approx(0.25)  # b = 3, c = 0: 2 * 0.5^3
    assert summarize([row]) == OutcomeCounts(caught=1)
    assert row.model_dump(mode="json")["detection_cost"] == 2


def test_failed_variant_row_counts_by_expectation_and_keeps_the_error():
    harmful = failed_row("fault-x", "harmful", "engine failed to start: ShardMismatch", doc="off by one.")
    benign = failed_row("fault-y", "benign", "engine failed to start: OOM")
    assert (harmful.status, harmful.outcome, harmful.detectors) == ("FAILED", "caught", ("engine failure",))
    assert benign.outcome == "false alarm" and benign.delta is None and benign.detection_cost is None
    assert harmful.doc == "off by one. Run failed: engine failed to start: ShardMismatch"
    assert summarize([harmful, benign]).model_dump(by_alias=True) == {"caught": 1, "missed": 0, "clean": 0, "false alarm": 1}
