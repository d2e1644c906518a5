"""The "Where it starts" section (localize.json) in report.md, report.html and the terminal:
documents built here, no engine."""

from __future__ import annotations

import base64
import io
import re

import pytest
from html_page import parse_page
from report_samples import HOSTILE, PNG_MAGIC, RUN_INFO, as_document, as_run, identical_compare, make_compare
from rich.console import Console

from evalpipe.compare.localize import MODULES
from evalpipe.documents.localization import (
    LayerPoint,
    LocalizeDocument,
    ModuleDoc,
    PositionDoc,
    SequenceDoc,
    read_localizations,
    write_localizations,
)
from evalpipe.report import localize as report_localize
from evalpipe.report import plots
from evalpipe.report.html import render_html
from evalpipe.report.markdown import md_escape, render_markdown

LAYERS = 4
FLOOR = 1e-3
FAULT_SENTENCE = ("first difference above the A/A floor: layer 1, attention output after the reduction, "
                  "position 7 (a shard boundary of T = 4); relative L2 error 0.05 against a floor of 0.001.")
NONE_SENTENCE = "no module above the A/A floor: 28 module outputs compared, none differs more than its floor."


def _module(layer: int, module: str, rel: float | None, aa: float | None = 1e-4, label: str = "gsm8k doc 3",
            **kw) -> ModuleDoc:
    above = rel is not None and rel > FLOOR
    worst = [PositionDoc(label=label, position=7, rel_l2=rel, flags=["a shard boundary of T = 4"])] if rel else []
    return ModuleDoc(layer=layer, module=module, title=MODULES[module], rows=12, rel_l2=rel,
                     cosine=None if rel is None else 1 - rel * rel / 2, max_abs=None if rel is None else rel * 3,
                     aa_rel_l2=aa, aa_cosine=1.0, aa_max_abs=aa, floor=FLOOR, above=above, worst=worst, **kw)


def localization(fault: bool = True, label: str = "gsm8k doc 3", variant: str = "sp", sentence: str | None = None,
                 not_reassembled: list[str] | None = None, missing: tuple[int, str] | None = None) -> LocalizeDocument:
    """A 4-layer model; with ``fault`` layer 1's attn.out is the first above its floor, and
    everything after it grows by x3 a module."""
    modules = []
    rel = 0.05
    for layer in range(LAYERS):
        for module in MODULES:
            value: float | None = 0.0
            if fault and (layer, module) >= (1, "attn.out") and (layer > 1 or list(MODULES).index(module) >= 3):
                value, rel = rel, rel * 1.5
            if (layer, module) == missing:
                value = None
            modules.append(_module(layer, module, value, aa=1e-4 if value is not None else None, label=label))
    first = next((m for m in modules if m.above), None)
    curve = [LayerPoint(layer=m.layer, rel_l2=m.rel_l2, aa_rel_l2=m.aa_rel_l2) for m in modules if m.module == "layer.out"]
    return LocalizeDocument(
        run_id="run-1", variant=variant, reference="legacy", aa="legacy-aa", modes={"legacy": "offline", "legacy-aa": "offline", variant: "offline"}, dtype="bfloat16",
        precision="bf16", numerics_floor=FLOOR, rel_aa=3.0, aa_identical=False,
        sequences=[SequenceDoc(label=label, tokens=16, rows=[0, 7, 15], why={"7": ["worst teacher-forced"]})],
        modules=modules, first=first, sentence=sentence or (FAULT_SENTENCE if fault else NONE_SENTENCE),
        layer_curve=curve, not_reassembled=not_reassembled or [],
    )


@pytest.fixture(scope="module")
def fault_html() -> str:
    return render_html(as_document(make_compare()), as_run(RUN_INFO), localizations=[localization()])


def _md(doc: LocalizeDocument | None) -> str:
    return render_markdown(as_document(make_compare()), as_run(RUN_INFO), [] if doc is None else [doc])


