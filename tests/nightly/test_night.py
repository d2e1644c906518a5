"""evalpipe/nightly/night.py: one night recorded and judged against the history (a pinned baseline wins; a failed night is FAILED, not a regression), the components a night names, and every night status with its exit code and colour."""

from __future__ import annotations

import pytest
from nightly_fakes import write_night

from evalpipe.errors import UserError
from evalpipe.history.store import open_history
from evalpipe.nightly import night as nightly


def test_a_pinned_baseline_wins(tmp_path, judged_nights):
    db, results = judged_nights([False, False, False])
    db.pin_baseline("night-00")
    run_dir = write_night(tmp_path / "runs", 3)
    r = nightly.record_and_judge(db, run_dir, labels={}, alpha=1e-3, min_nights=2, dashboard=tmp_path / "d.html", title="t")
    assert r.judgement.baseline == "night-00"


def test_a_failed_night_is_failed_not_a_regression(tmp_path):
    db = open_history(None, tmp_path / "out")
    run_dir = write_night(tmp_path / "runs", 0, extra={"status": "failed"})
    r = nightly.record_and_judge(db, run_dir, labels={}, alpha=1e-3, min_nights=2, dashboard=tmp_path / "d.html", title="t")
    assert r.judgement.status == "FAILED" and r.exit_code == 3


def test_components_parse():
    assert nightly.parse_components(["vllm_ascend=abc", "cann = 8.0"]) == {"vllm_ascend": "abc", "cann": "8.0"}
    with pytest.raises(UserError, match="is not NAME=VERSION"):
        nightly.parse_components(["oops"])


def test_every_night_status_has_an_exit_code_a_colour_an_icon_and_a_mark():
    from evalpipe.documents.nightly_doc import NIGHT_STATUSES
    from evalpipe.nightly.night import EXIT_CODES, NIGHT_COLOURS
    from evalpipe.nightly.simulate import NIGHT_MARKS
    from evalpipe.report.nightly import NIGHT_ICONS

    for table in (EXIT_CODES, NIGHT_COLOURS, NIGHT_MARKS, NIGHT_ICONS):
        assert set(table) == set(NIGHT_STATUSES)
