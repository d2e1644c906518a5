"""Turn score rows and token summaries into a verdict with concrete, evidence-bearing reasons.

IDENTICAL: the same samples, every token id, logprob and top-k entry bitwise equal
(free-running and, when present, teacher-forced), every score equal.
DIVERGENT: a structural problem (samples or metrics on one side only, nothing to
compare) or a failing gate (:mod:`evalpipe.compare.gates`).
EQUIVALENT: not identical, but every gate passes.
INCONCLUSIVE: whatever the outputs say, nothing was proven about the declared paths: a
side did not run the path its expectations declare, cannot be verified, or both sides
ran the same code (:mod:`evalpipe.compare.code_paths`, applied by :func:`with_paths`);
or a side was compared unverified, without the manifest its files are checked against
(`evalpipe compare --unverified`, applied by :func:`Verdict.unverified`).

The gates are evaluated for every verdict, IDENTICAL included, so that a CI report
can show one test case per task x gate whatever the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from evalpipe.compare.gates import PASS, AASummaries, GateResult, evaluate_gates
from evalpipe.compare.numerics import Numerics
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import SampledTask, ScoreRow, ShiftTest, Status, TokenSummary
from evalpipe.number_format import fmt_delta, fmt_score, fmt_small

NO_GATE_JUDGED = ("the outputs differ and no gate judged the difference, so nothing shows them equivalent; turn the score "
                  "gates on (gates.scores.require_equivalence) or give the comparison the data its gates need")
ARROW = "\u2192"


def worst_status(statuses: Iterable[Status]) -> Status:
    """The worst of several comparisons' statuses; of none, INCONCLUSIVE (nothing compared is no pass)."""
    statuses = list(statuses)
    return max(statuses, key=lambda s: s.severity) if statuses else Status.INCONCLUSIVE


@dataclass(frozen=True)
class Verdict:
    status: Status
    reasons: tuple[str, ...]
    gates: tuple[GateResult, ...] = ()
    outputs: Status | None = None  # INCONCLUSIVE: what the outputs alone said

    def with_paths(self, inconclusive: bool, reasons: Sequence[str]) -> "Verdict":
        """INCONCLUSIVE, the path reasons first, when the paths prove nothing; else unchanged.
        The gates stay: CI still sees what the outputs did."""
        if not inconclusive:
            return self
        said = f"the outputs alone would be {self.status.value}" + (f": {self.reasons[0]}" if self.reasons else "")
        return Verdict(Status.INCONCLUSIVE, (*reasons, said, *self.reasons[1:]), self.gates, outputs=self.status)

    def unverified(self, names: Sequence[str]) -> "Verdict":
        """INCONCLUSIVE, the unverified sides named first, when a side's files could not be
        checked against its manifest (``names``: those sides); else unchanged. Files nobody
        vouches for prove nothing either way: an EQUIVALENT from them is no pass (exit 0), a
        DIVERGENT no finding; what they said stays in ``outputs`` and the gates stay."""
        if not names:
            return self
        reason = unverified_reason(names)
        if self.status is Status.INCONCLUSIVE:
            return Verdict(Status.INCONCLUSIVE, (reason, *self.reasons), self.gates, outputs=self.outputs)
        return self.with_paths(True, [reason])


def unverified_reason(names: Sequence[str]) -> str:
    """The first reason of a comparison read without a side's manifest."""
    sides = ", ".join(repr(n) for n in names)
    whose = "its files are what its engine" if len(names) == 1 else "their files are what their engines"
    return f"compared unverified (--unverified): {sides} had no manifest.json, so nothing shows {whose} wrote"


# ---------------------------------------------------------------------------
# sample keys in sentences (numbers: evalpipe.number_format)
# ---------------------------------------------------------------------------


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


def presence_reasons(t: TokenSummary, label_a: str = "A", label_b: str = "B", name: str | None = None) -> list[str]:
    """Samples present on one side only (``name`` replaces the task name in the sentences)."""
    out = []
    for n, keys, label in ((t.only_a, t.only_a_keys, label_a), (t.only_b, t.only_b_keys, label_b)):
        if n:
            noun = "sample" if n == 1 else "samples"
            out.append(f"{name or t.task}: {n} {noun} present only in {label} ({fmt_keys(keys, n)})")
    return out


def difference_reasons(t: TokenSummary, name: str | None = None) -> list[str]:
    """How the paired samples differ: generated tokens, logprobs, top-k lists."""
    name = name or t.task
    out = []
    if t.n_divergent:
        where = ""
        if t.worst_divergence:
            w = t.worst_divergence[0]
            where = f" (earliest at {_where(w.doc_id, w.repeat)}, position {w.pos})"
        elif t.divergence_positions:
            where = f" (earliest at position {t.divergence_positions[0]})"
        extra = f"; {t.n_length_diff} differ in length" if t.n_length_diff else ""
        out.append(f"{name}: {t.n_divergent}/{t.n_samples} samples generate different tokens{where}{extra}")
    if t.n_logprob_diff_same_ids:
        out.append(
            f"{name}: logprobs differ on {t.n_logprob_diff_same_ids}/{t.n_samples} samples with identical tokens "
            f"(max |\u0394logprob| {fmt_small(t.max_abs_dlogprob_same_ids)})"
        )
    if t.n_topk_diff_same_ids:
        out.append(
            f"{name}: top-k lists differ on {t.n_topk_diff_same_ids}/{t.n_samples} samples "
            "with identical tokens and logprobs"
        )
    return out


def token_reasons(t: TokenSummary, label_a: str = "A", label_b: str = "B", name: str | None = None) -> list[str]:
    return presence_reasons(t, label_a, label_b, name) + difference_reasons(t, name)


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


