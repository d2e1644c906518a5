"""evalpipe/gates/registry.py: every gate is one object, and everything that reads gates
iterates it. A gate added there and nowhere else fails here until it has a config
setting of its kind, floors for every precision (a token or distributional gate), a label
and a sentence the config and the reports show, a measure in compare and a failing input
(tests/test_every_check_can_fail.py)."""

from __future__ import annotations

import pytest

from evalpipe.compare import gates as compare_gates
from evalpipe.compare.numerics import FLOORS, NOISY_AA_FLOORS
from evalpipe.config.gate_settings import AUTO, Gates, TokenGates, Tolerance
from evalpipe.documents.comparison import TokenSummary
from evalpipe.gates.registry import FAMILIES, GATES, ORDER, PRECISIONS, Gate
from evalpipe.nightly import judging
from tests.test_every_check_can_fail import FAILING_INPUTS

# the kind of setting each family's gate has in `gates:`
SETTING_KIND = {"scores": bool, "free-running": Tolerance, "teacher-forced": Tolerance, "distributional": (float, str),
                "sampled": bool}


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.name)
def test_a_gate_has_a_setting_of_its_kind_described_in_its_own_words(gate: Gate):
    group = getattr(Gates(), gate.group)
    value = getattr(group, gate.field_name)
    assert isinstance(value, SETTING_KIND[gate.family]), (gate.setting, value)
    if gate.family == "distributional":
        assert value == AUTO or isinstance(value, float)
    else:
        assert type(group).model_fields[gate.field_name].description == gate.sentence


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.name)
def test_a_gate_has_floors_for_every_precision_unless_it_judges_scores(gate: Gate):
    if gate.family in ("scores", "sampled"):
        assert not gate.floors and not gate.noisy_aa_floors, "a score or sampled gate's bound is its margin or alpha"
        return
    assert set(gate.floors) == set(PRECISIONS)
    for precision in PRECISIONS:
        assert FLOORS[precision][gate.name] == gate.floors[precision]
        noisy = gate.noisy_aa_floors.get(precision)
        assert noisy is None or noisy <= gate.floors[precision], "a noisy A/A run only lowers a floor"
        assert NOISY_AA_FLOORS[precision].get(gate.name) == noisy


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.name)
def test_a_gate_has_a_label_a_sentence_a_measure_and_a_failing_input(gate: Gate):
    assert gate.label and not gate.label.endswith(".") and gate.label == gate.label.strip()
    assert gate.sentence.endswith(".") and gate.sentence[0].isupper()
    assert gate.family in FAMILIES
    assert gate.name in FAILING_INPUTS
    if gate.family in ("free-running", "teacher-forced"):
        measures = compare_gates.FREE_MEASURES + compare_gates.TEACHER_MEASURES
        assert [m.gate for m in measures].count(gate.name) == 1


def test_the_registry_is_what_compare_and_nightly_iterate():
    assert compare_gates.GATE_ORDER == ORDER and len(set(ORDER)) == len(ORDER)
    assert set(compare_gates.SCORE_GATES + compare_gates.FREE_GATES + compare_gates.TEACHER_GATES
               + compare_gates.DISTRIBUTION_GATES + compare_gates.SAMPLED_GATES) == set(ORDER)
    assert set(judging.TOKEN_GATES.values()) == {g.name for g in GATES if g.series is not None}


def test_every_gate_setting_of_the_config_belongs_to_a_gate():
    settings = {g.setting for g in GATES}
    for group in ("tokens",):
        for name in type(getattr(Gates(), group)).model_fields:
            assert f"{group}.{name}" in settings, f"{group}.{name} gates nothing"
    assert {"distribution.dlogprob_shift", "distribution.kl_shift"} <= settings


def test_a_gate_that_is_not_of_the_asked_kind_is_refused():
    with pytest.raises(KeyError, match="not a token gate"):
        Gates().tokens.tolerance(GATES[0])
    with pytest.raises(KeyError, match="not a distributional gate"):
        Gates().distribution.setting(GATES[2])


@pytest.mark.parametrize("gate", [g for g in GATES if g.measure is not None], ids=lambda g: g.name)
def test_a_token_gate_reads_a_figure_the_token_summary_has_and_is_set_under_tokens(gate: Gate):
    assert gate.measure is not None and gate.measure.figure in TokenSummary.model_fields, gate.measure
    assert gate.group == "tokens" and gate.field_name == gate.name
    figure_type = str(TokenSummary.model_fields[gate.measure.figure].annotation)
    assert ("int" in figure_type) == gate.measure.counts, (gate.measure, figure_type)
    assert isinstance(Gates().tokens.tolerance(gate), Tolerance)


def test_the_token_settings_are_the_registry_s_token_gates_in_its_order():
    assert list(TokenGates.model_fields) == [g.field_name for g in GATES if g.measure is not None]
