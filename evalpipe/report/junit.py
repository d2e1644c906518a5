"""junit.xml: one test case per gate result, so a CI system can show and gate on them.

Suites are comparisons ("evalpipe.<reference>-vs-<variant>"), cases are gates
(classname "<variant>.<task>", name "<gate>" or "<gate>[<metric>]"), plus one case
for the paths (classname "<variant>.path", name "expectations"): it fails (type
"inconclusive") when an expectation failed or both sides ran the same code, passes
when each side's path is verified, and is skipped, with the note, for a run from
before the path probes. A comparison without gate results (compare.json from before
gates existed) gets one "verdict" case that fails unless its status is IDENTICAL or
EQUIVALENT, so such a file still gates; so does an INCONCLUSIVE comparison none of
whose other cases failed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from evalpipe.compare.code_paths import NOT_RECORDED, VERIFIED
from evalpipe.compare.verdict import PASSING, Status
from evalpipe.report.view import as_dict, fmt_num, path_judgement, path_reasons, variant_of

PASSING_STATUSES = {s.value for s in PASSING}
INCONCLUSIVE = Status.INCONCLUSIVE.value
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


class Case(NamedTuple):
    classname: str
    name: str
    outcome: str  # "pass", "fail" or "skip"
    message: str
    text: str
    kind: str = "gate"  # the failure's type


def _gate_cases(variant: str, gates: Iterable[Mapping[str, Any]]) -> list[Case]:
    cases = []
    for g in gates:
        # a status other than pass/skip (a hand-edited compare.json) fails: the file gates CI
        outcome = str(g.get("status", "skip"))
        outcome = outcome if outcome in ("pass", "skip") else "fail"
        cases.append(Case(f"{variant}.{g.get('task', '')}", _case_name(g), outcome, str(g.get("detail") or ""),
                          _failure_text(g)))
    return cases


def _path_case(variant: str, c: Mapping[str, Any]) -> Case | None:
    """The paths' case; None for compare.json from before the path probes."""
    paths = path_judgement(c)
    if paths is None:
        return None
    reasons = path_reasons(c)
    first = reasons[0] if reasons else f"path status {paths.get('status')}"
    outcome = {VERIFIED: "pass", NOT_RECORDED: "skip"}.get(str(paths.get("status")), "fail")
    return Case(f"{variant}.path", "expectations", outcome, first, "\n".join(reasons), "inconclusive")


def _verdict_case(variant: str, c: Mapping[str, Any]) -> Case:
    status = str(c.get("status", ""))
    outcome = "pass" if status in PASSING_STATUSES else "fail"
    kind = "inconclusive" if status == INCONCLUSIVE else "gate"
    return Case(variant, "verdict", outcome, status, "\n".join(str(r) for r in c.get("reasons") or ()), kind)


def _cases(c: Mapping[str, Any]) -> list[Case]:
    variant = variant_of(c)
    gates = list(c.get("gates") or ())
    cases = _gate_cases(variant, gates)
    path = _path_case(variant, c)
    if path is not None:
        cases.append(path)
    # without gates the verdict is the only case; an INCONCLUSIVE comparison must fail CI even
    # when its gates passed and its paths entry is missing or hand-edited
    unfailed_inconclusive = c.get("status") == INCONCLUSIVE and all(k.outcome != "fail" for k in cases)
    if not gates or unfailed_inconclusive:
        cases.append(_verdict_case(variant, c))
    return cases


def render_junit(compare: Any) -> str:
    """junit.xml text (UTF-8, with declaration) for the compare.json dict."""
    compare = as_dict(compare)
    root = ET.Element("testsuites", name=xml_text(f"evalpipe.{compare.get('run_id', '')}"))
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    reference = compare.get("reference", "")
    for c in compare.get("comparisons") or ():
        ref = c.get("reference", c.get("a", reference))
        suite = ET.SubElement(root, "testsuite", name=xml_text(f"evalpipe.{ref}-vs-{variant_of(c)}"))
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for k in _cases(c):
            case = ET.SubElement(suite, "testcase", classname=xml_text(k.classname), name=xml_text(k.name))
            counts["tests"] += 1
            if k.outcome == "fail":
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=xml_text(k.message), type=k.kind)
                failure.text = xml_text(k.text)
            elif k.outcome == "skip":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=xml_text(k.message))
        suite.set("errors", "0")
        for key, n in counts.items():
            suite.set(key, str(n))
            totals[key] += n
    root.set("errors", "0")
    for key, n in totals.items():
        root.set(key, str(n))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
