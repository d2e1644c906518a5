"""Every gate a comparison can fail, as one object each, in report order.

A gate's facts used to live in five places kept in step by hand (the config's fields,
compare's gate lists, numerics' floors, nightly's series, the reports). They live here;
the rest iterates :data:`GATES`. A token gate declares what it measures (a figure of the
task's token summary); the config's `tokens:` settings and compare's token measures are made
from those declarations. How a score or distributional gate is computed stays in
evalpipe/compare/gates.py, found there by the gate's name (a rule test holds the two together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# The reference's precision class, which sets the floors (evalpipe/compare/numerics.py).
FP32, HALF = "fp32", "half"
PRECISIONS = (FP32, HALF)

Family = Literal["scores", "free-running", "teacher-forced", "distributional", "sampled"]
# Where a token gate's detail points (evalpipe/compare/gates.py reads each kind): the positions
# of the largest KL, the first hard divergences, the first hard top-1 flips.
Evidence = Literal["largest_kl", "hard_divergences", "hard_top1_flips"]
FAMILIES: tuple[Family, ...] = ("scores", "free-running", "teacher-forced", "distributional", "sampled")


@dataclass(frozen=True)
class TokenMeasure:
    """What a token gate measures: ``figure``, a field of the task's token summary
    (:class:`evalpipe.documents.comparison.TokenSummary`), held against its tolerance;
    ``evidence``, which positions its detail names; ``counts``: the figure is a count."""

    figure: str
    evidence: Evidence
    counts: bool = False


@dataclass(frozen=True)
class Gate:
    """One gate.

    ``setting``: where the config holds it, as ``group.field`` of `gates:` (a switch for a
    score or sampled gate, a Tolerance for a token gate, a floor for a distributional one);
    ``floors``: the floor per precision for a deterministic engine or no A/A run, and
    ``noisy_aa_floors`` where the A/A run is noisy (docs/numerics.md measures both);
    ``series``: the (source, measure) a night follows in the history, if any;
    ``measure``: what a token gate reads (its setting is then a Tolerance under `tokens:`);
    ``label`` and ``sentence``: what it measures, for the reports' wording and the config's
    descriptions."""

    name: str
    family: Family
    setting: str
    label: str  # a noun phrase: "largest teacher-forced KL"
    sentence: str
    floors: Mapping[str, float] = field(default_factory=dict)
    noisy_aa_floors: Mapping[str, float] = field(default_factory=dict)
    series: tuple[str, str] | None = None
    measure: TokenMeasure | None = None

    @property
    def group(self) -> str:
        return self.setting.split(".")[0]

    @property
    def field_name(self) -> str:
        return self.setting.split(".")[1]


GATES: tuple[Gate, ...] = (
    Gate("score_equivalence", "scores", "scores.require_equivalence", "paired score equivalence (TOST)",
         "Fail a task x metric whose paired difference is not shown equivalent within +-margin (TOST)."),
    Gate("score_mcnemar", "scores", "scores.fail_on_significant", "paired score significance (McNemar)",
         "Fail a task x metric whose paired difference is significant (McNemar exact p < alpha)."),
    Gate("free_hard_divergences", "free-running", "tokens.free_hard_divergences", "hard divergences when free-running",
         "Free-running samples whose first divergence is hard (not a near tie), per task.",
         floors={FP32: 0, HALF: 0}, series=("free", "n_hard_divergences"),
         measure=TokenMeasure("n_hard_divergences", "hard_divergences", counts=True)),
    Gate("free_kl_max", "free-running", "tokens.free_kl_max", "largest KL when free-running",
         "Largest free-running per-position KL before the first divergence, nats (batch-layout faults that only "
         "decoding meets).",
         floors={FP32: 1e-8, HALF: 0.1}, series=("free", "kl_max"), measure=TokenMeasure("kl_max", "largest_kl")),
    Gate("teacher_kl_p99", "teacher-forced", "tokens.teacher_kl_p99", "p99 of the teacher-forced KL",
         "The p99 over teacher-forced positions of the symmetric top-k KL, max(KL(ref||variant), KL(variant||ref)), nats.",
         floors={FP32: 1e-9, HALF: 1e-3}, series=("teacher", "kl_p99"), measure=TokenMeasure("kl_p99", "largest_kl")),
    Gate("teacher_kl_max", "teacher-forced", "tokens.teacher_kl_max", "largest teacher-forced KL",
         "Largest teacher-forced per-position KL, nats (catches faults that touch few positions).",
         floors={FP32: 1e-8, HALF: 0.1}, series=("teacher", "kl_max"), measure=TokenMeasure("kl_max", "largest_kl")),
    Gate("teacher_hard_top1_flips", "teacher-forced", "tokens.teacher_hard_top1_flips", "hard top-1 flips when teacher-forced",
         "Teacher-forced positions whose top-1 token differs and the reference's gap between the two is not a near tie.",
         floors={FP32: 0, HALF: 0}, measure=TokenMeasure("n_top1_hard", "hard_top1_flips", counts=True)),
    # Where the A/A run is noisy, the distributional gates compare A/B with noise of the same
    # kind (run-to-run reordering of the same reductions), so they need no room for it and
    # their half-precision floors drop; fp32's are already far below any error that matters.
    Gate("teacher_dlogprob_shift", "distributional", "distribution.dlogprob_shift",
         "mean shift of the forced token's logprob, A/B minus A/A",
         "Fail when the forced token's logprob moves one way, A/B against A/A, over all teacher-forced positions "
         "(sign-flip test), by more than the floor (nats).",
         floors={FP32: 1e-6, HALF: 1e-3}, noisy_aa_floors={HALF: 1e-4}),
    Gate("teacher_kl_shift", "distributional", "distribution.kl_shift", "mean per-position KL above A/A",
         "Fail when the per-position KL of A/B is above that of A/A over all teacher-forced positions (sign-flip "
         "test), by more than the floor (nats).",
         floors={FP32: 1e-10, HALF: 1e-4}, noisy_aa_floors={HALF: 1e-6}),
    # Sampled tasks only (config `sampling:`, docs/sampling.md): with common random numbers a
    # sample can leave the reference's path only where the two distributions differ.
    Gate("sampled_excess_divergence", "sampled", "sampling.excess_divergence", "divergent samples beyond what the distributions explain",
         "Fail a sampled task whose samples leave the reference's path more often than the teacher-forced distributions "
         "allow (at most 2·TV/(1+TV) per step with common random numbers; Poisson-binomial p < sampling.alpha)."),
    Gate("sampled_divergence_above_aa", "sampled", "sampling.above_aa", "divergent samples above the A/A run's",
         "Fail a sampled task with more divergent samples than the A/A run has on the same seeds (one-sided Fisher exact "
         "p < sampling.alpha)."),
)

BY_NAME: dict[str, Gate] = {g.name: g for g in GATES}
ORDER: tuple[str, ...] = tuple(g.name for g in GATES)


def names(family: Family) -> tuple[str, ...]:
    return tuple(g.name for g in GATES if g.family == family)


def gate(name: str) -> Gate:
    return BY_NAME[name]


def token_gates() -> tuple[Gate, ...]:
    """The gates held against a Tolerance under `tokens:`, each with what it measures."""
    return tuple(g for g in GATES if g.measure is not None)
