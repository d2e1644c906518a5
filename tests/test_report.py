import io
import re

from rich.console import Console

from evalpipe.compare import compare_run
from evalpipe.report import md_escape, print_summary, render_markdown
from fakes import METRIC, TASK, make_samples, mutate, write_run

NASTY = "x | y `rm -rf` <script>alert(1)</script>\nsecond line"

RUN_INFO = {
    "run_id": "run-1",
    "model": {"name": "tiny-layout", "revision": "abc"},
    "fingerprints": {"model": "m123", "tasks": "t456"},
    "variants": [
        {"name": "legacy", "env": {"LAYOUT": "legacy", "OMP": "1"}},
        {"name": "sp", "env": {"LAYOUT": "sp", "OMP": "1"}},
    ],
    "reference": "legacy",
    "timings": {"legacy": {"total_s": 12.5}, "sp": {"total_s": 11.0}},
    "versions": {"vllm": "0.32.0"},
}


def _run(tmp_path, mut=None):
    a = make_samples(6)
    a = mutate(a, 2, lambda s: s.copy(response=NASTY, target="4|2"))
    b = mut(a) if mut else a
    root = write_run(tmp_path / "run-1", {"legacy": a, "sp": b}, reference="legacy", run_info=RUN_INFO)
    return compare_run(root)


def _diverge(a):
    def fn(s):
        ids = list(s.token_ids)
        ids[4] = 11
        return s.copy(token_ids=ids, response=NASTY.replace("second", "other"), scores={METRIC: 1.0})

    return mutate(a, 2, fn)


def test_md_escape():
    out = md_escape(NASTY)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "\\|" in out and "|" not in out.replace("\\|", "")
    assert "\\`rm -rf\\`" in out
    assert "\n" not in out and "<br>" in out


def test_markdown_escapes_model_text(tmp_path):
    md = render_markdown(_run(tmp_path, _diverge), RUN_INFO)
    assert "<script>" not in md and "</script>" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "\\`rm -rf\\`" in md
    # every table row keeps its column count: unescaped pipes never appear inside cells
    for block in re.findall(r"(?:^\|.*\n)+", md, flags=re.M):
        rows = block.strip("\n").split("\n")
        widths = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
        assert len(widths) == 1, block


def test_markdown_layout(tmp_path):
    md = render_markdown(_run(tmp_path, _diverge), RUN_INFO)
    lines = md.splitlines()
    assert lines[0] == "# evalpipe comparison: run-1"
    assert lines[2] == "## Verdict: DIFFERENT"
    # verdict reasons come before the run header
    assert md.index("samples generate different tokens") < md.index("## Run")
    assert "tiny-layout (revision=abc)" in md
    assert "| fingerprint model | m123 |" in md
    # only the settings that differ between variants
    assert "env.LAYOUT=legacy" in md and "OMP" not in md
    assert "| legacy.total\\_s | 12.5 |" in md
    assert "| exact\\_match,strict-match | 0.500 | 0.667 | +0.167 | 1/6 (0 right→wrong, 1 wrong→right) |" in md
    assert "#### Earliest divergences" in md and "doc 2, position 4" in md
    assert "`11`" in md


def test_identical_report_and_determinism(tmp_path):
    rc = _run(tmp_path)
    md1 = render_markdown(rc, RUN_INFO)
    assert "## Verdict: IDENTICAL" in md1 and "Earliest divergences" not in md1
    assert render_markdown(rc, RUN_INFO) == md1
    assert render_markdown(rc, {}).startswith("# evalpipe comparison: run-1")  # tolerant of missing keys


def test_terminal_summary(tmp_path):
    rc = _run(tmp_path, _diverge)
    buf = io.StringIO()
    print_summary(rc, Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "scores (reference: legacy)" in out
    row = next(line for line in out.splitlines() if line.startswith("│ sp") and "%" in line)
    assert TASK in row and "83.3%" in row and "DIFFERENT" in row
    assert "run-1: DIFFERENT" in out


def test_markdown_statistics_table(tmp_path):
    md = render_markdown(_run(tmp_path, _diverge), RUN_INFO)
    # 6 items, A = [0,1,0,1,0,1], B flips doc 2 to right: d = [0,0,1,0,0,0], d̄ = 1/6,
    # SE = √((5/6)/5/6) = 1/6, t_{.975,5} = 2.5706 -> [−0.262, +0.595];
    # 90%: t_{.95,5} = 2.0150 -> [−0.169, +0.503]; MDD = (2.5706 + 0.9195)/6 = 0.582; McNemar(0, 1) = 1
    assert "| equivalent within ±0.01 [90% CI] | detectable Δ | items |" in md
    assert (
        "| exact\\_match,strict-match | 0.500 ± 0.224 | 0.667 ± 0.211 | +0.167 [−0.262, +0.595] | 1 "
        "| no [−0.169, +0.503] | 0.582 | 6 |"
    ) in md


def test_markdown_flipped_items(tmp_path):
    md = render_markdown(_run(tmp_path, _diverge), RUN_INFO)
    section = md[md.index("#### Items whose score changed") : md.index("#### Earliest divergences")]
    assert "exact\\_match,strict-match: 1" in section
    row = next(line for line in section.splitlines() if line.startswith("| 2 |"))
    assert "| 0 → 1 | Question 2? | 4\\|2 |" in row
    assert "&lt;script&gt;" in row and "<script>" not in row and "other line" in row


def test_markdown_flipped_items_truncated(tmp_path):
    a = make_samples(12)
    b = [s.copy(scores={METRIC: 1.0 - s.scores[METRIC]}) for s in a]
    rc = compare_run(write_run(tmp_path / "run-f", {"legacy": a, "sp": b}, reference="legacy"))
    md = render_markdown(rc, {})
    assert "exact\\_match,strict-match: first 10 of 12" in md
    section = md[md.index("#### Items whose score changed") :]
    assert "| 9 |" in section and "| 10 |" not in section


def test_identical_report_statistics(tmp_path):
    md = render_markdown(_run(tmp_path), RUN_INFO)
    assert "| 0.500 ± 0.224 | 0.500 ± 0.224 | 0 [0, 0] | 1 | yes [0, 0] | 0.000 | 6 |" in md
    assert "Items whose score changed" not in md
