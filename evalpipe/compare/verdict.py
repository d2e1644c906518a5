"""Turn score rows and token summaries into a verdict with concrete, evidence-bearing reasons.

This milestone decides IDENTICAL vs DIFFERENT only. The tolerance-based statuses
(EQUIVALENT, DIVERGENT) slot into :class:`Status` and :data:`STATUS_SEVERITY`; the
gate checks add reasons through the same list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Sequence

from evalpipe.compare.scores import ScoreRow
from evalpipe.compare.tokens import TaskTokenSummary

MINUS = "\u2212"
ARROW = "\u2192"


class Status(str, Enum):
    IDENTICAL = "IDENTICAL"
    DIFFERENT = "DIFFERENT"

    @property
    def severity(self) -> int:
        return STATUS_SEVERITY[self]

    def __str__(self) -> str:  # plain "IDENTICAL" in f-strings
        return self.value


# Higher is worse; the overall status of several comparisons is the worst one.
STATUS_SEVERITY: dict[Status, int] = {Status.IDENTICAL: 0, Status.DIFFERENT: 10}


def worst_status(statuses: Iterable[Status]) -> Status:
    statuses = list(statuses)
    return max(statuses, key=lambda s: s.severity) if statuses else Status.IDENTICAL


@dataclass(frozen=True)
class Verdict:
    status: Status
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "reasons": list(self.reasons)}


# ---------------------------------------------------------------------------
# number formatting shared with the reports
# ---------------------------------------------------------------------------


def fmt_score(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def fmt_delta(x: float | None) -> str:
    """Signed delta: 3 decimals, or 2 significant digits when smaller than that shows."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    s = f"{x:+.3f}" if abs(x) >= 0.0005 else f"{x:+.2g}"
    return MINUS + s[1:] if s.startswith("-") else s


def fmt_small(x: float | None) -> str:
    """|dlogprob|-like magnitudes: 2 significant digits (3.1e-06, 0.12)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    return f"{x:.2g}"


def fmt_keys(keys: Sequence[tuple[int, int]], total: int) -> str:
    """'doc 3, 7' or 'doc 3 repeat 1, ...' plus an ellipsis when truncated."""
    parts = [f"{d}" if r == 0 else f"{d} repeat {r}" for d, r in keys]
    more = ", \u2026" if total > len(keys) else ""
    return ("doc " + ", ".join(parts) + more) if parts else ""


def _where(doc_id: int, repeat: int) -> str:
    return f"doc {doc_id}" + (f" repeat {repeat}" if repeat else "")


# ---------------------------------------------------------------------------
# reasons
# ---------------------------------------------------------------------------


def token_reasons(t: TaskTokenSummary, label_a: str = "A", label_b: str = "B") -> list[str]:
    out = []
    for n, keys, label in ((t.only_a, t.only_a_keys, label_a), (t.only_b, t.only_b_keys, label_b)):
        if n:
            noun = "sample" if n == 1 else "samples"
            out.append(f"{t.task}: {n} {noun} present only in {label} ({fmt_keys(keys, n)})")
    if t.n_divergent:
        where = ""
        if t.worst_divergence:
            w = t.worst_divergence[0]
            where = f" (earliest at {_where(w.doc_id, w.repeat)}, position {w.pos})"
        elif t.divergence_positions:
            where = f" (earliest at position {t.divergence_positions[0]})"
        extra = f"; {t.n_length_diff} differ in length" if t.n_length_diff else ""
        out.append(f"{t.task}: {t.n_divergent}/{t.n_samples} samples generate different tokens{where}{extra}")
    if t.n_logprob_diff_same_ids:
        out.append(
            f"{t.task}: logprobs differ on {t.n_logprob_diff_same_ids}/{t.n_samples} samples with identical tokens "
            f"(max |\u0394logprob| {fmt_small(t.max_abs_dlogprob_same_ids)})"
        )
    if t.n_topk_diff_same_ids:
        out.append(
            f"{t.task}: top-k lists differ on {t.n_topk_diff_same_ids}/{t.n_samples} samples "
            "with identical tokens and logprobs"
        )
    return out


def score_reason(r: ScoreRow) -> str:
    s = (
        f"{r.task} {r.metric}: {fmt_score(r.mean_a)} {ARROW} {fmt_score(r.mean_b)} "
        f"(\u0394 {fmt_delta(r.delta)}, {r.n_changed} {'item' if r.n_changed == 1 else 'items'} changed"
    )
    if r.binary and r.n_changed:
        s += f": {r.a_right_b_wrong} right{ARROW}wrong, {r.a_wrong_b_right} wrong{ARROW}right"
    if r.n_missing:
        s += f"; {r.n_missing} scored on one side only"
    return s + ")"


def decide(
    score_rows: Sequence[ScoreRow],
    token_summaries: Sequence[TaskTokenSummary],
    *,
    metrics_only_a: Sequence[str] = (),
    metrics_only_b: Sequence[str] = (),
    label_a: str = "A",
    label_b: str = "B",
) -> Verdict:
    """IDENTICAL iff same sample set, every token id and logprob bitwise equal, every score equal.

    Reasons point at the evidence: which task, how many samples, where the earliest
    divergence is, how big the largest |dlogprob| is, how each score moved. For an
    IDENTICAL verdict the reasons state what was checked.
    """
    problems: list[str] = []
    tasks = sorted({t.task for t in token_summaries} | {r.task for r in score_rows})
    tok_by_task = {t.task: t for t in token_summaries}
    rows_by_task: dict[str, list[ScoreRow]] = {}
    for r in score_rows:
        rows_by_task.setdefault(r.task, []).append(r)

    if not tasks:
        problems.append("no samples to compare: both sides are empty")
    for task in tasks:
        t = tok_by_task.get(task)
        if t is None:
            problems.append(f"{task}: no token-level comparison available")
        else:
            problems.extend(token_reasons(t, label_a, label_b))
            if t.n_samples == 0 and not (t.only_a or t.only_b):
                problems.append(f"{task}: no samples to compare")
        for r in sorted(rows_by_task.get(task, []), key=lambda r: r.metric):
            if not r.identical:
                problems.append(score_reason(r))
    for label, metrics in ((label_a, metrics_only_a), (label_b, metrics_only_b)):
        if metrics:
            problems.append(f"metrics reported only by {label}: {', '.join(metrics)}")

    if problems:
        return Verdict(Status.DIFFERENT, tuple(problems))

    evidence = []
    for task in tasks:
        t = tok_by_task[task]
        evidence.append(
            f"{task}: {t.n_identical}/{t.n_samples} samples bitwise identical ({t.tokens_a} tokens, ids and logprobs)"
        )
        for r in sorted(rows_by_task.get(task, []), key=lambda r: r.metric):
            evidence.append(f"{task} {r.metric}: {fmt_score(r.mean_a)} on both ({r.n_paired} items)")
    return Verdict(Status.IDENTICAL, tuple(evidence))
