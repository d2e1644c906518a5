"""The "Where it starts" section of the reports: localize.json (`evalpipe localize`) as a
sentence, a short table and two plots.

Pure: a :class:`~evalpipe.documents.localization.LocalizeDocument` in, text and data out.
Every text of the document (labels, names, titles, flags, reasons) goes through the
caller's ``esc`` (:func:`evalpipe.report.markdown.md_escape` or
:func:`evalpipe.report.html.html_text`); the numbers are formatted here.

The table is short on purpose: a model has dozens of layers times seven modules, and
localize.json holds them all. Shown are the first module above its floor with the few
before and after it, then one row per later layer (the residual stream after it), so the
growth of the difference reads down the table; without any module above its floor, the
modules closest to theirs.
"""

from __future__ import annotations

from typing import Any

from evalpipe.compare.localize import MODULES
from evalpipe.documents.localization import LocalizeDocument, ModuleDoc
from evalpipe.number_format import DASH, fmt_small
from evalpipe.report.formats import Esc

MAX_ROWS = 15
BEFORE_FIRST = 2  # modules shown before the first one above its floor
AFTER_FIRST = 4  # and after it in its layer, before one row per later layer
CLOSEST = 5  # without a module above its floor: the ones closest to theirs
MAX_NOT_REASSEMBLED = 5
LAYER_ROW = "layer.out"  # the module that stands for a whole layer in the growth rows

COLUMNS = ("layer", "module", "rel L2", "A/A rel L2", "floor", "cosine", "max abs", "worst positions")


def fmt_cosine(x: float | None) -> str:
    """Cosines sit just below 1: the distance from 1 is what tells them apart."""
    if x is None:
        return DASH
    return "1" if x == 1 else f"1 \u2212 {1 - x:.2g}" if 0.99 <= x < 1 else f"{x:.4g}"


def module_order(doc: LocalizeDocument) -> list[str]:
    """The doc's module names in forward order (MODULES first, any other after, as met)."""
    present = list(dict.fromkeys(m.module for m in doc.modules))
    known = [name for name in MODULES if name in present]
    return known + [name for name in present if name not in MODULES]


def _ratio(m: ModuleDoc) -> float:
    """How far a module is from its floor, for ranking (no value: the lowest; NaN or inf: the highest)."""
    if m.nonfinite:
        return float("inf")
    if m.rel_l2 is None:
        return -1.0
    if m.floor <= 0:
        return float("inf") if m.rel_l2 > 0 else 0.0
    return m.rel_l2 / m.floor


def selected_modules(doc: LocalizeDocument) -> tuple[list[ModuleDoc], int]:
    """(the table's modules in forward order, how many modules above their floor it leaves out)."""
    modules = list(doc.modules)
    first = next((i for i, m in enumerate(modules) if m.above), None)
    if first is None:
        closest = sorted(range(len(modules)), key=lambda i: -_ratio(modules[i]))[:CLOSEST]
        return [modules[i] for i in sorted(closest) if modules[i].rel_l2 is not None], 0
    layer = modules[first].layer
    # the neighbourhood stays in the first's layer: later layers get one row each
    picked = [i for i in range(max(0, first - BEFORE_FIRST), min(len(modules), first + AFTER_FIRST + 1))
              if i <= first or modules[i].layer == layer]
    later = [i for i, m in enumerate(modules) if m.layer > layer and i not in picked and _stands_for_layer(m, modules)]
    slots = max(0, MAX_ROWS - len(picked))
    if len(later) > slots:
        # evenly over the later layers, the last one included: the growth to the output reads down the table
        later = [later[round(k * (len(later) - 1) / (slots - 1))] for k in range(slots)] if slots > 1 else later[-slots:]
    picked = sorted(set(picked + later))
    above_left_out = sum(1 for i, m in enumerate(modules) if m.above and i not in picked)
    return [modules[i] for i in picked], above_left_out


def _stands_for_layer(m: ModuleDoc, modules: list[ModuleDoc]) -> bool:
    """layer.out where the layer has it, else the layer's module furthest from its floor."""
    same = [x for x in modules if x.layer == m.layer]
    if any(x.module == LAYER_ROW for x in same):
        return m.module == LAYER_ROW
    return m is max(same, key=_ratio)


def _worst(m: ModuleDoc, esc: Esc) -> list[str]:
    out = []
    for w in m.worst:
        text = f"{esc(w.label)} @ {w.position}: {fmt_small(w.rel_l2, DASH)}"
        if w.flags:
            text += f" ({esc('; '.join(w.flags))})"
        out.append(text)
    return out