def test_markdown_has_the_sentence_and_the_first_module_row():
    md = _md(localization())
    assert "## Where it starts" in md
    assert md.index("## Gates") < md.index("## Where it starts") < md.index("## Run")
    section = md[md.index("## Where it starts"):md.index("## Run")]
    assert md_escape(FAULT_SENTENCE) in section
    first_row = next(line for line in section.splitlines() if "(first)" in line)
    assert first_row.startswith("| 1 | **attn.out: attention output after the reduction** (first) | **0.05** | 0.0001 | 0.001 |")
    assert "gsm8k doc 3 @ 7: 0.05 (a shard boundary of T = 4)" in first_row
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) <= report_localize.MAX_ROWS
    # the neighbourhood (two before the first), then one row per later layer
    assert [r.split(" | ")[1].split(":")[0].strip("*") for r in rows[:3]] == ["attn.heads", "attn.partials", "attn.out"]
    assert [r.split(" | ")[0] for r in rows[-2:]] == ["| 2", "| 3"] and all("layer.out" in r for r in rows[-2:])
    assert "| reference | legacy |" in section and "| A/A | legacy-aa |" in section and "| variant | sp |" in section
    assert "numerics floor 0.001 for bf16" in section


def test_markdown_without_a_localization_has_no_section():
    assert "Where it starts" not in _md(None)


def test_no_difference_renders_the_closest_modules_and_plots():
    doc = localization(fault=False)
    md = _md(doc)
    assert md_escape(NONE_SENTENCE) in md and "No module is above its floor" in md
    assert "(first)" not in md
    png = plots.localize_heatmap(doc)
    assert png is not None and base64.b64decode(png).startswith(PNG_MAGIC)
    curve = plots.localize_curve(doc)
    assert curve is not None and base64.b64decode(curve).startswith(PNG_MAGIC)
    html = render_html(as_document(identical_compare()), None, localizations=[doc])
    ids = {a.get("id") for tag, a in parse_page(html).starts if tag == "img"}
    assert {"localize-heatmap", "localize-curve"} <= ids


def test_html_has_the_sentence_the_heatmap_and_the_curve(fault_html):
    page = parse_page(fault_html)
    images = {a.get("id"): a for tag, a in page.starts if tag == "img"}
    for name in ("localize-heatmap", "localize-curve"):
        img = images[name]
        assert img["alt"]
        assert base64.b64decode(img["src"].removeprefix("data:image/png;base64,")).startswith(PNG_MAGIC)
    text = "".join(page.texts)
    assert FAULT_SENTENCE in text
    assert fault_html.index('id="gates"') < fault_html.index('id="where-it-starts"') < fault_html.index('id="run"')
    assert '<tr class="above first">' in fault_html


def test_html_without_plots_says_so():
    html = render_html(as_document(make_compare()), as_run(RUN_INFO), plots=False, localizations=[localization()])
    assert "localize-heatmap" not in html and "Plots were not drawn" in html and FAULT_SENTENCE in html


def test_plots_of_missing_values_and_nothing():
    doc = localization(missing=(2, "mlp.out"))
    assert plots.localize_heatmap(doc) is not None
    empty = localization(fault=False).model_copy(update={"modules": [], "layer_curve": [], "first": None})
    assert plots.localize_heatmap(empty) is None and plots.localize_curve(empty) is None
    html = render_html(as_document(make_compare()), None, localizations=[empty])
    assert "No module has a value to draw" in html and "No per-layer residual stream to draw" in html


