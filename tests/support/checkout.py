"""Where the checkout's own files are, for tests that read them (configs, docs, README)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
