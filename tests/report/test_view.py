"""The report's content as plain data (evalpipe/report/view.py), which report.md and report.html
both render: build_view of hand-built compare.json documents (tests/support/report_samples.py)
sends every piece of untrusted text through the renderer's ``esc`` and keeps structure as data
(gate status, counts); the gate rows come failing first with their evidence cut to
EVIDENCE_SHOWN and each gate's own words; the gate summary sentence; the run header's roles
and only the settings that tell the variants apart (credentials redacted); flatten.
"""

from __future__ import annotations

from typing import Any

from report_samples import NASTY, RUN_INFO, as_document, as_run, comparison, gate, identical_compare, make_compare

from evalpipe.gates import registry
from evalpipe.report.view import EVIDENCE_SHOWN, build_view, flatten


def tag(text: Any, max_len: int | None = None) -> str:
    """An ``esc`` that marks what passed through it."""
    return f"«{text}»"


def plain(text: Any, max_len: int | None = None) -> str:
    return "" if text is None else str(text)


def _strings(value: Any) -> list[str]:
    """Every string of the view, the plots' unescaped sources ("data") left out."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k != "data" for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def test_every_untrusted_text_passes_through_esc():
    view = build_view(as_document(make_compare()), as_run(RUN_INFO), tag)
    assert view["run_id"] == "«run-1»" and view["status"] == "«DIVERGENT»"
    c = view["comparisons"][0]
    assert c["variant"] == "«sp»" and c["tasks"][0]["name"] == "«gsm8k_synth_4shot»"
    # the model's text (flipped items, worst positions) reaches the view only as esc made it
    hostile = [s for s in _strings(view) if "<script>" in s]
    assert len(hostile) >= 3 and any(NASTY in s for s in hostile)  # whole, not cut or stripped
    assert all(s.startswith("«") and s.endswith("»") for s in hostile), hostile
    assert ("«model»", "«tiny-layout (path=abc)»") in view["header"]["rows"]
    # structure stays data for the templates: the gate status is not esc'd
    assert {r["status"] for r in view["gates"]["rows"]} == {"fail", "skip", "pass"}
    assert view["gates"]["counts"]["fail"] == 2


def test_gate_rows_fail_first_with_evidence_cut_and_each_gates_own_words():
    known = registry.BY_NAME["teacher_kl_max"]
    many = [f"doc {i} repeat 0 pos 1" for i in range(EVIDENCE_SHOWN + 2)]
    c = comparison(gates=[
        gate("teacher_kl_p99", "pass", 0.001, 0.01),
        gate("made_up_gate", "skip", None, None),
        gate("teacher_kl_max", "fail", 0.3, 0.1, evidence=many),
    ])
    rows = build_view(as_document(make_compare(comparisons=[c])), None, plain)["gates"]["rows"]
    assert [r["gate"] for r in rows] == ["teacher_kl_max", "made_up_gate", "teacher_kl_p99"]
    failed = rows[0]
    assert failed["evidence"] == [*many[:EVIDENCE_SHOWN], "… 2 more in compare.json"]
    assert failed["what"] == f"{known.label}: {known.sentence}"
    assert failed["measured"] == "0.3" and failed["aa"] == "—"
    assert rows[1]["what"] == "a gate this version of evalpipe does not know"


def test_a_gate_rows_detail_does_not_repeat_its_own_columns():
    c = comparison(gates=[
        gate("teacher_kl_max", "fail", 0.3, 0.1, detail="gsm8k_synth_4shot teacher_kl_max: 0.3 > 0.1 (floor 0.1)"),
        gate("score_mcnemar", "pass", 0.5, 0.05, metric="acc", detail="gsm8k_synth_4shot acc score_mcnemar: p 0.5, 1 flip"),
        gate("odd", "skip", None, None, detail="a sentence of another shape"),
    ])
    rows = {r["gate"]: r for r in build_view(as_document(make_compare(comparisons=[c])), None, plain)["gates"]["rows"]}
    assert rows["teacher_kl_max"]["detail"] == "0.3 > 0.1 (floor 0.1)"
    assert rows["score_mcnemar"]["detail"] == "p 0.5, 1 flip" and rows["score_mcnemar"]["metric"] == "acc"
    assert rows["odd"]["detail"] == "a sentence of another shape"


def test_the_run_table_shows_fields_never_serialised_objects():
    run = dict(RUN_INFO, hardware={"cpu": "AMD EPYC", "cores": 2, "flags": ["avx2", "avx512f"], "gpu": None})
    rows = dict(build_view(as_document(make_compare()), as_run(run), plain)["header"]["rows"])
    assert rows["hardware"] == "cores 2, cpu AMD EPYC, flags avx2, avx512f"
    assert rows["model"] == "tiny-layout (path=abc)"
    assert not any(v.startswith(("{", "[")) for v in rows.values()), rows
    # a built-in model: its name first, then what the run recorded of it; a bare path alone
    builtin = dict(RUN_INFO, model={"path": "/m/tiny", "fingerprint": "ab12", "builtin": True, "name": "tiny-gsm"})
    rows = dict(build_view(as_document(make_compare()), as_run(builtin), plain)["header"]["rows"])
    assert rows["model"] == "tiny-gsm (builtin=True, fingerprint=ab12, path=/m/tiny)"
    bare = dict(build_view(as_document(make_compare()), as_run(dict(RUN_INFO, model={"path": "/m/x"})), plain)["header"]["rows"])
    assert bare["model"] == "/m/x"


def test_gate_summary_sentence():
    def summary(d: dict[str, Any]) -> str:
        return build_view(as_document(d), None, plain)["gates"]["summary"]

    assert summary(identical_compare()) == "No gate was evaluated."
    assert summary(make_compare()) == "2 of 6 gates failed, 1 skipped."
    c = comparison(status="EQUIVALENT", gates=[gate("teacher_kl_p99", "pass", 0.001, 0.01), gate("x", "skip", None, None)])
    assert summary(make_compare(status="EQUIVALENT", comparisons=[c])) == "All 1 evaluated gates passed, 1 skipped."


def test_run_header_roles_and_distinguishing_settings():
    run = dict(RUN_INFO, variants=["legacy", "sp", "tp2"],
               variant_settings={**RUN_INFO["variant_settings"], "tp2": {"env": {"LAYOUT": "tp", "OMP": "1", "HF_TOKEN": "hf_secret"}}})
    header = build_view(as_document(make_compare()), as_run(run), plain)["header"]
    by_name = {v["name"]: v for v in header["variants"]}
    assert list(by_name) == ["legacy", "sp", "tp2", "legacy-aa"]
    assert [by_name[n]["role"] for n in by_name] == ["reference", "compared", "not compared", "A/A noise floor"]
    # OMP is the same everywhere: left out; the token is redacted (a run.json of an older evalpipe may keep it)
    assert by_name["legacy"]["settings"] == "env.LAYOUT=legacy"
    assert by_name["tp2"]["settings"] == "env.HF_TOKEN=***; env.LAYOUT=tp"
    assert "hf_secret" not in str(header)
    assert ("model_s", "12.5") in header["timings"]


def test_without_run_json_the_header_keeps_what_the_comparison_knows():
    view = build_view(as_document(identical_compare()), None, plain)
    rows = dict(view["header"]["rows"])
    assert rows["run id"] == "run-1" and rows["A/A noise floor"] == "not run"
    assert view["header"]["timings"] == [] and view["noise_floor"] is None
    assert [(v["name"], v["role"]) for v in view["header"]["variants"]] == [("legacy", "reference"), ("sp", "compared")]
    assert view["numerics"] == "Numerics: reference in unknown (from unknown), half floors (docs/numerics.md); no A/A run."


def test_flatten_joins_nested_keys_with_dots():
    assert flatten({"env": {"A": "1", "deep": {"x": [1, 2]}}, "python": None}) == {"env.A": "1", "env.deep.x": [1, 2], "python": None}
    assert flatten(5) == {"": 5} and flatten({}) == {}
