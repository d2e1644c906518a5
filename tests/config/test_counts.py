"""Counts and ranges of counts as a config states them."""

import pytest
from pydantic import ValidationError

from evalpipe.config.counts import CountRange, whole_count


@pytest.mark.parametrize("value", [True, 2.0, "2", -1])
def test_a_count_is_a_whole_number_of_zero_or_more(value):
    with pytest.raises(ValueError):
        whole_count(value, "the count")


def test_a_range_holds_and_describes():
    assert CountRange(min=1).holds(1) and not CountRange(min=1).holds(0)
    assert CountRange(max=0).describe() == "<= 0" and CountRange(min=2, max=2).describe() == "2"
    assert CountRange(min=1, max=3).describe() == "1..3"


@pytest.mark.parametrize("doc", [{}, {"min": 0}, {"min": 3, "max": 1}])
def test_a_range_every_count_holds_or_none_holds_is_refused(doc):
    with pytest.raises(ValidationError):
        CountRange.model_validate(doc)
