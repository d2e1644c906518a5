"""The engine-path tasks' planning aid: requests per variant and the share a divergence must touch."""

import pytest

from evalpipe.commands.scenario_plan import drives_a_path, path_lines, requests_sent
from evalpipe.config.run_config import TaskSpec
from evalpipe.config.sampling import Sampling
from evalpipe.data.scenarios import ScenarioSpec

SPEC = ScenarioSpec(prefix_questions=16, preempt_requests=24).resolved({"max_num_batched_tokens": 512, "max_model_len": 2048})


@pytest.mark.parametrize("task, limit, n", [("scenario_prefix_cache", None, 16), ("scenario_prefix_cache", 5, 5),
                                            ("scenario_chunked_prefill", None, 10), ("scenario_near_limit", None, 2),
                                            ("scenario_preemption", None, 24), ("gsm8k_synth_4shot", 20, 20),
                                            ("gsm8k_synth_4shot", None, None)])
def test_requests_sent_per_variant(task, limit, n):
    assert requests_sent(TaskSpec(task=task, limit=limit), SPEC) == n


def test_only_greedy_tasks_that_drive_a_path_get_lines():
    assert not drives_a_path(TaskSpec(task="gsm8k_synth_4shot"))
    assert path_lines(TaskSpec(task="gsm8k_synth_4shot"), SPEC) == []
    sampled = TaskSpec(task="scenario_prefix_cache", sampling=Sampling(temperature=0.6))
    assert path_lines(sampled, SPEC) == [], "a sampled task is sized by the sampled plan"
    (line,) = path_lines(TaskSpec(task="scenario_prefix_cache", schedule="prime_first"), SPEC)
    # 1 - (1 - r)^16 = 0.95 at r = 17.1%; a 5% share needs ceil(log 0.05 / log 0.95) = 59 requests
    assert line.startswith("scenario_prefix_cache: 16 requests per variant, sent prime first; a divergence touching 17.1%")
    assert line.endswith("5%: 59 requests, 1%: 299 requests")
    (every,) = path_lines(TaskSpec(task="gsm8k_synth_4shot", schedule="one_at_a_time"), SPEC)
    assert every.startswith("gsm8k_synth_4shot: every item, sent one at a time (--limit N sizes it)")
