"""Small PNG plots for report.html, returned as base64 text for ``data:`` URIs.

Matplotlib's object API with the Agg canvas: no pyplot, so no global figure state and
no display backend. PNGs carry no creation-time metadata, so the same input gives
the same bytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

DPI = 90
PANEL_SIZE = (3.6, 2.3)  # inches per panel
COLOR_AB = "#d95f02"
COLOR_AA = "#7570b3"
DECADES = tuple(range(-10, 3))
MAX_POSITION_BINS = 30

# (key in a TaskTokenSummary dict, axis title)
DISTRIBUTIONS = (("kl_hist", "KL per position"), ("abs_dlogprob_hist", "|Δlogprob| per position"))


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bins(hist: Mapping[str, Any] | None) -> tuple[list[str], np.ndarray] | None:
    """Bar labels and counts of a decade histogram: the exact zeros first, then one bar per decade."""
    if not isinstance(hist, Mapping):
        return None
    decades = list(hist.get("decades") or DECADES)
    counts = list(hist.get("counts") or [])
    counts = (counts + [0] * len(decades))[: len(decades)]
    values = np.asarray([hist.get("zero") or 0] + counts, dtype=float)
    labels = ["0"] + [f"1e{d}" for d in decades]
    # the histogram clips: the first decade also holds everything smaller, the last everything larger
    labels[1] = f"<1e{decades[0] + 1}" if len(decades) > 1 else labels[1]
    labels[-1] = f"\u22651e{decades[-1]}"
    return labels, values


def _shares(values: np.ndarray) -> np.ndarray:
    total = values.sum()
    return values / total if total > 0 else values


def distribution_plot(ab: Mapping[str, Any] | None, aa: Mapping[str, Any] | None, mode: str) -> str | None:
    """Per-position KL and |Δlogprob| as shares of positions per decade, A/B beside A/A; None if empty."""
    panels = []
    for key, title in DISTRIBUTIONS:
        series = []
        for label, summary, color in (("A/B", ab, COLOR_AB), ("A/A", aa, COLOR_AA)):
            bins = _bins((summary or {}).get(key))
            if bins is not None and bins[1].sum() > 0:
                series.append((label, bins[0], _shares(bins[1]), color))
        if series:
            panels.append((title, series))
    if not panels:
        return None
    fig = Figure(figsize=(PANEL_SIZE[0] * len(panels), PANEL_SIZE[1]))
    # fixed margins: a layout engine measures every tick label and costs more than the drawing
    fig.subplots_adjust(left=0.1, right=0.98, top=0.88, bottom=0.25, wspace=0.3)
    for i, (title, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        labels = series[0][1]
        x = np.arange(len(labels))
        width = 0.8 / len(series)
        for j, (name, _, shares, color) in enumerate(series):
            ax.bar(x + (j - (len(series) - 1) / 2) * width, shares, width, label=name, color=color)
        positive = [shares[shares > 0].min() for _, _, shares, _ in series if (shares > 0).any()]
        ax.set_yscale("log")
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_ylim(bottom=min(positive) / 2 if positive else 1e-4, top=1.5)
        ax.set_xticks(x, labels, rotation=90, fontsize=6)
        ax.tick_params(axis="y", labelsize=6)
        ax.set_title(f"{title} ({mode})", fontsize=8)
        ax.set_ylabel("share of positions", fontsize=7)
        ax.legend(fontsize=6, frameon=False)
    return _png(fig)


def divergence_plot(ab: Sequence[int] | None, aa: Sequence[int] | None) -> str | None:
    """Histogram of free-running first-divergence positions, A/B beside A/A; None without any."""
    series = [(name, np.asarray(list(p), dtype=float), color) for name, p, color in (("A/B", ab, COLOR_AB), ("A/A", aa, COLOR_AA)) if p]
    if not series:
        return None
    top = max(float(s.max()) for _, s, _ in series)
    # whole-token bins (at most MAX_POSITION_BINS of them), centred on the positions
    width = max(1, int(np.ceil((top + 1) / MAX_POSITION_BINS)))
    edges = np.arange(0, top + 1 + width, width) - 0.5
    fig = Figure(figsize=PANEL_SIZE)
    fig.subplots_adjust(left=0.17, right=0.96, top=0.88, bottom=0.2)
    ax = fig.add_subplot(1, 1, 1)
    ax.hist([s for _, s, _ in series], bins=edges, label=[n for n, _, _ in series], color=[c for *_, c in series])
    ax.set_title("first divergence position (free-running)", fontsize=8)
    ax.set_xlabel("token position", fontsize=7)
    ax.set_ylabel("samples", fontsize=7)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, max(top + 0.5, 10))
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, frameon=False)
    return _png(fig)
