"""report.html: self-contained, escaped, the markdown's content in the same order, inline plots."""

from __future__ import annotations

import base64
import copy
import re

import pytest
from html_page import parse_page
from report_samples import (
    HOSTILE,
    PNG_MAGIC,
    RUN_INFO,
    comparison,
    flipped,
    gate,
    identical_compare,
    make_compare,
    render_html,
    score_row,
    teacher_summary,
    worst,
)

from evalpipe.report.html import html_text


@pytest.fixture(scope="module")
def html() -> str:
    """The report of make_compare(), rendered once: matplotlib makes every render take a fraction of a second."""
    return render_html(make_compare(), RUN_INFO)


def _hostile_compare() -> dict:
    """Hostile text everywhere a model, a dataset or a config can put text."""
    w = worst("largest_kl", 5, 7, kl=0.3, context=HOSTILE, response_a=HOSTILE, response_b=HOSTILE + "\x00\x1b",
              target=HOSTILE, token_text_a=HOSTILE, topk_texts_b=[HOSTILE, "b", "c"])
    row = score_row(flipped=[dict(flipped(2, HOSTILE), question=HOSTILE, target=HOSTILE, answer_b=HOSTILE)])
    c = comparison(
        reasons=[HOSTILE],
        scores=[row],
        teacher=[teacher_summary(worst_kl=[w])],
        gates=[gate("teacher_kl_max", "fail", 0.3, 0.1, detail=HOSTILE, evidence=[HOSTILE])],
    )
    return make_compare(comparisons=[c])


def test_html_escapes_all_model_and_dataset_text():
    html = render_html(_hostile_compare(), dict(RUN_INFO, model={"name": HOSTILE}))
    # nothing of the hostile text survives unescaped
    assert "<script" not in html and "alert(1)</script>" not in html
    assert "</td> &" not in html and '"dq"' not in html and "'sq'" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &lt;/td&gt; &amp; &#34;dq&#34; &#39;sq&#39;\nnext line" in html
    assert "\x00" not in html and "\x1b" not in html and "\\u0000\\u001b" in html
    page = parse_page(html)
    tags = [t for t, _ in page.starts]
    assert "script" not in tags
    # the hostile text reads back as text, whole, in every place it was put
    assert sum(HOSTILE in t for t in page.texts) >= 10
    # table structure intact: every cell opened is closed
    assert tags.count("td") == page.ends.count("td") and tags.count("tr") == page.ends.count("tr")


def test_html_is_self_contained(html):
    assert "http://" not in html and "https://" not in html and "url(" not in html and "@import" not in html
    page = parse_page(html)
    assert not {"script", "link", "iframe", "object"} & {t for t, _ in page.starts}
    srcs = [a.get("src") or "" for t, a in page.starts if t == "img"]
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not any(k.startswith("on") for _, a in page.starts for k in a)


def test_html_verdict_badge_and_same_order_as_markdown(html):
    assert '<h2>Verdict <span class="badge divergent">DIVERGENT</span></h2>' in html
    assert '<span class="badge equivalent">EQUIVALENT</span>' in html  # the A/A comparison
    order = [
        html.index(s)
        for s in ('id="verdict"', 'id="gates"', 'id="run"', 'class="comparison"', "<h3>Task", "Items whose score changed",
                  "Earliest divergences (free-running)", "Largest KL (teacher-forced)")
    ]
    assert order == sorted(order)
    gates = html[html.index('id="gates"') : html.index('id="run"')]
    statuses = re.findall(r'<td class="gate-(\w+)">', gates)
    assert statuses == ["fail", "fail", "skip", "pass", "pass", "pass"]
    assert "2 of 6 gates failed, 1 skipped." in gates


def test_html_tables_match_markdown_content(html):
    assert "<th>teacher-forced A/A</th>" in html
    assert '<td class="num">1e-06 / 0.004 / 0.3</td>' in html
    assert "+0.167 [−0.262, +0.595]" in html
    assert "<b>11 (−1.405)</b>" in html  # the other side's token in the top-k list
    assert "<code>11</code> <span class=\"txt\">&#34;\\n&#34;</span> (−0.9)" in html


def test_html_plots_and_their_absence(html):
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 2
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    old = render_html(identical_compare(), {})
    assert "data:image/png" not in old
    assert "No per-position KL or |Δlogprob| distribution for this task (free-running)." in old
    assert "No free-running divergence: every paired sample generated the same token ids." in old
    assert '<span class="badge identical">IDENTICAL</span>' in old and "No gate was evaluated." in old


def test_html_is_deterministic(html):
    assert render_html(copy.deepcopy(make_compare()), RUN_INFO) == html


def test_html_text_shows_control_characters():
    assert html_text("a\x00b\x1bc\nd\te\u2028") == "a\\u0000b\\u001bc\nd\te\\u2028"
    assert html_text("abcdef", 3) == "abc\u2026"
    assert html_text(None) == ""


def test_a_page_without_plots_says_so_and_keeps_everything_else(html):
    bare = render_html(make_compare(), RUN_INFO, plots=False)
    assert "data:image/png" in html and "data:image/png" not in bare
    assert "Plots were not drawn for this page" in bare
    strip = lambda page: re.sub(r"<figure.*?</figure>|<img[^>]*>|<p class=\"muted\">[^<]*</p>", "", page, flags=re.S)  # noqa: E731
    assert len(bare) < len(html) and strip(bare).count("<table") == strip(html).count("<table")


def test_each_task_heading_carries_its_own_verdict_badge():
    own = [{"task": "gsm8k_synth_4shot", "status": "INCONCLUSIVE", "reasons": ["no prefix-cache hit"],
            "outputs_status": "EQUIVALENT", "gates_failed": 0, "gates_passed": 4}]
    page = render_html(make_compare(comparisons=[comparison(tasks=own)]), RUN_INFO)
    assert '<h3>Task gsm8k_synth_4shot <span class="badge inconclusive">INCONCLUSIVE</span></h3>\n<p>no prefix-cache hit</p>' in page
