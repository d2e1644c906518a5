"""How the reports write numbers, positions and untrusted text: the formats every
renderer shares (markdown, HTML, the terminal, JUnit), so a figure reads the same in each."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from evalpipe.compare.verdict import fmt_delta, fmt_score

Esc = Callable[..., str]  # (text, max_len=None) -> safe text

EXCERPT_CHARS = 160
EXCERPT_CONTEXT = 48
CONTEXT_CHARS = 200
DASH = "\u2014"
ELLIPSIS = "\u2026"


# Unicode categories Cc, Cs, Zl and Zp
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def show_controls(s: str, keep: str = "") -> str:
    """Control, lone-surrogate and line-separator characters (model output can hold any) as \\uXXXX.

    They break table rows, are invalid in HTML and cannot be encoded as UTF-8.
    """
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", s)


# ---------------------------------------------------------------------------
# number formatting
# ---------------------------------------------------------------------------


def fmt_num(x: Any) -> str:
    """Gate values: counts as integers, measurements with 3 significant digits."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return DASH if x is None else str(x)
    if not math.isfinite(x):
        return "n/a"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.3g}"


def fmt_lp(x: float | None) -> str:
    if x is None:
        return "n/a"
    s = f"{x:.4g}"
    return "\u2212" + s[1:] if s.startswith("-") else s


def fmt_pct(n: int | None, total: int | None) -> str:
    if n is None or total is None:
        return DASH
    return f"{n}/{total} ({100.0 * n / total:.1f}%)" if total else "0/0"


def fmt_p(p: float | None) -> str:
    if p is None:
        return DASH
    if p >= 1.0:
        return "1"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def fmt_mean_se(mean: float | None, se: float | None) -> str:
    return fmt_score(mean) if se is None or mean is None else f"{fmt_score(mean)} \u00b1 {fmt_score(se)}"


def fmt_where(doc: Any, repeat: Any, pos: Any = None) -> str:
    s = f"doc {doc}" + (f" repeat {repeat}" if repeat else "")
    return s if pos is None else f"{s} pos {pos}"


def fmt_positions(items: Sequence[Sequence[int]] | None, total: int | None) -> str:
    """'doc 3 pos 5, doc 7 repeat 1 pos 0 (first 2 of 31)', or '' when there is none."""
    listed = [fmt_where(*item) for item in items or () if len(item) == 3]
    if not listed:
        return ""
    more = f" (first {len(listed)} of {total})" if total and total > len(listed) else ""
    return ", ".join(listed) + more


def fmt_triple(v: Any) -> str:
    return fmt_where(*v) if isinstance(v, (list, tuple)) and len(v) == 3 else DASH


# ---------------------------------------------------------------------------
# examples (flipped items, worst positions)
# ---------------------------------------------------------------------------


def excerpts(a: str | None, b: str | None) -> tuple[str, str]:
    """Windows of both responses around their first differing character."""
    a, b = a or "", b or ""
    k = 0
    for k, (x, y) in enumerate(zip(a, b)):  # noqa: B007 - k is read after the loop
        if x != y:
            break
    else:
        k = min(len(a), len(b))
    start = max(0, k - EXCERPT_CONTEXT) if a != b else 0

    def cut(s: str) -> str:
        piece = s[start : start + EXCERPT_CHARS]
        return (ELLIPSIS if start > 0 else "") + piece + (ELLIPSIS if start + EXCERPT_CHARS < len(s) else "")

    return cut(a), cut(b)


def quoted(text: Any) -> str:
    # Token texts are mostly whitespace and fragments: a JSON literal shows " the" and "\n" as they are.
    return json.dumps(str(text), ensure_ascii=False)
