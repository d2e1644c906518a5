"""The nightly trend dashboard: one self-contained HTML page over the run history.

The input is the dashboard's document (evalpipe.documents.dashboard_doc.DashboardData:
nights, score series, token series, flagged changes), built from the history. The page has no script and
nothing external: it is opened from file:// on machines without network, and kept
as a CI artifact. Charts are inline SVG drawn here rather than matplotlib images:
a year of nights has hundreds of charts and a matplotlib figure costs ~50 ms each,
while a path string costs microseconds. Tooltips are SVG ``<title>`` elements.

Every text in the document is untrusted (prompts, model outputs, component versions,
even task names). Safety rests on jinja2's autoescape: this module hands the
template raw text and numbers only; the one exception is SVG path data, which is
built here from floats alone. Hrefs additionally go through :func:`safe_href`,
because autoescape does not stop a ``javascript:`` URL.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any, Iterable, Sequence, Union
from urllib.parse import urlsplit

from evalpipe.documents.dashboard_doc import DashboardData, NightEntry, ScoreSeries, ScoreValue, TokenSeries, TokenValue
from evalpipe.documents.nightly_doc import SeriesChange
from evalpipe.number_format import fmt_p, fmt_sig
from evalpipe.report.formats import show_controls
from evalpipe.report.markdown import template_environment

TEMPLATE_NAME = "dashboard.html.j2"

# A night's statuses (NightStatus) are each styled as their own state: INCONCLUSIVE (amber)
# proved nothing about the code paths, which is neither a pass nor a regression.
Point = Union[ScoreValue, TokenValue]
DOTS_MAX = 60  # above this many points a chart shows the line and change markers only
FLIPPED_SHOWN = 20
PROMPT_MAX = 300

# Chart geometry (SVG user units; the CSS scales the whole chart).
WIDTH, HEIGHT = 360, 150
LEFT, RIGHT, TOP, BOTTOM = 46, 8, 8, 22
X0, X1 = LEFT, WIDTH - RIGHT
Y0, Y1 = TOP, HEIGHT - BOTTOM  # Y0 is the top of the plot area


# --- text and numbers -------------------------------------------------------------

def _text(value: Any, max_len: int | None = None) -> str:
    """Plain text for the autoescaping template: truncated, control characters shown as \\uXXXX
    (model output can hold any character; controls are invalid in HTML)."""
    if value is None:
        return ""
    s = str(value).replace("\r\n", "\n").replace("\r", "\n")
    if max_len is not None and len(s) > max_len:
        s = s[:max_len] + "\u2026"
    return show_controls(s, keep="\t\n")


def _num(value: float | None) -> float | None:
    """A finite float or None (missing, NaN and inf all mean: nothing to draw)."""
    return value if value is not None and math.isfinite(value) else None


def _is_fraction(*values: float | None) -> bool:
    nums = [_num(v) for v in values]
    return all(v is not None and -1.0 <= v <= 1.0 for v in nums)


def _fmt_delta(change: SeriesChange) -> str:
    """Score deltas of fraction metrics (accuracy, exact match) in percentage points, others raw."""
    delta = _num(change.delta)
    if delta is None:
        return "—"
    if change.kind == "score" and _is_fraction(change.before, change.after):
        return f"{delta * 100:+.1f} pts"
    return f"{delta:+.4g}"


def _short_night(night: str) -> str:
    """The date of an ISO date-time ("2025-03-01T02:00:00Z" -> "2025-03-01"); other text as is."""
    s = _text(night)
    return s.split("T", 1)[0] if len(s) > 10 and s[4:5] == "-" and s[10:11] in ("T", " ") else s


def safe_href(href: str | None) -> str | None:
    """A link target the page may use: relative paths and http(s)/file URLs only.

    Autoescape keeps an href inside its attribute, but ``javascript:`` or ``data:``
    would still run when clicked.
    """
    if not href:
        return None
    s = str(href).strip()
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in s):
        return None
    try:
        scheme = urlsplit(s).scheme.lower()
    except ValueError:
        return None
    # a Windows drive letter parses as a one-letter scheme
    return s if scheme in ("", "http", "https", "file") or len(scheme) == 1 else None


# --- chart geometry -----------------------------------------------------------------


def _c(v: float) -> str:
    """A coordinate rounded to 0.1 unit, without a trailing ".0" (keeps long paths compact)."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


