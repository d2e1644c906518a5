"""evalpipe/commands/sampling_plan.py: the dry run's sizing of a sampled task. Pinned against
the closed forms: the smallest rate N samples show once with 95% probability is
1 − 0.05^(1/N); the smallest avg@n difference is (z_0.975 + z_0.8)·√(d/n)/√items; the
lines say both for the run's size and what 1% / 0.1% rates and 0.02 / 0.01 differences need."""

from __future__ import annotations

import math

import pytest

from evalpipe.commands.sampling_plan import plan_lines, smallest_difference, smallest_rate_seen
from evalpipe.config.run_config import TaskSpec
from evalpipe.config.sampling import Sampling


def test_the_smallest_effects_a_run_shows():
    assert smallest_rate_seen(299) == pytest.approx(1 - 0.05 ** (1 / 299)) and smallest_rate_seen(299) < 0.01
    assert smallest_rate_seen(298) < smallest_rate_seen(100)
    z = 1.959964 + 0.841621
    assert smallest_difference(100, 4) == pytest.approx(z * math.sqrt(0.05 / 4) / 10, rel=1e-5)


def test_the_lines_of_a_sized_and_an_unsized_task_and_none_for_greedy():
    sized = plan_lines(TaskSpec(task="t", limit=100, sampling=Sampling(temperature=0.6, samples=4)))
    assert sized[0].startswith("t: 100 items x 4 sample(s) = 400 samples per variant; they show a divergent-sample rate of 0.75%")
    assert "an avg@4 difference of 0.031 or more" in sized[0]
    assert sized[1:] == [
        "  a divergent-sample rate of 1.0%: 299 samples (75 items x 4)",
        "  a divergent-sample rate of 0.1%: 2995 samples (749 items x 4)",
        "  an avg@4 difference of 0.02 at 5% discordant samples: 246 items x 4",
        "  an avg@4 difference of 0.01 at 5% discordant samples: 982 items x 4",
    ]
    unsized = plan_lines(TaskSpec(task="t", sampling=Sampling(temperature=0.6)))
    assert unsized[0].startswith("t: every item x 1 sample(s)") and unsized[1].endswith("299 samples (299 items x 1)")
    assert plan_lines(TaskSpec(task="t", limit=5)) == []
