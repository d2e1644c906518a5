"""Gates that know the numerics: the floor table, where the precision comes from, and
what it does to a verdict (evalpipe.compare.numerics, the `auto` floors of the gates)."""

import json
import re

import pytest
from checkout import ROOT
from fakes import make_samples, mutate, perturb_topk, tables, token_table

from evalpipe.compare import Status, compare_tables
from evalpipe.compare.gates import DISTRIBUTION_GATES, FREE_GATES, TEACHER_GATES
from evalpipe.compare.numerics import FLOORS, FP32, HALF, NOISY_AA_FLOORS, Numerics, numerics_from_engine_args
from evalpipe.config.gate_settings import Gates, TokenGates, Tolerance

DOC = ROOT / "docs" / "numerics.md"


def test_every_token_and_distributional_gate_has_a_floor_per_precision_and_fp32_is_never_looser():
    gates = set(FREE_GATES + TEACHER_GATES + DISTRIBUTION_GATES)
    assert set(FLOORS) == {FP32, HALF}
    for precision in FLOORS:
        assert set(FLOORS[precision]) == gates
    for gate in gates:
        assert FLOORS[FP32][gate] <= FLOORS[HALF][gate], gate
    assert set(NOISY_AA_FLOORS) == {FP32, HALF}
    for precision, noisy in NOISY_AA_FLOORS.items():
        assert set(noisy) <= set(DISTRIBUTION_GATES), "a noisy A/A lowers only the distributional floors"
        for gate, value in noisy.items():
            assert value < FLOORS[precision][gate]


def test_a_noisy_aa_run_lowers_the_distributional_floors_of_half_precision_only():
    half = Numerics("bfloat16", "t")
    assert half.floor("teacher_kl_shift") == half.with_aa(True).floor("teacher_kl_shift") == FLOORS[HALF]["teacher_kl_shift"]
    assert half.with_aa(False).floor("teacher_kl_shift") == NOISY_AA_FLOORS[HALF]["teacher_kl_shift"]
    assert half.with_aa(False).floor("teacher_kl_p99") == FLOORS[HALF]["teacher_kl_p99"]
    fp32 = Numerics("float32", "t")
    assert fp32.with_aa(False).floors() == fp32.with_aa(True).floors() == FLOORS[FP32]


def test_the_numerics_document_lists_every_floor_of_the_table():
    text = DOC.read_text()
    for gate in FLOORS[FP32]:
        row = re.search(rf"^\| `{gate}` \|([^|]+)\|([^|]+)\|([^|]+)\|", text, re.M)
        assert row, f"docs/numerics.md has no row for {gate}"
        documented = [float(cell) for cell in row.groups()]
        table = [FLOORS[FP32][gate], FLOORS[HALF][gate], NOISY_AA_FLOORS[HALF].get(gate, FLOORS[HALF][gate])]
        assert documented == table, f"docs/numerics.md: {gate} floors {documented}, the code {table}"


@pytest.mark.parametrize(
    "dtype, precision", [("float32", FP32), ("FLOAT32", FP32), ("float64", FP32), ("bfloat16", HALF), ("float16", HALF), ("half", HALF)]
)
def test_precision_classes(dtype, precision):
    assert Numerics(dtype).precision == precision and Numerics(dtype).known


def test_unknown_precision_takes_the_lenient_floors_and_says_so():
    n = Numerics(None, "no dtype in legacy/manifest.json")
    assert n.precision == HALF and not n.known
    assert n.describe() == "precision unknown (no dtype in legacy/manifest.json): half-precision floors; no A/A run"
    assert Numerics("float32", "x").with_aa(True).describe() == "float32 (x); A/A bitwise identical at the teacher-forced positions"


def test_dtype_from_engine_args_then_the_models_config(tmp_path):
    assert numerics_from_engine_args({"dtype": "bfloat16"}, "m.json").dtype == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    got = numerics_from_engine_args({"dtype": "auto", "model": str(tmp_path)}, "m.json")
    assert (got.dtype, got.doc.source) == ("float16", "the model's config.json (dtype auto)")
    missing = numerics_from_engine_args({"model": str(tmp_path / "nope")}, "legacy/manifest.json")
    assert missing.dtype is None and missing.doc.source == "no dtype in legacy/manifest.json"


def test_the_same_small_logprob_change_fails_fp32_floors_and_passes_half_precision_floors():
    s = make_samples(6)
    sa, ta = tables(s)
    teacher_b = token_table(mutate(s, 2, perturb_topk(5e-3)))  # KL ~1e-5 at each position of one sample
    common = dict(label_a="legacy", label_b="sp", teacher_a=token_table(s), teacher_b=teacher_b)
    fp32 = compare_tables(sa, ta, sa, ta, numerics=Numerics("float32", "test"), **common)
    half = compare_tables(sa, ta, sa, ta, numerics=Numerics("bfloat16", "test"), **common)
    assert fp32.status is Status.DIVERGENT and half.status is Status.EQUIVALENT
    g = next(g for g in fp32.verdict.gates if g.gate == "teacher_kl_max")
    assert g.status == "fail" and g.threshold == FLOORS[FP32]["teacher_kl_max"] and "fp32 floor 1e-08" in g.detail
    # a number in the config overrides the table
    loose = Gates(tokens=TokenGates(teacher_kl_max=Tolerance(abs=1.0), teacher_kl_p99=Tolerance(abs=1.0)))
    overridden = compare_tables(sa, ta, sa, ta, numerics=Numerics("float32", "test"), gates=loose, **common)
    g = next(g for g in overridden.verdict.gates if g.gate == "teacher_kl_max")
    assert g.status == "pass" and g.threshold == 1.0 and "(abs 1;" in g.detail


def test_numerics_and_aa_identity_are_recorded_in_the_comparison():
    s = make_samples(4)
    sa, ta = tables(s)
    aa = compare_tables(sa, ta, sa, ta, teacher_a=token_table(s), teacher_b=token_table(s), numerics=Numerics("float32", "t"))
    vc = compare_tables(sa, ta, sa, ta, teacher_a=token_table(s), teacher_b=token_table(s), aa=aa, numerics=Numerics("float32", "t"))
    d = vc.doc.numerics.model_dump()
    assert d["dtype"] == "float32" and d["precision"] == FP32 and d["aa_identical"] is True
    assert d["floors"] == FLOORS[FP32]
    assert compare_tables(sa, ta, sa, ta).doc.numerics.model_dump()["aa_identical"] is None
