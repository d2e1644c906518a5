"""evalpipe/config/sampling.py: the `sampling:` settings and each sample's seed. A seed must
depend on the sample's identity only (the same in every variant and run), differ between
samples, fit the engines' integer, and bad settings must be refused with the field named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from evalpipe.config.sampling import GREEDY_BELOW, SEED_BITS, Sampling, sample_seed


def test_the_seed_is_a_function_of_the_sample_s_identity():
    assert sample_seed(1234, "gsm8k", 3, 0, 1) == sample_seed(1234, "gsm8k", 3, 0, 1)
    others = {sample_seed(1234, "gsm8k", 3, 0, 0), sample_seed(1234, "gsm8k", 3, 0, 2), sample_seed(1234, "gsm8k", 4, 0, 1),
              sample_seed(1234, "gsm8k", 3, 1, 1), sample_seed(1234, "other", 3, 0, 1), sample_seed(1, "gsm8k", 3, 0, 1)}
    assert sample_seed(1234, "gsm8k", 3, 0, 1) not in others and len(others) == 6


@given(st.integers(0, 2**40), st.text(max_size=20), st.integers(0, 10**6), st.integers(0, 8), st.integers(0, 1024))
def test_every_seed_fits_the_engines_integer(base, task, doc, request, sample):
    assert 0 <= sample_seed(base, task, doc, request, sample) < 2**SEED_BITS


def test_distinct_samples_rarely_share_a_seed():
    seeds = {sample_seed(0, "t", d, 0, s) for d in range(500) for s in range(8)}
    assert len(seeds) >= 3999  # 4000 samples in 2^31 seeds: a collision has odds ~0.4%


@pytest.mark.parametrize("bad, field", [({"temperature": 0}, "temperature"), ({"temperature": 0.6, "top_p": 0}, "top_p"),
                                        ({"temperature": 0.6, "top_k": 0}, "top_k"), ({"temperature": 0.6, "min_p": 1}, "min_p"),
                                        ({"temperature": 0.6, "samples": 0}, "samples"), ({"temperature": 0.6, "seed": -1}, "seed"),
                                        ({"temperature": 0.6, "n": 4}, "n"), ({}, "temperature")])
def test_bad_settings_are_refused_naming_the_field(bad, field):
    with pytest.raises(ValidationError) as err:
        Sampling.model_validate(bad)
    assert err.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize("temperature", [0, 0.0, 1e-6, 9.99e-6])
def test_a_temperature_at_which_vllm_decodes_greedily_is_refused_saying_so(temperature):
    with pytest.raises(ValidationError, match="where vLLM decodes greedily; leave `sampling:` out"):
        Sampling(temperature=temperature)
    assert Sampling(temperature=GREEDY_BELOW).temperature == GREEDY_BELOW


def test_the_sampler_is_one_definition_whose_off_values_are_its_defaults():
    from evalpipe.config.sampling import Sampler, Sampling

    recorded = Sampler.recorded(0.6, 1.0, 0, 0.0)  # a row's top_k 0 is vLLM's "off"
    assert recorded == Sampler(temperature=0.6) and recorded.top_k is None and recorded.vllm_top_k == 0
    assert recorded.describe() == "temperature 0.6"
    cut = Sampler.recorded(0.7, 0.9, 20, 0.05)
    assert cut.describe() == "temperature 0.7, top_p 0.9, top_k 20, min_p 0.05" and cut.vllm_top_k == 20
    # a task's `sampling:` is the same sampler with its samples and seed, described in the same words
    task = Sampling(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, samples=4)
    assert isinstance(task, Sampler) and task.describe() == cut.describe()
