"""Models evalpipe can serve without downloading anything (see :mod:`evalpipe.models.builtin`)."""

from evalpipe.models.builtin import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    BuiltModel,
    builtin_name,
    ensure_builtin,
    is_builtin,
)

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PREFIX",
    "BuiltModel",
    "builtin_name",
    "ensure_builtin",
    "is_builtin",
]
