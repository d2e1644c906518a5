"""Gates: when a comparison that is not bitwise identical still counts as EQUIVALENT.

Every gate is one check of one task (score gates: of one task x metric) with a
measured value, a threshold and a one-sentence detail pointing at the evidence. A
failing gate makes the comparison DIVERGENT; gates that cannot be evaluated on the
data at hand are "skip" and say why.

Score gates (per task x metric, over the paired items; see :mod:`evalpipe.compare.stats`)

* ``score_equivalence``: TOST. "No significant difference" is not evidence of
  equality: a small task rarely fails a significance test. TOST turns the burden
  around and passes only when the (1 - 2 alpha) interval of the paired difference
  lies inside ±margin, i.e. the data *show* the change is smaller than the margin.
  Measured: the interval's end furthest from 0; threshold: the margin.
* ``score_mcnemar``: significance. A tiny but systematic shift can sit inside a
  generous margin; McNemar's exact test on the discordant pairs catches it for
  0/1 metrics (fail when p < alpha). Non-binary metrics use a paired t-test p-value
  when the score row carries one (``ttest_p``), else the gate is skipped.

Together: equivalence bounds the size of the change, significance catches a
consistent direction; neither alone says "same".

Token gates (per task, each a :class:`evalpipe.config.gate_settings.Tolerance`)

The bound is ``max(floor, rel_aa x A/A value)``: the A/A comparison (the reference
against its own re-run with another batch arrangement) measures how much the
engine differs from itself. A variant is held to a multiple of that noise, never
to less than the floor; without an A/A run the bound is the floor. Fail iff
measured > bound. The floor is the tolerance's ``abs``, or with ``abs: auto`` (the
default) the floor for the reference's precision (:mod:`evalpipe.compare.numerics`):
a deterministic fp32 engine's A/A is bitwise identical, and then only the floor
stands between a systematic error and a PASS.

* ``free_hard_divergences``: free-running samples whose first divergence is hard.
* ``free_kl_max``: the largest top-k KL at a free-running position before the
  first divergence (both sides still agree on every earlier token). Decoding
  batches are arranged differently from the prefill that teacher forcing uses, so
  a fault tied to the batch layout (a row of a shard boundary, stale padding) can
  show here while the teacher-forced positions never meet it.
* ``teacher_kl_p99`` / ``teacher_kl_max``: the per-position top-k KL over the
  teacher-forced positions (both sides score the reference's tokens, so every
  position is comparable).
* ``teacher_hard_top1_flips``: teacher-forced positions whose top-1 token differs
  and is not a near tie.

Distributional gates (per task, :mod:`evalpipe.compare.distribution`; need an A/A run)

* ``teacher_dlogprob_shift``: the mean signed shift of the forced token's logprob,
  A/B minus A/A, over all teacher-forced positions (a bug tends to push it one way,
  noise does not);
* ``teacher_kl_shift``: the mean per-position KL of A/B above that of A/A.

Each fails when the sign-flip permutation test over samples is significant
(p < ``distribution.alpha``) and the effect is beyond its floor (precision-dependent
like the token floors). Measured: the effect (nats per position) with its interval.
They see a systematic error far below the noise of one position, which a
per-position bound at 3 x A/A cannot.

Swap symmetry: a verdict must not depend on which variant is called the reference.
The score gates are symmetric in A and B (TOST's interval is symmetric around the
difference and the margin around 0; McNemar is symmetric in its discordant counts).
The token gates inherit their symmetry from :mod:`evalpipe.compare.tokens`: its KL
is max(KL(A||B), KL(B||A)) per position and a near tie needs both sides' gaps below
the threshold, so a swap gives the same measures. The A/A values come from the
reference's own re-run and bound both orders alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Final, Iterable, Mapping, Sequence

from evalpipe.compare.distribution import ALTERNATIVE, measured
from evalpipe.compare.numerics import Numerics
from evalpipe.config.gate_settings import AUTO, DistributionGates, Gates, Tolerance
from evalpipe.documents.comparison import GateResult, GateStatus, SampledTask, ScoreRow, ShiftTest, TokenSummary
from evalpipe.gates import registry
from evalpipe.number_format import NOT_AVAILABLE, fmt_num

PASS: Final = GateStatus.PASS
FAIL: Final = GateStatus.FAIL
SKIP: Final = GateStatus.SKIP
SCORE_GATES = registry.names("scores")
DISTRIBUTION_GATES = registry.names("distributional")
SAMPLED_GATES = registry.names("sampled")
# Items / positions quoted in a detail sentence; ``evidence`` lists all that the summary kept.
POINTERS_IN_DETAIL = 3
NO_TEACHER = "no teacher-forced data (teacher.parquet missing on one side)"
NO_TEACHER_TASK = "no teacher-forced data for this task (teacher.parquet has no rows for it)"


@dataclass(frozen=True, eq=False)
class AASummaries:
    """Token summaries of the A/A comparison by task; ``teacher`` None when it had no teacher-forced data."""

    free: Mapping[str, TokenSummary]
    teacher: Mapping[str, TokenSummary] | None = None

    @classmethod
    def of(
        cls, free: Iterable[TokenSummary], teacher: Iterable[TokenSummary] | None = None
    ) -> "AASummaries":
        return cls({t.task: t for t in free}, None if teacher is None else {t.task: t for t in teacher})


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------


def _num(x: float | None) -> str:
    """A figure in a gate's sentence (evalpipe.number_format.fmt_num; "n/a" when missing)."""
    return fmt_num(x, NOT_AVAILABLE)


