"""How evalpipe writes a number for people, in one place: the verdict's reasons, the gates'
sentences, every report (markdown, HTML, the terminal, JUnit, the dashboard) and the
localization table use these, so a figure reads the same wherever it appears.

A missing value is written as ``missing`` (a dash in tables, "n/a" in sentences); NaN as
"n/a", and so are infinities except in a gate's value, where one is the largest difference
there is (a non-finite logprob); a minus sign as U+2212 where a column
of signed numbers is read.
"""

from __future__ import annotations

import math

DASH = "\u2014"
MINUS = "\u2212"
NOT_AVAILABLE = "n/a"


def _finite(x: float | None) -> float | None:
    return None if x is None or isinstance(x, bool) or not math.isfinite(x) else float(x)


def _minus(s: str) -> str:
    return MINUS + s[1:] if s.startswith("-") else s


def fmt_score(x: float | None) -> str:
    """A score (a mean of 0/1 items, a rate): three decimals."""
    return NOT_AVAILABLE if _finite(x) is None else f"{x:.3f}"


def fmt_delta(x: float | None) -> str:
    """A signed difference: three decimals, or two significant digits when smaller than that shows."""
    f = _finite(x)
    if f is None:
        return NOT_AVAILABLE
    if f == 0:
        return "0"
    return _minus(f"{f:+.3f}" if abs(f) >= 0.0005 else f"{f:+.2g}")


def fmt_small(x: float | None, missing: str = NOT_AVAILABLE) -> str:
    """A small magnitude (|dlogprob|, a relative error, a floor): two significant digits, zero as 0."""
    if x is None:
        return missing
    f = _finite(x)
    if f is None:
        return NOT_AVAILABLE
    return "0" if f == 0 else f"{f:.2g}"


def fmt_num(x: object, missing: str = DASH) -> str:
    """A gate's value: counts as integers, measurements with three significant digits (what is
    no number, a switch's value in a table of them, as its text)."""
    if x is None:
        return missing
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if math.isinf(x):  # a measure with a non-finite logprob on one side: the largest difference there is
        return _minus(str(x))
    f = _finite(x)
    if f is None:
        return NOT_AVAILABLE
    if f.is_integer() and abs(f) < 1e15:
        return str(int(f))
    return f"{f:.3g}"


def fmt_sig(x: float | None, digits: int = 4, missing: str = DASH) -> str:
    """A value on a chart or in a series: ``digits`` significant digits."""
    f = _finite(x)
    return missing if f is None else f"{f:.{digits}g}"


def fmt_lp(x: float | None) -> str:
    """A logprob: four significant digits."""
    f = _finite(x)
    return NOT_AVAILABLE if f is None else _minus(f"{f:.4g}")


def fmt_pct(n: int | None, total: int | None) -> str:
    """A count of a total, with its share: 5/6 (83.3%)."""
    if n is None or total is None:
        return DASH
    return f"{n}/{total} ({100.0 * n / total:.1f}%)" if total else "0/0"


def fmt_p(p: float | None) -> str:
    """A p-value: three decimals, below 0.001 as <0.001."""
    if p is None:
        return DASH
    if p >= 1.0:
        return "1"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    """An interval of signed differences."""
    return NOT_AVAILABLE if lo is None or hi is None else f"[{fmt_delta(lo)}, {fmt_delta(hi)}]"


def fmt_mean_se(mean: float | None, se: float | None) -> str:
    """A mean with its standard error."""
    return fmt_score(mean) if se is None or mean is None else f"{fmt_score(mean)} \u00b1 {fmt_score(se)}"
