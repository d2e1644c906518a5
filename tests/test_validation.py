"""evalpipe/validation.py: pydantic's first complaint as (where, what)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError, field_validator


class Inner(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be positive")
        return v


class Outer(BaseModel):
    inner: Inner


def _error(data) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value


def test_where_is_the_dotted_key_after_the_callers_prefix_and_what_drops_pydantics_prefix():
    from evalpipe.validation import first_problem

    err = _error({"inner": {"n": -1}})
    assert first_problem(err) == ("inner.n", "must be positive")
    assert first_problem(err, "config") == ("config.inner.n", "must be positive")
    assert first_problem(err, "") == ("inner.n", "must be positive")
    where, what = first_problem(_error({"inner": {"n": "x"}}))
    assert where == "inner.n" and "valid integer" in what


def test_the_whole_value_wrong_has_no_key():
    from evalpipe.validation import first_problem

    with pytest.raises(ValidationError) as caught:
        Inner.model_validate("not a mapping")
    where, what = first_problem(caught.value)
    assert where == "" and "dictionary" in what
