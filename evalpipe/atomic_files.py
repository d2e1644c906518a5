"""Files written whole or not at all: a temp file beside the target, fsync'd, renamed over
it; a reader never sees half a file, and a failed write leaves the old one. Every file
evalpipe writes goes through here (the run directory's tables too, evalpipe.rundir.artifacts).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def temp_beside(path: Path, private: bool = False) -> tuple[int, str]:
    """A temp file next to `path` (same file system, so the final rename is atomic),
    with the permissions a plain open() would have given (mkstemp makes it 0600);
    ``private``: left 0600, for a file that keeps credentials unredacted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    if not private:
        os.fchmod(fd, 0o666 & ~_umask())
    return fd, tmp


def _atomic_write_bytes(path: Path, data: bytes, private: bool = False) -> None:
    fd, tmp = temp_beside(path, private)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, private: bool = False) -> None:
    """``private``: owner-only (0600), for a file with credentials (job.json, server-args.yaml)."""
    _atomic_write_bytes(Path(path), text.encode("utf-8"), private)


def write_bytes(path: Path, data: bytes) -> None:
    _atomic_write_bytes(Path(path), data)


def write_json(path: Path, obj: Any, *, private: bool = False) -> None:
    """Stable JSON (sorted keys, fixed indent) so equal content gives equal bytes."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n", private=private)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
