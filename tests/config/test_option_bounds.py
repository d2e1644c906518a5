"""A command-line option obeys the bounds of the config key that sets the same quantity
(evalpipe/config/option_bounds.py): a value inside passes, one outside (or NaN) is one
sentence that says the allowed values in words and names the key."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, Field

from evalpipe.config.errors import ConfigError
from evalpipe.config.option_bounds import check_option
from evalpipe.config.run_config import Localize


class Limits(BaseModel):
    between: int = Field(default=1, ge=1, le=256)
    positive: float = Field(default=1.0, gt=0)
    below: float = Field(default=0.1, gt=0, lt=0.5)
    open_whole: int = Field(default=1, gt=0, lt=10)
    free: float = 0.0


def _refusal(value, field: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_option("--opt", value, Limits, field, f"x.{field}")
    return str(err.value)


def test_values_within_the_bounds_pass():
    for field, value in (("between", 1), ("between", 256), ("positive", 1e-9), ("below", 0.49), ("free", -1e9)):
        check_option("--opt", value, Limits, field, "x")
    check_option("--opt", None, Limits, "between", "x")  # not given


@pytest.mark.parametrize("field, value, wanted", [
    ("between", 0, "give a whole number from 1 to 256"),
    ("between", 257, "give a whole number from 1 to 256"),
    ("positive", 0.0, "give a positive number"),
    ("below", 0.5, "give a number above 0 and below 0.5"),
    ("open_whole", 10, "give a whole number from 1 to 9"),
    ("positive", math.nan, "give a positive number"),
])
def test_a_value_outside_is_one_sentence_naming_the_key(field, value, wanted):
    assert _refusal(value, field) == (f"--opt {value if isinstance(value, int) else format(value, 'g')} is out of range: "
                                      f"{wanted} (the bounds of the config key `x.{field}`).")


def test_the_bounds_are_the_config_model_s_own():
    check_option("--positions", 256, Localize, "positions", "localize.positions")
    with pytest.raises(ConfigError, match="--positions 1000000 is out of range: give a whole number from 1 to 256 "
                                          r"\(the bounds of the config key `localize.positions`\)\."):
        check_option("--positions", 1_000_000, Localize, "positions", "localize.positions")
