"""Where evalpipe keeps things that outlive a run: built models, generated data sets."""

from __future__ import annotations

import os
import re
from pathlib import Path

CACHE_ENV = "EVALPIPE_CACHE"
DATA_ENV = "EVALPIPE_DATA_DIR"


def cache_dir() -> Path:
    """Root of evalpipe's cache: $EVALPIPE_CACHE, else ~/.cache/evalpipe."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "evalpipe"


def models_dir() -> Path:
    return cache_dir() / "models"


def data_dir() -> Path:
    """Generated data sets; relative `data_files` in task YAMLs resolve against this."""
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser().resolve() if env else cache_dir() / "data"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
PLAIN_NAME_RULE = "letters, digits, `.`, `_`, `+` and `-` (no `/` or `..`), starting with a letter or digit"


def is_plain_name(name: str) -> bool:
    """Whether ``name`` can name one directory under another. Run ids, variant names and
    task group names all become directories (reports/runs/<run>/<variant>/...), so one rule
    keeps a name from planning itself into another's directory or into the run's root."""
    return bool(_PLAIN_NAME.fullmatch(name)) and ".." not in name


def file_problem(path: Path) -> str | None:
    """What keeps ``path`` from being read as a file, in the words of a sentence about it
    ("data file X {problem}"); None: it is a regular file (or a link to one)."""
    if path.is_file():
        return None
    if path.is_symlink() and not path.exists():
        return f"is a link to {os.readlink(path)}, which does not exist"
    if path.is_dir():
        return "is a directory"
    if path.exists():
        return "is not a regular file (a device, a pipe or a socket)"
    return "does not exist"
