"""report.md and the terminal summary, rendered from hand-built compare.json documents.

The builders write compare.json dicts by hand, so the renderers are tested without
running a comparison; :func:`as_document` makes them the typed document the renderers
take (evalpipe/documents/comparison.py). The builders and the renderers taking them
are imported by the other report tests.
"""

from __future__ import annotations

import copy
import io
import re
from typing import Any

import pytest
from rich.console import Console

from evalpipe import report
from evalpipe.documents.comparison import ComparisonDocument
from evalpipe.documents.run_doc import RunDocument
from evalpipe.report import md_escape, what_ran

TASK = "gsm8k_synth_4shot"
METRIC = "exact_match,strict-match"
NASTY = "x | y `rm -rf` <script>alert(1)</script>\nsecond line"
# everything a model or a dataset can put into an HTML cell that must stay text
HOSTILE = "<script>alert(1)</script> </td> & \"dq\" 'sq'\nnext line"

RUN_INFO = {
    "run_id": "run-1",
    "model": {"name": "tiny-layout", "path": "abc"},
    "fingerprints": {"config_sha256": "m123", "code": "t456"},
    "variants": ["legacy", "sp"],
    "variant_settings": {"legacy": {"env": {"LAYOUT": "legacy", "OMP": "1"}}, "sp": {"env": {"LAYOUT": "sp", "OMP": "1"}}},
    "reference": "legacy",
    "timings": {"model_s": 12.5, "total_s": 11.0},
    "versions": {"vllm": "0.32.0"},
}


def as_run(run_info: dict[str, Any] | RunDocument | None) -> RunDocument | None:
    """run.json as the renderers get it: the typed document."""
    return run_info if run_info is None or isinstance(run_info, RunDocument) else RunDocument.model_validate(run_info)


# ---------------------------------------------------------------------------
# compare.json builders (shape of ScoreRow / TokenSummary / GateResult to_dict)
# ---------------------------------------------------------------------------


def score_row(**kw: Any) -> dict[str, Any]:
    """6 items, A = [0,1,0,1,0,1], B flips doc 2 to right (the numbers of the statistics test)."""
    row = {
        "task": TASK, "metric": METRIC, "n_paired": 6, "mean_a": 0.5, "mean_b": 2 / 3, "delta": 1 / 6,
        "n_changed": 1, "n_missing": 0, "binary": True, "a_right_b_wrong": 0, "a_wrong_b_right": 1,
        "identical": False, "only_a": 0, "only_b": 0, "se_a": 0.2236, "se_b": 0.2108, "se_delta": 1 / 6,
        "ci_low": -0.2618, "ci_high": 0.5951, "ci_conf": 0.95, "df": 5, "n_clusters": 6, "mcnemar_p": 1.0,
        "margin": 0.01, "tost_ci_low": -0.1692, "tost_ci_high": 0.50255, "tost_p_lower": 0.2, "tost_p_upper": 0.8,
        "equivalent": False, "mdd": 0.5817, "n_flipped": 1,
        "flipped": [flipped(2)],
    }
    row.update(kw)
    return row


def flipped(doc: int, text: str = NASTY) -> dict[str, Any]:
    return {
        "doc_id": doc, "repeat": 0, "score_a": 0.0, "score_b": 1.0, "question": f"Question {doc}?",
        "target": "4|2", "response_a": "The answer is 2.", "response_b": text, "answer_a": "2", "answer_b": "4",
    }


def worst(kind: str, doc: int, pos: int, **kw: Any) -> dict[str, Any]:
    w = {
        "kind": kind, "task": TASK, "doc_id": doc, "repeat": 0, "pos": pos,
        "token_a": 13881, "token_b": 11, "logprob_a": -0.4053, "logprob_b": -0.9,
        "abs_dlogprob": 0.4947, "topk_ids_a": [13881, 11, 13883], "topk_logprobs_a": [-0.4053, -1.405, -2.405],
        "topk_ids_b": [11, 13881, 13], "topk_logprobs_b": [-0.9, -1.0, -2.4], "len_a": 8, "len_b": 8,
        "response_a": "The answer is 2.", "response_b": NASTY, "target": "42",
    }
    w.update(kw)
    return w


