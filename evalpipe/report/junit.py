"""junit.xml: one test case per gate result, so a CI system can show and gate on them.

Suites are comparisons ("evalpipe.<reference>-vs-<variant>"), cases are gates
(classname "<variant>.<task>", name "<gate>" or "<gate>[<metric>]"), plus one case
for the paths (classname "<variant>.path", name "expectations"): it fails (type
"inconclusive") when an expectation failed or both sides ran the same code, passes
when each side's path is verified, and is skipped, with the note, when the probes
recorded nothing. A comparison with a side read without its manifest (`compare
--unverified`) gets a failing case for it (classname "<variant>.artifacts", name
"verified", type "unverified"). A comparison without gate results (nothing to compare) gets one
"verdict" case that fails unless its status is IDENTICAL or EQUIVALENT, so it still
gates; so does an INCONCLUSIVE comparison none of whose other cases failed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any, NamedTuple

from evalpipe.documents.comparison import NOT_RECORDED, PASSING, VERIFIED, Comparison, ComparisonDocument, GateResult, Status
from evalpipe.number_format import fmt_num

PASSING_STATUSES = {s.value for s in PASSING}
INCONCLUSIVE = Status.INCONCLUSIVE.value
# Characters XML 1.0 cannot hold at all, not even as character references.
_INVALID_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: Any) -> str:
    """Text safe to put in an XML attribute or element: invalid characters shown as \\uXXXX."""
    return _INVALID_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", "" if text is None else str(text))


def _case_name(g: GateResult) -> str:
    return f"{g.gate}[{g.metric}]" if g.metric else g.gate


def _failure_text(g: GateResult) -> str:
    values = f"measured {fmt_num(g.measured)}, threshold {fmt_num(g.threshold)}, A/A value {fmt_num(g.aa_value)}"
    return "\n".join([values, *g.evidence])


class Case(NamedTuple):
    classname: str
    name: str
    outcome: str  # "pass", "fail" or "skip"
    message: str
    text: str
    kind: str = "gate"  # the failure's type


def _gate_cases(variant: str, gates: Iterable[GateResult]) -> list[Case]:
    return [Case(f"{variant}.{g.task}", _case_name(g), g.status, g.detail, _failure_text(g)) for g in gates]


def _path_case(variant: str, c: Comparison) -> Case | None:
    """The paths' case; None for a comparison whose paths were not judged."""
    if c.paths is None:
        return None
    reasons = c.paths.reasons
    first = reasons[0] if reasons else f"path status {c.paths.status}"
    outcome = {VERIFIED: "pass", NOT_RECORDED: "skip"}.get(c.paths.status, "fail")
    return Case(f"{variant}.path", "expectations", outcome, first, "\n".join(reasons), "inconclusive")


def _unverified_case(variant: str, c: Comparison) -> Case | None:
    """The case of the sides compared without their manifest; None for a verified comparison."""
    if not c.unverified:
        return None
    first = c.reasons[0] if c.reasons else f"compared unverified: {', '.join(c.unverified)}"
    return Case(f"{variant}.artifacts", "verified", "fail", first, first, "unverified")


def _verdict_case(variant: str, c: Comparison) -> Case:
    outcome = "pass" if c.status in PASSING_STATUSES else "fail"
    kind = "inconclusive" if c.status == INCONCLUSIVE else "gate"
    return Case(variant, "verdict", outcome, c.status, "\n".join(c.reasons), kind)


def _cases(c: Comparison) -> list[Case]:
    cases = _gate_cases(c.variant, c.gates)
    for extra in (_path_case(c.variant, c), _unverified_case(c.variant, c)):
        if extra is not None:
            cases.append(extra)
    # without gates the verdict is the only case; an INCONCLUSIVE comparison must fail CI even
    # when its gates passed and its paths were not judged
    unfailed_inconclusive = c.status == INCONCLUSIVE and all(k.outcome != "fail" for k in cases)
    if not c.gates or unfailed_inconclusive:
        cases.append(_verdict_case(c.variant, c))
    return cases


def render_junit(compare: ComparisonDocument) -> str:
    """junit.xml text (UTF-8, with declaration) of a comparison."""
    root = ET.Element("testsuites", name=xml_text(f"evalpipe.{compare.run_id}"))
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for c in compare.comparisons:
        suite = ET.SubElement(root, "testsuite", name=xml_text(f"evalpipe.{c.reference}-vs-{c.variant}"))
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
