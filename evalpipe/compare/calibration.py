"""Calibration: how evalpipe's verdict fares against variants whose truth is known.

A calibration run compares a reference with variants that are known to be benign
(must come out IDENTICAL or EQUIVALENT) or harmful (must come out DIVERGENT). For
each variant this module reports the verdict, the score movement with its paired
statistics, which detector families fired, and the detection cost: the smallest
number of items, taken in a fixed order (task, then doc_id), after which the
verdict on those items alone is already DIVERGENT. The cost tells a user how many
prompts a smoke test needs before a broken change shows.

Pure functions over loaded artifacts; nothing here starts an engine.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa

from evalpipe.compare.distribution import measured
from evalpipe.compare.gates import FAIL, GATE_ORDER, SCORE_GATES, SKIP
from evalpipe.compare.numerics import Numerics
from evalpipe.compare.run import VariantArtifacts, VariantComparison, compare_artifacts
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.calibration import CalibrationRow, Expected, Outcome, OutcomeCounts, SampledVerdict, SensitivityPoint
from evalpipe.documents.comparison import Status
from evalpipe.gates import registry

# the gates by family, in the calibration table's column order
DETECTORS = {family: registry.names(family) for family in ("free-running", "teacher-forced", "distributional", "sampled", "scores")}
# Outcomes against the expectation. Graded faults (the sensitivity curve) are harmful by
# construction but expected to go unseen below the detection limit: "not caught" is
# their other outcome, and it counts neither as a miss nor as clean.
CAUGHT: Outcome = "caught"
MISSED: Outcome = "missed"
CLEAN: Outcome = "clean"
FALSE_ALARM: Outcome = "false alarm"
NOT_CAUGHT: Outcome = "not caught"


def sampled_verdict(comparison: VariantComparison, expected: Expected, temperature: float, samples: int) -> SampledVerdict:
    families, gate_names = detectors_fired(comparison)
    return SampledVerdict(temperature=temperature, samples=samples, status=comparison.status.value,
                          outcome=outcome(expected, comparison.status.value), detectors=families, failed_gates=gate_names)


def sampled_failure(expected: Expected, temperature: float, samples: int) -> SampledVerdict:
    """An entry whose engine run failed in the sampled run: judged as a failed greedy run is."""
    return SampledVerdict(temperature=temperature, samples=samples, status="FAILED", outcome=outcome(expected, Status.DIVERGENT.value),
                          detectors=("engine failure",), failed_gates=())


def outcome(expected: Expected, status: str) -> Outcome:
    """``expected``: harmful (must be DIVERGENT), graded (DIVERGENT above the detection
    limit), fallback (left its declared path: must be INCONCLUSIVE, whatever its outputs),
    benign (must pass: IDENTICAL or EQUIVALENT)."""
    divergent = status == Status.DIVERGENT.value
    if expected == "harmful":
        return CAUGHT if divergent else MISSED
    if expected == "graded":
        return CAUGHT if divergent else NOT_CAUGHT
    if expected == "fallback":
        return CAUGHT if status == Status.INCONCLUSIVE.value else MISSED
    return CLEAN if status in (Status.IDENTICAL.value, Status.EQUIVALENT.value) else FALSE_ALARM


def detectors_fired(comparison: VariantComparison) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(detector families, gate names) with at least one failing gate."""
    failed = [g for g in comparison.verdict.gates if g.status == FAIL]
    names = tuple(dict.fromkeys(g.gate for g in failed))
    families = tuple(f for f, gates in DETECTORS.items() if any(n in gates for n in names))
    return families, names


# ---------------------------------------------------------------------------
# prefixes in a fixed order
# ---------------------------------------------------------------------------


def item_order(samples: pa.Table) -> list[tuple[str, int]]:
    """The items of a samples table in the fixed order (task, doc_id)."""
    cols = samples.select(["task", "doc_id"]).to_pydict()
    return sorted(set(zip(cols["task"], (int(d) for d in cols["doc_id"]))))


