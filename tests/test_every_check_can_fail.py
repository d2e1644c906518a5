"""The rule that every check can fail: each gate evalpipe evaluates (the registry
evalpipe.compare.gates.GATE_ORDER) and each kind of expectation (the fields of
evalpipe.config.expectations.Expectations) has an input here that fails it, gates under the
loosest settings the config accepts. A gate or an expectation kind added without a failing
input here fails this module; so does a bound that lets a setting make a gate unfailable.

The inputs are hand-built records and results (the functions judged are pure); the
validations that keep the settings inside those bounds are tested at the end, each with the
one sentence a user reads.
"""

from __future__ import annotations

import copy
import math
import types
from typing import Any, Callable

import numpy as np
import pytest

from evalpipe.compare import gates as G
from evalpipe.compare.code_paths import ModelProbe, PathSide, ProcessProbe, VariantProbes, check_side, judge_paths
from evalpipe.compare.distribution import sign_flip_pvalue
from evalpipe.compare.numerics import FLOORS, LOCALIZE_FLOORS, NOISY_AA_FLOORS, Numerics
from evalpipe.compare.scores import PairedScores
from evalpipe.config.errors import ConfigError
from evalpipe.config.expectations import Expectations
from evalpipe.config.gate_settings import SMALLEST_SAMPLED_ALPHA, SMALLEST_SIGN_FLIP_P, Gates
from evalpipe.config.loading import load_gates, parse_config
from evalpipe.documents.comparison import FAILED, SampledTask, ShiftTest
from evalpipe.documents.manifest import EngineCounters
from evalpipe.gates import registry

TASK = "gsm8k_synth_4shot"
N = 60  # items: enough that McNemar's exact p of N one-way flips (2 / 2^N) is below the loosest alpha

# The loosest gates the config accepts (each just inside its bound): a gate that no input
# fails under them could be made unfailable by a config.
LOOSEST = {
    "scores": {"margin": 1 - 1e-9, "alpha": 1e-12},
    "tokens": {g.field_name: {"abs": 1e12, "rel_aa": 1e12} for g in registry.GATES if g.measure is not None},
    "distribution": {"alpha": SMALLEST_SIGN_FLIP_P * (1 + 1e-9), "confidence": 1 - 1e-9,
                     "dlogprob_shift": 1e12, "kl_shift": 1e12},
    "sampling": {"alpha": SMALLEST_SAMPLED_ALPHA},
}
HUGE = 1e30  # a measure beyond the loosest finite bound (1e12 x an A/A value of 1)


def gate_settings() -> list[Gates]:
    return [Gates(), Gates.model_validate(LOOSEST)]


# ----------------------------------------------------------------------------- gates


def score_row(gates: Gates) -> Any:
    """Every item right on A and wrong on B: the largest difference a 0/1 metric has."""
    paired = PairedScores(task=TASK, metric="exact_match", doc_id=np.arange(N), repeat=np.zeros(N, dtype=int),
                          a=np.ones(N), b=np.zeros(N), only_a=0, only_b=0)
    return paired.summary(margin=gates.scores.margin, alpha=gates.scores.alpha)


def token_summary(**measures: Any) -> Any:
    """A token comparison of TASK whose measures are ``measures`` (the gates read attributes)."""
    base = {"task": TASK, "n_samples": 4, "n_positions_compared": 40, "n_hard_divergences": 0, "kl_max": 0.0,
            "kl_p99": 0.0, "n_top1_hard": 0, "kl_max_at": (0, 0, 3), "worst_kl": (), "hard_divergences": ((0, 0, 3),),
            "top1_hard_positions": ((0, 0, 3),)}
    return types.SimpleNamespace(**{**base, **measures})


def shift_test(test: str, gates: Gates) -> ShiftTest:
    """A shift far beyond any floor, with the smallest p-value the sign-flip test gives (> 16 samples)."""
    p = sign_flip_pvalue(np.full(100, 2.0), "two-sided" if test == "dlogprob_shift" else "greater")
    return ShiftTest(test=test, task=TASK, estimate=HUGE, ci_low=HUGE / 2, ci_high=2 * HUGE,
                     confidence=gates.distribution.confidence, p_value=p, n_positions=1000, n_samples=100,
                     aa_position_sd=1.0)