def hist(zero: int, counts: dict[int, int]) -> dict[str, Any]:
    decades = list(range(-10, 3))
    return {"decades": decades, "zero": zero, "counts": [counts.get(d, 0) for d in decades]}


def token_summary(**kw: Any) -> dict[str, Any]:
    t = {
        "task": TASK, "n_samples": 6, "only_a": 0, "only_b": 0, "only_a_keys": [], "only_b_keys": [],
        "n_ids_identical": 5, "n_identical": 5, "n_logprob_diff_same_ids": 0, "n_topk_diff_same_ids": 0,
        "n_length_diff": 0, "tokens_a": 48, "tokens_b": 48, "n_positions_compared": 44,
        "n_positions_logprob_diff": 3, "divergence_positions": [4], "median_first_divergence": 4.0,
        "max_abs_dlogprob": 0.02, "mean_abs_dlogprob": 0.001, "max_abs_dlogprob_same_ids": 0.0,
        "worst_divergence": [worst("earliest_divergence", 2, 4)], "worst_logprob": [], "near_tie_gap": 0.5,
        "n_near_tie_divergences": 0, "n_hard_divergences": 1, "hard_divergences": [[2, 0, 4]],
        "n_positions_topk_equal": 44, "share_topk_equal": 1.0, "kl_p50": 0.0, "kl_p99": 1e-4, "kl_max": 3e-4,
        "abs_dlogprob_p50": 0.0, "abs_dlogprob_p99": 0.01, "n_divergent": 1, "share_ids_identical": 5 / 6,
        "share_identical": 5 / 6, "identical": False,
        # fields that newer compare.json files carry
        "n_top1_disagree": 0, "n_top1_hard": 0, "share_top1_agree": 1.0, "top1_hard_positions": [],
        "kl_max_at": [3, 0, 6], "worst_kl": [],
        "kl_hist": hist(40, {-6: 2, -4: 2}), "abs_dlogprob_hist": hist(41, {-3: 2, -2: 1}),
    }
    t.update(kw)
    return t


def teacher_summary(**kw: Any) -> dict[str, Any]:
    defaults = {
        "n_ids_identical": 6, "n_identical": 2, "divergence_positions": [], "median_first_divergence": None,
        "n_hard_divergences": 0, "hard_divergences": [], "worst_divergence": [], "n_positions_compared": 48,
        "n_positions_topk_equal": 47, "kl_p50": 1e-6, "kl_p99": 0.004, "kl_max": 0.3, "kl_max_at": [5, 0, 7],
        "n_top1_disagree": 2, "n_top1_hard": 1, "share_top1_agree": 46 / 48, "top1_hard_positions": [[5, 0, 7]],
        "worst_kl": [worst("largest_kl", 5, 7, kl=0.3, context=f"Question 5? {HOSTILE} so the answer", token_text_a=" 4", token_text_b="\n")],
        "worst_logprob": [worst("largest_dlogprob", 5, 7, context=None)],
        "kl_hist": hist(3, {-6: 20, -4: 20, -3: 4, -1: 1}), "abs_dlogprob_hist": hist(10, {-4: 30, -2: 7, 0: 1}),
    }
    defaults.update(kw)
    return token_summary(**defaults)


def gate(name: str, status: str, measured: float | None, threshold: float | None, **kw: Any) -> dict[str, Any]:
    g = {
        "gate": name, "task": TASK, "metric": None, "status": status, "measured": measured,
        "threshold": threshold, "aa_value": None, "detail": f"{name}: {status}", "evidence": [],
    }
    g.update(kw)
    return g


