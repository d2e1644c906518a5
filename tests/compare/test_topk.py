"""evalpipe/compare/topk.py: the KL between two top-k lists, by the rule written out by hand (the mass a list leaves out capped at its smallest listed probability, a token a side lacks floored), exact under swapping the sides, and padding ignored."""

import math

import numpy as np
import pytest

from evalpipe.compare.topk import topk_kl


def test_kl_floor_keeps_it_finite():
    ln = math.log
    # both lists already hold all the mass (leftover 0): the token a side lacks gets 0,
    # floored to 1e-12. P = (0.9, 0.1, 1e-12), Q = (0.9, 1e-12, 0.1), each / (1 + 1e-12):
    # KL ~= 0.1 ln(0.1 / 1e-12) + 1e-12 ln(1e-12 / 0.1) ~= 0.1 * 25.328 = 2.5328
    ids_a = np.array([[1, 2]]); lp_a = np.array([[ln(0.9), ln(0.1)]])
    ids_b = np.array([[1, 3]]); lp_b = np.array([[ln(0.9), ln(0.1)]])
    kl, same = topk_kl(ids_a, lp_a, ids_b, lp_b)
    assert kl[0] == pytest.approx(0.1 * ln(0.1 / 1e-12), rel=1e-6) and not same[0]
    # padding (-1 / -inf) is ignored; order does not matter for set equality
    kl, same = topk_kl(np.array([[2, 1, -1]]), np.array([[ln(0.1), ln(0.9), -np.inf]]), ids_a, lp_a)
    assert kl[0] == pytest.approx(0.0, abs=1e-12) and same[0]


def _kl_by_hand(ids_a, lp_a, ids_b, lp_b):
    """The documented rule, one row at a time with dicts (slow, obviously right)."""
    pa_ = {i: math.exp(x) for i, x in zip(ids_a, lp_a) if i >= 0}
    pb_ = {i: math.exp(x) for i, x in zip(ids_b, lp_b) if i >= 0}
    union = sorted(set(pa_) | set(pb_))

    def dist(own):
        lacking = [u for u in union if u not in own]
        rest = max(0.0, 1.0 - sum(own.values()))
        fill = min(rest / len(lacking), min(own.values(), default=1.0)) if lacking else 0.0
        raw = [max(own.get(u, fill), 1e-12) for u in union]
        return [x / sum(raw) for x in raw]

    p, q = dist(pa_), dist(pb_)
    return sum(x * math.log(x / y) for x, y in zip(p, q))


def _random_lists(rng, n, k):
    """n rows of two top-k lists over a small vocabulary: sets overlap, orders and lengths vary."""
    ids_a = np.stack([rng.choice(12, size=k, replace=False) for _ in range(n)])
    ids_b = ids_a.copy()
    for r in range(n):
        kind = r % 4
        if kind == 1:  # same set, other order
            ids_b[r] = rng.permutation(ids_b[r])
        elif kind == 2:  # one token swapped for another
            ids_b[r, -1] = next(x for x in range(12) if x not in ids_a[r])
        elif kind == 3:  # shorter list on one side
            ids_b[r, -2:] = -1
    lp_a = np.log(rng.dirichlet(np.ones(k + 2), size=n)[:, :k])
    lp_b = lp_a + rng.normal(0, 0.05, size=lp_a.shape) * (rng.random((n, 1)) < 0.7)
    lp_b = np.where(ids_b >= 0, lp_b, -np.inf)
    return ids_a, lp_a, ids_b, lp_b


def test_topk_kl_matches_rule_by_hand_and_is_swap_exact():
    ids_a, lp_a, ids_b, lp_b = _random_lists(np.random.default_rng(3), 200, 5)
    kl_ab, same = topk_kl(ids_a, lp_a, ids_b, lp_b)
    kl_ba, same_ba = topk_kl(ids_b, lp_b, ids_a, lp_a)
    for r in range(len(ids_a)):
        assert kl_ab[r] == pytest.approx(_kl_by_hand(ids_a[r], lp_a[r], ids_b[r], lp_b[r]), rel=1e-9, abs=1e-15)
        assert kl_ba[r] == pytest.approx(_kl_by_hand(ids_b[r], lp_b[r], ids_a[r], lp_a[r]), rel=1e-9, abs=1e-15)
    assert same.tolist() == same_ba.tolist() == [set(x[x >= 0]) == set(y[y >= 0]) for x, y in zip(ids_a, ids_b)]


def test_missing_mass_is_capped_at_the_smallest_listed_probability():
    ln = math.log
    # A lists {1: 0.5, 2: 0.2}, leftover 0.3; B lists {1: 0.5, 3: 0.05}, leftover 0.45.
    # A lacks 3: min(0.3, 0.2) = 0.2; B lacks 2: min(0.45, 0.05) = 0.05.
    # P = (0.5, 0.2, 0.2) / 0.9 = (5/9, 2/9, 2/9), Q = (0.5, 0.05, 0.05) / 0.6 = (5/6, 1/12, 1/12)
    # KL(P||Q) = 5/9 ln(2/3) + 4/9 ln(8/3) = -0.225258 + 0.435924 = 0.210666
    # (uncapped, the leftovers would give P = (0.5, 0.2, 0.3), Q = (0.5, 0.45, 0.05): 0.375342)
    expected = 5 / 9 * ln(2 / 3) + 4 / 9 * ln(8 / 3)
    assert expected == pytest.approx(0.210666, abs=1e-6)
    kl, same = topk_kl(np.array([[1, 2]]), np.array([[ln(0.5), ln(0.2)]]), np.array([[1, 3]]), np.array([[ln(0.5), ln(0.05)]]))
    assert kl[0] == pytest.approx(expected, rel=1e-9) and not same[0]
