"""The report's "what ran" part: compare.json's path evidence (each side's probes, judged)
as a table of switches, processes, models, layers, calls and collectives per variant,
and the rules that make a comparison INCONCLUSIVE when its paths prove nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from evalpipe.compare.code_paths import short
from evalpipe.documents.comparison import FAILED, NOT_RECORDED, SAME_CODE, VERIFIED, Comparison, ComparisonDocument, Paths, SideCheck, Status
from evalpipe.documents.manifest import ProbeSummary
from evalpipe.number_format import DASH, fmt_num
from evalpipe.probes.record import bin_tokens
from evalpipe.report.formats import Esc

# ---------------------------------------------------------------------------
# what ran (compare.json "paths": the path probes of each side, judged)
# ---------------------------------------------------------------------------

# The switches that decide how the model is laid out over processes: a row each, equal or not.
LAYOUT_SWITCHES = (
    "tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size", "enable_expert_parallel",
    "all2all_backend", "use_sequence_parallel_moe", "attention_backends", "dtype",
)
# The kernels vLLM's CPU build chose by processor (the probes' cpu_kernels): a row wherever
# recorded, equal or not, since the same config runs other kernels on another x86 kind.
PROCESSOR_SWITCHES = ("cpu_kernels",)
# How the engine samples, as it resolved it: a row each where a comparison sampled
# (docs/sampling.md: what common random numbers need from the engine).
SAMPLER_SWITCHES = ("use_v2_model_runner", "logprobs_mode", "speculative_config", "seed")
NOT_RECORDED_CELL = "not recorded"
ENDPOINT_CELL = "not verifiable (endpoint)"
PATH_SENTENCES = {
    FAILED: "the paths failed their expectations",
    SAME_CODE: "both sides ran the same code",
    VERIFIED: "each side ran the path its expectations declare",
    NOT_RECORDED: "the path probes recorded nothing to judge",
}
INCONCLUSIVE_NOTE = (
    "INCONCLUSIVE: the outputs were compared, but the path probes do not show each side running the code it "
    "claims, so the comparison proves nothing about the change (see What ran)."
)


def unverified_note(compare: ComparisonDocument) -> str:
    """The reports' first words when variants were compared without their manifest; "" otherwise."""
    names = compare.unverified or []
    if not names:
        return ""
    sides = ", ".join(names)
    whose = "its files were" if len(names) == 1 else "their files were"
    return (f"Compared unverified (--unverified): {sides} had no manifest.json, so {whose} not checked against "
            f"what the engine wrote; every comparison that read {'it' if len(names) == 1 else 'them'} is "
            f"{Status.INCONCLUSIVE.value}, whatever the outputs say.")


def _side_summary(c: Comparison, side: str) -> ProbeSummary | None:
    """what_ran.a (the reference) or what_ran.b (the variant) of a comparison."""
    if c.paths is None:
        return None
    return c.paths.what_ran.a if side == "a" else c.paths.what_ran.b


def _side_check(c: Comparison, variant: str) -> SideCheck | None:
    checks = c.paths.checks if c.paths is not None else []
    return next((ch for ch in checks if ch.variant == variant), None)


@dataclass(frozen=True)
class _Column:
    """One side in the what-ran table: its summary (None: not recorded) and its expectations' check."""

    name: str
    role: str  # "reference", "A/A", or "" for a compared variant
    summary: ProbeSummary | None
    check: SideCheck | None

    @property
    def recorded(self) -> bool:
        return self.summary is not None and self.summary.verifiable

    @property
    def values(self) -> ProbeSummary:
        """The summary of a recorded column."""
        if self.summary is None:
            raise ValueError(f"the what-ran column {self.name} recorded nothing")
        return self.summary

    @property
    def missing(self) -> str:
        """What the column says instead of values when it has none."""
        return NOT_RECORDED_CELL if self.summary is None else ENDPOINT_CELL


