"""The base of every config model: unknown keys refused, values frozen, and no YAML
bool read as a number (pydantic would take `true` for 1)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _wants_a_number(annotation: Any) -> bool:
    """A field of numbers (int, float, or either with None or a word) that takes no bool."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    return bool(set(args) & {int, float}) and bool not in args


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # before every field's own check (a subclass's validators run first and may say it more precisely)
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true for 1 and false for 0, so `samples: true` or `margin: yes` would
        # be read as a number nobody wrote; YAML makes a bool of more words than `true`
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _wants_a_number(field.annotation):
            raise ValueError(f"got {str(value).lower()} where a number is wanted; give a number")
        return value
