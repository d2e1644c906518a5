"""The base of every config model (evalpipe/config/strict.py): an unknown key is refused, a
model cannot be changed in place, and a YAML boolean given where a number is wanted is
refused instead of being read as 1 or 0, while boolean fields and words still take theirs."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import ValidationError

from evalpipe.config.strict import Strict


class Settings(Strict):
    count: int = 1
    share: float | None = None
    floor: float | Literal["auto"] = "auto"
    enabled: bool = False
    either: int | bool = 0


@pytest.mark.parametrize("field", ["count", "share", "floor"])
def test_a_boolean_is_no_number(field):
    with pytest.raises(ValidationError, match="got true where a number is wanted; give a number"):
        Settings(**{field: True})


def test_what_each_field_takes():
    s = Settings(count=3, share=None, floor=0.5, enabled=True, either=True)
    assert (s.count, s.share, s.floor, s.enabled, s.either) == (3, None, 0.5, True, True)
    assert Settings(floor="auto").floor == "auto"


def test_unknown_keys_and_changes_are_refused():
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Settings(cuont=2)
    with pytest.raises(ValidationError, match="frozen"):
        Settings().count = 2  # type: ignore[misc]
