"""`gates:` of a run config (evalpipe/config/gate_settings.py): the documented defaults, the
bound a token gate holds a measure to (max of the floor and a multiple of the A/A value),
settings that would leave a gate unable to fail refused, and each registry gate's setting
read only by a gate of its kind."""

import pytest
from pydantic import ValidationError
from run_configs import MINIMAL

from evalpipe.config.errors import ConfigError
from evalpipe.config.gate_settings import (
    SMALLEST_SIGN_FLIP_P,
    DistributionGates,
    Gates,
    ScoreGates,
    Tolerance,
    margin_problem,
)
from evalpipe.config.loading import load_config, parse_config
from evalpipe.gates import registry


def test_gates_have_documented_defaults_and_reject_unknown_keys():
    cfg = parse_config(MINIMAL)
    assert cfg.gates.scores.margin == 0.01 and cfg.gates.scores.alpha == 0.05
    kl = cfg.gates.tokens.teacher_kl_p99
    assert kl.abs == "auto", "the floor follows the reference's precision by default"
    assert kl.bound(None, 1e-3) == 1e-3, "without an A/A run the floor applies"
    assert kl.bound(1e-4, 1e-3) == 1e-3 and kl.bound(0.01, 1e-3) == pytest.approx(0.03), "max(floor, 3 x A/A)"
    fixed = parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_p99": {"abs": 2e-3}}}}).gates.tokens.teacher_kl_p99
    assert fixed.bound(None, 1e-8) == 2e-3, "a number in the config overrides the table"
    with pytest.raises(ConfigError, match="gates.tokens.teacher_kl_p99.abs"):
        parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_p99": {"abs": -1}}}})
    with pytest.raises(ConfigError, match="unknown key `gates.tokens.kl`"):
        parse_config({**MINIMAL, "gates": {"tokens": {"kl": {"abs": 1}}}})
    strict = parse_config({**MINIMAL, "gates": {"tokens": {"teacher_kl_max": {"abs": 0.5, "rel_aa": None}}}})
    assert strict.gates.tokens.teacher_kl_max.bound(10.0) == 0.5


def test_default_config_spells_out_the_code_defaults_of_the_gates():
    # configs/default.yaml documents the gates; it must not drift from the code.
    from evalpipe.config.gate_settings import Gates

    assert load_config().gates == Gates()


def test_a_margin_or_alpha_that_leaves_a_gate_unable_to_fail_is_refused():
    assert margin_problem(0.01) is None
    assert "must be positive and finite" in margin_problem(0.0) and "must be positive" in margin_problem(float("nan"))
    assert "must be below 1" in margin_problem(1.0)
    with pytest.raises(ValidationError, match="must be below 1"):
        ScoreGates(margin=2)
    assert DistributionGates(alpha=2 * SMALLEST_SIGN_FLIP_P).alpha > SMALLEST_SIGN_FLIP_P
    with pytest.raises(ValidationError, match="smallest p-value the sign-flip test gives"):
        DistributionGates(alpha=SMALLEST_SIGN_FLIP_P)


@pytest.mark.parametrize("field, value", [("abs", float("inf")), ("abs", -1e-3), ("rel_aa", float("inf"))])
def test_a_tolerance_that_can_never_be_exceeded_is_refused(field, value):
    with pytest.raises(ValidationError, match="the gate could never fail"):
        Tolerance(**{field: value})


def test_each_gate_s_setting_is_read_by_a_gate_of_its_kind_only():
    gates = Gates(tokens={"teacher_kl_max": {"abs": 0.5}}, distribution={"kl_shift": 0.2})
    assert gates.tokens.tolerance(registry.gate("teacher_kl_max")).abs == 0.5
    distributional = next(g for g in registry.GATES if g.family == "distributional" and g.setting.endswith("kl_shift"))
    assert gates.distribution.setting(distributional) == 0.2
    with pytest.raises(KeyError, match="score_mcnemar is not a token gate"):
        gates.tokens.tolerance(registry.gate("score_mcnemar"))
    with pytest.raises(KeyError, match="teacher_kl_max is not a distributional gate"):
        gates.distribution.setting(registry.gate("teacher_kl_max"))