def _signed(x: float | None) -> str:
    return "n/a" if x is None else ("+" if x >= 0 else "") + _num(x)


def position(doc_id: int, repeat: int, pos: int | None = None) -> str:
    """Evidence string of an item ("doc 3 repeat 0") or a token position ("doc 3 repeat 0 pos 12")."""
    where = f"doc {int(doc_id)} repeat {int(repeat)}"
    return where if pos is None else f"{where} pos {int(pos)}"


def _pointer(label: str, evidence: Sequence[str], total: int | None = None) -> str:
    if not evidence:
        return ""
    more = len(evidence) > POINTERS_IN_DETAIL or (total is not None and total > len(evidence))
    return f"; {label} " + ", ".join(evidence[:POINTERS_IN_DETAIL]) + (", \u2026" if more else "")


def _floor_text(setting: float | str, floor: float, numerics: Numerics) -> str:
    """'fp32 floor 1e-09' for a floor from the table, 'abs 0.5' for one the config sets."""
    return f"{numerics.precision} floor {_num(floor)}" if setting == AUTO else f"abs {_num(floor)}"


def _bound_text(tol: Tolerance, aa_value: float | None, floor: float, numerics: Numerics) -> str:
    floor_text = _floor_text(tol.abs, floor, numerics)
    if tol.rel_aa is None:
        return f"{floor_text}; A/A not used"
    if aa_value is None:
        return f"{floor_text}; no A/A value"
    return f"max({floor_text}, {_num(tol.rel_aa)} x A/A {_num(aa_value)})"


# ---------------------------------------------------------------------------
# score gates
# ---------------------------------------------------------------------------


def _flipped_evidence(row: ScoreRow) -> tuple[str, ...]:
    return tuple(position(f.doc_id, f.repeat) for f in row.flipped)


def _check_row_settings(row: ScoreRow, gates: Gates) -> None:
    # The gates read TOST off the row; a row computed at another margin or level
    # would silently answer another question.
    margin, alpha = gates.scores.margin, gates.scores.alpha
    if row.margin != margin or row.alpha != alpha:
        raise ValueError(
            f"score row {row.task} {row.metric} was computed with margin {row.margin} and alpha {row.alpha} "
            f"but the gates ask for margin {margin} and alpha {alpha}; pass the gates' margin and alpha to compare_scores."
        )


def _score_gate(
    row: ScoreRow,
    gate: str,
    status: GateStatus,
    measured: float | None,
    threshold: float | None,
    text: str,
    evidence: tuple[str, ...] = (),
) -> GateResult:
    detail = f"{row.task} {row.metric} {gate}: {text}"
    return GateResult(gate=gate, task=row.task, metric=row.metric, status=status, measured=measured, threshold=threshold,
                      aa_value=None, detail=detail, evidence=evidence)


def _identical_row(row: ScoreRow, gate: str, measured: float, threshold: float) -> GateResult:
    return _score_gate(row, gate, PASS, measured, threshold, f"scores identical on all {row.n_paired} items")


