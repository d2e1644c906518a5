"""Verified artifacts: what a finished variant wrote is recorded in its manifest and
checked before anything reads it again.

The worker's last step (`finish` in :mod:`evalpipe.worker.main`) records, for every
file of :data:`VERIFIED_FILES` the variant has, its size, sha256 and (for a Parquet
table) its row count under manifest.json's ``"artifacts"``::

    "artifacts": {"samples.parquet": {"bytes": 51234, "rows": 600, "sha256": "9f2c..."}, ...}

:func:`verify_variant` checks a variant directory against that record. `compare`
(:func:`evalpipe.pipeline.comparing.load_artifacts`) and the history (:func:`evalpipe.history.store.read_run`)
call it first, so a file truncated, edited or replaced after the run is refused in one
sentence instead of being compared or recorded as if the engine had produced it; a
resumed run calls it on the variants it keeps. Variant directories written before this
record existed have no ``"artifacts"`` entry and are accepted as they are.

A variant directory without manifest.json has nothing its files can be checked against:
deleting the manifest must not turn a refused comparison into an unchecked one, so it is
refused too (:class:`ManifestMissing`). Only `evalpipe compare --unverified` reads such a
directory, and its verdict then says so and is INCONCLUSIVE
(:func:`evalpipe.compare.verdict.Verdict.unverified`). A run in progress, and a resumed
run, never read a variant without one: the worker writes it first, and resume starts such
a variant again (:mod:`evalpipe.rundir.resume`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from evalpipe.documents.manifest import ArtifactEntry, VariantManifest, read_manifest
from evalpipe.documents.worker_job import JOB_JSON
from evalpipe.errors import UserError
from evalpipe.rundir.artifacts import (
    MANIFEST_JSON,
    PROBES_JSON,
    RESULTS_JSON,
    SAMPLES_PARQUET,
    TEACHER_BASELINE_PARQUET,
    TEACHER_PARQUET,
    TOKENS_PARQUET,
    VariantDir,
)

# What compare, the history and nightly read of a variant. Not manifest.json (it holds
# the record) and not the logs (appended to by servers that may outlive the worker).
# probes.json is gathered by the parent once the variant's processes are done, and joins
# the record then (evalpipe.probing.records).
VERIFIED_FILES = (RESULTS_JSON, SAMPLES_PARQUET, TOKENS_PARQUET, TEACHER_PARQUET, TEACHER_BASELINE_PARQUET, JOB_JSON,
                  PROBES_JSON)
ARTIFACTS_KEY = "artifacts"
_CHUNK = 1 << 20  # streaming: a 128k-token trace is never held in memory to be hashed


class ArtifactMismatch(UserError):
    """A variant directory that does not match its manifest, in one sentence (a user error, exit code 2)."""


class ManifestMissing(ArtifactMismatch):
    """A variant directory without manifest.json: nothing to check its files against."""


def sha256_of(path: Path) -> tuple[str, int]:
    """(hex sha256, bytes read) of a file, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def parquet_rows(path: Path) -> int:
    """Row count from the Parquet footer (no column is read)."""
    return int(pq.read_metadata(path).num_rows)


def describe_file(path: Path) -> dict[str, Any]:
    """One file's entry of the record: bytes, sha256 and (a Parquet table) rows."""
    sha, size = sha256_of(path)
    entry: dict[str, Any] = {"bytes": size, "sha256": sha}
    if path.name.endswith(".parquet"):
        entry["rows"] = parquet_rows(path)
    return entry


def describe_artifacts(vdir: VariantDir) -> dict[str, dict[str, Any]]:
    """The manifest's ``"artifacts"`` record of the files the variant has now."""
    return {name: describe_file(vdir.root / name) for name in VERIFIED_FILES if (vdir.root / name).is_file()}


def _mismatch(path: Path, what: str) -> ArtifactMismatch:
    return ArtifactMismatch(f"{path} does not match its manifest ({what}); re-run the variant or restore the file.")


def _rows_or_none(path: Path) -> int | None:
    try:
        return parquet_rows(path)
    except Exception:  # noqa: BLE001 - a damaged footer is reported as the size/sha256 difference it is
        return None


def missing_manifest(vdir: VariantDir, fix: str = "restore it or re-run the variant") -> ManifestMissing:
    return ManifestMissing(f"{vdir.manifest} is missing, so nothing shows that the files of variant {vdir.name!r} "
                           f"are what it wrote; {fix}.")


def verify_variant(vdir: VariantDir | Path, manifest: VariantManifest | None = None, *,
                   allow_unverified: bool = False, fix: str | None = None,
                   files: tuple[str, ...] = VERIFIED_FILES) -> bool:
    """Check every file the variant's manifest records (present, same size, rows and
    sha256) and that no file of :data:`VERIFIED_FILES` was added after it finished;
    :class:`ArtifactMismatch` naming the first file that differs. A manifest without an
    ``"artifacts"`` record (a run from before the record) passes: there is nothing to
    check it against. A directory without a manifest is refused (:class:`ManifestMissing`,
    its sentence ending with ``fix`` when given) unless ``allow_unverified``. True: checked;
    False: read unverified. ``manifest``: its content, when the caller has read it already
    (resume keeps what it verified). ``files``: only these are checked, for a reader of a
    variant that is still being finished (teacher forcing reads the reference's tables
    while its parent may be adding probes.json to the record)."""
    vdir = vdir if isinstance(vdir, VariantDir) else VariantDir(Path(vdir))
    if manifest is None:
        if not vdir.manifest.is_file():
            if allow_unverified:
                return False
            raise missing_manifest(vdir) if fix is None else missing_manifest(vdir, fix)
        try:
            manifest = read_manifest(vdir.manifest)
        except UserError as err:
            raise ArtifactMismatch(str(err)) from None
    record = manifest.artifacts
    if record is None:
        return True
    for name, entry in sorted(record.items()):
        if Path(name).name != name or name == MANIFEST_JSON:
            raise ArtifactMismatch(f"{vdir.manifest} records the artifact {name!r}, which is not a file of the variant; restore it or re-run the variant.")
        if name in files:
            _verify_file(vdir.root / name, entry)
    for name in files:
        path = vdir.root / name
        if name not in record and path.is_file():
            raise ArtifactMismatch(
                f"{path} is not in its manifest (the variant finished without it, so it was added afterwards); "
                "move it out of the variant directory or re-run the variant."
            )
    return True


def _verify_file(path: Path, entry: ArtifactEntry) -> None:
    if not path.is_file():
        raise _mismatch(path, "the file is missing; the variant finished with it")
    size, rows = path.stat().st_size, entry.rows
    if rows is not None:
        found = _rows_or_none(path)
        if found is not None and found != rows:
            raise _mismatch(path, f"it has {found} rows, the manifest records {rows}: the table was rewritten after the variant finished")
    if size != entry.bytes:
        raise _mismatch(path, f"it has {size} bytes, the manifest records {entry.bytes}: "
                              "the file was truncated or altered after the variant finished")
    if sha256_of(path)[0] != entry.sha256:
        raise _mismatch(path, "sha256 differs: the file was altered after the variant finished")
