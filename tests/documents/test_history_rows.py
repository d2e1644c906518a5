"""The history's rows (evalpipe/documents/history_rows.py): which recorded nights may be the
next night's baseline, token measures read by name, and per-item values that a query did
not ask for refused in one sentence rather than read as None."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from evalpipe.documents.history_rows import RecordedRun, RecordedTokens, ScorePoint
from evalpipe.documents.nightly_doc import NightlyDocument


def _night(status: str | None, *, compared: bool = True, reasons: tuple[str, ...] = ()) -> RecordedRun:
    judgement = None if status is None else NightlyDocument(run_id="n", status=status, compared=compared, reasons=list(reasons))
    return RecordedRun(run_id="n", kind="nightly", started_at=0.0, run_dir="/runs/n", nightly_status=status, judgement=judgement)


@pytest.mark.parametrize("night, passed", [
    (_night("PASS"), True),
    # the first night of a one-variant series: nothing compared, no fault shown either
    (_night("INCONCLUSIVE", compared=False, reasons=("tonight compared nothing",)), True),
    (_night("INCONCLUSIVE", compared=False, reasons=("tonight compared nothing", "sp ran legacy's path")), False),
    (_night("INCONCLUSIVE", reasons=("sp ran legacy's path",)), False),
    (_night("REGRESSION", reasons=("acc fell",)), False),
    (_night("FAILED"), False),
    (_night(None), False),  # recorded, never judged
])
def test_which_nights_may_be_the_next_nights_baseline(night, passed):
    assert night.passed_as_baseline is passed


def test_a_recorded_run_reads_its_statuses_as_enums_and_refuses_others():
    run = RecordedRun(run_id="r", kind="run", started_at=1.0, run_dir="/r", status="ok", verdict="DIVERGENT")
    assert run.status is not None and run.status.value == "ok" and run.verdict is not None and run.verdict.exit_code == 1
    with pytest.raises(ValidationError, match="verdict"):
        RecordedRun(run_id="r", kind="run", started_at=1.0, run_dir="/r", verdict="GREEN")


def test_token_measures_are_read_by_name():
    tokens = RecordedTokens(task="gsm8k", source="free", kl_p99=1e-3, n_hard_divergences=2.0)
    assert tokens.measure("kl_p99") == 1e-3 and tokens.measure("n_hard_divergences") == 2.0
    assert tokens.measure("kl_max") is None


def test_per_item_values_a_query_did_not_ask_for_are_refused():
    common = {"run_id": "r", "started_at": 0.0, "variant": "sp", "role": "variant", "task": "gsm8k", "metric": "acc",
              "mean": 0.5, "se": None, "n": 2, "item_set_pk": 1}
    with_items = ScorePoint(**common, values=np.array([1.0, 0.0]))
    assert with_items.items.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="read without its items"):
        _ = ScorePoint(**common).items
