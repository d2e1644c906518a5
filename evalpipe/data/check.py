"""Local data files checked before any engine starts: readable, not empty, every line
valid, and holding the columns the task's prompt templates use.

Without this, a broken file surfaces minutes later inside lm-eval / datasets as
`DatasetGenerationError` (no file, no line) or a template's `'question' is undefined`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

import jinja2
import jinja2.meta
import pyarrow.parquet as pq

from evalpipe.errors import UserError
from evalpipe.paths import file_problem

SUPPORTED = (".jsonl", ".json", ".csv", ".parquet")
TEMPLATE_KEYS = ("doc_to_text", "doc_to_target", "doc_to_choice")


class DataFileError(UserError):
    """A data file problem, in one sentence naming the file (and line)."""


def paths_of(data_files: Any) -> Iterator[Path]:
    if isinstance(data_files, dict):
        for v in data_files.values():
            yield from paths_of(v)
    elif isinstance(data_files, (list, tuple)):
        for v in data_files:
            yield from paths_of(v)
    elif data_files is not None:
        yield Path(str(data_files))


def template_columns(cfg: dict[str, Any]) -> dict[str, set[str]]:
    """Per template key, the document fields its Jinja template reads (plain column
    names and Python functions are left to lm-eval)."""
    env = jinja2.Environment()
    out: dict[str, set[str]] = {}
    for key in TEMPLATE_KEYS:
        tpl = cfg.get(key)
        if isinstance(tpl, str) and ("{{" in tpl or "{%" in tpl):
            try:
                out[key] = set(jinja2.meta.find_undeclared_variables(env.parse(tpl)))
            except jinja2.TemplateSyntaxError:
                continue
    return out


def _jsonl_columns(path: Path) -> tuple[set[str], int]:
    columns: set[str] = set()
    rows = 0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFileError(f"data file {path}, line {n}: not valid JSON ({err.msg}, column {err.colno}); fix or remove that line.") from None
            if not isinstance(row, dict):
                raise DataFileError(f"data file {path}, line {n}: a {type(row).__name__}, not an object with the task's fields; one JSON object per line.")
            columns |= set(row)
            rows += 1
    return columns, rows


def _json_columns(path: Path) -> tuple[set[str], int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataFileError(f"data file {path}, line {err.lineno}: not valid JSON ({err.msg}); fix it (or use one object per line, .jsonl).") from None
    rows = data.get("data") if isinstance(data, dict) and isinstance(data.get("data"), list) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataFileError(f"data file {path} is not a list of objects (or {{\"data\": [...]}}); write one object per item.")
    return set().union(*(set(r) for r in rows)) if rows else set(), len(rows)


def _csv_columns(path: Path) -> tuple[set[str], int]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        rows = sum(1 for row in reader if row)
    return set(header or []), rows


def _parquet_columns(path: Path) -> tuple[set[str], int]:
    try:
        meta = pq.read_metadata(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for damaged files
        raise DataFileError(f"data file {path} cannot be read as Parquet ({err}); re-create it.") from None
    return set(meta.schema.names), meta.num_rows


PARQUET_MAGIC = b"PAR1"  # the first (and last) four bytes of every Parquet file


def is_parquet(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC


READERS = {".jsonl": _jsonl_columns, ".json": _json_columns, ".csv": _csv_columns, ".parquet": _parquet_columns}


def columns_of(path: Path) -> tuple[set[str], int]:
    """(columns, rows) of a data file; DataFileError when it cannot serve as one."""
    problem = file_problem(path)
    if problem is not None:
        raise DataFileError(f"data file {path} {problem}; point `data_files` to a file.")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataFileError(f"data file {path} has the unsupported type {path.suffix or '(none)'}; use {', '.join(SUPPORTED)}.")
    if reader is not _parquet_columns and is_parquet(path):
        # read as text it would be "not UTF-8 (byte N)", which names neither the cause nor the fix
        raise DataFileError(f"data file {path} is a Parquet file, not {path.suffix} text; rename it to {path.stem}.parquet "
                            "(and the `data_files` entry with it).")
    try:
        return reader(path)
    except UnicodeDecodeError as err:
        raise DataFileError(f"data file {path} is not UTF-8 text (byte {err.start}); convert it or use Parquet.") from None


def check_data_files(task: str, data_files: Any, cfg: dict[str, Any], splits: Iterable[str] | None = None) -> None:
    """Check every data file of a task against its prompt templates; one sentence on the first problem."""
    needed = template_columns(cfg)
    for path in paths_of(data_files):
        columns, rows = columns_of(path)
        if rows == 0:
            raise DataFileError(f"data file {path} of task `{task}` has no items; fill it or point `data_files` to another file.")
        for key, fields in needed.items():
            missing = sorted(fields - columns)
            if missing:
                raise DataFileError(
                    f"data file {path} of task `{task}` lacks the column{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(missing)} that the task's {key} uses (it has {', '.join(sorted(columns)) or 'none'}); "
                    "add them or point `data_files` to the right file."
                )