def equivalence_gate(row: ScoreRow, gates: Gates) -> GateResult:
    """TOST at ``gates.scores.margin``; measured = the interval end furthest from 0."""
    gate, margin, alpha = "score_equivalence", gates.scores.margin, gates.scores.alpha
    if row.identical:
        return _identical_row(row, gate, 0.0, margin)
    evidence = _flipped_evidence(row)
    conf = f"{100 * (1 - 2 * alpha):g}%"
    lo, hi = row.tost_ci_low, row.tost_ci_high
    measured = None if lo is None or hi is None else max(abs(lo), abs(hi))
    if measured is None:
        why = "no item is scored on both sides" if row.n_paired == 0 else "its interval is undefined"
        text = f"not shown equivalent within \u00b1{_num(margin)}, {why} (n {row.n_paired}, {row.n_changed} changed)"
    else:
        inside = "inside" if row.equivalent else "not inside"
        text = f"{conf} CI [{_signed(lo)}, {_signed(hi)}] {inside} \u00b1{_num(margin)} (n {row.n_paired}"
        text += ")" if row.equivalent else f", \u0394 {_signed(row.delta)}, minimum detectable difference {_num(row.mdd)})"
    if not row.equivalent:
        text += _pointer("flipped:", evidence, row.n_flipped)
    return _score_gate(row, gate, PASS if row.equivalent else FAIL, measured, margin, text, evidence)


def significance_gate(row: ScoreRow, gates: Gates) -> GateResult:
    """McNemar exact p for 0/1 metrics, the paired t-test p (if the row has one) otherwise; fail when p < alpha."""
    gate, alpha = "score_mcnemar", gates.scores.alpha
    if row.identical:
        return _identical_row(row, gate, 1.0, alpha)
    evidence = _flipped_evidence(row)
    if row.binary:
        p, test = row.mcnemar_p, "McNemar exact p"
        counts = f"{row.a_right_b_wrong} right\u2192wrong, {row.a_wrong_b_right} wrong\u2192right, n {row.n_paired}"
    else:
        p, test = getattr(row, "ttest_p", None), "paired t-test p"
        counts = f"{row.n_changed} changed, n {row.n_paired}"
    if p is None:
        if row.n_paired == 0:
            why = "no item is scored on both sides"
        elif row.binary:
            why = "the p-value is undefined"
        else:
            why = "the metric is not 0/1 and the score row has no paired t-test p-value; score_equivalence covers it"
        return _score_gate(row, gate, SKIP, None, alpha, f"skipped, {why}", evidence)
    failed = p < alpha
    text = f"{test} {_num(p)} {'<' if failed else '>='} {_num(alpha)} ({counts})"
    if failed:
        text += _pointer("flipped:", evidence, row.n_flipped)
    return _score_gate(row, gate, FAIL if failed else PASS, p, alpha, text, evidence)


def score_gates(row: ScoreRow, gates: Gates) -> list[GateResult]:
    _check_row_settings(row, gates)
    out = []
    if gates.scores.require_equivalence:
        out.append(equivalence_gate(row, gates))
    if gates.scores.fail_on_significant:
        out.append(significance_gate(row, gates))
    return out


# ---------------------------------------------------------------------------
# token gates
# ---------------------------------------------------------------------------


def _kl_positions(t: Any) -> list[tuple[int, int, int]]:
    at = getattr(t, "kl_max_at", None)
    worst = [(w.doc_id, w.repeat, w.pos) for w in getattr(t, "worst_kl", ())]
    return ([tuple(at)] if at is not None else []) + worst


@dataclass(frozen=True)
class _TokenMeasure:
    """How a token gate reads a TokenSummary.

    Fields the summary may not have yet (older token comparisons) are read with
    getattr, so such a gate skips instead of failing.
    """

    gate: str
    field: str
    label: str  # how the detail points at the evidence: "worst at", "first at"
    positions: Callable[[Any], Iterable[tuple[int, int, int]]]
    is_count: bool = False

    def evidence(self, t: Any) -> tuple[str, ...]:
        return tuple(dict.fromkeys(position(*p) for p in self.positions(t)))

    def value(self, t: Any) -> tuple[float | None, str | None]:
        """(measured, None) or (None, why it cannot be measured)."""
        if not hasattr(t, self.field):
            return None, f"this token comparison does not compute {self.field}"
        v = getattr(t, self.field)
        if v is not None:
            return float(v), None
        if t.n_positions_compared == 0 and t.n_samples == 0:
            return 0.0, None  # nothing on either side to differ
        if t.n_positions_compared == 0:
            return None, f"no position to compare in {t.n_samples} samples"
        return None, f"{self.field} is undefined over {t.n_positions_compared} positions"


