"""A count a config states: a whole number, or a range of them ({min, max})."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from evalpipe.config.strict import Strict


def whole_count(value: Any, what: str) -> int:
    """A count as a config writes it: a whole number, 0 or more. YAML's `true` is refused
    (pydantic would read it as 1), as are 2.0 and "2"."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number, 0 or more; got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be 0 or more; got {value}")
    return value


class CountRange(Strict):
    """Calls per forward pass between ``min`` and ``max`` (either may be left out, not both)."""

    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @field_validator("min", "max", mode="before")
    @classmethod
    def _whole(cls, value: Any, info: Any) -> Any:
        return None if value is None else whole_count(value, f"`{info.field_name}`")

    @model_validator(mode="after")
    def _bounded(self) -> "CountRange":
        if not self.min and self.max is None:
            raise ValueError("a range needs a `max`, or a `min` above 0 (without either every count holds)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"the range's min {self.min} is above its max {self.max} (no count holds); swap them")
        return self

    def holds(self, n: int) -> bool:
        return (self.min is None or n >= self.min) and (self.max is None or n <= self.max)

    def describe(self) -> str:
        if self.min is not None and self.max is not None:
            return f"{self.min}..{self.max}" if self.min != self.max else str(self.min)
        return f">= {self.min}" if self.min is not None else f"<= {self.max}"
