"""A command-line option that sets the same quantity as a config key obeys the key's bounds:
one rule for both, read from the config model's field, so that neither can drift from the
other (`--positions 1000000` refused where `localize: {positions: 1000000}` is)."""

from __future__ import annotations

import math

import annotated_types as at
from pydantic import BaseModel

from evalpipe.config.errors import ConfigError


def _bounds(model: type[BaseModel], field: str) -> tuple[float | None, bool, float | None, bool]:
    """(lower, lower included, upper, upper included) of a field's numeric constraints."""
    lower: float | None = None
    upper: float | None = None
    lower_in = upper_in = True
    for m in model.model_fields[field].metadata:
        if isinstance(m, at.Ge):
            lower, lower_in = float(m.ge), True  # type: ignore[arg-type]
        elif isinstance(m, at.Gt):
            lower, lower_in = float(m.gt), False  # type: ignore[arg-type]
        elif isinstance(m, at.Le):
            upper, upper_in = float(m.le), True  # type: ignore[arg-type]
        elif isinstance(m, at.Lt):
            upper, upper_in = float(m.lt), False  # type: ignore[arg-type]
    return lower, lower_in, upper, upper_in


def _n(v: float) -> str:
    return f"{v:g}"


def _wanted(whole: bool, lower: float | None, lower_in: bool, upper: float | None, upper_in: bool) -> str:
    """The values the bounds allow, in words ("a whole number from 1 to 256")."""
    if whole:  # whole numbers: an open bound is the closed one next to it
        if lower is not None and not lower_in:
            lower, lower_in = math.floor(lower) + 1, True
        if upper is not None and not upper_in:
            upper, upper_in = math.ceil(upper) - 1, True
    kind = "whole number" if whole else "number"
    if lower is not None and upper is not None and lower_in and upper_in:
        return f"a {kind} from {_n(lower)} to {_n(upper)}"
    parts = []
    if lower is not None:
        parts.append(f"{'at least' if lower_in else 'above'} {_n(lower)}")
    if upper is not None:
        parts.append(f"{'at most' if upper_in else 'below'} {_n(upper)}")
    if lower == 0 and not lower_in and upper is None:
        return f"a positive {kind}"
    if whole and lower == 1 and upper is None:
        return "a positive whole number"
    return f"a {kind} " + " and ".join(parts)


def check_option(option: str, value: float | None, model: type[BaseModel], field: str, key: str) -> None:
    """Refuse ``value`` of ``option`` (None: not given) outside the bounds of ``model``'s
    ``field``, the config key ``key`` (e.g. `localize.positions`) that sets the same quantity."""
    if value is None:
        return
    lower, lower_in, upper, upper_in = _bounds(model, field)
    fits = not math.isnan(value) and (
        lower is None or (value >= lower if lower_in else value > lower)) and (
        upper is None or (value <= upper if upper_in else value < upper))
    if fits:
        return
    whole = isinstance(value, int) and not isinstance(value, bool)
    raise ConfigError(f"{option} {value if whole else format(value, 'g')} is out of range: give {_wanted(whole, lower, lower_in, upper, upper_in)} "
                      f"(the bounds of the config key `{key}`).")

