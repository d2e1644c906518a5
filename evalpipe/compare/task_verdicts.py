"""A verdict of each task of a comparison: the same rules as the comparison's (decide, each
gate against the same task's A/A figures), over that task's evidence only, then its paths:
the variant's own (every task shares them) and the task's requirements of vLLM's counters.

A scenario is a test of one engine path: its verdict says whether that path kept the outputs,
where the comparison's says whether everything did. A failed scenario requirement makes only
that task INCONCLUSIVE; a variant that ran the wrong code makes every task so.
"""

from __future__ import annotations

from collections.abc import Sequence

from evalpipe.compare.gates import AASummaries
from evalpipe.compare.numerics import Numerics
from evalpipe.compare.verdict import Verdict, decide
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import GateStatus, Paths, SampledTask, ScoreRow, ShiftTest, TaskVerdict, TokenSummary


def task_verdicts(
    score_rows: Sequence[ScoreRow],
    token_summaries: Sequence[TokenSummary],
    *,
    teacher_summaries: Sequence[TokenSummary] | None,
    gates: Gates,
    aa: AASummaries | None,
    numerics: Numerics,
    shift_tests: Sequence[ShiftTest] | None,
    shift_missing: str | None,
    sampled: Sequence[SampledTask] | None,
    aa_sampled: Sequence[SampledTask] | None,
    paths: Paths | None,
    shared_reasons: Sequence[str] = (),
) -> list[TaskVerdict]:
    """One verdict per task the comparison saw, in task order. ``shared_reasons``: what makes
    every task INCONCLUSIVE besides the paths (a side compared unverified, an A/A run whose
    seeded samples did not repeat)."""
    tasks = sorted({t.task for t in token_summaries} | {r.task for r in score_rows})
    out = []
    for task in tasks:
        verdict = decide(
            [r for r in score_rows if r.task == task], _of(token_summaries, task) or [],
            teacher_summaries=_of(teacher_summaries, task), gates=gates, aa=aa, numerics=numerics,
            shift_tests=_of(shift_tests, task), sampled=_of(sampled, task),
            aa_sampled=aa_sampled, **({} if shift_missing is None else {"shift_missing": shift_missing}),
        )
        reasons = [*shared_reasons, *_path_reasons(paths, task)]
        verdict = verdict.with_paths(bool(reasons), reasons)
        out.append(_document(task, verdict))
    return out


def _of(items: Sequence | None, task: str) -> list | None:
    return None if items is None else [x for x in items if x.task == task]


def _path_reasons(paths: Paths | None, task: str) -> list[str]:
    """Why the paths prove nothing for ``task``: every failure that is not another task's own."""
    if paths is None or not paths.inconclusive:
        return []
    others = {f for c in paths.checks for t, fs in c.task_failures.items() if t != task for f in fs}
    return [r for r in paths.reasons if r not in others]


def _document(task: str, verdict: Verdict) -> TaskVerdict:
    return TaskVerdict(task=task, status=verdict.status, reasons=list(verdict.reasons), outputs_status=verdict.outputs,
                       gates_failed=sum(g.failed for g in verdict.gates),
                       gates_passed=sum(g.status is GateStatus.PASS for g in verdict.gates))