def sampled_task(divergent: int) -> SampledTask:
    """A sampled task of N samples of which ``divergent`` left the reference's path, where the
    distributions allow none (excess p 0 when any did)."""
    return SampledTask(task=TASK, temperature=0.6, top_p=1.0, top_k=0, min_p=0.0, samples_per_item=1, items=N, samples=N,
                       divergent=divergent, divergent_rate=divergent / N, first_divergence_min=0 if divergent else None,
                       first_divergence_median=0.0 if divergent else None, agreeing_positions=100, max_abs_dlogprob=0.0,
                       predicted_samples=N, predicted=0.0, excess_p=0.0 if divergent else 1.0, tv_max=0.0, pass_at=[])


def _worst(gates: Gates, **fields: Any) -> list[G.GateResult]:
    return G.evaluate_gates([score_row(gates)], [token_summary(**fields)], [token_summary(**fields)], gates,
                            G.AASummaries.of([token_summary()], [token_summary()]),
                            numerics=Numerics("float32", "test"),
                            shift_tests=[shift_test(t, gates) for t in ("dlogprob_shift", "kl_shift")],
                            sampled=[sampled_task(N)], aa_sampled=[sampled_task(0)])


# gate -> the token-summary fields that make it fail (score and distributional gates fail on the
# inputs above whatever these are)
FAILING_INPUTS: dict[str, dict[str, Any]] = {
    "score_equivalence": {},
    "score_mcnemar": {},
    "free_hard_divergences": {"n_hard_divergences": int(HUGE)},
    "free_kl_max": {"kl_max": HUGE},
    "teacher_kl_p99": {"kl_p99": HUGE},
    "teacher_kl_max": {"kl_max": HUGE},
    "teacher_hard_top1_flips": {"n_top1_hard": int(HUGE)},
    "teacher_dlogprob_shift": {},
    "teacher_kl_shift": {},
    # every sample of the task diverged where its distributions allow none, the A/A run's none
    "sampled_excess_divergence": {},
    "sampled_divergence_above_aa": {},
}


def test_every_gate_of_the_registry_has_a_failing_input():
    assert set(FAILING_INPUTS) == set(G.GATE_ORDER), (
        "a gate without a failing input here (or an input for a gate that is gone): "
        f"{sorted(set(G.GATE_ORDER) ^ set(FAILING_INPUTS))}")
    # the registry is what evaluate_gates produces: every gate, nothing else
    produced = {g.gate for g in _worst(Gates())}
    assert produced == set(G.GATE_ORDER), produced


@pytest.mark.parametrize("gate", G.GATE_ORDER)
@pytest.mark.parametrize("settings", ["default", "loosest"])
def test_the_gate_fails_on_its_input(gate, settings):
    gates = gate_settings()[settings == "loosest"]
    (result,) = [g for g in _worst(gates, **FAILING_INPUTS[gate]) if g.gate == gate]
    assert result.status == G.FAIL, result.detail
    # a gate that holds passes on the same comparison without the fault (it can also pass)
    if FAILING_INPUTS[gate]:
        (calm,) = [g for g in _worst(gates) if g.gate == gate]
        assert calm.status == G.PASS, calm.detail


def test_the_precision_floors_are_finite_bounds():
    # an `auto` floor is the bound of its gate: infinite, NaN or negative, no input fails it
    tables = [*FLOORS.values(), *NOISY_AA_FLOORS.values(), LOCALIZE_FLOORS]
    for table in tables:
        for name, floor in table.items():
            assert math.isfinite(floor) and floor >= 0, (name, floor)
    for precision in FLOORS:
        assert set(FLOORS[precision]) == set(G.FREE_GATES + G.TEACHER_GATES + G.DISTRIBUTION_GATES), precision


# ----------------------------------------------------------------------------- expectations

