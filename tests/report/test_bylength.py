"""The "Per length" sections of report.md and report.html (their plots are pinned in
test_plots.py, the terminal line in test_terminal.py).

The compare.json dicts come from real comparisons of the hand-built long-context runs of
tests/compare/test_bylength.py (legacy vs sp, sp broken only at length 2049, with an A/A run).
"""

from __future__ import annotations

import base64
import copy
import re

import pytest
from fakes import make_samples, set_token, write_run
from html_page import parse_page
from report_samples import HOSTILE, NASTY, PNG_MAGIC, as_document, long_run_compare, render_html, render_markdown

from evalpipe.pipeline.comparing import compare_run
from evalpipe.report.terminal import length_lines
from tests.compare.test_bylength import (
    apply,
    broken_at_2049,
    meta,
    write_long_run,
)


@pytest.fixture(scope="module")
def md(long_compare) -> str:
    return render_markdown(long_compare, {})


@pytest.fixture(scope="module")
def html(long_compare) -> str:
    return render_html(long_compare, {})


def _section(text: str, start: str, end: str) -> str:
    i = text.index(start)
    j = text.find(end, i + len(start))
    return text[i : j if j >= 0 else len(text)]


def _md_table(section: str, first_header: str) -> list[list[str]]:
    lines = section[section.index(f"| {first_header} |"):].splitlines()
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


# ---------------------------------------------------------------------------
# report.md
# ---------------------------------------------------------------------------


def test_markdown_per_length_table(md):
    sec = _section(md, "#### Per length: longctx\\_passkey", "\n#### ")
    rows = _md_table(sec, "length")
    header, sep, body = rows[0], rows[1], rows[2:]
    assert header[:5] == ["length", "kind (tags)", "items", "legacy score", "sp score"]
    assert "TF KL max prompt / cont." in header and "A/A TF KL max prompt / cont." in header
    assert "TF max \\|Δlogprob\\| prompt / cont." in header and "TF hard top-1 flips prompt / cont." in header
    assert sep[:3] == ["---", "---", "---:"]
    assert [r[0] for r in body] == ["1024", "**2047**", "2048", "**2049**"]  # edge-case lengths in bold
    col = {h: i for i, h in enumerate(header)}
    by_len = {r[0].strip("*"): r for r in body}
    bad = by_len["2049"]
    assert bad[col["kind (tags)"]] == "**edge (tp4:1,block+1)**"
    assert bad[col["items"]] == "4 in 2 clusters"
    assert bad[col["Δ \\[95% CI\\]"]].startswith("+0.500 \\[")
    assert bad[col["free-running diverged (hard)"]] == "1/4 (1 hard)"
    assert bad[col["TF hard top-1 flips prompt / cont."]] == "0 / 1"
    kl_prompt, kl_cont = bad[col["TF KL max prompt / cont."]].split(" / ")
    assert float(kl_prompt) > 0 and kl_cont != "0"
    for length in ("1024", "2047", "2048"):
        r = by_len[length]
        assert r[col["TF KL max prompt / cont."]] == "0 / 0", length
        assert r[col["Δ \\[95% CI\\]"]] == "0 \\[0, 0\\]" and r[col["McNemar p"]] == "1"
    # the A/A floor per length: only the 1024 item of legacy-aa moved (a continuation position)
    assert by_len["1024"][col["A/A TF KL max prompt / cont."]].startswith("0 / ")
    assert by_len["1024"][col["A/A TF KL max prompt / cont."]] != "0 / 0"
    assert by_len["2049"][col["A/A TF KL max prompt / cont."]] == "0 / 0"
    assert "Scores: exact\\_match,strict-match." in sec


def test_markdown_per_depth_table(md):
    sec = _section(md, "#### Per length: longctx\\_passkey", "\n#### ")
    rows = _md_table(sec[sec.index("Per needle depth:"):], "depth")
    assert [r[0].split()[0] for r in rows[2:]] == ["0.1", "0.5", "0.9"]
    assert rows[2][1] == "1024–2049 (4)"


def test_markdown_order_of_sections(md):
    order = [md.index(s) for s in ("### Task longctx\\_passkey", "| tokens |", "#### Per length: longctx\\_passkey",
                                   "#### Items whose score changed")]
    assert order == sorted(order)


