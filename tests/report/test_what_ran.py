"""The "What ran" of every renderer and INCONCLUSIVE as a status of its own.

compare.json's "paths" entry (evalpipe/compare/code_paths.py judge_paths's Paths with its
"what_ran") is built here by hand, after two real runs of the
layout model: a PASS whose sides ran their declared paths (legacy: all_gather, sp:
all_to_all), and the trap, a config that forgot the plugin line so that both sides ran
vLLM's own Llama and the outputs were IDENTICAL (paths "failed", INCONCLUSIVE). The
builders are imported by test_report_escaping.py.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from html_page import parse_page
from report_samples import (
    TASK,
    as_document,
    comparison,
    gate,
    identical_compare,
    make_compare,
    noise_floor,
    print_summary,
    render_html,
    render_markdown,
    what_ran_view,
)
from rich.console import Console

from evalpipe.documents.comparison import Status
from evalpipe.report import render_junit
from evalpipe.report.html import KNOWN_STATUSES, status_class
from evalpipe.report.terminal import STATUS_STYLE

LAYOUT = "evalpipe.lab.layout.model"
LEGACY_CALL = f"{LAYOUT}.LayoutDecoderLayer._legacy_attention"
SP_CALL = f"{LAYOUT}.LayoutDecoderLayer._sp_attention"
LLAMA = "vllm.model_executor.models.llama"

# the switches every engine process of the layout runs resolved (r2 / r3, offline, one process)
SWITCHES: dict[str, Any] = {
    "additional_config": {}, "all2all_backend": "allgather_reducescatter", "architectures": ["EvalpipeLayoutForCausalLM"],
    "attention_backends": ["CPU_ATTN"], "compilation_mode": 0, "cudagraph_mode": "NONE", "data_parallel_size": 1,
    "distributed_executor_backend": "uni", "dp_rank": 0, "dtype": "float32", "enable_chunked_prefill": True,
    "enable_expert_parallel": False, "enable_prefix_caching": True, "enforce_eager": True,
    "max_num_batched_tokens": 8192, "max_num_seqs": 64, "pipeline_parallel_size": 1, "pp_rank": 0,
    "quantization": None, "tensor_parallel_size": 1, "tp_rank": 0, "use_sequence_parallel_moe": False, "world_rank": 0,
}

# the trap's path failures, as judge_paths wrote them
TRAP_FAILURES = {
    "legacy": [
        f"variant `legacy` was expected to build `{LAYOUT}.LayoutForCausalLM`; vLLM instantiated `{LLAMA}.LlamaForCausalLM` (1 process)",
        f"variant `legacy`'s decoder layers were expected to be `{LAYOUT}.LayoutDecoderLayer`; found 3 `{LLAMA}.LlamaDecoderLayer`",
        f"variant `legacy` never called `{LEGACY_CALL}` (0 calls in 1 process)",
        "variant `legacy` was expected to make 3 all_gather call(s) in every forward pass; seen 0 in 48 of 48 forward passes",
        "variant `legacy` was expected to make 3 reduce_scatter call(s) in every forward pass; seen 0 in 48 of 48 forward passes",
    ],
    "sp": [
        f"variant `sp` was expected to build `{LAYOUT}.LayoutForCausalLM`; vLLM instantiated `{LLAMA}.LlamaForCausalLM` (1 process)",
        f"variant `sp`'s decoder layers were expected to be `{LAYOUT}.LayoutDecoderLayer`; found 3 `{LLAMA}.LlamaDecoderLayer`",
        f"variant `sp` never called `{SP_CALL}` (0 calls in 1 process)",
        "variant `sp` was expected to make 3 all_to_all call(s) in every forward pass; seen 0 in 48 of 48 forward passes",
        "variant `sp` was expected to make 3 reduce_scatter call(s) in every forward pass; seen 0 in 48 of 48 forward passes",
    ],
}
OUTPUTS_LINE = f"the outputs alone would be IDENTICAL: {TASK}: 4/4 samples bitwise identical (137 tokens, ids and logprobs)"
SAME_CODE_REASON = ("the variants ran the same code: nothing was compared (same model and layer classes, functions "
                    "called and collectives per forward pass, same settings resolved by the engine, IDENTICAL "
                    "outputs, and no expectation tells `legacy` and "
                    "`sp` apart); declare what each path must show under `expect:`, or `expect: {same_path: true}` "
                    "for a pair meant to be an A/A")
NOT_RECORDED_NOTE = "path not verified: `legacy`, `sp` ran before evalpipe recorded path probes"
ENDPOINT_FAILURE = ("variant `sp`: path not verifiable in endpoint mode: the server runs outside evalpipe and exposes "
                    "no record of the code it ran (say so, or start it with evalpipe's probes)")


# ---------------------------------------------------------------------------
# builders: code_paths.summarize / SideCheck / Paths shapes
# ---------------------------------------------------------------------------


def collectives(**kinds: dict[str, int]) -> dict[str, Any]:
    """all_gather={"3": 48} -> the summary's collectives_per_forward."""
    return {k: {"counts": counts, "forwards": sum(counts.values())} for k, counts in kinds.items()}