MODEL, LAYER, FN = "pkg.m.Model", "pkg.m.Layer", "pkg.m.Layer.forward_new"


def probes(*, model: str = MODEL, layer: str = LAYER, calls: dict[str, int] | None = None, per_forward: dict | None = None,
           switches: dict | None = None, processes: int = 1) -> VariantProbes:
    built = ModelProbe(model_class=model, layers={layer: 2}, attention_backends=["CPU_ATTN"], forwards=4,
                       forward_tokens=[], per_forward=per_forward or {})
    return VariantProbes(variant="v", mode="offline", verifiable=True, names={FN: FN, MODEL: MODEL, LAYER: LAYER}, processes=[
        ProcessProbe(variant="v", pid=pid, ppid=0, process_name="w", role="worker", argv=[], started_at=0.0, updated_at=0.0,
                     models=[built], switches=switches or {}, switch_errors={}, calls=calls or {}, collectives={},
                     shapes={}, absent={}, errors=[])
        for pid in range(1, processes + 1)])


def _side_fails(expect: dict[str, Any], records: VariantProbes) -> tuple[str, ...]:
    return check_side("v", Expectations.model_validate(expect), records).failures


def _same_path_fails() -> tuple[str, ...]:
    reference = PathSide("ref", Expectations(), probes(calls={FN: 3}))
    other = PathSide("ref-aa", Expectations(same_path=True), probes(layer="pkg.m.OldLayer", calls={FN: 3}))
    judged = judge_paths(reference, other, outputs_identical=True)
    assert judged.status == FAILED
    return judged.reasons


# expectation kind -> a run of the engine that breaks it
FAILING_RECORDS: dict[str, Callable[[], tuple[str, ...]]] = {
    "same_path": _same_path_fails,
    "model": lambda: _side_fails({"model": MODEL}, probes(model="pkg.m.Other")),
    "engine_processes": lambda: _side_fails({"engine_processes": 2}, probes(processes=1)),
    "layers": lambda: _side_fails({"layers": [LAYER]}, probes(layer="pkg.m.OldLayer")),
    "called": lambda: _side_fails({"called": [FN]}, probes(calls={})),
    "not_called": lambda: _side_fails({"not_called": [FN]}, probes(calls={FN: 1})),
    # the sp layout's "no all-gather": broken by one all-gather in each pass
    "per_forward": lambda: _side_fails({"per_forward": {"all_gather@tp": 0}}, probes(per_forward={"all_gather@tp": {"1": 4}})),
    "switches": lambda: _side_fails({"switches": {"max_num_seqs": 64}}, probes(switches={"max_num_seqs": 7})),
    # a deployment over two nodes whose processes all ran on one (or never said where)
    "deployment": lambda: _side_fails({"deployment": {"nodes": 2}}, probes(processes=2)),
    # one-token passes asked for (where a decode-only bug lives); the engine ran none (its
    # passes here recorded no bins at all, as an engine whose batches never shrank to one)
    "forward_tokens": lambda: _side_fails({"forward_tokens": {"1": {"min": 1}}}, probes()),
    # a prefix-cache scenario whose engine found nothing in its prefix cache (caching off)
    "tasks": lambda: check_side("v", Expectations.model_validate({"tasks": {"scenario_prefix_cache": {"prefix_cache_hits": {"min": 1}}}}),
                                probes(), {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=0, prefix_cache_queries=1024)}).failures,
}


def test_every_expectation_kind_has_a_failing_record():
    assert set(FAILING_RECORDS) == set(Expectations.model_fields), (
        "an expectation kind without a failing record here (or a record for a kind that is gone): "
        f"{sorted(set(Expectations.model_fields) ^ set(FAILING_RECORDS))}")


@pytest.mark.parametrize("kind", list(Expectations.model_fields))
def test_the_expectation_fails_on_its_record(kind):
    failures = FAILING_RECORDS[kind]()
    assert failures and all(isinstance(f, str) and f for f in failures), failures


# ----------------------------------------------------------------------------- the bounds, refused in one sentence

