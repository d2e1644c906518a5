"""`gates:` of a run config (and of a --gates file): when a comparison that is not
bitwise identical still counts as EQUIVALENT. What each gate is: evalpipe/gates/registry.py."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import Field, create_model, field_validator

from evalpipe.config.strict import Strict
from evalpipe.gates import registry

AUTO: Final = "auto"


# The distributional gates' sign-flip test draws this many random flips beyond 16 samples
# (evalpipe.compare.distribution), so its p-value is never below 1 / (1 + this): an alpha at
# or under that leaves those gates unable to fail.
SIGN_FLIP_RESAMPLES: Final = 9999


SMALLEST_SIGN_FLIP_P: Final = 1 / (1 + SIGN_FLIP_RESAMPLES)


def margin_problem(margin: float) -> str | None:
    """Why a TOST margin leaves the score equivalence gate unable to fail, or None. The
    margin is on the metric's scale; the scores compared are 0/1 per item (exact_match,
    accuracy), whose paired difference never exceeds 1."""
    if not math.isfinite(margin) or margin <= 0:
        return f"must be positive and finite (a score difference on the metric's scale, e.g. 0.01); got {margin}"
    if margin >= 1:
        return (f"must be below 1: no paired difference of a 0/1 metric (exact_match, accuracy) exceeds 1, so a margin "
                f"of {margin:g} leaves the equivalence gate unable to fail; use e.g. 0.01 (1 point)")
    return None


def _bound(value: Any, what: str) -> Any:
    """A gate's floor or multiple: finite and >= 0 (a bound of infinity, or NaN, is never exceeded)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number >= 0{what}; got {value} (the gate could never fail)")
    return value


class Tolerance(Strict):
    """A gate on one token metric: fail when measured > max(abs, rel_aa x the A/A value).

    ``abs: auto`` (the default) takes the floor for the reference's precision from
    :data:`evalpipe.compare.numerics.FLOORS`; a number overrides it. Without an A/A run
    (``noise_floor: false``) the bound is the floor alone.
    """

    abs: float | Literal["auto"] = Field(
        default=AUTO, description="Absolute floor; the gate never fails at or below it. `auto`: the floor for the reference's precision (docs/numerics.md)."
    )
    rel_aa: float | None = Field(default=3.0, ge=0, description="Multiple of the same metric in the A/A noise-floor run; null ignores the A/A run.")

    @field_validator("abs")
    @classmethod
    def _finite_floor(cls, v: float | str) -> float | str:
        return _bound(v, " or `auto`")

    @field_validator("rel_aa")
    @classmethod
    def _finite_multiple(cls, v: float | None) -> float | None:
        return _bound(v, " or null")

    def floor(self, auto_floor: float) -> float:
        return auto_floor if self.abs == AUTO else float(self.abs)

    def bound(self, aa_value: float | None, auto_floor: float = 0.0) -> float:
        floor = self.floor(auto_floor)
        if self.rel_aa is None or aa_value is None:
            return floor
        return max(floor, self.rel_aa * aa_value)


class ScoreGates(Strict):
    margin: float = Field(default=0.01, description="TOST equivalence margin on the metric's scale (0.01 = 1 point of accuracy); below 1.")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="Level of McNemar's test and of TOST (TOST uses the 1 - 2 alpha interval).")
    require_equivalence: bool = Field(default=True, description=registry.gate("score_equivalence").sentence)
    fail_on_significant: bool = Field(default=True, description=registry.gate("score_mcnemar").sentence)

    @field_validator("margin")
    @classmethod
    def _margin_can_fail(cls, v: float) -> float:
        if problem := margin_problem(v):
            raise ValueError(problem)
        return v


def _described(name: str) -> Any:
    """A token gate's setting, described by the gate itself (evalpipe/gates/registry.py)."""
    return Field(default=Tolerance(), description=registry.gate(name).sentence)


class _TokenGates(Strict):
    def tolerance(self, gate: registry.Gate) -> Tolerance:
        value = getattr(self, gate.field_name) if gate.group == "tokens" else None
        if not isinstance(value, Tolerance):
            raise KeyError(f"{gate.name} is not a token gate (its setting is {gate.setting})")
        return value


# `tokens:` holds one Tolerance per token gate of the registry, named and described by the
# gate, in its order: a token gate added there is a setting here without a line of this file.
if TYPE_CHECKING:
    TokenGates = _TokenGates
else:
    TokenGates = create_model(
        "TokenGates", __base__=_TokenGates, __module__=__name__,
        **{g.field_name: (Tolerance, _described(g.name)) for g in registry.token_gates()},
    )


class DistributionGates(Strict):
    """Tests of the A/B distribution against the A/A one over all teacher-forced positions
    (:mod:`evalpipe.compare.distribution`): a gate fails when the difference is
    significant (p < alpha) and larger than its floor. They need an A/A run."""

    enabled: bool = True
    alpha: float = Field(default=1e-3, lt=0.5, description=f"Level of the sign-flip permutation tests (per task and test); above {SMALLEST_SIGN_FLIP_P:g}, their smallest p-value.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Confidence of the reported effect interval.")
    dlogprob_shift: float | Literal["auto"] = Field(
        default=AUTO, description="Floor on |mean signed shift| of the forced token's logprob, nats; `auto`: by precision (docs/numerics.md)."
    )
    kl_shift: float | Literal["auto"] = Field(
        default=AUTO, description="Floor on the mean per-position KL above A/A, nats; `auto`: by precision (docs/numerics.md)."
    )

    @field_validator("alpha")
    @classmethod
    def _alpha_above_the_smallest_p(cls, v: float) -> float:
        if not v > SMALLEST_SIGN_FLIP_P:
            raise ValueError(f"must be above {SMALLEST_SIGN_FLIP_P:g}, the smallest p-value the sign-flip test gives with "
                             f"{SIGN_FLIP_RESAMPLES} random flips (at or below it the gates could never fail); got {v}")
        return v

    @field_validator("dlogprob_shift", "kl_shift")
    @classmethod
    def _finite_floor(cls, v: float | str) -> float | str:
        return _bound(v, " or `auto`")

    def setting(self, gate: registry.Gate) -> float | Literal["auto"]:
        """The floor the config sets for a distributional gate (``auto``: by precision)."""
        if gate.family != "distributional" or gate.group != "distribution":
            raise KeyError(f"{gate.name} is not a distributional gate (its setting is {gate.setting})")
        value: float | Literal["auto"] = getattr(self, gate.field_name)
        return value


# Below this level the exact tests of the sampled gates could only fail where their p-value
# underflows: such an alpha would leave them unable to fail.
SMALLEST_SAMPLED_ALPHA: Final = 1e-9


class SamplingGates(Strict):
    """The gates of sampled tasks (config `sampling:`; docs/sampling.md): exact tests on the
    number of samples that left the reference's path."""

    alpha: float = Field(default=1e-3, ge=SMALLEST_SAMPLED_ALPHA, lt=0.5,
                         description="Level of the sampled gates' exact tests (Poisson-binomial, Fisher).")
    excess_divergence: bool = Field(default=True, description=registry.gate("sampled_excess_divergence").sentence)
    above_aa: bool = Field(default=True, description=registry.gate("sampled_divergence_above_aa").sentence)


class Gates(Strict):
    """When a non-identical comparison still counts as EQUIVALENT. Any failing gate makes it DIVERGENT."""

    scores: ScoreGates = ScoreGates()
    tokens: TokenGates = TokenGates()
    distribution: DistributionGates = DistributionGates()
    sampling: SamplingGates = SamplingGates()