def summary(model: str = f"{LAYOUT}.LayoutForCausalLM", layer: str = f"{LAYOUT}.LayoutDecoderLayer", *,
            calls: dict[str, int] | None = None, per_forward: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    s = {
        "mode": "offline", "verifiable": True, "processes": {"evalpipe_worker": 1}, "models": [model],
        "layers": {layer: 3}, "switches": dict(SWITCHES), "calls": calls or {LEGACY_CALL: 144, SP_CALL: 0},
        "absent": [], "collectives_per_forward": per_forward if per_forward is not None else {}, "forwards": 48,
        "server_of": None,
    }
    s.update(kw)
    return s


def legacy_summary(**kw: Any) -> dict[str, Any]:
    return summary(calls={LEGACY_CALL: 144, SP_CALL: 0},
                   per_forward=collectives(all_gather={"3": 48}, reduce_scatter={"3": 48}), **kw)


def sp_summary(**kw: Any) -> dict[str, Any]:
    return summary(calls={LEGACY_CALL: 0, SP_CALL: 144},
                   per_forward=collectives(all_to_all={"3": 48}, reduce_scatter={"3": 48}), **kw)


def llama_summary() -> dict[str, Any]:
    """What both sides of the trap ran: vLLM's Llama, no collective, neither layout function."""
    return summary(f"{LLAMA}.LlamaForCausalLM", f"{LLAMA}.LlamaDecoderLayer", calls={LEGACY_CALL: 0, SP_CALL: 0},
                   switches=dict(SWITCHES, architectures=["LlamaForCausalLM"]))


def check(variant: str, failures: list[str] | None = None, evidence: list[str] | None = None,
          verifiable: bool = True) -> dict[str, Any]:
    failures = failures or []
    return {"variant": variant, "ok": verifiable and not failures, "verifiable": verifiable,
            "failures": failures, "evidence": evidence or []}


def paths(status: str, reasons: list[str], checks: list[dict[str, Any]], a: dict[str, Any] | None,
          b: dict[str, Any] | None, same_profile: bool | None = None) -> dict[str, Any]:
    return {"status": status, "reasons": reasons, "checks": checks, "same_profile": same_profile,
            "what_ran": {"a": a, "b": b}}


def passing_gates() -> list[dict[str, Any]]:
    return [gate("teacher_kl_p99", "pass", 0.0, 1e-9), gate("teacher_kl_max", "pass", 0.0, 1e-8),
            gate("teacher_kl_shift", "skip", None, None, detail="no A/A run")]


def verified_paths() -> dict[str, Any]:
    evidence = {"legacy": ["model `LayoutForCausalLM` in 1 process", "3 all_gather in each of 48 forward passes"],
                "sp": ["model `LayoutForCausalLM` in 1 process", "3 all_to_all in each of 48 forward passes"]}
    return paths("verified", [f"{v}: {'; '.join(e)}" for v, e in evidence.items()],
                 [check(v, evidence=e) for v, e in evidence.items()], legacy_summary(), sp_summary(), same_profile=False)


def trap_paths(variant: str = "sp") -> dict[str, Any]:
    failures = [*TRAP_FAILURES["legacy"], *TRAP_FAILURES["sp"]]
    return paths("failed", failures, [check("legacy", TRAP_FAILURES["legacy"]), check(variant, TRAP_FAILURES["sp"])],
                 llama_summary(), llama_summary())


def pass_compare(**kw: Any) -> dict[str, Any]:
    """r2: both sides ran their declared layout (EQUIVALENT), with an A/A run that ran the reference's path."""
    aa = dict(noise_floor(), paths=paths(
        "verified", ["legacy: 3 all_gather in each of 48 forward passes", "legacy-aa: 3 all_gather in each of 48 forward passes"],
        [check("legacy", evidence=["3 all_gather"]), check("legacy-aa", evidence=["3 all_gather"])],
        legacy_summary(), legacy_summary(), same_profile=True), outputs_status=None)
    c = comparison(status="EQUIVALENT", reasons=["all 2 gates passed (1 skipped)"], gates=passing_gates(),
                   paths=verified_paths(), outputs_status=None)
    return make_compare(schema_version=3, status="EQUIVALENT", noise_floor=aa, comparisons=[c], **kw)


def inconclusive_comparison(p: dict[str, Any], variant: str = "sp", **kw: Any) -> dict[str, Any]:
    """The paths prove nothing; the outputs alone were IDENTICAL and every gate passed."""
    fields = {"status": "INCONCLUSIVE", "outputs_status": "IDENTICAL", "reasons": [*p["reasons"], OUTPUTS_LINE],
              "gates": passing_gates(), "paths": p}
    fields.update(kw)
    return comparison(variant, **fields)


def trap_compare() -> dict[str, Any]:
    """r3: the config forgot the plugin line."""
    return make_compare(schema_version=3, status="INCONCLUSIVE", noise_floor=None,
                        comparisons=[inconclusive_comparison(trap_paths())])


def same_code_compare() -> dict[str, Any]:
    p = paths("same_code", [SAME_CODE_REASON], [check("legacy", evidence=["ok"]), check("sp", evidence=["ok"])],
              legacy_summary(), legacy_summary(), same_profile=True)
    return make_compare(schema_version=3, status="INCONCLUSIVE", noise_floor=None, comparisons=[inconclusive_comparison(p)])


def not_recorded_compare(b: dict[str, Any] | None = None) -> dict[str, Any]:
    c = comparison(status="EQUIVALENT", reasons=["all 2 gates passed (1 skipped)"], gates=passing_gates(),
                   paths=paths("not_recorded", [NOT_RECORDED_NOTE], [], None, b), outputs_status=None)
    return make_compare(schema_version=3, status="EQUIVALENT", noise_floor=None, comparisons=[c])


def endpoint_compare() -> dict[str, Any]:
    endpoint = {**summary(), "mode": "endpoint", "verifiable": False, "processes": {}, "models": [], "layers": {},
                "switches": {}, "calls": {LEGACY_CALL: 0, SP_CALL: 0}, "forwards": 0}
    p = paths("failed", [ENDPOINT_FAILURE], [check("legacy", evidence=["ok"]), check("sp", [ENDPOINT_FAILURE], verifiable=False)],
              legacy_summary(), endpoint)
    return make_compare(schema_version=3, status="INCONCLUSIVE", noise_floor=None, comparisons=[inconclusive_comparison(p)])


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def plain(text: Any, max_len: int | None = None) -> str:
    return "" if text is None else str(text)


def table(compare: dict[str, Any]) -> dict[str, Any]:
    view = what_ran_view(compare, plain)
    assert view is not None and view["table"] is not None
    return view["table"]


def rows(compare: dict[str, Any]) -> dict[str, list[str]]:
    return {r["label"]: r["cells"] for r in table(compare)["rows"]}


def md_section(md: str) -> str:
    return md[md.index("## What ran") : md.index("## Run")]


def html_section(html: str) -> str:
    return html[html.index('<section id="what-ran">') : html.index('<section id="run">')]


def summary_text(compare: dict[str, Any], **console: Any) -> str:
    buf = io.StringIO()
    print_summary(compare, Console(file=buf, width=250, **({"color_system": None} | console)))
    return buf.getvalue()


def junit(compare: dict[str, Any]) -> ET.Element:
    return ET.fromstring(render_junit(as_document(compare)).encode("utf-8"))


def path_case(root: ET.Element) -> ET.Element:
    cases = [c for c in root.iter("testcase") if c.get("classname", "").endswith(".path")]
    assert len(cases) == 1, [c.get("classname") for c in root.iter("testcase")]
    return cases[0]


# ---------------------------------------------------------------------------
# the side-by-side table
# ---------------------------------------------------------------------------


def test_columns_are_reference_variants_then_the_aa_run():
    second = comparison("sp2", status="EQUIVALENT", gates=passing_gates(), outputs_status=None,
                        paths=dict(verified_paths(), what_ran={"a": legacy_summary(), "b": sp_summary(switches=dict(SWITCHES, dtype="x"))}))
    d = pass_compare()
    d["comparisons"].append(second)
    assert [(c["name"], c["role"]) for c in table(d)["columns"]] == [
        ("legacy", "reference"), ("sp", ""), ("sp2", ""), ("legacy-aa", "A/A")]
    header = next(line for line in md_section(render_markdown(d, {})).splitlines() if line.startswith("| |"))
    assert header == "| | legacy (reference) | sp | sp2 | legacy-aa (A/A) |"


def test_rows_of_a_verified_run():
    d = pass_compare()
    d["comparisons"][0]["paths"]["what_ran"]["b"]["switches"]["enforce_eager"] = False
    assert list(rows(d)) == [
        "processes", "model", "decoder layers",
        "all_gather per forward pass", "all_to_all per forward pass", "reduce_scatter per forward pass",
        "calls of LayoutDecoderLayer._legacy_attention", "calls of LayoutDecoderLayer._sp_attention",
        "tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "enable_expert_parallel",
        "all2all_backend", "use_sequence_parallel_moe", "attention_backends", "dtype",
        "enforce_eager",  # the only other switch that differs; max_num_seqs and the rest are equal
        "expectations",
    ]
    r = rows(d)
    assert r["processes"] == ["offline: 1 evalpipe_worker"] * 3
    assert r["model"] == ["LayoutForCausalLM"] * 3 and r["decoder layers"] == ["3 × LayoutDecoderLayer"] * 3
    assert r["all_gather per forward pass"] == ["3 in 48/48", "0 in 48/48", "3 in 48/48"]
    assert r["all_to_all per forward pass"] == ["0 in 48/48", "3 in 48/48", "0 in 48/48"]
    assert r["calls of LayoutDecoderLayer._sp_attention"] == ["0", "144", "0"]
    assert r["attention_backends"] == ["CPU_ATTN"] * 3 and r["enable_expert_parallel"] == ["false"] * 3
    assert r["enforce_eager"] == ["true", "false", "true"]
    assert r["expectations"] == ["✓", "✓", "✓"]
    differs = {row["label"] for row in table(d)["rows"] if row["differs"]}
    assert differs == {"all_gather per forward pass", "all_to_all per forward pass", "enforce_eager",
                       "calls of LayoutDecoderLayer._legacy_attention", "calls of LayoutDecoderLayer._sp_attention"}


def test_the_batch_shapes_each_engine_ran_get_a_row_where_recorded():
    d = pass_compare()
    what_ran = d["comparisons"][0]["paths"]["what_ran"]
    what_ran["a"]["tokens_per_forward"] = {"1": 40, "2": 6, "64": 2}
    what_ran["b"]["tokens_per_forward"] = {"1": 40, "2": 6, "64": 2}
    r = rows(d)
    assert r["forward passes by tokens"] == ["1: 40, 2-3: 6, 64-127: 2", "1: 40, 2-3: 6, 64-127: 2", "not recorded"]
    assert "forward passes by tokens" not in rows(pass_compare()), "no row where no side recorded them"


def test_the_kernels_the_processor_chose_get_a_row_wherever_recorded():
    """Equal on both sides or not: another x86 kind runs the same config on other kernels."""
    d = pass_compare()
    d["comparisons"][0]["paths"]["what_ran"]["b"]["switches"]["cpu_kernels"] = {"attention_isa": ["amx"], "linear": ["onednn_mm"]}
    r = rows(d)
    assert list(r).index("cpu_kernels") == list(r).index("dtype") + 1
    assert r["cpu_kernels"][0] == "—" and "amx" in r["cpu_kernels"][1]
    assert "cpu_kernels" in {row["label"] for row in table(d)["rows"] if row["differs"]}


def test_a_sampled_run_shows_how_each_engine_samples_and_a_greedy_one_only_where_they_differ():
    from tests.report.test_sampled import task

    d = pass_compare()
    for c in (d["comparisons"][0], d["noise_floor"]):
        for side in ("a", "b"):
            c["paths"]["what_ran"][side]["switches"].update(
                use_v2_model_runner=False, logprobs_mode="raw_logprobs", speculative_config=None, seed=0)
    greedy = rows(d)
    assert not {"use_v2_model_runner", "logprobs_mode", "speculative_config", "seed"} & set(greedy)
    d["comparisons"][0]["sampling"] = [task(0).model_dump(mode="json")]
    sampled = rows(d)
    assert sampled["use_v2_model_runner"] == ["false"] * 3 and sampled["logprobs_mode"] == ["raw_logprobs"] * 3
    assert list(sampled).index("use_v2_model_runner") > list(sampled).index("dtype")


def test_several_counts_per_forward_pass_and_absent_functions():
    d = pass_compare()
    b = d["comparisons"][0]["paths"]["what_ran"]["b"]
    b["collectives_per_forward"] = collectives(all_to_all={"0": 8, "3": 40}, reduce_scatter={"3": 48})
    b["absent"] = [LEGACY_CALL]
    r = rows(d)
    assert r["all_to_all per forward pass"][1] == "3 in 40/48, 0 in 8/48"
    assert r["calls of LayoutDecoderLayer._legacy_attention"][1] == "absent"


def test_serve_mode_per_process_values_and_a_reused_server():
    d = pass_compare()
    served = legacy_summary(mode="serve", processes={"api_server": 1, "engine_core": 2})
    served["switches"].update(tensor_parallel_size=2, tp_rank={"per_process": [0, 1]},
                              attention_backends={"per_process": [["CPU_ATTN"], ["TORCH_SDPA", "CPU_ATTN"]]})
    d["comparisons"][0]["paths"]["what_ran"]["b"] = served
    d["noise_floor"]["paths"]["what_ran"]["b"] = dict(served, server_of="sp")
    r = rows(d)
    assert r["processes"] == ["offline: 1 evalpipe_worker", "serve: 1 api_server, 2 engine_core",
                              "serve: 1 api_server, 2 engine_core (reused sp's server)"]
    assert r["tensor_parallel_size"] == ["1", "2", "2"]
    assert r["tp_rank"] == ["0", "0 | 1", "0 | 1"]  # differs between the columns, so it has a row
    assert r["attention_backends"][1] == "CPU_ATTN | TORCH_SDPA, CPU_ATTN"
    assert "\\| " in md_section(render_markdown(d, {}))  # the join stays inside its markdown cell


def test_a_failed_path_in_the_table():
    r = rows(trap_compare())
    assert r["model"] == ["LlamaForCausalLM", "LlamaForCausalLM"]
    assert r["decoder layers"] == ["3 × LlamaDecoderLayer"] * 2
    assert r["collectives per forward pass"] == ["none in 48/48"] * 2
    assert r["calls of LayoutDecoderLayer._legacy_attention"] == ["0", "0"]
    assert r["expectations"] == ["5 failed", "5 failed"]


def test_endpoint_and_not_recorded_columns():
    r = rows(endpoint_compare())
    assert r["processes"] == ["offline: 1 evalpipe_worker", "not verifiable (endpoint)"]
    assert r["model"] == ["LayoutForCausalLM", "—"] and r["dtype"] == ["float32", "—"]
    assert r["expectations"] == ["✓", "1 failed"]
    half = rows(not_recorded_compare(b=sp_summary()))
    assert half["processes"] == ["not recorded", "offline: 1 evalpipe_worker"]
    assert half["expectations"] == ["—", "—"]
    # nothing recorded on either side: the note, no table of "not recorded"
    assert what_ran_view(not_recorded_compare(), plain)["table"] is None


def test_no_section_without_paths():
    for d in (make_compare(), identical_compare()):
        assert what_ran_view(d, plain) is None
        assert "What ran" not in render_markdown(d, {}) and 'id="what-ran"' not in render_html(d, {}, plots=False)
        assert "what ran" not in summary_text(d)


# ---------------------------------------------------------------------------
# report.md and report.html
# ---------------------------------------------------------------------------


def test_markdown_of_the_trap():
    md = render_markdown(trap_compare(), {})
    assert "## Verdict: INCONCLUSIVE\n\nINCONCLUSIVE: the outputs were compared, but the path probes" in md
    assert "**sp** vs reference **legacy**: **INCONCLUSIVE** (the outputs alone: IDENTICAL)" in md
    assert ("All 2 evaluated output gates passed, 1 skipped, but the paths of sp prove nothing: INCONCLUSIVE "
            "(see What ran).") in md
    order = [md.index(s) for s in ("## Verdict", "## Gates", "## What ran", "## Run", "## sp vs legacy")]
    assert order == sorted(order)
    section = md_section(md)
    assert ("**sp** vs **legacy**: the paths failed their expectations, so the comparison is INCONCLUSIVE; "
            "the outputs alone would be IDENTICAL.") in section
    failures = [line for line in section.splitlines() if line.startswith("- ✗ ")]
    assert len(failures) == 10
    assert failures[0] == ("- ✗ variant \\`legacy\\` was expected to build \\`evalpipe.lab.layout.model.LayoutForCausalLM\\`; "
                           "vLLM instantiated \\`vllm.model\\_executor.models.llama.LlamaForCausalLM\\` (1 process)")
    assert "| model | LlamaForCausalLM | LlamaForCausalLM |" in section
    assert "| collectives per forward pass | none in 48/48 | none in 48/48 |" in section
    assert "| expectations | 5 failed | 5 failed |" in section
    assert "| attention\\_backends | CPU\\_ATTN | CPU\\_ATTN |" in section


def test_markdown_of_a_verified_run():
    md = render_markdown(pass_compare(), {})
    assert "INCONCLUSIVE" not in md and "All 2 evaluated gates passed, 1 skipped." in md
    section = md_section(md)
    assert "**sp** vs **legacy**: each side ran the path its expectations declare." in section
    assert "A/A **legacy-aa** vs **legacy**: each side ran the path its expectations declare." in section
    assert "- ✓ legacy: model \\`LayoutForCausalLM\\` in 1 process; 3 all\\_gather in each of 48 forward passes" in section
    assert "| **all\\_gather per forward pass** | 3 in 48/48 | 0 in 48/48 | 3 in 48/48 |" in section
    assert "| reduce\\_scatter per forward pass | 3 in 48/48 | 3 in 48/48 | 3 in 48/48 |" in section
    assert "| expectations | ✓ | ✓ | ✓ |" in section


def test_markdown_same_code_and_not_recorded():
    section = md_section(render_markdown(same_code_compare(), {}))
    assert "**sp** vs **legacy**: both sides ran the same code, so the comparison is INCONCLUSIVE" in section
    assert "- ✗ the variants ran the same code: nothing was compared" in section
    note = md_section(render_markdown(not_recorded_compare(), {}))
    assert "**sp** vs **legacy**: the path probes recorded nothing to judge." in note
    assert "- path not verified: \\`legacy\\`, \\`sp\\` ran before evalpipe recorded path probes" in note
    assert "| processes |" not in note


def test_html_of_the_trap():
    html = render_html(trap_compare(), {}, plots=False)
    assert '<h2>Verdict <span class="badge inconclusive">INCONCLUSIVE</span></h2>' in html
    assert ".badge.inconclusive { background: #d4a72c; color: #1f2328; }" in html and ".badge.different" not in html
    assert "(the outputs alone: IDENTICAL)" in html
    order = [html.index(s) for s in ('id="verdict"', 'id="gates"', 'id="what-ran"', 'id="run"', 'class="comparison"')]
    assert order == sorted(order)
    section = html_section(html)
    failures = re.findall(r'<li class="txt path-failure">✗ (.*?)</li>', section)
    assert len(failures) == 10
    assert failures[5] == ("variant `sp` was expected to build `evalpipe.lab.layout.model.LayoutForCausalLM`; "
                           "vLLM instantiated `vllm.model_executor.models.llama.LlamaForCausalLM` (1 process)")
    page = parse_page(section)
    assert "<th>expectations</th><td class=\"txt\">5 failed</td><td class=\"txt\">5 failed</td>" in section
    assert [t for t in page.texts if t.strip()][:1] == ["What ran"]


def test_html_marks_rows_that_differ():
    section = html_section(render_html(pass_compare(), {}, plots=False))
    assert '<tr class="differs"><th>all_gather per forward pass</th><td class="txt">3 in 48/48</td>' in section
    assert "<tr><th>dtype</th>" in section
    assert '<li class="txt path-evidence">✓ legacy: model `LayoutForCausalLM`' in section
    note = html_section(render_html(not_recorded_compare(), {}, plots=False))
    assert '<li class="txt path-note">path not verified' in note and "<table" not in note


def test_every_status_has_a_badge_and_a_terminal_style():
    assert KNOWN_STATUSES == {s.value for s in Status}
    assert set(STATUS_STYLE) == {s.value for s in Status}
    assert STATUS_STYLE["INCONCLUSIVE"] == "bold yellow"
    assert status_class("INCONCLUSIVE") == "inconclusive"
    # a status nothing writes any more (compare.json from before the gates): the document refuses it
    # (tests/documents/test_comparison.py), so the renderers know none
    assert "DIFFERENT" not in STATUS_STYLE
    with pytest.raises(KeyError):
        status_class("DIFFERENT")


# ---------------------------------------------------------------------------
# terminal
# ---------------------------------------------------------------------------


def test_terminal_inconclusive_reasons_table_and_gates_line():
    out = summary_text(trap_compare())
    lines = out.splitlines()
    assert lines[0] == "run-1: INCONCLUSIVE"
    assert lines[1] == "sp vs legacy: the paths prove nothing (the outputs alone: IDENTICAL)"
    reasons = [line for line in lines if line.startswith("  - ")]
    assert len(reasons) == 8 and reasons[0].startswith("  - variant `legacy` was expected to build")
    assert "  … 2 more in report.md" in lines
    assert lines.index("  … 2 more in report.md") < next(i for i, line in enumerate(lines) if line.startswith("what ran"))
    header = next(line for line in lines if "legacy (reference)" in line)
    assert header.split() == ["legacy", "(reference)", "sp"]
    row = next(line for line in lines if line.lstrip().startswith("model"))
    assert row.split() == ["model", "LlamaForCausalLM", "LlamaForCausalLM"]
    assert next(line for line in lines if "expectations" in line).split() == ["expectations", "5", "failed", "5", "failed"]
    assert "all 2 output gates passed (1 skipped), but the paths prove nothing: INCONCLUSIVE" in out
    assert "all 2 gates passed" not in out
    assert out.index("what ran") < out.index("scores (reference: legacy)")


def test_terminal_path_reasons_are_yellow():
    out = summary_text(trap_compare(), color_system="standard", force_terminal=True)
    assert re.search(r"\x1b\[1;33mINCONCLUSIVE", out)  # the verdict: bold yellow
    line = next(line for line in out.splitlines() if "was expected to build" in line)
    assert line.startswith("\x1b[33m")


def test_terminal_verified_run_shows_what_ran_and_a_plain_pass():
    out = summary_text(pass_compare())
    assert "what ran" in out and "the paths prove nothing" not in out
    assert "all 2 gates passed (1 skipped)" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("all_gather per forward pass"))
    assert row.split()[4:] == ["3", "in", "48/48", "0", "in", "48/48", "3", "in", "48/48"]