class _Linear:
    def __init__(self, lo: float, hi: float):
        self.data_lo, self.data_hi = lo, hi
        if hi - lo < 1e-12:
            pad = max(abs(hi) * 0.05, 0.01)
        else:
            pad = (hi - lo) * 0.08
        self.lo, self.hi = lo - pad, hi + pad

    def __call__(self, v: float) -> float:
        return Y1 - (v - self.lo) / (self.hi - self.lo) * (Y1 - Y0)

    def ticks(self) -> list[tuple[float, str]]:
        # labelled at the data's own min and max (not the padded edges): the numbers a reader wants
        lo, hi = self.data_lo, self.data_hi
        if hi - lo < 1e-12:
            return [(self(lo), f"{lo:.4g}")]
        return [(self(v), f"{v:.4g}") for v in (lo, (lo + hi) / 2, hi)]


class _Log:
    """log10 scale; zero and negative values sit on the floor, one decade below the smallest positive one."""

    def __init__(self, values: Iterable[float]):
        vals = list(values)
        pos = [v for v in vals if v > 0]
        self.has_floor = len(pos) < len(vals)
        if pos:
            lo_e = math.floor(math.log10(min(pos)))
            hi_e = math.ceil(math.log10(max(pos)))
            if self.has_floor:
                lo_e -= 1
        else:
            lo_e, hi_e = -6, -5
        if hi_e <= lo_e:
            hi_e = lo_e + 1
        self.lo_e, self.hi_e = lo_e, hi_e

    def __call__(self, v: float) -> float:
        e = math.log10(v) if v > 0 else self.lo_e
        e = max(e, self.lo_e)
        return Y1 - (e - self.lo_e) / (self.hi_e - self.lo_e) * (Y1 - Y0)

    def ticks(self) -> list[tuple[float, str]]:
        span = self.hi_e - self.lo_e
        step = max(1, math.ceil(span / 4))
        exps = list(range(self.lo_e, self.hi_e + 1, step))
        if exps[-1] != self.hi_e:
            exps.append(self.hi_e)
        out = []
        for e in exps:
            label = f"1e{e}"
            if e == self.lo_e and self.has_floor:
                label = f"≤{label}"
            out.append((self(10.0**e), label))
        return out


def _x_positions(points: Sequence[Point], night_index: dict[str, int], n_nights: int) -> list[float]:
    """x of each point: the night's place in the whole history, so every chart lines up with the
    timeline; points of unknown nights fall back to their own order."""
    found = [night_index.get(p.run_id) for p in points]
    idx = [i for i in found if i is not None]
    if idx and len(idx) == len(found):  # every night known
        lo, hi = 0, max(n_nights - 1, 0)
    else:
        idx, lo, hi = list(range(len(points))), 0, max(len(points) - 1, 0)
    if hi == lo:
        return [(X0 + X1) / 2 for _ in idx]
    return [X0 + (i - lo) / (hi - lo) * (X1 - X0) for i in idx]


