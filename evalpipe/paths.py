"""Where evalpipe keeps things that outlive a run: built models, generated data sets."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "EVALPIPE_CACHE"
DATA_ENV = "EVALPIPE_DATA_DIR"

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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
