"""What every document model shares: strict frozen fields, and a failed validation told
as one sentence that names the file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from evalpipe.errors import UserError
from evalpipe.validation import first_problem

M = TypeVar("M", bound=BaseModel)


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def as_written(model: M) -> M:
    """``model`` as its file holds it: compare builds its models with the measures it computes
    with, +inf among them (non-finite logprobs: the largest difference there is) and NaN
    logprobs in a worst example; JSON has null there, and so does what this returns, for the
    readers of the document in memory (the reports, the terminal summary) to see what a
    reader of the file sees."""
    return type(model).model_validate_json(model.model_dump_json())


def validated(model: type[M], data: Any, where: str, remedy: str, at: str = "") -> M:
    """``model`` from ``data``, or a UserError: "<where>: <at.key>: <what is wrong>; <remedy>."."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        key, what = first_problem(err, at)
        raise UserError(f"{where}: {key}: {what}; {remedy}.") from None


def read_json_object(path: Path, remedy: str) -> dict[str, Any]:
    """The JSON object in ``path``, or a UserError: "<path> is not valid JSON (...); <remedy>."."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); {remedy}.") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} should hold a JSON object; {remedy}.")
    return raw