def comparison(variant: str = "sp", reference: str = "legacy", **kw: Any) -> dict[str, Any]:
    c = {
        "a": reference, "b": variant, "reference": reference, "variant": variant, "status": "DIVERGENT",
        "reasons": [f"{TASK} teacher_kl_max: 0.3 > 0.1 (largest at doc 5 pos 7)"],
        "samples": {"a": 6, "b": 6},
        "scores": [score_row()], "metrics_only_a": [], "metrics_only_b": [],
        "tokens": [token_summary()],
        "teacher": [teacher_summary()],
        "gates": [
            gate("score_equivalence", "pass", 0.005, 0.01, metric=METRIC),
            gate("score_mcnemar", "pass", 1.0, 0.05, metric=METRIC),
            gate("free_hard_divergences", "fail", 1, 0, aa_value=0, evidence=["doc 2 repeat 0 pos 4"]),
            gate("teacher_kl_p99", "pass", 0.004, 0.006, aa_value=0.002),
            gate("teacher_kl_max", "fail", 0.3, 0.1, aa_value=0.01,
                 detail="KL 0.3 > 0.1 at doc 5 pos 7", evidence=["doc 5 repeat 0 pos 7"]),
            gate("teacher_hard_top1_flips", "skip", None, None, detail="no teacher-forced data for this task"),
        ],
    }
    c.update(kw)
    return c


def noise_floor() -> dict[str, Any]:
    return comparison(
        "legacy-aa", status="EQUIVALENT", reasons=[], gates=[], scores=[score_row(delta=0.0, mean_b=0.5, flipped=[], n_flipped=0)],
        tokens=[token_summary(n_ids_identical=6, n_identical=6, divergence_positions=[], n_hard_divergences=0,
                              hard_divergences=[], worst_divergence=[], kl_hist=hist(44, {}), abs_dlogprob_hist=hist(44, {}))],
        teacher=[teacher_summary(kl_p99=0.002, kl_max=0.01, n_top1_hard=0, top1_hard_positions=[], worst_kl=[],
                                 worst_logprob=[], kl_hist=hist(10, {-7: 30, -5: 8}))],
    )


def make_compare(**kw: Any) -> dict[str, Any]:
    """A DIVERGENT run: one variant with scores, free-running, teacher-forced and A/A data, six gates."""
    d = {
        "schema_version": 2, "run_id": "run-1", "reference": "legacy", "variants": ["sp"], "status": "DIVERGENT",
        "gates": {
            "scores": {"margin": 0.01, "alpha": 0.05, "require_equivalence": True, "fail_on_significant": True},
            "tokens": {"teacher_kl_max": {"abs": 0.1, "rel_aa": 3.0}},
        },
        "noise_floor": noise_floor(),
        "comparisons": [comparison()],
    }
    d.update(kw)
    return d


def identical_compare() -> dict[str, Any]:
    """An IDENTICAL run in the old layout: no gates, no teacher-forced or A/A data, no new token fields."""
    old_keys = ("n_top1_disagree", "n_top1_hard", "share_top1_agree", "top1_hard_positions", "kl_max_at",
                "worst_kl", "kl_hist", "abs_dlogprob_hist")
    t = token_summary(n_ids_identical=6, n_identical=6, divergence_positions=[], median_first_divergence=None,
                      n_hard_divergences=0, hard_divergences=[], worst_divergence=[], n_positions_compared=48,
                      n_positions_topk_equal=48, kl_p99=0.0, kl_max=0.0, max_abs_dlogprob=0.0, abs_dlogprob_p99=0.0,
                      n_divergent=0, identical=True)
    for k in old_keys:
        del t[k]
    row = score_row(mean_b=0.5, delta=0.0, n_changed=0, a_wrong_b_right=0, identical=True, se_b=0.2236, se_delta=0.0,
                    ci_low=0.0, ci_high=0.0, tost_ci_low=0.0, tost_ci_high=0.0, equivalent=True, mdd=0.0,
                    n_flipped=0, flipped=[])
    c = comparison(status="IDENTICAL", reasons=[f"{TASK}: 6/6 samples bitwise identical"], scores=[row], tokens=[t])
    for k in ("teacher", "gates"):
        del c[k]
    return {"schema_version": 1, "run_id": "run-1", "reference": "legacy", "variants": ["sp"],
            "status": "IDENTICAL", "comparisons": [c]}


# Defaults of the compare.json fields the builders above leave out (the layout they
# follow predates them): what a comparison without them would have written.
_TOKEN_DEFAULTS = {"n_top1_disagree": 0, "n_top1_hard": 0, "share_top1_agree": None, "top1_hard_positions": [],
                   "kl_max_at": None, "worst_kl": [], "kl_hist": hist(0, {}), "abs_dlogprob_hist": hist(0, {})}
