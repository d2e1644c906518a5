"""Each sample of a sampled task scored on its own, as lm-eval scores one answer.

lm-eval answers a request ``repeats`` times but scores a document once, through its
filters (``take_first`` keeps the first answer, ``majority_vote`` a vote). A sampled
comparison pairs every sample (avg@n, pass@k), so each answer goes through the task's
filter pipelines and its ``process_results`` alone: the same columns a greedy task's
row gets from lm-eval's logged sample, one row per sample.
"""

from __future__ import annotations

from typing import Any

from evalpipe.rundir.artifacts import ANSWER_PREFIX, SCORE_PREFIX


def score_each(task: Any, doc: Any, responses: list[str]) -> list[dict[str, Any]]:
    """Per response: ``answer:<filter>`` (the filtered answer) and ``score:<metric>,<filter>``
    (the per-item numbers; corpus-level metrics' tuples are left out, as for greedy rows)."""
    rows = []
    for response in responses:
        row: dict[str, Any] = {}
        for ensemble in task._filters:  # lm-eval keeps a task's filter pipelines there, one per filter name
            values: Any = [[response]]
            for make in ensemble.filters:
                values = list(make().apply(values, [doc]))
            filtered = values[0]
            row[f"{ANSWER_PREFIX}{ensemble.name}"] = None if filtered is None else str(filtered)
            for metric, value in task.process_results(doc, [filtered]).items():
                if value is None or isinstance(value, (int, float)):  # bool is an int
                    row[f"{SCORE_PREFIX}{metric},{ensemble.name}"] = None if value is None else float(value)
        rows.append(row)
    return rows
