"""Run directory layout, trace schemas and atomic writes.

Everything that crosses a process boundary or outlives a run goes through here, so
the worker (which writes) and compare/report (which read) agree on one contract:

    reports/runs/<run_id>/
        run.json                 resolved config, fingerprints, versions, timings, status
        <variant>/job.json       what the worker was asked to do (owner-only: unredacted)
        <variant>/manifest.json  env (secrets redacted), argv, python, status, timings
        <variant>/results.json   lm-eval results (metrics per task)
        <variant>/samples.parquet  one row per task x doc x repeat
        <variant>/tokens.parquet   one row per generated position (free-running)
        <variant>/teacher.parquet  one row per position of the reference's continuations,
                                   scored by this variant (teacher-forced)
        <variant>/probes.json    what ran: every engine process's path-probe record
        <variant>/engine.log     (worker.log beside it when a server writes engine.log)
        compare.json, report.md, report.html, junit.xml
        localize.json            `evalpipe localize`: where a DIVERGENT variant first departs

Each document's file name is defined next to its model in evalpipe/documents/ and named
here too, so that this module lists the whole layout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from evalpipe.atomic_files import read_json, temp_beside, write_bytes, write_json, write_text  # noqa: F401 - the run directory's writers
from evalpipe.documents.localization import LOCALIZE_JSON  # noqa: F401 - the layout names every file
from evalpipe.documents.manifest import MANIFEST_JSON  # noqa: F401
from evalpipe.documents.run_doc import RUN_JSON  # noqa: F401
from evalpipe.documents.worker_job import JOB_JSON  # noqa: F401
from evalpipe.redact import REDACTED  # noqa: F401 (REDACTED: the marker, for readers of manifests)
from evalpipe.redact import redact_env as _redact_env

RESULTS_JSON = "results.json"
SAMPLES_PARQUET = "samples.parquet"
TOKENS_PARQUET = "tokens.parquet"
TEACHER_PARQUET = "teacher.parquet"
# nightly: the baseline night's reference sequences scored by tonight's variant
TEACHER_BASELINE_PARQUET = "teacher_baseline.parquet"
PROBES_JSON = "probes.json"  # what ran: every engine process's path-probe record (evalpipe.probing.records)
ENGINE_LOG = "engine.log"
WORKER_LOG = "worker.log"  # the worker's own output when a server writes engine.log
COMPARE_JSON = "compare.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
JUNIT_XML = "junit.xml"

# Per-metric correctness columns in samples.parquet are named "score:<metric>,<filter>"
# (lm-eval's own "<metric>,<filter>" key), the filtered answers "answer:<filter>".
SCORE_PREFIX = "score:"
ANSWER_PREFIX = "answer:"

SAMPLE_KEY = ("task", "doc_id", "repeat")

SAMPLES_BASE_SCHEMA = pa.schema(
    [
        ("task", pa.string()),
        ("doc_id", pa.int64()),
        ("repeat", pa.int32()),
        ("prompt_hash", pa.string()),
        ("prompt", pa.string()),
        ("target", pa.string()),
        ("response", pa.string()),
        ("n_tokens", pa.int32()),
        ("finish_reason", pa.string()),
    ]
)

TOKENS_SCHEMA = pa.schema(
    [
        ("task", pa.string()),
        ("doc_id", pa.int64()),
        ("repeat", pa.int32()),
        ("pos", pa.int32()),
        ("token_id", pa.int32()),
        ("logprob", pa.float32()),
        ("topk_ids", pa.list_(pa.int32())),
        ("topk_logprobs", pa.list_(pa.float32())),
        # The token's own text, so reports can show context without a tokenizer.
        # Optional on read: artifacts written before it existed lack it.
        ("token_text", pa.string()),
    ]
)
TOKENS_REQUIRED = tuple(f.name for f in TOKENS_SCHEMA if f.name != "token_text")
# A sampled task's rows (config `sampling:`) record how each sample was drawn: its engine
# seed and the sampler's settings; a greedy task's rows have none of these columns.
SAMPLING_COLUMNS: dict[str, pa.DataType] = {
    "seed": pa.int64(),
    "temperature": pa.float64(),
    "top_p": pa.float64(),
    "top_k": pa.int32(),
    "min_p": pa.float64(),
}
# samples.parquet may carry the prompt's token ids (teacher forcing rebuilds the
# reference's exact sequences from them); optional on read.
PROMPT_IDS_COLUMN = "prompt_token_ids"

def redact_env(env: dict[str, str], also: Iterable[str | None] = ()) -> dict[str, str]:
    """Hide values of variables whose names look like credentials (HF_TOKEN, *_API_KEY ...),
    of the variables named in ``also`` (e.g. a config's `api_key_env`, whatever its name)
    and passwords in URL values; the rules live in evalpipe.redact, shared by every output."""
    return _redact_env(env, also)


ROW_GROUP_ROWS = 1 << 16


def write_table(path: Path, table: pa.Table) -> None:
    fd, tmp = temp_beside(Path(path))
    os.close(fd)
    try:
        # Row groups of 64k rows: readers decode them on all cores (one group of a
        # GSM8K-sized trace would be decoded by one thread).
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_table(path: Path) -> pa.Table:
    # ParquetFile, not pq.read_table: the latter goes through pyarrow.dataset, whose
    # import (pandas included) costs a fifth of a second on every `evalpipe compare`.
    with pq.ParquetFile(path) as f:
        return f.read()


# Item metadata a task's documents may carry (the long-context probes do), kept per
# sample so the comparison can group by length and depth; `cluster` marks items that
# share one context (several questions about one haystack), for clustered statistics.
DOC_COLUMNS: dict[str, pa.DataType] = {
    "cluster": pa.string(),
    "target_length": pa.int64(),
    "length_kind": pa.string(),
    "length_tags": pa.string(),
    "depth": pa.float64(),
}
_DOC_FIELD_TO_COLUMN = {"haystack_id": "cluster", "target_length": "target_length", "length_kind": "length_kind",
                        "length_tags": "length_tags", "depth": "depth"}


def doc_columns(doc: Any) -> dict[str, Any]:
    """The DOC_COLUMNS values a task document carries (none for most tasks)."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Any] = {}
    for field, column in _DOC_FIELD_TO_COLUMN.items():
        value = doc.get(field)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        out[column] = str(value) if DOC_COLUMNS[column] == pa.string() else value
    return out


def samples_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Build samples.parquet: the fixed columns plus every score:/answer: column seen."""
    rows = list(rows)
    extra_names = sorted({k for r in rows for k in r if k.startswith((SCORE_PREFIX, ANSWER_PREFIX))})
    fields = list(SAMPLES_BASE_SCHEMA) + [
        pa.field(n, pa.float64() if n.startswith(SCORE_PREFIX) else pa.string()) for n in extra_names
    ]
    if any(PROMPT_IDS_COLUMN in r for r in rows):
        fields.append(pa.field(PROMPT_IDS_COLUMN, pa.list_(pa.int32())))
    fields += [pa.field(name, kind) for name, kind in DOC_COLUMNS.items() if any(name in r for r in rows)]
    fields += [pa.field(name, kind) for name, kind in SAMPLING_COLUMNS.items() if any(name in r for r in rows)]
    schema = pa.schema(fields)
    columns = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.table(columns, schema=schema)


def tokens_table(columns: dict[str, list]) -> pa.Table:
    """Build tokens.parquet / teacher.parquet from column lists (one entry per position).

    ``token_text`` may be absent (then null)."""
    n = len(columns["pos"])
    return pa.table(
        {f.name: columns[f.name] if f.name in columns else [None] * n for f in TOKENS_SCHEMA}, schema=TOKENS_SCHEMA
    )


def score_columns(table: pa.Table) -> list[str]:
    return [n for n in table.column_names if n.startswith(SCORE_PREFIX)]



class RunDir:
    """Paths inside one run directory; creates nothing by itself."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def compare_json(self) -> Path:
        return self.root / COMPARE_JSON

    @property
    def report_md(self) -> Path:
        return self.root / REPORT_MD

    @property
    def report_html(self) -> Path:
        return self.root / REPORT_HTML

    @property
    def junit_xml(self) -> Path:
        return self.root / JUNIT_XML

    def variant(self, name: str) -> "VariantDir":
        return VariantDir(self.root / name)

    def variant_names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / MANIFEST_JSON).exists())


class VariantDir:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.name = self.root.name

    manifest = property(lambda self: self.root / MANIFEST_JSON)
    results = property(lambda self: self.root / RESULTS_JSON)
    samples = property(lambda self: self.root / SAMPLES_PARQUET)
    tokens = property(lambda self: self.root / TOKENS_PARQUET)
    teacher = property(lambda self: self.root / TEACHER_PARQUET)
    teacher_baseline = property(lambda self: self.root / TEACHER_BASELINE_PARQUET)
    probes = property(lambda self: self.root / PROBES_JSON)
    engine_log = property(lambda self: self.root / ENGINE_LOG)
    worker_log = property(lambda self: self.root / WORKER_LOG)
