"""Every renderer against hostile text in every field it shows.

The compare dict of report_samples.py gets the payloads of payloads.py (both tests/support/) appended to
every string (task and metric names, variant names, questions, targets, responses,
token texts, reasons, gate details and evidence, run.json values), and the id-like
numbers (doc ids, token ids, gate values) become text with payloads too, as a
hand-edited or foreign compare.json could hold. Then, per format, what the payloads
must not do: become markup, links or extra table cells (report.md, nightly.md),
elements, attributes or script (report.html, the dashboard), or break the XML
(junit.xml, nightly-junit.xml).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from dashboard_samples import render, sample_history
from html_page import Page, parse_page
from payloads import CDATA_END, CONTROLS, SCRIPT, TEMPLATE, TEXT, VISIBLE
from pydantic import ValidationError
from report_samples import RUN_INFO, as_document, as_run, make_compare, score_row

from evalpipe import report
from evalpipe.compare.code_paths import short
from evalpipe.documents.nightly_doc import NightlyDocument
from evalpipe.report import md_escape, render_junit
from evalpipe.report.nightly import render_night_junit, render_night_summary
from tests.report.test_nightly import change
from tests.report.test_what_ran import inconclusive_comparison, legacy_summary, sp_summary, summary_text, trap_paths

# Numbers a renderer formats as text (ids, positions, gate values): poisoned as strings.
ID_LIKE = {"doc_id", "repeat", "pos", "token_a", "token_b", "score_a", "score_b", "measured", "threshold", "aa_value"}
ID_LISTS = {"topk_ids_a", "topk_ids_b", "hard_divergences", "top1_hard_positions", "kl_max_at"}


def poison_all(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: poison_all(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [poison_all(v, "doc_id" if key in ID_LISTS else key) for v in value]
    if isinstance(value, str):
        return value + TEXT
    if key in ID_LIKE and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value}{TEXT}"
    return value


# Fields of compare.json that hold one of a few values (the typed document refuses any other)
ENUM_KEYS = {"status", "outputs_status"}


def typed(value: Any, key: str | None = None) -> Any:
    """A poisoned compare dict as the typed document holds it: numbers and enumerations back
    to what they were, every free text still poisoned (the only place model text can be)."""
    if isinstance(value, dict):
        return {k: typed(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v, "doc_id" if key in ID_LISTS else key) for v in value]
    if isinstance(value, str) and value.endswith(TEXT) and key in ENUM_KEYS | ID_LIKE:
        bare = value[: -len(TEXT)]
        return bare if key in ENUM_KEYS else float(bare) if "." in bare or "e" in bare else int(bare)
    return value


def render_markdown(compare: dict, run_info: dict | None = None) -> str:
    return report.render_markdown(as_document(typed(compare)), as_run(run_info))


def render_html(compare: dict, run_info: dict | None = None, **kw: Any) -> str:
    return report.render_html(as_document(typed(compare)), as_run(run_info), **kw)


@pytest.fixture(scope="module")
def hostile() -> dict:
    return poison_all(make_compare())


# The maps of a what-ran summary whose keys are names the engine chose: roles, classes, switches, functions,
# collective kinds and counts. A plugin can name a class anything.
NAMED_KEYS = {"processes", "layers", "switches", "calls", "collectives_per_forward", "counts"}
HOSTILE_LAYER = f"evalpipe.lab.layout.model.LayoutDecoderLayer{TEXT}"


def poison_names(value: Any, parent: str | None = None) -> Any:
    if isinstance(value, dict):
        return {(f"{k}{TEXT}" if parent in NAMED_KEYS else k): poison_names(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [poison_names(v, parent) for v in value]
    return value


@pytest.fixture(scope="module")
def hostile_paths() -> dict:
    """An INCONCLUSIVE run whose path records and judgement hold the payloads in every name and value."""
    a, b = legacy_summary(), sp_summary()
    b["switches"]["tp_rank"] = {"per_process": [0, TEXT]}
    b["absent"] = [next(iter(b["calls"]))]
    paths = dict(trap_paths(), what_ran={"a": a, "b": b})
    paths = poison_names(poison_all(paths))
    paths["status"] = "failed"
    variant = "sp" + TEXT
    c = inconclusive_comparison(paths, variant, outputs_status="IDENTICAL" + TEXT)
    aa = inconclusive_comparison(paths, "legacy-aa" + TEXT)
    return make_compare(status="INCONCLUSIVE", variants=[variant], comparisons=[c], noise_floor=aa)


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def assert_inert_markdown(md: str) -> None:
    """No HTML but <br>, no link, no control character, every table row as wide as its header,
    no line started by untrusted text (a heading, a list item, a table row)."""
    assert "<" not in md.replace("<br>", ""), "raw HTML in Markdown"
    assert not re.search(r"(?<!\\)\]\(", md), "a Markdown link"
    assert not _CONTROL.search(md), "a control character"
    for line in md.splitlines():
        assert not line.startswith(("# not", "| --- |", "{{", "```")), f"untrusted text starts a line: {line[:80]!r}"
    block: list[str] = []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            widths = {_unescaped_pipes(row) for row in block}
            assert len(widths) == 1, f"table rows of different widths {widths}: {block[0][:80]!r}"
        block = []


def test_report_md_keeps_hostile_text_inert(hostile):
    md = render_markdown(hostile, poison_all(RUN_INFO))
    assert_inert_markdown(md)
    # shown, escaped: the reader sees the text
    for payload in (SCRIPT, CDATA_END, TEMPLATE):
        assert md_escape(payload) in md
    assert "{{ 7\\*7 }}" in md and "\\u0000\\u0008\\u000b\\u001b" in md


def test_gate_status_and_ids_hold_no_text(hostile):
    """The fields that used to reach report.md raw (a gate's status, token and top-k ids, doc
    ids, gate values) are typed: a compare.json with text there is refused before any rendering."""
    with pytest.raises(ValidationError) as err:
        report.render_markdown(as_document(hostile), as_run(RUN_INFO))
    fields = {e["loc"][-1] for e in err.value.errors()}
    assert {"status", "measured", "doc_id", "token_a"} <= fields


def test_what_ran_md_keeps_hostile_names_inert(hostile_paths):
    md = render_markdown(hostile_paths, {})
    section = md[md.index("## What ran") : md.index("## Run")]
    assert_inert_markdown(md)
    assert md_escape(f"3 \u00d7 {short(HOSTILE_LAYER)}") in section  # a class name, shortened and escaped
    assert md_escape(f"0 | {TEXT}") in section  # per-process values
    assert md_escape(f"{TEXT} per forward pass") in section.replace("all\\_gather", "")  # a collective kind
    assert md_escape("variant `legacy` was expected to build") in section and md_escape(SCRIPT) in section


def test_nightly_md_keeps_hostile_text_inert():
    md = render_night_summary(_hostile_judgement(), dashboard=TEXT)  # type: ignore[arg-type]
    assert_inert_markdown(md)
    assert md_escape(SCRIPT) in md


# ---------------------------------------------------------------------------
# HTML (report.html, dashboard)
# ---------------------------------------------------------------------------


def assert_inert_html(html: str, allowed_tags: set[str]) -> Page:
    page = parse_page(html)
    tags = {t for t, _ in page.starts}
    assert tags <= allowed_tags, f"elements from the data: {tags - allowed_tags}"
    for tag, attrs in page.starts:
        assert not [a for a in attrs if a.startswith("on")], f"event handler on <{tag}>"
        assert attrs.get("id") not in ("pwned", "pwned-link")
        for url_attr in ("href", "src"):
            url = (attrs.get(url_attr) or "").strip().lower()
            assert not url.startswith(("javascript:", "data:text", "vbscript:")), f"<{tag} {url_attr}={url[:40]!r}>"
    assert not _CONTROL.search(html)
    return page


REPORT_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "h4", "section", "p", "b", "i",
               "ul", "li", "span", "div", "table", "tr", "th", "td", "code", "img"}


def test_report_html_keeps_hostile_text_inert(hostile):
    html = render_html(hostile, poison_all(RUN_INFO))
    page = assert_inert_html(html, REPORT_TAGS)
    assert all(a["src"].startswith("data:image/png;base64,") for t, a in page.starts if t == "img")
    text = "".join(page.texts)
    for payload in VISIBLE:
        assert payload in text, f"not shown literally: {payload!r}"
    assert "\\u0000\\u0008\\u000b\\u001b[31m" in text


def test_what_ran_html_keeps_hostile_names_inert(hostile_paths):
    html = render_html(hostile_paths, {}, plots=False)
    assert_inert_html(html, REPORT_TAGS)
    section = parse_page(html[html.index('<section id="what-ran">') : html.index('<section id="run">')])
    text = "".join(section.texts)
    assert f"3 \u00d7 {short(HOSTILE_LAYER)}".replace("\x00\x08\x0b\x1b", "\\u0000\\u0008\\u000b\\u001b") in text
    for payload in VISIBLE:
        assert payload in text, f"not shown literally: {payload!r}"


def test_what_ran_terminal_and_junit_keep_hostile_names_inert(hostile_paths):
    out = summary_text(typed(hostile_paths))
    assert "what ran" in out and SCRIPT in out
    assert not _CONTROL.search(out.replace("\n", "")), "a control character from the records reached the terminal"
    root = _parse_xml(render_junit(as_document(typed(hostile_paths))))
    failure = next(c for c in root.iter("testcase") if c.get("name") == "expectations").find("failure")
    assert failure.get("type") == "inconclusive" and SCRIPT in failure.get("message")


DASHBOARD_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "h4", "section", "p",
                  "b", "i", "ul", "li", "span", "div", "table", "tr", "th", "td", "code", "a", "article", "figure",
                  "figcaption", "br", "svg", "rect", "line", "text", "path", "circle", "g"}


def test_dashboard_keeps_hostile_text_inert():
    data = poison_text(sample_history(n_nights=6, change_at=3))
    page = assert_inert_html(render(data), DASHBOARD_TAGS)
    # every link kept is the page's own: relative report paths (poisoned ones are dropped) and chart anchors
    hrefs = [a.get("href") for t, a in page.starts if t == "a"]
    assert all(h and (h.startswith("#chart-") or not re.match(r"^[a-z]+:", h)) for h in hrefs)
    text = "".join(page.texts)
    for payload in VISIBLE:
        assert payload in text, f"not shown literally: {payload!r}"


# ---------------------------------------------------------------------------
# JUnit XML
# ---------------------------------------------------------------------------


def _parse_xml(xml: str) -> ET.Element:
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f]", xml), "a character XML 1.0 forbids"
    return ET.fromstring(xml.encode("utf-8"))  # raises on anything not well-formed


def test_junit_stays_well_formed_with_hostile_text(hostile):
    root = _parse_xml(render_junit(as_document(typed(hostile))))
    failures = root.findall(".//failure")
    assert failures
    # the text survives as text: a reader of the CI result sees what the model wrote
    assert any(SCRIPT in (f.get("message") or "") and CDATA_END in (f.get("message") or "") for f in failures)
    assert any("\\u0000\\u0008\\u000b\\u001b[31m" in (f.text or "") for f in failures)
    names = [c.get("name") for c in root.iter("testcase")]
    assert all(SCRIPT in n for n in names)


def test_nightly_junit_stays_well_formed_with_hostile_text():
    root = _parse_xml(render_night_junit(_hostile_judgement()))
    texts = [f.text or "" for f in root.iter("failure")]
    assert texts and any(SCRIPT in t and CDATA_END in t for t in texts)
    assert all(CONTROLS not in t for t in texts)


# The fields of a night's judgement and the dashboard's data that hold one of a few values
# (the typed documents refuse any other): every other text is poisoned.
NIGHT_ENUMS = {"status", "verdict", "outputs_status", "state", "kind", "direction"}


def poison_text(value: Any, key: str | None = None) -> Any:
    """``value`` with the payloads appended to every free text, enumerations left as they are."""
    if isinstance(value, dict):
        return {k: poison_text(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [poison_text(v, key) for v in value]
    if isinstance(value, str) and key not in NIGHT_ENUMS:
        return value + TEXT
    return value


def _hostile_judgement() -> NightlyDocument:
    vs = {"variant": "sp", "baseline": "run-1", "status": "DIVERGENT", "reasons": ["acc fell"],
          "scores": [score_row(task="gsm8k", metric="acc", a_right_b_wrong=3, a_wrong_b_right=0, mcnemar_p=0.01, alpha=0.05)]}
    err = {"variant": "tp", "baseline": "run-1", "error": "cannot compare"}
    return NightlyDocument.model_validate(poison_text({
        "run_id": "night-1", "status": "REGRESSION", "verdict": "DIVERGENT", "baseline": "run-1",
        "reasons": ["strict-match fell"], "vs_baseline": [vs, err], "changes": [change("flagged", "acc fell")]}))