def _segments(xs: Sequence[float], ys: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive points with a value; a None breaks the line (a gap, not a zero)."""
    out: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for x, y in zip(xs, ys):
        if y is None:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append((x, y))
    if cur:
        out.append(cur)
    return out


def _line_path(xs: Sequence[float], ys: Sequence[float | None]) -> str:
    parts = []
    for seg in _segments(xs, ys):
        parts.append("M" + " L".join(f"{_c(x)},{_c(y)}" for x, y in seg))
        if len(seg) == 1:
            parts.append("h0")  # a lone point: with round caps this draws a dot
    return "".join(parts)


def _band_path(xs: Sequence[float], lows: Sequence[float | None], highs: Sequence[float | None]) -> str:
    """The confidence band: one closed sub-path per run of points that have both bounds."""
    both = [None if lo is None or hi is None else (lo, hi) for lo, hi in zip(lows, highs)]
    parts = []
    cur: list[tuple[float, float, float]] = []
    for x, b in list(zip(xs, both)) + [(0.0, None)]:
        if b is not None:
            cur.append((x, b[0], b[1]))
            continue
        if len(cur) == 1:
            x1, lo1, hi1 = cur[0]
            parts.append(f"M{_c(x1 - 2)},{_c(hi1)} H{_c(x1 + 2)} V{_c(lo1)} H{_c(x1 - 2)}Z")
        elif cur:
            top = " L".join(f"{_c(x)},{_c(hi)}" for x, _, hi in cur)
            bottom = " L".join(f"{_c(x)},{_c(lo)}" for x, lo, _ in reversed(cur))
            parts.append(f"M{top} L{bottom}Z")
        cur = []
    return "".join(parts)


def _point_title(p: Point, value: float | None, extra: str = "") -> str:
    return f"{_text(p.night)} · {_text(p.run_id)}: {fmt_sig(value)}{extra}"


def _markers(points: Sequence[Point], xs: Sequence[float], ys: Sequence[float | None], changes: Sequence[int],
             scale_y: Any) -> list[dict[str, Any]]:
    out = []
    for i in changes:
        if not 0 <= i < len(points):
            continue
        p = points[i]
        out.append({
            "run_id": _text(p.run_id),
            "x": _c(xs[i]),
            "y": None if ys[i] is None else _c(scale_y(ys[i])),
            "title": "flagged change starts here — " + _point_title(p, ys[i]),
        })
    return out


def _axis(points: Sequence[Point], xs: Sequence[float], scale: Any) -> dict[str, Any]:
    ticks = [{"y": _c(y), "label": label} for y, label in scale.ticks()]
    xl = []
    if points:
        xl.append({"x": _c(xs[0]), "label": _short_night(points[0].night), "anchor": "start"})
        if len(points) > 1:
            xl.append({"x": _c(xs[-1]), "label": _short_night(points[-1].night), "anchor": "end"})
    return {"yticks": ticks, "xlabels": xl}


def _dots(points: Sequence[Point], xs: Sequence[float], ys: Sequence[float | None], scale_y: Any,
          reports: dict[str, str | None], title: Any) -> list[dict[str, Any]]:
    """The clickable dots with tooltips; `title(i)` is only called for drawn dots (long histories draw none)."""
    if len(points) > DOTS_MAX:
        return []
    return [
        {"x": _c(x), "y": _c(scale_y(y)), "title": title(i), "href": reports.get(p.run_id)}
        for i, (p, x, y) in enumerate(zip(points, xs, ys))
        if y is not None
    ]


def score_chart(series: ScoreSeries, night_index: dict[str, int], n_nights: int,
                reports: dict[str, str | None]) -> dict[str, Any]:
    """Geometry of one score chart: line, confidence band, A/A band, dots, change markers."""
    points = series.points
    xs = _x_positions(points, night_index, n_nights)
    vals = [_num(p.value) for p in points]
    lows = [_num(p.ci_low) for p in points]
    highs = [_num(p.ci_high) for p in points]
    band = series.aa_band
    aa_lo = _num(band.low) if band else None
    aa_hi = _num(band.high) if band else None
    domain = [v for v in vals + lows + highs + [aa_lo, aa_hi] if v is not None]
    chart: dict[str, Any] = {
        "kind": "score",
        "task": _text(series.task),
        "metric": _text(series.metric),
        "variant": _text(series.variant),
        "n_points": len(points),
        "empty": not any(v is not None for v in vals),
    }
    scale = _Linear(min(domain), max(domain)) if domain else _Linear(0.0, 1.0)
    ys = [None if v is None else scale(v) for v in vals]
    chart["line"] = _line_path(xs, ys)
    chart["aa_line"] = ""  # token charts only: the score's A/A is the band
    chart["band"] = _band_path(xs, [None if v is None else scale(v) for v in lows],
                               [None if v is None else scale(v) for v in highs])
    if aa_lo is not None and aa_hi is not None:
        top, bottom = scale(max(aa_lo, aa_hi)), scale(min(aa_lo, aa_hi))
        chart["aa"] = {"y": _c(top), "h": _c(max(bottom - top, 0.5)),
                       "title": f"A/A noise band {fmt_sig(aa_lo)} – {fmt_sig(aa_hi)}"}
    else:
        chart["aa"] = None

    def title(i: int) -> str:
        p, lo, hi = points[i], lows[i], highs[i]
        extra = f" (CI {fmt_sig(lo)} – {fmt_sig(hi)})" if lo is not None and hi is not None else ""
        if p.n is not None:
            extra += f", n={p.n}"
        return _point_title(p, vals[i], extra)

    chart["dots"] = _dots(points, xs, vals, scale, reports, title)
    chart["markers"] = _markers(points, xs, vals, series.changes, scale)
    chart["axis"] = _axis(points, xs, scale)
    last = next((v for v in reversed(vals) if v is not None), None)
    chart["latest"] = fmt_sig(last)
    chart["aa_text"] = f"A/A band {fmt_sig(aa_lo)} – {fmt_sig(aa_hi)}" if chart["aa"] else "no A/A band"
    return chart


def token_chart(series: TokenSeries, night_index: dict[str, int], n_nights: int,
                reports: dict[str, str | None]) -> dict[str, Any]:
    """Geometry of one token-measure chart: the A/B value and the same night's A/A value."""
    points = series.points
    xs = _x_positions(points, night_index, n_nights)
    vals = [_num(p.value) for p in points]
    aas = [_num(p.aa_value) for p in points]
    log = series.log
    present = [v for v in vals + aas if v is not None]
    if log:
        scale: Any = _Log(present)
    else:
        scale = _Linear(min(present + [0.0]), max(present + [0.0])) if present else _Linear(0.0, 1.0)
    ys = [None if v is None else scale(v) for v in vals]
    aa_ys = [None if v is None else scale(v) for v in aas]

    def title(i: int) -> str:
        return _point_title(points[i], vals[i], f" (A/A {fmt_sig(aas[i])})" if aas[i] is not None else "")

    last = next((v for v in reversed(vals) if v is not None), None)
    return {
        "kind": "token",
        "task": _text(series.task),
        "metric": _text(series.measure),
        "variant": _text(series.variant),
        "log": log,
        "n_points": len(points),
        "empty": not present,
        "line": _line_path(xs, ys),
        "aa_line": _line_path(xs, aa_ys),
        "band": "",
        "aa": None,
        "dots": _dots(points, xs, vals, scale, reports, title),
        "markers": _markers(points, xs, vals, series.changes, scale),
        "axis": _axis(points, xs, scale),
        "latest": fmt_sig(last),
        "aa_text": "log scale, 0 drawn at the floor" if log else "linear scale",
    }


# --- the view -----------------------------------------------------------------------


def _night_view(n: NightEntry) -> dict[str, Any]:
    status = n.status.value
    reasons = [_text(r, 500) for r in n.reasons]
    verdict = _text(n.verdict.value) if n.verdict else ""
    lines = [f"{_text(n.night)} · {status}" + (f" · {verdict}" if verdict else ""),
             f"run {_text(n.run_id)}" + (f", baseline {_text(n.baseline)}" if n.baseline else "")]
    lines += [f"– {r}" for r in reasons]
    return {
        "run_id": _text(n.run_id),
        "night": _text(n.night),
        "date": _short_night(n.night),
        "status": status,
        "cls": status.lower(),
        "verdict": verdict,
        "baseline": _text(n.baseline),
        "report": safe_href(n.report),
        "reasons": reasons,
        "title": "\n".join(lines),
    }


def _change_view(c: SeriesChange, chart_ids: dict[tuple[str, str, str, str], str]) -> dict[str, Any]:
    key = (c.kind, _text(c.task), _text(c.metric), _text(c.variant))
    return {
        "kind": c.kind,
        "task": key[1],
        "metric": key[2],
        "variant": key[3],
        "run_id": _text(c.run_id),
        "night": _text(c.night),
        "date": _short_night(c.night),
        "direction": c.direction,
        "arrow": {"down": "↓", "up": "↑"}[c.direction],
        "before": fmt_sig(c.before),
        "after": fmt_sig(c.after),
        "delta": _fmt_delta(c),
        "p_value": fmt_p(c.p_value),
        "lasting": ("open: the new level lasts to the latest night" if c.open else "closed")
        + f" ({c.nights_after} night{'' if c.nights_after == 1 else 's'} after)",
        "open": c.open,
        "summary": _text(c.summary, 1000),
        "flipped": [
            {"doc_id": str(f.doc_id), "repeat": str(f.repeat), "before": fmt_sig(f.before),
             "after": fmt_sig(f.after), "prompt": _text(f.prompt, PROMPT_MAX)}
            for f in c.flipped[:FLIPPED_SHOWN]
        ],
        "flipped_total": len(c.flipped),
        "flipped_more": max(len(c.flipped) - FLIPPED_SHOWN, 0),
        "bisect": [{"component": _text(b.component), "before": _text(b.before, 300), "after": _text(b.after, 300)}
                   for b in c.bisect],
        "last_good": _text(c.last_good),
        "first_bad": _text(c.first_bad),
        "report": safe_href(c.report),
        "chart": chart_ids.get(key),
    }


def build_view(data: DashboardData) -> dict[str, Any]:
    """Everything the template shows, as raw text, numbers and path strings."""
    nights = [_night_view(n) for n in data.nights]
    night_index = {n["run_id"]: i for i, n in enumerate(nights)}
    reports = {n["run_id"]: n["report"] for n in nights}

    tasks: dict[str, dict[str, Any]] = {}
    chart_ids: dict[tuple[str, str, str, str], str] = {}

    def task(name: str) -> dict[str, Any]:
        if name not in tasks:
            tasks[name] = {"name": name, "anchor": f"task-{len(tasks)}", "scores": [], "tokens": []}
        return tasks[name]

    n = 0
    for s in data.series:
        ch = score_chart(s, night_index, len(nights), reports)
        ch["id"] = f"chart-{n}"
        n += 1
        chart_ids.setdefault(("score", ch["task"], ch["metric"], ch["variant"]), ch["id"])
        task(ch["task"])["scores"].append(ch)
    for t in data.token_series:
        ch = token_chart(t, night_index, len(nights), reports)
        ch["id"] = f"chart-{n}"
        n += 1
        chart_ids.setdefault(("token", ch["task"], ch["metric"], ch["variant"]), ch["id"])
        task(ch["task"])["tokens"].append(ch)

    counts = {k: sum(1 for x in nights if x["cls"] == k) for k in ("pass", "inconclusive", "regression", "failed")}
    return {
        "title": _text(data.title) or "evalpipe nightly",
        "generated_at": _text(data.generated_at),
        "database": _text(data.database),
        "nights": nights,
        "latest": nights[-1] if nights else None,
        "counts": counts,
        "changes": [_change_view(c, chart_ids) for c in data.changes],
        "tasks": list(tasks.values()),
        "n_charts": n,
        "dots_max": DOTS_MAX,
        "flipped_shown": FLIPPED_SHOWN,
        "width": WIDTH,
        "height": HEIGHT,
        "plot": {"x0": X0, "x1": X1, "y0": Y0, "y1": Y1},
    }


def render_dashboard(data: DashboardData) -> str:
    """The dashboard page from its document (nights, series, token_series, changes)."""
    return template_environment(autoescape=True).get_template(TEMPLATE_NAME).render(**build_view(data))