_COMPARISON_DEFAULTS = {"teacher": None, "gates": [], "distribution": None, "outputs_status": None, "paths": None,
                        "numerics": {"dtype": None, "source": "unknown", "precision": "half", "aa_identical": None,
                                     "floors": {}}}


def as_document(d: dict[str, Any] | ComparisonDocument) -> ComparisonDocument:
    """A builder's dict as the typed compare.json document (schema 3), the fields it leaves out filled in."""
    if isinstance(d, ComparisonDocument):
        return d
    d = copy.deepcopy(d)

    def fill(c: dict[str, Any]) -> dict[str, Any]:
        for key, value in _COMPARISON_DEFAULTS.items():
            c.setdefault(key, copy.deepcopy(value))
        for row in c["scores"]:
            row.setdefault("alpha", 0.05)
        for t in [*c["tokens"], *(c["teacher"] or [])]:
            for key, value in _TOKEN_DEFAULTS.items():
                t.setdefault(key, copy.deepcopy(value))
        return c

    d.update(schema_version=3, noise_floor=fill(d["noise_floor"]) if d.get("noise_floor") else None,
             comparisons=[fill(c) for c in d["comparisons"]], gates=d.get("gates") or {})
    return ComparisonDocument.model_validate(d)


def render_markdown(compare: dict[str, Any] | ComparisonDocument, run_info: dict[str, Any] | None = None) -> str:
    return report.render_markdown(as_document(compare), as_run(run_info))


def render_html(compare: dict[str, Any] | ComparisonDocument, run_info: dict[str, Any] | None = None, **kw: Any) -> str:
    return report.render_html(as_document(compare), as_run(run_info), **kw)


def print_summary(compare: dict[str, Any] | ComparisonDocument, console: Console | None = None) -> None:
    report.print_summary(as_document(compare), console)


def what_ran_view(compare: dict[str, Any] | ComparisonDocument, esc: Any) -> dict[str, Any] | None:
    return what_ran.what_ran_view(as_document(compare), esc)


# ---------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def md() -> str:
    return render_markdown(make_compare(), RUN_INFO)


def _table_blocks(md: str) -> list[list[str]]:
    return [b.strip("\n").split("\n") for b in re.findall(r"(?:^\|.*\n)+", md, flags=re.MULTILINE)]


def test_md_escape():
    out = md_escape(NASTY)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "\\|" in out and "|" not in out.replace("\\|", "")
    assert "\\`rm -rf\\`" in out
    assert "\n" not in out and "<br>" in out
    assert md_escape("a\x1bb\x00") == "a\\u001bb\\u0000"


def test_markdown_escapes_model_text(md):
    assert "<script>" not in md and "</script>" not in md and "</td>" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "\\`rm -rf\\`" in md
    # every table row keeps its column count: unescaped pipes never appear inside cells
    for rows in _table_blocks(md):
        widths = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
        assert len(widths) == 1, rows


def test_markdown_order_verdict_then_gates_then_run(md):
    lines = md.splitlines()
    assert lines[0] == "# evalpipe comparison: run-1"
    assert lines[2] == "## Verdict: DIVERGENT"
    assert "**sp** vs reference **legacy**: **DIVERGENT**" in md
    assert "A/A noise floor: **legacy-aa** vs **legacy**: EQUIVALENT" in md
    order = [md.index(s) for s in ("## Verdict", "teacher\\_kl\\_max: 0.3", "## Gates", "## Run", "## sp vs legacy", "### Task")]
    assert order == sorted(order)


