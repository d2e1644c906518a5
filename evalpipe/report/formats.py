"""How the reports write positions, excerpts and untrusted text: the formats every renderer
shares (markdown, HTML, the terminal, JUnit); numbers are evalpipe.number_format'."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from evalpipe.number_format import DASH

Esc = Callable[..., str]  # (text, max_len=None) -> safe text

EXCERPT_CHARS = 160
EXCERPT_CONTEXT = 48
CONTEXT_CHARS = 200
ELLIPSIS = "\u2026"


# Unicode categories Cc, Cs, Zl and Zp
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def show_controls(s: str, keep: str = "") -> str:
    """Control, lone-surrogate and line-separator characters (model output can hold any) as \\uXXXX.

    They break table rows, are invalid in HTML and cannot be encoded as UTF-8.
    """
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", s)


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
