"""The `bisect:` section: strict, with escalations that grow and paths inside the tree."""

import pytest
from pydantic import ValidationError

from evalpipe.config.bisect import BisectSpec


def test_defaults_search_first_parents_confirm_and_localize():
    spec = BisectSpec(repo="plugin")
    assert (spec.pythonpath, spec.first_parent, spec.escalate, spec.confirm, spec.localize) == (["."], True, [], True, True)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("escalate", [100, 50], "limit values \\[100, 50\\] must grow"),
    ("escalate", [0], "positive and grow"),
    ("escalate", [True], "valid integer"),
    ("escalate", [{"samples": 8}, {"limit": 50, "samples": 4}], "samples values \\[8, 4\\] must grow"),
    ("escalate", [{}], "gives `limit:`, `samples:` or both"),
    ("escalate", [{"samples": 1}], "greater than or equal to 2"),
    ("escalate", [{"limit": 50, "tries": 2}], "Extra inputs"),
    ("pythonpath", ["../elsewhere"], "leaves the candidate's tree"),
    ("pythonpath", ["/abs"], "leaves the candidate's tree"),
    ("pythonpath", [], "at least 1"),
    ("repo", "", "at least 1"),
    ("builds", [{"name": "a"}, {"name": "b"}], "one of the two"),
    ("build", [], "at least 1"),
    ("tries", 3, "Extra inputs"),
])
def test_bad_values_are_refused_with_what_to_give(field, value, words):
    with pytest.raises(ValidationError, match=words):
        BisectSpec(**{"repo": "plugin", field: value})


def test_an_escalation_is_an_item_limit_or_more_samples_or_both():
    spec = BisectSpec(repo="plugin", escalate=[50, {"samples": 4}, {"limit": 200, "samples": 8}])
    assert [(e.limit, e.samples) for e in spec.escalate] == [(50, None), (None, 4), (200, 8)]


def test_an_explicit_list_of_builds_instead_of_a_repository():
    spec = BisectSpec(builds=[{"name": "w1201", "env": {"PYTHONPATH": "/wheels/1201"}}, {"name": "w1202", "python": "/e/bin/python"}])
    assert spec.build_named("w1202").python == "/e/bin/python" and spec.repo is None
    for builds, words in (([{"name": "a"}], "at least two"), ([{"name": "a"}, {"name": "a"}], "named twice"),
                          ([{"name": "a/b"}, {"name": "c"}], "not a plain name")):
        with pytest.raises(ValidationError, match=words):
            BisectSpec(builds=builds)
    with pytest.raises(ValidationError, match="one of the two"):
        BisectSpec()
    with pytest.raises(ValidationError, match="apply to the commits of a `repo:`"):
        BisectSpec(builds=[{"name": "a"}, {"name": "b"}], build=["make"])