def test_terminal_same_code_and_no_gates():
    out = summary_text(same_code_compare())
    assert "  - the variants ran the same code: nothing was compared" in out
    d = same_code_compare()
    del d["comparisons"][0]["gates"]
    out = summary_text(d)
    # without gates the remaining reasons follow, the path reason not twice
    assert out.count("the variants ran the same code") == 1 and f"  sp: {OUTPUTS_LINE}" in out


# ---------------------------------------------------------------------------
# junit.xml
# ---------------------------------------------------------------------------


def _counts(el: ET.Element) -> tuple[int, int, int]:
    return int(el.get("tests")), int(el.get("failures")), int(el.get("skipped"))


def test_junit_a_failed_path_fails_its_case():
    root = junit(trap_compare())
    assert _counts(root) == (4, 1, 1)  # 3 gates (1 skipped) + the path
    case = path_case(root)
    assert (case.get("classname"), case.get("name")) == ("sp.path", "expectations")
    failure = case.find("failure")
    assert failure.get("type") == "inconclusive"
    assert failure.get("message") == TRAP_FAILURES["legacy"][0]
    assert failure.text.splitlines() == [*TRAP_FAILURES["legacy"], *TRAP_FAILURES["sp"]]


def test_junit_same_code_fails_verified_passes_not_recorded_skips():
    failure = path_case(junit(same_code_compare())).find("failure")
    assert failure.get("type") == "inconclusive" and failure.get("message") == SAME_CODE_REASON
    root = junit(pass_compare())
    assert _counts(root) == (4, 0, 1) and list(path_case(root)) == []
    root = junit(not_recorded_compare())
    skipped = path_case(root).find("skipped")
    assert _counts(root) == (4, 0, 2) and skipped.get("message") == NOT_RECORDED_NOTE


def test_junit_without_paths_has_no_path_case():
    root = junit(make_compare())
    assert not [c for c in root.iter("testcase") if c.get("name") == "expectations"]
    assert _counts(root) == (6, 2, 1)


@pytest.mark.parametrize("paths_entry", [
    "failed", "same_code", "verified", "not_recorded", None, "absent",
])
def test_an_inconclusive_comparison_never_passes_ci(paths_entry):
    """Whatever its paths entry says (a hand-edited or truncated compare.json), with or without gates."""
    p = {"failed": trap_paths(), "same_code": same_code_compare()["comparisons"][0]["paths"],
         "verified": verified_paths(), "not_recorded": not_recorded_compare()["comparisons"][0]["paths"],
         None: None, "absent": None}[paths_entry]
    c = inconclusive_comparison(trap_paths())
    c["paths"] = p
    if paths_entry == "absent":
        del c["paths"]
    for gates in (passing_gates(), None):
        if gates is None:
            c.pop("gates", None)
        root = junit(make_compare(status="INCONCLUSIVE", comparisons=[c]))
        assert int(root.get("failures")) >= 1
        assert any(f.get("type") == "inconclusive" for f in root.iter("failure"))
