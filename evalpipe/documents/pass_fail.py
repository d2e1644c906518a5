"""The results file other bisect tools read (`evalpipe run|compare --results-json PATH`).

vllm-ascend's tools/bisect judges a step by the JSON files its test leaves in a results
directory: a step fails when any of them has the top-level ``"pass_fail": "fail"``, and it
reads them only when the test exited 0 (exit codes 2, 3, 4 and 5 are a skip there, which
are evalpipe's user error, failed run and INCONCLUSIVE). This is evalpipe's verdict in that
shape: one entry per variant and task with the task's own verdict and scores, and the run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from evalpipe.atomic_files import write_text
from evalpipe.documents.base import Document
from evalpipe.documents.comparison import ComparisonDocument, Status

PASS_FAIL_SCHEMA_VERSION: Final = 1
PassFail = Literal["pass", "fail", "inconclusive"]


def pass_fail_of(status: Status) -> PassFail:
    if status.passed:
        return "pass"
    return "fail" if status is Status.DIVERGENT else "inconclusive"


class PassFailTask(Document):
    name: str  # variant/task
    status: Status
    metrics: dict[str, float | None]  # the variant's scores
    pass_fail: PassFail


class PassFailResult(Document):
    schema_version: Literal[1] = PASS_FAIL_SCHEMA_VERSION
    tool: Literal["evalpipe"] = "evalpipe"
    run_id: str
    reference: str
    status: Status
    exit_code: int
    tasks: list[PassFailTask]
    pass_fail: PassFail


def pass_fail_result(doc: ComparisonDocument, exit_code: int) -> PassFailResult:
    tasks = []
    for comparison in doc.comparisons:
        for verdict in comparison.tasks or []:
            metrics = {s.metric: s.mean_b for s in comparison.scores if s.task == verdict.task}
            tasks.append(PassFailTask(name=f"{comparison.variant}/{verdict.task}", status=verdict.status, metrics=metrics,
                                      pass_fail=pass_fail_of(verdict.status)))
    return PassFailResult(run_id=doc.run_id, reference=doc.reference, status=doc.status, exit_code=exit_code, tasks=tasks,
                          pass_fail=pass_fail_of(doc.status))


def write_pass_fail(path: Path, result: PassFailResult) -> None:
    write_text(path, result.model_dump_json(indent=2) + "\n")