MINIMAL = {"model": {"path": "builtin:tiny-gsm"}, "variants": {"a": {}, "b": {}},
           "tasks": {"gsm8k": {"task": TASK, "num_fewshot": 4}}}


def config_error(gates: dict[str, Any]) -> str:
    data = copy.deepcopy(MINIMAL)
    data["gates"] = gates
    with pytest.raises(ConfigError) as err:
        parse_config(data, "my.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("my.yaml: `gates."), text
    return text


def test_the_loosest_settings_are_accepted():
    assert parse_config({**MINIMAL, "gates": LOOSEST}, "my.yaml").gates == Gates.model_validate(LOOSEST)


@pytest.mark.parametrize("margin", [math.inf, math.nan, 1, 1.5, 0, -0.01])
def test_a_margin_that_leaves_the_equivalence_gate_unable_to_fail_is_refused(margin, tmp_path):
    text = config_error({"scores": {"margin": margin}})
    assert "gates.scores.margin" in text and "must be" in text, text
    if math.isfinite(margin) and margin >= 1:
        assert "no paired difference of a 0/1 metric (exact_match, accuracy) exceeds 1" in text
    # the same sentence for --margin and a --gates file
    with pytest.raises(ConfigError, match=r"^--margin must be"):
        load_gates(None, margin)
    path = tmp_path / "gates.yaml"
    path.write_text(f"scores: {{margin: {margin}}}\n".replace("inf", ".inf").replace("nan", ".nan"))
    with pytest.raises(ConfigError, match=r"gates.scores.margin|scores.margin"):
        load_gates(path)


def test_with_margin_checks_the_margin_too():
    from evalpipe.compare.run import with_margin
    from evalpipe.errors import UserError

    assert with_margin(None, 0.02).scores.margin == 0.02
    with pytest.raises(UserError, match="^the score margin must be below 1"):
        with_margin(None, 1.0)


@pytest.mark.parametrize("gates, said", [
    ({"tokens": {"teacher_kl_p99": {"abs": math.inf}}}, "`gates.tokens.teacher_kl_p99.abs`: must be a finite number >= 0 or `auto`; got inf (the gate could never fail)."),
    ({"tokens": {"teacher_kl_p99": {"abs": math.nan}}}, "`gates.tokens.teacher_kl_p99.abs`: must be a finite number >= 0 or `auto`; got nan"),
    ({"tokens": {"free_kl_max": {"abs": -1}}}, "`gates.tokens.free_kl_max.abs`: must be a finite number >= 0 or `auto`; got -1"),
    ({"tokens": {"free_kl_max": {"rel_aa": math.inf}}}, "`gates.tokens.free_kl_max.rel_aa`: must be a finite number >= 0 or null; got inf"),
    ({"distribution": {"kl_shift": math.inf}}, "`gates.distribution.kl_shift`: must be a finite number >= 0 or `auto`; got inf"),
    ({"distribution": {"dlogprob_shift": -0.5}}, "`gates.distribution.dlogprob_shift`: must be a finite number >= 0 or `auto`; got -0.5"),
    ({"distribution": {"alpha": 1e-4}}, "`gates.distribution.alpha`: must be above 0.0001, the smallest p-value the sign-flip test gives with 9999 random flips"),
    ({"distribution": {"alpha": 0}}, "`gates.distribution.alpha`: must be above 0.0001"),
    ({"distribution": {"confidence": 1}}, "`gates.distribution.confidence`"),
    ({"scores": {"alpha": 0}}, "`gates.scores.alpha`"),
    ({"scores": {"alpha": math.nan}}, "`gates.scores.alpha`"),
])
def test_a_bound_no_input_can_exceed_is_refused(gates, said):
    text = config_error(gates)
    assert said in text, text


def test_localize_rel_aa_is_finite():
    data = {**copy.deepcopy(MINIMAL), "localize": {"rel_aa": math.inf}}
    with pytest.raises(ConfigError, match=r"`localize.rel_aa`: Input should be a finite number"):
        parse_config(data, "my.yaml")