def _hard_positions(t: Any) -> Iterable[tuple[int, int, int]]:
    return getattr(t, "hard_divergences", ())


def _top1_positions(t: Any) -> Iterable[tuple[int, int, int]]:
    return getattr(t, "top1_hard_positions", ())


# Where each kind of evidence is in a summary, and how a detail points at it.
_EVIDENCE: dict[registry.Evidence, tuple[str, Callable[[Any], Iterable[tuple[int, int, int]]]]] = {
    "largest_kl": ("worst at", _kl_positions),
    "hard_divergences": ("first at", _hard_positions),
    "hard_top1_flips": ("first at", _top1_positions),
}


def _token_measure(name: str, measure: registry.TokenMeasure) -> _TokenMeasure:
    """How a token gate of the registry reads a summary: what its entry declares."""
    label, positions = _EVIDENCE[measure.evidence]
    return _TokenMeasure(name, measure.figure, label, positions, measure.counts)


_TOKEN_MEASURES = {g.name: _token_measure(g.name, g.measure) for g in registry.GATES if g.measure is not None}
FREE_MEASURES = tuple(_TOKEN_MEASURES[name] for name in registry.names("free-running"))
TEACHER_MEASURES = tuple(_TOKEN_MEASURES[name] for name in registry.names("teacher-forced"))
FREE_GATES = registry.names("free-running")
TEACHER_GATES = registry.names("teacher-forced")
# Every gate evaluate_gates can produce, in report order: the registry's.
GATE_ORDER = registry.ORDER


def _aa_value(m: _TokenMeasure, aa: Mapping[str, TokenSummary] | None, task: str) -> float | None:
    t = None if aa is None else aa.get(task)
    if t is None:
        return None
    value, _ = m.value(t)
    return value


def token_gate(
    m: _TokenMeasure,
    task: str,
    t: TokenSummary | None,
    tol: Tolerance,
    aa_value: float | None,
    missing: str,
    numerics: Numerics = Numerics(),
) -> GateResult:
    """One tolerance gate: fail iff measured > max(floor, rel_aa x A/A value)."""
    floor = tol.floor(numerics.floor(m.gate))
    bound = tol.bound(aa_value, floor)
    head = f"{task} {m.gate}:"
    if t is None:
        return GateResult(gate=m.gate, task=task, metric=None, status=SKIP, measured=None, threshold=bound, aa_value=aa_value, detail=f"{head} skipped, {missing}")
    measured, why = m.value(t)
    if measured is None:
        return GateResult(gate=m.gate, task=task, metric=None, status=SKIP, measured=None, threshold=bound, aa_value=aa_value, detail=f"{head} skipped, {why}")
    evidence = m.evidence(t) if measured > 0 else ()
    failed = measured > bound
    text = f"{head} {_num(measured)} {'>' if failed else '<='} {_num(bound)} ({_bound_text(tol, aa_value, floor, numerics)})"
    if failed:
        text += _pointer(m.label, evidence, int(measured) if m.is_count else None)
    return GateResult(gate=m.gate, task=task, metric=None, status=FAIL if failed else PASS, measured=measured, threshold=bound, aa_value=aa_value, detail=text, evidence=evidence)


# ---------------------------------------------------------------------------
# distributional gates
# ---------------------------------------------------------------------------

