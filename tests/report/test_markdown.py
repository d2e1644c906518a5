"""report.md (evalpipe/report/markdown.py): md_escape, and render_markdown of hand-built
compare.json documents (tests/support/report_samples.py) -- the order verdict, gates, run,
evidence; the gate table failing first; the run header; the worst positions and flipped
items; model text escaped so no table row loses a column; the same bytes for the same inputs.
"""

from __future__ import annotations

import copy
import re

import pytest
from report_samples import (
    METRIC,
    NASTY,
    RUN_INFO,
    as_document,
    comparison,
    flipped,
    identical_compare,
    make_compare,
    render_markdown,
    score_row,
)

from evalpipe.documents.comparison import ComparisonDocument
from evalpipe.report import md_escape


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



def test_md_escape_cuts_long_text_and_flattens_line_breaks():
    assert md_escape(None) == "" and md_escape(42) == "42"
    assert md_escape("abcdef", 3) == "abc\u2026" and md_escape("abc", 3) == "abc"
    assert md_escape("a\r\nb\rc\td") == "a<br>b<br>c d"
    assert md_escape("*_[x]~ & y") == "\\*\\_\\[x\\]\\~ &amp; y"


def test_markdown_has_no_runs_of_blank_lines_nor_trailing_spaces(md):
    assert md.endswith("\n") and not md.endswith("\n\n")
    assert "\n\n\n" not in md
    assert not [line for line in md.splitlines() if line != line.rstrip()]

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




def test_each_task_heading_carries_its_own_verdict_and_why_it_is_no_pass():
    from report_samples import TASK

    why = "variant `sp`: task `gsm8k_synth_4shot` was to drive >= 1 prefix-cache hit tokens; vLLM counted 0"
    doc = make_compare(comparisons=[comparison(tasks=[{"task": TASK, "status": "INCONCLUSIVE", "reasons": [why],
                                                       "outputs_status": "EQUIVALENT", "gates_failed": 0, "gates_passed": 4}])])
    md = render_markdown(doc, RUN_INFO)
    assert f"### Task {md_escape(TASK)}: INCONCLUSIVE\n\n{md_escape(why)}\n" in md
    # a file from before task verdicts: the heading as it was
    assert f"### Task {md_escape(TASK)}\n" in render_markdown(make_compare(), RUN_INFO)