def _rank_of_rows(table: pa.Table, order: list[tuple[str, int]]) -> np.ndarray:
    """Each row's item rank in ``order`` (sorted by task, then doc_id); len(order) if absent.

    Within a task the ranks are consecutive, so a searchsorted per task finds them."""
    tasks = table.column("task").to_numpy(zero_copy_only=False)
    docs = table.column("doc_id").to_numpy()
    ranks = np.full(table.num_rows, len(order), dtype=np.int64)
    start = 0
    for task, group in itertools.groupby(order, key=lambda key: key[0]):
        known = np.fromiter((d for _, d in group), dtype=np.int64)
        rows = np.flatnonzero(tasks == task)
        at = np.searchsorted(known, docs[rows])
        hit = known[np.minimum(at, len(known) - 1)] == docs[rows]
        ranks[rows[hit]] = start + at[hit]
        start += len(known)
    return ranks


class PrefixView:
    """A variant's artifacts restricted to the first n items of the fixed order."""

    def __init__(self, side: VariantArtifacts, order: list[tuple[str, int]]):
        self.side = side
        self._ranks = {
            "samples": _rank_of_rows(side.samples, order),
            "tokens": _rank_of_rows(side.tokens, order),
            "teacher": None if side.teacher is None else _rank_of_rows(side.teacher, order),
        }

    def first(self, n: int) -> VariantArtifacts:
        def cut(table: pa.Table | None, ranks: np.ndarray | None) -> pa.Table | None:
            # ranks is None exactly when the table is (see __init__)
            return None if table is None or ranks is None else table.filter(pa.array(ranks < n))

        s = self.side
        return VariantArtifacts(
            s.name,
            cut(s.samples, self._ranks["samples"]),
            cut(s.tokens, self._ranks["tokens"]),
            cut(s.teacher, self._ranks["teacher"]),
        )


def detection_cost(
    reference: VariantArtifacts,
    variant: VariantArtifacts,
    gates: Gates,
    aa: VariantArtifacts | None = None,
    max_items: int | None = None,
    numerics: Numerics | None = None,
) -> int | None:
    """Smallest n such that the first n items alone give DIVERGENT; None if no n does.

    Scanned upward from 1: the verdict on a prefix is not monotone in n (a score
    gate can pass on more items), so bisection could skip the smallest n. The A/A
    run, when given, is cut to the same items so relative bounds stay comparable.
    """
    order = item_order(reference.samples)
    views = [PrefixView(s, order) for s in (reference, variant)]
    aa_view = PrefixView(aa, order) if aa is not None else None
    limit = min(len(order), max_items or len(order))
    for n in range(1, limit + 1):
        ref_n, var_n = (v.first(n) for v in views)
        aa_cmp = compare_artifacts(ref_n, aa_view.first(n), worst_k=0, gates=gates, numerics=numerics) if aa_view else None
        if compare_artifacts(ref_n, var_n, worst_k=0, gates=gates, aa=aa_cmp, numerics=numerics).status is Status.DIVERGENT:
            return n
    return None


def compare_first(
    reference: VariantArtifacts,
    variant: VariantArtifacts,
    gates: Gates,
    n: int,
    aa: VariantArtifacts | None = None,
    numerics: Numerics | None = None,
) -> VariantComparison:
    """The comparison (A/A floor included) on the first ``n`` items of the fixed order."""
    order = item_order(reference.samples)
    ref_n, var_n = (PrefixView(s, order).first(n) for s in (reference, variant))
    aa_cmp = None
    if aa is not None:
        aa_cmp = compare_artifacts(ref_n, PrefixView(aa, order).first(n), worst_k=0, gates=gates, numerics=numerics)
    return compare_artifacts(ref_n, var_n, worst_k=0, gates=gates, aa=aa_cmp, numerics=numerics)


# ---------------------------------------------------------------------------
# sensitivity and false alarms
# ---------------------------------------------------------------------------


def _ratio(measured: float | None, threshold: float | None) -> float | None:
    if measured is None or threshold is None:
        return None
    if threshold == 0:
        return None if measured == 0 else float("inf")
    return abs(measured) / threshold


def sensitivity_point(comparison: VariantComparison, magnitude: float, n_items: int, gates: Gates) -> SensitivityPoint:
    families, gate_names = detectors_fired(comparison)
    ratios: dict[str, list[float]] = {}
    for g in comparison.verdict.gates:
        if g.gate in SCORE_GATES or g.status == SKIP:
            continue
        r = _ratio(g.measured, g.threshold)
        if r is not None:
            ratios.setdefault(g.gate, []).append(r)
    significant: dict[str, bool] = {}
    for t in comparison.shifts or ():
        gate = "teacher_" + t.test
        significant[gate] = significant.get(gate, False) or measured(t.p_value) < gates.distribution.alpha
    return SensitivityPoint(
        variant=comparison.variant,
        magnitude=magnitude,
        n_items=n_items,
        status=comparison.status.value,
        families=families,
        failed_gates=gate_names,
        ratios={k: max(v) for k, v in ratios.items()},
        significant=significant,
    )


