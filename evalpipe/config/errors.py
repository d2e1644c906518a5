"""The config package's error: something the user fixes in a config or an argument."""

from __future__ import annotations

from evalpipe.errors import UserError


class ConfigError(UserError):
    """A problem the user fixes in their config or arguments (exit code 2)."""