def distribution_gate(
    gate: str, task: str, test: ShiftTest | None, cfg: DistributionGates, numerics: Numerics, missing: str
) -> GateResult:
    """Fail iff the permutation test is significant (p < alpha) and |effect| > floor.

    measured = the effect (signed for the logprob shift), threshold = the floor; the
    detail gives the interval, the p-value and the effect in units of one position's
    A/A spread (how far below a per-position gate's reach it is)."""
    setting = cfg.setting(registry.gate(gate))
    floor = numerics.floor(gate) if setting == AUTO else float(setting)
    floor_text = _floor_text(setting, floor, numerics)
    head = f"{task} {gate}:"
    if test is None:
        return GateResult(gate=gate, task=task, metric=None, status=SKIP, measured=None, threshold=floor, aa_value=None, detail=f"{head} skipped, {missing}")
    if test.n_samples < 2:
        why = f"{test.n_samples} sample(s) with teacher-forced positions paired with the A/A run; the test needs 2"
        return GateResult(gate=gate, task=task, metric=None, status=SKIP, measured=None, threshold=floor, aa_value=None, detail=f"{head} skipped, {why}")
    effect = measured(test.estimate)
    significant = measured(test.p_value) < cfg.alpha
    relevant = abs(effect) > floor
    failed = significant and relevant
    conf = f"{100 * test.confidence:g}%"
    two_sided = ALTERNATIVE[test.test] == "two-sided"
    high = _signed(test.ci_high) if two_sided else "\u221e)"
    interval = f"[{_signed(test.ci_low)}, {high}" + ("]" if two_sided else "")
    text = (
        f"{head} {registry.gate(gate).label} {_signed(effect)} nats, {conf} CI {interval}, "
        f"sign-flip p {_num(test.p_value)} {'<' if significant else '>='} {_num(cfg.alpha)}, "
        f"|effect| {'>' if relevant else '<='} {floor_text} ({test.n_positions} positions in {test.n_samples} samples"
    )
    if test.aa_position_sd:
        text += f"; {_num(abs(effect) / test.aa_position_sd)} x one position's A/A spread"
    text += ")"
    return GateResult(gate=gate, task=task, metric=None, status=FAIL if failed else PASS, measured=effect, threshold=floor, aa_value=test.aa_position_sd, detail=text)


def distribution_gates(
    tasks: Sequence[str],
    tests: Sequence[ShiftTest] | None,
    gates: Gates,
    numerics: Numerics,
    missing: str,
) -> list[GateResult]:
    """Both distributional gates of every task; ``tests`` None: skipped, ``missing`` says why."""
    cfg = gates.distribution
    if not cfg.enabled:
        return []
    by_key = {(t.task, "teacher_" + t.test): t for t in tests or ()}
    return [
        distribution_gate(gate, task, by_key.get((task, gate)), cfg, numerics, missing if tests is None else NO_TEACHER_TASK)
        for task in tasks
        for gate in DISTRIBUTION_GATES
    ]


# ---------------------------------------------------------------------------
# sampled gates (sampled tasks only)
# ---------------------------------------------------------------------------


def _skip(gate: str, task: str, why: str, alpha: float) -> GateResult:
    return GateResult(gate=gate, task=task, metric=None, status=SKIP, measured=None, threshold=alpha, aa_value=None,
                      detail=f"{task} {gate}: skipped, {why}")


def excess_divergence_gate(t: SampledTask, alpha: float) -> GateResult:
    """Fail when more samples left the reference's path than the teacher-forced distributions
    allow: the exact probability of at least that many, each sample at its bound, is < alpha."""
    gate = "sampled_excess_divergence"
    if t.samples == 0:
        return _skip(gate, t.task, "no sampled sample on both sides: nothing was compared", alpha)
    if t.excess_p is None:
        why = (f"{t.samples - t.predicted_samples} of {t.samples} samples have no teacher-forced distributions on both "
               "sides (capture.teacher_forcing)")
        return _skip(gate, t.task, why, alpha)
    failed = t.excess_p < alpha
    text = (f"{t.task} {gate}: {t.divergent} of {t.samples} samples left the reference's path where the distributions "
            f"allow {_num(t.predicted)} at most (largest TV {_num(t.tv_max)}); P(>= {t.divergent}) = {_num(t.excess_p)} "
            f"{'<' if failed else '>='} {_num(alpha)}")
    if failed:
        text += ": more divergences than the distributions explain"
    return GateResult(gate=gate, task=t.task, metric=None, status=FAIL if failed else PASS, measured=t.excess_p,
                      threshold=alpha, aa_value=None, detail=text)


