"""Hostile text for the escaping tests: what a data file or a model output may hold.

Each payload would do something visible if a renderer let it through: run script
(``window.__pwned``, the page title), create an element (``#pwned``), become a link,
break a Markdown table or an XML file, or be evaluated as a template.
"""

from __future__ import annotations

from typing import Any

SCRIPT = "<script>window.__pwned=1;document.title='pwned'</script>"
IMG = '<img src=x onerror="window.__pwned=2">'
SVG = '"><svg onload="window.__pwned=3">'
IFRAME = "<iframe srcdoc=\"<script>parent.__pwned=4</script>\"></iframe>"
JS_URL = "javascript:window.__pwned=5"
MD_LINK = f"[click me]({JS_URL})"
A_TAG = f'<a id="pwned-link" href="{JS_URL}">click</a>'
BREAKOUT = "</td></tr></table></div><div id=\"pwned\">x</div>"
CDATA_END = "]]>"
CONTROLS = "\x00\x08\x0b\x1b[31m"
TABLE_ROW = "| --- | --- |"
TEMPLATE = "{{ 7*7 }}{% raw %}"
BACKTICKS = "``` `code` ~~strike~~ *em* _em_ # not a heading"
ENTITY = "&lt;b&gt; &#x6a;avascript:"

# Text a browser shows literally when escaping works (no control characters: those are
# shown as \uXXXX, checked separately).
VISIBLE = (SCRIPT, IMG, SVG, IFRAME, MD_LINK, A_TAG, BREAKOUT, CDATA_END, TABLE_ROW, TEMPLATE, BACKTICKS, ENTITY)
ALL = VISIBLE + (CONTROLS,)
# one string holding every payload, on several lines
TEXT = "\n".join(ALL)
ONE_LINE = " ".join(VISIBLE)


def poison(value: Any, text: str = TEXT) -> Any:
    """``value`` with ``text`` appended to every string in it (keys unchanged), so
    joins between equal strings still match."""
    if isinstance(value, dict):
        return {k: poison(v, text) for k, v in value.items()}
    if isinstance(value, list):
        return [poison(v, text) for v in value]
    if isinstance(value, str):
        return value + text
    return value
