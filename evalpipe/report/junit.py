"""junit.xml: one test case per gate result, so a CI system can show and gate on them.

Suites are comparisons ("evalpipe.<reference>-vs-<variant>"), cases are gates
(classname "<variant>.<task>", name "<gate>" or "<gate>[<metric>]"). A comparison
without gate results (compare.json from before gates existed) gets one "verdict" case
that fails unless its status is IDENTICAL or EQUIVALENT, so such a file still gates.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any

from evalpipe.report.view import as_dict, fmt_num

PASSING_STATUSES = {"IDENTICAL", "EQUIVALENT"}
# Characters XML 1.0 cannot hold at all, not even as character references.
_INVALID_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: Any) -> str:
    """Text safe to put in an XML attribute or element: invalid characters shown as \\uXXXX."""
    return _INVALID_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", "" if text is None else str(text))


def _case_name(g: Mapping[str, Any]) -> str:
    gate = str(g.get("gate", "gate"))
    return f"{gate}[{g['metric']}]" if g.get("metric") else gate


def _failure_text(g: Mapping[str, Any]) -> str:
    values = (
        f"measured {fmt_num(g.get('measured'))}, threshold {fmt_num(g.get('threshold'))}, "
        f"A/A value {fmt_num(g.get('aa_value'))}"
    )
    return "\n".join([values, *(str(e) for e in g.get("evidence") or ())])


def _cases(c: Mapping[str, Any]) -> Iterable[tuple[str, str, str, str, str]]:
    """(classname, name, outcome "pass" / "fail" / "skip", message, text) per test case."""
    variant = str(c.get("variant", c.get("b", "")))
    gates = list(c.get("gates") or ())
    for g in gates:
        # a status other than pass/skip (a hand-edited compare.json) fails: the file gates CI
        outcome = str(g.get("status", "skip"))
        outcome = outcome if outcome in ("pass", "skip") else "fail"
        yield f"{variant}.{g.get('task', '')}", _case_name(g), outcome, str(g.get("detail") or ""), _failure_text(g)
    if not gates:
        status = str(c.get("status", ""))
        outcome = "pass" if status in PASSING_STATUSES else "fail"
        reasons = [str(r) for r in c.get("reasons") or ()]
        yield variant, "verdict", outcome, status, "\n".join(reasons)


def render_junit(compare: Any) -> str:
    """junit.xml text (UTF-8, with declaration) for the compare.json dict."""
    compare = as_dict(compare)
    root = ET.Element("testsuites", name=xml_text(f"evalpipe.{compare.get('run_id', '')}"))
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    reference = compare.get("reference", "")
    for c in compare.get("comparisons") or ():
        ref = c.get("reference", c.get("a", reference))
        suite = ET.SubElement(root, "testsuite", name=xml_text(f"evalpipe.{ref}-vs-{c.get('variant', c.get('b', ''))}"))
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for classname, name, outcome, message, text in _cases(c):
            case = ET.SubElement(suite, "testcase", classname=xml_text(classname), name=xml_text(name))
            counts["tests"] += 1
            if outcome == "fail":
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=xml_text(message), type="gate")
                failure.text = xml_text(text)
            elif outcome == "skip":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=xml_text(message))
        suite.set("errors", "0")
        for key, n in counts.items():
            suite.set(key, str(n))
            totals[key] += n
    root.set("errors", "0")
    for key, n in totals.items():
        root.set(key, str(n))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