def _columns(compare: ComparisonDocument) -> list[_Column]:
    """The reference, every compared variant, then the A/A run."""
    entries = [c for c, _ in compare.judged_entries()]
    reference = compare.reference
    # every comparison shares the reference: the first one that recorded it speaks for all
    ref_summary = next((s for c in entries if (s := _side_summary(c, "a")) is not None), None)
    ref_check = next((ch for c in entries if (ch := _side_check(c, reference)) is not None), None)
    columns = [_Column(reference, "reference", ref_summary, ref_check)]
    for c, aa in compare.judged_entries():
        columns.append(_Column(c.variant, "A/A" if aa else "", _side_summary(c, "b"), _side_check(c, c.variant)))
    return columns


def _value_text(value: Any) -> str:
    """A switch value as a reader writes it: strings bare, lists comma-joined, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) if value else "[]"
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _switch_cell(name: str, summary: ProbeSummary) -> str:
    if name not in summary.switches:
        return DASH
    value = summary.switches[name]
    # the engine's own value, any JSON; processes that resolved it differently are listed
    if isinstance(value, dict) and isinstance(value.get("per_process"), list):
        return " | ".join(_value_text(v) for v in value["per_process"])
    return _value_text(value)


def _processes_cell(summary: ProbeSummary) -> str:
    listed = ", ".join(f"{n} {role}" for role, n in summary.processes.items()) or "no process recorded"
    reused = f" (reused {summary.server_of}'s server)" if summary.server_of else ""
    return f"{summary.mode}: {listed}{reused}"


def _nodes_cell(summary: ProbeSummary) -> str:
    """"node 0: DP 0; node 1: DP 1": where a deployment's ranks built the model."""
    if not summary.nodes:
        return "one node"
    return "; ".join(f"node {node}: DP {', '.join(map(str, ranks)) or '?'}" for node, ranks in summary.nodes.items())


def _models_cell(summary: ProbeSummary) -> str:
    return ", ".join(short(m) for m in summary.models) or "none"


def _layers_cell(summary: ProbeSummary) -> str:
    return ", ".join(f"{n} \u00d7 {short(cls)}" for cls, n in sorted(summary.layers.items())) or "none"


def _calls_cell(name: str, summary: ProbeSummary) -> str:
    if name in summary.absent:
        return "absent"
    return fmt_num(summary.calls[name]) if name in summary.calls else DASH


def _collective_cell(kind: str, summary: ProbeSummary) -> str:
    """"3 in 40/48, 0 in 8/48": each count of calls in one forward pass, most frequent first."""
    entry = summary.collectives_per_forward.get(kind)
    forwards = entry.forwards if entry is not None else summary.forwards
    if not forwards:
        return "no forward pass"
    # a kind this side never called is 0 in every forward pass
    counts = (entry.counts if entry is not None else {}) or {"0": forwards}
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{value} in {n}/{forwards}" for value, n in ordered)


def _tokens_per_forward_cell(summary: ProbeSummary) -> str:
    """"1: 230, 2-3: 4, 64-127: 8": the passes of each size bin, smallest first (the batch
    shapes the engine ran: one request decoding alone, decode batches, prefill chunks)."""
    if not summary.tokens_per_forward:
        return NOT_RECORDED_CELL
    return ", ".join(f"{bin_tokens(key)}: {fmt_num(n)}" for key, n in summary.tokens_per_forward.items())


def _no_collectives_cell(summary: ProbeSummary) -> str:
    forwards = summary.forwards
    return f"none in {forwards}/{forwards}" if forwards else "no forward pass"


def _expectations_cell(check: SideCheck | None) -> str:
    if check is None:
        return DASH
    if check.ok:
        return "\u2713"
    failures = len(check.failures)
    return f"{failures} failed" if failures else "not verified"


def _names_in(columns: Sequence[_Column], names_of: Callable[[ProbeSummary], Iterable[str]]) -> list[str]:
    """The names each column's summary lists, in the order the columns first name them."""
    names: dict[str, None] = {}
    for col in columns:
        names.update(dict.fromkeys(names_of(col.values)))
    return list(names)


Cell = Callable[[ProbeSummary], str]


