"""The nightly dashboard page: content, escaping of untrusted text, edge-case histories.

Pure and fast: the page is parsed with the standard library's HTMLParser, so a
payload that the browser would run shows up here as a real <script>/<img> tag.
tests/report/test_dashboard_browser.py opens the same kind of page in Chromium.
"""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

from dashboard_samples import IMG, INCONCLUSIVE_REASON, SCRIPT, render, run_id, sample_history, synthetic_history

from evalpipe.report.dashboard import DOTS_MAX, FLIPPED_SHOWN, safe_href
from evalpipe.rundir.artifacts import write_text


class Page(HTMLParser):
    """Tags (with attributes) and text of a page, as a browser's parser would see them."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(html)
        self.close()
        self.text = "".join(self.chunks)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.chunks.append(data)

    def having(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[dict[str, str | None]]:
        out = []
        for t, a in self.tags:
            if tag is not None and t != tag:
                continue
            if cls is not None and cls not in (a.get("class") or "").split():
                continue
            if all(a.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                out.append(a)
        return out


def test_sample_page_has_header_timeline_change_and_charts():
    data = sample_history(n_nights=8, change_at=5)
    html = render(data)
    page = Page(html)

    assert page.having("title") and "evalpipe nightly — configs/default.yaml" in page.text
    assert "2025-01-09T06:00:00Z" in page.text and "postgresql://evalpipe@db.example/history" in page.text
    latest = page.having("div", id="latest")
    assert latest and "regression" in latest[0]["class"].split()

    cells = page.having(cls="night")
    assert [c["data-run-id"] for c in cells] == [run_id(i) for i in range(8)]
    assert all(c["href"] == f"runs/{c['data-run-id']}/report.html" for c in cells)
    assert [c["class"].split()[1] for c in cells] == ["pass"] * 5 + ["regression"] * 3
    assert "strict-match fell below the A/A band" in cells[-1]["title"]

    changes = page.having(cls="change")
    assert [c["data-run-id"] for c in changes] == [run_id(5)]
    assert "-4.2 pts" in page.text and "0.482 → 0.44" in page.text and "0.003" in page.text
    # 25 flipped items: the first 20 listed, the rest counted
    assert "Question 19" in page.text and "Question 20" not in page.text
    assert f"and {25 - FLIPPED_SHOWN} more flipped items" in page.text

    charts = page.having("figure", cls="chart")
    assert len(charts) == 2 and {c["data-metric"] for c in charts} == {"exact_match,strict-match", "teacher_kl_p99"}
    markers = page.having("g", cls="change-marker")
    assert [m["data-run-id"] for m in markers] == [run_id(5), run_id(5)]  # the score and the token chart
    assert len(page.having("circle", cls="dot")) == 16  # 8 nights on each chart
    assert len(page.having("rect", cls="aa")) == 1 and len(page.having("path", cls="ci")) == 1
    # the change links to its chart
    assert page.having("a", href=f"#{page.having('figure', cls='score')[0]['id']}")


def test_page_is_self_contained():
    html = render(synthetic_history(n_nights=40, n_tasks=2))
    page = Page(html)
    assert not page.having("script") and not page.having("link") and not page.having("img")
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    assert "@import" not in html and "url(" not in html


def test_untrusted_text_is_shown_literally_never_as_markup():
    data = sample_history(task=f"gsm8k{SCRIPT}")
    data["series"][0]["metric"] = f"acc{IMG}"
    data["nights"][0]["reasons"] = [SCRIPT]
    data["title"] = f"nightly {SCRIPT}"
    html = render(data)
    page = Page(html)

    assert not page.having("script") and not page.having("img")
    assert "<script>" not in html and "<img" not in html
    # shown as text: in the task heading, the flipped prompt, the bisect table, the metric and the title
    assert f"Task gsm8k{SCRIPT}" in page.text
    assert f"Question 3: {SCRIPT} {IMG} how many apples?" in page.text
    assert f"0.32.1+{SCRIPT}" in page.text
    assert f"acc{IMG}" in page.text
    # and kept whole inside attributes
    assert page.having("figure", cls="score")[0]["data-task"] == f"gsm8k{SCRIPT}"


def test_hostile_hrefs_are_dropped():
    data = sample_history()
    data["nights"][0]["report"] = "javascript:window.__pwned=1"
    data["nights"][1]["report"] = " JaVaScRiPt:alert(1)"
    data["changes"][0]["report"] = "data:text/html,<script>alert(1)</script>"
    page = Page(render(data))
    hrefs = [a.get("href") or "" for a in page.having("a")]
    assert not [h for h in hrefs if ":" in h and not h.startswith("#")]
    assert [c.get("href") for c in page.having(cls="night")][:3] == [None, None, "runs/run-0002/report.html"]
    assert safe_href("https://ci.example/r/1") and safe_href("../runs/x/report.html") == "../runs/x/report.html"


def test_control_characters_are_made_visible():
    data = sample_history()
    data["changes"][0]["flipped"][0]["prompt"] = "a\x00b\x1bc\u2028d"
    html = render(data)
    assert "a\\u0000b\\u001bc\\u2028d" in Page(html).text
    assert "\x00" not in html and "\x1b" not in html


def test_empty_history_says_no_nights_yet():
    data = {"title": "evalpipe nightly", "generated_at": "2025-01-01T00:00:00Z", "database": "sqlite:///h.db",
            "nights": [], "series": [], "token_series": [], "changes": []}
    page = Page(render(data))
    assert page.having(id="empty") and "No nights recorded yet" in page.text
    assert not page.having(cls="night") and not page.having("figure") and not page.having(id="latest")


def test_single_night():
    data = sample_history(n_nights=1, change_at=5)
    data["changes"] = []
    for s in data["series"] + data["token_series"]:
        s["changes"] = []
    page = Page(render(data))
    assert len(page.having(cls="night")) == 1 and "1 night:" in page.text
    assert len(page.having("figure", cls="chart")) == 2
    assert "No flagged changes" in page.text
    line = page.having("path", cls="line")[0]["d"]
    assert line.startswith("M") and line.endswith("h0")  # a lone point drawn as a dot


def test_none_values_leave_gaps():
    data = sample_history(n_nights=8, change_at=5)
    pts = data["series"][0]["points"]
    pts[2].update(value=None, ci_low=None, ci_high=None)
    pts[5].update(value=None, ci_low=None, ci_high=None, n=None)  # the flagged night itself
    data["series"][0]["aa_band"] = None
    data["token_series"][0]["points"][3].update(value=None, aa_value=None)
    data["changes"][0].update(p_value=None, report=None)
    data["nights"][3].update(verdict=None, report=None, baseline=None)
    page = Page(render(data))

    score = page.having("figure", cls="score")[0]["id"]
    paths = {p["class"]: p["d"] for p in page.having("path")[:2]}
    assert paths["line"].count("M") == 3  # 0-1, 3-4, 6-7
    assert paths["ci"].count("M") == 3 and paths["ci"].count("Z") == 3
    assert len(page.having("circle", cls="dot")) == 6 + 7
    assert not page.having("rect", cls="aa") and "no A/A band" in page.text
    marker = page.having("g", cls="change-marker")[0]
    assert marker["data-run-id"] == run_id(5) and score
    assert "(no report)" in page.text


def test_all_values_missing_draws_an_empty_chart():
    data = sample_history(n_nights=4, change_at=9)
    for p in data["series"][0]["points"]:
        p.update(value=None, ci_low=None, ci_high=None)
    data["series"][0]["aa_band"] = None
    page = Page(render(data))
    assert page.text.count("no values recorded") == 1
    assert len(page.having("path", cls="line")) == 1  # the token chart's; the score chart has none


def test_year_of_nights_gives_one_chart_per_series_and_compact_paths(tmp_path):
    data = synthetic_history(n_nights=365, n_tasks=10)
    n_score, n_token = len(data["series"]), len(data["token_series"])
    assert (n_score, n_token) == (10 * 3 * 2, 10 * 3 * 3)
    path = tmp_path / "dash" / "index.html"
    write_text(path, render(copy.deepcopy(data)))
    html = path.read_text(encoding="utf-8")
    page = Page(html)

    assert len(page.having("figure", cls="score")) == n_score
    assert len(page.having("figure", cls="token")) == n_token
    assert len(page.having(cls="night")) == 365
    assert len(page.having("section", cls="task")) == 10
    # one line per series, no dots above DOTS_MAX points, only the change markers
    assert len(page.having("path", cls="line")) == n_score + n_token
    assert not page.having("circle", cls="dot") and 365 > DOTS_MAX
    assert len(page.having("g", cls="change-marker")) == n_score
    assert len(page.having(cls="change")) == 10
    assert all(re.fullmatch(r"[MLHVZh0-9., -]+", p["d"]) for p in page.having("path"))
    assert max(len(p["d"]) for p in page.having("path", cls="line")) < 365 * 16
    assert not list(tmp_path.glob("dash/.*.tmp"))  # the atomic write left no temp file


def test_rendering_is_deterministic():
    data = sample_history()
    assert render(data) == render(copy.deepcopy(data))


def test_an_inconclusive_night_is_its_own_amber_state_neither_pass_nor_regression():
    data = sample_history(n_nights=8, change_at=5, inconclusive=(2, 7))
    html = render(data)
    page = Page(html)
    cells = page.having(cls="night")
    assert [c["class"].split()[1] for c in cells] == ["pass", "pass", "inconclusive", "pass", "pass", "regression", "regression", "inconclusive"]
    assert INCONCLUSIVE_REASON in cells[2]["title"]
    assert "inconclusive" in page.having("div", id="latest")[0]["class"].split()
    assert [b["class"] for b in page.having("span", cls="badge")][:2] == ["badge inconclusive", "badge regression"]  # latest first
    assert "8 nights: 4 PASS, 2 INCONCLUSIVE (nothing proven about the code paths), 2 REGRESSION, 0 FAILED." in page.text
    colours = dict(re.findall(r"\.(pass|inconclusive|regression|failed) \{ --c: (#[0-9a-f]{6})", html))
    assert colours["inconclusive"] == "#d4a72c"  # amber
    assert len(set(colours.values())) == 4  # each state its own colour
