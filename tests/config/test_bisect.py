"""The `bisect:` section: strict, with escalations that grow and paths inside the tree."""

import pytest
from pydantic import ValidationError

from evalpipe.config.bisect import BisectSpec


def test_defaults_search_first_parents_confirm_and_localize():
    spec = BisectSpec(repo="plugin")
    assert (spec.pythonpath, spec.first_parent, spec.escalate, spec.confirm, spec.localize) == (["."], True, [], True, True)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("escalate", [100, 50], "positive and grow"),
    ("escalate", [0], "positive and grow"),
    ("escalate", [True], "valid integer"),
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