def _row_makers(recorded: Sequence[_Column], sampled: bool = False) -> list[tuple[str, Cell]]:
    """(label, cell of one summary) per row, the rows that depend on what was recorded included."""
    rows: list[tuple[str, Cell]] = [("processes", _processes_cell)]
    if any(col.values.nodes for col in recorded):  # a deployment over several nodes: node x rank
        rows.append(("nodes × data-parallel ranks", _nodes_cell))
    rows += [("model", _models_cell), ("decoder layers", _layers_cell)]
    kinds = _names_in(recorded, lambda s: s.collectives_per_forward)
    if kinds:
        rows += [(f"{kind} per forward pass", partial(_collective_cell, kind)) for kind in sorted(kinds)]
    else:
        rows.append(("collectives per forward pass", _no_collectives_cell))
    if any(col.values.tokens_per_forward for col in recorded):  # the batch shapes each engine ran
        rows.append(("forward passes by tokens", _tokens_per_forward_cell))
    rows += [(f"calls of {short(name)}", partial(_calls_cell, name)) for name in _names_in(recorded, lambda s: s.calls)]
    rows += [(name, partial(_switch_cell, name)) for name in LAYOUT_SWITCHES]
    switches = set(_names_in(recorded, lambda s: s.switches))
    rows += [(name, partial(_switch_cell, name)) for name in PROCESSOR_SWITCHES if name in switches]
    shown = set(LAYOUT_SWITCHES) | set(PROCESSOR_SWITCHES)
    if sampled:
        rows += [(name, partial(_switch_cell, name)) for name in SAMPLER_SWITCHES if name in switches]
        shown |= set(SAMPLER_SWITCHES)
    # any other switch only where the sides disagree: the table shows what sets them apart
    for name in sorted(switches - shown):
        cell = partial(_switch_cell, name)
        if _differs([cell(col.values) for col in recorded]):
            rows.append((name, cell))
    return rows


def _differs(cells: Sequence[str]) -> bool:
    return len(set(cells)) > 1


def _what_ran_table(columns: Sequence[_Column], esc: Esc, sampled: bool = False) -> dict[str, Any]:
    recorded = [col for col in columns if col.recorded]
    rows = []
    for i, (label, cell) in enumerate(_row_makers(recorded, sampled)):
        # a column without values says why once, in the first row
        cells = [cell(col.values) if col.recorded else (col.missing if i == 0 else DASH) for col in columns]
        differs = _differs([x for x, col in zip(cells, columns) if col.recorded])
        rows.append({"label": esc(label), "cells": [esc(x) for x in cells], "differs": differs})
    rows.append({"label": esc("expectations"), "cells": [esc(_expectations_cell(col.check)) for col in columns],
                 "differs": False})
    return {"columns": [{"name": esc(col.name), "role": col.role} for col in columns], "rows": rows,
            "differs": any(r["differs"] for r in rows)}


def _path_block(c: Comparison, paths: Paths, aa: bool, esc: Esc) -> dict[str, Any]:
    """A comparison's path judgement: one sentence, then its reasons (failures, evidence or a note)."""
    sentence = PATH_SENTENCES[paths.status]
    if c.status == Status.INCONCLUSIVE.value:
        sentence += f", so the comparison is {Status.INCONCLUSIVE.value}"
    if c.outputs_status:
        sentence += f"; the outputs alone would be {c.outputs_status}"
    kind = {VERIFIED: "evidence", NOT_RECORDED: "note"}.get(paths.status, "failure")
    return {
        "variant": esc(c.variant),
        "reference": esc(c.reference),
        "aa": aa,
        "sentence": esc(sentence),
        "kind": kind,
        "lines": [esc(r) for r in paths.reasons],
    }


def what_ran_view(compare: ComparisonDocument, esc: Esc) -> dict[str, Any] | None:
    """Each comparison's path judgement and the sides side by side; None when no comparison
    was judged (a bare table comparison)."""
    judged = [(c, c.paths, aa) for c, aa in compare.judged_entries() if c.paths is not None]
    if not judged:
        return None
    columns = _columns(compare)
    return {
        "paths": [_path_block(c, paths, aa, esc) for c, paths, aa in judged],
        # a table of columns that all say "not recorded" shows nothing
        "table": (_what_ran_table(columns, esc, sampled=any(c.sampling for c, _ in compare.judged_entries()))
                  if any(col.summary is not None for col in columns) else None),
    }