def smallest_caught(points: Sequence[SensitivityPoint], n_items: int) -> dict[str, float | None]:
    """Per detector family, the smallest magnitude it catches on ``n_items`` items (None: none)."""
    out: dict[str, float | None] = {}
    for family in DETECTORS:
        caught = [p.magnitude for p in points if p.n_items == n_items and family in p.families]
        out[family] = min(caught) if caught else None
    return out


def gate_firing(comparisons: Sequence[VariantComparison]) -> dict[str, tuple[int, int]]:
    """Per gate: (comparisons in which it failed, comparisons in which it was evaluated)."""
    out: dict[str, list[int]] = {g: [0, 0] for g in GATE_ORDER}
    for c in comparisons:
        seen: dict[str, bool] = {}
        for g in c.verdict.gates:
            if g.status == SKIP:
                continue
            seen[g.gate] = seen.get(g.gate, False) or g.status == FAIL
        for gate, fired in seen.items():
            out[gate][0] += int(fired)
            out[gate][1] += 1
    return {g: (f, n) for g, (f, n) in out.items()}


def calibration_row(
    comparison: VariantComparison,
    expected: Expected,
    *,
    cost: int | None,
    doc: str = "",
    metric: str | None = None,
) -> CalibrationRow:
    """One table row; the score figures are those of ``metric`` (default: the first
    task's first metric in name order) — the gates still cover every metric."""
    families, gate_names = detectors_fired(comparison)
    rows = sorted(comparison.scores.rows, key=lambda r: (r.task, r.metric))
    first = next((r for r in rows if r.metric == metric), rows[0] if rows else None)
    return CalibrationRow(
        variant=comparison.variant,
        expected=expected,
        status=comparison.status.value,
        outcome=outcome(expected, comparison.status.value),
        detectors=families,
        failed_gates=gate_names,
        task=first.task if first else None,
        metric=first.metric if first else None,
        delta=first.delta if first else None,
        ci_low=first.ci_low if first else None,
        ci_high=first.ci_high if first else None,
        mcnemar_p=first.mcnemar_p if first else None,
        n_items=first.n_paired if first else 0,
        detection_cost=cost,
        doc=doc,
        by_task={t.task: t.status.value for t in comparison.doc.tasks or ()},
    )


def failed_row(variant: str, expected: Expected, error: str, doc: str = "") -> CalibrationRow:
    """A variant whose engine run failed: a harmful one counts as caught (the run fails
    loudly, exit 3), a benign one as a false alarm; no score or detector figures."""
    return CalibrationRow(
        variant=variant,
        expected=expected,
        status="FAILED",
        outcome=outcome(expected, Status.DIVERGENT.value),
        detectors=("engine failure",),
        failed_gates=(),
        task=None,
        metric=None,
        delta=None,
        ci_low=None,
        ci_high=None,
        mcnemar_p=None,
        n_items=0,
        detection_cost=None,
        doc=f"{doc} Run failed: {error}".strip(),
    )


def place_name(layer: int | None, module: str | None) -> str:
    """How the table names a place: "layer 1 attn.out", or "none"."""
    return "none" if layer is None or module is None else f"layer {layer} {module}"


def summarize(rows: Sequence[CalibrationRow]) -> OutcomeCounts:
    """Counts per outcome: how many harmful variants were caught, benign ones kept clean
    (graded faults are the sensitivity curve's, not counted here)."""
    return _counts(r.outcome for r in rows if r.expected != "graded")


def summarize_sampled(rows: Sequence[CalibrationRow]) -> OutcomeCounts | None:
    """The same counts for the sampled run's verdicts; None when the zoo did not run sampled."""
    if not any(r.sampled is not None for r in rows):
        return None
    return _counts(r.sampled.outcome for r in rows if r.expected != "graded" and r.sampled is not None)


def _counts(outcomes: Iterable[Outcome]) -> OutcomeCounts:
    seen = Counter(outcomes)
    return OutcomeCounts(caught=seen[CAUGHT], missed=seen[MISSED], clean=seen[CLEAN], false_alarm=seen[FALSE_ALARM])
