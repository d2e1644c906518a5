"""Small PNG plots for report.html, returned as base64 text for ``data:`` URIs.

Matplotlib's object API with the Agg canvas: no pyplot, so no global figure state and
no display backend. PNGs carry no creation-time metadata, so the same input gives
the same bytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from evalpipe.documents.comparison import DepthRow, FreeFigures, GroupFigures, Histogram, LengthRow, TeacherFigures, TokenSummary
from evalpipe.documents.localization import LocalizeDocument
from evalpipe.report.formats import show_controls
from evalpipe.report.localize import module_order

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 90
PANEL_SIZE = (3.6, 2.3)  # inches per panel
COLOR_AB = "#d95f02"
COLOR_AA = "#7570b3"
DECADES = tuple(range(-10, 3))
MAX_POSITION_BINS = 30

def _kl_hist(t: TokenSummary) -> Histogram:
    return t.kl_hist


def _abs_dlogprob_hist(t: TokenSummary) -> Histogram:
    return t.abs_dlogprob_hist


# (histogram of a token summary, axis title)
DISTRIBUTIONS: tuple[tuple[Callable[[TokenSummary], Histogram], str], ...] = (
    (_kl_hist, "KL per position"), (_abs_dlogprob_hist, "|Δlogprob| per position"))


def _png(fig: Figure) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bins(hist: Histogram) -> tuple[list[str], np.ndarray]:
    """Bar labels and counts of a decade histogram: the exact zeros first, then one bar per decade."""
    decades = list(hist.decades or DECADES)
    counts = (list(hist.counts) + [0] * len(decades))[: len(decades)]
    values = np.asarray([hist.zero] + counts, dtype=float)
    labels = ["0"] + [f"1e{d}" for d in decades]
    # the histogram clips: the first decade also holds everything smaller, the last everything larger
    labels[1] = f"<1e{decades[0] + 1}" if len(decades) > 1 else labels[1]
    labels[-1] = f"\u22651e{decades[-1]}"
    return labels, values


def _shares(values: np.ndarray) -> np.ndarray:
    total = values.sum()
    return values / total if total > 0 else values


def distribution_plot(ab: TokenSummary | None, aa: TokenSummary | None, mode: str) -> str | None:
    """Per-position KL and |Δlogprob| as shares of positions per decade, A/B beside A/A; None if empty."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    panels = []
    for hist_of, title in DISTRIBUTIONS:
        series = []
        for label, summary, color in (("A/B", ab, COLOR_AB), ("A/A", aa, COLOR_AA)):
            bins = _bins(hist_of(summary)) if summary is not None else None
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
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

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
    ax.hist([s for _, s, _ in series], bins=edges.tolist(), label=[n for n, _, _ in series], color=[c for *_, c in series])
    ax.set_title("first divergence position (free-running)", fontsize=8)
    ax.set_xlabel("token position", fontsize=7)
    ax.set_ylabel("samples", fontsize=7)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, max(top + 0.5, 10))
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, frameon=False)
    return _png(fig)


# ---------------------------------------------------------------------------
# per length / depth (compare.json "by_length" rows)
# ---------------------------------------------------------------------------

def _kl_max(f: FreeFigures | TeacherFigures) -> float | None:
    return f.kl_max


def _max_abs_dlogprob(f: FreeFigures | TeacherFigures) -> float | None:
    return f.max_abs_dlogprob


# (figure of a row's trace figures, panel title)
TREND_METRICS: tuple[tuple[Callable[[FreeFigures | TeacherFigures], float | None], str], ...] = (
    (_kl_max, "KL max"), (_max_abs_dlogprob, "max |Δlogprob|"))
Part = Callable[[GroupFigures], FreeFigures | TeacherFigures | None]  # which trace figures of a row


def _free(r: GroupFigures) -> FreeFigures | None:
    return r.free


def _teacher(r: GroupFigures) -> TeacherFigures | None:
    return r.teacher


def _teacher_prompt(r: GroupFigures) -> TeacherFigures | None:
    return r.teacher_prompt


def _teacher_continuation(r: GroupFigures) -> TeacherFigures | None:
    return r.teacher_continuation
