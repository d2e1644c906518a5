"""pydantic's complaint about a document or a setting, as the piece of one sentence every
reader of a typed file or option needs: where (a dotted key) and what is wrong."""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(err: ValidationError, *at: str) -> tuple[str, str]:
    """(where, what) of the first error: the key path (``at`` first, then pydantic's
    location; "" for the whole value) and pydantic's message without its "Value error, "."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in (*(a for a in at if a), *first["loc"]))
    return where, first["msg"].removeprefix("Value error, ")
