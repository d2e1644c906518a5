"""compare.json (evalpipe/documents/comparison.py): a written comparison reads back as the
same document and the same bytes, a field, status or schema this evalpipe does not read is
refused in one sentence that says how to rewrite the file, and the status rules and the
document's own counts (severity, exit code, judged entries, gate counts) hold."""

from __future__ import annotations

import json

import pytest
from fakes import make_samples, mutate, perturb_topk, set_token, write_run

from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import (
    COMPARE_SCHEMA_VERSION,
    Comparison,
    ComparisonDocument,
    GateResult,
    NumericsDoc,
    Paths,
    SampleCounts,
    Status,
    WhatRan,
    comparison_json,
    read_comparison,
    write_comparison,
)
from evalpipe.errors import ExitCode, UserError
from evalpipe.rundir import artifacts


@pytest.fixture(scope="module")
def compared_run(tmp_path_factory):
    """A real comparison with every optional section: the A/A noise floor, teacher-forced
    tokens, distributional tests and the (not recorded) path judgement."""
    from evalpipe.pipeline.comparing import compare_run, write_outputs

    s, t = make_samples(8), make_samples(8, seed=5)
    variants = {"legacy": s, "legacy-aa": mutate(s, 3, set_token(1, 999)), "sp": mutate(s, 1, set_token(1, 999))}
    teachers = {"legacy": t, "legacy-aa": mutate(t, 2, perturb_topk(0.5)), "sp": mutate(t, 4, perturb_topk(0.5))}
    root = write_run(tmp_path_factory.mktemp("compared") / "run", variants, reference="legacy", teachers=teachers,
                     noise_floor="legacy-aa")
    rc = compare_run(root)
    write_outputs(root, rc)
    return root, rc


def test_a_comparison_round_trips(compared_run):
    root, rc = compared_run
    path = artifacts.RunDir(root).compare_json
    doc = read_comparison(path)
    assert doc == rc.doc
    assert doc.noise_floor is not None and doc.comparisons[0].distribution and doc.comparisons[0].teacher
    assert doc.comparisons[0].paths is not None and doc.comparisons[0].paths.status == "not_recorded"
    assert path.read_text() == rc.to_json(), "the reader loses nothing the writer wrote"
    assert json.loads(path.read_text())["schema_version"] == COMPARE_SCHEMA_VERSION


def _rewrite(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["comparisons"][0].update(verdict="x"), "comparisons.0.verdict: Extra inputs are not permitted; re-run"),
    (lambda d: d["comparisons"][0]["gates"][0].update(status="DIFFERENT"), "comparisons.0.gates.0.status: Input should be"),
    (lambda d: d.update(status="DIFFERENT"), "status: Input should be 'IDENTICAL', 'EQUIVALENT', 'INCONCLUSIVE' or 'DIVERGENT'"),
])
def test_a_comparison_the_reader_does_not_know_is_one_sentence(compared_run, tmp_path, edit, fragment):
    root, _ = compared_run
    path = tmp_path / "compare.json"
    path.write_text(artifacts.RunDir(root).compare_json.read_text())
    _rewrite(path, edit)
    with pytest.raises(UserError) as err:
        read_comparison(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and fragment in text and text.endswith(f"`evalpipe compare {tmp_path}` to rewrite it.")
    assert "\n" not in text


@pytest.mark.parametrize("version, fragment", [
    (2, "was written by an older evalpipe (schema 2)"),
    (None, "was written by another evalpipe (schema None)"),
    (4, "was written by another evalpipe (schema 4)"),
])
def test_a_comparison_of_another_schema_is_refused_in_one_sentence(compared_run, tmp_path, version, fragment):
    """compare.json is derived data: an older one is rewritten from the artifacts, not migrated."""
    root, _ = compared_run
    path = tmp_path / "compare.json"
    path.write_text(artifacts.RunDir(root).compare_json.read_text())
    _rewrite(path, lambda d: d.update(schema_version=version) if version is not None else d.pop("schema_version"))
    with pytest.raises(UserError, match="re-run `evalpipe compare .*` to rewrite it.$") as err:
        read_comparison(path)
    assert fragment in str(err.value)


def test_an_unreadable_comparison_is_one_sentence(tmp_path):
    path = tmp_path / "compare.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as a comparison"):
        read_comparison(path)