EDGE_MARKER = "D"


def _trend_series(source: str, split: bool) -> tuple[tuple[Part, str, str], ...]:
    """(row part, label suffix, line style) of the trace figures a trend plot draws."""
    if source != "teacher":
        return ((_free, "", "-"),)
    if split:
        return ((_teacher_prompt, " prompt", "-"), (_teacher_continuation, " cont.", "--"))
    return ((_teacher, "", "-"),)


def _length_x(r: GroupFigures) -> float:
    return float(r.target_length) if isinstance(r, LengthRow) else float("nan")


def _depth_x(r: GroupFigures) -> float:
    return float(r.depth_bin) if isinstance(r, DepthRow) else float("nan")


def _trend_values(
    rows: Sequence[GroupFigures], x_of: Callable[[GroupFigures], float], part: Part,
    metric: Callable[[FreeFigures | TeacherFigures], float | None],
) -> list[tuple[float, float, bool]]:
    """(x, value, edge) of the rows that have the figure; NaN / missing values are left out."""
    out = []
    for r in rows:
        fig, x = part(r), x_of(r)
        value = metric(fig) if fig is not None else None
        if value is None or not np.isfinite(float(value)):
            continue
        out.append((x, float(value), isinstance(r, LengthRow) and r.length_kind == "edge"))
    return out


def _trend_plot(
    ab: Sequence[GroupFigures] | None,
    aa: Sequence[GroupFigures] | None,
    *,
    x_of: Callable[[GroupFigures], float],
    xlabel: str,
    source: str,
    split: bool,
    log2_x: bool,
) -> str | None:
    """One panel per TREND_METRICS: A/B and A/A figures against ``x_key``; None when nothing is positive.

    Round lengths are joined by a line; edge-case lengths are unjoined hollow
    diamonds, so a divergence that sits on the edges stands out from the trend. Zeros
    (bit-equal) are drawn at the bottom edge of the log axis.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    mode = "teacher-forced" if source == "teacher" else "free-running"
    panels = []
    for metric, title in TREND_METRICS:
        series = []
        for side, rows, color in (("A/B", ab, COLOR_AB), ("A/A", aa, COLOR_AA)):
            for part, suffix, style in _trend_series(source, split):
                pts = _trend_values(rows or (), x_of, part, metric)
                if pts:
                    series.append((side + suffix, pts, color, style, side == "A/B"))
        if series:
            panels.append((metric, title, series))
    positive = [v for _, _, series in panels for _, pts, *_ in series for _, v, _ in pts if v > 0]
    if not positive:
        return None
    fig = Figure(figsize=(PANEL_SIZE[0] * len(panels), PANEL_SIZE[1] + 0.4))
    fig.subplots_adjust(left=0.09, right=0.98, top=0.88, bottom=0.2, wspace=0.3)
    for i, (_metric, title, series) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        values = [v for _, pts, *_ in series for _, v, _ in pts]
        pos = [v for v in values if v > 0]
        floor = min(pos) / 10 if pos else 1e-12
        has_zero = any(v <= 0 for v in values)
        best = None  # the largest A/B point, labelled with its x
        for label, pts, color, style, is_ab in series:
            xs = np.asarray([p[0] for p in pts])
            ys = np.maximum(np.asarray([p[1] for p in pts]), floor)
            edge = np.asarray([p[2] for p in pts], dtype=bool)
            ax.plot(xs[~edge], ys[~edge], style, marker="o", markersize=3, linewidth=1, color=color, label=label)
            if edge.any():
                ax.scatter(xs[edge], ys[edge], s=22, marker=EDGE_MARKER, facecolors="none", edgecolors=color, linewidths=1)
            if is_ab:
                j = int(np.argmax(ys))
                if best is None or ys[j] > best[1]:
                    best = (xs[j], ys[j])
        if best is not None and best[1] > floor:
            ax.annotate(f"{best[0]:g}", best, textcoords="offset points", xytext=(3, 3), fontsize=6)
        if any(p[2] for _, pts, *_ in series for p in pts):
            ax.scatter([], [], s=22, marker=EDGE_MARKER, facecolors="none", edgecolors="black", label="edge-case length")
        if pos:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())
            ax.set_ylim(bottom=floor / 1.5, top=max(values) * 3)
        else:  # nothing but zeros: a log axis would invent a scale
            ax.set_yticks([floor], ["0"])
            ax.text(0.5, 0.6, "0 at every point", transform=ax.transAxes, ha="center", fontsize=7)
        xs_all = sorted({p[0] for _, pts, *_ in series for p in pts})
        if log2_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_locator(NullLocator())
            rounds = sorted({p[0] for _, pts, *_ in series for p in pts if not p[2]}) or xs_all
            ax.set_xticks(rounds, [f"{x:g}" for x in rounds], rotation=90 if len(rounds) > 6 else 0)
            lo, hi = min(xs_all), max(xs_all)
            ax.set_xlim(lo / 2 ** 0.15, hi * 2 ** 0.15)
        else:
            ax.set_xlim(-0.05, 1.05)
        ax.tick_params(labelsize=6)
        ax.set_title(f"{title} ({mode}) vs {xlabel}", fontsize=8)
        ax.set_xlabel(xlabel + (" (log2)" if log2_x else ""), fontsize=7)
        ax.set_ylabel("nats" + (" (0 at the bottom)" if has_zero and pos else ""), fontsize=7)
        if i == 0:
            ax.legend(fontsize=6, frameon=False, loc="best")
    return _png(fig)


def length_plot(
    ab: Sequence[GroupFigures] | None, aa: Sequence[GroupFigures] | None, source: str, split: bool
) -> str | None:
    """KL max and max |Δlogprob| per prompt length (log2 axis), A/B beside A/A; edge lengths as diamonds."""
    return _trend_plot(ab, aa, x_of=_length_x, xlabel="prompt length", source=source, split=split, log2_x=True)


def depth_plot(
    ab: Sequence[GroupFigures] | None, aa: Sequence[GroupFigures] | None, source: str, split: bool
) -> str | None:
    """KL max and max |Δlogprob| per needle-depth bin, A/B beside A/A."""
    return _trend_plot(ab, aa, x_of=_depth_x, xlabel="needle depth", source=source, split=split, log2_x=False)


# ---------------------------------------------------------------------------
# localize.json: where a variant first parts from the reference
# ---------------------------------------------------------------------------

HEATMAP_CMAP = "RdBu_r"  # diverging: above the floor warm, below it cool, the floor itself white
NO_VALUE = "#bdbdbd"
MAX_DECADES = 6.0  # the colour scale's reach either side of the floor
COLOR_FLOOR = "#555555"


def _label(text: str) -> str:
    """A name from the document as literal plot text: a ``$`` would start matplotlib's math mode."""
    return show_controls(text).replace("$", r"\$")


