"""A sampled task's section of the reports (compare.json "sampling"): how the samples were
drawn, how many left the reference's path and where, how many the teacher-forced
distributions predict, and pass@k; the A/A run's figures beside the variant's."""

from __future__ import annotations

from typing import Any

from evalpipe.documents.comparison import Comparison, SampledTask
from evalpipe.number_format import DASH, fmt_ci, fmt_delta, fmt_num, fmt_pct, fmt_score
from evalpipe.report.formats import Esc

SAMPLING_NOTE = (
    "Common random numbers: every sample was drawn with its own seed, the same on both sides and in the A/A run, so two "
    "engines whose sampling distributions agree draw the same tokens. A sample can leave the reference's path only where "
    "the distributions differ, at most 2·TV/(1+TV) per step (TV: total variation of the two sampling distributions, "
    "from the teacher-forced top-k); more divergent samples than that predicts is itself evidence. The score table "
    "above is avg@n: one row per sample, paired per item (cluster-robust interval). docs/sampling.md."
)


def _start(t: SampledTask) -> str:
    if t.first_divergence_min is None:
        return DASH
    return f"position {t.first_divergence_min} (median {fmt_num(t.first_divergence_median)})"


def _predicted(t: SampledTask) -> str:
    if t.predicted is None:
        return "n/a (no teacher-forced data)"
    p = DASH if t.excess_p is None else fmt_num(t.excess_p)
    return f"≤ {fmt_num(t.predicted)} (P(≥ {t.divergent}) = {p})"


ROWS = (
    ("samples compared", lambda t: f"{t.samples} ({t.items} items × {t.samples_per_item})"),
    ("divergent samples", lambda t: fmt_pct(t.divergent, t.samples)),
    ("divergent samples predicted", _predicted),
    ("first divergence", _start),
    ("largest TV at a forced step", lambda t: fmt_num(t.tv_max)),
    ("sampled steps on the shared path", lambda t: str(t.agreeing_positions)),
    ("max |Δlogprob| of the sampled tokens there", lambda t: fmt_num(t.max_abs_dlogprob)),
)


def sampling_section(task: str, c: Comparison, nf: Comparison | None, esc: Esc) -> dict[str, Any] | None:
    """The view of ``task``'s sampled figures (None: a greedy task)."""
    mine = {t.task: t for t in c.sampling or ()}.get(task)
    if mine is None:
        return None
    aa = {t.task: t for t in (nf.sampling if nf is not None else None) or ()}.get(task)
    columns = [c.variant] + ([f"A/A ({nf.variant})"] if aa is not None and nf is not None else [])
    return {
        "sampler": esc(mine.sampler.describe()),
        "note": esc(SAMPLING_NOTE),
        "columns": [esc(x) for x in columns],
        "rows": [(esc(label), [esc(cell(t)) for t in (mine, aa) if t is not None]) for label, cell in ROWS],
        "pass_at": [
            {"metric": esc(p.metric), "k": p.k, "a": fmt_score(p.a), "b": fmt_score(p.b),
             "delta": esc(f"{fmt_delta(p.delta)} {fmt_ci(p.ci_low, p.ci_high)}"), "n_items": p.items}
            for p in mine.pass_at
        ],
    }