def test_untrusted_text_is_escaped():
    doc = localization(label=HOSTILE + " | x", variant="sp" + HOSTILE, sentence="first difference " + HOSTILE + " $x^$",
                       not_reassembled=[f"attn.heads of layer 0: {HOSTILE}"])
    md = _md(doc)
    section = md[md.index("## Where it starts"):md.index("## Run")]
    assert "<script>" not in section and "&lt;script&gt;" in section
    # the labels' pipes and newlines cannot break a table row
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows and {len(re.findall(r"(?<!\\)\|", line)) for line in rows} == {len(report_localize.COLUMNS) + 1}
    html = render_html(as_document(make_compare()), as_run(RUN_INFO), localizations=[doc])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page = parse_page(html)
    assert not [tag for tag, _ in page.starts if tag in ("script", "iframe")]
    # names with "$" and control characters still plot
    assert plots.localize_curve(doc.model_copy(update={"reference": "a$b\x00"})) is not None


def test_terminal_sentence_and_summary():
    from io import StringIO

    from evalpipe.report.terminal import print_summary

    doc = localization()
    assert report_localize.terminal_sentence(doc) == "sp: " + FAULT_SENTENCE
    out = StringIO()
    print_summary(as_document(make_compare()), Console(file=out, width=400), localizations=[doc])
    assert "where it starts: sp: first difference above the A/A floor: layer 1" in out.getvalue()


def test_compare_keeps_the_section_from_localize_json(tmp_path):
    from fakes import make_samples, write_run

    from evalpipe.pipeline.comparing import compare_run, write_outputs
    from evalpipe.rundir import artifacts

    legacy = make_samples(3)
    run = write_run(tmp_path / "run", {"legacy": legacy, "sp": [s.copy() for s in legacy]})
    write_localizations(run, [localization()])
    assert read_localizations(run) == [localization()]
    write_outputs(run, compare_run(run), plots=False, localizations=read_localizations(run))
    assert "## Where it starts" in (run / artifacts.REPORT_MD).read_text(encoding="utf-8")
    assert 'id="where-it-starts"' in (run / artifacts.REPORT_HTML).read_text(encoding="utf-8")


def test_localizing_a_variant_again_replaces_its_entry_and_every_variant_renders(tmp_path):
    write_localizations(tmp_path, [localization(variant="sp")])
    write_localizations(tmp_path, [localization(variant="other"), localization(variant="sp", sentence="again")])
    docs = read_localizations(tmp_path)
    assert [(d.variant, d.sentence) for d in docs] == [("other", FAULT_SENTENCE), ("sp", "again")]
    html = render_html(as_document(make_compare()), as_run(RUN_INFO), localizations=docs)
    assert html.count('id="where-it-starts"') == 1
    assert 'id="localize-heatmap"' in html and 'id="localize-heatmap-1"' in html and "again" in html


def test_an_unreadable_localize_json_costs_a_warning_and_the_section_not_the_comparison(tmp_path):
    from fakes import make_samples, write_run

    from evalpipe.pipeline.comparing import report_run
    from evalpipe.reporting import TerminalReporter
    from evalpipe.rundir import artifacts

    legacy = make_samples(3)
    run = write_run(tmp_path / "run", {"legacy": legacy, "sp": [s.copy() for s in legacy]})
    (run / "localize.json").write_text('{"version": 7, "localizations": []}')
    out = io.StringIO()
    code, _ = report_run(run, TerminalReporter(Console(file=out, width=400)))
    assert code in (0, 1, 4)
    assert "warning: the reports leave out where the divergence starts" in out.getvalue()
    assert "localization of version 7; this evalpipe reads version 1" in out.getvalue()
    assert "Where it starts" not in (run / artifacts.REPORT_MD).read_text(encoding="utf-8")


def test_a_finished_localization_is_written_over_an_unreadable_file_which_is_kept_aside(tmp_path):
    (tmp_path / "localize.json").write_text('{"version": 1, "localizations": [{"mode": "offline"}]}')
    path, aside = write_localizations(tmp_path, [localization(variant="sp")])
    assert aside == tmp_path / "localize.json.unreadable" and "mode" in aside.read_text()
    assert [d.variant for d in read_localizations(tmp_path)] == ["sp"] and path == tmp_path / "localize.json"
