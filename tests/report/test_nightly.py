"""A night's judgement as a CI step summary and as JUnit XML (evalpipe/report/nightly.py), from
hand-built NightlyDocuments: the headline with the night's icon and status, the baseline
(or that there is none yet), the reasons, the table against the baseline night with its
flipped items (at most 20 named), the flagged and pending changes of the series; in the
XML one case for tonight, one per variant against the baseline and one per flagged
regression, each failing with its type (regression, inconclusive, error) only when it should.
(Hostile text in both: test_escaping.py.)
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from report_samples import flipped, score_row

from evalpipe.documents.nightly_doc import NightlyDocument
from evalpipe.report.nightly import render_night_junit, render_night_summary


def _flipped(n: int) -> list[dict[str, Any]]:
    return [{**flipped(i), "repeat": i % 2} for i in range(n)]


def change(state: str, summary: str, open_: bool = True, regression: bool = True) -> dict[str, Any]:
    """A change of the series as the judgement holds it (evalpipe.documents.nightly_doc.SeriesChange)."""
    return {
        "state": state, "regression": regression, "open": open_, "kind": "score", "task": "gsm8k", "metric": "acc",
        "variant": "sp", "summary": summary, "last_good": "night-0", "first_bad": "night-1", "run_id": "night-1",
        "night": "2025-01-02T02:00:00Z", "direction": "down", "before": 0.5, "after": 0.4, "delta": -0.1, "p_value": 0.01,
        "nights_after": 1,
        "bisect": [{"component": "vllm", "before": "0.1", "after": "0.2"}],
        "flipped": [{"doc_id": 7, "repeat": 0, "before": 1.0, "after": 0.0}],
    }


def _regression_night() -> NightlyDocument:
    return NightlyDocument(
        run_id="night-1", status="REGRESSION", verdict="EQUIVALENT", baseline="night-0",
        reasons=["sp: 3 items right→wrong against night-0"],
        vs_baseline=[
            {"variant": "sp", "baseline": "night-0", "status": "DIVERGENT", "reasons": ["gsm8k acc: McNemar p 0.03"],
             "scores": [score_row(task="gsm8k", metric="acc", a_right_b_wrong=3, a_wrong_b_right=1, mcnemar_p=0.625, alpha=0.05,
                                  flipped=_flipped(25))]},
            {"variant": "tp", "baseline": "night-0", "error": "compare.json of night-0 is unreadable"},
            {"variant": "legacy", "baseline": "night-0", "status": "IDENTICAL", "reasons": [], "scores": []},
        ],
        changes=[change("flagged", "acc fell"), change("pending", "kl rose", open_=False), change("not significant", "old news")],
    )


def _cases(xml: str) -> dict[tuple[str, str], ET.Element | None]:
    """(classname, name) of each test case -> its failure element (None: it passed)."""
    assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    (suite,) = ET.fromstring(xml.split("\n", 1)[1]).iter("testsuite")
    cases = {(c.get("classname"), c.get("name")): c.find("failure") for c in suite.iter("testcase")}
    assert suite.get("tests") == str(len(cases))
    assert suite.get("failures") == str(sum(f is not None for f in cases.values()))
    return cases


def test_summary_of_a_first_passing_night():
    md = render_night_summary(NightlyDocument(run_id="night-1", verdict="IDENTICAL"), dashboard=Path("site/index.html"))
    assert md.startswith("## evalpipe nightly night-1: ✅ PASS\n\n")
    assert "- tonight's verdict (variants vs reference): **IDENTICAL**" in md
    assert "- baseline night: none yet (first passing night becomes it)" in md
    assert "- dashboard: site/index.html" in md
    assert "### " not in md  # no reasons, nothing against a baseline, no changes
    assert "dashboard" not in render_night_summary(NightlyDocument(run_id="night-1"))


def test_summary_of_a_regression_against_the_baseline():
    md = render_night_summary(_regression_night())
    assert md.startswith("## evalpipe nightly night-1: ❌ REGRESSION\n")
    assert "- baseline night: night-0" in md
    assert "### Why\n\n- sp: 3 items right→wrong against night-0" in md
    assert "| sp | night-0 | DIVERGENT | gsm8k acc: 3/1, p 0.625 |" in md
    assert "| tp | night-0 | error | compare.json of night-0 is unreadable |" in md
    assert "| legacy | night-0 | IDENTICAL |  |" in md
    # the flipped items: the first 20 named, repeats only where not 0, the rest counted
    flipped = next(line for line in md.splitlines() if line.startswith("sp, gsm8k acc: flipped "))
    assert flipped.startswith("sp, gsm8k acc: flipped doc 0, doc 1 repeat 1, doc 2, ") and "doc 19 repeat 1" in flipped
    assert "doc 20" not in flipped and flipped.endswith(" (+5 more)")
    # changes: flagged and pending shown, others not
    assert "- **flagged** acc fell\n  - changed between night-0 and night-1: vllm: 0.1 → 0.2\n" in md
    assert "  - 1 items changed, first: doc 7 (1→0)" in md
    assert "- **pending** kl rose" in md and "old news" not in md


def test_junit_of_a_passing_night_has_one_passing_case():
    cases = _cases(render_night_junit(NightlyDocument(run_id="night-1", verdict="EQUIVALENT")))
    assert cases == {("tonight", "variants_vs_reference"): None}


def test_junit_fails_each_case_with_its_type():
    cases = _cases(render_night_junit(_regression_night()))
    assert list(cases) == [("tonight", "variants_vs_reference"), ("vs_baseline", "sp"), ("vs_baseline", "tp"),
                           ("vs_baseline", "legacy"), ("series", "gsm8k[acc].sp")]  # only the flagged regression
    assert cases[("tonight", "variants_vs_reference")] is None  # EQUIVALENT passes
    sp = cases[("vs_baseline", "sp")]
    assert sp.get("type") == "regression" and sp.text == "DIVERGENT: gsm8k acc: McNemar p 0.03"
    tp = cases[("vs_baseline", "tp")]
    assert tp.get("type") == "error" and tp.get("message") == "compare.json of night-0 is unreadable"
    assert cases[("vs_baseline", "legacy")] is None
    assert cases[("series", "gsm8k[acc].sp")].get("type") == "regression"
    # a flagged regression that is no longer open is a passing case
    closed = _regression_night().model_copy(update={"changes": [NightlyDocument.model_validate({"run_id": "n", "changes": [change("flagged", "acc fell", open_=False)]}).changes[0]], "vs_baseline": []})
    assert _cases(render_night_junit(closed))[("series", "gsm8k[acc].sp")] is None


def test_junit_of_tonights_own_verdict():
    inconclusive = NightlyDocument(run_id="n", status="INCONCLUSIVE", verdict="INCONCLUSIVE", paths="sp ran the legacy path")
    failure = _cases(render_night_junit(inconclusive))[("tonight", "variants_vs_reference")]
    assert failure.get("type") == "inconclusive" and failure.text == "sp ran the legacy path"
    divergent = NightlyDocument(run_id="n", status="REGRESSION", verdict="DIVERGENT")
    failure = _cases(render_night_junit(divergent))[("tonight", "variants_vs_reference")]
    assert failure.get("type") == "regression" and failure.text == "verdict DIVERGENT"
