"""Recorded and judged nights for the tests of evalpipe/nightly/ (no engine)."""

from __future__ import annotations

import pytest
from nightly_fakes import write_night

from evalpipe.history.store import open_history
from evalpipe.nightly import night as nightly

GOOD, BAD, FIXED = "good1", "bad2", "fix3"


@pytest.fixture
def judged_nights(tmp_path):
    """Record and judge nights whose fault state follows ``plan`` (True = faulty): returns
    the history and each night's result, its dashboard under tmp_path/dash."""

    def record(plan):
        db = open_history(None, tmp_path / "out")
        results = []
        for i, fault in enumerate(plan):
            label = BAD if fault else (GOOD if not any(plan[:i]) else FIXED)
            run_dir = write_night(tmp_path / "runs", i, fault=fault, components={"vllm_ascend": label})
            results.append(nightly.record_and_judge(db, run_dir, labels={}, alpha=1e-3, min_nights=2,
                                                    dashboard=tmp_path / "dash" / "index.html", title="t"))
        return db, results

    return record
