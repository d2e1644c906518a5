"""evalpipe/compare/sampling.py: a sampled task's paths under common random numbers. Pinned:
the sampling distribution as vLLM cuts it (temperature, min_p, top_k, top_p) on hand-computed
rows; total variation and the coupling bound; the per-sample leave probability; the exact
Poisson-binomial tail against brute force; pass@k against enumeration; the planning sums;
the per-task figures of a comparison built from token tables; and the A/A reproducibility
sentence. The Gumbel-max coupling itself is checked by simulation: two samplers with the
same noise disagree no more often than the bound says."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalpipe.compare import sampling as S
from evalpipe.documents.comparison import SampledTask

PLAIN = S.Sampler(temperature=1.0)


def row(*logprobs: float, ids: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    lps = np.array([logprobs], dtype=np.float32)
    return np.array([ids or list(range(len(logprobs)))]), lps


def test_the_distribution_is_tempered_and_renormalised_over_the_listed_tokens():
    ids, lps = row(math.log(0.5), math.log(0.3), math.log(0.1))
    np.testing.assert_allclose(S.sampling_distribution(ids, lps, PLAIN)[0], [5 / 9, 3 / 9, 1 / 9], rtol=1e-6)
    cold = S.sampling_distribution(ids, lps, S.Sampler.recorded(0.5, 1.0, 0, 0.0))[0]
    np.testing.assert_allclose(cold, np.array([25, 9, 1]) / 35, rtol=1e-6)  # p^(1/T), renormalised


def test_top_k_top_p_and_min_p_cut_as_the_sampler_cuts():
    ids, lps = row(math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1))
    top2 = S.sampling_distribution(ids, lps, S.Sampler.recorded(1.0, 1.0, 2, 0.0))[0]
    np.testing.assert_allclose(top2, [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
    # a token tied with the k-th stays, as vLLM masks only what is below the k-th logit
    tied = S.sampling_distribution(*row(math.log(0.4), math.log(0.2), math.log(0.2), math.log(0.1)),
                                   S.Sampler.recorded(1.0, 1.0, 2, 0.0))[0]
    np.testing.assert_allclose(tied, [0.5, 0.25, 0.25, 0], rtol=1e-6)
    # top_p 0.6: 0.4 is not enough, 0.4 + 0.3 reaches it; the third is cut
    nucleus = S.sampling_distribution(ids, lps, S.Sampler.recorded(1.0, 0.6, 0, 0.0))[0]
    np.testing.assert_allclose(nucleus, [4 / 7, 3 / 7, 0, 0], rtol=1e-6)
    # min_p 0.45: tokens below 0.45 x the best's probability (0.1 against 0.18) go
    minp = S.sampling_distribution(ids, lps, S.Sampler.recorded(1.0, 1.0, 0, 0.45))[0]
    np.testing.assert_allclose(minp, [4 / 9, 3 / 9, 2 / 9, 0], rtol=1e-6)
    # the list need not be ordered, and padding (-1 / -inf) is never sampled
    shuffled = S.sampling_distribution(np.array([[7, 3, -1]]), np.array([[math.log(0.1), math.log(0.3), -np.inf]]), PLAIN)
    np.testing.assert_allclose(shuffled[0], [0.25, 0.75, 0.0], rtol=1e-6)


def test_total_variation_over_the_union_of_ids_and_the_coupling_bound():
    ids_a, p_a = np.array([[1, 2, -1]]), np.array([[0.5, 0.5, 0.0]])
    ids_b, p_b = np.array([[2, 3, 1]]), np.array([[0.5, 0.25, 0.25]])
    tv = S.total_variation(ids_a, p_a, ids_b, p_b)
    assert tv[0] == pytest.approx(0.25)  # ½(|0.5−0.25| + |0.5−0.5| + |0−0.25|)
    assert S.coupling_bound(tv)[0] == pytest.approx(0.4)  # 2·0.25/1.25
    assert S.total_variation(ids_a, p_a, ids_a, p_a)[0] == 0.0
    assert S.total_variation(np.array([[1]]), np.array([[1.0]]), np.array([[2]]), np.array([[1.0]]))[0] == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20, 0), min_size=2, max_size=6), st.lists(st.floats(-20, 0), min_size=2, max_size=6),
       st.floats(0.1, 2.0))
def test_total_variation_is_symmetric_bounded_and_its_bound_at_most_twice_it(la, lb, temperature):
    s = S.Sampler.recorded(temperature, 1.0, 0, 0.0)
    ids_a, lps_a = row(*la)
    ids_b, lps_b = row(*lb, ids=[i + 1 for i in range(len(lb))])  # overlapping id sets
    p_a, p_b = S.sampling_distribution(ids_a, lps_a, s), S.sampling_distribution(ids_b, lps_b, s)
    ab, ba = S.total_variation(ids_a, p_a, ids_b, p_b)[0], S.total_variation(ids_b, p_b, ids_a, p_a)[0]
    assert ab == pytest.approx(ba, abs=1e-12) and 0.0 <= ab <= 1.0
    bound = S.coupling_bound(np.array([ab]))[0]
    assert ab - 1e-12 <= bound <= 2 * ab + 1e-12


def test_the_gumbel_max_coupling_keeps_to_its_bound():
    """Two samplers given the same Gumbel noise: they disagree in at most 2·TV/(1+TV) of the draws."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.4, 0.35, 0.15, 0.1])
    noise = rng.gumbel(size=(200_000, 4))
    disagree = np.mean(np.argmax(np.log(p) + noise, axis=1) != np.argmax(np.log(q) + noise, axis=1))
    tv = 0.5 * np.abs(p - q).sum()
    assert 0 < disagree <= S.coupling_bound(np.array([tv]))[0] + 0.005