def test_markdown_gate_table_failing_first(md):
    assert "2 of 6 gates failed, 1 skipped." in md
    gates = md[md.index("## Gates") : md.index("## Run")]
    rows = [r for r in gates.splitlines() if r.startswith("| sp |")]
    statuses = [r.split(" | ")[7] for r in rows]
    assert statuses == ["**FAIL**", "**FAIL**", "skip", "pass", "pass", "pass"]
    assert "| sp | teacher\\_kl\\_max | gsm8k\\_synth\\_4shot | — | 0.3 | 0.1 | 0.01 | **FAIL** |" in gates
    assert f"| sp | score\\_equivalence | gsm8k\\_synth\\_4shot | {md_escape(METRIC)} | 0.005 | 0.01 | — | pass |" in gates
    # evidence of failing gates, under the table
    assert "- sp teacher\\_kl\\_max gsm8k\\_synth\\_4shot:\n  - doc 5 repeat 0 pos 7" in gates


@pytest.mark.parametrize(
    "line",
    [
        # run header: model, fingerprints, only the settings that differ between variants, timings
        "| model | tiny-layout (path=abc) |",
        "| fingerprint config\\_sha256 | m123 |",
        "| legacy | reference | env.LAYOUT=legacy |",
        "| model\\_s | 12.5 |",
        "| legacy-aa | A/A noise floor | — |",
        "| A/A noise floor | legacy-aa vs legacy: EQUIVALENT |",
        "| scores gates | alpha=0.05, fail\\_on\\_significant=True, margin=0.01, require\\_equivalence=True |",
        # scores: 6 items, A = [0,1,0,1,0,1], B flips doc 2 to right: d̄ = 1/6, SE = 1/6,
        # t_{.975,5} = 2.5706 -> [−0.262, +0.595]; 90%: t_{.95,5} = 2.0150; MDD 0.582; McNemar(0, 1) = 1
        "| exact\\_match,strict-match | 0.500 | 0.667 | +0.167 | 1/6 (0 right→wrong, 1 wrong→right) |",
        "| equivalent within ±0.01 [90% CI] | detectable Δ | items |",
        (
            "| exact\\_match,strict-match | 0.500 ± 0.224 | 0.667 ± 0.211 | +0.167 [−0.262, +0.595] | 1 "
            "| no [−0.169, +0.503] | 0.582 | 6 |"
        ),
        # tokens: free-running and teacher-forced, each beside its A/A noise floor
        "| tokens | free-running | free-running A/A | teacher-forced | teacher-forced A/A |",
        "| KL p50 / p99 / max | 0 / 0.0001 / 0.0003 | 0 / 0.0001 / 0.0003 | 1e-06 / 0.004 / 0.3 | 1e-06 / 0.002 / 0.01 |",
        "| top-1 agreement | 44/44 (100.0%) | 44/44 (100.0%) | 46/48 (95.8%) | 46/48 (95.8%) |",
        "| hard top-1 flips | 0 | 0 | 1 | 0 |",
        "| largest KL at | doc 3 pos 6 | doc 3 pos 6 | doc 5 pos 7 | doc 5 pos 7 |",
        "Hard free-running divergences: doc 2 pos 4",
        "Hard teacher-forced top-1 flips: doc 5 pos 7",
    ],
)
def test_markdown_lines(md, line):
    assert line in md


def test_markdown_header_keeps_only_distinguishing_settings(md):
    assert "env.LAYOUT=sp" in md and "OMP" not in md


def test_markdown_worst_positions(md):
    assert "#### Earliest divergences (free-running)" in md
    assert "#### Largest KL (teacher-forced)" in md and "#### Largest \\|Δlogprob\\| (teacher-forced)" in md
    section = md[md.index("#### Largest KL (teacher-forced)") :]
    assert section.startswith("#### Largest KL (teacher-forced)\n\ndoc 5, position 7: KL 0.3, \\|Δlogprob\\| 0.49\n")
    # context is escaped, token texts are shown as literals, the other side's token is bold
    assert "context: Question 5? &lt;script&gt;alert(1)&lt;/script&gt; &lt;/td&gt; &amp; \"dq\" 'sq'<br>next line so the answer" in section
    assert '| token (logprob) | `13881` " 4" (−0.4053) | `11` "\\\\n" (−0.9) |' in section
    assert "| top-k (other side's token in bold) | 13881 (−0.4053), **11 (−1.405)**, 13883 (−2.405) |" in section
    earliest = md[md.index("#### Earliest divergences") :]
    assert earliest.startswith("#### Earliest divergences (free-running)\n\ndoc 2, position 4\n")


