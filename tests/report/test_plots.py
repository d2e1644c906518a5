"""The report's PNG plots (evalpipe/report/plots.py): each plot draws only what is there (None
without data, so the page says why instead), returns base64 PNG text, and gives the same bytes
for the same input. The distribution and divergence plots take hand-built token summaries,
the length and depth plots the rows of a real comparison of the long-context run
(tests/report/conftest.py) and hand-built rows; the localize heatmap and curve are pinned
with the "Where it starts" section in test_localize.py.
"""

from __future__ import annotations

import base64

from report_samples import PNG_MAGIC, as_document, hist, teacher_summary, token_summary

from evalpipe.documents.comparison import FreeFigures, LengthRow, TokenSummary
from evalpipe.report.plots import MAX_POSITION_BINS, depth_plot, distribution_plot, divergence_plot, length_plot


def _png(text: str | None) -> bytes:
    assert text is not None
    png = base64.b64decode(text, validate=True)
    assert png.startswith(PNG_MAGIC)
    return png


def _length_row(length: int, kl: float | None, kind: str = "round") -> LengthRow:
    """A free-running row whose KL max and max |Δlogprob| are both ``kl``."""
    free = FreeFigures(n_samples=2, n_divergent=0, n_near_tie_divergences=0, n_hard_divergences=0, n_positions=20,
                       max_abs_dlogprob=kl, kl_p99=kl, kl_max=kl)
    return LengthRow(n_items=2, n_clusters=2, scores=[], free=free, teacher=None, teacher_prompt=None,
                     teacher_continuation=None, target_length=length, length_kind=kind, length_tags=None, depths=[])


def test_plots_draw_only_what_is_there():
    assert distribution_plot(None, None, "free-running") is None
    nothing = {"decades": list(range(-10, 3)), "zero": 0, "counts": [0] * 13}
    empty = TokenSummary.model_validate(token_summary(kl_hist=nothing, abs_dlogprob_hist=nothing))
    assert distribution_plot(empty, None, "free-running") is None
    only_aa = distribution_plot(None, TokenSummary.model_validate(teacher_summary()), "teacher-forced")
    assert only_aa and base64.b64decode(only_aa).startswith(PNG_MAGIC)
    assert divergence_plot([], None) is None
    assert base64.b64decode(divergence_plot([0, 0, 3], [7]) or "").startswith(PNG_MAGIC)


def test_length_and_depth_plots(long_compare):
    doc = as_document(long_compare)
    ab = doc.comparisons[0].by_length[0]
    aa = doc.noise_floor.by_length[0]
    for fn, rows_ab, rows_aa in ((length_plot, ab.lengths, aa.lengths), (depth_plot, ab.depths, aa.depths)):
        png = fn(rows_ab, rows_aa, "teacher", True)
        assert base64.b64decode(png).startswith(PNG_MAGIC)
        assert fn(rows_ab, rows_aa, "teacher", True) == png  # deterministic bytes
        assert fn(rows_ab, None, "teacher", False) is not None
        assert fn(rows_ab, None, "free", False) is not None  # free-running: sp diverged at 2049
        assert fn([], None, "teacher", True) is None


def test_distribution_plot_same_histograms_same_bytes_fewer_bars_other_bytes():
    ab = TokenSummary.model_validate(token_summary())
    aa = TokenSummary.model_validate(token_summary(kl_hist=hist(44, {-7: 1}), abs_dlogprob_hist=hist(43, {-5: 2})))
    png = _png(distribution_plot(ab, aa, "free-running"))
    assert _png(distribution_plot(ab.model_copy(), aa.model_copy(), "free-running")) == png
    assert _png(distribution_plot(ab, None, "free-running")) != png  # A/A bars left out


def test_divergence_plot_bins_long_sequences():
    """Positions far beyond MAX_POSITION_BINS tokens still draw (in wider bins), deterministically."""
    far = [0, 5, 40 * MAX_POSITION_BINS, 100 * MAX_POSITION_BINS]
    png = _png(divergence_plot(far, [1]))
    assert _png(divergence_plot(list(far), [1])) == png
    assert _png(divergence_plot(far, None)) != png


def test_length_plot_needs_a_positive_figure():
    """All figures zero or missing: nothing a log axis could show, so no plot; one positive figure
    (on an edge length, drawn as an unjoined diamond) is enough, zeros then sit at the bottom."""
    zeros = [_length_row(1024, 0.0), _length_row(2048, 0.0), _length_row(4096, None)]
    assert length_plot(zeros, zeros, "free", False) is None
    assert length_plot(zeros, None, "teacher", False) is None  # rows without teacher-forced figures
    one = [*zeros[:2], _length_row(2049, 0.25, kind="edge")]
    png = _png(length_plot(one, zeros, "free", False))
    assert _png(length_plot(one, zeros, "free", False)) == png
