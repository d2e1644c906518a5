"""evalpipe/bisection/levels.py: the levels a step climbs (what an escalation leaves out carried
over) and the escalations refused before anything runs, in one sentence each."""

from __future__ import annotations

import pytest

from evalpipe.bisection.levels import Level, escalation_problem, levels
from evalpipe.config.bisect import Escalation
from evalpipe.config.sampling import Sampling

SAMPLED = Sampling(temperature=0.6, samples=2)


def test_each_escalation_keeps_what_it_leaves_out_from_the_level_before():
    steps = [Escalation(limit=50), Escalation(samples=4), Escalation(limit=200)]
    assert levels(10, steps) == [Level(10), Level(50), Level(50, 4), Level(200, 4)]
    assert levels(None, []) == [Level(None)]
    assert [lv.label() for lv in levels(10, steps[:2])] == ["10 items", "50 items", "50 items, 4 samples per item"]


@pytest.mark.parametrize(("limit", "steps", "samplings", "words"), [
    (10, [Escalation(limit=50)], [None], None),
    (10, [Escalation(samples=4)], [SAMPLED], None),
    (10, [Escalation(limit=10)], [None], "must be larger than --limit 10"),
    (None, [Escalation(limit=50)], [None], "runs every item (no --limit)"),
    (None, [Escalation(samples=4)], [SAMPLED, SAMPLED], None),
    (10, [Escalation(samples=4)], [None], "decodes greedily"),
    (10, [Escalation(samples=4)], [SAMPLED, None], "decodes greedily"),
    (10, [Escalation(samples=2)], [SAMPLED], "must be more than the config's 2"),
])
def test_escalations_that_would_not_look_harder_are_refused(limit, steps, samplings, words):
    problem = escalation_problem(limit, steps, samplings)
    assert problem is None if words is None else words in (problem or ""), problem