def test_the_document_owns_the_schema_version():
    assert ComparisonDocument.model_fields["schema_version"].default == COMPARE_SCHEMA_VERSION == 3


# -- built by hand: the document's own rules, without a comparison run --------------------


def _gate(status: str, measured: float | None = 0.0) -> GateResult:
    return GateResult(gate="kl_p99", task="t", metric=None, status=status, measured=measured, threshold=0.1,
                      aa_value=None, detail="")


def _entry(variant: str, status: Status, gates: list[GateResult], paths: str | None = None,
           unverified: list[str] | None = None) -> Comparison:
    judged = None if paths is None else Paths(status=paths, reasons=[f"{variant}: {paths}"], checks=[], same_profile=None,
                                             what_ran=WhatRan(a=None, b=None))
    return Comparison(a="legacy", b=variant, reference="legacy", variant=variant, status=status, reasons=[],
                      samples=SampleCounts(a=4, b=4), scores=[], metrics_only_a=[], metrics_only_b=[], tokens=[],
                      teacher=None, gates=gates, numerics=NumericsDoc(dtype="bfloat16", source="config",
                                                                      precision="bf16", aa_identical=None, floors={}),
                      distribution=None, outputs_status=None, paths=judged, unverified=unverified)


def _document() -> ComparisonDocument:
    return ComparisonDocument(
        run_id="r", reference="legacy", variants=["sp", "tp", "ep"], status=Status.INCONCLUSIVE, gates=Gates(),
        noise_floor=_entry("legacy-aa", Status.IDENTICAL, [_gate("fail")]),
        comparisons=[_entry("sp", Status.EQUIVALENT, [_gate("pass"), _gate("skip", None)], paths="verified"),
                     _entry("tp", Status.INCONCLUSIVE, [_gate("fail")], paths="same_code"),
                     _entry("ep", Status.INCONCLUSIVE, [_gate("pass", float("nan"))], paths="verified",
                            unverified=["ep"])],
    )


def test_the_status_rules_order_and_exit_codes():
    assert [s.passed for s in Status] == [True, True, False, False]
    assert [s.exit_code for s in Status] == [ExitCode.OK, ExitCode.OK, ExitCode.INCONCLUSIVE, ExitCode.DIVERGENT]
    worst = max([Status.INCONCLUSIVE, Status.DIVERGENT, Status.EQUIVALENT], key=lambda s: s.severity)
    assert worst is Status.DIVERGENT, "a divergence found outranks a comparison that proved nothing"
    assert f"{Status.EQUIVALENT}" == "EQUIVALENT" and Status("IDENTICAL") is Status.IDENTICAL


def test_a_hand_built_comparison_is_written_as_stable_json_and_read_back(tmp_path):
    doc = _document()
    path = tmp_path / "compare.json"
    write_comparison(path, doc)
    text = path.read_text()
    assert text == comparison_json(doc) and text.endswith("}\n")
    raw = json.loads(text)
    assert list(raw) == sorted(raw) and raw["schema_version"] == COMPARE_SCHEMA_VERSION
    assert raw["comparisons"][2]["gates"][0]["measured"] is None, "NaN is written as null"
    assert "unverified" not in raw and "unverified" not in raw["comparisons"][0] and "by_length" not in raw["comparisons"][0]
    again = read_comparison(path)
    assert again.comparisons[2].unverified == ["ep"] and again.comparisons[2].gates[0].measured is None
    assert again.model_copy(update={"comparisons": doc.comparisons}) == doc


def test_the_document_s_counts_and_judged_entries():
    doc = _document()
    assert [(c.variant, aa) for c, aa in doc.judged_entries()] == [("sp", False), ("tp", False), ("ep", False),
                                                                    ("legacy-aa", True)]
    assert doc.gate_counts() == {"total": 4, "fail": 1, "skip": 1, "pass": 2}, "the A/A comparison's gates not counted"
    sp, tp, ep = doc.comparisons
    assert tp.paths_inconclusive and not sp.paths_inconclusive and not doc.noise_floor.paths_inconclusive
    assert tp.path_reasons == ["tp: same_code"] and doc.noise_floor.path_reasons == []
    assert ep.unverified_only and not tp.unverified_only and not sp.unverified_only
    assert doc.inconclusive_variants() == ["tp"], "ep is INCONCLUSIVE only for being compared unverified"
    assert sp.gates[1].skipped and tp.gates[0].failed and not sp.gates[0].failed