def _row(m: ModuleDoc, esc: Esc, first: ModuleDoc | None) -> dict[str, Any]:
    return {
        "layer": str(m.layer),
        "module": esc(m.module),
        "title": esc(m.title),
        "rel_l2": fmt_small(m.rel_l2, DASH) + (f" (NaN/inf at {m.nonfinite})" if m.nonfinite else ""),
        "aa_rel_l2": fmt_small(m.aa_rel_l2, DASH),
        "floor": fmt_small(m.floor, DASH),
        "cosine": fmt_cosine(m.cosine),
        "max_abs": fmt_small(m.max_abs, DASH),
        "worst": _worst(m, esc),
        "above": m.above,
        "first": first is not None and (m.layer, m.module) == (first.layer, first.module),
        "not_reassembled": esc(m.not_reassembled) if m.not_reassembled else "",
    }


def _configurations(doc: LocalizeDocument, esc: Esc) -> list[tuple[str, str]]:
    rows = [("reference", esc(doc.reference)), ("variant", esc(doc.variant)),
            ("A/A", esc(doc.aa) if doc.aa is not None else "none (the numerics floor alone)")]
    modes = ", ".join(f"{esc(name)} {mode}" for name, mode in doc.modes.items())
    engine = f"{modes}; {esc(doc.precision)}" + (f" ({esc(doc.dtype)})" if doc.dtype else "")
    rows.append(("engine", engine))
    rows.append(("sequences", f"{len(doc.sequences)}, {sum(len(s.rows) for s in doc.sequences)} positions captured"))
    return rows


def _floor_text(doc: LocalizeDocument, esc: Esc) -> str:
    text = (f"A module is above its floor when its relative L2 error exceeds max(numerics floor "
            f"{fmt_small(doc.numerics_floor, DASH)} for {esc(doc.precision)}, {doc.rel_aa:g} \u00d7 its A/A relative L2 error).")
    if doc.aa is None:
        return text + " No A/A configuration ran: every floor is the numerics floor."
    if doc.aa_identical:
        return text + " The A/A run is bitwise identical at every module (a deterministic engine): every floor is the numerics floor."
    return text


def view(doc: LocalizeDocument, esc: Esc) -> dict[str, Any]:
    """The section's content for both reports; texts already passed through ``esc``."""
    modules, left_out = selected_modules(doc)
    total_above = sum(1 for m in doc.modules if m.above)
    notes = [esc(line) for line in doc.not_reassembled[:MAX_NOT_REASSEMBLED]]
    if len(doc.not_reassembled) > MAX_NOT_REASSEMBLED:
        notes.append(f"\u2026 {len(doc.not_reassembled) - MAX_NOT_REASSEMBLED} more in localize.json")
    if doc.first is None:
        caption = "No module is above its floor; the modules closest to theirs:"
    else:
        later = {m.layer for m in doc.modules if m.layer > doc.first.layer}
        which = "each later layer" if later <= {m.layer for m in modules} else "later layers, evenly spaced"
        caption = (f"{total_above} of {len(doc.modules)} modules are above their floor. The first, the modules "
                   f"around it and the residual stream after {which}:")
    return {
        "sentence": esc(doc.sentence),
        "variant": esc(doc.variant),
        "caption": caption,
        "columns": COLUMNS,
        "rows": [_row(m, esc, doc.first) for m in modules],
        "more": f"{left_out} more modules above their floor are in localize.json." if left_out else "",
        "configurations": _configurations(doc, esc),
        "floor": _floor_text(doc, esc),
        "not_reassembled": notes,
    }


def markdown_section(doc: LocalizeDocument, esc: Esc) -> str:
    """One variant's part of report.md's "## Where it starts" section (the template writes the heading once)."""
    v = view(doc, esc)
    lines = [f"**{v['variant']}**: {v['sentence']}", ""]
    if v["rows"]:
        lines += [v["caption"], "",
                  "| " + " | ".join(COLUMNS) + " |",
                  "|---:|---|" + "---:|" * (len(COLUMNS) - 3) + "---|"]
        for r in v["rows"]:
            rel = f"**{r['rel_l2']}**" if r["above"] else r["rel_l2"]
            module = f"{r['module']}: {r['title']}"
            if r["first"]:
                module = f"**{module}** (first)"
            lines.append(f"| {r['layer']} | {module} | {rel} | {r['aa_rel_l2']} | {r['floor']} | {r['cosine']} | "
                         f"{r['max_abs']} | {'; '.join(r['worst']) or DASH} |")
        lines.append("")
        if v["more"]:
            lines += [v["more"], ""]
    lines += ["| configuration | |", "|---|---|"]
    lines += [f"| {k} | {value} |" for k, value in v["configurations"]]
    lines += ["", v["floor"], ""]
    if v["not_reassembled"]:
        lines += ["Could not be reassembled (left out of the comparison):", ""]
        lines += [f"- {line}" for line in v["not_reassembled"]]
        lines.append("")
    return "\n".join(lines)


def terminal_sentence(doc: LocalizeDocument) -> str:
    """One line for the terminal summary (plain text; the caller shows control characters)."""
    return f"{doc.variant}: {doc.sentence}"
