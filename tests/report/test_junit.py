"""junit.xml: one suite per comparison, one case per gate, parseable whatever the model wrote."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from report_samples import METRIC, TASK, as_document, comparison, gate, identical_compare, make_compare

from evalpipe.report import render_junit
from evalpipe.report.junit import xml_text


def _suites(xml: str) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.fromstring(xml.encode("utf-8"))
    assert root.tag == "testsuites"
    return root, root.findall("testsuite")


def _counts(el: ET.Element) -> tuple[int, int, int]:
    return int(el.get("tests")), int(el.get("failures")), int(el.get("skipped"))


def test_junit_suites_cases_and_counts():
    second = comparison(
        "sp2", status="EQUIVALENT", gates=[gate("teacher_kl_p99", "pass", 0.001, 0.01), gate("score_mcnemar", "pass", 0.9, 0.05, metric=METRIC)]
    )
    xml = render_junit(as_document(make_compare(comparisons=[comparison(), second])))
    assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    root, suites = _suites(xml)
    assert [s.get("name") for s in suites] == ["evalpipe.legacy-vs-sp", "evalpipe.legacy-vs-sp2"]
    assert _counts(suites[0]) == (6, 2, 1) and _counts(suites[1]) == (2, 0, 0)
    assert _counts(root) == (8, 2, 1) and root.get("errors") == "0"
    cases = suites[0].findall("testcase")
    assert {c.get("classname") for c in cases} == {f"sp.{TASK}"}
    assert [c.get("name") for c in cases] == [
        f"score_equivalence[{METRIC}]", f"score_mcnemar[{METRIC}]", "free_hard_divergences",
        "teacher_kl_p99", "teacher_kl_max", "teacher_hard_top1_flips",
    ]
    kl_max = next(c for c in cases if c.get("name") == "teacher_kl_max")
    failure = kl_max.find("failure")
    assert failure.get("message") == "KL 0.3 > 0.1 at doc 5 pos 7"
    assert "measured 0.3, threshold 0.1, A/A value 0.01" in failure.text and "doc 5 repeat 0 pos 7" in failure.text
    skipped = next(c for c in cases if c.get("name") == "teacher_hard_top1_flips").find("skipped")
    assert skipped.get("message") == "no teacher-forced data for this task"
    passed = next(c for c in cases if c.get("name") == "teacher_kl_p99")
    assert list(passed) == []


def test_junit_survives_any_model_text():
    nasty = "a\x00b\x1bc <x> & \"q\" ]]> \ud800 \n"
    c = comparison(gates=[gate("teacher_kl_max", "fail", 0.3, 0.1, detail=nasty, evidence=[nasty], task=nasty)])
    _, suites = _suites(render_junit(as_document(make_compare(comparisons=[c]))))
    case = suites[0].find("testcase")
    failure = case.find("failure")
    assert failure.get("message") == "a\\u0000b\\u001bc <x> & \"q\" ]]> \\ud800 \n"
    assert "a\\u0000b\\u001bc <x> & \"q\" ]]>" in failure.text
    assert case.get("classname").startswith("sp.a\\u0000b")


def test_junit_without_gates_has_one_verdict_case():
    _, suites = _suites(render_junit(as_document(identical_compare())))
    case = suites[0].find("testcase")
    assert (case.get("classname"), case.get("name"), list(case)) == ("sp", "verdict", [])
    divergent = dict(identical_compare())
    divergent["comparisons"] = [dict(divergent["comparisons"][0], status="DIVERGENT", reasons=["tokens differ"])]
    root, suites = _suites(render_junit(as_document(divergent)))
    assert _counts(root) == (1, 1, 0)
    failure = suites[0].find("testcase").find("failure")
    assert failure.get("message") == "DIVERGENT" and failure.text == "tokens differ"


def test_xml_text():
    assert xml_text("ok\ttab\nnl") == "ok\ttab\nnl"
    assert xml_text("\x0b\ufffe\U0001F600") == "\\u000b\\ufffe\U0001F600"
    assert xml_text(None) == ""
