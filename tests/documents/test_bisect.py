"""The bisect journal: written and read back as the same object; a damaged one is one sentence."""

import pytest

from evalpipe.documents.bisect import (
    Attempt,
    BisectJournal,
    Candidate,
    Evidence,
    Step,
    StepVerdict,
    read_journal,
    write_journal,
)
from evalpipe.documents.comparison import Status
from evalpipe.errors import UserError


def journal() -> BisectJournal:
    cands = [Candidate(commit=f"{i:040x}", subject=f"c{i}", files=["a.py"]) for i in range(1, 5)]
    return BisectJournal(config="c.yaml", repo="/r", variant="sp", good="0" * 40, bad=cands[-1].commit, candidates=cands)


def test_a_journal_round_trips_and_counts_runs_and_decided_steps(tmp_path):
    j = journal()
    attempt = Attempt(run_dir="/x", limit=8, status=Status.DIVERGENT, verdict=StepVerdict.DIFFERENT, reason="r",
                      evidence=Evidence(first_divergence=3, kl_p99=1e-6, flipped=0, failed_gates=["teacher_kl_p99"]))
    j = j.with_step(Step(commit=j.candidates[3].commit, attempts=[attempt, attempt], verdict=StepVerdict.DIFFERENT, reason="r"))
    j = j.with_step(Step(commit=j.candidates[1].commit, attempts=[attempt], verdict=StepVerdict.UNKNOWN, reason="in progress"))
    path = tmp_path / "bisect.json"
    write_journal(path, j)
    again = read_journal(path)
    assert again == j
    assert again.runs() == 3
    assert again.verdicts() == {3: StepVerdict.DIFFERENT}, "a step in progress decides nothing"
    replaced = again.with_step(Step(commit=j.candidates[1].commit, attempts=[attempt], verdict=StepVerdict.SAME, reason="s"))
    assert replaced.verdicts() == {3: StepVerdict.DIFFERENT, 1: StepVerdict.SAME} and len(replaced.steps) == 2


def test_a_damaged_journal_names_the_file_and_the_remedy(tmp_path):
    path = tmp_path / "bisect.json"
    path.write_text('{"schema_version": 1}')
    with pytest.raises(UserError, match=r"bisect.json: .*move .* aside to start the bisect again"):
        read_journal(path)
    path.write_text("{")
    with pytest.raises(UserError, match="is not valid JSON"):
        read_journal(path)