def test_a_sample_leaves_the_path_with_one_minus_the_product_of_staying():
    bounds = np.array([0.1, 0.2, 0.0, 0.5])
    owner = np.array([0, 0, 1, 2])
    np.testing.assert_allclose(S.leave_probability(bounds, owner, 4), [1 - 0.9 * 0.8, 0.0, 0.5, 0.0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=0, max_size=8), st.integers(0, 9))
def test_the_poisson_binomial_tail_is_exact(probs, k):
    brute = 0.0
    for outcome in itertools.product((0, 1), repeat=len(probs)):
        if sum(outcome) >= k:
            brute += math.prod(p if o else 1 - p for p, o in zip(probs, outcome))
    assert S.upper_tail(np.array(probs), k) == pytest.approx(brute, abs=1e-12)


def test_the_tail_of_impossible_divergences_is_zero():
    assert S.upper_tail(np.zeros(50), 1) == 0.0 and S.upper_tail(np.zeros(50), 0) == 1.0


def test_pass_at_k_is_the_unbiased_estimator():
    for n, c, k in ((5, 2, 1), (5, 2, 3), (4, 0, 2), (4, 4, 1), (6, 1, 6)):
        draws = list(itertools.combinations(range(n), k))
        exact = sum(any(i < c for i in d) for d in draws) / len(draws)
        assert S.pass_at_k(n, c, k) == pytest.approx(exact)
    assert S.ks_of(1) == [1] and S.ks_of(4) == [1, 2, 4] and S.ks_of(6) == [1, 2, 4, 6]


def test_planning_sums():
    assert S.samples_to_see(0.01, 0.95) == 299 and S.samples_to_see(0.05, 0.95) == 59
    # 1.96 + 0.8416 = 2.8016; (2.8016 x 0.2 / 0.05)^2 = 125.6
    assert S.items_for_difference(0.2, 0.05) == 126
    assert S.avg_at_n_spread(4, 0.04) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        S.samples_to_see(0.0)


def sampled(divergent: int, samples: int = 10, predicted: float | None = 0.0, excess_p: float | None = None,
            tv_max: float | None = 0.0) -> SampledTask:
    return SampledTask(task="t", temperature=0.6, top_p=0.95, top_k=0, min_p=0.0, samples_per_item=2, items=5, samples=samples,
                       divergent=divergent, divergent_rate=divergent / samples, first_divergence_min=None,
                       first_divergence_median=None, agreeing_positions=0, max_abs_dlogprob=None, predicted_samples=samples,
                       predicted=predicted, excess_p=excess_p, tv_max=tv_max, pass_at=[])


def test_an_a_a_run_that_does_not_repeat_its_seeded_samples_is_named_with_its_settings():
    reason = S.reproducibility_problem([sampled(3, excess_p=0.0)], alpha=1e-3)
    assert reason is not None and "not reproducible under these sampling settings (temperature 0.6, top_p 0.95" in reason
    assert "3 of 10 samples of t" in reason and "predict no divergence" in reason and "seeds not honoured" in reason
    # identical distributions everywhere and still a divergence: the sampler, whatever the tail says
    assert S.reproducibility_problem([sampled(1, excess_p=None, tv_max=0.0)], alpha=1e-3) is not None
    # divergences the distributions explain (noisy numerics), or none at all: reproducible
    assert S.reproducibility_problem([sampled(1, predicted=2.0, excess_p=0.6, tv_max=0.3)], alpha=1e-3) is None
    assert S.reproducibility_problem([sampled(0)], alpha=1e-3) is None
