"""evalpipe/worker/sample_scores.py: each sample of a sampled task scored on its own answer,
with the task's own filters and metrics (lm-eval's doc-level score keeps the first answer only)."""

from __future__ import annotations

from lm_eval.filters import build_filter_ensemble

from evalpipe.worker.sample_scores import score_each


class RegexTask:
    """A task with two filter pipelines as GSM8K's (a strict and a loose number) and exact match."""

    def __init__(self):
        self._filters = [
            build_filter_ensemble("strict", [("regex", {"regex_pattern": r"#### (\-?[0-9]+)"}), ("take_first", None)]),
            build_filter_ensemble("loose", [("regex", {"regex_pattern": r"(-?[0-9]+)", "group_select": -1}), ("take_first", None)]),
        ]

    def process_results(self, doc, results):
        return {"exact_match": float(results[0] == doc["answer"]), "note": ("corpus", 1)}


def test_each_answer_gets_its_own_filtered_answer_and_score():
    rows = score_each(RegexTask(), {"answer": "42"}, ["so #### 42", "it is 7 then 42", "#### 41"])
    assert [r["answer:strict"] for r in rows] == ["42", "[invalid]", "41"]
    assert [r["score:exact_match,strict"] for r in rows] == [1.0, 0.0, 0.0]
    assert [r["score:exact_match,loose"] for r in rows] == [1.0, 1.0, 0.0]
    assert all("score:note,strict" not in r for r in rows)  # a corpus-level tuple is no per-item score
