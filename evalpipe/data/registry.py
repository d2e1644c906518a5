"""Data sets evalpipe generates itself, found by their directory under the data dir."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from evalpipe.data.gsm_synth import write_splits
from evalpipe.errors import UserError


def _gsm8k_synth(out_dir: Path) -> None:
    write_splits(out_dir)


# directory name under the data dir -> function that writes that directory's files
GENERATED: dict[str, Callable[[Path], None]] = {"gsm8k_synth": _gsm8k_synth}


def ensure_dataset_file(relative: Path, data_dir: Path) -> Path:
    """`data_dir / relative`; for a data set evalpipe generates, (re)generated first so
    stale or edited files are replaced by what the generator defines (cheap, idempotent)."""
    path = Path(data_dir) / relative
    if relative.parts and relative.parts[0] in GENERATED:
        GENERATED[relative.parts[0]](Path(data_dir) / relative.parts[0])
    return path


def build_all(data_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Write every generated data set (or the named ones); returns their directories."""
    chosen = names or sorted(GENERATED)
    unknown = [name for name in chosen if name not in GENERATED]
    if unknown:  # before the first write: a refused command line leaves nothing behind
        raise UserError(f"unknown generated data set `{unknown[0]}`; known: {', '.join(sorted(GENERATED))}.")
    out = []
    for name in chosen:
        GENERATED[name](Path(data_dir) / name)
        out.append(Path(data_dir) / name)
    return out
