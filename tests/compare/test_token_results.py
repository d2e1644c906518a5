"""evalpipe/compare/token_results.py: the per-sample arrays a token comparison keeps beside
its summaries. Pinned: which samples count as paired, as identical in ids and identical
outright (ids, logprobs and top-k), a one-sided sample in neither, and the per-position
arrays refused when a comparison with positions lacks one."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import make_samples, mutate, set_token, tables

from evalpipe.compare.token_results import TokenComparison, prefix_values
from evalpipe.compare.tokens import compare_tokens


def _compared(a, b) -> TokenComparison:
    (sa, ta), (sb, tb) = tables(a), tables(b)
    return compare_tokens(ta, tb, sa, sb)


def test_paired_identical_in_ids_and_identical_outright():
    a = make_samples(4)
    b = mutate(a, 1, set_token(3, 9))
    b = mutate(b, 2, lambda s: s.copy(logprobs=[s.logprobs[0] - 0.25] + s.logprobs[1:]))
    d = _compared(a, b).samples
    assert d is not None and len(d) == 4
    assert d.paired.tolist() == [True] * 4
    assert d.ids_identical.tolist() == [True, False, True, True]
    assert d.identical.tolist() == [True, False, False, True]  # doc 2: same ids, another logprob
    assert d.first_divergence.tolist() == [-1, 3, -1, -1]


def test_a_sample_on_one_side_is_neither_paired_nor_identical():
    a = make_samples(3)
    d = _compared(a, a[:2]).samples
    assert d is not None
    assert d.in_a.tolist() == [True, True, True] and d.in_b.tolist() == [True, True, False]
    assert d.paired.tolist() == [True, True, False] and not d.identical[2]


def test_the_per_position_arrays_are_all_there_or_refused():
    d = _compared(make_samples(2), make_samples(2)).samples
    assert d is not None and len(prefix_values(d.prefix_kl)) == len(prefix_values(d.prefix_rows)) > 0
    with pytest.raises(ValueError, match="lacks one of its per-position arrays"):
        prefix_values(None)
    assert np.all(prefix_values(d.prefix_kl) == 0)