def teacher_name(task: str) -> str:
    return f"{task} (teacher-forced)"


@dataclass
class _Findings:
    """What decide() observed, sorted into the kinds the status depends on."""

    structural: list[str] = field(default_factory=list)  # DIVERGENT whatever the gates say
    differences: list[str] = field(default_factory=list)  # not identical, possibly within the gates
    evidence: list[str] = field(default_factory=list)  # what was checked, for an IDENTICAL verdict

    def free(self, task: str, t: TokenSummary | None, label_a: str, label_b: str) -> None:
        if t is None:
            self.structural.append(f"{task}: no token-level comparison available")
            return
        self.structural.extend(presence_reasons(t, label_a, label_b))
        if t.n_samples == 0 and not (t.only_a or t.only_b):
            self.structural.append(f"{task}: no samples to compare")
        self.differences.extend(difference_reasons(t))
        self.evidence.append(
            f"{task}: {t.n_identical}/{t.n_samples} samples bitwise identical ({t.tokens_a} tokens, ids and logprobs)"
        )

    def teacher(self, task: str, t: TokenSummary, label_a: str, label_b: str) -> None:
        # One-sided teacher-forced samples are a difference, not a structural problem:
        # the free-running comparison already judges the sample sets.
        name = teacher_name(task)
        self.differences.extend(token_reasons(t, label_a, label_b, name))
        self.evidence.append(
            f"{name}: {t.n_identical}/{t.n_samples} samples bitwise identical ({t.n_positions_compared} positions)"
        )

    def scores(self, rows: Sequence[ScoreRow]) -> None:
        for r in sorted(rows, key=lambda r: r.metric):
            if r.identical:
                self.evidence.append(f"{r.task} {r.metric}: {fmt_score(r.mean_a)} on both ({r.n_paired} items)")
            else:
                self.differences.append(score_reason(r))


def _findings(
    score_rows: Sequence[ScoreRow],
    token_summaries: Sequence[TokenSummary],
    teacher_summaries: Sequence[TokenSummary] | None,
    metrics_only: tuple[tuple[str, Sequence[str]], tuple[str, Sequence[str]]],
) -> _Findings:
    """``metrics_only``: (label, metrics only that side reports) for side A, then side B."""
    (label_a, _), (label_b, _) = metrics_only
    f = _Findings()
    free = {t.task: t for t in token_summaries}
    teacher = {t.task: t for t in teacher_summaries or ()}
    tasks = sorted(set(free) | set(teacher) | {r.task for r in score_rows})
    if not tasks:
        f.structural.append("no samples to compare: both sides are empty")
    for task in tasks:
        f.free(task, free.get(task), label_a, label_b)
        if task in teacher:
            f.teacher(task, teacher[task], label_a, label_b)
        f.scores([r for r in score_rows if r.task == task])
    for label, metrics in metrics_only:
        if metrics:
            f.structural.append(f"metrics reported only by {label}: {', '.join(metrics)}")
    return f


def gates_summary(results: Sequence[GateResult]) -> str:
    n_skip = sum(g.skipped for g in results)
    return f"all {len(results) - n_skip} gates passed ({n_skip} skipped)"


def decide(
    score_rows: Sequence[ScoreRow],
    token_summaries: Sequence[TokenSummary],
    *,
    teacher_summaries: Sequence[TokenSummary] | None = None,
    gates: Gates = Gates(),
    aa: AASummaries | None = None,
    metrics_only_a: Sequence[str] = (),
    metrics_only_b: Sequence[str] = (),
    label_a: str = "A",
    label_b: str = "B",
    numerics: Numerics = Numerics(),
    shift_tests: Sequence[ShiftTest] | None = None,
    shift_missing: str | None = None,
    sampled: Sequence[SampledTask] | None = None,
    aa_sampled: Sequence[SampledTask] | None = None,
) -> Verdict:
    """IDENTICAL, EQUIVALENT or DIVERGENT, with reasons that point at the evidence.

    ``teacher_summaries`` None: no teacher-forced data (its gates skip, and it does not
    keep a comparison from being IDENTICAL). ``aa``: the A/A comparison's summaries,
    for the gates' relative bounds; ``numerics``: the reference's precision (the gates'
    ``auto`` floors); ``shift_tests``: the distributional tests (None: skipped, for the
    reason ``shift_missing``).

    Reasons: DIVERGENT lists the failing gates' details first, then the structural
    problems and the other observed differences; EQUIVALENT the observed differences
    and how many gates passed; IDENTICAL what was checked.
    """
    extra = {} if shift_missing is None else {"shift_missing": shift_missing}
    results = tuple(
        evaluate_gates(
            score_rows, token_summaries, teacher_summaries, gates, aa, numerics=numerics, shift_tests=shift_tests,
            sampled=sampled, aa_sampled=aa_sampled, **extra
        )
    )
    f = _findings(score_rows, token_summaries, teacher_summaries, ((label_a, metrics_only_a), (label_b, metrics_only_b)))
    failing = [g.detail for g in results if g.failed]
    if failing or f.structural:
        return Verdict(Status.DIVERGENT, tuple(failing + f.structural + f.differences), results)
    if f.differences and not any(g.status == PASS for g in results):
        # different outputs that no gate could judge (the score gates off, the others skipped): nothing shows them equivalent
        return Verdict(Status.INCONCLUSIVE, (NO_GATE_JUDGED + f" ({gates_summary(results)})", *f.differences), results)
    if f.differences:
        return Verdict(Status.EQUIVALENT, tuple(f.differences + [gates_summary(results)]), results)
    return Verdict(Status.IDENTICAL, tuple(f.evidence), results)
