"""evalpipe/compare/token_summary.py: the per-task token summary and the numbers it is made
of. Pinned: percentiles that survive infinities (a non-finite logprob on one side is the
largest difference there is, not missing data), NaN as "nothing measured", the decade
histogram's edges, and a summary built per task, in task order, with its counts adding up."""

from __future__ import annotations

import math

import numpy as np
from fakes import make_samples, mutate, set_token, tables

from evalpipe.compare.token_results import HIST_DECADES
from evalpipe.compare.token_summary import _decade_hist, opt_float, quantile
from evalpipe.compare.tokens import compare_tokens


def test_quantiles_of_nothing_of_infinities_and_of_plain_values():
    assert quantile(np.array([]), 99) is None
    assert quantile(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 50) == 3.0
    assert quantile(np.array([1.0, 2.0]), 100) == 2.0
    # one infinite value among many: the maximum is infinite, the median is not
    values = np.array([0.0] * 99 + [np.inf])
    assert quantile(values, 100) == math.inf and quantile(values, 50) == 0.0
    assert quantile(np.array([np.inf, np.inf]), 50) == math.inf  # not NaN, as np.percentile alone gives
    assert opt_float(float("nan")) is None and opt_float(float("inf")) == math.inf


def test_the_decade_histogram_counts_zeros_apart_and_clips_at_both_ends():
    zero, counts = _decade_hist(np.array([0.0, 0.0, 1e-12, 5e-10, 2e-3, 3.0, 1e9, np.inf, np.nan]))
    assert zero == 2 and sum(counts) == 6 and len(counts) == len(HIST_DECADES)
    assert counts[0] == 2  # 1e-12 clips into the first decade with 5e-10
    assert counts[HIST_DECADES.index(-3)] == 1 and counts[HIST_DECADES.index(0)] == 1
    assert counts[-1] == 2  # 1e9 and inf clip into the last


def test_a_summary_per_task_in_task_order_whose_counts_add_up():
    a = make_samples(5, task="b_task") + make_samples(4, task="a_task", seed=1)
    b = mutate(a, 1, set_token(2, 5), task="b_task")
    (sa, ta), (sb, tb) = tables(a), tables(b)
    summaries = compare_tokens(ta, tb, sa, sb).summaries
    assert [s.task for s in summaries] == ["a_task", "b_task"]
    same, moved = summaries
    assert same.identical and same.n_identical == same.n_samples == 4
    assert not moved.identical and moved.n_samples == 5 and moved.n_ids_identical == 4
    assert moved.divergence_positions == [2] and moved.n_divergent == 1
    assert moved.n_hard_divergences + moved.n_near_tie_divergences == 1
    assert moved.kl_hist.zero + sum(moved.kl_hist.counts) == moved.n_positions_compared