def _log_ratio(rel_l2: float | None, floor: float) -> float:
    """log10(rel_l2 / floor), clipped to ±MAX_DECADES (an exact zero is as far below as the scale goes);
    NaN without a value."""
    if rel_l2 is None or not np.isfinite(rel_l2):
        return float("nan")
    if rel_l2 <= 0:
        return -MAX_DECADES
    if floor <= 0:
        return MAX_DECADES
    return float(np.clip(np.log10(rel_l2 / floor), -MAX_DECADES, MAX_DECADES))


def localize_heatmap(doc: LocalizeDocument) -> str | None:
    """Layer (rows) x module (columns, forward order): log10(rel L2 / floor), warm above the floor,
    cells without a value grey, the first module above its floor outlined; None without any value."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    columns = module_order(doc)
    layers = sorted({m.layer for m in doc.modules})
    if not columns or not any(m.rel_l2 is not None or m.nonfinite for m in doc.modules):
        return None
    grid = np.full((len(layers), len(columns)), np.nan)
    for m in doc.modules:
        # NaN or inf where the reference is finite: as far above the floor as the scale goes
        value = MAX_DECADES if m.nonfinite else _log_ratio(m.rel_l2, m.floor)
        grid[layers.index(m.layer), columns.index(m.module)] = value
    finite = np.abs(grid[np.isfinite(grid)])
    reach = max(1.0, float(finite.max()) if finite.size else 1.0)
    cmap = colormaps[HEATMAP_CMAP].with_extremes(bad=NO_VALUE)
    height = min(9.0, max(PANEL_SIZE[1], 0.22 * len(layers) + 1.3))
    fig = Figure(figsize=(max(PANEL_SIZE[0], 0.55 * len(columns) + 2.2), height))
    fig.subplots_adjust(left=0.12, right=0.88, top=1 - 0.3 / height, bottom=0.75 / height)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-reach, vmax=reach, aspect="auto", interpolation="nearest")
    bar = fig.colorbar(image, ax=ax, fraction=0.06, pad=0.03)
    bar.set_label("log10(rel L2 / floor)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    ax.set_xticks(range(len(columns)), [_label(c) for c in columns], rotation=45, ha="right", fontsize=6)
    ticks = list(range(0, len(layers), -(-len(layers) // 12)))
    ax.set_yticks(ticks, [str(layers[i]) for i in ticks])
    ax.tick_params(axis="y", labelsize=6)
    ax.set_ylabel("layer", fontsize=7)
    first = doc.first
    if first is not None and first.layer in layers and first.module in columns:
        ax.add_patch(Rectangle((columns.index(first.module) - 0.5, layers.index(first.layer) - 0.5), 1, 1,
                               fill=False, edgecolor="black", linewidth=2))
        title = f"rel L2 over its floor (outlined: first above, layer {first.layer} {_label(first.module)})"
    else:
        title = "rel L2 over its floor (no module above it)"
    if np.isnan(grid).any():
        title += "; grey: no value"
    ax.set_title(title, fontsize=8)
    return _png(fig)


def localize_curve(doc: LocalizeDocument) -> str | None:
    """Per layer, the residual stream's rel L2: reference vs variant beside reference vs A/A, with
    the floor (log y axis; exact zeros on a line at the bottom); None without any point."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, NullLocator

    points = [p for p in doc.layer_curve if p.rel_l2 is not None or p.aa_rel_l2 is not None]
    if not points:
        return None
    floors = [max(doc.numerics_floor, doc.rel_aa * p.aa_rel_l2) if p.aa_rel_l2 is not None else doc.numerics_floor
              for p in points]
    values = [v for p in points for v in (p.rel_l2, p.aa_rel_l2) if v is not None]
    positive = [v for v in values + floors if v > 0]
    bottom = min(positive) / 10 if positive else 1e-12
    has_zero = any(v <= 0 for v in values)
    fig = Figure(figsize=(PANEL_SIZE[0] * 1.5, PANEL_SIZE[1] + 0.3))
    fig.subplots_adjust(left=0.12, right=0.97, top=0.88, bottom=0.18)
    ax = fig.add_subplot(1, 1, 1)
    layers = np.asarray([p.layer for p in points], dtype=float)
    for label, attr, color in ((_label(f"{doc.reference} vs {doc.variant}"), "rel_l2", COLOR_AB),
                               (_label(f"{doc.reference} vs A/A"), "aa_rel_l2", COLOR_AA)):
        ys = np.asarray([np.nan if getattr(p, attr) is None else max(getattr(p, attr), bottom) for p in points])
        if np.isfinite(ys).any():
            ax.plot(layers, ys, "-", marker="o", markersize=3, linewidth=1, color=color, label=label)
    ax.step(layers, floors, where="mid", linestyle="--", linewidth=1, color=COLOR_FLOOR, label="floor")
    if has_zero:
        ax.axhline(bottom, linestyle=":", linewidth=1, color="black", label="0 (bit-equal) drawn on this line")
    if doc.first is not None:
        ax.axvline(doc.first.layer, linewidth=0.8, color=COLOR_AB, alpha=0.5, label=f"first above: layer {doc.first.layer}")
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(bottom=bottom / 1.5, top=max(positive) * 3 if positive else 1.0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=6)
    ax.set_title("residual stream after each layer: relative L2 error", fontsize=8)
    ax.set_xlabel("layer", fontsize=7)
    ax.set_ylabel("rel L2", fontsize=7)
    ax.legend(fontsize=6, frameon=False, loc="best")
    return _png(fig)
