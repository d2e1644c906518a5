"""evalpipe/report/sampled.py: a sampled task's section of the reports. Pinned: the sampler in
words, the variant's figures beside the A/A run's, the prediction with its tail probability,
where divergences start, pass@k rows; a greedy task has no section."""

from __future__ import annotations

import html

from evalpipe.documents.comparison import Comparison, PassAtK, SampledTask
from evalpipe.report.sampled import sampling_section


def task(divergent: int, **over) -> SampledTask:
    base = dict(task="t", temperature=0.6, top_p=0.95, top_k=0, min_p=0.0, samples_per_item=4, items=5, samples=20,
                divergent=divergent, divergent_rate=divergent / 20, first_divergence_min=7 if divergent else None,
                first_divergence_median=9.5 if divergent else None, agreeing_positions=400, max_abs_dlogprob=2e-6,
                predicted_samples=20, predicted=0.5, excess_p=0.01 if divergent else 1.0, tv_max=3e-3,
                pass_at=[PassAtK(metric="exact_match,strict", k=4, items=5, a=0.8, b=0.6, delta=-0.2, ci_low=-0.5, ci_high=0.1)])
    return SampledTask(**{**base, **over})


def comparison(variant: str, sampled: list[SampledTask] | None) -> Comparison:
    return Comparison.model_construct(variant=variant, reference="ref", sampling=sampled)


def test_the_section_puts_the_variant_beside_its_a_a_run():
    view = sampling_section("t", comparison("sp", [task(2)]), comparison("ref-aa", [task(0, predicted=0.0)]), html.escape)
    assert view is not None and view["sampler"] == "temperature 0.6, top_p 0.95"
    assert view["columns"] == ["sp", "A/A (ref-aa)"]
    rows = dict(view["rows"])
    assert rows["samples compared"] == ["20 (5 items × 4)", "20 (5 items × 4)"]
    assert rows["divergent samples"][0].startswith("2/20") and rows["divergent samples"][1].startswith("0/20")
    assert rows["divergent samples predicted"] == ["≤ 0.5 (P(≥ 2) = 0.01)", "≤ 0 (P(≥ 0) = 1)"]
    assert rows["first divergence"] == ["position 7 (median 9.5)", "—"]
    (p,) = view["pass_at"]
    assert (p["k"], p["a"], p["b"], p["n_items"]) == (4, "0.800", "0.600", 5) and p["delta"].startswith("\u22120.200 [")


def test_without_an_a_a_run_one_column_and_a_greedy_task_no_section():
    view = sampling_section("t", comparison("sp", [task(0, predicted=None, excess_p=None)]), None, html.escape)
    assert view is not None and view["columns"] == ["sp"]
    assert dict(view["rows"])["divergent samples predicted"] == ["n/a (no teacher-forced data)"]
    assert sampling_section("other", comparison("sp", [task(0)]), None, html.escape) is None
    assert sampling_section("t", comparison("sp", None), None, html.escape) is None