def test_markdown_flipped_items(md):
    section = md[md.index("#### Items whose score changed") : md.index("#### Earliest divergences")]
    assert "exact\\_match,strict-match: 1" in section
    row = next(line for line in section.splitlines() if line.startswith("| 2 |"))
    assert "| 0 → 1 | Question 2? | 4\\|2 |" in row
    assert "&lt;script&gt;" in row and "<script>" not in row and "second line" in row


def test_markdown_flipped_items_truncated():
    c = comparison(scores=[score_row(n_flipped=12, flipped=[flipped(i, "r") for i in range(12)])])
    md = render_markdown(make_compare(comparisons=[c]), {})
    assert "exact\\_match,strict-match: first 10 of 12" in md
    section = md[md.index("#### Items whose score changed") :]
    assert "| 9 |" in section and "| 10 |" not in section


def test_identical_old_layout_and_determinism():
    d = identical_compare()
    md1 = render_markdown(d, RUN_INFO)
    assert "## Verdict: IDENTICAL" in md1 and "Earliest divergences" not in md1
    assert "No gate was evaluated." in md1
    assert "| 0.500 ± 0.224 | 0.500 ± 0.224 | 0 [0, 0] | 1 | yes [0, 0] | 0.000 | 6 |" in md1
    # the document always carries the top-1 counts (a file without them is refused as another schema)
    assert "| tokens | free-running |\n" in md1 and "| top-1 agreement | 48/48 (100.0%) |" in md1
    assert "Items whose score changed" not in md1
    assert render_markdown(copy.deepcopy(d), RUN_INFO) == md1
    assert render_markdown(d, None).startswith("# evalpipe comparison: run-1")  # tolerant of missing run.json
    big = make_compare()
    assert render_markdown(big, RUN_INFO) == render_markdown(copy.deepcopy(big), RUN_INFO)


def test_markdown_of_a_document_read_back_is_the_same():
    doc = as_document(make_compare())
    assert render_markdown(ComparisonDocument.model_validate_json(doc.model_dump_json()), RUN_INFO) == render_markdown(doc, RUN_INFO)


# ---------------------------------------------------------------------------
# terminal
# ---------------------------------------------------------------------------


def _summary(d: dict[str, Any]) -> str:
    buf = io.StringIO()
    print_summary(d, Console(file=buf, width=220, color_system=None))
    return buf.getvalue()


def test_terminal_summary_divergent():
    out = _summary(make_compare())
    lines = out.splitlines()
    assert lines[0] == "run-1: DIVERGENT"
    assert "A/A noise floor (legacy-aa): EQUIVALENT" in out
    assert "scores (reference: legacy)" in out
    header = next(line for line in lines if "TF KL p99" in line)
    assert "TF hard top-1" in header
    row = next(line for line in lines if line.startswith("│ sp") and "%" in line)
    assert TASK in row and "83.3%" in row and "0.004" in row and "DIVERGENT" in row
    assert "failed gates" in out
    failed = [line for line in lines if line.startswith("│ sp") and "teacher_kl_max" in line]
    assert failed and "0.3" in failed[0] and "KL 0.3 > 0.1 at doc 5 pos 7" in failed[0]
    assert not any("teacher_kl_p99" in line for line in lines)


def test_terminal_summary_all_gates_passed():
    c = comparison(status="EQUIVALENT", gates=[gate("teacher_kl_p99", "pass", 0.001, 0.01), gate("x", "skip", None, None)])
    out = _summary(make_compare(status="EQUIVALENT", comparisons=[c]))
    assert out.startswith("run-1: EQUIVALENT")
    assert "all 1 gates passed (1 skipped)" in out and "failed gates" not in out


def test_terminal_summary_old_layout():
    out = _summary(identical_compare())
    assert out.startswith("run-1: IDENTICAL")
    assert "TF KL p99" not in out and "failed gates" not in out
    row = next(line for line in out.splitlines() if line.startswith("│ sp") and "%" in line)
    assert "100.0%" in row and "IDENTICAL" in row