def above_aa_gate(t: SampledTask, aa: SampledTask | None, alpha: float) -> GateResult:
    """Fail when the variant's divergent samples are significantly more than the A/A run's
    (one-sided Fisher exact test on the two counts of the same number of seeds)."""
    gate = "sampled_divergence_above_aa"
    if t.samples == 0:
        return _skip(gate, t.task, "no sampled sample on both sides: nothing was compared", alpha)
    if aa is None or aa.samples == 0:
        return _skip(gate, t.task, "no sampled A/A comparison of this task (noise_floor: true)", alpha)
    from scipy.stats import fisher_exact  # noqa: PLC0415 - scipy's stats import costs every compare a quarter second

    table = [[t.divergent, t.samples - t.divergent], [aa.divergent, aa.samples - aa.divergent]]
    p = float(fisher_exact(table, alternative="greater").pvalue)
    failed = p < alpha
    text = (f"{t.task} {gate}: {t.divergent} of {t.samples} samples diverged, the A/A run {aa.divergent} of {aa.samples}; "
            f"Fisher p {_num(p)} {'<' if failed else '>='} {_num(alpha)}")
    return GateResult(gate=gate, task=t.task, metric=None, status=FAIL if failed else PASS, measured=p, threshold=alpha,
                      aa_value=aa.divergent / aa.samples, detail=text)


def sampled_gates(sampled: Sequence[SampledTask] | None, aa: Sequence[SampledTask] | None, gates: Gates) -> list[GateResult]:
    """Both sampled gates of every sampled task (none for a greedy comparison)."""
    cfg = gates.sampling
    by_task = {t.task: t for t in aa or ()}
    out = []
    for t in sampled or ():
        if cfg.excess_divergence:
            out.append(excess_divergence_gate(t, cfg.alpha))
        if cfg.above_aa:
            out.append(above_aa_gate(t, by_task.get(t.task), cfg.alpha))
    return out


# ---------------------------------------------------------------------------
# all gates
# ---------------------------------------------------------------------------


def _order(g: GateResult) -> tuple[str, int, str]:
    return g.task, GATE_ORDER.index(g.gate), g.metric or ""


def evaluate_gates(
    score_rows: Sequence[ScoreRow],
    free_summaries: Sequence[TokenSummary],
    teacher_summaries: Sequence[TokenSummary] | None,
    gates: Gates,
    aa: AASummaries | None = None,
    *,
    numerics: Numerics = Numerics(),
    shift_tests: Sequence[ShiftTest] | None = None,
    shift_missing: str = "no A/A run: these gates compare the A/B distribution with the A/A one (noise_floor: true)",
    sampled: Sequence[SampledTask] | None = None,
    aa_sampled: Sequence[SampledTask] | None = None,
) -> list[GateResult]:
    """Every gate of every task, ordered by (task, gate, metric).

    ``teacher_summaries`` None means the comparison has no teacher-forced data (the
    teacher gates skip); ``aa`` the A/A comparison whose values set the relative bounds;
    ``numerics`` the reference's precision (the ``auto`` floors); ``shift_tests`` the
    distributional tests (None: those gates skip, ``shift_missing`` says why); ``sampled`` the
    sampled tasks' figures and ``aa_sampled`` the A/A comparison's (greedy: None, no sampled gate).
    A task appears when any input mentions it.
    """
    free = {t.task: t for t in free_summaries}
    teacher = None if teacher_summaries is None else {t.task: t for t in teacher_summaries}
    tasks = sorted({r.task for r in score_rows} | set(free) | set(teacher or ()))
    out = [g for row in score_rows for g in score_gates(row, gates)]
    for task in tasks:
        for m in FREE_MEASURES:
            tol = gates.tokens.tolerance(registry.gate(m.gate))
            aa_value = _aa_value(m, None if aa is None else aa.free, task)
            out.append(token_gate(m, task, free.get(task), tol, aa_value, "no token-level comparison for this task", numerics))
        for m in TEACHER_MEASURES:
            tol = gates.tokens.tolerance(registry.gate(m.gate))
            summary = None if teacher is None else teacher.get(task)
            missing = NO_TEACHER if teacher is None else NO_TEACHER_TASK
            aa_value = _aa_value(m, None if aa is None else aa.teacher, task)
            out.append(token_gate(m, task, summary, tol, aa_value, missing, numerics))
    out.extend(distribution_gates(tasks, shift_tests, gates, numerics, shift_missing))
    out.extend(sampled_gates(sampled, aa_sampled, gates))
    return sorted(out, key=_order)