def test_markdown_and_html_escape_length_tags(tmp_path):
    def hostile(doc):
        return {**meta(doc), "length_tags": NASTY if doc % 2 else HOSTILE}

    compare = long_run_compare(tmp_path, doc_meta=hostile)
    md = render_markdown(compare, {})
    sec = _section(md, "#### Per length:", "\n#### ")
    assert "<script>" not in sec and "x | y" not in sec
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in sec and "x \\| y \\`rm -rf\\`" in sec
    # every row of the length table keeps its cell count
    rows = _md_table(sec, "length")
    assert len({len(r) for r in rows}) == 1
    html = render_html(compare, {})
    assert "<script" not in html and "alert(1)</script>" not in html
    page = parse_page(html)
    tags = [t for t, _ in page.starts]
    assert tags.count("td") == page.ends.count("td") and tags.count("tr") == page.ends.count("tr")
    assert any(HOSTILE.split("\n")[0] in t for t in page.texts)


def test_gsm8k_like_reports_have_no_per_length_section(tmp_path):
    s = make_samples(6)
    run = write_run(tmp_path / "run", {"legacy": s, "sp": apply(s, [2], set_token(2, 7), task=s[0].task)})
    compare = compare_run(run).doc.model_dump(mode="json")
    assert "by_length" not in compare["comparisons"][0]
    assert "Per length" not in render_markdown(compare, {})
    html = render_html(compare, {})
    assert "Per length" not in html and "against prompt length" not in html
    assert length_lines(as_document(compare)) == []


def test_markdown_is_deterministic(long_compare, md):
    assert render_markdown(copy.deepcopy(long_compare), {}) == md


# ---------------------------------------------------------------------------
# report.html
# ---------------------------------------------------------------------------


def test_html_per_length_table_marks_edge_rows(html):
    sec = _section(html, "<h4>Per length: longctx_passkey</h4>", "<h4>Items whose score changed")
    assert sec.count('<tr class="edge">') == 2  # 2047 and 2049; depth rows are never edge
    assert "<th>A/A TF KL max prompt / cont.</th>" in sec
    assert '<tr class="edge"><td>2049</td><td>edge (tp4:1,block+1)</td>' in sec


def test_html_has_length_and_depth_plots(html):
    sec = _section(html, "<h4>Per length: longctx_passkey</h4>", "<h4>Items whose score changed")
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', sec)
    assert [a for a, _ in imgs] == [
        "KL max and max |Δlogprob| (teacher-forced) against prompt length",
        "KL max and max |Δlogprob| (teacher-forced) against needle depth",
    ]
    assert all(base64.b64decode(b).startswith(PNG_MAGIC) for _, b in imgs)


def test_html_says_why_a_plot_is_missing(long_compare):
    c = copy.deepcopy(long_compare)
    for comp in [c["noise_floor"], *c["comparisons"]]:
        for entry in comp["by_length"]:
            for r in entry["lengths"] + entry["depths"]:
                for part in ("free", "teacher", "teacher_prompt", "teacher_continuation"):
                    if r.get(part):
                        r[part].update(kl_max=0.0, max_abs_dlogprob=0.0)
    html = render_html(c, {})
    assert "data:image/png;base64" not in _section(html, "<h4>Per length:", "<h4>Items whose")
    assert "nothing to plot against prompt length" in html and "nothing to plot against needle depth" in html


# ---------------------------------------------------------------------------
# other shapes of the rows
# ---------------------------------------------------------------------------


def test_without_teacher_the_section_uses_free_running_figures(tmp_path):
    variants = {name: (s, None) for name, (s, _) in broken_at_2049().items()}
    compare = compare_run(write_long_run(tmp_path / "run", variants)).doc.model_dump(mode="json")
    md = render_markdown(compare, {})
    sec = _section(md, "#### Per length:", "\n#### ")
    header = _md_table(sec, "length")[0]
    assert "free-running KL max" in header and "free-running max \\|Δlogprob\\|" in header
    assert not any("TF" in h or "A/A" in h for h in header)
    html = render_html(compare, {})
    assert "(free-running) against prompt length" in html
